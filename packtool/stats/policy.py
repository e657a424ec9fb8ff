"""What `packtool pack --long-docs POLICY` packs, from document lengths: `stats`' model of it.

Documents longer than the max length m are `split` into m-token pieces plus a remainder,
`truncate`d to their first m tokens, or `drop`ped; empty documents give no piece (as the packer's
`make_segments`). `lengths.py` packs and bounds these pieces at every max length; the histogram
form feeds the L2 bound (`bounds.lower_bound_l2_histogram`) without one length per piece.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from packtool.pack.kernels import split_lengths
from packtool.pack.limits import LONG_DOC_POLICIES
from packtool.stats.bounds import split_histogram

__all__ = ["LONG_DOC_POLICIES", "policy_histogram", "policy_pieces"]


def policy_pieces(lengths: NDArray[np.int64], max_len: int, policy: str) -> NDArray[np.integer]:
    """The piece lengths `pack --long-docs policy` packs, in input order (int32 when split).

    Raises:
        ConfigError: split would make more chunks than the packer allows (`split_lengths`).
    """
    if policy == "split":
        return split_lengths(lengths, max_len)
    kept = lengths[lengths > 0]
    if policy == "truncate":
        return np.minimum(kept, max_len)
    return kept[kept <= max_len]  # drop


def policy_histogram(
    values: NDArray[np.int64], counts: NDArray[np.int64], max_len: int, policy: str
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """`policy_pieces` as (piece length, count) pairs, from the (distinct length, count) ones.

    A length may repeat (truncated ones all become max_len): the bound adds them up.
    """
    if policy == "split":
        return split_histogram(values, counts, max_len)
    keep = values > 0
    if policy == "truncate":
        return np.minimum(values[keep], max_len), counts[keep]
    keep &= values <= max_len  # drop
    return values[keep], counts[keep]
