"""The `bucketed` strategy of `OnlinePacker`: two-level packing, the seed serving system's scheme.

Level one rounds each length up to a multiple of `bucket` and fills rows with documents of one
bucket only (`max_len // bucket_len` of them); level two treats each such row as one item of its
real fill and first-fit-decreasing packs those items together with the documents left over, so
short documents fill the gaps across buckets. Measured in `benchmarks/bench_online.py` against
plain FFD, which packs tighter (see docs/online.md); FFD stays the default.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from loader.online.rows import EMPTY_I64
from packtool.pack import kernels


def bucketed_assign(
    lengths: NDArray[np.int64], max_len: int, bucket: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """Two-level packing: full rows inside each length bucket, then FFD across buckets.

    Level one rounds lengths up to multiples of `bucket` and makes rows of `max_len // rounded`
    documents of one bucket (only full groups, in input order). Level two first-fit-decreasing
    packs those rows (as items of their real fill) together with the documents left over.

    Returns `(row, offset, n_rows)` like `packtool.pack.kernels.ffd_assign`.
    """
    lengths = np.asarray(lengths, np.int64)
    n = len(lengths)
    if n == 0:
        return EMPTY_I64, EMPTY_I64, 0
    rounded = np.minimum(-(-lengths // bucket) * bucket, max_len)
    per_row = max_len // rounded
    order = np.lexsort((np.arange(n), rounded))  # by bucket, input order inside
    rb = rounded[order]
    first = np.flatnonzero(np.r_[True, rb[1:] != rb[:-1]])
    counts = np.diff(np.r_[first, n])
    rank = np.arange(n) - np.repeat(first, counts)
    k = per_row[order]
    full_groups = np.repeat(counts, counts) // k
    in_l1 = (rank // k) < full_groups
    # Level one groups: (bucket, group index) -> a dense item id.
    l1_docs = order[in_l1]
    if len(l1_docs):
        key = np.repeat(np.arange(len(first)), counts)[in_l1] * n + (rank // k)[in_l1]
        _, grp = np.unique(key, return_inverse=True)
        n_groups = int(grp.max()) + 1
    else:
        grp = EMPTY_I64
        n_groups = 0
    l1_len = lengths[l1_docs]
    item_len = np.bincount(grp, weights=l1_len, minlength=n_groups).astype(np.int64)
    rest = order[~in_l1]
    items = np.concatenate([item_len, lengths[rest]])
    irow, ioff, n_rows = kernels.ffd_assign(items, max_len)
    row = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    # inside a level-one group: documents in input order, offsets by running real length
    within = np.cumsum(l1_len) - l1_len
    gstart = np.zeros(n_groups, np.int64)
    if n_groups:
        firsts = np.flatnonzero(np.r_[True, grp[1:] != grp[:-1]])
        gstart[grp[firsts]] = within[firsts]
    row[l1_docs] = irow[grp]
    offset[l1_docs] = ioff[grp] + within - gstart[grp]
    row[rest] = irow[n_groups:]
    offset[rest] = ioff[n_groups:]
    return row, offset, n_rows
