"""The derived shard column `seq_lengths` (diff of doc_offsets, TRL's packed format) and the
general rule behind it (packtool/dataset/columns.py `Column.derived`): written by pack, listed in
index.json, checked by verify, shown by inspect, not loaded, absent from older datasets."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataset
from loader.store.shards import ShardStore
from loader.testing import write_dataset
from packtool.audit import verify_columns
from packtool.audit.inspect import inspect_dataset
from packtool.audit.verify import column_parts, verify_dataset
from packtool.dataset import columns as shard_columns
from packtool.dataset.columns import DOCUMENT, ROW, SEQ_LENGTHS, Column, Derivation
from packtool.dataset.manifest import INDEX_FILE, read_manifest
from packtool.dataset.shards import ShardConfig
from packtool.engines import worker
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig, pack_table

REQUIRED = ("input_ids", "doc_offsets", "doc_ids", "doc_chunks")
ROWS = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10], [11], [12]]]


def test_seq_lengths_is_a_derived_per_document_column_the_loader_does_not_read():
    c = shard_columns.get(SEQ_LENGTHS)
    assert (c.level, c.dtype, c.required, c.loaded) == (DOCUMENT, "int32", False, False)
    assert c.derived is not None and c.derived.inputs == ("doc_offsets",)
    assert shard_columns.derived() == (c,)
    assert shard_columns.written() == (*REQUIRED, SEQ_LENGTHS)
    assert shard_columns.written(["loss_mask"]) == (*REQUIRED, "loss_mask", SEQ_LENGTHS)
    # Never taken from the tokenized inputs, even when a table has a column of that name.
    assert shard_columns.tokenized_optional(["input_ids", SEQ_LENGTHS]) == ()


def test_a_required_derived_column_is_refused():
    rule = Derivation(inputs=("doc_offsets",), compute=shard_columns.piece_lengths, rule="r")
    with pytest.raises(ValueError, match="column x: a derived column cannot be required"):
        Column(name="x", dtype="int32", level=DOCUMENT, required=True, doc="", derived=rule)


@settings(max_examples=80, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 9), min_size=0, max_size=5), min_size=1, max_size=8),
    cut=st.integers(0, 7),
)
def test_piece_lengths_equal_each_rows_diff_of_doc_offsets(rows, cut):
    # Rows with no document (an empty doc_offsets list stands for a damaged row) give none.
    offsets = [np.concatenate([[0], np.cumsum(r)]).tolist() if r else [] for r in rows]
    arr = pa.array(offsets, pa.list_(pa.int32()))
    cut = min(cut, len(rows) - 1)
    sliced = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)])  # offsets not from 0
    for col in (arr, sliced):
        got = shard_columns.get(SEQ_LENGTHS).derive({"doc_offsets": shard_columns.flat_parts(col)})
        assert got.type == pa.list_(pa.int32())
        assert got.to_pylist() == [np.diff(o).tolist() for o in offsets]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    max_len=st.integers(8, 48),
    algorithm=st.sampled_from(["ffd", "bfd"]),
)
def test_pack_writes_each_rows_piece_lengths(lengths, max_len, algorithm):
    ids = [list(range(n)) for n in lengths]
    table = pa.table(
        {
            "doc_id": pa.array(range(len(ids)), pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            # A column of that name in the inputs is not carried: pack computes its own.
            SEQ_LENGTHS: pa.array([[99]] * len(ids), pa.list_(pa.int32())),
        }
    )
    out = pack_table(table, PackConfig(max_len=max_len, algorithm=algorithm)).table
    assert out.column_names == [*REQUIRED, SEQ_LENGTHS]
    for row in out.to_pylist():
        assert row[SEQ_LENGTHS] == np.diff(row["doc_offsets"]).tolist()


def _text_corpus(folder, n=300):
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "c.jsonl"
    words = ["alpha", "beta", "gamma", "delta"]
    with path.open("w") as f:
        for _ in range(n):
            text = " ".join(rng.choice(words, int(rng.integers(1, 60))))
            f.write(json.dumps({"text": text}) + "\n")
    return path


def _config(out, corpus, **kw):
    return RunConfig(
        inputs=(str(corpus),),
        out_dir=str(out),
        pack=PackConfig(max_len=256),
        shards=ShardConfig(shard_rows=20, row_group_rows=8),
        chunk_docs=100,
        progress=False,
        **kw,
    )


def test_pack_lists_verifies_and_shows_it(tmp_path):
    corpus = _text_corpus(tmp_path / "in")
    summary = run_pack(_config(tmp_path / "out", corpus))
    assert summary.columns == (SEQ_LENGTHS,)
    index = json.loads((tmp_path / "out" / INDEX_FILE).read_text())
    assert index["columns"] == [*REQUIRED, SEQ_LENGTHS]
    verify_dataset(tmp_path / "out")
    for shard in read_manifest(tmp_path / "out").shards:
        for row in pq.read_table(tmp_path / "out" / shard.file).to_pylist():
            assert row[SEQ_LENGTHS] == np.diff(row["doc_offsets"]).tolist()
    shown = inspect_dataset(tmp_path / "out")
    assert f"doc_chunks, {SEQ_LENGTHS}" in shown.format()
    assert f"no {SEQ_LENGTHS}" not in shown.format()
    assert shown.to_dict()["summary"]["columns_not_stored"] == []


def test_an_older_dataset_without_it_verifies_loads_and_says_so(tmp_path):
    write_dataset(tmp_path / "old", ROWS, max_len=6)
    write_dataset(tmp_path / "new", ROWS, max_len=6, derived=True)
    assert read_manifest(tmp_path / "old").columns == REQUIRED
    assert read_manifest(tmp_path / "new").columns == (*REQUIRED, SEQ_LENGTHS)
    for path in ("old", "new"):
        verify_dataset(tmp_path / path)
    text = inspect_dataset(tmp_path / "old").format()
    assert f"no {SEQ_LENGTHS} (each piece's length" in text and "a repack stores it" in text
    # The loader reads neither way the same batches and never decodes the column.
    new = ShardStore(tmp_path / "new")
    assert new.optional == () and SEQ_LENGTHS not in new._read_columns
    for a, b in zip(
        PackedDataset(tmp_path / "old", rows_per_batch=2, shuffle=False),
        PackedDataset(tmp_path / "new", rows_per_batch=2, shuffle=False),
        strict=True,
    ):
        assert a.keys() == b.keys()
        for k, v in a.items():
            assert v.equal(b[k]) if hasattr(v, "equal") else v == b[k], k


@pytest.mark.parametrize(
    ("stored", "message"),
    [
        ([[3, 2], [4], [1, 1, 1]], None),
        ([[3, 2], [3], [1, 1, 1]], r"row 1 .*seq_lengths\[0\] = 3, expected 4 \(the differences"),
        ([[2, 3], [4], [1, 1, 1]], r"row 0 .*seq_lengths\[0\] = 2, expected 3"),
        ([[3, 2], [4], [1, 2]], r"row 2 .*2 seq_lengths values for 3 documents"),
    ],
)
def test_verify_refuses_seq_lengths_that_differ_from_doc_offsets(tmp_path, stored, message):
    write_dataset(tmp_path, ROWS, max_len=6, columns={SEQ_LENGTHS: stored})
    if message is None:
        verify_dataset(tmp_path)
        return
    with pytest.raises(DataError, match=message):
        verify_dataset(tmp_path)


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=4), min_size=1, max_size=6),
    damage=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(-2, 2))),
    drop=st.lists(st.integers(0, 5), max_size=2),
)
def test_the_vectorised_check_and_the_row_reference_agree(rows, damage, drop):
    """Random rows, their lengths damaged (values changed, entries dropped): the first bad row
    of the vectorised check is the first row the plain per-row reference names."""
    offsets = [np.concatenate([[0], np.cumsum(r)]).tolist() for r in rows]
    stored = [list(r) for r in rows]
    for r, k, delta in damage:
        if r < len(stored) and k < len(stored[r]):
            stored[r][k] += delta
    for r in drop:
        if r < len(stored) and stored[r]:
            stored[r].pop()
    table = pa.table(
        {
            "input_ids": pa.array([[0] * sum(r) for r in rows], pa.list_(pa.uint16())),
            "doc_offsets": pa.array(offsets, pa.list_(pa.int32())),
            SEQ_LENGTHS: pa.array(stored, pa.list_(pa.int32())),
        }
    )
    parts = {name: column_parts(table.column(name).combine_chunks()) for name in table.column_names}
    cols = (shard_columns.get(SEQ_LENGTHS),)
    want = next(
        (
            r
            for r in range(len(rows))
            if verify_columns.row_problem(
                {n: np.asarray(table.column(n)[r].as_py()) for n in table.column_names}, cols
            )
        ),
        None,
    )
    assert verify_columns.first_bad_row(parts, cols) == want
    assert (want is None) == (stored == [list(r) for r in rows])


def test_a_run_started_before_seq_lengths_is_not_resumed_with_other_shards(tmp_path, monkeypatch):
    corpus = _text_corpus(tmp_path / "in")
    before = tuple(c for c in shard_columns.SHARD_COLUMNS if c.name != SEQ_LENGTHS)
    monkeypatch.setattr(shard_columns, "SHARD_COLUMNS", before)
    real = worker.write_chunk
    calls = {"n": 0}

    def crash_on_second_chunk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "write_chunk", crash_on_second_chunk)
    with pytest.raises(KeyboardInterrupt):
        run_pack(_config(tmp_path / "out", corpus))
    monkeypatch.undo()
    with pytest.raises(
        ConfigError, match=r"options or inputs differ \(columns: added \"seq_lengths\"\)"
    ):
        run_pack(_config(tmp_path / "out", corpus, resume=True))


# --- the rule is general: any derived column at any level --------------------------------------


def _docs_per_row(parts):
    off, _ = parts["doc_offsets"]
    return None, (np.diff(off) - 1).astype(np.int16)


N_DOCS = Column(
    name="n_docs",
    dtype="int16",
    level=ROW,
    required=False,
    doc="documents in the row",
    derived=Derivation(inputs=("doc_offsets",), compute=_docs_per_row, rule="len(doc_offsets) - 1"),
)


@pytest.fixture
def with_n_docs(monkeypatch):
    monkeypatch.setattr(shard_columns, "SHARD_COLUMNS", (*shard_columns.SHARD_COLUMNS, N_DOCS))


def test_an_added_derived_column_is_written_and_checked_like_seq_lengths(with_n_docs, tmp_path):
    corpus = _text_corpus(tmp_path / "in", n=80)
    run_pack(_config(tmp_path / "out", corpus))
    m = read_manifest(tmp_path / "out")
    assert m.columns == (*REQUIRED, SEQ_LENGTHS, "n_docs")
    verify_dataset(tmp_path / "out")
    table = pq.read_table(tmp_path / "out" / m.shards[0].file)
    assert table.schema.field("n_docs").type == pa.int16()
    assert table.column("n_docs").to_pylist() == [
        len(o) - 1 for o in table.column("doc_offsets").to_pylist()
    ]
    write_dataset(tmp_path / "bad", ROWS, max_len=6, columns={"n_docs": [2, 1, 2]})
    with pytest.raises(DataError, match=r"row 2 .*n_docs\[0\] = 2, expected 3 \(len\(doc_offsets"):
        verify_dataset(tmp_path / "bad")


def test_derive_refuses_a_column_that_is_not_derived():
    with pytest.raises(ValueError, match="not derived"):
        shard_columns.get("loss_mask").derive({})
