"""`packtool stats` for data with a loss mask: supervised tokens and the supervised efficiency.

With a loss mask, what a packed row is worth is the tokens that train, not the tokens it holds:
the supervised efficiency is supervised tokens / (rows x max_len) (beside the plain efficiency,
tokens / slots). It is projected the way `packtool pack` packs masked data by default: a document
is never split; one longer than the max length keeps its first max-length tokens (with their
mask), and a document left with no supervised token past its first is dropped
(`documents_unsupervised`).

Streaming: `SupervisedCounter.add` takes one table at a time and keeps, per max length, a
histogram of the kept (truncated) lengths and running sums, bounded by the longest document.
The FFD rows at the end expand each histogram back to one length per kept document (int64,
plus FFD's row and offset per document: ~24 bytes a document per max length, for the moment
they are packed), as the plain figures hold one length per document (docs/stats.md). The bounds
on rows (L1, L2 on the kept lengths, as `pack` computes its own) come from the histogram itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.dataset.columns import LOSS_MASK, flat_parts
from packtool.dataset.masks import prefix_sums
from packtool.dataset.tokenized import length_tables
from packtool.pack.kernels import ffd_assign
from packtool.stats.bounds import lower_bounds_from_histogram


@dataclass(frozen=True, kw_only=True)
class SupervisedAt:
    """The projected packing of masked data at one max length (documents truncated, not split)."""

    max_len: int
    rows: int
    """FFD rows of the kept documents, each cut to max_len."""
    tokens: int
    """Tokens kept (after truncation)."""
    supervised_tokens: int
    """Supervised tokens kept."""
    documents_truncated: int
    documents_unsupervised: int
    """Documents dropped: no supervised token in their first max_len tokens."""
    lower_bound_l1: int
    """ceil(kept tokens / max_len): the bound on `rows`, on the kept (truncated) lengths."""
    lower_bound_l2: int
    """Martello–Toth L2 on the kept lengths (what `pack` reports as its bound on masked data)."""

    @property
    def efficiency(self) -> float:
        return self.tokens / (self.rows * self.max_len) if self.rows else 0.0

    @property
    def supervised_efficiency(self) -> float:
        return self.supervised_tokens / (self.rows * self.max_len) if self.rows else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_len": self.max_len,
            "rows": self.rows,
            "tokens": self.tokens,
            "supervised_tokens": self.supervised_tokens,
            "documents_truncated": self.documents_truncated,
            "documents_unsupervised": self.documents_unsupervised,
            "lower_bound_rows": {"l1": self.lower_bound_l1, "l2": self.lower_bound_l2},
            "efficiency": self.efficiency,
            "supervised_efficiency": self.supervised_efficiency,
        }


@dataclass(frozen=True, kw_only=True)
class SupervisedStats:
    """What `packtool stats` adds for data with a loss mask."""

    supervised_tokens: int
    """Tokens with loss_mask 1 in the whole input."""
    tokens: int
    at: dict[int, SupervisedAt]
    """The projection at the max length and at every candidate."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "supervised_tokens": self.supervised_tokens,
            "supervised_share": self.supervised_tokens / self.tokens if self.tokens else 0.0,
            "model": "documents never split: truncated to max_len, dropped when unsupervised",
            "at": {str(m): a.to_dict() for m, a in sorted(self.at.items())},
        }


def read_supervised(
    tokenized: list[tuple[Path, dict[str, Any]]], counter: SupervisedCounter, skips: Any = None
) -> NDArray[np.int32]:
    """Document lengths of `packtool tokenize` files with a loss mask (`InputsRead.tokenized`),
    feeding `counter` on the way.

    Reads only the `length` and `loss_mask` columns, one row group at a time, the lengths
    checked as without a mask (`dataset.tokenized.length_tables`; rows of no token counted
    in `skips`).

    Raises:
        DataError: a file without either column, or a negative or null length.
    """
    parts = []
    for lengths, table in length_tables(tokenized, (LOSS_MASK,), skips):
        parts.append(lengths)
        counter.add(table)
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.empty(0, np.int32)


class SupervisedCounter:
    """Accumulates `SupervisedStats` over tokenized tables that carry a `loss_mask` column."""

    def __init__(self, limits: Sequence[int]) -> None:
        self.limits = np.asarray(sorted(set(int(m) for m in limits)), np.int64)
        k = len(self.limits)
        self.hist: list[NDArray[np.int64]] = [np.zeros(1, np.int64) for _ in range(k)]
        self.supervised = np.zeros(k, np.int64)
        self.truncated = np.zeros(k, np.int64)
        self.unsupervised = np.zeros(k, np.int64)
        self.total_supervised = 0
        self.tokens = 0

    def add(self, table: pa.Table) -> None:
        offsets, mask = flat_parts(table.column(LOSS_MASK))
        lengths = np.diff(offsets)
        self.tokens += int(lengths.sum())
        self.total_supervised += int(mask.sum(dtype=np.int64))
        kept = prefix_sums(mask, offsets, self.limits)  # (n_docs, n_limits)
        targets = mask.copy()  # a document's first token is never a target (labels shift)
        has = offsets[1:] > offsets[:-1]
        targets[offsets[:-1][has]] = 0
        trains = prefix_sums(targets, offsets, self.limits)
        for j, m in enumerate(self.limits.tolist()):
            ok = trains[:, j] > 0
            clipped = np.minimum(lengths[ok], m)
            counts = np.bincount(clipped)
            if len(counts) > len(self.hist[j]):
                self.hist[j] = np.pad(self.hist[j], (0, len(counts) - len(self.hist[j])))
            self.hist[j][: len(counts)] += counts
            self.supervised[j] += int(kept[ok, j].sum())
            self.truncated[j] += int((lengths[ok] > m).sum())
            self.unsupervised[j] += int((~ok).sum())

    def result(self) -> SupervisedStats:
        at = {}
        for j, m in enumerate(self.limits.tolist()):
            hist = self.hist[j].copy()
            hist[0] = 0  # no document is kept with no token (a kept one has a target)
            lengths = np.repeat(np.arange(len(hist), dtype=np.int64), hist)
            rows = int(ffd_assign(lengths, m)[2]) if len(lengths) else 0
            l1, l2 = lower_bounds_from_histogram(hist, m)
            at[m] = SupervisedAt(
                max_len=m,
                rows=rows,
                tokens=int(lengths.sum()),
                supervised_tokens=int(self.supervised[j]),
                documents_truncated=int(self.truncated[j]),
                documents_unsupervised=int(self.unsupervised[j]),
                lower_bound_l1=l1,
                lower_bound_l2=l2,
            )
        return SupervisedStats(supervised_tokens=self.total_supervised, tokens=self.tokens, at=at)
