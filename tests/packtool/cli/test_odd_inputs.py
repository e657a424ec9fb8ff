"""Odd inputs found by an audit of every command: each is one `error:` line or a counted skip,
never a traceback and never documents lost in silence.

Each test fails on the code before the fix it names: a Parquet file with two columns of the
text column's name, a string column holding bytes that are not UTF-8, a kept field that is the
text column, a file name that is not UTF-8, tokenized Parquet whose metadata lacks its tokenizer
or names an end-of-text id outside the vocabulary (pack accepted it and wrote a dataset its own
`verify` refused), a compressed file or Parquet under a name read as text (all its documents
were one `invalid_utf8` skip), files a folder input holds but does not read, and a partition of
one byte (one partition per byte: hours for a megabyte).
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli import one_error_line, run

ROWS = [{"id": i, "text": f"document {i} " * (i % 5 + 1)} for i in range(40)]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS).encode()


@pytest.fixture
def good(tmp_path) -> Path:
    path = tmp_path / "good.jsonl"
    path.write_bytes(JSONL)
    return path


def _fails_in_one_line(args: list, *parts: str) -> str:
    code, _, err = run(*args)
    line = one_error_line(err)
    assert code == 1 and "Traceback" not in err, err
    for part in parts:
        assert part in line, line
    return line


@pytest.mark.parametrize("command", ["stats", "pack", "tokenize"])
def test_two_columns_named_as_the_text_column_are_one_line(tmp_path, command):
    path = tmp_path / "dup.parquet"
    table = pa.Table.from_arrays([pa.array(["a doc"] * 5), pa.array(["b"] * 5)], ["text", "text"])
    pq.write_table(table, path)
    args = [command, path] + ([] if command == "stats" else ["-o", tmp_path / "out"])
    _fails_in_one_line(args, "dup.parquet: 2 columns are named 'text'")


@pytest.mark.parametrize(
    "layout", [(pa.binary(), pa.string()), (pa.large_binary(), pa.large_string())]
)
def test_a_string_column_holding_bytes_that_are_not_utf8_is_a_counted_skip(tmp_path, layout):
    raw, text = layout
    values = [b"ok document one", b"bad \xff bytes", b"ok document two"]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"text": pa.array(values, raw).view(text)}), path)
    code, out, err = run("pack", path, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0, err
    assert "packed 2 of 2 documents" in out and "invalid_utf8 1" in out + err


def test_a_kept_field_or_group_that_is_the_text_column_reads_parquet_as_jsonl(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"text": [f"doc {i}" for i in range(5)]}), path)
    code, _, err = run("tokenize", path, "-o", tmp_path / "k.parquet", "--keep-field", "text")
    assert code == 0, err
    assert pq.read_table(tmp_path / "k.parquet").column("text").to_pylist()[0] == "doc 0"
    code, out, err = run(
        "pack", path, "-o", tmp_path / "g", "--group-by", "text", "--max-len", "64"
    )
    assert code == 0 and "packed 5 of 5 documents" in out, err


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS file names must be UTF-8")
def test_a_file_name_that_is_not_utf8_is_read_and_named_by_its_escape(tmp_path):
    name = os.fsdecode(b"latin1_\xe9.jsonl")
    path = tmp_path / name
    path.write_bytes(JSONL)
    code, out, err = run("pack", path, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0 and "packed 40 of 40 documents" in out, err
    code, _, err = run("tokenize", path, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    source = pq.read_table(tmp_path / "t.parquet").column("source")[0].as_py()
    assert source.endswith("latin1_\\udce9.jsonl")


NOT_UTF8 = pytest.mark.skipif(sys.platform == "darwin", reason="macOS file names must be UTF-8")


@NOT_UTF8
@pytest.mark.parametrize("command", ["pack", "tokenize", "tokenize-folder", "megatron"])
def test_an_output_named_in_bytes_that_are_not_utf8_is_written(tmp_path, good, command):
    # Seen: a 60-80 line traceback (pyarrow was handed the surrogate-escaped name).
    name = os.fsdecode(b"o\xff.parquet" if command == "tokenize" else b"o\xff")
    out = tmp_path / name
    extra = {"pack": ["--max-len", "64"], "megatron": ["--to", "megatron"]}.get(command, [])
    code, _, err = run("pack" if command == "pack" else "tokenize", good, "-o", out, *extra)
    assert code == 0, err
    if command == "pack":
        code, out_text, err = run("verify", out)
        assert code == 0 and "OK" in out_text, err
        code, out_text, err = run("inspect", out, "--row", "0")
        assert code == 0 and "row 0" in out_text, err
    elif command == "megatron":
        assert (tmp_path / os.fsdecode(b"o\xff.bin")).stat().st_size > 0
    else:
        files = [out] if command == "tokenize" else sorted(out.glob("part-*.parquet"))
        rows = sum(pq.read_metadata(pa.BufferReader(f.read_bytes())).num_rows for f in files)
        assert rows == len(ROWS)


@NOT_UTF8
@pytest.mark.parametrize("command", ["stats", "pack", "tokenize"])
def test_parquet_input_named_in_bytes_that_are_not_utf8_is_read(tmp_path, good, command):
    code, _, err = run("tokenize", good, "-o", tmp_path / "tok.parquet")
    assert code == 0, err
    raw = tmp_path / os.fsdecode(b"q\xff.parquet")  # tokenized Parquet: its footer read
    raw.write_bytes((tmp_path / "tok.parquet").read_bytes())
    text = tmp_path / os.fsdecode(b"r\xff.parquet")  # a text column
    with open(text, "wb") as f:
        pq.write_table(pa.table({"text": [r["text"] for r in ROWS]}), f)
    for path in (raw, text):
        out = ["-o", tmp_path / f"out-{path.name[0]}"] if command != "stats" else []
        max_len = ["--max-len", "64"] if command != "tokenize" else []
        code, out_text, err = run(command, path, *out, *max_len)
        assert code == 0, err
        assert "Traceback" not in err
        if command == "pack":
            assert "packed 40 of 40 documents" in out_text


def _tokenized(tmp_path: Path, good: Path, edit) -> Path:
    code, _, err = run("tokenize", good, "-o", tmp_path / "tok.parquet")
    assert code == 0, err
    table = pq.read_table(tmp_path / "tok.parquet")
    meta = json.loads(table.schema.metadata[b"packtool"])
    table = edit(table, meta)
    path = tmp_path / "edited.parquet"
    pq.write_table(table.replace_schema_metadata({b"packtool": json.dumps(meta).encode()}), path)
    return path


def test_tokenized_metadata_with_an_eos_outside_its_vocabulary_is_refused(tmp_path, good):
    def edit(table, meta):
        meta["tokenizer"]["eos_id"] = 9999
        return table

    path = _tokenized(tmp_path, good, edit)
    for command in ("pack", "stats"):
        args = [command, path] + (["-o", tmp_path / "out"] if command == "pack" else [])
        _fails_in_one_line(args, "edited.parquet: packtool metadata says tokenizer eos_id 9999")
    assert not (tmp_path / "out").exists()


def test_tokenized_metadata_with_a_vocabulary_past_uint32_is_refused(tmp_path, good):
    # vocab_size 2**33: pack failed naming no file ("vocab_size ... does not fit uint32 token
    # ids"), and stats accepted the file
    def edit(table, meta):
        meta["tokenizer"]["vocab_size"] = 2**33
        return table

    path = _tokenized(tmp_path, good, edit)
    for args in (["stats", path], ["pack", path, "-o", tmp_path / "out"]):
        _fails_in_one_line(args, f"{path}: malformed packtool metadata (tokenizer vocab_size")


def test_tokenized_metadata_without_its_tokenizer_is_one_line(tmp_path, good):
    def edit(table, meta):
        del meta["tokenizer"]
        return table

    path = _tokenized(tmp_path, good, edit)
    _fails_in_one_line(["stats", path], "malformed packtool metadata (no tokenizer)")
    _fails_in_one_line(["pack", path, "-o", tmp_path / "o"], "(no tokenizer)")


@pytest.mark.parametrize("meta", [None, [1, 2], "text"])
def test_tokenized_metadata_that_is_no_object_is_one_line(tmp_path, good, meta):
    # valid JSON of another shape: an AttributeError traceback ('NoneType' has no 'get')
    path = _tokenized(tmp_path, good, lambda table, _: table)
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({b"packtool": json.dumps(meta).encode()}), path)
    for args in (
        ["stats", path],
        ["pack", path, "-o", tmp_path / "o"],
        ["tokenize", path, "-o", tmp_path / "t.parquet"],
    ):
        _fails_in_one_line(args, "edited.parquet: malformed packtool metadata (not a JSON object)")


def test_stats_on_tokenized_parquet_without_lengths_is_one_line(tmp_path, good):
    path = _tokenized(tmp_path, good, lambda table, meta: table.drop_columns(["length"]))
    _fails_in_one_line(["stats", path], "edited.parquet: no column 'length'")


@pytest.mark.parametrize(
    ("name", "pack", "what"),
    [
        ("c.jsonl.xz", lzma.compress, "holds xz-compressed data"),
        ("c.jsonl.bz2", bz2.compress, "holds bzip2-compressed data"),
        ("c.pq", None, "holds Parquet, not text; name it with .parquet"),
    ],
)
def test_a_compressed_file_or_parquet_under_another_name_is_an_error_not_a_skip(
    tmp_path, good, name, pack, what
):
    path = tmp_path / name
    if pack is None:
        pq.write_table(pa.table({"text": ["a", "b"]}), path)
    else:
        path.write_bytes(pack(JSONL))
    _fails_in_one_line(["pack", good, path, "-o", tmp_path / "out"], f"{name}: {what}")
    # Text that is not UTF-8 stays what it was: a counted skip of that one document.
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    code, out, err = run("pack", good, latin, "-o", tmp_path / "ok", "--max-len", "64")
    assert code == 0 and "invalid_utf8 1" in out + err, err


def test_files_a_folder_holds_but_does_not_read_are_named_on_stderr(tmp_path, good):
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(JSONL)
    (folder / "b.jsonl.xz").write_bytes(lzma.compress(JSONL))
    (folder / "notes.json").write_text("{}")
    (folder / ".hidden").write_text("x")
    code, out, err = run("pack", folder, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0 and "packed 40 of 40 documents" in out, err
    note = next(line for line in err.splitlines() if line.startswith("note: "))
    assert "2 file(s) in the input folders are not read" in note
    assert "b.jsonl.xz" in note and "notes.json" in note and ".hidden" not in note
    code, _, err = run("stats", good)
    assert code == 0 and "note:" not in err  # files named one by one: nothing to say


def test_a_dataset_card_beside_records_is_named_not_read(tmp_path):
    """A folder as the Hub gives it (`huggingface-cli download`): README.md (YAML front matter
    and prose) beside the records was read as one more document, with no word. It is passed over
    and named; named by itself, or in a folder of text files alone, it is read."""
    folder = tmp_path / "ds"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "train.jsonl").write_bytes(JSONL)
    (folder / "README.md").write_text("---\nlicense: mit\n---\n# A dataset\n")
    code, out, err = run("pack", folder, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0 and "packed 40 of 40 documents" in out, err
    note = next(line for line in err.splitlines() if line.startswith("note: "))
    assert (
        f"1 file(s) in the input folders are not read ({folder / 'README.md'} (a dataset card "
        in (note)
    )
    code, out, err = run("pack", folder / "README.md", "-o", tmp_path / "card", "--max-len", "64")
    assert code == 0 and "packed 1 of 1 documents" in out, err
    (folder / "data" / "train.jsonl").unlink()
    (folder / "data" / "a.txt").write_text("text")
    code, out, err = run("pack", folder, "-o", tmp_path / "texts", "--max-len", "64")
    assert code == 0 and "packed 2 of 2 documents" in out and "note:" not in err, err


def test_folders_a_glob_matches_are_named_not_passed_over(tmp_path):
    """`'d/*'` over d/top.jsonl, d/a/ and d/b/ read d/top.jsonl and passed the folders over with
    no word; matching folders only, it said "glob matches no files". A note names them, and the
    error says what the glob did match."""
    (tmp_path / "d" / "a").mkdir(parents=True)
    (tmp_path / "d" / "b").mkdir()
    (tmp_path / "d" / "a" / "x.jsonl").write_bytes(JSONL)
    (tmp_path / "d" / "b" / "y.jsonl").write_bytes(JSONL)
    glob = str(tmp_path / "d" / "*")
    code, out, err = run("stats", glob)
    assert code == 1 and one_error_line(err) == (
        f"error: {glob}: glob matches no files, only 2 folder(s) ({tmp_path / 'd' / 'a'}, "
        f"{tmp_path / 'd' / 'b'}): a glob reads the files it matches; give a folder itself to "
        "read its corpus files, or match files ('d/*/*.jsonl', 'd/**/*.jsonl')"
    )
    (tmp_path / "d" / "top.jsonl").write_bytes(JSONL)
    code, out, err = run("pack", glob, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0 and "packed 40 of 40 documents" in out, err
    note = next(line for line in err.splitlines() if line.startswith("note: "))
    assert note.startswith(
        f"note: 2 folder(s) matched by the input globs are not read ({tmp_path / 'd' / 'a'}, "
        f"{tmp_path / 'd' / 'b'}): a glob reads the files it matches"
    )
    code, out, err = run("stats", str(tmp_path / "d" / "**" / "*.jsonl"))
    assert code == 0 and "note:" not in err, err  # its files matched: nothing passed over
    # `d/**` matches the folders and every file under them: it reads what they hold, and an
    # empty folder holds nothing to pass over (the note named them all as not read)
    (tmp_path / "d" / "empty").mkdir()
    code, out, err = run("stats", str(tmp_path / "d" / "**"))
    assert code == 0 and "note:" not in err, err


def test_a_linked_folder_inside_an_input_folder_is_named_not_passed_over(tmp_path):
    """Before: corpus/part2 -> ../common (two .txt files) was skipped with no note: "Tokenized
    1 documents", no skips. The walk does not follow it (a link may loop or lead anywhere); the
    note names it, and given by name it is read."""
    common = tmp_path / "common"
    common.mkdir()
    (common / "b.txt").write_text("bee")
    (common / "c.txt").write_text("sea")
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "a.txt").write_text("ay")
    (folder / "part2").symlink_to(common, target_is_directory=True)
    code, out, err = run("tokenize", folder, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    note = next(line for line in err.splitlines() if line.startswith("note: "))
    assert "1 file(s) in the input folders are not read" in note
    assert f"{folder / 'part2'} (a link to a folder, not followed)" in note
    code, out, err = run("tokenize", folder / "part2", "-o", tmp_path / "u.parquet")
    assert code == 0 and "Tokenized 2 documents" in out + err, out + err


def test_a_partition_of_a_few_bytes_is_refused(tmp_path, good):
    for command in ("pack", "tokenize"):
        args = [command, good, "-o", tmp_path / command, "--partition-size", "1"]
        if command == "tokenize":
            args += ["--to", "megatron"]
        _fails_in_one_line(args, "--partition-size '1': must be at least 1,024 bytes")


def test_verify_counts_the_documents_pack_counted(tmp_path, good):
    """Long documents split across rows: verify said "N documents" for the pieces (299 where
    pack had packed 200); it names both now."""
    code, out, err = run("pack", good, "-o", tmp_path / "out", "--max-len", "16")
    assert code == 0 and "packed 40 of 40 documents" in out, err
    code, out, err = run("verify", tmp_path / "out")
    assert code == 0, err
    pieces = int(out.split(" documents (")[1].split(" pieces")[0].replace(",", ""))
    assert ", 40 documents (" in out and pieces > 40, out


def test_verify_and_inspect_of_a_file_say_it_is_a_file(good):
    for command in ("verify", "inspect"):
        _fails_in_one_line([command, good], "good.jsonl: a file, not a dataset")


def test_a_megatron_output_given_as_a_folder_is_refused(tmp_path, good):
    """`-o mg/` wrote mg.bin and mg.idx beside the folder, not in it."""
    _fails_in_one_line(
        ["tokenize", good, "--to", "megatron", "-o", f"{tmp_path}/mg/"], "names a file prefix"
    )
    assert not list(tmp_path.glob("mg.*"))


def test_the_hint_for_a_wrongly_named_compressed_file_says_what_its_bytes_are(tmp_path):
    import zstandard

    cases = {
        "noise.jsonl.zst": (os.urandom(3000), "the file is not .zst data, nor text"),
        "zstd.jsonl.gz": (
            zstandard.ZstdCompressor().compress(JSONL),
            "holds zstd-compressed data: name it with .zst",
        ),
        "plain.jsonl.gz": (JSONL, "the file is not compressed: drop the .gz"),
    }
    for name, (data, says) in cases.items():
        (tmp_path / name).write_bytes(data)
        _fails_in_one_line(["stats", tmp_path / name], f"{name}: ", says)


@pytest.mark.parametrize("command", ["stats", "pack", "tokenize"])
def test_an_empty_input_path_is_refused_not_read_as_the_current_folder(
    tmp_path, monkeypatch, command
):
    # `packtool tokenize "$CORPUS" ...` with CORPUS unset read whatever the current folder held
    (tmp_path / "here.jsonl").write_text('{"text": "from the current folder"}\n')
    monkeypatch.chdir(tmp_path)
    out = {"stats": [], "pack": ["-o", tmp_path / "p"], "tokenize": ["-o", tmp_path / "t.parquet"]}
    for inputs in ([""], [" ", "here.jsonl"]):
        _fails_in_one_line([command, *inputs, *out[command]], "an input path is empty")
    assert not (tmp_path / "p").exists() and not (tmp_path / "t.parquet").exists()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("s3:///x", "no bucket in the URL; expected s3://BUCKET/KEY"),
        ("gs:///x/y.jsonl", "no bucket in the URL"),  # was 48 s of retries to reach a host
        ("hf:///x", "hf:///x"),  # the Hub's own check ("not a Hub path"), or ours
    ],
)
def test_a_url_without_a_bucket_is_one_line(tmp_path, good, url, says):
    # upath took it, then failed at the first join: a ValueError traceback at every command
    for args in (["stats", url], ["verify", url], ["pack", url, "-o", tmp_path / "o"]):
        _fails_in_one_line(args, says)
    _fails_in_one_line(["pack", good, "-o", url], says)
    if url.startswith("s3:"):  # named as given: `s3:///x/index.json` was a file never given
        for args in (["stats", url], ["tokenize", url, "-o", tmp_path / "t.parquet"]):
            assert _fails_in_one_line(args, says).startswith(f"error: {url}: "), args


def test_an_empty_output_or_engine_list_says_so(tmp_path, good):
    _fails_in_one_line(["pack", good, "-o", ""], "the output path is empty")
    _fails_in_one_line(["tokenize", good, "-o", ""], "the output path is empty")
    from tests.packtool.tokenizer_shapes import build

    tok = build("gpt2", tmp_path / "tok")
    code, _, err = run("stats", good, "--tokenizer", tok, "--tokenizer-engine", ",")
    assert code != 0 and "names no engine" in one_error_line(err), err


def test_packs_skip_line_names_where_the_skipped_documents_are(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(JSONL + b"not json\n" + JSONL)
    code, out, err = run("pack", path, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("skips: "))
    assert "malformed_json 1 (e.g. " in line and "mixed.jsonl:41" in line, line


def test_stats_names_its_option_for_a_row_of_one_token(good):
    _fails_in_one_line(["stats", good, "--max-len", "1"], "--max-len must be an integer >= 2")


def test_stats_names_the_file_holding_a_negative_length(tmp_path, good):
    def edit(table, meta):
        lengths = table.column("length").to_pylist()
        lengths[3] = -1
        return table.set_column(
            table.schema.get_field_index("length"),
            "length",
            pa.array(lengths, table.schema.field("length").type),
        )

    path = _tokenized(tmp_path, good, edit)
    # Rows count from 0 (docs/tokenize.md), as pack names the same row; stats said "row 4".
    _fails_in_one_line(["stats", path], "edited.parquet: row 3 has length -1")
    _fails_in_one_line(["pack", path, "-o", tmp_path / "out"], "edited.parquet: row 3:")


def test_a_chat_template_for_inputs_with_no_chat_is_refused(tmp_path, good):
    """It was ignored with exit 0: the user believed the template applied."""
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    for command in ("stats", "pack"):
        args = [command, good, "--chat-template", template]
        args += ["-o", tmp_path / command] if command == "pack" else []
        _fails_in_one_line(
            args, f"--chat-template {template} / chat_template=", "the inputs hold no chat records"
        )


def test_train_on_for_plain_text_is_refused(tmp_path, good):
    """It was ignored with exit 0, as --chat-template was."""
    for command in ("stats", "pack", "tokenize"):
        args = [command, good, "--train-on", "last"]
        out = tmp_path / ("t.parquet" if command == "tokenize" else command)
        args += ["-o", out] if command != "stats" else []
        _fails_in_one_line(
            args, "--train-on last / train_on='last': the inputs hold plain text", "; drop it"
        )


def test_chat_options_for_tokenized_inputs_are_refused(tmp_path, good):
    """Both were ignored with exit 0 for tokenized Parquet (`--chat-template /nonexistent.jinja`
    too, and `--train-on all` left the stored mask as it was): the check asked each file's first
    records for their kind, which tokenized Parquet does not have."""
    chat = tmp_path / "chat.jsonl"
    chat.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            }
        )
        + "\n"
    )
    template = tmp_path / "t.jinja"
    template.write_text(
        "{% for m in messages %}{% generation %}{{ m['content'] }}{% endgeneration %}{% endfor %}"
    )
    code, _, err = run(
        "tokenize", chat, "-o", tmp_path / "chat.parquet", "--chat-template", template
    )
    assert code == 0, err
    code, _, err = run("tokenize", good, "-o", tmp_path / "text.parquet")
    assert code == 0, err
    for tokenized in ("chat.parquet", "text.parquet"):
        for command in ("stats", "pack"):
            args = [command, tmp_path / tokenized]
            args += ["-o", tmp_path / command] if command == "pack" else []
            _fails_in_one_line(
                [*args, "--chat-template", tmp_path / "missing.jinja"],
                "the inputs hold tokenized documents",
                "--chat-template ",
                "; drop it (or tokenize the records again with it)",
            )
            for train_on in ("all", "last"):
                _fails_in_one_line(
                    [*args, "--train-on", train_on],
                    f"--train-on {train_on} / train_on={train_on!r}: the inputs hold tokenized "
                    "documents",
                    "; drop it",
                )
    assert not (tmp_path / "pack").exists()


def test_inspect_of_a_shard_rewritten_with_fewer_rows_says_so(tmp_path, good):
    """It printed the manifest's row count beside totals measured from the shards, exit 0."""
    code, _, err = run("pack", good, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0, err
    shard = next((tmp_path / "out").glob("shard-*.parquet"))
    table = pq.read_table(shard)
    pq.write_table(table.slice(0, table.num_rows - 1), shard)
    _fails_in_one_line(["inspect", tmp_path / "out"], f"rows, index.json says {table.num_rows}")


def test_many_rounds_print_one_short_line(tmp_path, good):
    code, out, err = run("pack", good, "-o", tmp_path / "o", "--max-len", "64", "--rounds", "200")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("rows per round: "))
    assert line.endswith("(200 rounds)") and len(line) < 120, line


