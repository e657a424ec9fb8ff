"""`--group-by` and packing options at their edges, from an audit of the packing core: JSON
integers beyond 64 bits kept as written (orjson read them as floats, and two ids were one group),
a list column of pre-tokenized Parquet as a group (a traceback), option values too large to
allocate or write (tracebacks), and the message for a field with no value anywhere."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.groups import read_groups
from packtool.dataset.manifest import read_manifest
from tests.cli import one_error_line, run

BIG = 1 << 64  # orjson reads this and BIG + 1 as the same float


def _groups(out: Path) -> dict:
    return json.loads((out / "index.json").read_text())["extra"]["groups"]


@pytest.mark.parametrize("layout", ["jsonl", "json_array"])
def test_integers_beyond_64_bits_are_distinct_groups_kept_as_written(tmp_path, layout):
    records = [{"text": f"doc {i} " * 3, "user": BIG + i % 2} for i in range(6)]
    records.append({"text": "small", "user": 7, "meta": {"id": BIG}})
    if layout == "jsonl":
        path = tmp_path / "g.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    else:
        path = tmp_path / "g.json"
        path.write_text(json.dumps(records))
    code, _, err = run(
        "pack", path, "-o", tmp_path / "out", "--group-by", "user", "--max-len", 4096
    )
    assert code == 0, err
    assert sorted(_groups(tmp_path / "out")) == sorted([str(BIG), str(BIG + 1), "7"])
    # --keep-field stores the number as written, nested ones too.
    out = tmp_path / "t.parquet"
    code, _, err = run("tokenize", path, "-o", out, "--keep-field", "user", "--keep-field", "meta")
    assert code == 0, err
    table = pq.read_table(out)
    assert sorted(set(table.column("user").to_pylist())) == sorted([str(BIG), str(BIG + 1), "7"])
    assert f'{{"id":{BIG}}}' in table.column("meta").to_pylist()


def test_a_list_column_of_pretokenized_parquet_groups_as_its_json_text(tmp_path):
    # `--group-by lst` was pyarrow's "Unsupported cast from list<...> to utf8" traceback.
    path = tmp_path / "pre.parquet"
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5], [6, 7, 8]], "lst": [[1], [2, 3], [1]]})
    pq.write_table(table, path)
    code, _, err = run("pack", path, "-o", tmp_path / "out", "--group-by", "lst", "--max-len", 64)
    assert code == 0, err
    assert sorted(_groups(tmp_path / "out")) == ["[1]", "[2,3]"]
    bad = tmp_path / "bin.parquet"
    pq.write_table(
        pa.table({"input_ids": [[1, 2]], "b": pa.array([b"\xff\xfe"], pa.binary())}), bad
    )
    code, _, err = run("pack", bad, "-o", tmp_path / "bad", "--group-by", "b", "--max-len", 64)
    assert code == 1 and "column 'b' cannot be kept as text" in one_error_line(err)


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        # the option's own range (it said "rounds must be ...", the library's field)
        (
            "--rounds",
            10**10,
            "Invalid value for '--rounds': 10000000000 is not in the range 1<=x<=1000",
        ),
        ("--rounds", 10**20, "'--rounds'"),
        (
            "--row-group-rows",
            10**20,
            "'--row-group-rows': 100000000000000000000 is not in the range 1<=x<=2147483647",
        ),
        ("--shard-rows", 10**20, "'--shard-rows'"),
    ],
)
def test_option_values_too_large_to_honour_are_one_line(tmp_path, option, value, says):
    # 10^10 rounds allocated 74.5 GiB; 10^20 overflowed numpy and Parquet's writer.
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "one two"}\n')
    code, _, err = run("pack", src, "-o", tmp_path / "out", option, value)
    assert code == 1 and says in one_error_line(err)
    assert not (tmp_path / "out").exists()


def test_a_group_field_empty_in_every_document_says_so(tmp_path):
    # It said "no document has this field" of a field every document has ("").
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": f"doc {i}", "lang": ""}) + "\n" for i in range(5)))
    code, _, err = run("pack", src, "-o", tmp_path / "out", "--group-by", "lang")
    assert code == 1
    assert "no document has this field, or a value for it (missing, null or empty" in (
        one_error_line(err)
    )


def test_a_list_of_binary_values_groups_as_its_text_and_bad_bytes_are_one_line(tmp_path):
    # A list<binary> column was a TypeError traceback (bytes are not JSON serializable).
    path = tmp_path / "pre.parquet"
    lists = pa.array([[b"a"], [b"b", b"c"], [b"a"]], pa.list_(pa.binary()))
    pq.write_table(pa.table({"input_ids": [[1, 2], [3, 4], [5]], "tags": lists}), path)
    code, _, err = run("pack", path, "-o", tmp_path / "out", "--group-by", "tags", "--max-len", 64)
    assert code == 0, err
    assert sorted(_groups(tmp_path / "out")) == ['["a"]', '["b","c"]']
    bad = pa.array([[b"\xff"]], pa.list_(pa.binary()))
    pq.write_table(pa.table({"input_ids": [[1, 2]], "tags": bad}), path)
    code, _, err = run("pack", path, "-o", tmp_path / "bad", "--group-by", "tags", "--max-len", 64)
    assert code == 1 and "column 'tags' cannot be kept as text" in one_error_line(err)


@pytest.mark.parametrize("command", ["pack", "pretokenized", "tokenize"])
def test_a_field_named_doc_chunk_is_refused_in_one_line(tmp_path, command):
    # `doc_chunk` is the column a tail's pieces add: `pack --group-by doc_chunk` was a 19-frame
    # traceback ending in pyarrow's "Column 'doc_chunk' not found"; `tokenize --keep-field
    # doc_chunk` wrote a file that failed the same way in a later `pack --group-by doc_chunk`.
    src = tmp_path / "x.jsonl"
    src.write_text('{"text": "abc", "doc_chunk": "a"}\n')
    if command == "tokenize":
        args = ["tokenize", src, "-o", tmp_path / "t.parquet", "--keep-field", "doc_chunk"]
    else:
        if command == "pretokenized":
            src = tmp_path / "pre.parquet"
            pq.write_table(pa.table({"input_ids": [[1, 2, 3]], "doc_chunk": ["a"]}), src)
        args = ["pack", src, "-o", tmp_path / "out", "--group-by", "doc_chunk"]
    code, _, err = run(*args)
    assert code == 1
    assert "error: extra field 'doc_chunk' clashes with a built-in column" in one_error_line(err)
    assert not (tmp_path / "out").exists() and not (tmp_path / "t.parquet").exists()


def test_many_groups_go_to_groups_json_and_the_summary_names_the_largest(tmp_path):
    """Past 1,000 groups index.json records only groups.json's name, count and sha256 (every
    group listed in index.json made it ~100 bytes a group, parsed by every reader at open), and
    the summary names the 20 groups with the most tokens, then how many more (it printed a line
    per group: 1,207 lines here)."""
    # Names JSON escapes (a quote, a backslash, a newline, non-ASCII) in every third group.
    names = [f"u{i:04d}" + ('é"\\\n☃' if i % 3 == 0 else "") for i in range(1200)]
    src = tmp_path / "a.jsonl"
    lines = (json.dumps({"text": "x" * (i + 1), "user": n}) for i, n in enumerate(names))
    src.write_text("".join(line + "\n" for line in lines))
    out = tmp_path / "out"
    code, summary, err = run("pack", src, "-o", out, "--group-by", "user", "--max-len", 4096)
    assert code == 0, err
    extra = json.loads((out / "index.json").read_text())["extra"]
    assert "groups" not in extra and (out / "index.json").stat().st_size < 4096
    raw = (out / "groups.json").read_bytes()
    assert extra["groups_file"] == {
        "file": "groups.json",
        "num_groups": 1200,
        "sha256": hashlib.sha256(raw).hexdigest(),
    }
    groups = json.loads(raw)["groups"]
    assert sorted(groups) == sorted(names)
    manifest = read_manifest(out)
    assert sum(g["rows"] for g in groups.values()) == manifest.counts["rows"]
    assert sum(g["tokens"] for g in groups.values()) == manifest.counts["tokens_out"]
    assert read_groups(manifest, out) == groups
    shown = [line for line in summary.splitlines() if line.startswith("group ")]
    largest = sorted(groups, key=lambda name: -groups[name]["tokens"])[:20]
    assert len(shown) == 20
    for line, name in zip(shown, largest, strict=True):
        assert line.startswith(f"group {name!r}: {groups[name]['rows']} rows, efficiency ")
    assert summary.splitlines()[-1].startswith("... and 1,180 more groups (the 20 with the most ")
    assert "groups.json" in summary.splitlines()[-1]
    code, said, err = run("verify", out)
    assert code == 0 and said.startswith("OK"), err
    # An edited list is caught by verify (index.json records its digest) in one line.
    (out / "groups.json").write_bytes(raw.replace(b'"rows": 1,', b'"rows": 2,', 1))
    code, _, err = run("verify", out)
    assert code == 1
    assert one_error_line(err) == (
        f"error: {out / 'groups.json'}: its sha256 is not the one index.json records "
        "(groups_file.sha256): the list of groups was changed or damaged"
    )


def test_a_thousand_groups_stay_in_index_json(tmp_path):
    src = tmp_path / "a.jsonl"
    src.write_text("".join(json.dumps({"text": "ab", "user": f"u{i}"}) + "\n" for i in range(1000)))
    code, summary, err = run("pack", src, "-o", tmp_path / "out", "--group-by", "user")
    assert code == 0, err
    assert len(_groups(tmp_path / "out")) == 1000 and not (tmp_path / "out/groups.json").exists()
    assert "more groups (the 20 with the most tokens are shown; every group's rows and " in summary
    assert "efficiency: index.json (extra.groups))" in summary
