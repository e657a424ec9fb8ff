"""`index.json`: a hand-edited or foreign manifest fails with one sentence, in every reader."""

from __future__ import annotations

import json

import pytest

from packtool.errors import DataError
from packtool.inspect_dataset import inspect_dataset
from packtool.manifest import INDEX_FILE, dataset_folder, read_manifest
from packtool.verify import verify_dataset

ROWS = [[[(0, 0, 5), (1, 0, 3)], [(2, 0, 7)]]]  # one shard, two rows


def edit(directory, path: tuple, value) -> None:
    index = json.loads((directory / INDEX_FILE).read_text())
    node = index
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (directory / INDEX_FILE).write_text(json.dumps(index))


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("max_len",), "16", "max_len must be a positive integer, found '16'"),
        (("max_len",), 0, "max_len must be a positive integer, found 0"),
        (("max_len",), None, "max_len must be a positive integer"),
        (("tokenizer",), [], "tokenizer must be an object"),
        (("tokenizer", "vocab_size"), 1.5, "tokenizer.vocab_size must be a positive integer"),
        (("tokenizer", "eos_id"), {}, "tokenizer.eos_id must be a token id or null"),
        (("counts",), 3, "counts must be an object"),
        (("counts", "rows"), None, "counts.rows must be an integer >= 0"),
        (("efficiency",), "high", "efficiency must be a number"),
        (("lower_bound_rows",), "x", "lower_bound_rows must be an integer >= 0"),
        (("shards",), {}, "shards must be a list"),
        (("shards", 0), "shard-00000.parquet", "shards[0] must be an object"),
        (("shards", 0, "file"), None, "shards[0].file must be a string"),
        (("shards", 0, "rows"), "2", "shards[0].rows must be an integer >= 0"),
        (("shards", 0, "bytes"), -1, "shards[0].bytes must be an integer >= 0"),
        (("algorithm",), 1, "algorithm must be a string"),
        (("extra",), [], "extra must be an object"),
    ],
)
def test_wrong_types_are_one_clear_error_everywhere(packed_dataset_factory, path, value, message):
    d = packed_dataset_factory(ROWS, max_len=16)
    edit(d, path, value)
    for read in (
        read_manifest,
        lambda p: verify_dataset(p, checksums=False),
        lambda p: inspect_dataset(p, row=0).format(),
    ):
        with pytest.raises(DataError, match="malformed manifest") as info:
            read(d)
        assert message in str(info.value)
        assert str(d / INDEX_FILE) in str(info.value)


def test_a_valid_manifest_still_reads(packed_dataset_factory):
    d = packed_dataset_factory(ROWS, max_len=16)
    assert read_manifest(d).num_rows == 2
    assert verify_dataset(d).rows == 2


def test_the_index_json_path_means_its_folder(packed_dataset_factory, tmp_path):
    d = packed_dataset_factory(ROWS, max_len=16)
    index = d / INDEX_FILE
    assert dataset_folder(index) == d and dataset_folder(d) == d
    assert read_manifest(index) == read_manifest(d)
    # The readers find the shards next to it (a path under index.json would not exist).
    report = verify_dataset(index, checksums=True)
    assert (report.rows, report.directory) == (2, d)
    view = inspect_dataset(index, row=1).row
    assert view is not None and [(d.doc_id, d.length) for d in view.documents] == [(2, 7)]
    # A missing dataset is still named by its folder.
    with pytest.raises(DataError, match=f"^{tmp_path / 'nothing'}: no such dataset folder$"):
        read_manifest(tmp_path / "nothing" / INDEX_FILE)
    # A folder that happens to be called index.json is a folder.
    odd = packed_dataset_factory(ROWS, name=INDEX_FILE)
    assert dataset_folder(odd) == odd and read_manifest(odd).num_rows == 2
