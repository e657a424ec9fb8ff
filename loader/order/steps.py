"""Global steps: an epoch's order cut into rank batches, split over ranks, computed lazily.

Everything here is a pure function of (dataset fingerprint, seed, epoch, batching settings,
world size): worker counts never enter, so the token stream is the same with 0 or 8 workers.

The epoch's order (`loader.order.permutation.EpochOrder`) is cut, from a start position (`origin`, 0
unless resuming with other settings), into *rank batches* of consecutive rows: `rows_per_batch`
rows each, or, with a token budget, as many rows as fit greedily in `tokens_per_batch` (and in
`max_docs` documents). Global step k is rank batches `k*W .. k*W + W - 1` (W = world size); rank r
takes the r-th. Every rank runs the same number of steps: with `drop_last` an incomplete last
step is dropped; without it, ranks that have no rows left in the last step get a *filler* batch
(one row repeated with every label -100 and doc_ids -1), so they run the step but learn nothing
from it and no row is trained on twice.

Nothing is computed for the whole epoch up front. With `rows_per_batch` a batch's rows are
arithmetic. With a token budget the greedy cut runs forward from an *anchor* (a batch index whose
start position is known: the origin, or the step a resume state names together with its row
cursor) a chunk at a time (`FIRST_CHUNK` batches, doubling up to `CHUNK`), reading only the rows'
lengths it passes (per row group, `loader.store.row_index.RowIndex`); each chunk's end becomes a new
anchor, so going back to any step already passed costs one chunk, and the state held is one
anchor per `CHUNK` batches plus a few cached chunks. Where a cut from an earlier anchor reaches a
resume anchor, the two must agree (else a `DataError`). `num_steps` with a token budget is the
one thing that needs the cut to the end of the epoch (every row's length, once; cached).

`iter_blocks` groups the steps into blocks for `PackedDataLoader` workers, one window of the
order each, so a worker decodes its own windows' row groups and few others.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
from numpy.typing import NDArray

from loader.order.balance import balance_step, row_cost
from loader.order.permutation import EpochOrder
from loader.store.row_index import RowIndex
from packtool.errors import DataError

CHUNK = 1024
"""Most rank batches cut at a time from an anchor (token budget)."""
FIRST_CHUNK = 64
"""Rank batches cut from an origin or resume anchor; each next chunk is twice the last, up to
`CHUNK` (a first batch needs only a few rows' lengths, a long run few anchors)."""
PIECE = 8192
"""Most positions whose row lengths are read at a time while cutting (the first piece of a cut
is 256, then doubling)."""
CHUNKS_CACHED = 8
BLOCK_STEPS_CAP = 1024
"""Most steps `block_steps` reports (it sizes the transport ring: one slot per step)."""


def greedy_cut(
    lengths: NDArray[np.integer],
    n_docs: NDArray[np.integer] | None,
    *,
    tokens_per_batch: int,
    max_docs: int | None,
) -> NDArray[np.int64]:
    """Boundaries of greedy token-budget batches over rows in stream order, `(n_batches + 1,)`.

    A batch takes rows while its tokens stay within `tokens_per_batch` (and its documents within
    `max_docs`); a single row always fits (rows are checked against max_len upfront). Where a
    batch starting at each row would end is found for all rows at once (`searchsorted`); the
    batches are then the chain of those ends from row 0 (~0.1 µs a batch).
    """
    n = len(lengths)
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    ends = np.searchsorted(cum, cum[:-1] + tokens_per_batch, side="right") - 1
    if max_docs is not None:
        assert n_docs is not None
        cum_docs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_docs, out=cum_docs[1:])
        docs_end = np.searchsorted(cum_docs, cum_docs[:-1] + max_docs, side="right") - 1
        np.minimum(ends, docs_end, out=ends)
    np.maximum(ends, np.arange(1, n + 1), out=ends)
    jump = ends.tolist()
    bounds = [0]
    start = 0
    while start < n:
        start = jump[start]
        bounds.append(start)
    return np.asarray(bounds, dtype=np.int64)


