"""Lower bounds on packed rows from a histogram of lengths: L1 and Martello–Toth's L2.

A histogram merges across partitions and tables by addition, so a bound over a whole corpus
costs max_len + 1 integers: what `lengths.py` computes on a corpus's lengths, `supervised.py` on
the kept (truncated) lengths of masked data, and the engines on what they packed. Split off
`lengths.py` so that `supervised.py` (which `lengths.py` uses) needs nothing of it.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["lower_bound_l2_histogram", "lower_bounds_from_histogram", "split_histogram"]


def lower_bounds_from_histogram(histogram: ArrayLike, max_len: int) -> tuple[int, int]:
    """(L1, L2) from a histogram of piece lengths (`histogram[l]` pieces of length l <= max_len).

    What the engines use: a histogram merges across partitions by addition, so the bounds of a
    whole corpus cost max_len + 1 integers, never a list of every length.
    """
    hist = np.asarray(histogram, dtype=np.int64)
    sizes = np.flatnonzero(hist)
    total = int((sizes * hist[sizes]).sum())
    if len(sizes) and sizes[-1] > max_len:
        raise ValueError(f"a piece of {sizes[-1]} tokens is longer than max_len {max_len}")
    return int(-(-total // max_len)), lower_bound_l2_histogram(sizes, hist[sizes], max_len)


def split_histogram(
    values: NDArray[np.int64], counts: NDArray[np.int64], max_len: int
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The chunk-length histogram after splitting, from the (distinct length, count) histogram."""
    full = values // max_len
    rest = values % max_len
    keep = rest > 0
    sizes = np.concatenate([[max_len], rest[keep]])
    n = np.concatenate([[int((full * counts).sum())], counts[keep]])
    return sizes, n


def lower_bound_l2_histogram(sizes: NDArray[np.int64], n: NDArray[np.int64], max_len: int) -> int:
    """Martello–Toth L2 of `n[i]` pieces of length `sizes[i]` (each <= max_len) in max_len rows.

    (`lengths.lower_bound_l2` has the rule.)
    """
    if int(n.sum()) == 0:
        return 0
    c = max_len
    counts = np.bincount(sizes, weights=n, minlength=c + 1).astype(np.int64)
    cum_n = np.cumsum(counts)  # documents with length <= x
    cum_t = np.cumsum(counts * np.arange(c + 1, dtype=np.int64))  # tokens in them
    n = int(cum_n[-1])
    half = c // 2  # largest length s with 2s <= c
    k = np.arange(0, half + 1)
    j1 = n - cum_n[c - k]
    j2 = cum_n[c - k] - cum_n[half]
    s2 = cum_t[c - k] - cum_t[half]
    below_k = np.where(k > 0, cum_t[np.maximum(k - 1, 0)], 0)
    s3 = cum_t[half] - below_k
    extra = -(-(s3 - (j2 * c - s2)) // c)
    return int((j1 + j2 + np.maximum(extra, 0)).max())
