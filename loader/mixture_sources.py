"""A mixture's sources, row by row: each source's epoch order as a `packtool.schedule`
`LengthReader`, plus the rows themselves for gathering.

A packed source reads its epoch order through `PackedDataset`'s public API only: a private
`PackedDataset` over the same folder with one rank and `rows_per_batch=ORDER_CHUNK`, whose step
s is positions `s * ORDER_CHUNK ...` of the epoch order (`plan` / `rows_for`), shuffled with the
mixture's seed and shuffle settings. Row lengths come from `ShardStore.row_index()`.

A streaming source (`StreamingPackedDataset`) is packed whole, as one stream (one slot, whatever
the rank and worker), so its rows do not depend on how many workers read the mixture; each
process packs it ahead in small windows and forgets rows once the mixture has passed them.
Resuming it re-packs its current epoch up to the cursor (the cost of online packing: its state is
its buffer, not a position).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from loader.config import LoaderConfig
from loader.dataset import PackedDataset
from loader.online_state import config_state
from loader.streaming import StreamingPackedDataset
from packtool.errors import ConfigError
from packtool.mixture import SourceSpec

ORDER_CHUNK = 1024
"""Epoch-order positions per step of a packed source's private plan."""


class PackedSource:
    """A packed dataset folder as a mixture source.

    Args:
        spec: The source (its `path` a folder or a `PackedDataset`, whose folder is used).
        config: The mixture's loader settings (seed, shuffle, shuffle_window, cache, verify).
    """

    kind = "packed"
    window = 4096

    def __init__(self, spec: SourceSpec, config: LoaderConfig) -> None:
        self.name = spec.name
        path = spec.path.store.path if isinstance(spec.path, PackedDataset) else spec.path
        self.ds = PackedDataset(
            path,
            rows_per_batch=ORDER_CHUNK,
            seed=config.seed,
            shuffle=config.shuffle,
            shuffle_window=config.shuffle_window,
            cache_bytes=config.cache_bytes,
            verify=config.verify,
            rank=0,
            world_size=1,
        )
        self.store = self.ds.store
        self.path = str(self.store.path)
        self.fingerprint = self.ds.fingerprint
        self.tokenizer = dict(self.store.manifest.tokenizer)
        self.max_len = int(self.store.max_len)
        self.token_dtype = self.store.token_dtype
        self.num_rows = int(self.store.num_rows)
        self.row_len: np.ndarray | None = None
        self._plans: OrderedDict[int, Any] = OrderedDict()
        self._asked: set[int] = set()

    def load_index(self) -> None:
        """Per-row tokens, documents and attention cost (`ShardStore.row_index`), once."""
        if self.row_len is None:
            self.row_len, self.row_docs, self.row_sq = self.store.row_index()

    def _plan(self, epoch: int) -> Any:
        plan = self._plans.get(epoch)
        if plan is None:
            # ds.plan caches one epoch; the mixture reads two at an epoch's edge
            plan = self.ds.plan(epoch)
            self._plans[epoch] = plan
            while len(self._plans) > 2:
                self._plans.popitem(last=False)
        return plan

    def epoch_rows(self, epoch: int) -> int:
        return self.num_rows

    def ids(self, epoch: int, start: int, n: int) -> np.ndarray:
        """Row ids at positions `start .. start + n - 1` of `epoch`'s order (fewer at its end)."""
        stop = min(start + n, self.num_rows)
        if stop <= start:
            return np.zeros(0, np.int64)
        plan = self._plan(epoch)
        first, last = start // ORDER_CHUNK, (stop - 1) // ORDER_CHUNK
        parts = [self.ds.rows_for(plan, c, 0) for c in range(first, last + 1)]
        rows = parts[0] if len(parts) == 1 else np.concatenate(parts)
        base = first * ORDER_CHUNK
        return np.asarray(rows[start - base : stop - base], dtype=np.int64)

    def lengths(self, epoch: int, start: int, n: int) -> np.ndarray:
        self.load_index()
        return self.row_len[self.ids(epoch, start, n)]

    def describe_rows(self, epoch: int, start: int, n: int) -> tuple[np.ndarray, ...]:
        """`(row ids, documents, attention cost)` of `n` rows from `start` of `epoch`."""
        self.load_index()
        ids = self.ids(epoch, start, n)
        return ids, self.row_docs[ids], self.row_sq[ids]

    def gather_into(
        self, rows: np.ndarray, tokens: np.ndarray, lens: np.ndarray, ids: np.ndarray
    ) -> tuple[int, int]:
        sizes = self.store.gather_into(rows, tokens, lens, ids)
        assert sizes is not None  # the caller sized the arrays from the row index
        return sizes

    def prefetch(self, groups: list[int]) -> None:
        """Start decoding these row groups (first-use order) unless asked for lately."""
        new = [g for g in dict.fromkeys(groups) if g not in self._asked]
        if new and self.store.pending_row_groups < 16:
            if len(self._asked) > 256:
                self._asked.clear()
            self._asked.update(new)
            self.store.prefetch(np.asarray(new, np.int64))

    def release(self, epoch: int, pos: int) -> None:
        """Nothing to forget: rows are read from the shards on demand."""

    def close_iteration(self) -> None:
        self.store.cancel_prefetch()
        self._asked.clear()