def cut_batches(
    order: NDArray[np.integer],
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    max_docs: int | None = None,
    lengths: NDArray[np.integer] | None = None,
    n_docs: NDArray[np.integer] | None = None,
) -> NDArray[np.int64]:
    """Boundaries of consecutive rank batches over a materialised `order`, `(n_batches + 1,)`.

    The plain reference of `EpochPlan`'s lazy cut (tests, small datasets).

    Args:
        order: Row indices in stream order.
        rows_per_batch: Fixed rows per batch (exclusive with `tokens_per_batch`).
        tokens_per_batch: Token budget; rows are added in order while the budget holds.
        max_docs: Also stop a batch before it exceeds this many documents (static shapes).
        lengths: Token count of every row (indexed by row id); needed with a token budget.
        n_docs: Document count of every row; needed with `max_docs`.
    """
    n = len(order)
    if rows_per_batch is not None:
        return np.append(np.arange(0, n, rows_per_batch, dtype=np.int64), n)
    assert tokens_per_batch is not None and lengths is not None
    return greedy_cut(
        lengths[order],
        None if n_docs is None else n_docs[order],
        tokens_per_batch=tokens_per_batch,
        max_docs=max_docs,
    )


class EpochPlan:
    """The global steps of one epoch from a start position, computed when asked for.

    Args:
        order: The epoch's order.
        origin: Position in `order` where the first step starts.
        world_size: Ranks.
        rows_per_batch: Fixed rows per rank batch (exclusive with `tokens_per_batch`).
        tokens_per_batch: Token budget per rank batch.
        max_docs: Also close a budget batch before it exceeds this many documents.
        drop_last: Drop an incomplete last step.
        index: Row lengths (and document counts); needed with a token budget.
    """

    def __init__(
        self,
        order: EpochOrder,
        *,
        origin: int = 0,
        world_size: int = 1,
        rows_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
        max_docs: int | None = None,
        drop_last: bool = False,
        index: RowIndex | None = None,
    ) -> None:
        if (rows_per_batch is None) == (tokens_per_batch is None):
            raise ValueError("give exactly one of rows_per_batch or tokens_per_batch")
        if tokens_per_batch is not None and index is None:
            raise ValueError("a token budget needs the row index")
        self.order = order
        self.num_rows = len(order)
        self.origin = min(max(int(origin), 0), self.num_rows)
        self.world_size = int(world_size)
        self.full_rows = rows_per_batch
        """rows_per_batch in row mode (a rank batch with fewer rows is incomplete)."""
        self.tokens_per_batch = tokens_per_batch
        self.max_docs = max_docs
        self.drop_last = drop_last
        self.index = index
        # Token budget: batch index -> start position, where known (sorted keys); chunks of
        # starts cut from an anchor; the batch count once the cut has reached the end.
        self._anchor_keys = [0]
        self._anchors = {0: self.origin}
        self._sizes = {0: FIRST_CHUNK}  # batches to cut from each anchor
        self._chunks: OrderedDict[int, NDArray[np.int64]] = OrderedDict()
        self._n_batches: int | None = None
        self._hint: tuple[int, NDArray[np.int64]] | None = None  # the chunk used last
        self._empty_from: int | None = None  # a batch index known to start at the end
        if rows_per_batch is not None:
            self._n_batches = -(-(self.num_rows - self.origin) // rows_per_batch)

    # ---- rank batches -------------------------------------------------------------------------

    def anchor(self, batch: int, position: int) -> None:
        """Record that rank batch `batch` starts at `position` (a resume state's cursor), so the
        cut resumes there instead of at the origin."""
        batch, position = int(batch), int(position)
        if self.full_rows is not None or batch <= 0:
            return
        if position >= self.num_rows:
            self._empty_from = batch if self._empty_from is None else min(self._empty_from, batch)
        elif batch not in self._anchors:
            bisect.insort(self._anchor_keys, batch)
            self._anchors[batch] = position
            self._sizes[batch] = FIRST_CHUNK

    def batch_starts(self, first: int, last: int) -> NDArray[np.int64]:
        """Start positions of rank batches `first..last` (inclusive), int64; a batch past the
        end starts at `num_rows` (so batch i's rows are `starts[i] .. starts[i + 1]`)."""
        count = last - first + 1
        if count <= 0:
            return np.zeros(0, dtype=np.int64)
        if self.full_rows is not None:
            i = np.arange(first, last + 1, dtype=np.int64)
            return np.minimum(self.origin + i * self.full_rows, self.num_rows)
        if self._hint is not None:  # most calls fall in the chunk used last (read-only)
            a, starts = self._hint
            if a <= first and last < a + len(starts):
                return starts[first - a : last - a + 1]
        out = np.full(count, self.num_rows, dtype=np.int64)
        i = first
        while i <= last:
            if (self._n_batches is not None and i >= self._n_batches) or (
                self._empty_from is not None and i >= self._empty_from
            ):
                break
            a, starts = self._chunk_at(i)
            end = a + len(starts) - 1
            if end < i:  # the cut ended before batch i
                continue
            upto = min(last, end)
            out[i - first : upto - first + 1] = starts[i - a : upto - a + 1]
            if upto == last:
                break
            # Go on from this chunk's end (an anchor), so the cut between two anchors is never
            # skipped: a resume anchor is checked where the cut from before reaches it.
            i = upto
        return out

    def _chunk_at(self, i: int) -> tuple[int, NDArray[np.int64]]:
        """`(a, starts)`: a chunk of batch starts from anchor `a` that holds batch `i`, or the
        last chunk when the epoch ends before `i`."""
        a = self._anchor_keys[bisect.bisect_right(self._anchor_keys, i) - 1]
        while True:
            starts = self._chunks.get(a)
            if starts is None:
                starts = self._cut_from(a)
            else:
                self._chunks.move_to_end(a)
            end = a + len(starts) - 1
            if i <= end or starts[-1] >= self.num_rows or end not in self._anchors:
                self._hint = (a, starts)
                return a, starts
            a = end

    def _cut_from(self, a: int) -> NDArray[np.int64]:
        """Cut up to `CHUNK` batches from anchor `a` (fewer before the next anchor or the end)."""
        k = bisect.bisect_right(self._anchor_keys, a)
        limit = self._anchor_keys[k] if k < len(self._anchor_keys) else None
        size = min(self._sizes[a], CHUNK)
        m = size if limit is None else min(size, limit - a)
        if self._empty_from is not None:
            m = min(m, max(self._empty_from - a, 0))
        starts = self._cut(self._anchors[a], m)
        end = a + len(starts) - 1
        if starts[-1] >= self.num_rows:
            self._n_batches = end
            if limit is not None or (self._empty_from is not None and self._empty_from < end):
                self._mismatch(limit if limit is not None else self._empty_from)
        elif end in self._anchors:
            if self._anchors[end] != starts[-1]:
                self._mismatch(end)
        elif self._empty_from is not None and end >= self._empty_from:
            self._mismatch(self._empty_from)
        else:
            bisect.insort(self._anchor_keys, end)
            self._anchors[end] = int(starts[-1])
            self._sizes[end] = 2 * size
        starts.flags.writeable = False
        self._chunks[a] = starts
        while len(self._chunks) > CHUNKS_CACHED:
            self._chunks.popitem(last=False)
        return starts

    def _mismatch(self, batch: int) -> None:
        raise DataError(
            f"the resume state puts rank batch {batch} at a row where this plan has none "
            "start; the checkpoint is damaged or from other data"
        )

    def _cut(self, p: int, m: int) -> NDArray[np.int64]:
        """Start positions `[p, e1, ..., em]` of `m` greedy budget batches from position `p`
        (fewer, the last ending at `num_rows`, when the order ends first)."""
        n = self.num_rows
        out = [np.array([p], dtype=np.int64)]
        got = 0
        start = p  # first position not yet in a finished batch
        lengths = np.zeros(0, np.int64)
        docs = np.zeros(0, np.int64)
        piece = min(256, PIECE)
        while got < m and start < n:
            have = start + len(lengths)
            stop = min(have + piece, n)
            piece = min(2 * piece, PIECE)
            length, n_doc, _ = self.index.stats(self.order.rows(have, stop))
            lengths = np.concatenate([lengths, length])
            docs = np.concatenate([docs, n_doc])
            bounds = greedy_cut(
                lengths,
                docs if self.max_docs is not None else None,
                tokens_per_batch=self.tokens_per_batch,
                max_docs=self.max_docs,
            )
            if stop < n:  # the last batch may still grow with the next piece's rows
                bounds = bounds[:-1]
            bounds = bounds[1 : m - got + 1]
            if len(bounds):
                out.append(start + bounds)
                got += len(bounds)
                cut = int(bounds[-1])
                start += cut
                lengths, docs = lengths[cut:], docs[cut:]
        return np.concatenate(out)

    @property
    def num_batches(self) -> int:
        """Rank batches in the plan (a token budget cuts the rest of the epoch once)."""
        while self._n_batches is None:
            last = self._anchor_keys[-1]
            if self._empty_from is not None and self._empty_from <= last:
                self._n_batches = self._empty_from  # never: anchors lie before the end
            else:
                self._chunk_at(last + CHUNK)
        return self._n_batches

    # ---- global steps -------------------------------------------------------------------------

    @property
    def num_steps(self) -> int:
        """Global steps in the plan (every rank runs them all)."""
        n_batches, w = self.num_batches, self.world_size
        if not self.drop_last:
            return -(-n_batches // w)
        steps = n_batches // w
        if steps and self.full_rows is not None:
            lo, hi = self.batch_starts(steps * w - 1, steps * w).tolist()
            if hi - lo < self.full_rows:
                steps -= 1
        return steps

    def has_step(self, step: int) -> bool:
        """Whether global `step` is in the plan (cuts no further than that step)."""
        if step < 0:
            return False
        w = self.world_size
        if not self.drop_last:
            return int(self.batch_starts(step * w, step * w)[0]) < self.num_rows
        lo, hi = self.batch_starts(step * w + w - 1, step * w + w).tolist()
        return lo < self.num_rows and (self.full_rows is None or hi - lo == self.full_rows)

    def steps(self, first: int, stride: int = 1) -> Iterator[int]:
        """Steps `first, first + stride, ...` while they are in the plan."""
        step = first
        while self.has_step(step):
            yield step
            step += stride

    def cursor_after(self, steps: int) -> int:
        """Position in `order` after the first `steps` global steps (rows consumed)."""
        if steps <= 0:
            return self.origin
        return int(self.batch_starts(steps * self.world_size, steps * self.world_size)[0])

    def step_rows(
        self, step: int, first: int = 0, count: int | None = None
    ) -> list[NDArray[np.int64]]:
        """Row ids of each rank for global `step` (an empty array means a filler batch); with
        `first` and `count`, of ranks `first .. first + count - 1` only (a rank's own batch: an
        order dealt to nodes then computes one node's rows, not every node's)."""
        w = self.world_size
        count = w - first if count is None else count
        starts = self.batch_starts(step * w + first, step * w + first + count)
        rows = self.order.rows(int(starts[0]), int(starts[-1]))
        cuts = (starts - starts[0]).tolist()
        return [rows[cuts[r] : cuts[r + 1]] for r in range(count)]

    def check_position(self, *, epoch: int, step: int, cursor: int, own_step: bool) -> None:
        """Refuse a resume position `(step, cursor)` that cannot belong to this plan.

        With `rows_per_batch` the cursor of a step is arithmetic and checked exactly; with a
        token budget it is bounded (each rank batch holds 1 to `tokens_per_batch` rows), the rest
        is the state's check value (loader/packed/resume.py).
        """
        w = self.world_size
        where = f"the state resumes at step {step} of epoch {epoch} at row {cursor}"
        if self.full_rows is not None:
            want = min(self.origin + step * w * self.full_rows, self.num_rows)
            if not own_step and step > self.num_steps:
                raise DataError(
                    f"the state resumes at step {step} of epoch {epoch}, which has "
                    f"{self.num_steps} steps; the checkpoint is damaged"
                )
            if cursor != want:
                raise DataError(
                    f"{where}, but that step starts at row {want}; the checkpoint is damaged"
                )
            return
        rows = cursor - self.origin
        low = 0 if step == 0 else (step - 1) * w + 1
        high = step * w * self.tokens_per_batch
        if (step == 0 and rows != 0) or rows > high or (cursor < self.num_rows and rows < low):
            raise DataError(
                f"{where}, but {step} steps of {w} rank batches cannot consume {rows} rows; the "
                "checkpoint is damaged"
            )


def plan_epoch(
    *,
    num_rows: int,
    fingerprint: str,
    seed: int,
    epoch: int,
    world_size: int,
    origin: int = 0,
    shuffle: bool = True,
    drop_last: bool = False,
    rows_per_batch: int | None = None,
    tokens_per_batch: int | None = None,
    max_docs: int | None = None,
    lengths: NDArray[np.integer] | None = None,
    n_docs: NDArray[np.integer] | None = None,
    group_starts: NDArray[np.int64] | None = None,
    window: int = 0,
    index: RowIndex | None = None,
) -> EpochPlan:
    """An `EpochPlan` from plain arguments (the row counts as arrays or as a `RowIndex`).

    Without `group_starts` the dataset is one row group (so `window` > 0 is a free shuffle too).
    """
    if group_starts is None:
        group_starts = np.array([0, num_rows], dtype=np.int64)
        window = 0
    if index is None and lengths is not None:
        index = RowIndex.from_arrays(lengths, n_docs, group_starts=group_starts)
    order = EpochOrder(
        group_starts,
        fingerprint=fingerprint,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        window=window,
    )
    return EpochPlan(
        order,
        origin=origin,
        world_size=world_size,
        rows_per_batch=rows_per_batch,
        tokens_per_batch=tokens_per_batch,
        max_docs=max_docs,
        drop_last=drop_last,
        index=index,
    )


def epoch_permutation(
    n_rows: int,
    *,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    group_starts: NDArray[np.int64] | None = None,
    window: int = 0,
) -> NDArray[np.int64]:
    """The whole epoch order as an array, int64 `(n_rows,)` (8 bytes a row: tests and small
    datasets; the loader itself uses `EpochOrder` lazily). Without `group_starts`, a free
    shuffle."""
    if group_starts is None:
        group_starts, window = np.array([0, n_rows], dtype=np.int64), 0
    order = EpochOrder(
        group_starts,
        fingerprint=fingerprint,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        window=window,
    )
    return np.asarray(order)


def rank_rows(
    plan: EpochPlan,
    step: int,
    rank: int,
    *,
    balance: bool = False,
    index: RowIndex | None = None,
    linear: float = 0.0,
    rows_cap: int | None = None,
    tokens_cap: int | None = None,
    docs_cap: int | None = None,
    nodes: int = 1,
) -> NDArray[np.int64]:
    """Row ids rank `rank` trains on at global `step` (empty: a filler batch).

    With `balance`, the step's rows are reassigned to ranks by attention cost (`index`'s
    Σ len² + `linear` × tokens) under the caps: among the ranks of `rank`'s node with `nodes`
    > 1 (each node keeps the rows of its own windows, `loader.order.nodes`).
    """
    group = plan.world_size // nodes
    if not balance or group == 1:
        return plan.step_rows(step, rank, 1)[0]
    first = rank - rank % group
    per_rank = plan.step_rows(step, first, group)
    rows = np.concatenate(per_rank)
    assert index is not None
    lengths, n_docs, sq = index.stats(rows)
    assignment = balance_step(
        rows,
        row_cost(sq, lengths, linear),
        group,
        lengths=lengths,
        n_docs=n_docs,
        rows_cap=rows_cap,
        tokens_cap=tokens_cap,
        docs_cap=docs_cap,
    )
    if assignment is None:  # no balanced split fits the caps: keep the plain one
        return per_rank[rank - first]
    return rows[assignment == rank - first]


def iter_blocks(
    plan: EpochPlan, first: int, *, per_step: bool = False, node: int | None = None
) -> Iterator[tuple[int, int]]:
    """`(start, end)` step ranges of the `PackedDataLoader` worker blocks from step `first`.

    A block is the run of steps whose middle row lies in one window of the order (a step that
    crosses a window's edge goes with the window holding most of its rows), so a worker decodes
    its windows' row groups plus a few of a neighbour's. The first block starts at `first`.
    With `per_step` (a free shuffle, which has no windows) every step is its own block. With
    `node` (an order dealt to nodes, `loader.order.nodes`): the middle row of that node's rank
    batches, so the blocks follow the windows of the node's own stream (streams' windows differ
    in size, so another stream's edges would cut each of the node's windows in two, and two
    workers would decode its row groups).
    """
    w = plan.world_size
    ranks = None if node is None else w // plan.order.nodes
    start, window, step = first, None, first
    while plan.has_step(step):
        if per_step:
            yield step, step + 1
            step += 1
            continue
        count = 256
        starts = plan.batch_starts(step * w, (step + count) * w)
        lo, hi = starts[:-1:w][:count], starts[w::w][:count]
        middle = (lo + hi) // 2
        if ranks is not None:  # the node's rank batches; the step's middle where it has none
            a, b = starts[node * ranks :: w][: len(lo)], starts[(node + 1) * ranks :: w][: len(lo)]
            middle = np.where(a < b, (a + b) // 2, middle)
        windows = plan.order.window_of(middle).tolist()
        for j in windows:
            if not plan.has_step(step):
                break
            if j != window and step > start:
                yield start, step
                start = step
            window = j
            step += 1
    if not per_step and step > start:
        yield start, step


def block_steps_bound(plan: EpochPlan, *, max_len: int, per_step: bool = False) -> int:
    """At least the most steps in one worker block (sizes the transport ring), capped at
    `BLOCK_STEPS_CAP`, without cutting the epoch.

    A block's steps have their middle rows in one window of S rows. With `rows_per_batch` those
    middles are `W × rows_per_batch` apart (the short last step aside): at most
    `ceil(S / (W × rows)) + 1` of them. A budget batch holds at least `tokens_per_batch //
    max_len` rows (1 under a document cap): the steps inside the window, plus one crossing each
    edge.
    """
    if per_step:
        return 1
    rows = plan.order.max_window_rows
    if plan.full_rows is not None:
        steps = -(-rows // (plan.full_rows * plan.world_size)) + 1
    else:
        per_batch = 1
        if plan.max_docs is None:
            per_batch = max(plan.tokens_per_batch // max(max_len, 1), 1)
        steps = -(-rows // (per_batch * plan.world_size)) + 2
    return int(min(steps, BLOCK_STEPS_CAP))
