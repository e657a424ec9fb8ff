"""The tokenized-Parquet format's shared reading: the inputs' common tokenizer, their lengths."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized import common_identity, length_tables
from packtool.errors import DataError
from packtool.storage import local as storage
from tests.cli import one_error_line, run

BYTE = TokenizerIdentity(
    kind="byte", name="byte", vocab_size=258, eos_id=256, bos_id=None, sha256="a" * 64
)


def _meta(identity: TokenizerIdentity) -> dict:
    return {"tokenizer": identity.to_dict()}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # Only the BOS differed: both sides read "byte:byte, vocab 258, eos 256", the same.
        ({"bos_id": 5}, "byte:byte (vocab 258, eos 256, bos 5), unlike a.parquet (byte:byte, "
         "vocab 258, eos 256, bos none); they differ in bos_id"),
        ({"sha256": "b" * 64}, "byte:byte (vocab 258, eos 256, bos none, sha256 bbbbbbbbbbbb), "
         "unlike a.parquet (byte:byte, vocab 258, eos 256, bos none, sha256 aaaaaaaaaaaa); "
         "they differ in sha256"),
        ({"eos_id": None, "bos_id": 1}, "byte:byte (vocab 258, eos none, bos 1), unlike "
         "a.parquet (byte:byte, vocab 258, eos 256, bos none); they differ in eos_id, bos_id"),
    ],
)  # fmt: skip
def test_a_tokenizer_mismatch_names_what_differs(change, said):
    from dataclasses import replace

    other = replace(BYTE, **change)
    with pytest.raises(DataError) as info:
        common_identity([(Path("a.parquet"), _meta(BYTE)), (Path("b.parquet"), _meta(other))])
    assert str(info.value) == f"b.parquet: tokenized with {said}"


def test_another_name_or_engine_is_the_same_tokenizer():
    from dataclasses import replace

    other = replace(BYTE, name="elsewhere/byte", engine="byte")
    assert common_identity([(Path("a"), _meta(BYTE)), (Path("b"), _meta(other))]) == BYTE


def _edited(tmp_path: Path, edit: dict[int, int], null_id_in: int | None = None) -> Path:
    """A tokenized file of six documents (2..7 ids each), two rows a row group, whose
    `length` of row r is edited to `edit[r]` (and an id of row `null_id_in` made null)."""
    from packtool.tokenize.tokenize import tokenize_corpus

    src = tmp_path / "c.jsonl"
    src.write_text("".join('{"text": "%s"}\n' % ("x" * i) for i in range(1, 7)))  # +EOS: 2..7
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    tokenize_corpus([src], good, progress=False)
    t = pq.read_table(good)
    lengths = t.column("length").to_pylist()
    assert lengths == [2, 3, 4, 5, 6, 7]
    for row, value in edit.items():
        lengths[row] = value
    t = t.set_column(t.schema.get_field_index("length"), "length", pa.array(lengths, pa.int32()))
    if null_id_in is not None:
        ids = t.column("input_ids").to_pylist()
        ids[null_id_in][0] = None
        i = t.schema.get_field_index("input_ids")
        t = t.set_column(i, t.schema.field(i), pa.array(ids, t.schema.field(i).type))
    pq.write_table(t.replace_schema_metadata(pq.read_schema(good).metadata), bad, row_group_size=2)
    return bad


@pytest.mark.parametrize(
    ("edit", "said"),
    [
        ({0: 1001}, "row 0: length is 1001 but the row has 2 ids"),
        ({3: 2}, "row 3: length is 2 but the row has 5 ids"),  # in the second row group
        ({5: 9, 4: 1}, "row 4: length is 1 but the row has 6 ids"),
        # sum(length) + rows of length 0 unchanged: the statistics' empty lists tell
        ({0: 0, 1: 4}, "row 0: length is 0 but the row has 2 ids"),
    ],
)
def test_a_length_unlike_its_ids_is_refused_as_pack_refuses_it(tmp_path, edit, said):
    # stats trusted `length` (reading only it): a length 1,000 past its ids gave 1,000 more
    # tokens, which pack then refused. The footer's counts tell, without reading an id.
    from packtool.stats.lengths import StatsConfig, compute_stats

    bad = _edited(tmp_path, edit)
    with pytest.raises(DataError) as info:
        compute_stats([bad], StatsConfig(max_len=64, candidates=(64,)))
    assert str(info.value) == f"{bad}: {said}"
    code, _, err = run("pack", bad, "-o", tmp_path / "out", "--max-len", 64)
    assert code == 1 and one_error_line(err) == f"error: {bad}: {said}"


def test_a_null_id_is_named_as_pack_names_it(tmp_path):
    bad = _edited(tmp_path, {}, null_id_in=2)
    with pytest.raises(DataError) as info:
        list(length_tables([(bad, {})]))
    assert str(info.value) == f"{bad}: row 2: a null token id"


@pytest.mark.parametrize("command", ["stats", "pack"])
def test_a_null_row_of_length_0_is_refused_by_stats_as_pack_refuses_it(tmp_path, command):
    """A row whose `input_ids` is null and whose `length` is 0 (no packtool writer makes one:
    the column is not nullable) looked like an empty row from the footer, so `stats` counted it
    an `empty` skip and went on, while `pack` refused the file ("null input_ids", as it refuses
    a null length or a null id). A row group with a row of length 0 now has its ids read."""
    from tests.packtool.cli.test_corrupt_inputs import foreign_tokenized

    ids = [[1, 2, 256], [3, 4, 5, 256], None]
    bad = foreign_tokenized(tmp_path / "t.parquet", input_ids=ids, length=[3, 4, 0])
    out = ["-o", tmp_path / "out"] if command == "pack" else []
    code, _, err = run(command, bad, "--max-len", 64, *out)
    assert code == 1 and one_error_line(err) == f"error: {bad}: row 2: null input_ids"
    with pytest.raises(DataError, match=f"^{bad}: row 2: null input_ids$"):
        list(length_tables([(bad, {})]))


def test_an_empty_row_is_still_an_empty_skip_for_stats(tmp_path):
    from packtool.read.documents import SkipCounter
    from tests.packtool.cli.test_corrupt_inputs import foreign_tokenized

    path = foreign_tokenized(
        tmp_path / "t.parquet", input_ids=[[1, 2, 256], [3, 4, 5, 256], []], length=[3, 4, 0]
    )
    skips = SkipCounter()
    assert [x.tolist() for x, _ in length_tables([(path, {})], skips=skips)] == [[3, 4], []]
    assert skips.counts == {"empty": 1}


def test_lengths_that_match_their_ids_read_no_id(tmp_path, monkeypatch):
    good = _edited(tmp_path, {})
    pf = storage.parquet_file(good)
    read = []
    real = type(pf).read_row_group
    monkeypatch.setattr(
        type(pf),
        "read_row_group",
        lambda self, *a, **k: read.append(k["columns"]) or real(self, *a, **k),
    )
    assert [len(x) for x, _ in length_tables([(good, {})])] == [2, 2, 2]
    assert read == [["length"]] * 3


def test_a_footer_counting_nulls_otherwise_never_refuses_rows_that_agree(tmp_path):
    """What a writer counts as a null of a list column is not fixed by Parquet (pyarrow < 6.0
    counted leaf nulls only): a footer saying no null for a file with an empty document sent
    the check to read the ids, which agreed with `length`, and it still refused the file."""
    import numpy as np
    import pyarrow.parquet as pq

    from packtool.dataset.tokenized import _check_ids_count, _ids_leaf

    path = tmp_path / "a.parquet"
    lengths = np.array([3, 0, 1], np.int32)
    ids = pa.array([[1, 2, 3], [], [4]], pa.list_(pa.uint32()))
    pq.write_table(pa.table({"input_ids": ids, "length": lengths}), path)
    real = pq.ParquetFile(path)

    class Footer:  # the real footer, its ids' null count as such a writer wrote it
        def __init__(self, inner, **told):
            self.inner, self.told = inner, told

        def __getattr__(self, name):
            return self.told.get(name, getattr(self.inner, name))

    column = real.metadata.row_group(0).column(_ids_leaf(real, path))
    assert column.statistics.null_count == 1  # today's pyarrow: the empty list
    stats = Footer(column.statistics, null_count=0)
    told = Footer(column, statistics=stats)
    group = Footer(real.metadata.row_group(0), column=lambda i: told)
    pf = Footer(real, metadata=Footer(real.metadata, row_group=lambda i: group))
    _check_ids_count(pf, 0, _ids_leaf(real, path), lengths, path, 0)  # no DataError
