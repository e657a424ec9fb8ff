"""Plain-Python references of the packing kernels: simple O(N * rows) loops, obviously right.

Used by the tests (the numba kernels must give exactly the same assignment) and by
`benchmarks/bench_pack.py` (the speed-up over a direct implementation). Not for production use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from numpy.typing import NDArray


def _decreasing(lengths: Sequence[int]) -> list[int]:
    # sorted() is stable: equal lengths keep input order
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


def ffd_reference(lengths: Sequence[int], max_len: int) -> tuple[list[int], list[int], int]:
    """First-fit-decreasing: longest first, each into the first open row with room."""
    return _first_fit(lengths, max_len, _decreasing(lengths))


def ff_reference(lengths: Sequence[int], max_len: int) -> tuple[list[int], list[int], int]:
    """First fit in input order (no sort)."""
    return _first_fit(lengths, max_len, range(len(lengths)))


def _first_fit(
    lengths: Sequence[int], max_len: int, order: Sequence[int]
) -> tuple[list[int], list[int], int]:
    lengths = [int(x) for x in lengths]
    rem: list[int] = []
    row = [0] * len(lengths)
    offset = [0] * len(lengths)
    for i in order:
        length = lengths[i]
        for r in range(len(rem)):
            if rem[r] >= length:
                break
        else:
            r = len(rem)
            rem.append(max_len)
        row[i] = r
        offset[i] = max_len - rem[r]
        rem[r] -= length
    return row, offset, len(rem)


def bfd_reference(lengths: Sequence[int], max_len: int) -> tuple[list[int], list[int], int]:
    """Best-fit-decreasing: longest first, each into the open row with the least room that fits.

    Ties between rows with equal room go to the row that changed most recently.
    """
    lengths = [int(x) for x in lengths]
    rem: list[int] = []
    stamp: list[int] = []  # step at which each row last received a document
    row = [0] * len(lengths)
    offset = [0] * len(lengths)
    for step, i in enumerate(_decreasing(lengths)):
        length = lengths[i]
        best = -1
        for r in range(len(rem)):
            if rem[r] >= length and (
                best < 0 or rem[r] < rem[best] or (rem[r] == rem[best] and stamp[r] > stamp[best])
            ):
                best = r
        if best < 0:
            best = len(rem)
            rem.append(max_len)
            stamp.append(step)
        row[i] = best
        offset[i] = max_len - rem[best]
        rem[best] -= length
        stamp[best] = step
    return row, offset, len(rem)


def mix_reference(
    weights: Sequence[float],
    seg: list[int],
    windows: list[list[int]],
    cap_left: list[int],
    *,
    tokens_mode: bool,
    max_units: int,
    tokens_left: int,
    n_out: int,
) -> tuple[list[int], int, int, int]:
    """The mixture schedule's rule (packtool/mixture/schedule.py) as a plain loop over Python lists.

    Chooses up to `n_out` rows; `seg` and `cap_left` are updated in place and each chosen row is
    popped from the front of its source's window. Returns `(sources, status, which,
    tokens_left)` with the statuses of `packtool.mixture.deficit.mix_kernel`.
    """
    out: list[int] = []
    while len(out) < n_out:
        total = float(sum(seg))
        lags = [w * total - float(s) if w > 0 else None for w, s in zip(weights, seg, strict=True)]
        eligible = [
            ((float(max_units) - e) / w, i)
            for i, (w, e) in enumerate(zip(weights, lags, strict=True))
            if e is not None and e >= 0.0
        ]
        if eligible:
            best = min(eligible)[1]  # smallest slack; ties: the earlier source
        else:
            best = max((e, -i) for i, e in enumerate(lags) if e is not None)[1] * -1
        if not windows[best]:
            return out, 1, best, tokens_left
        length = windows[best].pop(0)
        out.append(best)
        seg[best] += length if tokens_mode else 1
        tokens_left -= length
        if cap_left[best] > 0:
            cap_left[best] -= 1
            if cap_left[best] == 0:
                return out, 2, best, tokens_left
        if tokens_left <= 0:
            return out, 3, -1, tokens_left
    return out, 0, -1, tokens_left


def repack_reference(
    seg_len: NDArray[np.int64],
    seg_group: NDArray[np.int64],
    row: NDArray[np.int64],
    offset: NDArray[np.int64],
    rows: NDArray[np.int64],
    max_len: int,
    rounds: int,
    rng: np.random.Generator,
    fraction: float = 0.10,
    first_fit: Callable[[Sequence[int], int], tuple] = ff_reference,
) -> NDArray[np.int64]:
    """The extra rounds as `pack_table` ran them until 2026-12-07: a Python call per group and
    round (packtool/pack/repack.py's `repack_groups`, same arguments, same in-place updates).

    A round pools the least-filled `fraction` of a group's rows (at least two), shuffles their
    segments with `rng`, first-fits them in that order (`first_fit`: `ff_reference`, or the
    `kernels.ff_assign` the old path called, for its speed) and keeps the result if it needs
    fewer rows. Returns the rows of all groups after each round.
    """
    n_groups = len(rows)
    history = np.full(rounds, rows.sum(), dtype=np.int64)
    by_group = np.argsort(seg_group, kind="stable")
    starts = np.zeros(n_groups + 1, np.int64)
    np.cumsum(np.bincount(seg_group, minlength=n_groups), out=starts[1:])
    for g in np.flatnonzero(rows >= 2):
        members = by_group[starts[g] : starts[g + 1]]
        r, o, n = row[members], offset[members], int(rows[g])
        for k in range(1, rounds):
            r, o, n = _repack_round(r, o, n, seg_len[members], max_len, rng, fraction, first_fit)
            history[k] += n - rows[g]
        row[members], offset[members], rows[g] = r, o, n
    return history


def _repack_round(
    row: NDArray[np.int64],
    offset: NDArray[np.int64],
    n_rows: int,
    seg_len: NDArray[np.int64],
    max_len: int,
    rng: np.random.Generator,
    fraction: float,
    first_fit: Callable[[Sequence[int], int], tuple],
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    if n_rows < 2:
        return row, offset, n_rows
    fill = np.bincount(row, weights=seg_len, minlength=n_rows)
    k = max(2, math.ceil(fraction * n_rows))
    chosen = np.argsort(fill, kind="stable")[:k]
    in_pool = np.zeros(n_rows, dtype=bool)
    in_pool[chosen] = True
    pool = np.flatnonzero(in_pool[row])
    order = pool[rng.permutation(len(pool))]
    new_row, new_offset, m = first_fit(seg_len[order], max_len)
    if m >= k:
        return row, offset, n_rows
    row, offset = row.copy(), offset.copy()
    # Reuse the chosen rows' numbers for the new rows, then renumber densely.
    row[order] = np.sort(chosen)[np.asarray(new_row, dtype=np.int64)]
    offset[order] = new_offset
    used, row = np.unique(row, return_inverse=True)
    return row.astype(np.int64), offset, len(used)
