"""A chunk's token ids as the batches they were encoded in, addressed as one flat array.

A partition's chunk is the concatenation of the tokenizer's batches (`rechunk`).
Copying them into one contiguous array first would cost a pass over every token after the last
batch is encoded, on one core, in the single-threaded tail of a run (~0.02-0.2 s per 38 M
GPT-2 tokens on the project's box: a fresh 75 MB allocation, slow when the kernel compacts
memory for its huge pages). `FlatIds` keeps the batches and gathers the packed rows' tokens
straight from them: each segment lies inside one document, and each document inside one batch,
so a segment is copied from its batch in one piece (`gather`). The tokens and their order are
the same as gathering from the concatenation.

Coordinates are those of `column.combine_chunks()` (which copies even a single chunk): token 0
is the first token of the first document, over the batches in order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import ArrayLike, NDArray

from packtool.arrow_numpy import from_numpy, to_numpy
from packtool.errors import DataError
from packtool.pack import jit, kernels


class FlatIds:
    """The values of a list column (`input_ids`), chunk by chunk, without concatenating them.

    Args:
        column: a list (or large list) column, one chunk or several.

    Attributes:
        doc_start: int64, (documents + 1,): each document's first token, then the end.

    Raises:
        DataError: the column is not a list of ids (a null id is found by `values()`, when the
            ids are first needed).
    """

    def __init__(self, column: pa.ChunkedArray | pa.Array) -> None:
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        kind = column.type
        if not pa.types.is_list(kind) and not pa.types.is_large_list(kind):
            raise DataError(f"input_ids must be a list column, found {kind}")
        self._arrays: list[pa.Array] = []  # each chunk's own ids (slices, no copy)
        starts = [0]
        doc_start = []
        for c in chunks:
            if not len(c):
                continue
            offsets = to_numpy(c.offsets).astype(np.int64)  # absolute in a slice's child array
            self._arrays.append(c.values.slice(offsets[0], offsets[-1] - offsets[0]))
            doc_start.append(offsets[:-1] - offsets[0] + starts[-1])
            starts.append(starts[-1] + int(offsets[-1] - offsets[0]))
        doc_start.append(np.array([starts[-1]], dtype=np.int64))
        self.doc_start: NDArray[np.int64] = np.concatenate(doc_start)
        self._starts = np.asarray(starts, dtype=np.int64)  # (chunks + 1,)
        if not self._arrays:  # no rows (`pa.array([])` imports pandas: ~0.4 s of a process)
            empty = np.zeros(0, np.dtype(kind.value_type.to_pandas_dtype()))
            self._arrays.append(from_numpy(empty, kind.value_type))
        self._values: list[np.ndarray] | None = None

    def values(self) -> list[np.ndarray]:
        """Each chunk's ids as numpy (views).

        Raises:
            DataError: an id is null (checked here, when the ids are first needed, as
                `pack_table` always did).
        """
        if self._values is None:
            if any(a.null_count for a in self._arrays):
                raise DataError("input_ids holds null token ids")
            self._values = [to_numpy(a) for a in self._arrays]
        return self._values

    def gather(self, src: ArrayLike, lengths: ArrayLike) -> NDArray:
        """Concatenate tokens `[src[i], src[i] + lengths[i])` for every i (global coordinates).

        Raises:
            ValueError: `src` and `lengths` differ in shape, or a segment is not inside one
                chunk (segments are pieces of one document, which never spans chunks).
        """
        chunks = self.values()
        if len(chunks) == 1:
            return kernels.gather_segments(chunks[0], src, lengths)
        src, lengths = kernels.checked_segments(src, lengths, None)
        n_chunks = len(chunks)
        chunk = np.clip(np.searchsorted(self._starts, src, side="right") - 1, 0, n_chunks - 1)
        if np.any(src + lengths > self._starts[chunk + 1]):
            raise ValueError("a segment falls outside the chunk it starts in")
        dst = np.cumsum(lengths) - lengths
        out = np.empty(int(lengths.sum()), dtype=chunks[0].dtype)
        # Segments grouped by chunk (stable: each chunk's in output order), one kernel call per
        # chunk: O(segments log segments + tokens), however many batches the chunk holds.
        order = np.argsort(chunk, kind="stable")
        bounds = np.searchsorted(chunk[order], np.arange(n_chunks + 1))
        for k in range(n_chunks):
            pick = order[bounds[k] : bounds[k + 1]]
            if len(pick):
                local = src[pick] - self._starts[k]
                _scatter_segments(chunks[k], local, dst[pick], lengths[pick], out)
        return out


@jit.njit(cache=True, nogil=True)
def _scatter_segments(values, src, dst, lengths, out):  # pragma: no cover - compiled
    for i in range(lengths.size):
        s, d = src[i], dst[i]
        for t in range(lengths[i]):
            out[d + t] = values[s + t]


def warm_up() -> None:
    """Load the kernel from numba's cache (or compile it) for every id dtype."""
    for dtype in (np.uint16, np.uint32):
        v = np.arange(4, dtype=dtype)
        _scatter_segments(v, np.zeros(1, np.int64), np.zeros(1, np.int64), np.ones(1, np.int64), v)


def rechunk(
    batches: Iterable[pa.Table], chunk_docs: int, max_tokens: int | None = None
) -> Iterator[pa.Table]:
    """Regroup a stream of tables into tables of exactly `chunk_docs` rows (the last fewer).

    The tables keep the batches as their chunks (no copy): `pack_table` reads the ids chunk by
    chunk (`FlatIds`), so no pass over every token runs after the last batch.

    `max_tokens`: also end a table before the row that would take its `length` column's sum
    past this (a table holds at least one row). The tail tree reads its children's pieces so
    (packtool/engines/merge.py): `chunk_docs` pieces of up to `max_len` tokens each are up to
    100,000 x 2^24 tokens, which no process should hold at once. None: rows alone, as before.
    """
    pending: list[pa.Table] = []
    held = tokens = 0
    for batch in batches:
        pending.append(batch)
        held += batch.num_rows
        if max_tokens is not None:
            tokens += int(pc.sum(batch.column("length")).as_py() or 0)
        while held >= chunk_docs or (max_tokens is not None and tokens > max_tokens and held):
            table = pa.concat_tables(pending)
            cut = min(chunk_docs, held)
            if max_tokens is not None and tokens > max_tokens:
                ends = np.cumsum(to_numpy(table.column("length")).astype(np.int64))
                cut = min(cut, max(1, int(np.searchsorted(ends, max_tokens, side="right"))))
            yield table.slice(0, cut)
            rest = table.slice(cut)
            del table  # the chunk's buffers go with the caller's last reference, not ours
            pending, held = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
            if max_tokens is not None:
                tokens = int(pc.sum(rest.column("length")).as_py() or 0) if held else 0
    if held:
        yield pa.concat_tables(pending)
