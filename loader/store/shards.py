"""Memory-mapped packtool shards: manifest checks, a row-group index and a bounded row-group cache.

`ShardStore` is the only place the loader touches files. It reads Parquet through
`pyarrow.memory_map`, so every worker process shares the OS page cache, and it decodes whole row
groups on demand into flat numpy arrays (values + offsets), kept in a small LRU cache bounded in
bytes: no per-row or per-token Python objects live in a worker. Offsets read from disk are
validated once per decoded row group, so a damaged file is a `DataError` naming the file and row.
Local shards are opened when read and at most `OPEN_FILES` kept open per process
(`ShardFiles`, shard_files.py).

While a dataset iterates, `prefetch` hands the row groups of upcoming steps to one background
thread per process, which decodes them (pyarrow releases the GIL while decoding) while the caller
gathers and collates from those already decoded; a decode error is raised where the row group is
first used, as without prefetching.

Row counts for batch planning (tokens, documents and Σ len² per row) are read per row group from
the `doc_offsets` column alone (`row_stats`), when the epoch order first needs them.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loader.record import Documents, empty_documents
from loader.store.bucket import CACHE_LIMIT, BucketRowGroups
from loader.store.row_group import (
    INT_TYPES,
    RowGroupData,
    aligned,
    list_parts,
    validate_row_group,
    write_parts,
)
from loader.store.row_index import GroupStats, offsets_stats
from loader.store.shard_files import OPEN_FILES, STATS_FILES, ShardFiles
from packtool.dataset.columns import BYTES, TOKEN, Column, declared, loaded_optional, names
from packtool.dataset.manifest import ShardInfo, open_dataset, sha256_file
from packtool.errors import DataError, one_line
from packtool.storage import local as storage

_NO_COLUMNS: Mapping[str, np.ndarray] = MappingProxyType({})
"""The optional columns of a row of a store that has none."""
_COLUMNS = ("input_ids", "doc_offsets", "doc_ids")
"""The required columns the loader reads; the optional ones it carries come from the manifest's
`columns` and the declaration (`ShardStore.optional`)."""


class DecodeThread:
    """One background decode thread per process (made on first use; a forked or unpickled copy
    makes its own), for one store or shared by several."""

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._pool: ThreadPoolExecutor | None = None

    def __getstate__(self) -> dict:
        return {"_pid": -1, "_pool": None}

    def executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():
            self._pid, self._pool = os.getpid(), None
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="packtool-decode")
        return self._pool


class ShardStore:
    """Random access to the rows of a packtool dataset folder.

    Args:
        path: The folder holding `index.json` and the shards.
        verify: Also check every shard's sha256 against the manifest at open (reads every byte;
            slow on large datasets). Sizes and Parquet footers are always checked.
        page_checksums: Check the CRC32 of every Parquet page as it is decoded (packtool pack
            writes them; pages without one are read unchecked): a damaged page is a `DataError`
            instead of different tokens. Costs about 4 % of the loader's CPU on text, 15 % on
            incompressible ids (docs/loader.md, `page_checksums`; docs/benchmarks.md, "Loader").
        cache_bytes: Upper bound on decoded row groups kept per process (at least one row group is
            always kept).
        min_row_groups: Row groups kept whatever their bytes (a mixture's source: its share of
            the process's `cache_bytes` still holds a whole shuffle window).

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
        min_row_groups: int = 1,
        cache_dir: str | os.PathLike | None = None,
        cache_limit: int = CACHE_LIMIT,
    ) -> None:
        # The folder (also when given its index.json; in a bucket the version its link names).
        self.path, self.manifest = open_dataset(path)
        # A dataset in a bucket: row groups by ranged reads into the node's cache.
        self.bucket = (
            BucketRowGroups(self.path, self.manifest, cache_dir, cache_limit, page_checksums)
            if storage.is_remote(self.path)
            else None
        )
        self.page_checksums = bool(page_checksums)
        self.vocab_size = int(self.manifest.tokenizer["vocab_size"])
        self.cache_bytes = int(cache_bytes)
        self.min_row_groups = max(int(min_row_groups), 1)
        self.max_len = int(self.manifest.max_len)
        self.optional: tuple[Column, ...] = loaded_optional(self.manifest.columns)
        """The optional columns this dataset has that records carry (`loss_mask`)."""
        self._read_columns = (*_COLUMNS, *(c.name for c in self.optional))
        self._names = [str(self.path / info.file) for info in self.manifest.shards]
        """Each shard's path or URL as text (messages): joined once here, not per row group (a
        `UPath` join and `str` cost ~0.25 ms, a tenth of a small row group's decode)."""
        # A local dataset's shards, opened when read, at most OPEN_FILES per process (decodes)
        # and STATS_FILES more (row counts, `row_stats`): loader/store/shard_files.py.
        self._files = ShardFiles(self.path, self._names, self.page_checksums, OPEN_FILES)
        self._stats_files = ShardFiles(
            self.path, self._names, self.page_checksums, STATS_FILES,
            jemalloc=False, opened=self._files.opened,
        )  # fmt: skip
        self._bytes = {c.name for c in self.optional if c.storage == BYTES}
        rg_rows: list[int] = []
        rg_shard: list[int] = []
        rg_first: list[int] = []
        token_dtypes = []
        footers = self.bucket.footers() if self.bucket else None  # fetched together
        known = set(names(declared()))
        try:
            for i, info in enumerate(self.manifest.shards):
                file = self.path / info.file
                meta, schema = self._footer(file, info, footers, verify)
                token_dtype, groups = self._check_shard(file, info, meta, schema, known)
                token_dtypes.append(token_dtype)
                first = 0
                for rows in groups:
                    rg_rows.append(rows)
                    rg_shard.append(i)
                    rg_first.append(first)
                    first += rows
                if self.bucket is not None:
                    self.bucket.add_shard(meta)
        except BaseException:
            if self.bucket is not None:  # the footers not fetched yet are not
                self.bucket.stop_fetches()
            raise
        # int32 where it fits (a shard holds under 2^31 rows): 20 bytes per row group with the
        # int64 starts (~78 MB at 10^9 rows of 256-row groups), the store's only per-row-group
        # state.
        self._rg_shard = np.asarray(rg_shard, dtype=np.int32)
        self._rg_first = np.asarray(rg_first, dtype=np.int32)
        self._rg_local = np.zeros(len(rg_rows), dtype=np.int32)
        for i in range(1, len(rg_rows)):
            same = rg_shard[i] == rg_shard[i - 1]
            self._rg_local[i] = self._rg_local[i - 1] + 1 if same else 0
        if self.bucket is not None:
            self.bucket.seal()
        self._rg_start = np.zeros(len(rg_rows) + 1, dtype=np.int64)
        np.cumsum(rg_rows, out=self._rg_start[1:])
        self.num_rows = int(self._rg_start[-1])
        self.token_dtype = np.dtype(np.result_type(*token_dtypes) if token_dtypes else np.uint16)
        """The stored token dtype (the widest over the shards): uint16 or uint32 per the contract."""
        self._cache: OrderedDict[int, RowGroupData] = OrderedDict()
        self._cached_bytes = 0
        self.decoded_row_groups = 0
        """How many row groups this process decoded (cache misses)."""
        # Decode-ahead: one thread per process (made on first use; a mixture's stores share one),
        # which then does every decode of this store (a ParquetFile is not read from two threads
        # at once).
        self._pid = os.getpid()
        self._thread = DecodeThread()  # shared by the stores of a mixture (`share_decode_thread`)
        self._decoder: ThreadPoolExecutor | None = None
        self._pending: dict[int, Future] = {}
        # Row counts (`row_stats`) are read through file handles of their own, so the iterating
        # thread never waits behind the decode thread's queue (nor reads its files).
        self._stats_lock = threading.Lock()

    def _footer(
        self, file: Path, info: ShardInfo, footers: Iterator[pq.FileMetaData] | None, verify: bool
    ) -> tuple[pq.FileMetaData, pa.Schema]:
        """A shard's footer and its schema: a bucket's from `footers`, fetched together into
        the node's cache (no request once cached); a local shard's from the file, its size
        checked first (and with `verify` its sha256, before)."""
        if verify and sha256_file(file) != info.sha256:
            raise DataError(f"{file}: sha256 does not match index.json; the shard is corrupt")
        try:
            meta = next(footers) if footers else self._files.footer(file, info)
            return meta, meta.schema.to_arrow_schema()
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{file}: not a readable Parquet file ({one_line(exc)})") from None

    def _check_shard(
        self,
        file: Path,
        info: ShardInfo,
        meta: pq.FileMetaData,
        schema: pa.Schema,
        known: set[str],
    ) -> tuple[type[np.integer], list[int]]:
        """Check one shard's footer against index.json (`known`: the declared column names):
        its columns, token type and rows. Returns its token dtype and its row groups' rows.

        Raises:
            DataError: What does not match, naming the file.
        """
        # A declared column the shard holds but index.json does not list (an edited
        # `columns`): the loader would ignore it (a loss mask: every token trained on).
        unlisted = [n for n in schema.names if n in known and n not in self.manifest.columns]
        if unlisted:
            raise DataError(
                f"{file}: holds column(s) {unlisted} that index.json columns does not list "
                f"({list(self.manifest.columns)}); index.json was edited or belongs to other "
                "shards: restore it, or repack"
            )
        for name in self._read_columns:
            if name not in schema.names:
                raise DataError(f"{file}: column {name!r} missing (has {schema.names})")
            kind = schema.field(name).type
            is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
            if not is_list and not (pa.types.is_binary(kind) and name in self._bytes):
                raise DataError(f"{file}: column {name!r} is {kind}, not a list")
        value_type = schema.field("input_ids").type.value_type
        if value_type not in INT_TYPES or value_type.bit_width > 32:
            raise DataError(f"{file}: input_ids hold {value_type}, not 8-32 bit integer token ids")
        if meta.num_rows != info.rows:
            raise DataError(f"{file}: {meta.num_rows} rows but index.json says {info.rows}")
        groups = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if sum(groups) != info.rows:
            # The footer has no checksum: a damaged row count would shift every row after it.
            raise DataError(
                f"{file}: its row groups hold {sum(groups)} rows but the file says "
                f"{meta.num_rows}; the footer is damaged, repack it"
            )
        return INT_TYPES[value_type], groups

    # Open files, cached row groups and the decode thread belong to one process; a worker (forked
    # or spawned) starts with none of them.
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()  # the open files: none (`ShardFiles.__getstate__`)
        state["_cache"] = OrderedDict()
        state["_cached_bytes"] = 0
        state["_decoder"] = None
        state["_pending"] = {}
        state["_pid"] = -1
        state["_stats_lock"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._stats_lock = threading.Lock()

    def _own(self) -> None:
        """Drop what a fork inherited from the parent (its decode thread does not exist here)."""
        if self._pid != os.getpid():
            self._pid = os.getpid()
            self._decoder = None
            self._pending = {}
            self._files.forget()
            self._stats_files.forget()
            self._stats_lock = threading.Lock()  # a fork may copy it held by another thread

    def share_decode_thread(self, thread: DecodeThread) -> None:
        """Decode ahead on `thread`, which other stores share (a mixture's sources: one decode
        thread per process, as one dataset has, instead of one per source: its allocations are
        reused at the whole mixture's rate, ~6% less decode CPU per row group measured)."""
        if self._decoder is not None or self._pending:
            raise RuntimeError("share_decode_thread before the store decodes ahead")
        self._thread = thread

    @property
    def pending_row_groups(self) -> int:
        """Row groups handed to the decode thread and not yet used."""
        return len(self._pending)

    def prefetch(self, groups: np.ndarray | list[int]) -> None:
        """Start decoding row groups (global numbering) in the background, in the given order.

        Row groups already cached or pending are skipped; a later `row_group(g)` waits for its
        decode. Decoded row groups are held until used (at most what the caller asks ahead).
        """
        self._own()
        wanted = [
            g
            for g in dict.fromkeys(groups.tolist() if isinstance(groups, np.ndarray) else groups)
            if g not in self._cache and g not in self._pending
        ]
        self.fetch_ahead(wanted)  # a bucket's ranges download on their own threads meanwhile
        for g in wanted:
            if self._decoder is None:
                self._decoder = self._thread.executor()
            self._pending[g] = self._decoder.submit(self._decode, g)

    def cancel_prefetch(self) -> None:
        """Forget the row groups asked ahead (an iteration ended); the decode thread stays idle."""
        for future in self._pending.values():
            future.cancel()
        self._pending = {}

    @property
    def num_row_groups(self) -> int:
        return len(self._rg_shard)

    @property
    def row_group_starts(self) -> np.ndarray:
        """First row of every row group plus the row count, int64 `(num_row_groups + 1,)`."""
        return self._rg_start

    def row_group_of(self, rows: np.ndarray) -> np.ndarray:
        """The row group index of each global row index."""
        return np.searchsorted(self._rg_start, rows, side="right") - 1

    @property
    def open_files(self) -> int:
        """Most shard files this process keeps open for decoding (`OPEN_FILES`; a mixture's
        sources share it out, loader/store/shard_files.py)."""
        return self._files.limit

    @open_files.setter
    def open_files(self, limit: int) -> None:
        self._files.limit = max(int(limit), 1)

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
        while self._cached_bytes > self.cache_bytes and len(self._cache) > self.min_row_groups:
            _, old = self._cache.popitem(last=False)
            self._cached_bytes -= old.nbytes
        return data

    def _decode(self, g: int) -> RowGroupData:
        """Read, decode and validate row group `g` (no cache)."""
        shard = int(self._rg_shard[g])
        where = self._names[shard]
        try:
            # One row group is one column chunk per column: a reader thread pool only adds overhead.
            if self.bucket is not None:
                table = self.bucket.read(g, shard, int(self._rg_local[g]), list(self._read_columns))
            else:
                table = self._files.get(shard).read_row_group(
                    int(self._rg_local[g]), columns=list(self._read_columns), use_threads=False
                )
            if table.schema.field("input_ids").type.value_type not in INT_TYPES:
                raise DataError(
                    f"{where}: input_ids hold {table.schema.field('input_ids').type.value_type}, "
                    "not integer token ids"
                )
            tok, tok_off, tok_nulls = list_parts(table.column("input_ids"))
            off, off_off, off_nulls = list_parts(table.column("doc_offsets"))
            ids, ids_off, ids_nulls = list_parts(table.column("doc_ids"))
            extra = {c.name: list_parts(table.column(c.name)) for c in self.optional}
        except (pa.ArrowException, OSError, TypeError) as exc:
            raise DataError(
                f"{where}: row group {int(self._rg_local[g])} unreadable ({one_line(exc)}); the shard is damaged"
            ) from None
        if tok_nulls or off_nulls or ids_nulls or any(x[2] for x in extra.values()):
            raise DataError(f"{where}: row group {int(self._rg_local[g])} holds nulls")
        expected = int(self._rg_start[g + 1] - self._rg_start[g])
        if not len(tok_off) - 1 == len(off_off) - 1 == len(ids_off) - 1 == expected:
            raise DataError(
                f"{where}: row group {int(self._rg_local[g])} decodes to "
                f"{len(tok_off) - 1} rows, its footer says {expected}; the shard is damaged"
            )
        for c in self.optional:  # one value per token / per document, as declared
            want = tok_off if c.level == TOKEN else ids_off
            if not np.array_equal(extra[c.name][1] - extra[c.name][1][0], want - want[0]):
                raise DataError(
                    f"{where}: row group {int(self._rg_local[g])}: {c.name} does not have one "
                    f"value per {'token' if c.level == TOKEN else 'document'}; repack it"
                )
        data = RowGroupData(
            tokens=tok,
            token_offsets=tok_off.astype(np.int64, copy=False),
            doc_offsets=off.astype(np.int32, copy=False),
            doc_offsets_offsets=off_off.astype(np.int64, copy=False),
            doc_ids=ids.astype(np.int64, copy=False),
            doc_ids_offsets=ids_off.astype(np.int64, copy=False),
            columns={
                c.name: aligned(*extra[c.name][:2], tok_off if c.level == TOKEN else ids_off)
                for c in self.optional
            },
        )
        validate_row_group(
            data,
            max_len=self.max_len,
            where=where,
            first_row=int(self._rg_first[g]),
            vocab_size=self.vocab_size,
        )
        return data

    def fetch_ahead(self, groups: np.ndarray | list[int]) -> None:
        """Download the ranges of row groups (global numbering) of a dataset in a bucket into
        the node's cache in the background, in order (nothing for a local dataset)."""
        if self.bucket is not None:
            self.bucket.fetch_ahead(list(groups), self._rg_shard)

    @property
    def downloaded_bytes(self) -> int:
        """Bytes this process downloaded into the node's cache (0 for a local dataset)."""
        return self.bucket.cache.downloaded if self.bucket is not None else 0

    def _slices(self, rows: np.ndarray) -> tuple[list[tuple], int, int]:
        """Per row: (tokens, cu_seqlens, doc ids, optional columns) views into cached row groups;
        total tokens and documents."""
        groups = self.row_group_of(rows)
        return self.views(groups.tolist(), (rows - self._rg_start[groups]).tolist(), [])

    def views(
        self, groups: list[int], local: list[int], parts: list[tuple]
    ) -> tuple[list[tuple], int, int]:
        """`_slices` of the rows at `local` in row groups `groups`, appended to `parts` (a
        mixture collects several stores' rows in one list); the tokens and documents added."""
        n_tokens = n_docs = 0
        optional = self.optional
        for i, g in zip(local, groups, strict=True):
            data = self.row_group(g)
            a, b = data.token_offsets[i : i + 2].tolist()
            oa, ob = data.doc_offsets_offsets[i : i + 2].tolist()
            ia = int(data.doc_ids_offsets[i])
            ib = ia + ob - oa - 1
            extra = (
                {
                    c.name: data.columns[c.name][a:b]
                    if c.level == TOKEN
                    else data.columns[c.name][ia:ib]
                    for c in optional
                }
                if optional
                else _NO_COLUMNS
            )
            parts.append((data.tokens[a:b], data.doc_offsets[oa:ob], data.doc_ids[ia:ib], extra))
            n_tokens += b - a
            n_docs += ib - ia
        return parts, n_tokens, n_docs

    def gather_into(
        self, rows: np.ndarray, dest: Documents, at: tuple[int, int] = (0, 0)
    ) -> tuple[int, int] | None:
        """Write the rows' documents into preallocated arrays, from token and document `at`.

        Args:
            rows: Global row indices, in batch order.
            dest: Destination arrays: tokens (any integer dtype that holds `token_dtype`),
                doc_lens (int32), doc_ids (int64) and one array per optional column (`optional`).
            at: The token and document of `dest` where the rows go (a mixture writes several
                stores' rows one after another).

        Returns:
            `(n_tokens, n_docs)` written from `at`, or None (nothing written) when the arrays
            are too small.
        """
        parts, n_tokens, n_docs = self._slices(rows)
        t, d = at
        if t + n_tokens > dest.n_tokens or d + n_docs > min(dest.n_docs, len(dest.doc_ids)):
            return None
        self._write(parts, dest, t, d)
        return n_tokens, n_docs

    def _write(self, parts: list[tuple], dest: Documents, t: int = 0, d: int = 0) -> None:
        write_parts(parts, dest, self.optional, t, d)

    def empty_record(self, n_tokens: int, n_docs: int) -> Documents:
        """Uninitialised arrays for `n_tokens` tokens and `n_docs` documents (stored dtypes)."""
        return empty_documents(n_tokens, n_docs, self.token_dtype, self.optional)

    def gather(self, rows: np.ndarray) -> Documents:
        """The rows' documents, concatenated in the given order.

        Returns:
            A `Documents`: tokens in `token_dtype` `(total_tokens,)`, document lengths int32
            `(n_docs,)`, document ids int64 `(n_docs,)`, and the optional columns the dataset
            has (`optional`, e.g. `loss_mask` uint8 `(total_tokens,)`).
        """
        parts, n_tokens, n_docs = self._slices(rows)
        out = self.empty_record(n_tokens, n_docs)
        self._write(parts, out)
        return out

    def row_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every row's token count, document count and attention cost Σ len², at once.

        Reads the `doc_offsets` column of every shard and holds 24 bytes a row (24 GB at 10^9
        rows): for checks and small datasets. `PackedDataset` reads them per row group instead
        (`row_stats`, `loader.store.row_index.RowIndex`).

        Returns:
            `(lengths int64, n_docs int64, sq_cost float64)`, each `(num_rows,)`.
        """
        self._own()
        if self._decoder is not None:  # the decode thread is the only one reading the files
            return self._decoder.submit(self._row_index).result()
        return self._row_index()

    def _row_index(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.bucket is not None:  # row group by row group, through the node's cache
            stats = [self.row_stats(g) for g in range(self.num_row_groups)]
            return (
                np.concatenate([s.lengths for s in stats] or [np.zeros(0)]).astype(np.int64),
                np.concatenate([s.n_docs for s in stats] or [np.zeros(0)]).astype(np.int64),
                np.concatenate([s.sq for s in stats] or [np.zeros(0, np.float64)]),
            )
        lengths = np.empty(self.num_rows, dtype=np.int64)
        n_docs = np.empty(self.num_rows, dtype=np.int64)
        sq = np.empty(self.num_rows, dtype=np.float64)
        pos = 0
        for i, info in enumerate(self.manifest.shards):
            where = self._names[i]
            try:
                col = (
                    self._files.get(i)
                    .read(columns=["doc_offsets"], use_threads=False)
                    .column("doc_offsets")
                )
                off, off_off, nulls = list_parts(col)
            except (pa.ArrowException, OSError) as exc:
                raise DataError(
                    f"{where}: doc_offsets unreadable ({one_line(exc)}); the shard is damaged"
                ) from None
            stats = offsets_stats(
                off, off_off, nulls, max_len=self.max_len, where=where, first_row=0
            )
            n = len(stats.lengths)
            lengths[pos : pos + n] = stats.lengths
            n_docs[pos : pos + n] = stats.n_docs
            sq[pos : pos + n] = stats.sq
            if n != info.rows or int(stats.lengths.sum()) != info.tokens:
                raise DataError(
                    f"{where}: {n} rows of {int(stats.lengths.sum())} tokens but index.json says "
                    f"{info.rows} of {info.tokens}; the shard is damaged"
                )
            pos += n
        return lengths, n_docs, sq

    def row_stats(self, g: int) -> GroupStats:
        """Row lengths, document counts and Σ len² of row group `g` (global numbering).

        Reads only that row group's `doc_offsets` column (a few KB), through file handles of its
        own: what `loader.store.row_index.RowIndex` loads when a window of the epoch order needs it.
        """
        self._own()
        shard, local = int(self._rg_shard[g]), int(self._rg_local[g])
        where = self._names[shard]
        if self.bucket is not None:
            try:
                col = self.bucket.read(g, shard, local, ["doc_offsets"])
            except (pa.ArrowException, OSError) as exc:
                raise DataError(
                    f"{where}: row group {local}: doc_offsets unreadable ({one_line(exc)}); the shard is "
                    "damaged"
                ) from None
            off, off_off, nulls = list_parts(col.column("doc_offsets"))
            return offsets_stats(
                off, off_off, nulls, max_len=self.max_len, where=where,
                first_row=int(self._rg_first[g]),
            )  # fmt: skip
        with self._stats_lock:
            pf = self._stats_files.get(shard)
            try:
                col = pf.read_row_group(local, columns=["doc_offsets"], use_threads=False)
                off, off_off, nulls = list_parts(col.column("doc_offsets"))
            except (pa.ArrowException, OSError) as exc:
                raise DataError(
                    f"{where}: row group {local}: doc_offsets unreadable ({one_line(exc)}); the shard is "
                    "damaged"
                ) from None
        return offsets_stats(
            off,
            off_off,
            nulls,
            max_len=self.max_len,
            where=where,
            first_row=int(self._rg_first[g]),
        )
