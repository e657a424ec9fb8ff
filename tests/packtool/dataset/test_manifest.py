"""`index.json`: a hand-edited or foreign manifest fails with one sentence, in every reader."""

from __future__ import annotations

import json
import re

import pytest

from packtool.audit.inspect import inspect_dataset
from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import INDEX_FILE, dataset_folder, read_manifest
from packtool.errors import ConfigError, DataError

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


@pytest.mark.parametrize(
    "key", ["tokenizer", "algorithm", "seed", "rounds", "long_docs", "lower_bound_rows", "shards"]
)
def test_a_missing_field_is_named(packed_dataset_factory, key):
    """Before: "malformed manifest (Manifest.__init__() missing 1 required keyword-only
    argument: 'rounds')" for the fields without a type check of their own."""
    d = packed_dataset_factory(ROWS, max_len=16)
    index = json.loads((d / INDEX_FILE).read_text())
    del index[key]
    (d / INDEX_FILE).write_text(json.dumps(index))
    message = f"{d / INDEX_FILE}: malformed manifest: {key} is missing"
    with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
        read_manifest(d)


def test_keys_a_later_packtool_adds_to_a_shard_entry_are_ignored(packed_dataset_factory):
    """As unknown top-level keys are (forward compatibility). Before: "malformed manifest
    (ShardInfo.__init__() got an unexpected keyword argument 'row_groups')"."""
    d = packed_dataset_factory(ROWS, max_len=16)
    edit(d, ("shards", 0, "row_groups"), 1)
    edit(d, ("written_by",), "packtool 9")
    assert read_manifest(d).shards[0].rows == 2
    assert verify_dataset(d).rows == 2


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


# --- index.json as a whole (issue #11 defect 8): what `packtool pack` writes, then edited -------


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """A real `packtool pack` dataset (byte tokenizer, vocab 258, max_len 1024)."""
    from pathlib import Path

    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    out = tmp_path_factory.mktemp("whole") / "packed"
    corpus = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"
    run_pack(
        RunConfig(
            inputs=(str(corpus),), out_dir=str(out), pack=PackConfig(max_len=1024), progress=False
        )
    )
    return out


def copy_of(packed, tmp_path):
    import shutil

    return shutil.copytree(packed, tmp_path / "copy")


def bump(key: str, by: int):
    return lambda index: index["counts"][key] + by


WHOLE = [
    # The list, in its order.
    (("counts", "tokens_in"), bump("tokens_in", 5), "counts.tokens_in is 2,839,136 but tokens_out"),
    (("counts", "documents_in"), 10, "counts.documents_in is 10 but documents_packed"),
    (
        ("tokenizer", "eos_id"),
        999,
        "tokenizer.eos_id is 999 but token ids are below vocab_size 258",
    ),
    (("format_version",), True, "format_version True is not supported"),
    (("format_version",), 3.0, "format_version 3.0 is not supported"),  # passed until 2026-12-06
    (("algorithm",), "xyz", "algorithm 'xyz' is not one of ['ffd', 'bfd']"),
    (("long_docs",), "nope", "long_docs 'nope' is not one of ['split', 'truncate', 'drop']"),
    (("tokenizer", "kind"), 5, "tokenizer.kind must be a non-empty string, found 5"),
    (("max_len",), 1025, "efficiency is 0.999491 but tokens / (rows * max_len) = 0.998516"),
    # And the rest of the class.
    (("tokenizer", "bos_id"), 258, "tokenizer.bos_id is 258 but token ids are below"),
    (("max_len",), 2**24 + 1, "above the limit 16,777,216"),
    (("rounds",), 0, "rounds must be >= 1"),
    (("counts", "documents_split"), 99_999, "counts.documents_split is 99,999, above documents"),
    (("counts", "documents_truncated"), 3, "documents_truncated is 3 but long_docs is 'split'"),
    (("counts", "segments"), 3, "counts.segments is 3; expected documents_packed"),
    (("counts", "rows"), None, "counts.rows must be an integer"),
    (("lower_bound_rows",), 10_000, "lower_bound_rows is 10,000; expected ceil"),
    (("extra", "lower_bound_l1"), 1, "extra.lower_bound_l1 is 1 but ceil(tokens_out / max_len)"),
    (("extra", "rows_per_round"), [1], "extra.rows_per_round is [1]; expected 1 row counts"),
    # Each of these was a traceback from verify or `inspect --row` (max() of None, len() of None).
    (("extra", "lower_bound_l2"), None, "extra.lower_bound_l2 is None; expected a row count"),
    (("extra", "lower_bound_l1"), "7", "extra.lower_bound_l1 is '7'; expected a row count"),
    (("extra", "doc_ids"), [], "extra.doc_ids is []; expected an object with a scheme"),
    (("extra", "doc_ids", "files"), None, "extra.doc_ids.files is None; expected a list"),
    (("extra", "doc_ids", "units"), 5, "extra.doc_ids.units is 5; expected one unit (text)"),
    (("extra", "doc_ids", "sizes"), [-1], "extra.doc_ids.sizes is [-1]; expected one size"),
    # Before: refused by `verify` only, in a line naming no file (`inspect --row`: "from unknown").
    (
        ("extra", "doc_ids", "sources"),
        "../x.json",
        "extra.doc_ids.sources is '../x.json'; expected a file name inside the dataset folder",
    ),
    (("shards", 0, "tokens"), 5, "counts.tokens_out is 2,839,131 but the shards list 5 in total"),
    (("tokenizer", "engine"), 5, "tokenizer.engine must be a string or null, found 5"),
    # Before: "vocab_size 8589934592 does not fit uint32 token ids", naming no file.
    (("tokenizer", "vocab_size"), 2**33, "tokenizer.vocab_size is 8,589,934,592; token ids are"),
    # A loss mask's counts (written only for masked data; any dataset is refused with them wrong).
    (
        ("counts", "tokens_supervised"),
        bump("tokens_out", 1),
        "tokens_supervised is 2,839,132, above",
    ),
    (
        ("counts", "documents_unsupervised"),
        1,
        "documents_unsupervised is 1, above documents_dropped",
    ),
    # Supervised tokens with no mask column (`columns` edited): the loader trained on every token.
    (
        ("counts", "tokens_supervised"),
        0,
        "counts.tokens_supervised is 0 but columns lists no loss_mask",
    ),
]