class _OneStream(StreamingPackedDataset):
    """The whole source as one stream: slot 0 of 1 in every process and DataLoader worker."""

    def _slot(self) -> tuple[int, int]:
        return 0, 1


class StreamSource:
    """A `StreamingPackedDataset` as a mixture source (see the module docstring)."""

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
        h = hashlib.sha256()
        for p in src.paths:
            h.update(f"{Path(p).name}:{Path(p).stat().st_size};".encode())
        h.update(repr((src.num_documents, sorted(config_state(src.config).items()))).encode())
        self.fingerprint = h.hexdigest()[:16]
        self.tokenizer = src.identity.to_dict() if src.identity is not None else {}
        self.max_len = int(src.config.max_len)
        self.token_dtype = np.dtype(np.uint32)
        self.num_rows: int | None = None
        self._epoch: int | None = None
        self._it: Any = None
        self._base = 0  # position of the first row held
        self._rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._ended = False

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_epoch=None, _it=None, _rows=[], _base=0, _ended=False)
        return state

    def load_index(self) -> None:
        """Row lengths are known once a row is packed."""

    def epoch_rows(self, epoch: int) -> None:
        return None

    def _seek(self, epoch: int, start: int) -> None:
        if self._epoch == epoch and self._base <= start:
            return
        self.ds.set_epoch(epoch)
        self._it, self._epoch, self._base, self._rows, self._ended = (
            iter(self.ds),
            epoch,
            0,
            [],
            False,
        )
        self._pull(start)  # replay up to the cursor (a resume, or a second look at an old row)
        self.release(epoch, start)

    def _pull(self, stop: int) -> None:
        while not self._ended and self._base + len(self._rows) < stop:
            batch = next(self._it, None)
            if batch is None:
                self._ended = True
                break
            cu = batch["cu_seqlens"].numpy()
            self._rows.append(
                (
                    batch["input_ids"].numpy().astype(self.token_dtype),
                    np.diff(cu).astype(np.int32),
                    batch["doc_ids"].numpy().copy(),
                )
            )

    def lengths(self, epoch: int, start: int, n: int) -> np.ndarray:
        self._seek(epoch, start)
        self._pull(start + n)
        rows = self._rows[start - self._base : start - self._base + n]
        return np.asarray([len(r[0]) for r in rows], dtype=np.int64)

    def describe_rows(self, epoch: int, start: int, n: int) -> tuple[np.ndarray, ...]:
        """`(-1 (no row ids), documents, attention cost)` of `n` rows from `start` of `epoch`."""
        rows = [self.row(epoch, p) for p in range(start, start + n)]
        docs = np.asarray([len(r[1]) for r in rows], dtype=np.int64)
        sq = np.asarray([float((r[1].astype(np.float64) ** 2).sum()) for r in rows])
        return np.full(n, -1, np.int64), docs, sq

    def row(self, epoch: int, pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        self._seek(epoch, pos)
        self._pull(pos + 1)
        if pos - self._base >= len(self._rows):
            raise ConfigError(f"source {self.name!r}: row {pos} of epoch {epoch} does not exist")
        return self._rows[pos - self._base]

    def gather_into(
        self, rows: np.ndarray, tokens: np.ndarray, lens: np.ndarray, ids: np.ndarray
    ) -> tuple[int, int]:
        """`rows`: (epoch, pos) pairs, int64 `(n, 2)`."""
        t = d = 0
        for epoch, pos in rows.tolist():
            tok, dl, di = self.row(epoch, pos)
            tokens[t : t + len(tok)] = tok
            lens[d : d + len(dl)] = dl
            ids[d : d + len(di)] = di
            t += len(tok)
            d += len(dl)
        return t, d

    def prefetch(self, groups: list[int]) -> None:
        """Rows are packed when the schedule reads their lengths."""

    def release(self, epoch: int, pos: int) -> None:
        """Forget the rows of `epoch` before `pos` (the mixture has passed them)."""
        if self._epoch == epoch and pos > self._base:
            drop = min(pos - self._base, len(self._rows))
            del self._rows[:drop]
            self._base += drop

    def close_iteration(self) -> None:
        self._epoch, self._it, self._rows, self._base, self._ended = None, None, [], 0, False


def open_source(spec: SourceSpec, config: LoaderConfig) -> PackedSource | StreamSource:
    """The reader for a source: a packed folder or `PackedDataset`, or a
    `StreamingPackedDataset`."""
    if isinstance(spec.path, StreamingPackedDataset):
        return StreamSource(spec, config)
    if not isinstance(spec.path, (str, Path, PackedDataset)) and not hasattr(
        spec.path, "__fspath__"
    ):
        raise ConfigError(
            f"source {spec.name!r}: path must be a packed dataset folder, a PackedDataset or a "
            f"StreamingPackedDataset, got {type(spec.path).__name__}"
        )
    return PackedSource(spec, config)