def test_control_characters_in_names_are_printed_as_escapes(tmp_path):
    """A file name holding ESC ] 0 ; ... BEL set the terminal's title (and ESC [ 2 J would
    clear the screen) when a skip example, an error or a summary printed it raw."""
    name = "a\x1b]0;owned\x07.jsonl"
    (tmp_path / name).write_text('{"text": ""}\n{"text": "hello"}\n')
    code, out, err = run("pack", tmp_path / name, "-o", tmp_path / "out", "--max-len", "64")
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out + err
    assert "a\\x1b]0;owned\\x07.jsonl:1" in out + err  # the skip example, escaped
    code, _, err = run("stats", tmp_path / "missing\x1b[2J.jsonl")
    assert code == 1 and "\x1b" not in err and "missing\\x1b[2J.jsonl" in err


def test_a_binary_column_kept_is_its_text_and_bad_bytes_name_their_row(tmp_path):
    # A binary column's values were kept as Python's repr ("b'ok'"), silently; a string column
    # holding bad bytes was named "after row 0" (its batch's first row).
    path = tmp_path / "x.parquet"
    values = [b"ok", b"fine", b"\xff", b"ok"]
    table = pa.table(
        {
            "text": ["a b", "c d", "e f", "g h"],
            "k": pa.array(values, pa.binary()),
            "s": pa.array(values, pa.binary()).cast(pa.string(), safe=False),
        }
    )
    pq.write_table(table, path)
    out = tmp_path / "o.parquet"
    code, _, err = run("tokenize", path, "-o", out, "--keep-field", "k")
    assert code == 1 and one_error_line(err).endswith(
        "column 'k' holds bytes that are not UTF-8 text at row 2"
    )
    pq.write_table(table.slice(0, 2), path)
    code, _, err = run("tokenize", path, "-o", out, "--keep-field", "k", "--overwrite")
    assert code == 0, err
    assert pq.read_table(out).column("k").to_pylist() == ["ok", "fine"]
    pq.write_table(table, path)
    code, _, err = run("tokenize", path, "-o", out, "--keep-field", "s", "--overwrite")
    assert code == 1 and one_error_line(err).endswith(
        "column 's' holds bytes that are not UTF-8 text at row 2"
    )
    # Fine-tuning records read the kept column the same way.
    records = tmp_path / "r.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b"], "completion": ["c", "d"], "k": pa.array([b"ok", b"\xff"])}), records)  # fmt: skip
    code, _, err = run("tokenize", records, "-o", out, "--keep-field", "k", "--overwrite")
    assert code == 1 and one_error_line(err).endswith(
        ":row 1: column 'k' holds bytes that are not UTF-8 text"
    )


