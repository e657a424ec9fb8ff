"""PackedRows and RowBatcher: rows and slices against a reference, and their cost."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.online.rows import PackedRows, RowBatcher


def rows_of(layout: list[list[int]], *, mask: bool = True) -> PackedRows:
    """Rows of segments of the given lengths; token ids count up from 0, the mask is id % 2."""
    seg_len = np.array([n for row in layout for n in row], np.int64)
    row_docs = np.zeros(len(layout) + 1, np.int64)
    np.cumsum([len(row) for row in layout], out=row_docs[1:])
    tokens = np.arange(int(seg_len.sum()), dtype=np.int64)
    columns = {"loss_mask": (tokens % 2).astype(np.uint8)} if mask else {}
    ids = np.arange(len(seg_len), dtype=np.int64) + 100
    return PackedRows(row_docs, seg_len, ids, np.zeros(len(seg_len), np.int32), tokens, columns)


def reference(layout: list[list[int]], r: int) -> tuple[list[int], list[int], list[int]]:
    """Row `r`'s tokens, segment lengths and document ids, counted by hand."""
    first_seg = sum(len(row) for row in layout[:r])
    start = sum(sum(row) for row in layout[:r])
    n = sum(layout[r])
    ids = list(range(100 + first_seg, 100 + first_seg + len(layout[r])))
    return list(range(start, start + n)), list(layout[r]), ids


layouts = st.lists(st.lists(st.integers(0, 6), max_size=4), max_size=12)


@settings(max_examples=100, deadline=None)
@given(layouts, st.data())
def test_rows_and_slices_match_a_reference(layout, data) -> None:
    rows = rows_of(layout)
    assert rows.n_rows == len(layout)
    for r in range(rows.n_rows):
        docs = rows.row(r)
        toks, lens, ids = reference(layout, r)
        assert docs.tokens.tolist() == toks
        assert docs.doc_lens.tolist() == lens
        assert docs.doc_ids.tolist() == ids
        assert docs.columns["loss_mask"].tolist() == [t % 2 for t in toks]
    a = data.draw(st.integers(0, len(layout)))
    b = data.draw(st.integers(a, len(layout)))
    part = rows.slice(a, b)
    assert part.n_rows == b - a
    for r in range(part.n_rows):  # a slice of a slice too
        toks, lens, ids = reference(layout, a + r)
        assert part.row(r).tokens.tolist() == toks
        assert part.slice(r, r + 1).tokens.tolist() == toks
        assert part.slice(r, r + 1).seg_len.tolist() == lens
        assert part.slice(r, r + 1).doc_ids.tolist() == ids
        assert part.slice(r, r + 1).columns["loss_mask"].tolist() == [t % 2 for t in toks]
    lengths = PackedRows(rows.row_docs, rows.seg_len, rows.doc_ids, rows.doc_chunks, None)
    assert lengths.slice(a, b).tokens is None and lengths.slice(a, b).seg_len.tolist() == [
        n for row in layout[a:b] for n in row
    ]
    if layout:
        assert len(lengths.row(0).tokens) == 0


class CountingLengths(np.ndarray):
    """Segment lengths that count the values every numpy operation on them reads."""

    touched = 0

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(x) if isinstance(x, CountingLengths) else x for x in inputs]
        CountingLengths.touched += sum(x.size for x in plain if isinstance(x, np.ndarray))
        if "out" in kwargs:
            kwargs["out"] = tuple(
                np.asarray(x) if isinstance(x, CountingLengths) else x for x in kwargs["out"]
            )
        return getattr(ufunc, method)(*plain, **kwargs)


def test_every_row_and_every_slice_read_each_length_a_bounded_number_of_times() -> None:
    """Before: `row(i)` and `slice(a, b)` summed every segment before theirs, so reading each of
    n rows touched ~n²/2 lengths (75k rows: rows.row(i) over all of them took 10.6 s)."""
    n = 3000
    rows = rows_of([[1, 2]] * n, mask=False)
    counted = PackedRows(
        rows.row_docs,
        rows.seg_len.view(CountingLengths),
        rows.doc_ids,
        rows.doc_chunks,
        rows.tokens,
    )
    CountingLengths.touched = 0
    for r in range(n):
        assert counted.row(r).tokens.tolist() == [3 * r, 3 * r + 1, 3 * r + 2]
    for r in range(n):
        assert counted.slice(r, r + 1).tokens.tolist() == [3 * r, 3 * r + 1, 3 * r + 2]
    batcher = RowBatcher(max_len=3, rows_per_batch=2)
    batcher.add(counted)
    assert sum(b.n_rows for b in batcher.ready(final=True)) == n
    assert CountingLengths.touched <= 20 * 2 * n  # linear: ~n² / 2 before
