"""`packtool verify`'s checks of the declared optional columns (packtool/dataset/columns.py), per row.

Derived from the declaration, so a column added there is checked with no change here:

- its list length by level: a `TOKEN` column has one value per id of the row, a `DOCUMENT`
  column one value per document (`len(doc_offsets) - 1`); a `ROW` column is a scalar;
- its values within the declared `min_value` / `max_value`;
- with `every_document_positive`, every document holds a non-zero value past its first token
  (for `loss_mask`: no document without a supervised token the loader can train on; labels
  shift, so a document's first token is never a target);
- a derived column (`Column.derived`) equals its rule computed from the row's own columns (for
  `seq_lengths`: the differences of `doc_offsets`).

`first_bad_row` is the vectorised check over a whole row group; `row_problem` is the plain
reference for one row that names what is wrong (tests hold the two to the same answer). The
required columns' own invariants are in packtool/audit/verify.py.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from packtool.dataset import columns as shard_columns
from packtool.dataset.columns import DOCUMENT, ROW, TOKEN, Column

Parts = dict[str, tuple[NDArray[np.int64], np.ndarray]]
"""Per list column: (offsets rebased to 0, values); per `ROW` column: (None, values)."""


def optional_columns(names: tuple[str, ...]) -> tuple[Column, ...]:
    """The declared optional columns among a dataset's `names`."""
    return tuple(c for c in shard_columns.resolve(names) if not c.required)


def _rows_of(positions: NDArray[np.int64], offsets: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.searchsorted(offsets, positions, side="right") - 1


def first_bad_row(parts: Parts, columns: tuple[Column, ...]) -> int | None:
    """The first row (in this batch) where an optional column breaks its declaration, or None."""
    ids_off = parts["input_ids"][0]
    doc_off = parts["doc_offsets"][0]
    n = len(ids_off) - 1
    n_docs = np.diff(doc_off) - 1
    bad = np.zeros(n, dtype=bool)
    for c in columns:
        off, values = parts[c.name]
        if c.level == ROW:
            hit = np.zeros(n, dtype=bool)
        else:
            want = np.diff(ids_off) if c.level == TOKEN else n_docs
            hit = np.diff(off) != want
        low = np.flatnonzero(values < c.min_value) if c.min_value is not None else []
        high = np.flatnonzero(values > c.max_value) if c.max_value is not None else []
        for positions in (low, high):
            if len(positions):
                hit[positions if c.level == ROW else _rows_of(positions, off)] = True
        if c.every_document_positive and c.level == TOKEN and not hit.all():
            hit |= _empty_document_rows(values, off, ids_off, parts["doc_offsets"], ~hit)
        if c.derived is not None:
            hit |= _differs_from_rule(c, parts, off, values)
        bad |= hit
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def _differs_from_rule(
    c: Column, parts: Parts, off: NDArray[np.int64] | None, values: np.ndarray
) -> NDArray[np.bool_]:
    """Rows where derived column `c` differs from its rule (rows of another length included)."""
    want_off, want = c.derived.compute(parts)
    if off is None:  # ROW: one value per row
        return np.asarray(values) != np.asarray(want)
    same = np.diff(off) == np.diff(want_off)
    # Compare the rows of the right length value by value; the others differ already.
    stored = np.repeat(same, np.diff(off))
    wrong = np.flatnonzero(stored)[values[stored] != want[np.repeat(same, np.diff(want_off))]]
    hit = ~same
    hit[_rows_of(wrong, off)] = True
    return hit


def _empty_document_rows(
    values: np.ndarray,
    off: NDArray[np.int64],
    ids_off: NDArray[np.int64],
    doc_offsets: tuple[NDArray[np.int64], np.ndarray],
    usable: NDArray[np.bool_],
) -> NDArray[np.bool_]:
    """Rows (among `usable`, whose lengths are right) with a document whose values past its
    first are all 0.

    Rows with fewer than two doc_offsets hold no document; the core checks report them. Left
    in, such a row repeats the previous row's last boundary (an index past `sums`), or, first
    in the batch, marks index -1 and so skips the batch's last document.
    """
    d_off, d_values = doc_offsets
    out = np.zeros(len(usable), dtype=bool)
    rows = np.flatnonzero(usable & (np.diff(d_off) >= 2))
    if not len(rows):
        return out
    # Document boundaries of the usable rows, as flat positions into `values`.
    starts, stops = d_off[rows], d_off[rows + 1]
    counts = stops - starts
    take = np.repeat(starts - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
    take += np.arange(int(counts.sum()))
    row_start, row_end = np.repeat(off[rows], counts), np.repeat(off[rows + 1], counts)
    # Offsets past the row are the core checks' to report; clipped, they cannot index outside.
    bounds = np.clip(d_values[take].astype(np.int64) + row_start, row_start, row_end)
    cum = np.zeros(len(values) + 1, np.int64)
    np.cumsum(values != 0, dtype=np.int64, out=cum[1:])  # dtype: ~4x faster than on output
    sums = cum[bounds[1:]] - cum[np.minimum(bounds[:-1] + 1, bounds[1:])]  # past each first
    # Differences across the end of one row and the start of the next are not documents.
    last = np.cumsum(counts) - 1
    inside = np.ones(len(sums), dtype=bool)
    inside[last[:-1]] = False
    row_of = np.repeat(rows, counts)[:-1]
    out[row_of[inside & (sums == 0)]] = True
    return out


def row_problem(row: dict[str, np.ndarray], columns: tuple[Column, ...]) -> str | None:
    """What is wrong with one row's optional columns, or None (the plain reference).

    Args:
        row: the row's values by column name (lists as 1-D arrays, `ROW` columns as scalars).
        columns: the optional columns to check.
    """
    n_tokens = len(row["input_ids"])
    offsets = [int(x) for x in row["doc_offsets"]]
    n_docs = len(offsets) - 1
    for c in columns:
        values = np.atleast_1d(row[c.name])
        if c.level in (TOKEN, DOCUMENT):
            want, what = (n_tokens, "input_ids") if c.level == TOKEN else (n_docs, "documents")
            if len(values) != want:
                return f"{len(values)} {c.name} values for {want} {what} (expected one per each)"
        for k, v in enumerate(values.tolist()):
            if c.min_value is not None and v < c.min_value:
                return f"{c.name}[{k}] = {v} is below {c.min_value} ({c.doc})"
            if c.max_value is not None and v > c.max_value:
                return f"{c.name}[{k}] = {v} is above {c.max_value} ({c.doc})"
        if c.derived is not None:
            one = {name: _one_row_parts(row[name]) for name in c.derived.inputs}
            want = np.atleast_1d(c.derived.compute(one)[1])
            if len(want) != len(values):
                return f"{len(values)} {c.name} values, expected {len(want)} ({c.derived.rule})"
            for k, (v, w) in enumerate(zip(values.tolist(), want.tolist(), strict=True)):
                if v != w:
                    return f"{c.name}[{k}] = {v}, expected {w} ({c.derived.rule})"
        if c.every_document_positive and c.level == TOKEN:
            for d in range(n_docs):
                if not values[offsets[d] + 1 : offsets[d + 1]].any():
                    return (
                        f"document {d} (tokens {offsets[d]}..{offsets[d + 1]}) has no non-zero "
                        f"{c.name} value past its first token ({c.doc}; the first is never a "
                        "target, labels being shifted); it would train on nothing"
                    )
    return None


def _one_row_parts(values: np.ndarray) -> tuple[NDArray[np.int64], np.ndarray]:
    values = np.atleast_1d(np.asarray(values))
    return np.array([0, len(values)], dtype=np.int64), values
