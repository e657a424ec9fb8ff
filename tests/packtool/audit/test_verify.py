"""`packtool verify`: a valid dataset passes; each kind of damage is named in one line, exit 1."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit.verify import first_bad_row, row_problem, verify_dataset
from packtool.dataset.manifest import INDEX_FILE, packed_schema, read_manifest
from packtool.errors import ConfigError, DataError
from tests.cli import run
from tests.packtool.conftest import row_columns

# Two shards, max_len 16: document 5 is split into chunks 0 and 1 across the shards.
SHARDS = [
    [[(0, 0, 5), (1, 0, 11)], [(2, 0, 16)], [(3, 0, 4), (4, 0, 3)]],
    [[(5, 0, 16)], [(5, 1, 6), (6, 0, 10)], [(7, 0, 2)]],
]
TOKENS = 5 + 11 + 16 + 4 + 3 + 16 + 6 + 10 + 2


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`packtool ARGS` through `main()` (tests.cli.run; capsys kept for the call sites)."""
    return run(*args)


def edit_index(directory: Path, **changes) -> None:
    path = directory / INDEX_FILE
    data = json.loads(path.read_text())
    for key, value in changes.items():
        data[key] = value
    path.write_text(json.dumps(data))


def assert_fails(directory: Path, capsys, *needles: str) -> str:
    """The library raises DataError naming the problem; the CLI prints it on one line, exit 1."""
    with pytest.raises(DataError) as info:
        verify_dataset(directory)
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    code, out, err = run_cli(["verify", str(directory)], capsys)
    assert code == 1
    assert out == ""
    assert err.strip() == f"error: {message}"
    assert len(err.strip().splitlines()) == 1
    return message


def test_valid_dataset_verifies(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS, row_group_size=2)
    report = verify_dataset(d)
    assert (report.shards, report.rows, report.tokens, report.documents) == (2, 6, TOKENS, 9)
    assert report.distinct_documents == 8  # one of them split across two rows
    assert report.efficiency == pytest.approx(TOKENS / (6 * 16))
    assert report.warnings == ()
    code, out, err = run_cli(["verify", str(d)], capsys)
    assert code == 0, err
    assert out.startswith(f"OK {d}: 2 shards, 6 rows, {TOKENS} tokens, 8 documents (9 pieces")
    assert "efficiency 76.04%" in out
    assert len(out.strip().splitlines()) == 1


