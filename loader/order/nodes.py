"""An epoch order dealt to nodes: each node's ranks read rows of that node's own windows.

In the plain order (`EpochOrder`) a global step is the world's rank batches cut one after
another from one shuffle window, so every rank reads rows of nearly every row group of the
epoch and every node downloads all of them from a bucket (benchmarks/node_reads.py: 98 % a
rank, 100 % a node, at 8 nodes of 8 ranks). `NodeOrder` deals the plain order's windows
round-robin to `nodes` streams (window j to stream j % nodes, in the plain order's window
order) and lays the streams out so that each global step gives node n `stripe` consecutive rows
of stream n: position p lies in block `b = p // (nodes * stripe)`, stream
`c = (p % (nodes * stripe)) // stripe`, at stream position `b * stripe + p % stripe`. With
`stripe` = ranks per node x `rows_per_batch`, a step's rank batches cut one after another give
node n's ranks rows of stream n only, so a node reads ~1/nodes of the row groups.

Streams differ in length by their last windows and by shards' shorter last row groups, whose
share of each stream varies like a random walk (the spread grows with the square root of the
windows a stream). Once the shortest cannot fill a block (the *tail*, at the epoch's end), the
streams' remaining rows follow one stream after another, and those last steps read rows of
other nodes' windows: ~86 k rows at 8 nodes, ~734 k at 64 (0.01 % and 0.07 %) of a 10^9-row
dataset in 61 k shards of 16,000-16,700 rows (256-row row groups, 16-row-group windows, stripe
64), ~2.6x `nodes` x (largest window + `stripe`).

A pure function of the plain order, `nodes` and `stripe` (every rank computes the same one),
and a permutation of the plain order's positions: the same rows, each once. The free order
(`window=0`) has no windows to deal. Held: two int64 per window, its number and its start in
its stream (~3.9 MB at 10^9 rows in 256-row row groups and 16-row-group windows), besides the
plain order, which keeps up to 4 + 2 x `nodes` windows (at most `MOST_CACHED`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.order.permutation import WINDOWS_CACHED, EpochOrder

MOST_CACHED = 64
"""Most windows of the plain order kept (32 KB each at 4,096 rows): whole steps of more than
~30 nodes, which only reports read (a rank reads its own node's), compute some again."""


class NodeOrder:
    """The row at every position of an epoch's stream dealt to `nodes` nodes.

    Args:
        base: The plain order (windowed or stored; not the free one).
        nodes: Streams (nodes), >= 1; 1 is the plain order itself.
        stripe: Consecutive positions of one stream a block holds (ranks per node x
            `rows_per_batch`), >= 1.
    """

    def __init__(self, base: EpochOrder, *, nodes: int, stripe: int) -> None:
        if base.kind == "free":
            raise ValueError("the free order (window=0) has no windows to deal to nodes")
        if nodes < 1 or stripe < 1:
            raise ValueError(f"nodes and stripe must be >= 1, got {nodes} and {stripe}")
        self.base, self.nodes, self.stripe = base, int(nodes), int(stripe)
        self.group_starts = base.group_starts
        self.num_rows = base.num_rows
        self.kind, self.window = base.kind, base.window
        # A whole step reads one window of each stream: keep them and their neighbours, up to
        # `MOST_CACHED` (a rank reads its own node's rows only: `rank_rows`).
        wanted = min(WINDOWS_CACHED + 2 * self.nodes, MOST_CACHED)
        base.windows_cached = max(base.windows_cached, wanted)
        sizes = np.diff(base.window_starts)
        self._windows = [np.arange(c, len(sizes), self.nodes) for c in range(self.nodes)]
        """Each stream's windows (the plain order's numbers), in stream order."""
        self._starts = []
        """Each stream's window starts (stream positions), then its length."""
        for windows in self._windows:
            starts = np.zeros(len(windows) + 1, dtype=np.int64)
            np.cumsum(sizes[windows], out=starts[1:])
            self._starts.append(starts)
        lengths = np.array([int(s[-1]) for s in self._starts], dtype=np.int64)
        self._blocks = int(lengths.min()) // self.stripe
        """Blocks every stream fills (before the tail)."""
        self.tail_start = self._blocks * self.nodes * self.stripe
        """First position of the tail."""
        self._tail = np.zeros(self.nodes + 1, dtype=np.int64)
        np.cumsum(lengths - self._blocks * self.stripe, out=self._tail[1:])

    def __len__(self) -> int:
        return self.num_rows

    @property
    def nbytes(self) -> int:
        """Bytes this order holds besides `group_starts` (the plain order's included)."""
        mine = sum(a.nbytes + b.nbytes for a, b in zip(self._windows, self._starts, strict=True))
        return self.base.nbytes + mine

    @property
    def max_window_rows(self) -> int:
        """Positions over which one window's rows spread (`nodes` x its rows: a stream advances
        `stripe` rows a block of `nodes` x `stripe`), which bounds the steps of a worker block
        (`block_steps_bound`)."""
        return self.nodes * self.base.max_window_rows

    def streams(
        self, positions: NDArray[np.integer]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """`(stream, stream position)` of each position."""
        p = np.asarray(positions, dtype=np.int64)
        span = self.nodes * self.stripe
        stream = (p % span) // self.stripe
        at = (p // span) * self.stripe + p % self.stripe
        tail = p >= self.tail_start
        if tail.any():
            t = p[tail] - self.tail_start
            c = np.searchsorted(self._tail, t, side="right") - 1
            stream[tail] = c
            at[tail] = self._blocks * self.stripe + t - self._tail[c]
        return stream, at

    def _locate(
        self, positions: NDArray[np.integer]
    ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
        """`(where in the plain order, the plain order's window)` of each position's row (the
        window is the stream's, found on the way: no search of the plain order's starts)."""
        stream, at = self.streams(positions)
        where = np.empty(len(at), dtype=np.int64)
        window = np.empty(len(at), dtype=np.int64)
        for c in np.unique(stream).tolist():
            mine = stream == c
            q = at[mine]
            k = np.searchsorted(self._starts[c], q, side="right") - 1
            window[mine] = self._windows[c][k]
            where[mine] = self.base.window_starts[window[mine]] + q - self._starts[c][k]
        return where, window

    def window_of(self, positions: NDArray[np.integer]) -> NDArray[np.int64]:
        """The plain order's window holding each position's row (`num_windows` for a position
        at or past the end, as `EpochOrder.window_of` says for its own)."""
        p = np.asarray(positions, dtype=np.int64)
        inside = p < self.num_rows
        out = np.full(len(p), self.base.num_windows, dtype=np.int64)
        out[inside] = self._locate(p[inside])[1]
        return out

    def rows(self, a: int, b: int) -> NDArray[np.int64]:
        """Row ids at positions `[a, b)` of the stream, int64 `(b - a,)`."""
        a, b = max(int(a), 0), min(int(b), self.num_rows)
        if a >= b:
            return np.zeros(0, dtype=np.int64)
        where, window = self._locate(np.arange(a, b, dtype=np.int64))
        out = np.empty(len(where), dtype=np.int64)
        for j in np.unique(window).tolist():
            mine = window == j
            out[mine] = self.base.window_rows(j)[where[mine] - self.base.window_starts[j]]
        return out

    __getitem__ = EpochOrder.__getitem__
    __array__ = EpochOrder.__array__
