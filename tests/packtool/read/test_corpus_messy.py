"""Corpus readers on messy input: compressed text, BOMs, CRLF, JSON arrays, truncated streams."""

from __future__ import annotations

import gzip
import json

import pytest
import zstandard

from packtool.errors import DataError
from packtool.read.compressed import open_stream
from packtool.read.corpus import expand_inputs, read_corpus
from packtool.read.documents import ReadConfig, SkipCounter


def texts(inputs, config=None, skips=None) -> list[str]:
    return [t for batch in read_corpus(inputs, config, skips) for t in batch.texts]


def zst(data: bytes) -> bytes:
    return zstandard.ZstdCompressor().compress(data)


# --- compressed plain text ----------------------------------------------------------------


@pytest.mark.parametrize("name", ["a.txt.gz", "a.txt.zst", "a.md.gz", "a.text.zst", "a.TXT.GZ"])
def test_compressed_text_is_one_document_per_file(tmp_path, name):
    body = "héllo ✓\nsecond line\n".encode()
    path = tmp_path / name
    path.write_bytes(gzip.compress(body) if name.lower().endswith(".gz") else zst(body))
    batches = list(read_corpus([path]))
    assert [t for b in batches for t in b.texts] == [body.decode()]
    assert batches[0].nbytes == len(body)  # uncompressed bytes, as for JSONL