@pytest.mark.parametrize(("path", "value", "message"), WHOLE, ids=[str(w[0]) for w in WHOLE])
def test_an_inconsistent_manifest_is_refused_by_verify_and_the_loader_alike(
    packed, tmp_path, path, value, message
):
    from loader import PackedDataset

    d = copy_of(packed, tmp_path)
    index = json.loads((d / INDEX_FILE).read_text())
    edit(d, path, value(index) if callable(value) else value)
    for read in (
        lambda p: verify_dataset(p, checksums=False),
        lambda p: PackedDataset(p, rows_per_batch=1),
        lambda p: inspect_dataset(p),
    ):
        with pytest.raises(DataError) as info:
            read(d)
        assert message in str(info.value), str(info.value)
        assert str(info.value).startswith(str(d / INDEX_FILE))


def test_what_pack_writes_passes_every_manifest_check(packed):
    from packtool.dataset.manifest_check import manifest_problem

    assert manifest_problem(json.loads((packed / INDEX_FILE).read_text())) is None
    assert verify_dataset(packed).rows == read_manifest(packed).num_rows


def test_the_packer_and_the_loader_take_the_values_a_manifest_may_record():
    """One list of each (packtool/dataset/manifest_check.py): every long-document policy a
    manifest may record is one `pack` and the online loader accept, anything else is refused by
    both in the same words; the same for the algorithms and the largest max_len."""
    from loader.config import OnlineConfig
    from packtool.dataset import manifest_check
    from packtool.pack.chunk import PackConfig

    for policy in manifest_check.LONG_DOC_POLICIES:
        assert PackConfig(max_len=64, long_docs=policy).long_docs == policy
        assert OnlineConfig(max_len=64, long_docs=policy).long_docs == policy
    refusals = set()
    for make in (PackConfig, OnlineConfig):
        with pytest.raises(ConfigError) as e:
            make(max_len=64, long_docs="chop")
        refusals.add(str(e.value))
    assert refusals == {"long_docs 'chop' is unknown; choose one of ['split', 'truncate', 'drop']"}
    for algorithm in manifest_check.ALGORITHMS:
        assert PackConfig(max_len=64, algorithm=algorithm).algorithm == algorithm
    assert PackConfig(max_len=manifest_check.MAX_LEN_LIMIT).max_len == manifest_check.MAX_LEN_LIMIT
    with pytest.raises(ConfigError, match="too large"):
        PackConfig(max_len=manifest_check.MAX_LEN_LIMIT + 1)


DEEP = "[" * 5000 + "]" * 5000  # past Python's recursion limit: json raises RecursionError


def test_a_manifest_nested_too_deeply_is_one_line_in_every_reader(packed_dataset_factory):
    """Before: a RecursionError traceback from verify, inspect and every read_manifest caller;
    a link-sized one (< 4 KB) from `linked_version` before the manifest was even read."""
    from packtool.dataset.manifest import is_dataset_index, linked_version
    from tests.cli import one_error_line, run

    d = packed_dataset_factory(ROWS, max_len=16)
    for text in (DEEP, "[" * 2000 + "]" * 2000):
        (d / INDEX_FILE).write_text(text)
        message = f"{d / INDEX_FILE}: unreadable manifest (nested too deeply)"
        with pytest.raises(DataError, match=f"^{re.escape(message)}$"):
            read_manifest(d)
        assert linked_version(d / INDEX_FILE) is None  # read_manifest says what is wrong
        assert not is_dataset_index(d / INDEX_FILE)
        for command in ("verify", "inspect"):
            assert one_error_line(run(command, d)[2]) == f"error: {message}"


def test_groups_and_sources_files_nested_too_deeply_are_one_line(packed_dataset_factory):
    import dataclasses
    import hashlib

    from packtool.dataset.groups import read_groups
    from packtool.read import docids

    d = packed_dataset_factory(ROWS, max_len=16)
    raw = DEEP.encode()
    digest = hashlib.sha256(raw).hexdigest()
    (d / "groups.json").write_bytes(raw)
    (d / docids.SOURCES_FILE).write_bytes(raw)
    record = {"file": "groups.json", "num_groups": 1, "sha256": digest}
    manifest = dataclasses.replace(read_manifest(d), extra={"groups_file": record})
    with pytest.raises(DataError, match=r"groups.json: unreadable list of groups \(nested too"):
        read_groups(manifest, d)
    info = docids.record(["x"], ["byte"], sources_sha256=digest)
    with pytest.raises(DataError, match=r"sources.json: unreadable list of input files \(nested"):
        docids.places({"doc_ids": info}, [3], d)


def test_a_url_of_a_store_packtool_does_not_read_is_named_whole(tmp_path, monkeypatch):
    # Before: "s4:/train/ds: no such dataset folder": the URL read as a local path, its "//"
    # collapsed, with no word that s4:// is no store (a typo of s3://).
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        read_manifest("s4://train/ds")
    assert str(info.value) == (
        "s4://train/ds: no such dataset folder (read as a local path: s4:// is no store packtool "
        "reads; it reads abfs, abfss, az, gcs, gs, hf, http, https, s3, s3a)"
    )
