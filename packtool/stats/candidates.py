"""The candidates table of `packtool stats`: one max length's projected packing, and the rule
that suggests one of them (the module docstring of `lengths.py` gives the conventions).

Split off `lengths.py`, which computes the candidates and re-exports these names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "SPLIT_TOLERANCE",
    "SUGGESTION_FALLBACK",
    "SUGGESTION_RULE",
    "SUGGEST_TOLERANCE",
    "Candidate",
    "suggest_max_len",
    "suggestion",
]

SUGGEST_TOLERANCE = 0.01
SPLIT_TOLERANCE = 0.01
_RULE = (
    "among candidates that {0} at most 1% of documents, the smallest whose projected FFD "
    "efficiency is within 1 percentage point of the best of them"
)
_FALLBACK = "no candidate {1} at most 1% of documents, so the largest (the one that {1} fewest)"
_VERBS = {
    "split": ("split", "splits"),
    "truncate": ("truncate", "truncates"),
    "drop": ("drop", "drops"),
}
SUGGESTION_RULE = _RULE.format(*_VERBS["split"])
SUGGESTION_FALLBACK = _FALLBACK.format(*_VERBS["split"])
"""The rule's other branch, said instead of `SUGGESTION_RULE` where it was taken (that rule was
printed for a largest candidate chosen because none split few enough). Both name the policy,
`truncate` or `drop`, where it is not split (`suggestion`)."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """Projected packing at one candidate max length."""

    max_len: int
    long_documents: int
    """Documents longer than max_len (split, truncated or dropped)."""
    chunks: int
    """Pieces packed after the policy (every document is one, or its chunks, or none)."""
    tokens: int
    """Tokens in those pieces (the efficiency's)."""
    lower_bound_rows: int
    """Martello–Toth L2."""
    rows: int
    """Rows FFD packs the chunks into."""
    efficiency: float
    pad_to_max_len_waste: float
    """Share of slots wasted if every chunk were padded to max_len."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_len": self.max_len,
            "long_documents": self.long_documents,
            "chunks": self.chunks,
            "tokens": self.tokens,
            "lower_bound_rows": self.lower_bound_rows,
            "rows": self.rows,
            "efficiency": self.efficiency,
            "pad_to_max_len_waste": self.pad_to_max_len_waste,
        }


def suggest_max_len(candidates: Sequence[Candidate], documents: int) -> int:
    """The suggested max length by `SUGGESTION_RULE` (see the module docstring)."""
    return suggestion(candidates, documents)[0]


def suggestion(
    candidates: Sequence[Candidate], documents: int, long_docs: str = "split"
) -> tuple[int, str]:
    """The suggested max length and the rule that chose it: `SUGGESTION_RULE`, or
    `SUGGESTION_FALLBACK` where no candidate splits at most 1% of the documents (their words
    say truncate or drop for those policies)."""
    verbs = _VERBS[long_docs]
    eligible = [c for c in candidates if c.long_documents <= SPLIT_TOLERANCE * documents]
    if not eligible:
        return max(c.max_len for c in candidates), _FALLBACK.format(*verbs)
    best = max(c.efficiency for c in eligible)
    chosen = min(c.max_len for c in eligible if c.efficiency >= best - SUGGEST_TOLERANCE)
    return chosen, _RULE.format(*verbs)
