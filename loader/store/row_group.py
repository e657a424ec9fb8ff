"""One decoded row group of a packtool shard: flat arrays, validated once, decoded from jemalloc.

`ShardStore` (loader/store/shards.py) decodes whole row groups into `RowGroupData` (values + offsets
per column, no per-row Python objects) and checks their offsets with `validate_row_group` before
any row of them is used, so a damaged file is a `DataError` naming the file and row.
`write_parts` copies row views out of them into a batch's arrays (one store's rows, or a
mixture's from several stores).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loader.record import Documents
from packtool.dataset.columns import TOKEN, Column, bytes_parts
from packtool.errors import DataError


@dataclass(frozen=True)
class RowGroupData:
    """One decoded row group as flat arrays (no per-row objects)."""

    tokens: np.ndarray
    """uint16|uint32, all rows' tokens back to back."""
    token_offsets: np.ndarray
    """(rows + 1,) offsets of each row into `tokens`."""
    doc_offsets: np.ndarray
    """int32, every row's cu_seqlens back to back (each starts at 0, ends at the row length)."""
    doc_offsets_offsets: np.ndarray
    """(rows + 1,) offsets of each row's cu_seqlens into `doc_offsets`."""
    doc_ids: np.ndarray
    """int64, every row's document ids back to back."""
    doc_ids_offsets: np.ndarray
    """(rows + 1,) offsets of each row's ids into `doc_ids`."""
    columns: dict[str, np.ndarray] = field(default_factory=dict)
    """Optional columns' values back to back: per-token ones indexed by `token_offsets`,
    per-document ones by `doc_ids_offsets` (checked when decoded)."""

    @property
    def nbytes(self) -> int:
        return sum(
            a.nbytes
            for a in (
                self.tokens,
                self.token_offsets,
                self.doc_offsets,
                self.doc_offsets_offsets,
                self.doc_ids,
                self.doc_ids_offsets,
                *self.columns.values(),
            )
        )


# Integer Arrow types -> numpy dtypes. Converting through `Array.to_numpy` would import pandas on
# some pyarrow paths (~0.3-0.9 s, in every fresh process), so buffers are wrapped directly.
INT_TYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
}
NUMERIC_TYPES = {**INT_TYPES, pa.float32(): np.float32, pa.float64(): np.float64}
"""What a declared optional column may hold (token ids are checked against `INT_TYPES`)."""


