"""A mixture's sources, row by row: each source's epoch order as a `packtool.mixture.schedule`
`LengthReader`, plus the rows themselves for gathering.

A packed source reads its epoch order and row counts the way `PackedDataset` does, lazily: the
order is the dataset's `EpochOrder` (loader/order/permutation.py: a window of rows computed when a
position inside it is first asked for), shuffled with the mixture's seed and shuffle settings,
and a row's tokens, documents and attention cost come from the dataset's `RowIndex`
(loader/store/row_index.py: one row group's counts read when first touched, an LRU bounded in bytes).
Nothing per row of a source is held: at 10^9 rows a source costs what a `PackedDataset` costs
(~12 bytes per row group for each of the two epoch orders kept, 20 for the shard store's table,
the index's 32 MB cache), not the 24 bytes a row of `ShardStore.row_index()`.

A streaming source (`StreamingPackedDataset`) is packed whole, as one stream (one slot, whatever
the rank and worker), so its rows do not depend on how many workers read the mixture; each
process packs it ahead in small windows and forgets rows once the mixture has passed them.
Resuming it re-packs its current epoch up to the cursor (the cost of online packing: its state is
its buffer, not a position).

Both gather rows as `loader.record.Documents` with the mixture's optional columns; a source
without one of them (a plain source in a mixture with masked ones) fills it as "no mask" would
read (`loss_mask` 1: every token a target, as `PackedDataset` trains on such a source).
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from loader.config import LoaderConfig
from loader.online.rows import PackedRows
from loader.online.state import config_state
from loader.online.streaming import StreamingPackedDataset
from loader.order.permutation import EpochOrder
from loader.packed.dataset import PackedDataset
from loader.record import Documents
from packtool.dataset.columns import LOSS_MASK, TOKEN, Column, get, optional
from packtool.errors import ConfigError
from packtool.mixture.spec import MixtureSpec, SourceSpec, read_mixture_file
from packtool.storage import local as storage

STREAM_BLOCK = 256
"""Positions of a streaming source that count as one "row group" (prefetch, worker ownership)."""
MISSING_FILL = {LOSS_MASK: 1}
"""What a source without an optional column contributes to it (a mask of 1: all supervised)."""


def missing_fill(column: Column, source: str) -> int:
    """The value a source lacking `column` fills it with, or a `ConfigError`."""
    if column.name not in MISSING_FILL:
        raise ConfigError(
            f"source {source!r} has no {column.name!r} column but other sources of the mixture "
            f"do; a mixture can fill only {sorted(MISSING_FILL)}"
        )
    return MISSING_FILL[column.name]


def fill_missing(
    dest: Documents, have: tuple[Column, ...], name: str, t: int, d: int, n_tok: int, n_doc: int
) -> None:
    """Fill the columns of `dest` that the source (`have`) lacks, for its `n_tok` tokens and
    `n_doc` documents written from token `t` and document `d`."""
    own = {c.name for c in have}
    for col, values in dest.columns.items():
        if col not in own:
            c = get(col)
            a, n = (t, n_tok) if c.level == TOKEN else (d, n_doc)
            values[a : a + n] = missing_fill(c, name)


class PackedSource:
    """A packed dataset folder as a mixture source.

    Args:
        spec: The source (its `path` a folder or a `PackedDataset`, whose folder is used).
        config: The mixture's loader settings (seed, shuffle, shuffle_window, cache, verify,
            page checksums).
        cache_share: The part of `config.cache_bytes` this source's decoded row groups may
            hold (the mixture splits the process's cache over its sources); it keeps at least
            a shuffle window and one row group more whatever their bytes.
    """

    kind = "packed"
    window = 4096
    former_fingerprints: tuple[str, ...] = ()
    """Other fingerprints a saved state may record for this data (none: its dataset's)."""

    def __init__(
        self, spec: SourceSpec, config: LoaderConfig, cache_share: int | None = None
    ) -> None:
        self.name = spec.name
        path = spec.path.store.path if isinstance(spec.path, PackedDataset) else spec.path
        self.ds = PackedDataset(
            path,
            rows_per_batch=1,
            seed=config.seed,
            shuffle=config.shuffle,
            shuffle_window=config.shuffle_window,
            cache_bytes=config.cache_bytes if cache_share is None else cache_share,
            verify=config.verify,
            page_checksums=config.page_checksums,
            cache_dir=config.cache_dir,
            cache_limit=config.cache_limit,
            rank=0,
            world_size=1,
        )
        self.store = self.ds.store
        # a windowed shuffle draws from a whole window of row groups at once
        self.store.min_row_groups = config.shuffle_window + 1 if config.shuffle else 2
        self.index = self.ds.index  # RowIndex: counts per row group, loaded on demand
        self.path = str(self.store.path)
        self.fingerprint = self.ds.fingerprint
        self.data = (self.fingerprint, f"fingerprint {self.fingerprint}")
        """What the same-data check compares, and its words (`check_distinct_data`)."""
        self.tokenizer = dict(self.store.manifest.tokenizer)
        self.max_len = int(self.store.max_len)
        self.token_dtype = self.store.token_dtype
        self.num_rows = int(self.store.num_rows)
        self.num_tokens = int(self.store.manifest.num_tokens)
        self.columns: tuple[Column, ...] = self.store.optional
        self._orders: OrderedDict[int, EpochOrder] = OrderedDict()
        self._recent: deque[tuple[int, int, tuple[np.ndarray, ...]]] = deque(maxlen=2)

    def order(self, epoch: int) -> EpochOrder:
        """`epoch`'s row order (the mixture reads two epochs at an epoch's edge: both kept)."""
        order = self._orders.get(epoch)
        if order is None:
            order = self.ds.order(epoch)
            self._orders[epoch] = order
            while len(self._orders) > 2:
                self._orders.popitem(last=False)
        return order

    def epoch_rows(self, epoch: int) -> int:
        return self.num_rows

    def epoch_tokens(self, epoch: int) -> int:
        """Tokens of an epoch (index.json's, checked against the rows when they are counted)."""
        return self.num_tokens

    def ids(self, epoch: int, start: int, n: int) -> np.ndarray:
        """Row ids at positions `start .. start + n - 1` of `epoch`'s order (fewer at its end)."""
        return self.order(epoch).rows(start, start + n)

    def lengths(self, epoch: int, start: int, n: int) -> np.ndarray:
        return self._described(epoch, start, n)[1]

    def describe_rows(self, epoch: int, start: int, n: int) -> tuple[np.ndarray, ...]:
        """`(row ids, documents, attention cost, row groups, index in the row group)` of `n`
        rows from `start`."""
        ids, _, docs, sq, groups, local = self._described(epoch, start, n)
        return ids, docs, sq, groups, local

    def _described(self, epoch: int, start: int, n: int) -> tuple[np.ndarray, ...]:
        """`(row ids, tokens, documents, attention cost, row groups, index in the row group)`
        of `n` rows from `start` of `epoch`'s order (fewer at its end): worked out once for the
        rows the schedule reads ahead (`lengths`, a window at a time) and sliced when the
        stream describes them (`describe_rows`)."""
        for e, a, cols in self._recent:
            if e == epoch and a <= start and start + n <= a + len(cols[0]):
                return tuple(c[start - a : start - a + n] for c in cols)
        ids = self.ids(epoch, start, n)
        lengths, docs, sq = self.index.stats(ids)
        groups = self.store.row_group_of(ids)
        cols = (ids, lengths, docs, sq, groups, ids - self.store.row_group_starts[groups])
        self._recent.append((epoch, start, cols))
        return cols

    def top_n_docs(self, k: int) -> np.ndarray:
        """The `k` largest per-row document counts (one pass over the counts: static shape)."""
        return self.index.top_n_docs(k)

    def docs_per_token(self) -> float:
        """Documents per token (sizes ring slots): `PackedDataset.docs_per_token`."""
        return self.ds.docs_per_token()

    def gather_into(self, rows: np.ndarray, dest: Documents, t: int, d: int) -> tuple[int, int]:
        """Write rows (row ids) into `dest` from token `t` and document `d` (the caller sized it
        from the counts); `(tokens, documents)` written."""
        sizes = self.store.gather_into(rows, dest, (t, d))
        assert sizes is not None
        if len(dest.columns) > len(self.columns):
            fill_missing(dest, self.columns, self.name, t, d, *sizes)
        return sizes

    def prefetch(self, groups: np.ndarray | list[int]) -> None:
        """Start decoding these row groups (first-use order; cached or pending ones skipped)."""
        self.store.prefetch(groups)

    def release(self, epoch: int, pos: int) -> None:
        """Nothing to forget: rows are read from the shards on demand."""

    def close_iteration(self) -> None:
        self.store.cancel_prefetch()


class _OneStream(StreamingPackedDataset):
    """The whole source as one stream: slot 0 of 1 in every process and DataLoader worker,
    yielding each packed row's `Documents` (optional columns included) instead of a batch.
    Its epoch is each process's own: every process that reads the source starts its passes
    itself (`StreamSource._seek`), two epochs at once at an epoch's edge."""

    share_start = False

    def _slot(self) -> tuple[int, int]:
        return 0, 1

    def _emit(self, rows: PackedRows) -> Documents:
        return rows.documents


class _Pass:
    """One epoch of a streaming source being packed: its iterator and the rows held (those
    from position `base` on that the mixture has not passed)."""

    __slots__ = ("base", "ended", "it", "rows")

    def __init__(self, it: Any) -> None:
        self.it = it
        self.base = 0
        self.rows: list[Documents] = []
        self.ended = False

    def pull(self, stop: int) -> None:
        """Pack rows until position `stop` is held (or the epoch ends)."""
        while not self.ended and self.base + len(self.rows) < stop:
            row = next(self.it, None)
            if row is None:
                self.ended = True
                break
            self.rows.append(row)

    def forget(self, pos: int) -> None:
        """Drop the rows before position `pos`."""
        if pos > self.base:
            drop = min(pos - self.base, len(self.rows))
            del self.rows[:drop]
            self.base += drop


class StreamSource:
    """A `StreamingPackedDataset` as a mixture source (see the module docstring).

    Each epoch is packed once, as its own pass: the schedule reads the next epoch's lengths
    (a new pass) before the rows of this one in the same chunk are described and gathered, so
    every epoch not yet passed keeps its pass; `release` drops the rows, and the passes of
    earlier epochs, that the mixture has passed (what is held is what the schedule read ahead).
    """

    kind = "streaming"
    window = 256

    def __init__(self, spec: SourceSpec, config: LoaderConfig) -> None:
        src: StreamingPackedDataset = spec.path
        self.name = spec.name
        self.path = ", ".join(str(p) for p in src.paths[:3]) + (
            " ..." if len(src.paths) > 3 else ""
        )
        self.ds = _OneStream(
            src.paths, src.config, rows_per_batch=1, shard_by=src.shard_by, rank=0, world_size=1
        )
        # the same files are the same data (equal names and sizes are not: two part.parquet)
        files = tuple(str(storage.resolve(p)) for p in src.paths)
        self.data = (files, f"the same files: {self.path}")
        settings = (src.num_documents, sorted(config_state(src.config).items()))
        # A resume identifies the source by content: each file's size and Parquet footer, in
        # order (`self.ds.footers`, one ranged read per file when the stream was opened), so
        # byte-identical files staged again (another folder, a new modification time) resume
        # and a file rewritten with other documents (other footer) is other data.
        content = repr((self.ds.footers, settings)).encode()
        self.fingerprint = hashlib.sha256(content).hexdigest()[:16]
        self.former_fingerprints = _former_fingerprints(src.paths, files, settings)
        """What states saved before recorded for these files (their resolved paths with sizes
        and modification times; before that, their names and sizes): such a state resumes,
        checked as it was then."""
        self.tokenizer = src.identity.to_dict() if src.identity is not None else {}
        self.max_len = int(src.config.max_len)
        self.token_dtype = np.dtype(np.uint32)
        self.columns = tuple(get(n) for n in src.columns if get(n).loaded)
        self.num_rows: int | None = None
        self._passes: dict[int, _Pass] = {}  # epoch -> its pass, epochs not yet passed

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_passes={})
        return state

    def epoch_rows(self, epoch: int) -> None:
        return None

    def epoch_tokens(self, epoch: int) -> None:
        return None

    def _seek(self, epoch: int, start: int) -> _Pass:
        """`epoch`'s pass, holding position `start` (a new pass replays up to it: a resume, or
        a second look at a row already forgotten)."""
        held = self._passes.get(epoch)
        if held is not None and held.base <= start:
            return held
        self.ds.set_epoch(epoch)
        held = self._passes[epoch] = _Pass(iter(self.ds))
        held.pull(start)
        held.forget(start)
        return held

    def lengths(self, epoch: int, start: int, n: int) -> np.ndarray:
        held = self._seek(epoch, start)
        held.pull(start + n)
        rows = held.rows[start - held.base : start - held.base + n]
        return np.asarray([r.n_tokens for r in rows], dtype=np.int64)

    def describe_rows(self, epoch: int, start: int, n: int) -> tuple[np.ndarray, ...]:
        """`(-1 (no row ids), documents, attention cost, blocks, index in the block)` of `n`
        rows from `start`."""
        rows = [self.row(epoch, p) for p in range(start, start + n)]
        docs = np.asarray([r.n_docs for r in rows], dtype=np.int64)
        sq = np.asarray([float((r.doc_lens.astype(np.float64) ** 2).sum()) for r in rows])
        pos = np.arange(start, start + n, dtype=np.int64)
        return np.full(n, -1, np.int64), docs, sq, pos // STREAM_BLOCK, pos % STREAM_BLOCK

    def row(self, epoch: int, pos: int) -> Documents:
        held = self._seek(epoch, pos)
        held.pull(pos + 1)
        if pos - held.base >= len(held.rows):
            raise ConfigError(f"source {self.name!r}: row {pos} of epoch {epoch} does not exist")
        return held.rows[pos - held.base]

    def gather_into(self, rows: np.ndarray, dest: Documents, t: int, d: int) -> tuple[int, int]:
        """`rows`: (epoch, pos) pairs, int64 `(n, 2)`, written from token `t` and document `d`."""
        t0, d0 = t, d
        for epoch, pos in rows.tolist():
            r = self.row(epoch, pos)
            n, k = r.n_tokens, r.n_docs
            dest.tokens[t : t + n] = r.tokens
            dest.doc_lens[d : d + k] = r.doc_lens
            dest.doc_ids[d : d + k] = r.doc_ids
            for name, values in r.columns.items():
                if name in dest.columns:
                    if get(name).level == TOKEN:
                        dest.columns[name][t : t + n] = values
                    else:
                        dest.columns[name][d : d + k] = values
            t += n
            d += k
        fill_missing(dest, self.columns, self.name, t0, d0, t - t0, d - d0)
        return t - t0, d - d0

    def prefetch(self, groups: np.ndarray | list[int]) -> None:
        """Rows are packed when the schedule reads their lengths."""

    def release(self, epoch: int, pos: int) -> None:
        """Forget the rows before position `pos` of `epoch`, and earlier epochs' passes (the
        mixture has passed them)."""
        for e in [e for e in self._passes if e < epoch]:
            del self._passes[e]
        held = self._passes.get(epoch)
        if held is not None:
            held.forget(pos)

    def close_iteration(self) -> None:
        self._passes = {}


def _former_fingerprints(paths: Sequence[Any], files: tuple[str, ...], settings: Any) -> tuple:
    """A streaming source's fingerprints as states saved before content identity recorded them:
    over its resolved files with each one's size and modification time (from 2026-12-07 on, until
    content identity came in the same day), and over its file names and sizes (before). One
    stat per file."""
    states = storage.file_states(files)
    by_path = hashlib.sha256(repr((states, settings)).encode()).hexdigest()[:16]
    old = hashlib.sha256()
    for p, st in zip(paths, states, strict=True):
        old.update(f"{Path(p).name}:{st[1]};".encode())
    old.update(repr(settings).encode())
    return by_path, old.hexdigest()[:16]


def open_source(
    spec: SourceSpec, config: LoaderConfig, cache_share: int | None = None
) -> PackedSource | StreamSource:
    """The reader for a source: a packed folder or `PackedDataset` (its row-group cache
    `cache_share` bytes, default `config.cache_bytes`), or a `StreamingPackedDataset`."""
    if isinstance(spec.path, StreamingPackedDataset):
        return StreamSource(spec, config)
    if not isinstance(spec.path, (str, Path, PackedDataset)) and not hasattr(
        spec.path, "__fspath__"
    ):
        raise ConfigError(
            f"source {spec.name!r}: path must be a packed dataset folder, a PackedDataset or a "
            f"StreamingPackedDataset, got {type(spec.path).__name__}"
        )
    return PackedSource(spec, config, cache_share)


def mixture_columns(sources: Sequence[PackedSource | StreamSource]) -> tuple[Column, ...]:
    """The optional columns of a mixture's batches: every one a source has, in declared order
    (a source without one fills it, `loader.mixture.sources.missing_fill`, or is refused)."""
    have = {c.name: c for s in sources for c in s.columns}
    out = tuple(c for c in optional() if c.name in have)
    for s in sources:
        for c in out:
            if c not in s.columns:
                missing_fill(c, s.name)  # raises for a column nothing can stand in for
    return out


def as_mixture(mixture: Any) -> MixtureSpec:
    """A `MixtureSpec` from a spec, a mixture file, or a list of `SourceSpec`."""
    if isinstance(mixture, MixtureSpec):
        return mixture
    if isinstance(mixture, (str, os.PathLike)):
        return read_mixture_file(mixture)
    if isinstance(mixture, Sequence) and all(isinstance(s, SourceSpec) for s in mixture):
        return MixtureSpec(sources=tuple(mixture))
    raise ConfigError(
        "a mixture is a MixtureSpec, a mixture file (.json/.yaml) or a list of SourceSpec, got "
        f"{type(mixture).__name__}"
    )
