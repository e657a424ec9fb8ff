"""Packed rows as flat arrays (`PackedRows`) and grouping them into batches (`RowBatcher`).

What `loader.online.packer.OnlinePacker` emits and what `loader.online.streaming` batches: a run of rows held
as segment lengths, document ids and the tokens back to back, so slicing, concatenating and
collating never touch a Python object per row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from loader.config import MAX_BATCH_TOKENS, check_int
from loader.record import Documents
from packtool.dataset.columns import get
from packtool.errors import ConfigError


@dataclass(frozen=True)
class PackedRows:
    """A run of packed rows in flat arrays (one pack's output, or a slice of it).

    Row `r` holds segments `row_docs[r]:row_docs[r + 1]`, laid end to end; its tokens are
    `tokens[row_offsets[r]:row_offsets[r + 1]]`.
    """

    row_docs: NDArray[np.int64]
    """Segment offsets per row, `(n_rows + 1,)`."""
    seg_len: NDArray[np.int64]
    """Length of each segment, `(n_segments,)`."""
    doc_ids: NDArray[np.int64]
    """Source document id of each segment."""
    doc_chunks: NDArray[np.int32]
    """Chunk index of a split document's segment, 0 otherwise."""
    tokens: NDArray[np.integer] | None
    """Token ids of every row back to back (None when the packer was fed lengths only)."""
    columns: dict[str, NDArray] = field(default_factory=dict)
    """Optional per-token columns (`loss_mask`), aligned with `tokens`."""

    @property
    def n_rows(self) -> int:
        return len(self.row_docs) - 1

    @property
    def row_lengths(self) -> NDArray[np.int64]:
        return np.add.reduceat(self.seg_len, self.row_docs[:-1]) if self.n_rows else EMPTY_I64

    @property
    def row_offsets(self) -> NDArray[np.int64]:
        """Token offsets per row, `(n_rows + 1,)`."""
        out = np.zeros(self.n_rows + 1, np.int64)
        np.cumsum(self.row_lengths, out=out[1:])
        return out

    @cached_property
    def seg_offsets(self) -> NDArray[np.int64]:
        """Token offsets per segment, `(n_segments + 1,)`: computed once, so that `row` and
        `slice` cost their own segments, not all those before them (each summed them: reading
        every row of a large pending run was quadratic)."""
        out = np.zeros(len(self.seg_len) + 1, np.int64)
        np.cumsum(self.seg_len, out=out[1:])
        return out

    def row(self, r: int) -> Documents:
        """The documents of row `r` (tokens and columns empty when fed lengths only)."""
        a, b = int(self.row_docs[r]), int(self.row_docs[r + 1])
        start, stop = (int(t) for t in self.seg_offsets[[a, b]])
        toks = EMPTY_I64[:0] if self.tokens is None else self.tokens[start:stop]
        cols = {name: v[start:stop] for name, v in self.columns.items()}
        return Documents(toks, self.seg_len[a:b], self.doc_ids[a:b], cols)

    def slice(self, a: int, b: int) -> PackedRows:
        """Rows `a:b`."""
        s0, s1 = int(self.row_docs[a]), int(self.row_docs[b])
        toks = None
        cols = {}
        if self.tokens is not None:
            t0, t1 = (int(t) for t in self.seg_offsets[[s0, s1]])
            toks = self.tokens[t0:t1]
            cols = {name: v[t0:t1] for name, v in self.columns.items()}
        return PackedRows(
            self.row_docs[a : b + 1] - s0,
            self.seg_len[s0:s1],
            self.doc_ids[s0:s1],
            self.doc_chunks[s0:s1],
            toks,
            cols,
        )

    @staticmethod
    def empty(tokens: Any = np.int64, columns: Iterable[str] = ()) -> PackedRows:
        """No rows, with the arrays a packer's rows have: `tokens` of that dtype (None: a
        packer fed lengths only, whose rows carry none) and the per-token `columns` named, each
        of its declared dtype."""
        toks = None if tokens is None else np.zeros(0, tokens)
        cols = {} if toks is None else {n: np.zeros(0, get(n).numpy_dtype()) for n in columns}
        return PackedRows(np.zeros(1, np.int64), EMPTY_I64, EMPTY_I64, EMPTY_I32, toks, cols)

    @staticmethod
    def concat(parts: list[PackedRows]) -> PackedRows:
        """`parts` end to end. Parts without rows add nothing and are left out (their types
        neither promote the others' nor, tokens None, hide them); `concat([])` has no rows and
        no tokens (no dtype is known); of parts all without rows, the first that has tokens
        (their dtype and columns) is the result."""
        parts = (
            [p for p in parts if p.n_rows]
            or [p for p in parts if p.tokens is not None][:1]
            or parts[:1]
        )
        if not parts:
            return _EMPTY_ROWS
        if len(parts) == 1:
            return parts[0]
        shifts = np.cumsum([0] + [len(p.seg_len) for p in parts[:-1]])
        row_docs = np.concatenate(
            [parts[0].row_docs[:1]]
            + [p.row_docs[1:] + s for p, s in zip(parts, shifts, strict=True)]
        )
        toks = None
        if parts[0].tokens is not None:
            toks = np.concatenate([p.tokens for p in parts])
        return PackedRows(
            row_docs,
            np.concatenate([p.seg_len for p in parts]),
            np.concatenate([p.doc_ids for p in parts]),
            np.concatenate([p.doc_chunks for p in parts]),
            toks,
            {name: np.concatenate([p.columns[name] for p in parts]) for name in parts[0].columns},
        )

    @property
    def documents(self) -> Documents:
        """All these rows' documents, end to end (none for no rows: `pop()` before anything was
        packed, whatever the packer was fed)."""
        if self.tokens is None and len(self.seg_len):
            raise ConfigError("these rows carry no tokens (the packer was fed lengths only)")
        tokens = EMPTY_I64 if self.tokens is None else self.tokens
        return Documents(tokens, self.seg_len, self.doc_ids, self.columns)

    def collate(self, **kwargs: Any) -> dict:
        """All these rows as one loader batch (`loader.collate`; keyword arguments pass through)."""
        from loader.collate import collate

        return collate(self.documents, **kwargs)

    def to_state(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @staticmethod
    def from_state(state: dict[str, Any]) -> PackedRows:
        # `columns` came later: a state saved before it had none.
        return PackedRows(
            **{f.name: state[f.name] for f in fields(PackedRows) if f.name != "columns"},
            columns=dict(state.get("columns") or {}),
        )


EMPTY_I64 = np.zeros(0, np.int64)
EMPTY_I32 = np.zeros(0, np.int32)
_EMPTY_ROWS = PackedRows.empty(None)


class RowBatcher:
    """Groups packed rows of at most `max_len` tokens into batches: `rows_per_batch` rows, or
    rows while `tokens_per_batch` holds (at least `max_len`, so every row fits a batch, as
    `PackedDataset` requires). Exactly one of the two."""

    def __init__(
        self,
        *,
        max_len: int,
        rows_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
    ):
        if (rows_per_batch is None) == (tokens_per_batch is None):
            raise ConfigError(
                "give exactly one of rows_per_batch or tokens_per_batch, got "
                f"rows_per_batch={rows_per_batch}, tokens_per_batch={tokens_per_batch}"
            )
        if rows_per_batch is not None:
            check_int("rows_per_batch", rows_per_batch, 1)
        if tokens_per_batch is not None:
            check_int("tokens_per_batch", tokens_per_batch, 1)
            if tokens_per_batch < max_len:
                # a row longer than the budget went alone: most batches ran over it
                raise ConfigError(
                    f"tokens_per_batch {tokens_per_batch} is smaller than max_len {max_len}: a "
                    "full row would not fit a batch; raise tokens_per_batch or lower max_len"
                )
        self.max_len = max_len
        self.rows_per_batch = rows_per_batch
        self.tokens_per_batch = tokens_per_batch
        most, why = self.batch_tokens
        if most > MAX_BATCH_TOKENS:  # as `PackedDataset` refuses it (loader.config)
            raise ConfigError(
                f"{why} is more tokens than a batch can hold: cu_seqlens is int32, so at most "
                f"{MAX_BATCH_TOKENS:,} a batch"
            )
        self.pending: PackedRows = _EMPTY_ROWS
        self.handed = 0
        """Rows of `pending` a running `ready()` has yielded (it trims `pending` only at its
        end): a consumer that stops it early must not be given them again (`rest`)."""

    @property
    def batch_tokens(self) -> tuple[int, str]:
        """The most tokens a batch can hold, and what sets that, in words (what a static
        shape's `pad_tokens` must hold: `loader.collate.check_collate_kwargs`)."""
        if self.tokens_per_batch is not None:
            return self.tokens_per_batch, f"tokens_per_batch={self.tokens_per_batch}"
        k, n = self.rows_per_batch, self.max_len
        return k * n, f"rows_per_batch={k} × max_len={n} = {k * n} tokens"

    def add(self, rows: PackedRows) -> None:
        if rows.n_rows:
            self.pending = PackedRows.concat([self.pending, rows]) if self.pending.n_rows else rows

    def ready(self, *, final: bool = False) -> Iterator[PackedRows]:
        """Complete batches (and, with `final`, the incomplete last one). A batch is complete
        when no further row can join it: `rows_per_batch` rows, or rows that fill
        `tokens_per_batch` exactly or leave too little room for the next row."""
        rows = self.pending
        a = self.handed = 0
        if self.rows_per_batch is not None:
            k = self.rows_per_batch
            while rows.n_rows - a >= k:
                a += k
                self.handed = a
                yield rows.slice(a - k, a)
        else:
            cum = np.cumsum(rows.row_lengths)
            budget = self.tokens_per_batch
            while a < rows.n_rows:
                base = cum[a - 1] if a else 0
                b = int(np.searchsorted(cum, base + budget, side="right"))
                b = max(b, a + 1)
                if b >= rows.n_rows and not final and cum[b - 1] - base < budget:
                    break  # the batch might still take more rows (one exactly full cannot)
                a, start = b, a
                self.handed = a
                yield rows.slice(start, b)
        if final and a < rows.n_rows:
            a, start = rows.n_rows, a
            self.handed = a
            yield rows.slice(start, a)
        self.pending = rows.slice(a, rows.n_rows) if a else rows
        self.handed = 0

    def rest(self) -> PackedRows:
        """The rows not yet handed out (also while a `ready()` is paused or was stopped)."""
        n = self.pending.n_rows
        return self.pending.slice(self.handed, n) if self.handed else self.pending