def int_numpy(arr: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of a null-free integer Arrow array (read-only)."""
    dtype = NUMERIC_TYPES.get(arr.type)
    if dtype is None:
        raise TypeError(f"{arr.type} is not an integer or float type")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(
        arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * itemsize
    )


def list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, int]:
    """(values, offsets, null_count) of a list column, zero-copy for a single chunk."""
    if isinstance(column, pa.ChunkedArray):
        arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    else:
        arr = column
    if pa.types.is_binary(arr.type):  # a column stored as bytes: one binary value per row
        offsets, values = bytes_parts(arr)
        return values, offsets, arr.null_count
    # `.offsets` and `.values` ignore a slice offset consistently (offsets index into `.values`).
    offsets = int_numpy(arr.offsets)
    values = int_numpy(arr.values)
    return values, offsets, arr.null_count + arr.values.null_count


def aligned(values: np.ndarray, offsets: np.ndarray, like: np.ndarray) -> np.ndarray:
    """`values` shifted so that `like`'s offsets index them (both lists' offsets may start past
    0 in a sliced array; they were checked to describe the same lengths)."""
    shift = int(offsets[0]) - int(like[0]) if len(offsets) else 0
    if shift >= 0:
        return values[shift:]
    return np.concatenate([np.zeros(-shift, values.dtype), values])


def validate_row_group(
    data: RowGroupData,
    *,
    max_len: int,
    where: str,
    first_row: int,
    vocab_size: int | None = None,
) -> None:
    """Check the offsets and ids of a decoded row group (a `DataError` naming file and row).

    Args:
        data: The decoded row group.
        max_len: The manifest's max_len; no row may be longer.
        where: The shard file, for messages.
        first_row: Index of the row group's first row inside the shard, for messages.
        vocab_size: The tokenizer's vocabulary size; every token id must be below it. Skipped
            when the token dtype cannot hold a larger id (uint16 with vocab_size 65,536).
    """
    n = len(data.token_offsets) - 1

    def fail(mask: np.ndarray, what: str) -> None:
        bad = int(np.flatnonzero(mask)[0])
        raise DataError(f"{where}: row {first_row + bad}: {what}; the shard is damaged, repack it")

    lens = np.diff(data.token_offsets)
    if (lens > max_len).any():
        fail(lens > max_len, f"row longer than max_len {max_len}")
    if (lens <= 0).any():
        fail(lens <= 0, "empty row")
    n_off = np.diff(data.doc_offsets_offsets)
    if (n_off < 2).any():
        fail(n_off < 2, "doc_offsets has fewer than 2 entries")
    n_ids = np.diff(data.doc_ids_offsets)
    if (n_ids != n_off - 1).any():
        fail(n_ids != n_off - 1, "doc_ids and doc_offsets disagree on the number of documents")
    starts = data.doc_offsets[data.doc_offsets_offsets[:-1]]
    if (starts != 0).any():
        fail(starts != 0, "doc_offsets does not start at 0")
    ends = data.doc_offsets[data.doc_offsets_offsets[1:] - 1]
    if (ends != lens).any():
        fail(ends != lens, "doc_offsets does not end at the row length")
    steps = np.diff(data.doc_offsets.astype(np.int64))
    # The steps between the last offset of one row and the first of the next are not document
    # lengths; mask them out before checking that every document is non-empty.
    boundary = data.doc_offsets_offsets[1:-1] - 1
    inside = np.ones(len(steps), dtype=bool)
    inside[boundary] = False
    if (inside & (steps <= 0)).any():
        row_of_step = np.searchsorted(data.doc_offsets_offsets, np.arange(len(steps)), "right") - 1
        bad_rows = np.zeros(n, dtype=bool)
        bad_rows[row_of_step[inside & (steps <= 0)]] = True
        fail(bad_rows, "doc_offsets is not strictly increasing")
    tokens = data.tokens
    if len(tokens) and np.issubdtype(tokens.dtype, np.signedinteger) and int(tokens.min()) < 0:
        # (Signed ids: shards other tools wrote; packtool's are unsigned, and pay nothing here.)
        pos = int(np.flatnonzero(tokens < 0)[0])
        row = int(np.searchsorted(data.token_offsets, pos, side="right") - 1)
        raise DataError(
            f"{where}: row {first_row + row}: token id {int(tokens[pos])} is negative; the shard "
            "is damaged, repack it"
        )
    # One max over the row group's tokens (about 2% of decoding it, README "Loader"): an id the
    # model's embedding does not have would otherwise fail much later, or index another row.
    if vocab_size is not None and len(tokens) and np.iinfo(tokens.dtype).max >= vocab_size:
        top = int(tokens.max())
        if top >= vocab_size:
            pos = int(np.flatnonzero(tokens >= vocab_size)[0])
            row = int(np.searchsorted(data.token_offsets, pos, side="right") - 1)
            raise DataError(
                f"{where}: row {first_row + row}: token id {int(tokens[pos])} is not below the "
                f"tokenizer's vocab_size {vocab_size}; the shard is damaged, repack it"
            )


def decode_with_jemalloc(pf: pq.ParquetFile, source: pa.NativeFile, page_checksums: bool) -> None:
    """Make `pf` allocate what it decodes from pyarrow's jemalloc pool, when there is one.

    Row groups are decoded in a background thread and freed in the iterating one; with pyarrow's
    default allocator (mimalloc) that costs ~2 ms of page faults per 1 M-token row group (about a
    third more decode time), with jemalloc ~0.8 ms. Only this reader's buffers change pool (the
    process default stays). Keeps the default reader where pyarrow lacks either piece.
    """
    try:
        from pyarrow._parquet import ParquetReader

        reader = ParquetReader(memory_pool=pa.jemalloc_memory_pool())
        reader.open(source, metadata=pf.metadata, page_checksum_verification=page_checksums)
    except (ImportError, AttributeError, TypeError, NotImplementedError, pa.ArrowException):
        return
    pf.reader = reader


def write_parts(
    parts: list[tuple],
    dest: Documents,
    optional: tuple[Column, ...],
    t: int = 0,
    d: int = 0,
    at: tuple[list[int], list[int]] | None = None,
) -> None:
    """Write row views (`ShardStore.views`: tokens, doc offsets, doc ids, optional columns)
    into `dest` from token `t` and document `d`, one after another; with `at`, each row at
    its own first token and document (`at[0][i]`, `at[1][i]`)."""
    tokens, doc_lens, doc_ids, columns = dest.tokens, dest.doc_lens, dest.doc_ids, dest.columns
    for i, (tok, off, ids, extra) in enumerate(parts):
        if at is not None:
            t, d = at[0][i], at[1][i]
        n, k = len(tok), len(ids)
        tokens[t : t + n] = tok
        np.subtract(off[1:], off[:-1], out=doc_lens[d : d + k])
        doc_ids[d : d + k] = ids
        for c in optional:
            if c.level == TOKEN:
                columns[c.name][t : t + n] = extra[c.name]
            else:
                columns[c.name][d : d + k] = extra[c.name]
        t += n
        d += k