def test_row_and_round_limits_are_the_libraries(tmp_path, good):
    """The CLI's ranges for --shard-rows / --row-group-rows and --rounds (shown in --help, named
    in errors: tests/packtool/cli/test_group_edges.py) are the library's limits."""
    from packtool.cli import commands
    from packtool.dataset.shards import MAX_ROWS
    from packtool.pack.chunk import MAX_ROUNDS

    assert (commands.ROWS.max, commands.ROUNDS.max) == (MAX_ROWS, MAX_ROUNDS)


@pytest.mark.parametrize(
    ("args", "names"),
    [
        (["inspect", ""], "'DATASET'"),
        (["verify", ""], "'DATASET'"),
        (["mix", ""], "'MIXTURE'"),
        (["stats", "GOOD", "--plot", ""], "'--plot'"),
    ],
)
def test_an_empty_path_is_named_not_read_as_the_current_folder(good, args, names):
    """`packtool inspect ""` said "index.json: missing" (the current folder), `mix ""` ".: cannot
    read the mixture file", `stats --plot ""` "plot file '.'"."""
    args = [str(good) if a == "GOOD" else a for a in args]
    code, _, err = run(*args)
    line = one_error_line(err)
    assert code == 1 and "the path is empty (an unset shell variable?)" in line, line
    assert names in line, line


