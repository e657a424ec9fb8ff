"""Memory-mapped packtool shards: manifest checks, a row-group index and a bounded row-group cache.

`ShardStore` is the only place the loader touches files. It reads Parquet through
`pyarrow.memory_map`, so every worker process shares the OS page cache, and it decodes whole row
groups on demand into flat numpy arrays (values + offsets), kept in a small LRU cache bounded in
bytes: no per-row or per-token Python objects live in a worker. Offsets read from disk are
validated once per decoded row group, so a damaged file is a `DataError` naming the file and row.

While a dataset iterates, `prefetch` hands the row groups of upcoming steps to one background
thread per process, which decodes them (pyarrow releases the GIL while decoding) while the caller
gathers and collates from those already decoded; a decode error is raised where the row group is
first used, as without prefetching.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import DataError
from packtool.manifest import Manifest, dataset_folder, read_manifest, sha256_file

_COLUMNS = ("input_ids", "doc_offsets", "doc_ids")


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
            )
        )


# Integer Arrow types -> numpy dtypes. Converting through `Array.to_numpy` would import pandas on
# some pyarrow paths (~0.3-0.9 s, in every fresh process), so buffers are wrapped directly.
_INT_TYPES = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
}


def _int_numpy(arr: pa.Array) -> np.ndarray:
    """Zero-copy numpy view of a null-free integer Arrow array (read-only)."""
    dtype = _INT_TYPES.get(arr.type)
    if dtype is None:
        raise TypeError(f"{arr.type} is not an integer type")
    itemsize = np.dtype(dtype).itemsize
    return np.frombuffer(
        arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * itemsize
    )


def _list_parts(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray, int]:
    """(values, offsets, null_count) of a list column, zero-copy for a single chunk."""
    if isinstance(column, pa.ChunkedArray):
        arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    else:
        arr = column
    # `.offsets` and `.values` ignore a slice offset consistently (offsets index into `.values`).
    offsets = _int_numpy(arr.offsets)
    values = _int_numpy(arr.values)
    return values, offsets, arr.null_count + arr.values.null_count


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


def _decode_with_jemalloc(pf: pq.ParquetFile, source: pa.NativeFile, page_checksums: bool) -> None:
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


class ShardStore:
    """Random access to the rows of a packtool dataset folder.

    Args:
        path: The folder holding `index.json` and the shards.
        verify: Also check every shard's sha256 against the manifest at open (reads every byte;
            slow on large datasets). Sizes and Parquet footers are always checked.
        page_checksums: Check the CRC32 of every Parquet page as it is decoded (packtool pack
            writes them; pages without one are read unchecked): a damaged page is a `DataError`
            instead of different tokens. Costs about 1% of decoding (README, "Loader").
        cache_bytes: Upper bound on decoded row groups kept per process (at least one row group is
            always kept).

    Raises:
        DataError: Missing, truncated or corrupt shards, a manifest that does not match the files,
            or an unknown format version.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        verify: bool = False,
        cache_bytes: int = 256 << 20,
        page_checksums: bool = True,
    ) -> None:
        self.path = dataset_folder(path)  # the folder, also when given its index.json
        self.manifest: Manifest = read_manifest(self.path)
        self.page_checksums = bool(page_checksums)
        self.vocab_size = int(self.manifest.tokenizer["vocab_size"])
        self.cache_bytes = int(cache_bytes)
        self.max_len = int(self.manifest.max_len)
        rg_rows: list[int] = []
        rg_shard: list[int] = []
        rg_first: list[int] = []
        token_dtypes = []
        for i, info in enumerate(self.manifest.shards):
            file = self.path / info.file
            if not file.is_file():
                raise DataError(f"{file}: shard listed in index.json is missing")
            size = file.stat().st_size
            if size != info.bytes:
                raise DataError(
                    f"{file}: {size} bytes but index.json says {info.bytes}; "
                    "the shard is truncated or was replaced"
                )
            if verify and sha256_file(file) != info.sha256:
                raise DataError(f"{file}: sha256 does not match index.json; the shard is corrupt")
            try:
                meta = pq.read_metadata(file)
                schema = meta.schema.to_arrow_schema()
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{file}: not a readable Parquet file ({exc})") from None
            for name in _COLUMNS:
                if name not in schema.names:
                    raise DataError(f"{file}: column {name!r} missing (has {schema.names})")
                if not pa.types.is_list(schema.field(name).type) and not pa.types.is_large_list(
                    schema.field(name).type
                ):
                    raise DataError(
                        f"{file}: column {name!r} is {schema.field(name).type}, not a list"
                    )
            value_type = schema.field("input_ids").type.value_type
            if value_type not in _INT_TYPES or value_type.bit_width > 32:
                raise DataError(
                    f"{file}: input_ids hold {value_type}, not 8-32 bit integer token ids"
                )
            token_dtypes.append(_INT_TYPES[value_type])
            if meta.num_rows != info.rows:
                raise DataError(f"{file}: {meta.num_rows} rows but index.json says {info.rows}")
            groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            if sum(groups) != info.rows:
                # The footer has no checksum: a damaged row count would shift every row after it.
                raise DataError(
                    f"{file}: its row groups hold {sum(groups)} rows but the file says "
                    f"{meta.num_rows}; the footer is damaged, repack it"
                )
            first = 0
            for g in range(meta.num_row_groups):
                rg_rows.append(meta.row_group(g).num_rows)
                rg_shard.append(i)
                rg_first.append(first)
                first += rg_rows[-1]
        self._rg_shard = np.asarray(rg_shard, dtype=np.int64)
        self._rg_first = np.asarray(rg_first, dtype=np.int64)
        self._rg_local = np.zeros(len(rg_rows), dtype=np.int64)
        for i in range(1, len(rg_rows)):
            same = rg_shard[i] == rg_shard[i - 1]
            self._rg_local[i] = self._rg_local[i - 1] + 1 if same else 0
        self._rg_start = np.zeros(len(rg_rows) + 1, dtype=np.int64)
        np.cumsum(rg_rows, out=self._rg_start[1:])
        self.num_rows = int(self._rg_start[-1])
        self.token_dtype = np.dtype(np.result_type(*token_dtypes) if token_dtypes else np.uint16)
        """The stored token dtype (the widest over the shards): uint16 or uint32 per the contract."""
        self._files: dict[int, pq.ParquetFile] = {}
        self._cache: OrderedDict[int, RowGroupData] = OrderedDict()
        self._cached_bytes = 0
        self.decoded_row_groups = 0
        """How many row groups this process decoded (cache misses)."""
        # Decode-ahead: one thread per process (made on first use), which then does every decode
        # of this store (a ParquetFile is not read from two threads at once).
        self._pid = os.getpid()
        self._decoder: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future] = {}

    # Open files, cached row groups and the decode thread belong to one process; a worker (forked
    # or spawned) starts with none of them.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_files"] = {}
        state["_cache"] = OrderedDict()
        state["_cached_bytes"] = 0
        state["_decoder"] = None
        state["_pending"] = {}
        state["_pid"] = -1
        return state

    def _own(self) -> None:
        """Drop what a fork inherited from the parent (its decode thread does not exist here)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._decoder = None
            self._pending = {}
            self._files = {}

    @property
    def pending_row_groups(self) -> int:
        """Row groups handed to the decode thread and not yet used."""
        return len(self._pending)

    def prefetch(self, groups: np.ndarray) -> None:
        """Start decoding row groups (global numbering) in the background, in the given order.

        Row groups already cached or pending are skipped; a later `row_group(g)` waits for its
        decode. Decoded row groups are held until used (at most what the caller asks ahead).
        """
        self._own()
        for g in dict.fromkeys(int(x) for x in groups):
            if g in self._cache or g in self._pending:
                continue
            if self._decoder is None:
                self._decoder = ThreadPoolExecutor(1, thread_name_prefix="packtool-decode")
            self._pending[g] = self._decoder.submit(self._decode, g)

    def cancel_prefetch(self) -> None:
        """Forget the row groups asked ahead (an iteration ended); the decode thread stays idle."""
        for future in self._pending.values():
            future.cancel()
        self._pending = {}

    @property
    def num_row_groups(self) -> int:
        return len(self._rg_shard)

    def row_group_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group index of each global row index."""
        return np.searchsorted(self._rg_start, rows, side="right") - 1

    def _file(self, shard: int) -> pq.ParquetFile:
        pf = self._files.get(shard)
        if pf is None:
            file = self.path / self.manifest.shards[shard].file
            try:
                source = pa.memory_map(str(file), "r")
                pf = pq.ParquetFile(source, page_checksum_verification=self.page_checksums)
                _decode_with_jemalloc(pf, source, self.page_checksums)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(f"{file}: cannot open shard ({exc})") from None
            self._files[shard] = pf
        return pf

    def row_group(self, g: int) -> RowGroupData:
        """Decoded row group `g` (global numbering), from the cache when possible."""
        data = self._cache.get(g)
        if data is not None:
            self._cache.move_to_end(g)
            return data
        self._own()
        future = self._pending.pop(g, None)
        if future is not None:
            data = future.result()
        elif self._decoder is not None:
            data = self._decoder.submit(self._decode, g).result()
        else:
            data = self._decode(g)
        self.decoded_row_groups += 1
        self._cache[g] = data
        self._cached_bytes += data.nbytes
        while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes
        return data

    def _decode(self, g: int) -> RowGroupData:
        """Read, decode and validate row group `g` (no cache)."""
        shard = int(self._rg_shard[g])
        where = str(self.path / self.manifest.shards[shard].file)
        try:
            # One row group is one column chunk per column: a reader thread pool only adds overhead.
            table = self._file(shard).read_row_group(
                int(self._rg_local[g]), columns=list(_COLUMNS), use_threads=False
            )
            if table.schema.field("input_ids").type.value_type not in _INT_TYPES:
                raise DataError(
                    f"{where}: input_ids hold {table.schema.field('input_ids').type.value_type}, "
                    "not integer token ids"
                )
            tok, tok_off, tok_nulls = _list_parts(table.column("input_ids"))
            off, off_off, off_nulls = _list_parts(table.column("doc_offsets"))
            ids, ids_off, ids_nulls = _list_parts(table.column("doc_ids"))
        except (pa.ArrowException, OSError) as exc:
            raise DataError(
                f"{where}: row group {int(self._rg_local[g])} unreadable ({exc}); the shard is damaged"
            ) from None
        if tok_nulls or off_nulls or ids_nulls:
            raise DataError(f"{where}: row group {int(self._rg_local[g])} holds nulls")
        expected = int(self._rg_start[g + 1] - self._rg_start[g])
        if not len(tok_off) - 1 == len(off_off) - 1 == len(ids_off) - 1 == expected:
            raise DataError(
                f"{where}: row group {int(self._rg_local[g])} decodes to "
                f"{len(tok_off) - 1} rows, its footer says {expected}; the shard is damaged"
            )
        data = RowGroupData(
            tokens=tok,
            token_offsets=tok_off.astype(np.int64, copy=False),
            doc_offsets=off.astype(np.int32, copy=False),
            doc_offsets_offsets=off_off.astype(np.int64, copy=False),
            doc_ids=ids.astype(np.int64, copy=False),
            doc_ids_offsets=ids_off.astype(np.int64, copy=False),
        )
        validate_row_group(
            data,
            max_len=self.max_len,
            where=where,
            first_row=int(self._rg_first[g]),
            vocab_size=self.vocab_size,
        )
        return data

    def _slices(
        self, rows: np.ndarray
    ) -> tuple[list[tuple[np.ndarray, np.ndarray, np.ndarray]], int, int]:
        """Per row: (tokens, cu_seqlens, doc ids) views into cached row groups; total tokens, docs."""
        groups = self.row_group_of(rows)
        parts = []
        n_tokens = n_docs = 0
        for row, g in zip(rows.tolist(), groups.tolist(), strict=True):
            data = self.row_group(g)
            i = row - int(self._rg_start[g])
            a, b = int(data.token_offsets[i]), int(data.token_offsets[i + 1])
            oa, ob = int(data.doc_offsets_offsets[i]), int(data.doc_offsets_offsets[i + 1])
            ia = int(data.doc_ids_offsets[i])
            parts.append(
                (data.tokens[a:b], data.doc_offsets[oa:ob], data.doc_ids[ia : ia + ob - oa - 1])
            )
            n_tokens += b - a
            n_docs += ob - oa - 1
        return parts, n_tokens, n_docs

    def gather_into(
        self, rows: np.ndarray, tokens: np.ndarray, doc_lens: np.ndarray, doc_ids: np.ndarray
    ) -> tuple[int, int] | None:
        """Write the rows' tokens, document lengths and ids into preallocated arrays.

        Args:
            rows: Global row indices, in batch order.
            tokens: Destination of the tokens (any integer dtype that holds `token_dtype`).
            doc_lens: Destination of the document lengths (int32).
            doc_ids: Destination of the document ids (int64).

        Returns:
            `(n_tokens, n_docs)` written at the front of the arrays, or None (nothing written)
            when they are too small.
        """
        parts, n_tokens, n_docs = self._slices(rows)
        if n_tokens > len(tokens) or n_docs > len(doc_lens) or n_docs > len(doc_ids):
            return None
        self._write(parts, tokens, doc_lens, doc_ids)
        return n_tokens, n_docs

    @staticmethod
    def _write(parts, tokens: np.ndarray, doc_lens: np.ndarray, doc_ids: np.ndarray) -> None:
        t = d = 0
        for tok, off, ids in parts:
            n, k = len(tok), len(ids)
            tokens[t : t + n] = tok
            np.subtract(off[1:], off[:-1], out=doc_lens[d : d + k])
            doc_ids[d : d + k] = ids
            t += n
            d += k

    def gather(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows' tokens, document lengths and document ids, concatenated in the given order.

        Returns:
            `(tokens, doc_lens, doc_ids)`: tokens in `token_dtype` `(total_tokens,)`, document
            lengths int32 `(n_docs,)` and document ids int64 `(n_docs,)`.
        """
        parts, n_tokens, n_docs = self._slices(rows)
        out = (
            np.empty(n_tokens, self.token_dtype),
            np.empty(n_docs, np.int32),
            np.empty(n_docs, np.int64),
        )
        self._write(parts, *out)
        return out

    def row_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-row token count, document count and attention cost Σ len², for batch planning.

        Reads only the `doc_offsets` column of every shard (small next to the tokens).

        Returns:
            `(lengths int64, n_docs int64, sq_cost float64)`, each `(num_rows,)`.
        """
        self._own()
        if self._decoder is not None:  # the decode thread is the only one reading the files
            return self._decoder.submit(self._row_index).result()
        return self._row_index()

    def _row_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lengths = np.empty(self.num_rows, dtype=np.int64)
        n_docs = np.empty(self.num_rows, dtype=np.int64)
        sq = np.empty(self.num_rows, dtype=np.float64)
        pos = 0
        for i, info in enumerate(self.manifest.shards):
            where = str(self.path / info.file)
            try:
                col = (
                    self._file(i)
                    .read(columns=["doc_offsets"], use_threads=False)
                    .column("doc_offsets")
                )
                off, off_off, nulls = _list_parts(col)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(
                    f"{where}: doc_offsets unreadable ({exc}); the shard is damaged"
                ) from None
            n = len(off_off) - 1
            counts = np.diff(off_off)
            if nulls or (counts < 2).any():
                raise DataError(f"{where}: malformed doc_offsets (null or fewer than 2 entries)")
            ends = off[off_off[1:] - 1].astype(np.int64)
            if (ends > self.max_len).any() or (ends <= 0).any() or (off[off_off[:-1]] != 0).any():
                bad = int(
                    np.flatnonzero((ends > self.max_len) | (ends <= 0) | (off[off_off[:-1]] != 0))[
                        0
                    ]
                )
                raise DataError(
                    f"{where}: row {bad}: doc_offsets out of range; the shard is damaged"
                )
            steps = np.diff(off.astype(np.int64))
            sq_all = np.zeros(len(off), dtype=np.float64)
            sq_all[1:] = np.cumsum(steps.astype(np.float64) ** 2)
            # Σ over a row's documents = prefix-sum difference; the cross-row step is excluded
            # because each row's range starts at its own first offset.
            if n != info.rows or int(ends.sum()) != info.tokens:
                raise DataError(
                    f"{where}: {n} rows of {int(ends.sum())} tokens but index.json says "
                    f"{info.rows} of {info.tokens}; the shard is damaged"
                )
            lengths[pos : pos + n] = ends
            n_docs[pos : pos + n] = counts - 1
            sq[pos : pos + n] = sq_all[off_off[1:] - 1] - sq_all[off_off[:-1]]
            pos += n
        return lengths, n_docs, sq
