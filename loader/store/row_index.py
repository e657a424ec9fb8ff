"""Per-row token and document counts, read one row group at a time when the order needs them.

A token budget cuts batches by row length, a static shape bounds documents per batch, rank
balance weighs rows by Σ len²: each needs a number per row. Held for every row at once that is
24 bytes a row, ~24 GB per rank at 10^9 rows; `RowIndex` instead reads a row group's counts when
a window of the epoch order first touches it (`ShardStore.row_stats`: the row group's
`doc_offsets` column only, ~1 % of its bytes) and keeps the recent ones in an LRU bounded in
bytes (16 bytes a row). A dataset whose counts fit the bound is read once per process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from packtool.errors import DataError

DEFAULT_CACHE_BYTES = 32 << 20
"""Row counts kept per process: 2 M rows, ~500 default shuffle windows."""


@dataclass(frozen=True)
class GroupStats:
    """The counts of one row group's rows."""

    lengths: NDArray[np.int32]
    """Tokens of each row `(rows,)`."""
    n_docs: NDArray[np.int32]
    """Documents of each row `(rows,)`."""
    sq: NDArray[np.float64]
    """Σ len² over each row's documents `(rows,)` (attention cost)."""

    @property
    def nbytes(self) -> int:
        return self.lengths.nbytes + self.n_docs.nbytes + self.sq.nbytes


def group_stats(
    lengths: NDArray[np.integer],
    n_docs: NDArray[np.integer] | None = None,
    sq: NDArray[np.floating] | None = None,
) -> GroupStats:
    """A `GroupStats` from arrays (one document per row and Σ len² = len² when not given)."""
    lengths = np.asarray(lengths)
    return GroupStats(
        lengths=lengths.astype(np.int32, copy=False),
        n_docs=(np.ones(len(lengths)) if n_docs is None else np.asarray(n_docs)).astype(
            np.int32, copy=False
        ),
        sq=(lengths.astype(np.float64) ** 2 if sq is None else np.asarray(sq, np.float64)),
    )


def offsets_stats(
    off: np.ndarray, off_off: np.ndarray, nulls: int, *, max_len: int, where: str, first_row: int
) -> GroupStats:
    """Row lengths, document counts and Σ len² from a `doc_offsets` column's values and offsets.

    Checks what the counts rely on (at least 2 offsets a row, starting at 0, ending in
    `1..max_len`); the rest of a row is checked when its row group is decoded.

    Args:
        off: The offsets of every row back to back.
        off_off: `(rows + 1,)` offsets of each row's offsets into `off`.
        nulls: Nulls found in the column (any is an error).
        max_len: The manifest's max_len.
        where: The shard file, for messages.
        first_row: Index of the first row inside the shard, for messages.
    """
    counts = np.diff(off_off)
    if nulls or (counts < 2).any():
        raise DataError(f"{where}: malformed doc_offsets (null or fewer than 2 entries)")
    ends = off[off_off[1:] - 1].astype(np.int64)
    bad = (ends > max_len) | (ends <= 0) | (off[off_off[:-1]] != 0)
    if bad.any():
        row = first_row + int(np.flatnonzero(bad)[0])
        raise DataError(f"{where}: row {row}: doc_offsets out of range; the shard is damaged")
    steps = np.diff(off.astype(np.int64))
    sq_all = np.zeros(len(off), dtype=np.float64)
    sq_all[1:] = np.cumsum(steps.astype(np.float64) ** 2)
    # Σ over a row's documents = prefix-sum difference; the cross-row step is excluded because
    # each row's range starts at its own first offset.
    return GroupStats(
        lengths=ends.astype(np.int32),
        n_docs=(counts - 1).astype(np.int32),
        sq=sq_all[off_off[1:] - 1] - sq_all[off_off[:-1]],
    )


