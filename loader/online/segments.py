"""`Segments`: the document segments waiting in an `OnlinePacker`'s buffer, as flat arrays.

A segment is a document, or a max_len chunk of a long one (`packtool.pack.chunk.make_segments`). The
buffer keeps their lengths, ids and hold counts in arrays and their tokens in one array, so a
refill, a pack and a checkpoint never touch a Python object per document.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.pack import kernels


@dataclass
class Segments:
    """Segments waiting in the buffer; `start` indexes `tokens` (None: lengths only)."""

    tokens: NDArray | None
    """Token ids of the segments, in order (a push keeps no token its segments left out)."""
    start: NDArray[np.int64]
    """Where each segment starts in `tokens`, `(n,)`."""
    length: NDArray[np.int64]
    """Tokens of each segment, `(n,)`."""
    doc: NDArray[np.int64]
    """Source document id of each segment."""
    chunk: NDArray[np.int32]
    """Chunk index of a split document's segment, 0 otherwise."""
    holds: NDArray[np.int32]
    """Packs each segment has been held back by (its row was under-filled)."""
    columns: dict[str, NDArray] = field(default_factory=dict)
    """Optional per-token columns (`loss_mask`), aligned with `tokens` (indexed by `start`)."""

    def take(self, a: int, b: int) -> Segments:
        """Segments a:b, the token array narrowed to their span (a view, no copy)."""
        start, length = self.start[a:b], self.length[a:b]
        toks = self.tokens
        cols = self.columns
        if toks is not None:
            lo = int(start[0]) if b > a else 0
            hi = int(start[-1] + length[-1]) if b > a else 0
            toks, start = toks[lo:hi], start - lo
            cols = {name: v[lo:hi] for name, v in cols.items()}
        return Segments(toks, start, length, self.doc[a:b], self.chunk[a:b], self.holds[a:b], cols)

    @staticmethod
    def compact(
        tokens: NDArray, columns: dict[str, NDArray], start: NDArray, length: NDArray
    ) -> tuple[NDArray, dict[str, NDArray], NDArray[np.int64]]:
        """The tokens (and per-token columns) of the segments `start`/`length` alone, laid end
        to end (new arrays), and the segments' starts in them."""
        toks = kernels.gather_segments(tokens, start, length)
        cols = {n: kernels.gather_segments(v, start, length) for n, v in columns.items()}
        return toks, cols, np.cumsum(length) - length

    @staticmethod
    def concat(parts: list[Segments]) -> Segments:
        """The segments of `parts` in order, in one set of arrays (tokens included)."""
        if len(parts) == 1:
            return parts[0]
        toks = None
        starts = [p.start for p in parts]
        if parts[0].tokens is not None:
            shift = np.cumsum([0] + [len(p.tokens) for p in parts[:-1]])
            starts = [s + d for s, d in zip(starts, shift, strict=True)]
            toks = np.concatenate([p.tokens for p in parts])
        return Segments(
            toks,
            np.concatenate(starts),
            np.concatenate([p.length for p in parts]),
            np.concatenate([p.doc for p in parts]),
            np.concatenate([p.chunk for p in parts]),
            np.concatenate([p.holds for p in parts]),
            {name: np.concatenate([p.columns[name] for p in parts]) for name in parts[0].columns},
        )

    def gather_columns(self, start: NDArray, length: NDArray) -> dict[str, NDArray]:
        """The per-token columns of the segments `start`/`length`, laid end to end."""
        return {n: kernels.gather_segments(v, start, length) for n, v in self.columns.items()}

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_state(state: dict[str, Any]) -> Segments:
        # `columns` came later: a state saved before it had none.
        return Segments(**{**state, "columns": dict(state.get("columns") or {})})
