"""packtool/audit/piece_ends.py: where documents end in EOS, every piece ends in eos_id or is
max_len long (a chunk of a split document, a truncated head)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit import piece_ends
from packtool.audit.verify import list_parts, verify_dataset
from packtool.dataset.manifest import INDEX_FILE
from packtool.errors import DataError
from tests.cli import one_error_line, run

EOS = 255
TOKENIZER = {"kind": "byte", "name": "byte", "vocab_size": 256, "eos_id": EOS, "bos_id": None}
# max_len 16: document 1 split (chunk 0 a full row, chunk 1 ends in EOS), document 3 a
# truncated head (a full row, no EOS), the others whole and ending in EOS
SPLIT_ROW = [(1, 0, [5] * 16)]
MIXED_ROW = [(0, 0, [1, 2, EOS]), (1, 1, [6, 7, EOS]), (2, 0, [8, 8, 8, 8, EOS])]
TRUNCATED_ROW = [(3, 0, [9] * 16)]


def make(factory, rows, **kw):
    kw.setdefault("tokenizer", {**TOKENIZER, "sha256": ""})
    return factory([rows], **kw)


def moved_boundary(rows):
    """MIXED_ROW with its first boundary one token later: document 0 ends in 6, not EOS."""
    return [
        *rows[:1],
        {
            "input_ids": [1, 2, EOS, 6, 7, EOS, 8, 8, 8, 8, EOS],
            "doc_offsets": [0, 4, 6, 11],
            "doc_ids": [0, 1, 2],
            "doc_chunks": [0, 1, 0],
        },
        *rows[2:],
    ]


def test_split_chunks_truncated_heads_and_whole_documents_verify(packed_dataset_factory):
    report = verify_dataset(make(packed_dataset_factory, [SPLIT_ROW, MIXED_ROW, TRUNCATED_ROW]))
    assert report.documents == 5 and report.distinct_documents == 4


def test_a_moved_document_boundary_fails_verify_in_one_line(packed_dataset_factory):
    # Before: a boundary moved by one token (seq_lengths recomputed, checksums rewritten)
    # passed verify (audit note 4, tamper_cases.py offset_shifted): "OK ... 4,024 documents".
    d = make(packed_dataset_factory, moved_boundary([SPLIT_ROW, MIXED_ROW, TRUNCATED_ROW]))
    message = (
        r"row 1 \(global row 1\): document 0 \(tokens 0..4\) ends in token 6, not eos_id 255, "
        r"and is 4 tokens, not max_len 16"
    )
    with pytest.raises(DataError, match=message):
        verify_dataset(d)
    code, _, err = run("verify", d)
    assert code == 1 and "ends in token 6, not eos_id 255" in one_error_line(err)


def test_an_edited_eos_id_fails_verify(packed_dataset_factory):
    # Before: index.json's eos_id changed to 5 passed verify (tamper_cases.py index_eos).
    d = make(packed_dataset_factory, [SPLIT_ROW, MIXED_ROW, TRUNCATED_ROW])
    index = json.loads((d / INDEX_FILE).read_text())
    index["tokenizer"]["eos_id"] = 5
    (d / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(DataError, match=r"row 1 .*ends in token 255, not eos_id 5, and is 3 tok"):
        verify_dataset(d)


@pytest.mark.parametrize(
    ("tokenizer", "extra"),
    [
        ({**TOKENIZER, "eos_id": None}, {}),  # no EOS appended (--no-eos, pre-tokenized ids)
        (TOKENIZER, {"chat_template": {"sha256": "0" * 64}}),  # chat: the template ends them
    ],
)
def test_documents_without_an_appended_eos_are_not_held_to_it(
    packed_dataset_factory, tokenizer, extra
):
    rows = moved_boundary([SPLIT_ROW, MIXED_ROW, TRUNCATED_ROW])
    d = make(packed_dataset_factory, rows, tokenizer={**tokenizer, "sha256": ""}, extra=extra)
    assert verify_dataset(d).documents == 5
    assert piece_ends.ending_eos(tokenizer, extra) is None
    assert piece_ends.ending_eos(TOKENIZER, {}) == EOS


@pytest.mark.parametrize("edit", ["moved boundary", "edited eos_id"])
def test_inspect_row_refuses_the_pieces_verify_refuses_in_one_line(packed_dataset_factory, edit):
    """Before: `inspect --row 1` of a dataset whose document boundary was moved (or whose
    index.json eos_id was edited) showed the row, exit 0, where verify says "document 0
    (tokens 0..4) ends in token 6, not eos_id 255, ...": the row reader (row_values.py) did not
    repeat the piece-end check. Now the row shown goes through it (that row alone)."""
    from packtool.audit.inspect import read_row

    rows = [SPLIT_ROW, MIXED_ROW, TRUNCATED_ROW]
    d = make(packed_dataset_factory, moved_boundary(rows) if edit == "moved boundary" else rows)
    if edit == "edited eos_id":
        index = json.loads((d / INDEX_FILE).read_text())
        index["tokenizer"]["eos_id"] = 5
        (d / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(DataError) as verified:
        verify_dataset(d)
    words = str(verified.value).split("(global row 1): ")[1]  # verify's own words
    with pytest.raises(DataError) as refused:
        read_row(d, 1)
    assert str(refused.value).endswith(f": row 1: {words}; run `packtool verify`")
    code, out, err = run("inspect", d, "--row", "1")
    assert code == 1 and out == ""
    assert one_error_line(err) == f"error: {refused.value}"
    for good in (0, 2):  # the other rows still show
        assert read_row(d, good).documents


@st.composite
def row_groups(draw):
    """Rows of pieces with valid offsets; each piece ends in EOS or not, some max_len long."""
    max_len = draw(st.integers(2, 8))
    ids, ids_off, offs, offs_off = [], [0], [], [0]
    for _ in range(draw(st.integers(1, 6))):
        row: list[int] = []
        offsets = [0]
        for _ in range(draw(st.integers(1, 3))):
            room = max_len - len(row)
            if room < 1:
                break
            n = draw(st.integers(1, room))
            piece = draw(st.lists(st.integers(0, 9), min_size=n, max_size=n))
            if draw(st.booleans()):
                piece[-1] = EOS
            row += piece
            offsets.append(len(row))
        ids += row
        ids_off.append(len(ids))
        offs += offsets
        offs_off.append(len(offs))
    return max_len, ids, ids_off, offs, offs_off


@settings(max_examples=300, deadline=None)
@given(row_groups())
def test_the_vectorised_check_agrees_with_the_plain_reference(group):
    max_len, ids, ids_off, offs, offs_off = group
    import pyarrow as pa

    ids_a = pa.ListArray.from_arrays(pa.array(ids_off, pa.int32()), pa.array(ids, pa.uint16()))
    off_a = pa.ListArray.from_arrays(pa.array(offs_off, pa.int32()), pa.array(offs, pa.int32()))
    parts = {"input_ids": list_parts(ids_a), "doc_offsets": list_parts(off_a)}
    found = piece_ends.first_bad_row(parts, eos_id=EOS, max_len=max_len)
    expected = None
    for r in range(len(ids_off) - 1):
        row_ids = np.asarray(ids[ids_off[r] : ids_off[r + 1]])
        row_offs = offs[offs_off[r] : offs_off[r + 1]]
        if piece_ends.row_problem(row_ids, row_offs, eos_id=EOS, max_len=max_len) is not None:
            expected = r
            break
    assert found == expected
