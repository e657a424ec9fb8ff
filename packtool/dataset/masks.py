"""Loss-mask arithmetic on flat arrays: supervised tokens per document, per prefix, as spans.

A loss mask is one uint8 per token (1 = the token is a target of the loss; a document's first
token never is one, labels being shifted, `target_sums`). Documents are given
by offsets into the flat mask, as everywhere in packtool; everything here is vectorised numpy
(a cumulative sum, then differences at the offsets), linear in the tokens.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def segment_sums(values: NDArray, offsets: NDArray[np.integer]) -> NDArray[np.int64]:
    """Sum of `values[offsets[i]:offsets[i + 1]]` for each i (empty segments give 0)."""
    cum = np.zeros(len(values) + 1, np.int64)
    np.cumsum(values, dtype=np.int64, out=cum[1:])  # dtype: ~4x faster than casting on output
    offsets = np.asarray(offsets, np.int64)
    return cum[offsets[1:]] - cum[offsets[:-1]]


def target_sums(mask: NDArray, offsets: NDArray[np.integer]) -> NDArray[np.int64]:
    """Supervised tokens of each document past its first token: those the loader can make
    targets. Labels are shifted (loader/collate.py), so a document's first token is never
    predicted: a document supervised only there trains on nothing."""
    sums = segment_sums(mask, offsets)
    offsets = np.asarray(offsets, np.int64)
    starts = offsets[:-1][offsets[1:] > offsets[:-1]]
    sums[offsets[1:] > offsets[:-1]] -= np.asarray(mask)[starts].astype(np.int64)
    return sums


def prefix_sums(
    values: NDArray, offsets: NDArray[np.integer], limits: NDArray[np.integer]
) -> NDArray[np.int64]:
    """`(n_docs, n_limits)`: the sum over each document's first `limits[j]` values.

    What truncating every document to `limits[j]` tokens keeps of its supervised tokens.
    """
    cum = np.zeros(len(values) + 1, np.int64)
    np.cumsum(values, dtype=np.int64, out=cum[1:])
    offsets = np.asarray(offsets, np.int64)
    starts, ends = offsets[:-1, None], offsets[1:, None]
    cut = np.minimum(starts + np.asarray(limits, np.int64)[None, :], ends)
    return cum[cut] - cum[starts]


def spans(mask: NDArray) -> list[tuple[int, int]]:
    """The runs of non-zero entries as half-open `(start, end)` pairs."""
    m = np.concatenate([[0], (np.asarray(mask) != 0).astype(np.int8), [0]])
    edges = np.flatnonzero(np.diff(m))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]