def test_a_loop_of_symlinks_as_input_or_output_is_one_line(tmp_path):
    # `pack a.jsonl` and `pack ok.jsonl -o a.jsonl` (a -> b -> a) were tracebacks: Path.resolve
    # raises RuntimeError for a loop (Python < 3.13), in the check that keeps output and inputs
    # apart, before anything else looked at the paths; `stats` said it in one line.
    (tmp_path / "b.jsonl").symlink_to(tmp_path / "a.jsonl")
    (tmp_path / "a.jsonl").symlink_to(tmp_path / "b.jsonl")
    good = tmp_path / "ok.jsonl"
    good.write_text('{"text": "x"}\n')
    loop = tmp_path / "a.jsonl"
    for args in (
        ["pack", loop, "-o", tmp_path / "o"],
        ["tokenize", loop, "-o", tmp_path / "t.parquet"],
        ["stats", loop],
        ["pack", good, "-o", loop],
        ["tokenize", good, "-o", loop],
    ):
        line = _fails_in_one_line(args, f"error: {loop}: cannot be followed (")
        assert "symbolic links)" in line, line


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_an_integer_past_pythons_digit_limit_is_read_or_a_skip_said_in_words(tmp_path, kind):
    """Before: a record holding an integer of 5,000 digits (past Python's 4,300-digit limit on
    int conversion) was a `malformed_json` skip "number is infinity when parsed as double" in a
    `.jsonl`, and the whole `.json` array an error naming orjson's words. It is read as a number
    beyond a double's range (`1e400`): the document counts where the field is not used; a kept
    field holding it is a counted skip that says what it is."""
    big = "1" * 5000
    records = [f'{{"text": "a", "n": {big}}}', '{"text": "bb", "n": 2}']
    path = tmp_path / f"big.{kind}"
    if kind == "jsonl":
        path.write_text("".join(r + "\n" for r in records))
    else:
        path.write_text("[" + ", ".join(records) + "]\n")
    code, out, err = run("stats", path, "--json", "--max-len", "64", "--candidates", "64")
    assert code == 0, err
    d = json.loads(out)
    assert (d["documents"], d["tokens"], d["inputs"]["skipped"]) == (2, 2 + 3, {})
    code, out, err = run("tokenize", path, "-o", tmp_path / "t.parquet", "--keep-field", "n")
    assert code == 0, err
    where = f"{path}:1" if kind == "jsonl" else f"{path}:item 0"
    words = f"field 'n' holds a number with more than {sys.get_int_max_str_digits()} digits"
    assert f"malformed_json 1 (e.g. {where} ({words}))" in out, out
    assert pq.read_table(tmp_path / "t.parquet").column("n").to_pylist() == ["2"]