def test_cli_takes_the_index_json_path_too(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS, row_group_size=2)
    code, out, err = run_cli(["verify", str(d / INDEX_FILE)], capsys)
    assert code == 0, err
    assert out.startswith(f"OK {d}: 2 shards, 6 rows")
    code, out, err = run_cli(["inspect", str(d / INDEX_FILE), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["summary"]["rows"] == 6


def test_uint32_tokens_for_large_vocab(packed_dataset_factory):
    d = packed_dataset_factory([[[(0, 0, [70_000, 3, 65_535])]]], vocab_size=100_000, max_len=4)
    assert verify_dataset(d).tokens == 3


def test_uint16_tokens_up_to_65536_ids(packed_dataset_factory, capsys):
    # vocab_size 65,536: every id fits uint16, as the writer (packtool.dataset.identity.token_dtype) picks it.
    d = packed_dataset_factory(
        [[[(0, 0, [65_535, 3])]]], vocab_size=65_536, max_len=4, schema=packed_schema(pa.uint16())
    )
    assert verify_dataset(d).tokens == 2
    d = packed_dataset_factory(
        [[[(0, 0, [65_535, 3])]]],
        vocab_size=65_536,
        max_len=4,
        schema=packed_schema(pa.uint32()),
        name="wide",
    )
    assert_fails(d, capsys, "column input_ids is list<uint32>", "expected list<uint16>")


def test_flipped_byte_is_a_checksum_error(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    shard = d / "shard-00001.parquet"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    assert_fails(d, capsys, "shard-00001.parquet", "sha256 mismatch")
    # Without checksums the file is still decoded and checked: a flipped byte inside compressed
    # data may go unnoticed (Parquet pages carry no CRC here), but never crashes with a traceback.
    try:
        verify_dataset(d, checksums=False)
    except DataError as exc:
        assert "shard-00001.parquet" in str(exc)


def test_truncated_shard(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    shard = d / "shard-00000.parquet"
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size - 100])
    assert_fails(d, capsys, "shard-00000.parquet", f"expected {size:,}", "truncated")


def test_missing_shard(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    (d / "shard-00001.parquet").unlink()
    assert_fails(d, capsys, "shard-00001.parquet", "missing")


def test_missing_and_corrupt_index(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    (d / INDEX_FILE).write_text('{"format": "packtool.packed", "format_')
    assert_fails(d, capsys, INDEX_FILE, "unreadable manifest")
    (d / INDEX_FILE).write_text("[1, 2]")
    assert_fails(d, capsys, INDEX_FILE, "malformed")
    (d / INDEX_FILE).unlink()
    assert_fails(d, capsys, INDEX_FILE, "missing")


def test_unknown_format_version(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    edit_index(d, format_version=99)
    assert_fails(d, capsys, "format_version 99 is not supported", "supported: [1, 2, 3]")


def test_wrong_column_type(packed_dataset_factory, capsys):
    schema = packed_schema(pa.uint16())
    schema = schema.set(1, pa.field("doc_offsets", pa.list_(pa.int64()), nullable=False))
    d = packed_dataset_factory(SHARDS, schema=schema)
    assert_fails(d, capsys, "column doc_offsets is list<int64>", "expected list<int32>")


def test_token_type_must_match_vocab(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS, schema=packed_schema(pa.uint32()))
    assert_fails(d, capsys, "column input_ids is list<uint32>", "vocab_size 256", "uint16")


def test_extra_or_missing_column(packed_dataset_factory, capsys):
    schema = packed_schema(pa.uint16()).remove(3)
    d = packed_dataset_factory(SHARDS, schema=schema, name="missing")
    assert_fails(d, capsys, "columns are ['input_ids', 'doc_offsets', 'doc_ids']")


def bad_row(**columns) -> dict[str, list]:
    base = {
        "input_ids": [1, 2, 3, 4],
        "doc_offsets": [0, 2, 4],
        "doc_ids": [90, 91],
        "doc_chunks": [0, 0],
    }
    return {**base, **columns}


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        (bad_row(doc_offsets=[1, 2, 4]), "doc_offsets starts at 1, expected 0"),
        (
            bad_row(doc_offsets=[0, 3, 2, 4], doc_ids=[90, 91, 92], doc_chunks=[0, 0, 0]),
            "not strictly increasing at index 2: 3 then 2",
        ),
        (
            bad_row(doc_offsets=[0, 2, 2, 4], doc_ids=[90, 91, 92], doc_chunks=[0, 0, 0]),
            "not strictly increasing at index 2: 2 then 2",
        ),
        (bad_row(doc_offsets=[0, 2, 6]), "doc_offsets[2] = 6 is past the row end (row length 4)"),
        (bad_row(doc_offsets=[0, 2, 3]), "doc_offsets ends at 3, expected the row length 4"),
        (
            bad_row(input_ids=list(range(20)), doc_offsets=[0, 2, 20]),
            "row length 20 exceeds max_len 16",
        ),
        (bad_row(doc_ids=[90]), "1 doc_ids and 2 doc_chunks for 3 doc_offsets"),
        (bad_row(doc_chunks=[0, 0, 0]), "2 doc_ids and 3 doc_chunks"),
        (bad_row(doc_offsets=[0], doc_ids=[], doc_chunks=[], input_ids=[]), "row has no documents"),
        (bad_row(input_ids=[1, 2, 256, 4]), "input_ids[2] = 256 is not below"),
        (bad_row(doc_chunks=[0, -1]), "doc_chunks[1] = -1 is negative"),
        (bad_row(doc_ids=[90, -5]), "doc id -5 is negative"),
    ],
)
def test_row_damage_is_named_with_file_and_row(packed_dataset_factory, capsys, row, needle):
    # The bad row is row 3 of shard 1 (global row 6), in the second row group of that shard.
    shards = [SHARDS[0] + [[(8, 0, 3)]], [*SHARDS[1], row]]
    d = packed_dataset_factory(shards, row_group_size=2)
    message = assert_fails(d, capsys, needle)
    assert message.startswith(f"{d / 'shard-00001.parquet'}: row 3 (global row 7): "), message


def test_manifest_totals_off(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    index = json.loads((d / INDEX_FILE).read_text())
    edit_index(d, counts={**index["counts"], "rows": 7})
    assert_fails(d, capsys, "counts.rows is 7 but the shards list 6")
    edit_index(d, counts={**index["counts"], "tokens_out": TOKENS + 1})
    assert_fails(d, capsys, f"counts.tokens_out is {TOKENS + 1}")
    edit_index(d, counts=index["counts"], efficiency=0.5)
    assert_fails(d, capsys, "efficiency is 0.5")


def test_shard_totals_off(packed_dataset_factory, capsys):
    # max_len 64: a row moved between shard entries keeps each within rows..rows x max_len
    # tokens (read_manifest checks that), so only the files disagree.
    d = packed_dataset_factory(SHARDS, max_len=64)
    index = json.loads((d / INDEX_FILE).read_text())
    # Move one token from shard 1 to shard 0 in the manifest: its totals still add up.
    shards = index["shards"]
    shards[0]["tokens"] += 1
    shards[1]["tokens"] -= 1
    edit_index(d, shards=shards)
    assert_fails(d, capsys, "shard-00000.parquet", "has 39 tokens, expected 40")
    shards[0]["tokens"] -= 1
    shards[1]["tokens"] += 1
    shards[0]["rows"] -= 1
    shards[1]["rows"] += 1
    edit_index(d, shards=shards)
    assert_fails(d, capsys, "shard-00000.parquet", "has 3 rows, expected 2")


def test_document_counts_against_manifest(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    index = json.loads((d / INDEX_FILE).read_text())
    edit_index(d, counts={**index["counts"], "segments": 9, "documents_packed": 8})
    assert verify_dataset(d).documents == 9
    edit_index(d, counts={**index["counts"], "segments": 10})
    assert_fails(d, capsys, "counts.segments is 10 but the shards hold 9 (doc_id, chunk) pieces")
    edit_index(d, counts={**index["counts"], "documents_packed": 9, "documents_in": 9})
    assert_fails(d, capsys, "counts.documents_packed is 9 but the shards hold 8 distinct doc_ids")
    # Document 5 is in two chunks: documents_split was not compared with the shards.
    edit_index(d, counts={**index["counts"], "documents_split": 1})
    assert verify_dataset(d).documents == 9
    edit_index(d, counts={**index["counts"], "documents_split": 0})
    assert_fails(d, capsys, "counts.documents_split is 0 but the shards hold 1 doc_ids in several")


def test_recorded_shares_of_the_slots_are_recomputed(packed_dataset_factory, capsys):
    """A group's efficiency and the supervised efficiency are tokens / (rows x max_len), as
    the dataset-wide one: an edited value passed (0.123 for a group, 0.5 supervised)."""
    d = packed_dataset_factory(SHARDS)
    index = json.loads((d / INDEX_FILE).read_text())
    good = {"a": {"rows": 2, "tokens": 32, "efficiency": 1.0}}
    good["b"] = {"rows": 4, "tokens": TOKENS - 32, "efficiency": round((TOKENS - 32) / 64, 6)}
    edit_index(d, extra={**index.get("extra", {}), "groups": good})
    assert verify_dataset(d).rows == 6
    bad = {**good, "b": {**good["b"], "efficiency": 0.123}}
    edit_index(d, extra={**index.get("extra", {}), "groups": bad})
    assert_fails(d, capsys, "extra.groups['b'].efficiency is 0.123 but tokens / (rows * max_len)")
    # A supervised count on a dataset with no loss_mask column is refused before its share is
    # looked at (the manifest check since 2026-12-07: the loader had trained on every token).
    counts = {**index["counts"], "tokens_supervised": 48}  # 48 of 6 x 16 slots: 0.5
    edit_index(d, counts=counts, extra={**index.get("extra", {}), "supervised_efficiency": 0.5})
    assert_fails(d, capsys, "counts.tokens_supervised is 48 but columns lists no loss_mask")


def test_a_masked_datasets_supervised_share_is_recomputed(tmp_path, capsys):
    """The supervised efficiency of a dataset packed with a loss mask (pre-tokenized input_ids
    and labels) is counts.tokens_supervised / (rows x max_len): the packed value passes, an
    edited one is named; an edited tokens_supervised is checked against the mask's sum. (The
    case above lost its masked dataset: a count without a loss_mask column is refused first.)"""
    from tests.packtool.pack.test_mask import write_sft

    out = tmp_path / "out"
    code, _, err = run("pack", *write_sft(tmp_path / "sft", n=80), "-o", out, "--max-len", 64)
    assert code == 0, err
    index = json.loads((out / INDEX_FILE).read_text())
    counts, extra = index["counts"], index["extra"]
    assert (
        "loss_mask" in index["columns"] and 0 < counts["tokens_supervised"] < counts["tokens_out"]
    )
    share = counts["tokens_supervised"] / (counts["rows"] * 64)
    assert extra["supervised_efficiency"] == round(share, 6)
    assert verify_dataset(out).supervised_tokens == counts["tokens_supervised"]
    assert run_cli(["verify", str(out)], capsys)[0] == 0
    tampered = round(share + 0.05, 6)
    edit_index(out, extra={**extra, "supervised_efficiency": tampered})
    assert_fails(
        out,
        capsys,
        f"extra.supervised_efficiency is {tampered!r} but tokens / (rows * max_len) = {share:.6f}",
    )
    # A supervised count edited with its share to match: the shards' masks sum to another.
    more = counts["tokens_supervised"] + 1
    edit_index(
        out,
        counts={**counts, "tokens_supervised": more},
        extra={**extra, "supervised_efficiency": round(more / (counts["rows"] * 64), 6)},
    )
    assert_fails(out, capsys, f"counts.tokens_supervised is {more:,} but the shards hold ")


@pytest.mark.parametrize("value", ["x", -1, float("nan"), 25, 24.0, True, None])
@pytest.mark.parametrize("key", ["file_bits", "offset_bits"])
def test_the_doc_id_layout_is_the_one_ids_are_made_with(packed_dataset_factory, capsys, key, value):
    """Before: `extra.doc_ids.file_bits` / `offset_bits` were never looked at ("x", -1 and NaN
    passed verify), yet a format 3 dataset's ids are always 24 bits of file and 39 of offset."""
    d = packed_dataset_factory(SHARDS)
    extra = json.loads((d / INDEX_FILE).read_text()).get("extra", {})
    ids = {"scheme": "file_offset", "file_bits": 24, "offset_bits": 39}
    ids |= {"files": ["a.jsonl"], "units": ["byte"]}
    edit_index(d, extra={**extra, "doc_ids": ids})
    assert verify_dataset(d).rows == 6
    ids = {k: v for k, v in ids.items() if k != key or value is not None}  # None: left out
    edit_index(
        d, extra={**extra, "doc_ids": {**ids, **({key: value} if value is not None else {})}}
    )
    shown = "nan" if value != value else repr(value)
    assert_fails(
        d, capsys, f"extra.doc_ids.{key} is {shown}; file_offset ids are always file_bits 24"
    )
    # manifest_check (below packtool.read) writes the layout out; it is the one ids use.
    from packtool.dataset.manifest_check import DOC_ID_BITS
    from packtool.read import docids

    assert DOC_ID_BITS == {"file_bits": docids.FILE_BITS, "offset_bits": docids.OFFSET_BITS}


@pytest.mark.parametrize(
    ("groups", "said"),
    [
        ("x", "extra.groups is 'x'; expected an object mapping each group to its rows and tokens"),
        ([], "extra.groups is []; expected an object"),
        ({"a": {"rows": 6.0, "tokens": TOKENS}}, "extra.groups['a'] is {'rows': 6.0, "),
        ({"a": {"rows": True, "tokens": TOKENS}}, "extra.groups['a'] is {'rows': True, "),
        ({"a": 6}, "extra.groups['a'] is 6; expected its rows and tokens"),
    ],
)
def test_groups_that_are_no_object_of_counts_are_refused(
    packed_dataset_factory, capsys, groups, said
):
    """Before: `extra.groups` was checked only when it was a non-empty object: a text passed
    verify, and rows 6.0 or true were added up (docs/verify-inspect.md says per-group rows and
    tokens are checked)."""
    d = packed_dataset_factory(SHARDS)
    extra = json.loads((d / INDEX_FILE).read_text()).get("extra", {})
    edit_index(d, extra={**extra, "groups": {"a": {"rows": 6, "tokens": TOKENS}}})
    assert verify_dataset(d).rows == 6
    edit_index(d, extra={**extra, "groups": groups})
    assert_fails(d, capsys, said)


def _groups_file(directory: Path, groups: dict, num_groups: int | None = None) -> dict:
    """`groups` written to groups.json as `pack` writes it past 1,000 groups; its record."""
    raw = json.dumps({"groups": groups}).encode()
    (directory / "groups.json").write_bytes(raw)
    count = len(groups) if num_groups is None else num_groups
    return {"file": "groups.json", "num_groups": count, "sha256": hashlib.sha256(raw).hexdigest()}


def test_groups_kept_in_groups_json_are_checked_by_verify(packed_dataset_factory, capsys):
    """A dataset of many groups lists them in groups.json (index.json records its name, count
    and sha256, and nothing reads it at open): verify checks it as index.json's own groups."""
    d = packed_dataset_factory(SHARDS)
    extra = json.loads((d / INDEX_FILE).read_text()).get("extra", {})
    good = {"a": {"rows": 2, "tokens": 32, "efficiency": 1.0}}
    good["b"] = {"rows": 4, "tokens": TOKENS - 32, "efficiency": round((TOKENS - 32) / 64, 6)}
    edit_index(d, extra={**extra, "groups_file": _groups_file(d, good)})
    assert verify_dataset(d).rows == 6
    where = d / "groups.json"
    off = {**good, "b": {**good["b"], "tokens": TOKENS - 31}}
    edit_index(d, extra={**extra, "groups_file": _groups_file(d, off)})
    message = assert_fails(d, capsys, f"{where}: groups add up to 6 rows and {TOKENS + 1} tokens")
    assert message.endswith(f"the dataset has 6 and {TOKENS}")
    edit_index(d, extra={**extra, "groups_file": _groups_file(d, good, num_groups=3)})
    assert_fails(d, capsys, f"{where}: 2 groups; index.json records 3")
    edit_index(d, extra={**extra, "groups_file": _groups_file(d, {"a": 6})})
    assert_fails(d, capsys, f"{where}: groups['a'] is 6; expected its rows and tokens")
    edit_index(d, extra={**extra, "groups_file": _groups_file(d, good)})
    where.unlink()
    assert_fails(d, capsys, f"{where}: unreadable list of groups")


@pytest.mark.parametrize(
    ("record", "said"),
    [
        ({"file": "../g.json"}, "extra.groups_file is {'file': '../g.json', "),
        ({"num_groups": "2"}, "expected the file of the groups (a name inside the dataset"),
        ({"sha256": "x"}, "extra.groups_file is {"),
        ({"both": True}, "extra.groups and extra.groups_file are both given"),
    ],
)
def test_a_groups_file_record_is_checked_at_open(packed_dataset_factory, capsys, record, said):
    d = packed_dataset_factory(SHARDS)
    extra = json.loads((d / INDEX_FILE).read_text()).get("extra", {})
    good = _groups_file(d, {"a": {"rows": 6, "tokens": TOKENS}})
    both = record.pop("both", False)
    groups = {"groups": {"a": {"rows": 6, "tokens": TOKENS}}} if both else {}
    edit_index(d, extra={**extra, **groups, "groups_file": {**good, **record}})
    with pytest.raises(DataError, match="extra.groups"):  # what every reader opens with
        read_manifest(d)
    assert_fails(d, capsys, said)


def test_duplicated_document(packed_dataset_factory, capsys):
    shards = [SHARDS[0], [*SHARDS[1], [(3, 0, 5)]]]
    d = packed_dataset_factory(shards)
    message = assert_fails(d, capsys, "document 3 chunk 0 appears again")
    assert message.startswith(f"{d / 'shard-00001.parquet'}: row 3:")
    assert f"first in {d / 'shard-00000.parquet'}: row 2" in message


def test_doc_ids_must_name_a_listed_input_file(packed_dataset_factory, capsys):
    """Format 3 ids are file index << 39 | offset: one naming a file the dataset does not list
    leads nowhere (inspect showed no source for it) and passed verify."""
    shards = [SHARDS[0], [*SHARDS[1], [(5 << 39 | 7, 0, 3)]]]
    d = packed_dataset_factory(shards)
    index = json.loads((d / INDEX_FILE).read_text())
    ids = {"scheme": "file_offset", "file_bits": 24, "offset_bits": 39}
    ids |= {"files": ["a.jsonl"], "units": ["byte"]}
    edit_index(d, extra={**index.get("extra", {}), "doc_ids": ids})
    message = assert_fails(
        d, capsys, "doc id 2748779069447 names input file 5, but the dataset lists 1"
    )
    assert message.startswith(f"{d / 'shard-00001.parquet'}: row 3 (global row 6): "), message


def test_missing_chunk(packed_dataset_factory, capsys):
    shards = [SHARDS[0], [[(9, 0, 4), (9, 2, 4)]]]
    d = packed_dataset_factory(shards)
    assert_fails(d, capsys, "document 9 has chunk 2 but chunk 1 is missing")


def test_unlisted_files_are_warnings(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    (d / "shard-00002.parquet").write_bytes((d / "shard-00000.parquet").read_bytes())
    (d / ".shard-00003.parquet.tmp").write_bytes(b"partial")
    report = verify_dataset(d)
    assert report.rows == 6
    assert len(report.warnings) == 2
    assert "shard-00002.parquet: not listed in index.json" in report.warnings[0]
    assert ".shard-00003.parquet.tmp: temporary file" in report.warnings[1]
    code, out, err = run_cli(["verify", str(d)], capsys)
    assert code == 0
    assert out.startswith("OK ")
    assert [line.split(":")[0] for line in err.strip().splitlines()] == ["warning", "warning"]


def test_files_in_subfolders_are_not_called_leftovers(packed_dataset_factory):
    """Before: verify globbed the folder recursively and told the user to delete another
    dataset's shards and a tokenize output kept in subfolders; pack writes only at the top
    level (shards, index.json, sources.json, groups.json, temporaries)."""
    d = packed_dataset_factory(SHARDS)
    other = packed_dataset_factory(SHARDS, name="other")
    shutil.copytree(other, d / "other_dataset")
    (d / "tok").mkdir()
    (d / "tok" / "part-00000.parquet").write_bytes(b"x")
    (d / "tok" / ".part-00001.parquet.tmp").write_bytes(b"x")
    (d / "shard-00009.parquet").write_bytes(b"x")
    assert [w.split(":")[0] for w in verify_dataset(d).warnings] == [str(d / "shard-00009.parquet")]


def test_shards_listed_out_of_order_are_named(packed_dataset_factory, capsys):
    """Before: swapping two entries of index.json's shard list passed verify (each entry's
    size and sha256 move with it) and changed the order rows are read in; CONTRACTS.md says
    shards are listed by partition and shard number."""
    d = packed_dataset_factory([SHARDS[0], SHARDS[1], [[(8, 0, 3)]]])
    index = json.loads((d / INDEX_FILE).read_text())
    names = [f"shard-{p:06d}-{k:05d}.parquet" for p, k in ((0, 0), (0, 1), (1, 0))]
    for entry, name in zip(index["shards"], names, strict=True):
        (d / entry["file"]).rename(d / name)
        entry["file"] = name
    edit_index(d, shards=index["shards"])
    assert verify_dataset(d).rows == 7
    shards = index["shards"]
    edit_index(d, shards=[shards[2], shards[1], shards[0]])
    message = assert_fails(
        d, capsys, f"shards[1] ({names[1]}) is listed after {names[2]}; shards are listed by"
    )
    assert message.startswith(f"{d / INDEX_FILE}: "), message
    # write_shards' names (and an older pack's) too; names packtool never writes: no order.
    from packtool.audit.verify import shard_order_problem

    assert "shards[1]" in shard_order_problem(["shard-00002.parquet", "shard-00001.parquet"])
    assert shard_order_problem(["b.parquet", "a.parquet"]) is None
    assert shard_order_problem(["shard-00001.parquet", "shard-000000-00000.parquet"]) is None


def test_shard_path_outside_folder(packed_dataset_factory, capsys):
    d = packed_dataset_factory(SHARDS)
    index = json.loads((d / INDEX_FILE).read_text())
    index["shards"][0]["file"] = "../elsewhere.parquet"
    edit_index(d, shards=index["shards"])
    assert_fails(d, capsys, "'../elsewhere.parquet' must be a path inside the dataset folder")
    # As a URL decodes it: over http(s) `%2e%2e/` is `../` (the Hub/stores audit read a shard
    # outside the dataset's prefix that way), and some servers take a backslash for a slash.
    for name in ("%2e%2e/%2e%2e/secret/x.parquet", "sub/%2E%2E/../x.parquet", "..\\x.parquet"):
        index["shards"][0]["file"] = name
        edit_index(d, shards=index["shards"])
        assert_fails(d, capsys, f"{name!r} must be a path inside the dataset folder")


# --- the vectorised row checks agree with the plain reference ---

doc_st = st.tuples(st.integers(0, 50), st.integers(0, 3), st.integers(1, 8))


@st.composite
def raw_rows(draw):
    """Mostly valid rows, some with one column perturbed."""
    row = row_columns(draw(st.lists(doc_st, min_size=0, max_size=4)), 64)
    kind = draw(st.sampled_from(["ok", "ok", "offsets", "ids", "doc_ids", "chunks"]))
    if kind == "offsets":
        row["doc_offsets"] = draw(st.lists(st.integers(-2, 30), max_size=6))
    elif kind == "ids" and row["input_ids"]:
        row["input_ids"][draw(st.integers(0, len(row["input_ids"]) - 1))] = draw(
            st.integers(0, 100)
        )
    elif kind == "doc_ids":
        row["doc_ids"] = row["doc_ids"][:-1]
    elif kind == "chunks" and row["doc_chunks"]:
        row["doc_chunks"][-1] = -1
    return row


@settings(max_examples=60, deadline=None)
@given(st.lists(raw_rows(), min_size=1, max_size=6), st.integers(0, 3))
def test_first_bad_row_matches_reference(rows, offset):
    schema = packed_schema(pa.uint16())
    table = pa.table({n: [r[n] for r in rows] for n in schema.names}, schema=schema)
    # Slice so that list offsets do not start at 0 (as in a real read of a later batch).
    table = table.slice(min(offset, len(rows) - 1))
    from packtool.audit.verify import list_parts

    parts = {n: list_parts(table.column(n).combine_chunks()) for n in schema.names}
    rows = rows[min(offset, len(rows) - 1) :]
    expected = [
        row_problem(*(np.asarray(r[n]) for n in schema.names), max_len=24, vocab_size=64)
        for r in rows
    ]
    first = next((i for i, p in enumerate(expected) if p is not None), None)
    assert first_bad_row(parts, max_len=24, vocab_size=64) == first


# --- end to end, as the README runs it ---

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"


def test_pack_then_verify_and_inspect(tmp_path, capsys):
    out = tmp_path / "packed"
    code, _, err = run_cli(["pack", str(SAMPLE), "-o", str(out), "--max-len", "2048"], capsys)
    assert code == 0, err
    code, text, err = run_cli(["verify", str(out)], capsys)
    assert code == 0, err
    report = verify_dataset(out)
    assert text.startswith(f"OK {out}: {report.shards} shards, {report.rows:,} rows")
    index = json.loads((out / INDEX_FILE).read_text())
    assert report.tokens == index["counts"]["tokens_out"]
    code, text, err = run_cli(["inspect", str(out), "--json", "--row", "0"], capsys)
    assert code == 0, err
    data = json.loads(text)
    assert data["summary"]["rows"] == report.rows
    assert data["row"]["doc_offsets"][-1] == data["row"]["length"] <= 2048
    # Damage the packed output: verify names the shard.
    shard = out / index["shards"][0]["file"]
    shard.write_bytes(shard.read_bytes()[:-10])
    assert_fails(out, capsys, str(shard), "truncated")


def _footer_flipped(tmp_path: Path, position, xor: int) -> Path:
    """A copy of a small dataset whose first shard has byte `position` of its footer (column
    names, types, key-value metadata, the footer length) xor-ed with `xor`; `position` an int
    or the bytes whose first occurrence in the footer to hit."""
    import shutil

    from tests.packtool.conftest import build_packed_dataset

    source = tmp_path / "clean"
    if not source.exists():
        build_packed_dataset(source, SHARDS, row_group_size=2)
    d = tmp_path / "flipped"
    shutil.rmtree(d, ignore_errors=True)
    shutil.copytree(source, d)
    shard = d / "shard-00000.parquet"
    data = bytearray(shard.read_bytes())
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    if isinstance(position, bytes):
        position = data.index(position, footer) - footer
    data[footer + position % (len(data) - footer)] ^= xor
    shard.write_bytes(data)
    return d


def _one_line_or_nothing(d: Path) -> None:
    """verify --no-checksums and inspect (summary, a row) raise DataError or pass."""
    from packtool.audit.inspect import read_row, summarize_dataset

    for call in (
        lambda: verify_dataset(d, checksums=False),
        lambda: summarize_dataset(d),
        lambda: read_row(d, 0),
    ):
        try:
            call()
        except DataError as exc:
            assert "\n" not in str(exc)


def test_a_damaged_column_name_in_a_footer_is_one_line(tmp_path, capsys):
    """Before: verify --no-checksums printed a traceback (r4: UnicodeDecodeError from pyarrow,
    a byte of the column name `input_ids` flipped in the footer)."""
    d = _footer_flipped(tmp_path, b"input_ids", 0xFF)
    with pytest.raises(DataError, match="not a readable Parquet file"):
        verify_dataset(d, checksums=False)
    code, out, err = run_cli(["verify", str(d), "--no-checksums"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    _one_line_or_nothing(d)


@settings(max_examples=150, deadline=None)
@given(position=st.integers(0, 10**6), xor=st.integers(1, 255))
def test_any_flipped_footer_byte_is_one_line_or_nothing(tmp_path_factory, position, xor):
    _one_line_or_nothing(_footer_flipped(tmp_path_factory.mktemp("f"), position, xor))


@pytest.mark.parametrize("path", [None, 3, ["a", "b"]])
def test_a_path_that_is_no_path_is_a_config_error(path):
    # Before: verify_dataset(None) (and loader.hf.hf_dataset(None), through the same
    # open_dataset) raised pathlib's TypeError.
    with pytest.raises(ConfigError) as info:
        verify_dataset(path)
    assert str(info.value) == f"path must be a dataset folder or URL, got {path!r}"


def test_too_many_open_files_is_named_as_the_limit_not_as_a_damaged_shard(
    packed_dataset_factory, monkeypatch
):
    """An open that fails with EMFILE says nothing about the shard: it was reported as
    "not a readable Parquet file ([Errno 24] Too many open files)", a DataError blaming the
    file. Now the OSError goes on, naming the shard and the limit."""
    import errno
    import resource

    from packtool.audit import verify as verify_module
    from tests.cli import one_error_line

    d = packed_dataset_factory(SHARDS, row_group_size=2)

    def no_descriptor_left(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(verify_module.storage, "parquet_file", no_descriptor_left)
    with pytest.raises(OSError) as info:
        verify_dataset(d)
    assert not isinstance(info.value, DataError)
    assert info.value.errno == errno.EMFILE
    code, out, err = run("verify", d)
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert (code, out) == (1, "")
    assert one_error_line(err) == (
        f"error: {d / 'shard-00000.parquet'}: Too many open files (the limit on open files, "
        f"`ulimit -n`, is {limit:,})"
    )
