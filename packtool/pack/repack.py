"""The extra packing rounds (`--rounds`), every group's and every round's in one numba call.

A round pools the least-filled rows of a group (`REPACK_FRACTION` of them, at least two),
shuffles their segments with the chunk's generator, first-fits them again in that order and
keeps the result if it needs fewer rows than it pooled; rows are then numbered densely in their
old order. A group of fewer than two rows is left as it is and draws nothing.

The shuffles are numpy's own: `_shuffle` is `Generator.shuffle`'s loop (the draws of
`permutation`), run on the generator's bit generator through numpy's ctypes interface for
compiled code (its state advanced in place), and the groups take their rounds in group order,
as one Python call per group and round did until 2026-12-07 (~30 us of CPU each: 3,000 groups x
16 rounds were 11.5 s of `packtool pack`'s pack stage on a loaded 2-core box; docs/benchmarks.md
`pack-rounds`). So a seed gives the rows it gave then; `packtool.pack.reference.repack_reference`
keeps that Python path, and the tests hold this kernel to it. Cost: per group and round,
O(m log m) for its m segments, in compiled code.

Compile time: the kernels use plain loops only. numba's own `Generator.shuffle` (N-d indexing
with `...`), `ndarray.sort` and fancy indexing (which compiles the formatting of its
shape-mismatch message) made a cold compile of these kernels ~16 s of CPU (82 functions) until
2026-12, now ~3 s (16), paid once per machine (numba caches it); the warm kernel got faster too
(docs/benchmarks.md `pack-rounds`). A kernel called with a literal int compiles a second
specialization: hence `np.int64(0)` below.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.pack import jit, kernels

REPACK_FRACTION = 0.10
"""Each extra round pools this share of the least-filled rows (at least two rows). Small pools
keep a round cheap; the gain of a round comes from the tail of partly-filled rows FFD leaves."""


@jit.njit(cache=True, nogil=True)
def _shuffle(x, bits):  # pragma: no cover - compiled
    """numpy's `Generator.shuffle` of a 1-d array: its Fisher-Yates loop and `random_interval`
    (numpy/random/src/distributions), drawing from `bits` (see `_bits`) as numpy would."""
    next32, next64, state = bits
    for i in range(x.size - 1, 0, -1):
        top = np.uint64(i)
        mask = top  # the lowest all-ones mask covering i
        for s in (1, 2, 4, 8, 16, 32):
            mask |= mask >> np.uint64(s)
        if top <= np.uint64(0xFFFFFFFF):
            value = np.uint64(next32(state)) & mask
            while value > top:
                value = np.uint64(next32(state)) & mask
        else:
            value = np.uint64(next64(state)) & mask
            while value > top:
                value = np.uint64(next64(state)) & mask
        j = np.int64(value)
        t = x[i]
        x[i] = x[j]
        x[j] = t


@jit.njit(cache=True, nogil=True)
def _sift_down(heap, i):  # pragma: no cover - compiled
    """Restore the max-heap `heap` below node i."""
    v = heap[i]
    while True:
        c = 2 * i + 1
        if c >= heap.size:
            break
        if c + 1 < heap.size and heap[c + 1] > heap[c]:
            c += 1
        if heap[c] <= v:
            break
        heap[i] = heap[c]
        i = c
    heap[i] = v


@jit.njit(cache=True, nogil=True)
def _k_smallest(key, least):  # pragma: no cover - compiled
    """The `least.size` (k) smallest of `key` into `least`, in no set order: a max-heap of the
    smallest so far, O(n log k) at worst and O(n + k log k) where most keys exceed its top
    (well-filled rows). A sort (`key.sort()`) chose them until 2026-12: numba's quicksort
    compiled for ~3 s of CPU, and a round needs the set, not its order."""
    k = least.size
    for i in range(k):  # a loop: `least[:] = key[:k]` compiles numba's shape-mismatch message
        least[i] = key[i]
    for i in range(k // 2 - 1, -1, -1):
        _sift_down(least, i)
    for r in range(k, key.size):
        if key[r] < least[0]:
            least[0] = key[r]
            _sift_down(least, np.int64(0))  # not a literal 0: one compile of _sift_down


@jit.njit(cache=True, nogil=True)
def _round(lens, row, offset, n_rows, max_len, fraction, bits, work):  # pragma: no cover - compiled
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
    least = work[2, :k]
    _k_smallest(key, least)
    in_pool = work[1, :n_rows]
    in_pool[:] = 0
    for j in range(k):
        in_pool[least[j] % n_rows] = 1
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
    _shuffle(order, bits)  # the draws of rng.permutation(size), applied to the pool
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
    seg_len, row, offset, rows, by_group, starts, max_len, rounds, fraction, bits
):  # pragma: no cover
    """Rounds 2..`rounds` of every group of two rows or more, in group order; returns each
    round's change in rows (summed over the groups) and updates `row`, `offset`, `rows`."""
    change = np.zeros(rounds, np.int64)
    largest = 0
    for g in range(rows.size):
        largest = max(largest, starts[g + 1] - starts[g])
    work = np.empty((5, largest), np.int64)
    group = np.empty((3, largest), np.int64)  # the group's lengths, rows and offsets
    for g in range(rows.size):
        if rows[g] < 2:
            continue
        a = starts[g]
        m = starts[g + 1] - a
        lens = group[0, :m]
        r = group[1, :m]
        o = group[2, :m]
        for t in range(m):  # loops, not fancy indexing: numba compiles those for seconds
            s = by_group[a + t]
            lens[t] = seg_len[s]
            r[t] = row[s]
            o[t] = offset[s]
        n = rows[g]
        for k in range(1, rounds):
            n = _round(lens, r, o, n, max_len, fraction, bits, work)
            change[k] += n - rows[g]
        for t in range(m):
            s = by_group[a + t]
            row[s] = r[t]
            offset[s] = o[t]
        rows[g] = n
    return change


_NEXT32 = ctypes.CFUNCTYPE(ctypes.c_uint32, ctypes.c_size_t)
_NEXT64 = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_size_t)


def _bits(rng: np.random.Generator) -> tuple[Any, Any, int]:
    """The generator's bit generator as numpy exposes it for compiled code (its `ctypes`
    interface): its next_uint32 and next_uint64 functions, typed to take the state's address,
    and that address. The kernel advances the state in place; `rng` must outlive the call."""
    interface = rng.bit_generator.ctypes
    return (
        ctypes.cast(interface.next_uint32, _NEXT32),
        ctypes.cast(interface.next_uint64, _NEXT64),
        interface.state_address,
    )


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
        _bits(rng),
    )
    return first + change


def warm_up() -> None:
    """Load the kernel from numba's cache (or compile it) on a tiny input."""
    lens = np.array([3, 3, 1, 1], np.int64)
    group = np.zeros(4, np.int64)
    row = np.array([0, 1, 0, 1], np.int64)
    offset = np.array([0, 0, 3, 3], np.int64)
    repack_groups(lens, group, row, offset, np.array([2], np.int64), 4, 2, np.random.default_rng(0))
