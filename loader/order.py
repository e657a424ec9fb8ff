"""Global row order: one seeded permutation per epoch, cut into global steps, split over ranks.

Everything here is a pure function of (dataset fingerprint, seed, epoch, batching settings,
world size): worker counts never enter, so the token stream is the same with 0 or 8 workers.

An epoch's permutation is cut, from a start position (`origin`, 0 unless resuming with other
settings), into *rank batches* of consecutive rows: `rows_per_batch` rows each, or, with a token
budget, as many rows as fit greedily in `tokens_per_batch` (and in `max_docs` documents). Global
step k is rank batches `k*W .. k*W + W - 1` (W = world size); rank r takes the r-th. Every rank
runs the same number of steps: with `drop_last` an incomplete last step is dropped; without it,
ranks that have no rows left in the last step get a *filler* batch (one row repeated with every
label -100 and doc_ids -1), so they run the step but learn nothing from it and no row is
trained on twice.

`worker_block_starts` groups the steps into blocks for `PackedDataLoader` workers, one shuffle
window each, so a worker decodes its own windows' row groups and few others.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from loader.balance import balance_step


def epoch_permutation(
    n_rows: int,
    *,
    fingerprint: str,
    seed: int,
    epoch: int,
    shuffle: bool = True,
    group_starts: np.ndarray | None = None,
    window: int = 0,
) -> np.ndarray:
    """The epoch's row order, int64 `(n_rows,)`; depends only on its arguments.

    Args:
        n_rows: Rows in the dataset.
        fingerprint: The dataset fingerprint (a different dataset gets a different order).
        seed: The run's seed.
        epoch: The epoch.
        shuffle: False gives the stored order.
        group_starts: First row of every row group plus the row count, `(n_groups + 1,)`;
            needed with `window`.
        window: 0 shuffles all rows freely. Otherwise row groups are shuffled, taken `window` at a
            time, and the rows of each window shuffled together: every row group is then decoded
            once per epoch (per worker) instead of once per row, when the cache holds a window.
    """
    if not shuffle:
        return np.arange(n_rows, dtype=np.int64)
    digest = hashlib.sha256(f"{fingerprint}:{seed}:{epoch}".encode()).digest()
    rng = np.random.default_rng(np.frombuffer(digest[:16], dtype=np.uint32).tolist())
    if not window or group_starts is None:
        return rng.permutation(n_rows).astype(np.int64, copy=False)
    n_groups = len(group_starts) - 1
    groups = rng.permutation(n_groups)
    sizes = np.diff(group_starts)[groups]
    # Rows of the shuffled row groups, in the new group order.
    rows = np.repeat(group_starts[groups] - np.cumsum(np.concatenate([[0], sizes[:-1]])), sizes)
    rows += np.arange(int(sizes.sum()), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])[::window]
    bounds = np.append(bounds, len(rows)) if bounds[-1] != len(rows) else bounds
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        rows[a:b] = rows[a:b][rng.permutation(b - a)]
    return rows.astype(np.int64, copy=False)


def cut_batches(
    order: np.ndarray,
    *,
    rows_per_batch: int | None,
    tokens_per_batch: int | None,
    max_docs: int | None = None,
    lengths: np.ndarray | None = None,
    n_docs: np.ndarray | None = None,
) -> np.ndarray:
    """Boundaries of consecutive rank batches over `order`, int64 `(n_batches + 1,)`.

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
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths[order], out=cum[1:])
    cum_docs = None
    if max_docs is not None:
        assert n_docs is not None
        cum_docs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_docs[order], out=cum_docs[1:])
    bounds = [0]
    start = 0
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + tokens_per_batch, side="right")) - 1
        if cum_docs is not None:
            end = min(
                end, int(np.searchsorted(cum_docs, cum_docs[start] + max_docs, side="right")) - 1
            )
        end = max(end, start + 1)  # a single row always fits (checked against max_len upfront)
        bounds.append(end)
        start = end
    return np.asarray(bounds, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class EpochPlan:
    """The global steps of one epoch from a start position."""

    order: np.ndarray
    """The epoch permutation, int64 `(num_rows,)`."""
    origin: int
    """Position in `order` where this plan's first step starts."""
    bounds: np.ndarray
    """Rank-batch boundaries as positions in `order` (absolute), `(n_batches + 1,)`."""
    world_size: int
    num_steps: int
    full_rows: int | None = None
    """rows_per_batch in row mode (a rank batch with fewer rows is incomplete)."""

    def cursor_after(self, steps: int) -> int:
        """Position in `order` after the first `steps` global steps (rows consumed)."""
        if steps <= 0:
            return self.origin
        last = min(steps * self.world_size, len(self.bounds) - 1)
        return int(self.bounds[last])

    def step_rows(self, step: int) -> list[np.ndarray]:
        """Row ids of each rank for global `step` (an empty array means a filler batch)."""
        out = []
        for r in range(self.world_size):
            b = step * self.world_size + r
            if b + 1 < len(self.bounds):
                out.append(self.order[self.bounds[b] : self.bounds[b + 1]])
            else:
                out.append(self.order[:0])
        return out


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
    lengths: np.ndarray | None = None,
    n_docs: np.ndarray | None = None,
    group_starts: np.ndarray | None = None,
    window: int = 0,
) -> EpochPlan:
    """Cut an epoch into global steps (see the module docstring)."""
    order = epoch_permutation(
        num_rows,
        fingerprint=fingerprint,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
        group_starts=group_starts,
        window=window,
    )
    origin = min(max(int(origin), 0), num_rows)
    bounds = origin + cut_batches(
        order[origin:],
        rows_per_batch=rows_per_batch,
        tokens_per_batch=tokens_per_batch,
        max_docs=max_docs,
        lengths=lengths,
        n_docs=n_docs,
    )
    n_batches = len(bounds) - 1
    if drop_last:
        num_steps = n_batches // world_size
        if num_steps and rows_per_batch is not None:
            last = num_steps * world_size - 1
            if bounds[last + 1] - bounds[last] < rows_per_batch:
                num_steps -= 1
    else:
        num_steps = -(-n_batches // world_size)
    return EpochPlan(
        order=order,
        origin=origin,
        bounds=bounds,
        world_size=world_size,
        num_steps=num_steps,
        full_rows=rows_per_batch,
    )


def rank_rows(
    plan: EpochPlan,
    step: int,
    rank: int,
    *,
    balance: bool = False,
    cost: np.ndarray | None = None,
    lengths: np.ndarray | None = None,
    n_docs: np.ndarray | None = None,
    rows_cap: int | None = None,
    tokens_cap: int | None = None,
    docs_cap: int | None = None,
) -> np.ndarray:
    """Row ids rank `rank` trains on at global `step` (empty: a filler batch)."""
    per_rank = plan.step_rows(step)
    if not balance or plan.world_size == 1:
        return per_rank[rank]
    rows = np.concatenate(per_rank)
    assert cost is not None
    assignment = balance_step(
        rows,
        cost[rows],
        plan.world_size,
        lengths=None if lengths is None else lengths[rows],
        n_docs=None if n_docs is None else n_docs[rows],
        rows_cap=rows_cap,
        tokens_cap=tokens_cap,
        docs_cap=docs_cap,
    )
    if assignment is None:  # no balanced split fits the caps: keep the plain one
        return per_rank[rank]
    return rows[assignment == rank]


def worker_block_starts(
    plan: EpochPlan,
    row_groups: np.ndarray,
    *,
    num_row_groups: int,
    window: int,
) -> np.ndarray:
    """First global step of every `PackedDataLoader` worker block, then `plan.num_steps`.

    A block is the run of steps whose rows lie (mostly: a step crossing a window's edge goes
    with the window holding most of its rows) in one shuffle window, or unshuffled in one run
    of about 8 row groups. A worker then decodes its windows' row groups plus a few of a
    neighbour's, instead of two windows per block when blocks were a fixed number of steps.

    Args:
        plan: The epoch plan.
        row_groups: The row group of every row of `plan.order`, in that order.
        num_row_groups: Row groups in the dataset.
        window: Row groups per shuffle window (16 unshuffled). A free shuffle has no windows:
            there every step is its own block.
    """
    n = plan.num_steps
    num_rows = len(plan.order)
    if n == 0 or num_row_groups == 0:
        return np.arange(n + 1, dtype=np.int64)
    last = np.full(num_row_groups, -1, dtype=np.int64)
    np.maximum.at(last, row_groups, np.arange(num_rows, dtype=np.int64))
    # Positions after which no row group continues: the windows' edges (and, unshuffled,
    # every row group's), as positions in `order`.
    reach = np.maximum.accumulate(last[row_groups])
    cuts = np.flatnonzero(reach == np.arange(num_rows)) + 1
    # Keep the first edge in every half-window of rows: each window stays one block.
    half = max(int(num_rows / num_row_groups * window) // 2, 1)
    cuts = cuts[np.diff(cuts // half, prepend=-1) != 0]
    # A step that crosses a window's edge goes with the window holding most of its rows
    # (its middle row): the fewest row groups of the other window to decode.
    last_b = len(plan.bounds) - 1
    steps = np.arange(n) * plan.world_size
    lo = plan.bounds[np.minimum(steps, last_b)]
    hi = plan.bounds[np.minimum(steps + plan.world_size, last_b)]
    seg = np.searchsorted(cuts, (lo + hi) // 2, side="right")
    return np.append(np.flatnonzero(np.diff(seg, prepend=-1)), n).astype(np.int64)
