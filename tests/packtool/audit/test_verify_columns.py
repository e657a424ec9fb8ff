"""packtool/audit/verify_columns.py: verify's checks of the loss mask (and any declared optional column)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit.verify import column_parts, verify_dataset
from packtool.audit.verify_columns import first_bad_row, optional_columns, row_problem
from packtool.dataset.manifest import INDEX_FILE, packed_schema
from packtool.errors import DataError
from tests.cli import one_error_line, run

COLUMNS = ("input_ids", "doc_offsets", "doc_ids", "doc_chunks", "loss_mask")
SCHEMA = packed_schema(pa.uint16(), COLUMNS)


def row(docs: list[tuple[list[int], list[int]]], first_id: int = 0) -> dict[str, list]:
    """The five columns of a row of (ids, mask) documents."""
    ids, mask, offsets = [], [], [0]
    for d, m in docs:
        ids += d
        mask += m
        offsets.append(len(ids))
    n = len(docs)
    return {
        "input_ids": ids,
        "doc_offsets": offsets,
        "doc_ids": list(range(first_id, first_id + n)),
        "doc_chunks": [0] * n,
        "loss_mask": mask,
    }


GOOD = [
    row([([1, 2, 3], [0, 1, 1]), ([4, 5], [0, 1])], 0),
    row([([6, 7, 8, 9], [0, 0, 0, 1])], 2),
]


def stored(r: dict) -> dict:
    """A row as the shards store it (the mask as bytes, its declared storage)."""
    if "loss_mask" not in r:
        return r
    return {**r, "loss_mask": bytes(r["loss_mask"])}


def make(factory, rows, **kw):
    kw.setdefault("columns", COLUMNS)
    return factory([[stored(r) for r in rows]], schema=SCHEMA, **kw)


def test_a_masked_dataset_verifies(packed_dataset_factory):
    report = verify_dataset(make(packed_dataset_factory, GOOD))
    assert report.supervised_tokens == 4
    assert "4 supervised tokens (supervised efficiency" in report.summary()


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({**GOOD[1], "loss_mask": [0, 0, 1]}, "3 loss_mask values for 4 input_ids"),
        ({**GOOD[1], "loss_mask": [0, 0, 2, 1]}, r"loss_mask\[2\] = 2 is above 1"),
        (
            row([([6, 7], [0, 1]), ([8, 9], [0, 0])], 2),
            r"document 1 \(tokens 2..4\) has no non-zero loss_mask value",
        ),
        # Only its first token supervised: labels shift, so the loader never predicts it (r6:
        # this passed, "OK ... 4 supervised tokens", and the document trained on nothing).
        (
            row([([6, 7], [0, 1]), ([8, 9], [1, 0])], 2),
            r"document 1 \(tokens 2..4\) has no non-zero loss_mask value past its first token",
        ),
        (
            row([([6, 7], [0, 1]), ([8], [1])], 2),
            r"document 1 \(tokens 2..3\) has no non-zero loss_mask value past its first token",
        ),
    ],
)
def test_verify_refuses_a_bad_mask_naming_the_row(packed_dataset_factory, bad, message):
    d = make(packed_dataset_factory, [GOOD[0], bad])
    with pytest.raises(DataError, match=message) as info:
        verify_dataset(d)
    assert "row 1 (global row 1)" in str(info.value)
    code, _, err = run("verify", d)
    assert code == 1 and "loss_mask" in one_error_line(err)


def test_verify_checks_the_recorded_supervised_tokens(packed_dataset_factory):
    counts = {"rows": 2, "tokens_out": 9, "tokens_supervised": 5}
    d = make(packed_dataset_factory, GOOD, counts=counts)
    with pytest.raises(DataError, match="counts.tokens_supervised is 5 but the shards hold 4"):
        verify_dataset(d)


def test_a_mask_the_manifest_does_not_list_is_refused(packed_dataset_factory):
    d = make(packed_dataset_factory, GOOD, columns=COLUMNS[:4])
    with pytest.raises(DataError, match=r"columns are .*loss_mask.*index.json columns"):
        verify_dataset(d)
    index = json.loads((d / INDEX_FILE).read_text())
    assert index["columns"] == list(COLUMNS[:4])


def _parts(rows: list[dict]) -> dict:
    table = pa.Table.from_pylist([stored(r) for r in rows], schema=SCHEMA)
    return {name: column_parts(table.column(name).combine_chunks()) for name in COLUMNS}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.lists(st.integers(0, 1), min_size=1, max_size=6), min_size=1, max_size=4),
            st.integers(-1, 1),  # change the mask's length by this much
            st.booleans(),  # put a 2 in the mask
        ),
        min_size=1,
        max_size=8,
    )
)
def test_vectorised_checks_agree_with_the_plain_reference(rows):
    built = []
    for masks, grow, two in rows:
        r = row([([7] * len(m), m) for m in masks])
        mask = r["loss_mask"]
        if grow < 0:
            mask = mask[:-1]
        elif grow > 0:
            mask = [*mask, 1]
        if two and mask:
            mask = [*mask[:-1], 2]
        built.append({**r, "loss_mask": mask})
    parts = _parts(built)
    optional = optional_columns(COLUMNS)
    first = first_bad_row(parts, optional)
    problems = []
    for r in built:
        values = {k: np.asarray(v) for k, v in r.items()}
        problems.append(row_problem(values, optional))
    expected = next((i for i, p in enumerate(problems) if p is not None), None)
    assert first == expected


ALL = (*COLUMNS, "seq_lengths")
_DTYPES = {
    "input_ids": np.uint16,
    "doc_offsets": np.int32,
    "doc_ids": np.int64,
    "doc_chunks": np.int32,
    "loss_mask": np.uint8,
    "seq_lengths": np.int32,
}


def _as(values: list[int], name: str) -> np.ndarray:
    info = np.iinfo(_DTYPES[name])
    return np.clip(np.asarray(values, dtype=np.int64), info.min, info.max).astype(_DTYPES[name])


@st.composite
def damaged_rows(draw) -> list[dict[str, list[int]]]:
    """A row group of valid rows with a few lists damaged: emptied, cut, grown, changed."""
    rows = []
    for _ in range(draw(st.integers(1, 5))):
        docs = draw(st.lists(st.integers(2, 5), min_size=1, max_size=3))
        r = row([([3] * n, [0] + [1] * (n - 1)) for n in docs])
        rows.append({**r, "seq_lengths": docs})
    for _ in range(draw(st.integers(0, 2))):
        r = rows[draw(st.integers(0, len(rows) - 1))]
        name = draw(st.sampled_from(ALL))
        v = r[name]
        op = draw(st.integers(0, 3))
        if op == 0:
            r[name] = []
        elif op == 1 and v:
            del v[draw(st.integers(0, len(v) - 1))]
        elif op == 2:
            v.insert(draw(st.integers(0, len(v))), draw(st.integers(0, 12)))
        elif v:
            v[draw(st.integers(0, len(v) - 1))] = draw(st.integers(-2, 12))
    return rows


@settings(max_examples=150, deadline=None)
@given(damaged_rows())
def test_every_check_agrees_with_the_plain_reference_on_damaged_rows(rows):
    # An empty doc_offsets list in a row group (first, last or between) once crashed the mask
    # check with an IndexError or made it skip the group's last document.
    from packtool.audit import verify

    parts = {}
    for name in ALL:
        lens = [len(r[name]) for r in rows]
        off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        parts[name] = (off, _as([x for r in rows for x in r[name]], name))
    optional = optional_columns(ALL)
    found = [verify.first_bad_row(parts, max_len=12, vocab_size=10), first_bad_row(parts, optional)]
    first = min((b for b in found if b is not None), default=None)
    expected = None
    for i, r in enumerate(rows):
        one = {name: _as(r[name], name) for name in ALL}
        core = verify.row_problem(*(one[c] for c in COLUMNS[:4]), max_len=12, vocab_size=10)
        if core or row_problem(one, optional):
            expected = i
            break
    assert first == expected


def test_a_row_group_ending_in_a_row_without_documents_is_named(packed_dataset_factory):
    empty = {"input_ids": [1], "doc_offsets": [], "doc_ids": [], "doc_chunks": [], "loss_mask": [0]}
    d = make(packed_dataset_factory, [*GOOD, empty])
    with pytest.raises(DataError, match=r"row 2 .*row has no documents"):
        verify_dataset(d)