def test_compressed_text_is_picked_up_in_folder_walks(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt.gz").write_bytes(gzip.compress(b"one"))
    (tmp_path / "d" / "b.md.zst").write_bytes(zst(b"two"))
    (tmp_path / "d" / "c.bin.gz").write_bytes(gzip.compress(b"not a corpus suffix"))
    assert [p.name for p in expand_inputs([tmp_path / "d"])] == ["a.txt.gz", "b.md.zst"]
    assert texts([tmp_path / "d"]) == ["one", "two"]


def test_compression_is_told_by_one_table_of_suffixes(tmp_path):
    from packtool.read.compressed import COMPRESSIONS, compression_of

    assert COMPRESSIONS == {".gz": "gzip", ".zst": "zstd"}
    names = ["a.jsonl.GZ", "a.txt.zst", "a.zst", "a.gz.txt", "a.jsonl", "a.tar.xz"]
    assert [compression_of(tmp_path / n) for n in names] == [
        "gzip",
        "zstd",
        "zstd",
        None,
        None,
        None,
    ]


def test_an_empty_folder_error_names_the_suffixes_of_the_format_registry(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(DataError) as err:
        expand_inputs([tmp_path / "d"])
    assert str(err.value) == (
        f"{tmp_path / 'd'}: folder has no corpus files (looked for .jsonl, .ndjson, .parquet, "
        ".txt, .md, .text (JSONL and text also .gz / .zst))"
    )


def test_a_named_file_of_another_suffix_is_decompressed_too(tmp_path):
    (tmp_path / "notes.log.gz").write_bytes(gzip.compress(b"log line"))
    assert texts([tmp_path / "notes.log.gz"]) == ["log line"]


def test_compressed_text_bad_utf8_and_empty_are_skips(tmp_path):
    (tmp_path / "bad.txt.gz").write_bytes(gzip.compress(b"ok \xff"))
    (tmp_path / "empty.txt.zst").write_bytes(zst(b""))
    skips = SkipCounter()
    assert texts([tmp_path / "bad.txt.gz", tmp_path / "empty.txt.zst"], skips=skips) == []
    assert skips.counts == {"invalid_utf8": 1, "empty": 1}


def test_truncated_zstd_jsonl_is_not_silently_cut_short(tmp_path):
    # zstandard's stream_reader ends quietly at a truncated frame; reading must fail instead.
    data = zst(b"".join(json.dumps({"text": f"doc {i}"}).encode() + b"\n" for i in range(3000)))
    (tmp_path / "c.jsonl.zst").write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(DataError, match="truncated"):
        texts([tmp_path / "c.jsonl.zst"])


def test_multi_frame_zstd_reads_every_frame(tmp_path):
    path = tmp_path / "c.jsonl.zst"
    path.write_bytes(zst(b'{"text": "a"}\n') + zst(b'{"text": "b"}\n') + zst(b""))
    assert texts([path]) == ["a", "b"]
    with open_stream(path) as f:
        assert f.read() == b'{"text": "a"}\n{"text": "b"}\n'


# --- BOM, CRLF ---------------------------------------------------------------------------


def test_bom_at_the_start_of_jsonl_is_not_a_bad_line(tmp_path):
    for name, data in [
        ("a.jsonl", b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n'),
        ("b.jsonl.gz", gzip.compress(b'\xef\xbb\xbf{"text": "first"}\n{"text": "second"}\n')),
    ]:
        (tmp_path / name).write_bytes(data)
        skips = SkipCounter()
        assert texts([tmp_path / name], skips=skips) == ["first", "second"]
        assert skips.total == 0


def test_bom_at_the_start_of_a_text_file_is_not_text(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfhello")
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(b"\xef\xbb\xbfhi"))
    (tmp_path / "only-bom.txt").write_bytes(b"\xef\xbb\xbf")
    skips = SkipCounter()
    assert texts([tmp_path / n for n in ("a.txt", "b.txt.gz", "only-bom.txt")], None, skips) == [
        "hello",
        "hi",
    ]
    assert skips.counts == {"empty": 1}


def test_crlf_jsonl_lines_parse(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"text": "a"}\r\n\r\n{"text": "b\\r\\nc"}\r\n')
    assert texts([tmp_path / "a.jsonl"]) == ["a", "b\r\nc"]


# --- JSON types, JSON arrays ---------------------------------------------------------------


def test_skip_details_use_json_type_names(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'[1]\n3\nnull\n"s"\ntrue\n{"text": 5}\n{"text": null}\n')
    skips = SkipCounter(max_examples=10)
    assert texts([tmp_path / "a.jsonl"], skips=skips) == []
    details = [e.split(" (", 1)[1] for e in skips.examples["malformed_json"]]
    kinds = ("array", "number", "null", "string", "boolean")
    assert details == [f"a JSON {t}, not an object)" for t in kinds]
    assert [e.split(" (", 1)[1] for e in skips.examples["missing_field"]] == [
        "'text' is a number)",
        "'text' is null)",
    ]
    assert skips.counts == {"malformed_json": 5, "missing_field": 2}


def test_a_null_text_field_is_a_counted_skip_as_in_parquet(tmp_path, monkeypatch):
    """Before: a file whose only line held `"text": null` stopped the run with "no line has the
    text field 'text' (fields found: text)", and nulls counted towards the 1,000-object patience;
    a null Parquet value was already this skip."""
    from packtool.read import jsonl

    (tmp_path / "a.jsonl").write_text('{"text": "a"}\n')
    (tmp_path / "n.jsonl").write_text('{"text": null}\n')
    inputs = [tmp_path / "a.jsonl", tmp_path / "n.jsonl"]
    skips = SkipCounter()
    assert texts(inputs, skips=skips) == ["a"]
    assert skips.examples == {"missing_field": [f"{tmp_path / 'n.jsonl'}:1 ('text' is null)"]}
    with pytest.raises(DataError, match=r"n.jsonl:1: missing field \('text' is null\); run wi"):
        texts(inputs, ReadConfig(strict=True))
    monkeypatch.setattr(jsonl, "MISSING_FIELD_PATIENCE", 3)
    (tmp_path / "late.jsonl").write_text('{"text": null}\n' * 3 + '{"text": "late"}\n')
    skips = SkipCounter()
    assert texts([tmp_path / "late.jsonl"], skips=skips) == ["late"]
    assert skips.counts == {"missing_field": 3}


@pytest.mark.parametrize("compress", [None, "gz", "zst"])
def test_a_json_file_holding_one_array_is_read_as_its_objects(tmp_path, compress):
    rows = [{"text": "a", "lang": "en"}, {"text": ""}, 7, {"text": "b", "lang": "fr"}]
    data = b"\xef\xbb\xbf" + json.dumps(rows, indent=2).encode()
    name = "data.json" + (f".{compress}" if compress else "")
    if compress == "gz":
        data = gzip.compress(data)
    elif compress == "zst":
        data = zst(data)
    (tmp_path / name).write_bytes(data)
    skips = SkipCounter()
    batches = list(read_corpus([tmp_path / name], ReadConfig(extra_fields=("lang",)), skips))
    assert [t for b in batches for t in b.texts] == ["a", "b"]
    assert [v for b in batches for v in b.extras["lang"]] == ["en", "fr"]
    assert skips.counts == {"empty": 1, "malformed_json": 1}
    assert skips.examples["malformed_json"] == [
        f"{tmp_path / name}:item 2 (a JSON number, not an object)"
    ]


def test_a_broken_json_array_is_a_one_line_error(tmp_path):
    (tmp_path / "data.json").write_text('[{"text": "a"},\n{"text": "b"')
    with pytest.raises(DataError, match=r"data.json: starts with '\[' but is not one valid JSON"):
        texts([tmp_path / "data.json"])


def test_jsonl_lines_that_are_arrays_are_still_skips(tmp_path):
    # Only `.json` files may be one array; a `.jsonl` line that is an array is a bad line.
    (tmp_path / "a.jsonl").write_text('[{"text": "x"}]\n{"text": "ok"}\n')
    skips = SkipCounter()
    assert texts([tmp_path / "a.jsonl"], skips=skips) == ["ok"]
    assert skips.counts == {"malformed_json": 1}


def test_a_line_of_cr_line_breaks_says_so_in_its_skip(tmp_path):
    # A file of old Mac line breaks (CR alone) is one line of several documents: one skip
    # ("unexpected content after document"), which undercounts what is lost; it names why.
    (tmp_path / "cr.jsonl").write_bytes(b'{"text": "a"}\n{"text": "b"}\r{"text": "c"}\n')
    skips = SkipCounter()
    assert texts([tmp_path / "cr.jsonl"], skips=skips) == ["a"]
    assert skips.examples["malformed_json"] == [
        f"{tmp_path / 'cr.jsonl'}:2 (unexpected content after document; the line holds CR (\\r) "
        "line breaks, JSONL lines end with \\n)"
    ]


def test_json_objects_reads_an_array_by_item_and_json_lines_by_line(tmp_path):
    # One decision for every reader of JSON records (the corpus and fine-tuning readers): a
    # `.json` file that starts with `[` is one array, any other file JSON Lines.
    from packtool.read.jsonl import json_objects

    (tmp_path / "a.json").write_text('[{"n": 1}, {"n": 2}]')
    (tmp_path / "b.json").write_text('{"n": 1}\n{"n": 2}\n')
    (tmp_path / "c.jsonl").write_text('[{"n": 1}]\n{"n": 2}\n')
    got = {
        name: [
            (w.split("/")[-1], o, off)
            for w, o, _, off in json_objects(tmp_path / name, SkipCounter())
        ]
        for name in ("a.json", "b.json", "c.jsonl")
    }
    assert got == {
        "a.json": [("a.json:item 0", {"n": 1}, 0), ("a.json:item 1", {"n": 2}, 1)],
        "b.json": [("b.json:1", {"n": 1}, 0), ("b.json:2", {"n": 2}, 9)],
        "c.jsonl": [("c.jsonl:1", [{"n": 1}], 0), ("c.jsonl:2", {"n": 2}, 11)],
    }


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _corpus(path, records: list[str]):
    path.write_text(
        "[" + ",\n".join(records) + "]" if path.suffix == ".json" else "\n".join(records)
    )
    return path


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_records_nested_hundreds_deep_are_read_or_counted_skips(tmp_path, suffix):
    """orjson reads values nested up to 1,024 deep, and the checks after it walked them by
    recursion: every item of a `.json` array (the lone-surrogate check) nested ~330 deep, and a
    kept field (`--group-by`, extra fields) nested ~500 deep in JSONL, were a RecursionError
    traceback. Walked with a stack now; a kept field nested past `KEPT_DEPTH` (which JSON text
    cannot be written from, nor read back exactly, within the recursion limit) is a counted
    `malformed_json` skip naming the field."""
    from packtool.read.jsonl import KEPT_DEPTH

    path = _corpus(
        tmp_path / f"c{suffix}",
        [
            f'{{"text": "deep unkept", "meta": {_nested(1020)}, "id": 1}}',
            f'{{"text": "too deep kept", "id": {_nested(KEPT_DEPTH + 1)}}}',
            f'{{"text": "too deep kept, lossy", "id": {_nested(1020, "1e30")}}}',
            '{"text": "flat", "id": 7}',
        ],
    )
    skips = SkipCounter()
    batches = list(read_corpus([path], ReadConfig(extra_fields=("id",)), skips))
    assert [t for b in batches for t in b.texts] == ["deep unkept", "flat"]
    assert [v for b in batches for v in b.extras["id"]] == ["1", "7"]
    assert skips.counts == {"malformed_json": 2}
    assert all("field 'id' nested too deeply" in e for e in skips.examples["malformed_json"])
    assert len(texts([path])) == 4  # without kept fields every record is read, however deep


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_a_kept_field_nested_deep_is_still_read_exactly(tmp_path, suffix):
    from packtool.read.jsonl import KEPT_DEPTH

    records = [
        f'{{"text": "deep kept", "id": {_nested(KEPT_DEPTH, "18446744073709551616")}}}',
        '{"text": "flat", "id": 18446744073709551617}',
    ]
    path = _corpus(tmp_path / f"c{suffix}", records)
    batches = list(read_corpus([path], ReadConfig(extra_fields=("id",))))
    kept = [v for b in batches for v in b.extras["id"]]
    assert kept == [_nested(KEPT_DEPTH, "18446744073709551616"), "18446744073709551617"]


@pytest.mark.parametrize("suffix", [".json", ".jsonl"])
def test_an_unkept_value_nested_past_the_limit_beside_a_huge_integer(tmp_path, suffix):
    """The one case left an error: a `.json` array is parsed again whole for an integer orjson
    read as a float, and an item nested past Python's recursion limit stops that (one line
    naming the file, not a traceback); a JSON Lines file parses the line alone."""
    records = [
        f'{{"text": "deep unkept", "meta": {_nested(1020)}, "id": 1}}',
        '{"text": "flat", "id": 18446744073709551617}',
    ]
    path = _corpus(tmp_path / f"c{suffix}", records)
    config = ReadConfig(extra_fields=("id",))
    if suffix == ".jsonl":
        assert [v for b in read_corpus([path], config) for v in b.extras["id"]] == [
            "1",
            "18446744073709551617",
        ]
        return
    with pytest.raises(DataError, match=r"^\S*c\.json: nested too deeply to read its kept"):
        list(read_corpus([path], config))
