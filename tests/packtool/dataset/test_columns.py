"""packtool/dataset/columns.py: the one declaration the shard schema, index.json, verify, pack and the
loader derive from. A column added to the declaration shows up everywhere with no other change."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pytest

from loader.packed.transport import Ring, pack_compact
from loader.store.shards import ShardStore
from loader.testing import write_dataset
from packtool.audit.verify import verify_dataset
from packtool.dataset import columns as shard_columns
from packtool.dataset.columns import DOCUMENT, ROW, TOKEN, Column
from packtool.dataset.manifest import INDEX_FILE, packed_schema, read_manifest
from packtool.errors import DataError
from packtool.pack.chunk import PackConfig, pack_table

REQUIRED = ("input_ids", "doc_offsets", "doc_ids", "doc_chunks")
ROWS = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10], [11], [12]]]


def test_the_required_columns_are_format_one():
    assert shard_columns.names(shard_columns.required()) == REQUIRED
    schema = packed_schema(pa.uint16())
    assert schema.names == list(REQUIRED)
    assert schema.field("input_ids").type == pa.list_(pa.uint16())
    assert schema.field("doc_offsets").type == pa.list_(pa.int32())
    assert schema.field("doc_ids").type == pa.list_(pa.int64())
    # The token rule: uint32 by default.
    assert packed_schema().field("input_ids").type == pa.list_(pa.uint32())


def test_loss_mask_is_declared_optional_per_token():
    c = shard_columns.get("loss_mask")
    assert (c.level, c.dtype, c.required, c.loaded) == (TOKEN, "uint8", False, True)
    schema = packed_schema(pa.uint16(), ("loss_mask", *REQUIRED))  # any order in, declared out
    assert schema.names == [*REQUIRED, "loss_mask"]
    # One byte per token, one binary value per row: decodes as one copy, not value by value.
    assert c.storage == shard_columns.BYTES and schema.field("loss_mask").type == pa.binary()


@pytest.mark.parametrize(
    "bad",
    [
        {"storage": "bytes", "dtype": "int32"},
        {"storage": "bytes", "level": DOCUMENT},
        {"storage": "bits"},
        {"level": "span"},
    ],
)
def test_a_column_declaration_that_cannot_work_is_refused(bad):
    with pytest.raises(ValueError, match="column x"):
        Column(
            **{"name": "x", "dtype": "uint8", "level": TOKEN, "required": False, "doc": "", **bad}
        )


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ((*REQUIRED, "weights"), "column 'weights' is not known to this packtool"),
        (("input_ids", "doc_offsets", "doc_ids"), "required column 'doc_chunks' is missing"),
    ],
)
def test_unknown_or_missing_columns_are_refused(names, message):
    with pytest.raises(DataError, match=message):
        packed_schema(pa.uint16(), names)


def _index(path):
    return json.loads((path / INDEX_FILE).read_text())


def test_index_json_records_the_columns_and_format_1_still_reads(tmp_path):
    write_dataset(
        tmp_path / "v2",
        ROWS,
        max_len=6,
        loss_masks=[[[0, 1, 1], [1, 0]], [[0, 0, 0, 1]], [[1], [1], [1]]],
    )
    index = _index(tmp_path / "v2")
    assert index["format_version"] == 3 and index["columns"] == [*REQUIRED, "loss_mask"]
    assert read_manifest(tmp_path / "v2").columns == (*REQUIRED, "loss_mask")
    write_dataset(tmp_path / "v1", ROWS, max_len=6, format_version=1)
    index = _index(tmp_path / "v1")
    assert index["format_version"] == 1 and "columns" not in index
    assert read_manifest(tmp_path / "v1").columns == REQUIRED
    verify_dataset(tmp_path / "v1")
    assert ShardStore(tmp_path / "v1").gather(np.array([0])).tokens.tolist() == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (None, "columns must be a list of column names"),
        ("input_ids", "columns must be a list of column names"),
        ([*REQUIRED, "input_ids"], "columns lists a name twice"),
        ([*REQUIRED, "weights"], "column 'weights' is not known"),
        (list(REQUIRED[:3]), "required column 'doc_chunks' is missing"),
    ],
)
def test_a_bad_columns_list_is_a_one_line_error(tmp_path, columns, message):
    write_dataset(tmp_path, ROWS, max_len=6)
    index = _index(tmp_path)
    if columns is None:
        del index["columns"]
    else:
        index["columns"] = columns
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(DataError, match=message) as info:
        read_manifest(tmp_path)
    assert "\n" not in str(info.value)


# --- a column added to the declaration: every part follows -------------------------------------

WEIGHT = Column(
    name="weight",
    dtype="uint8",
    level=TOKEN,
    required=False,
    doc="a per-token weight 0..3",
    min_value=0,
    max_value=3,
    loaded=True,
)
SOURCE = Column(name="source_id", dtype="int32", level=DOCUMENT, required=False, doc="a source")
LANG = Column(name="row_lang", dtype="int16", level=ROW, required=False, doc="a row's language")


@pytest.fixture
def extended(monkeypatch):
    """The declaration with three more optional columns, one per level."""
    monkeypatch.setattr(
        shard_columns, "SHARD_COLUMNS", (*shard_columns.SHARD_COLUMNS, WEIGHT, SOURCE, LANG)
    )


WEIGHTS = [[[0, 1, 2], [3, 0]], [[1, 1, 1, 1]], [[2], [0], [3]]]


def test_an_added_column_shows_up_in_the_schema(extended):
    schema = packed_schema(pa.uint16(), (*REQUIRED, "weight", "source_id", "row_lang"))
    assert schema.names == [*REQUIRED, "weight", "source_id", "row_lang"]
    assert schema.field("weight").type == pa.list_(pa.uint8())
    assert schema.field("source_id").type == pa.list_(pa.int32())
    assert schema.field("row_lang").type == pa.int16()  # a per-row column is a scalar


def test_an_added_column_is_written_listed_verified_and_loaded(extended, tmp_path):
    write_dataset(
        tmp_path,
        ROWS,
        max_len=6,
        columns={"weight": WEIGHTS, "source_id": [[7, 8], [9], [1, 2, 3]]},
    )
    assert _index(tmp_path)["columns"] == [*REQUIRED, "weight", "source_id"]
    verify_dataset(tmp_path)
    store = ShardStore(tmp_path)
    docs = store.gather(np.array([2, 0]))
    assert docs.columns["weight"].tolist() == [2, 0, 3, 0, 1, 2, 3, 0]  # loaded=True: carried
    assert "source_id" not in docs.columns  # not declared as loaded
    # The worker transport's layout comes from the declaration too.
    ring = Ring(
        num_workers=1,
        slots=1,
        max_tokens=64,
        max_docs=8,
        token_dtype=store.token_dtype,
        columns=store.optional,
    )
    ring.start_worker()
    for item in (
        ring.put(store, np.array([2, 0]), filler=False, step=0),
        pack_compact(
            docs, filler=False, token_dtype=store.token_dtype, step=1, columns=store.optional
        ),
    ):
        assert ring.take(item).columns["weight"].tolist() == [2, 0, 3, 0, 1, 2, 3, 0]


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([[[0, 1], [3, 0]], [[1, 1, 1, 1]], [[2], [0], [3]]], "4 weight values for 5 input_ids"),
        ([[[0, 1, 9], [3, 0]], [[1, 1, 1, 1]], [[2], [0], [3]]], r"weight\[2\] = 9 is above 3"),
    ],
)
def test_verify_refuses_an_added_column_that_breaks_its_declaration(
    extended, tmp_path, weights, message
):
    write_dataset(tmp_path, ROWS, max_len=6, columns={"weight": weights})
    with pytest.raises(DataError, match=message) as info:
        verify_dataset(tmp_path)
    assert "row 0" in str(info.value)


def test_pack_moves_an_added_column_with_the_ids(extended):
    ids = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
    weights = [[0, 1, 2, 3], [3, 2, 1], [1, 0]]
    table = pa.table(
        {
            "doc_id": pa.array([0, 1, 2], pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "length": pa.array([4, 3, 2], pa.int32()),
            "weight": pa.array(weights, pa.list_(pa.uint8())),
            "source_id": pa.array([10, 11, 12], pa.int32()),
        }
    )
    out = pack_table(table, PackConfig(max_len=5, long_docs="split")).table
    assert out.column_names == [*REQUIRED, "seq_lengths", "weight", "source_id"]
    by_doc = {}
    for row in out.to_pylist():
        off = row["doc_offsets"]
        for k, doc in enumerate(row["doc_ids"]):
            by_doc.setdefault(doc, [[], []])
            by_doc[doc][0] += row["weight"][off[k] : off[k + 1]]
            by_doc[doc][1].append(row["source_id"][k])
    for d in range(3):  # the weights follow their tokens, split pieces included
        assert by_doc[d][0] == weights[d]
        assert set(by_doc[d][1]) == {10 + d}


def test_a_per_row_column_is_written_and_verified(extended, tmp_path):
    write_dataset(tmp_path, ROWS, max_len=6, columns={"row_lang": [1, 2, 3]})
    verify_dataset(tmp_path)
    assert ShardStore(tmp_path).gather(np.array([1])).columns == {}  # stored, not loaded


def test_a_per_row_column_out_of_range_is_refused(monkeypatch, tmp_path):
    bounded = replace(LANG, min_value=0)
    monkeypatch.setattr(shard_columns, "SHARD_COLUMNS", (*shard_columns.SHARD_COLUMNS, bounded))
    write_dataset(tmp_path, ROWS, max_len=6, columns={"row_lang": [1, -2, 3]})
    with pytest.raises(DataError, match=r"row 1 .*row_lang\[0\] = -2 is below 0"):
        verify_dataset(tmp_path)


def test_online_packing_carries_an_added_per_token_column(extended):
    from loader import OnlinePacker

    p = OnlinePacker(max_len=6, buffer_docs=2, min_fill=0.0, shuffle_rows=False)
    p.push(np.arange(7), np.array([4, 3]), columns={"weight": np.array([0, 1, 2, 3, 3, 2, 1])})
    p.push(np.arange(2), np.array([2]), columns={"weight": np.array([1, 1])})
    state = p.state_dict()
    again = OnlinePacker(max_len=6, buffer_docs=2, min_fill=0.0, shuffle_rows=False)
    again.load_state_dict(state)
    for packer in (p, again):
        packer.flush()
        rows = packer.pop()
        got = zip(rows.tokens.tolist(), rows.columns["weight"].tolist(), strict=True)
        want = zip([0, 1, 2, 3, 4, 5, 6, 0, 1], [0, 1, 2, 3, 3, 2, 1, 1, 1], strict=True)
        assert sorted(got) == sorted(want)
        assert rows.documents.columns["weight"].dtype == np.uint8
    with pytest.raises(DataError, match=r"weight values must be in 0..3"):
        OnlinePacker(max_len=6).push(
            np.arange(2), np.array([2]), columns={"weight": np.array([0, 7])}
        )
