"""The extra packing rounds (`--rounds`), every group's and every round's in one numba call.

A round pools the least-filled rows of a group (`REPACK_FRACTION` of them, at least two),
shuffles their segments with the chunk's generator, first-fits them again in that order and
keeps the result if it needs fewer rows than it pooled; rows are then numbered densely in their
old order. A group of fewer than two rows is left as it is and draws nothing.

The shuffles are numpy's own: numba runs `Generator.shuffle` (the draws of `permutation`) on the
generator's bit generator (its state advanced in place), and the groups take their
rounds in group order, as one Python call per group and round did until 2026-12-07 (~30 us of
CPU each: 3,000 groups x 16 rounds were 11.5 s of `packtool pack`'s pack stage on a loaded 2-core
box; docs/benchmarks.md `pack-rounds`). So a seed gives the rows it gave then;
`packtool.pack.reference.repack_reference` keeps that Python path, and the tests hold this
kernel to it. Cost: per group and round, O(m log m) for its m segments, in compiled code.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from packtool.pack import jit, kernels

REPACK_FRACTION = 0.10
"""Each extra round pools this share of the least-filled rows (at least two rows). Small pools
keep a round cheap; the gain of a round comes from the tail of partly-filled rows FFD leaves."""


@jit.njit(cache=True, nogil=True)
def _round(lens, row, offset, n_rows, max_len, fraction, rng, work):  # pragma: no cover - compiled
    """One round on one group's segments (`row`, `offset` updated in place); its rows after.

    `work`: five buffers of at least the group's segments each, reused from round to round."""
    if n_rows < 2:
        return n_rows
    m = lens.size
    key = work[0, :n_rows]
    key[:] = 0
    for t in range(m):
        key[row[t]] += lens[t]
    k = max(2, math.ceil(fraction * n_rows))
    # The k least-filled rows, ties to the lower row (a stable argsort's first k): distinct keys.
    for r in range(n_rows):
        key[r] = key[r] * n_rows + r
    key.sort()
    in_pool = work[1, :n_rows]
    in_pool[:] = 0
    for j in range(k):
        in_pool[key[j] % n_rows] = 1
    chosen = work[2]  # the chosen rows, lowest first
    c = 0
    for r in range(n_rows):
        if in_pool[r]:
            chosen[c] = r
            c += 1
    size = 0
    order = work[3]
    for t in range(m):
        if in_pool[row[t]]:
            order[size] = t
            size += 1
    order = order[:size]
    rng.shuffle(order)  # the draws of rng.permutation(size), applied to the pool
    pooled = work[4, :size]
    for t in range(size):
        pooled[t] = lens[order[t]]
    new_row, new_offset, new_rows = kernels.first_fit(pooled, max_len)
    if new_rows >= k:
        return n_rows
    # The new rows take the chosen rows' numbers, lowest first; then renumber densely.
    for t in range(size):
        row[order[t]] = chosen[new_row[t]]
        offset[order[t]] = new_offset[t]
    used = work[1, :n_rows]
    used[:] = 0
    for t in range(m):
        used[row[t]] = 1
    n = 0
    for r in range(n_rows):  # used[r]: the row's new number, for the rows still used
        if used[r]:
            used[r] = n
            n += 1
        else:
            used[r] = -1
    for t in range(m):
        row[t] = used[row[t]]
    return n


@jit.njit(cache=True, nogil=True)
def _repack(
    seg_len, row, offset, rows, by_group, starts, max_len, rounds, fraction, rng
):  # pragma: no cover
    """Rounds 2..`rounds` of every group of two rows or more, in group order; returns each
    round's change in rows (summed over the groups) and updates `row`, `offset`, `rows`."""
    change = np.zeros(rounds, np.int64)
    largest = 0
    for g in range(rows.size):
        largest = max(largest, starts[g + 1] - starts[g])
    work = np.empty((5, largest), np.int64)
    for g in range(rows.size):
        if rows[g] < 2:
            continue
        members = by_group[starts[g] : starts[g + 1]]
        lens = seg_len[members]
        r = row[members]
        o = offset[members]
        n = rows[g]
        for k in range(1, rounds):
            n = _round(lens, r, o, n, max_len, fraction, rng, work)
            change[k] += n - rows[g]
        row[members] = r
        offset[members] = o
        rows[g] = n
    return change


def repack_groups(
    seg_len: NDArray[np.int64],
    seg_group: NDArray[np.int64],
    row: NDArray[np.int64],
    offset: NDArray[np.int64],
    rows: NDArray[np.int64],
    max_len: int,
    rounds: int,
    rng: np.random.Generator,
) -> NDArray[np.int64]:
    """Run rounds 2..`rounds` on each group's first-round placement, in place.

    Args:
        seg_len: every segment's length (1..max_len).
        seg_group: every segment's group (0..len(rows) - 1).
        row, offset: every segment's row within its group and offset in the row (updated).
        rows: every group's rows (updated).
        max_len, rounds: as `PackConfig`'s.
        rng: the chunk's generator; each shuffle draws from it, group by group, round by round.

    Returns:
        Rows of all groups after each round (`rounds` entries; the first is the first round's).
    """
    first = int(rows.sum())
    if rounds < 2 or not (rows >= 2).any():
        return np.full(rounds, first, np.int64)
    by_group = np.argsort(seg_group, kind="stable")
    starts = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(np.bincount(seg_group, minlength=len(rows)), out=starts[1:])
    change = _repack(
        np.ascontiguousarray(seg_len, np.int64),
        row,
        offset,
        rows,
        by_group,
        starts,
        max_len,
        rounds,
        REPACK_FRACTION,
        rng,
    )
    return first + change


def warm_up() -> None:
    """Load the kernel from numba's cache (or compile it) on a tiny input."""
    lens = np.array([3, 3, 1, 1], np.int64)
    group = np.zeros(4, np.int64)
    row = np.array([0, 1, 0, 1], np.int64)
    offset = np.array([0, 0, 3, 3], np.int64)
    repack_groups(lens, group, row, offset, np.array([2], np.int64), 4, 2, np.random.default_rng(0))
