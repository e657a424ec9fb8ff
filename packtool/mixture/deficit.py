"""The largest-deficit kernel of the mixture schedule (numba): the rule of
packtool/mixture/schedule.py run over a window of row lengths per source.

Pure: plain arrays in, the chosen sources and a status out (`OK`, or why it stopped: a source
needs its next window (`REFILL`), reached its cap (`CAP`), or the total was reached
(`TOTAL`)). `Schedule` keeps the counters between calls; packtool/pack/reference.py's
`mix_reference` is the plain loop the tests hold it to.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from packtool.pack import jit

OK, REFILL, CAP, TOTAL = 0, 1, 2, 3


@jit.njit(cache=True, nogil=True)
def mix_window(
    weights,
    seg,
    buf,
    wpos,
    wend,
    cap_left,
    epoch,
    pos,
    rows,
    tokens,
    tokens_mode,
    max_units,
    tokens_left,
    out_src,
    out_epoch,
    out_pos,
    out_len,
    start,
    stop,
):  # pragma: no cover - compiled
    k = weights.shape[0]
    d_total = 0
    for i in range(k):
        d_total += seg[i]
    n = start
    status = 0
    which = -1
    while n < stop:
        best = -1
        best_slack = np.inf
        behind = -1
        behind_e = -np.inf
        df = float(d_total)
        for i in range(k):
            w = weights[i]
            if w <= 0.0:
                continue
            e = w * df - float(seg[i])
            if e >= 0.0:
                s = (max_units - e) / w
                if s < best_slack:
                    best_slack = s
                    best = i
            if e > behind_e:
                behind_e = e
                behind = i
        if best < 0:  # only by rounding (the lags sum to 0): take the source most behind
            best = behind
        if wpos[best] >= wend[best]:
            status = 1
            which = best
            break
        length = buf[wpos[best]]
        wpos[best] += 1
        out_src[n] = best
        out_epoch[n] = epoch[best]
        out_pos[n] = pos[best]
        out_len[n] = length
        pos[best] += 1
        rows[best] += 1
        tokens[best] += length
        n += 1
        u = length if tokens_mode else 1
        seg[best] += u
        d_total += u
        tokens_left -= length
        if cap_left[best] > 0:
            cap_left[best] -= 1
            if cap_left[best] == 0:
                status = 2
                which = best
                break
        if tokens_left <= 0:
            status = 3
            break
    return n, status, which, tokens_left


def mix_kernel(
    weights: NDArray[np.float64],
    seg: NDArray[np.int64],
    buf: NDArray[np.int64],
    wpos: NDArray[np.int64],
    wend: NDArray[np.int64],
    cap_left: NDArray[np.int64],
    *,
    tokens_mode: bool,
    max_units: int,
    tokens_left: int,
    n_out: int,
) -> tuple[NDArray[np.int32], NDArray[np.int64], NDArray[np.int64], int, int, int]:
    """Choose up to `n_out` rows (the rule in the module docstring) from windows of row lengths,
    cursors at 0. Updates `seg`, `wpos` and `cap_left` in place.

    Args:
        weights: Normalised weights, 0 for sources not drawn from, float64 `(k,)`.
        seg: Units each source delivered in the segment, int64 `(k,)`.
        buf: Row lengths of every source's window, back to back, int64.
        wpos, wend: Next and end index of each source's window in `buf`, int64 `(k,)`.
        cap_left: Rows each source may still deliver before its cap fires (-1: no cap in this
            window), int64 `(k,)`.
        tokens_mode: Units are tokens (else rows).
        max_units: One row in units: max_len (tokens mode) or 1.
        tokens_left: Stop after the row that brings this to <= 0.
        n_out: Most rows to choose.

    Returns:
        `(src int32, length int64, position in its window int64, status, which, tokens_left)`;
        status 0: `n_out` rows; 1: source `which` needs a new window (its row is not taken);
        2: source `which` reached its cap with its last row; 3: `tokens_left` reached 0.
    """
    k = len(weights)
    zeros = [np.zeros(k, np.int64) for _ in range(4)]
    out = (np.empty(n_out, np.int32), *(np.empty(n_out, np.int64) for _ in range(3)))
    n, status, which, left = mix_window(
        weights, seg, buf, wpos, wend, cap_left, *zeros, tokens_mode, float(max_units),
        tokens_left, *out, 0, n_out,
    )  # fmt: skip
    return out[0][:n], out[3][:n], out[2][:n], int(status), int(which), int(left)