class RowIndex:
    """Random access to every row's counts, loaded per row group on demand.

    Args:
        group_starts: First row of every row group plus the row count, int64 `(groups + 1,)`.
        read: Reads the counts of row group `g` (global numbering).
        cache_bytes: Bound on the counts kept (at least one row group is always kept).
    """

    def __init__(
        self,
        group_starts: NDArray[np.int64],
        read: Callable[[int], GroupStats],
        *,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        prefetch: Callable[[list[int]], None] | None = None,
    ) -> None:
        self.group_starts = np.asarray(group_starts, dtype=np.int64)
        self.read = read
        self.prefetch = prefetch
        """Called with the row groups `stats` is about to read, before it reads them one by one
        (a bucket's store starts their downloads on its fetch threads, all at once)."""
        self.cache_bytes = int(cache_bytes)
        self._cache: OrderedDict[int, GroupStats] = OrderedDict()
        self._cached_bytes = 0
        self._lock = threading.Lock()
        self.groups_read = 0
        """Row groups whose counts this process read (cache misses)."""

    @classmethod
    def from_arrays(
        cls,
        lengths: NDArray[np.integer],
        n_docs: NDArray[np.integer] | None = None,
        sq: NDArray[np.floating] | None = None,
        *,
        group_starts: NDArray[np.int64] | None = None,
    ) -> RowIndex:
        """An index over counts already in memory (tests, references, small datasets)."""
        n = len(lengths)
        starts = np.array([0, n], np.int64) if group_starts is None else group_starts
        full = group_stats(lengths, n_docs, sq)

        def read(g: int) -> GroupStats:
            a, b = int(starts[g]), int(starts[g + 1])
            return GroupStats(full.lengths[a:b], full.n_docs[a:b], full.sq[a:b])

        return cls(starts, read, cache_bytes=0)

    # A lock cannot be pickled, and a spawned copy starts with its own lock and an empty cache
    # (a forked one keeps the parent's, copied with the process).
    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_lock"] = None
        state["_cache"] = OrderedDict()
        state["_cached_bytes"] = 0
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def num_rows(self) -> int:
        return int(self.group_starts[-1])

    @property
    def num_groups(self) -> int:
        return len(self.group_starts) - 1

    @property
    def nbytes(self) -> int:
        """Bytes of counts held in the cache now."""
        return self._cached_bytes

    def group(self, g: int) -> GroupStats:
        """The counts of row group `g`, from the cache when possible."""
        with self._lock:
            data = self._cache.get(g)
            if data is not None:
                self._cache.move_to_end(g)
                return data
        data = self.read(g)
        with self._lock:
            if g not in self._cache:
                self.groups_read += 1
                self._cache[g] = data
                self._cached_bytes += data.nbytes
                while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                    _, old = self._cache.popitem(last=False)
                    self._cached_bytes -= old.nbytes
        return data

    def warm(self, groups: list[int]) -> None:
        """Hand the row groups of `groups` not cached yet to `prefetch`, when more than one is
        about to be read (one alone is read as fast in place)."""
        if self.prefetch is None or len(groups) < 2:
            return
        with self._lock:
            missing = [g for g in groups if g not in self._cache]
        if len(missing) > 1:
            self.prefetch(missing)

    def stats(
        self, rows: NDArray[np.integer]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
        """`(lengths int64, n_docs int64, sq float64)` of the given global rows, each `(n,)`."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
        groups = np.searchsorted(self.group_starts, rows, side="right") - 1
        uniq, inv = np.unique(groups, return_inverse=True)
        self.warm(uniq.tolist())
        parts = [self.group(g) for g in uniq.tolist()]
        # The row groups' counts side by side: one gather per column, not one per row group.
        sizes = np.fromiter((len(p.lengths) for p in parts), np.int64, len(parts))
        base = np.cumsum(sizes) - sizes
        at = base[inv] + (rows - self.group_starts[groups])
        return (
            np.concatenate([p.lengths for p in parts])[at].astype(np.int64),
            np.concatenate([p.n_docs for p in parts])[at].astype(np.int64),
            np.concatenate([p.sq for p in parts])[at],
        )

    def scan(self) -> Iterator[GroupStats]:
        """Every row group's counts in stored order, read once and not cached (whole-dataset
        checks: O(rows) time, one row group in memory)."""
        for g in range(self.num_groups):
            with self._lock:
                data = self._cache.get(g)
            yield self.read(g) if data is None else data

    def top_n_docs(self, k: int) -> NDArray[np.int64]:
        """The `k` largest per-row document counts (fewer when there are fewer rows), one pass."""
        top = np.zeros(0, np.int64)
        for data in self.scan():
            both = np.concatenate([top, data.n_docs.astype(np.int64)])
            top = both if len(both) <= k else np.partition(both, -k)[-k:]
        return top
