"""`packtool tokenize` through the real entry point: exit codes, one-line errors, summaries."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packtool.dataset.manifest import read_manifest
from packtool.read import docids
from tests.cli import ENGINE_IGNORED, error_line, one_error_line, run
from tests.packtool.read.test_corpus import bad_jsonl, write_corpus


def test_tokenize_happy_path(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "o.parquet"
    code, stdout, err = run("tokenize", src, "-o", out, "--keep-field", "lang")
    assert code == 0, err
    assert stdout.startswith("Tokenized 3 documents into ")
    assert "with byte:byte (engine byte, vocab 258, eos 256, bos none), uint16 ids" in stdout
    assert pq.read_table(out).column("lang").to_pylist() == ["en", "de", "el"]
    # Exists: refused, then replaced with --overwrite.
    code, _, err = run("tokenize", src, "-o", out)
    assert code == 1
    assert "already exists; pass --overwrite" in one_error_line(err)
    assert run("tokenize", src, "-o", out, "--overwrite", "--no-eos")[0] == 0
    assert pq.read_table(out).column("input_ids")[0].as_py() == list(b"hello world")


def test_a_kept_field_no_record_has_is_one_error_line_and_the_old_output_stays(tmp_path):
    """A misspelt --keep-field on JSONL (no record has the field) made an all-null column with
    exit 0; a field some records have is kept, null where it is missing."""
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "a", "lang": "en"}\n{"text": "b"}\n{"text": "c", "lang": null}\n')
    out = tmp_path / "o.parquet"
    assert run("tokenize", src, "-o", out, "--keep-field", "lang")[0] == 0
    assert pq.read_table(out).column("lang").to_pylist() == ["en", None, None]
    before = out.read_bytes()
    code, stdout, err = run("tokenize", src, "-o", out, "--keep-field", "lnag", "--overwrite")
    assert code == 1 and stdout == ""
    assert one_error_line(err) == (
        "error: kept field 'lnag' (--keep-field / extra_fields): none of the 3 documents has a "
        "value for it (missing or "
        "null in every record: check the name); nothing was written"
    )
    assert out.read_bytes() == before  # the output it would have replaced is untouched


def test_a_special_id_past_the_vocabulary_is_noted_with_the_vocabulary_it_makes(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    code, stdout, err = run("tokenize", src, "-o", tmp_path / "o.parquet", "--eos-id", "999999")
    assert code == 0, err
    assert err.strip() == (
        "note: --eos-id 999999 is past the tokenizer's 258 ids: the dataset's vocabulary "
        "becomes 1,000,000 (uint32 ids)"
    )
    assert "vocab 1,000,000, eos 999999" in stdout and "uint32 ids" in stdout
    code, _, err = run("tokenize", src, "-o", tmp_path / "p.parquet", "--eos-id", "100")
    assert code == 0 and err == ""  # an id of the tokenizer's own: nothing to say


def test_tokenize_folder_output_and_bos(tmp_path):
    src = write_corpus(tmp_path / "c.parquet")
    code, stdout, err = run("tokenize", src, "-o", tmp_path / "out", "--bos-id", "default")
    assert code == 0, err
    row = pq.read_table(tmp_path / "out" / "part-00000.parquet").column("input_ids")[0].as_py()
    assert row == [257, *b"hello world", 256]


def test_skips_are_reported_and_strict_fails(tmp_path):
    src = bad_jsonl(tmp_path)
    code, stdout, err = run("tokenize", src, "-o", tmp_path / "o.parquet")
    assert code == 0, err
    assert "Skips: 6 skipped: empty 1" in stdout
    assert f"invalid_utf8 1 (e.g. {src}:5)" in stdout
    assert f"missing_field 2 (e.g. {src}:3 (no 'text')" in stdout
    code, _, err = run("tokenize", src, "-o", tmp_path / "s.parquet", "--strict")
    assert code == 1
    assert one_error_line(err).startswith(f"error: {src}:2: malformed json")
    assert not (tmp_path / "s.parquet").exists()


def test_a_corpus_of_skips_only_is_one_error_line(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": ""}\n{"body": "no text field"}\nnot json\n')
    code, stdout, err = run("tokenize", src, "-o", tmp_path / "o.parquet")
    assert code == 1 and stdout == ""
    line = one_error_line(err)
    assert line.startswith(f"error: no documents in {src} (3 skipped: ")
    for skip in ("empty 1", "missing_field 1", "malformed_json 1"):
        assert skip in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux /proc")
@pytest.mark.parametrize("name", ["x.parquet", "parts"])
def test_an_unwritable_output_is_named_as_given(tmp_path, name):
    # /proc exists but takes no new files, even as root: the first write fails. The error used
    # to name the hidden temporary (/proc/.x.parquet.tmp-PID), in pyarrow's words for a file.
    write_corpus(tmp_path / "c.jsonl")
    code, stdout, err = run("tokenize", tmp_path / "c.jsonl", "-o", f"/proc/{name}")
    assert code == 1 and stdout == ""
    assert one_error_line(err) == f"error: cannot write /proc/{name} (No such file or directory)"


@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        (None, ["missing.jsonl"], "missing.jsonl: no such file or folder"),
        (
            "c.jsonl",
            ["c.jsonl", "--text-field", "body"],
            "no line has the text field 'body' (fields found: lang, n, text)",
        ),
        (
            "c.parquet",
            ["c.parquet", "--text-column", "body"],
            "no text column 'body' (columns: text, lang)",
        ),
        ("c.jsonl", ["c.jsonl", "--tokenizer", "gpt9"], "unknown tokenizer 'gpt9'"),
        (
            "c.jsonl",
            ["c.jsonl", "--tokenizer", "tiktoken:nope"],
            "unknown tiktoken encoding 'nope'",
        ),
        ("c.jsonl", ["c.jsonl", "--eos-id", "7", "--no-eos"], "--eos-id and --no-eos contradict"),
        (
            "c.jsonl",
            ["c.jsonl", "--eos-id", "end"],
            "--eos-id must be a token id >= 0 or 'default', got 'end'",
        ),
        ("c.jsonl", ["c.jsonl", "--bos-id", "-2"], "--bos-id must be a token id"),
        # `auto` is what --help does not list: it got the library's "eos must be 'default' or
        # 'eos_token', ..." (no flag, values the CLI refuses), or passed silently for --bos-id.
        (
            "c.jsonl",
            ["c.jsonl", "--eos-id", "auto"],
            "error: --eos-id must be a token id >= 0 or 'default', got 'auto'",
        ),
        (
            "c.jsonl",
            ["c.jsonl", "--bos-id", "auto"],
            "error: --bos-id must be a token id >= 0 or 'default', got 'auto'",
        ),
        (
            "c.jsonl",
            ["c.jsonl", "--eos-id", "eos_token"],
            "error: --eos-id must be a token id >= 0 or 'default', got 'eos_token'",
        ),
        ("c.jsonl", ["c.jsonl", "--keep-field", "source"], "clashes with a built-in column"),
        ("bad.parquet", ["bad.parquet"], "bad.parquet: not a readable Parquet file"),
    ],
)
def test_user_mistakes_are_one_line_errors(tmp_path, monkeypatch, setup, args, message):
    monkeypatch.chdir(tmp_path)
    if setup == "bad.parquet":
        Path("bad.parquet").write_bytes(b"garbage")
    elif setup:
        write_corpus(tmp_path / setup)
    code, stdout, err = run("tokenize", *args, "-o", "out.parquet")
    assert code == 1
    assert message in one_error_line(err)
    assert not Path("out.parquet").exists()


def test_usage_errors_are_one_line_wrong_usage_2_bad_value_1(tmp_path):
    code, _, err = run("tokenize", "-o", tmp_path / "o.parquet")
    assert code == 2
    assert "Missing argument 'INPUT...'. (see packtool tokenize --help)" in one_error_line(err)
    code, _, err = run("tokenize", "x.jsonl", "-o", tmp_path / "o.parquet", "--bogus")
    assert code == 2 and "No such option '--bogus'" in one_error_line(err)
    # a bad value exits 1, as the values packtool checks itself (it printed click's 4 lines, 2)
    code, _, err = run("tokenize", "x.jsonl", "-o", tmp_path / "o.parquet", "--workers", "0")
    assert code == 1 and "Invalid value for '--workers'" in one_error_line(err)
    # An option missing its value is found before the subcommand's context exists: it pointed
    # to `packtool --help`.
    for cmd, option in (("tokenize", "--workers"), ("pack", "--max-len"), ("stats", "--plot")):
        code, _, err = run(cmd, "x.jsonl", option)
        assert code == 2
        assert one_error_line(err) == (
            f"error: Option '{option}' requires an argument. (see packtool {cmd} --help)"
        )


def test_no_command_prints_the_help_as_laid_out():
    """`packtool` alone printed the whole help squashed into one `error:` line."""
    code, out, err = run()
    assert code == 2 and out == ""
    assert err.startswith("Usage: packtool [OPTIONS] COMMAND [ARGS]...\n")
    assert "\nCommands:\n" in err and "  pack " in err and "error" not in err


def test_glob_and_several_inputs(tmp_path):
    write_corpus(tmp_path / "a.jsonl")
    write_corpus(tmp_path / "b.jsonl.zst")
    write_corpus(tmp_path / "c.jsonl.gz")
    (tmp_path / "d.txt").write_text("plain text doc")
    out = tmp_path / "o.parquet"
    code, stdout, err = run("tokenize", str(tmp_path / "*.jsonl*"), tmp_path / "d.txt", "-o", out)
    assert code == 0, err
    table = pq.read_table(out)
    # Each document's id says which input (in reading order) and where in it: the ids of `pack`.
    files = [docids.decode(i)[0] for i in table.column("doc_id").to_pylist()]
    assert files == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    assert len(set(table.column("doc_id").to_pylist())) == 10
    assert table.column("source").unique().to_pylist() == [
        str(tmp_path / n) for n in ("a.jsonl", "b.jsonl.zst", "c.jsonl.gz", "d.txt")
    ]
    assert table.schema.field("input_ids").type == pa.list_(pa.uint16())


def test_corpus_options_decorator_is_reusable():
    import click

    from packtool.cli.commands import CorpusOptions, corpus_options

    seen = {}

    @click.command()
    @click.option("--max-len", type=int, default=8)
    @corpus_options
    def cmd(max_len, corpus):
        seen["corpus"], seen["max_len"] = corpus, max_len

    result = CliRunner().invoke(cmd, ["--text-field", "body", "--no-eos", "--max-len", "4"])
    assert result.exit_code == 0, result.output
    corpus = seen["corpus"]
    assert isinstance(corpus, CorpusOptions)
    assert seen["max_len"] == 4
    assert corpus.read_config(extra_fields=("lang",)).text_field == "body"
    assert corpus.load_tokenizer().identity.eos_id is None


def test_tokenized_parquet_is_read_with_its_recorded_tokenizer(tmp_path):
    """Tokenized Parquet re-written without --tokenizer (to Parquet or --to megatron) failed
    with "the requested tokenizer is byte:byte", a tokenizer nobody asked for; `pack` uses the
    one the file records, and now tokenize does as well. A --tokenizer that differs is still an
    error naming both."""
    import json

    import numpy as np

    from tests.packtool.tokenizer_shapes import build

    tok = build("gpt2", tmp_path / "tok")
    src = write_corpus(tmp_path / "c.jsonl")
    made = tmp_path / "made.parquet"
    assert run("tokenize", src, "-o", made, "--tokenizer", tok)[0] == 0
    table = pq.read_table(made)
    meta = json.loads(table.schema.metadata[b"packtool"])
    assert meta["tokenizer"]["kind"] == "hf" and meta["tokenizer"]["vocab_size"] > 1000

    again = tmp_path / "again.parquet"
    code, out, err = run("tokenize", made, "-o", again)
    assert code == 0, err
    assert f"with hf:{tok}" in out and "uint16 ids" in out, out
    copy = pq.read_table(again)
    assert copy.column("input_ids").equals(table.column("input_ids"))
    assert json.loads(copy.schema.metadata[b"packtool"]) == meta  # tokenizer, special tokens

    prefix = tmp_path / "m"
    code, out, err = run("tokenize", made, "--to", "megatron", "-o", prefix)
    assert code == 0, err
    assert f"with hf:{tok}" in out, out
    ids = np.concatenate([np.asarray(r, np.uint16) for r in table.column("input_ids").to_pylist()])
    assert Path(f"{prefix}.bin").read_bytes() == ids.tobytes()  # the ids as they are

    for args in (["-o", tmp_path / "b.parquet"], ["--to", "megatron", "-o", tmp_path / "b"]):
        code, _, err = run("tokenize", made, *args, "--tokenizer", "byte")
        line = one_error_line(err)
        assert f"tokenized with hf:{tok}" in line and "the options give byte:byte" in line


def _cannot_encode(tmp_path: Path) -> dict[str, Path]:
    """Tokenizer files that load but cannot encode every text: a tokenizer.json whose unknown
    token is not in its vocabulary, and a ranks file without the 256 single bytes."""
    import base64
    import json

    word_level = {
        "version": "1.0", "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": {"some": 0, "words": 1, "ab": 2}, "unk_token": "<none>"},
    }  # fmt: skip
    (tmp_path / "wl.json").write_text(json.dumps(word_level))
    ranks = b"".join(base64.b64encode(t) + b" %d\n" % i for i, t in enumerate([b"a", b"b", b"ab"]))
    (tmp_path / "tiny.tiktoken").write_bytes(ranks)
    return {"tokenizers": tmp_path / "wl.json", "tiktoken": tmp_path / "tiny.tiktoken"}


@pytest.mark.parametrize("engine", ["tokenizers", "tiktoken"])
@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_a_tokenizer_that_cannot_encode_a_text_is_one_line_and_leaves_nothing(
    tmp_path, engine, command
):
    # tokenizers raised a plain Exception (WordLevel: "Missing [UNK] token"), tiktoken panicked
    # in Rust (a BaseException): both a traceback, and `pack` kept its staging folder as for a
    # Ctrl-C, so the corrected command was refused ("an interrupted run ... left its finished
    # partitions").
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "ab"}\n{"text": "zzz unknown"}\n')  # the first encodes with both
    tokenizer = _cannot_encode(tmp_path)[engine]
    out = tmp_path / ("o" if command == "pack" else "o.parquet")
    args = (
        command,
        src,
        "-o",
        out,
        "--tokenizer",
        tokenizer,
        "--tokenizer-engine",
        engine,
        "--no-eos",
    )
    code, _, err = run(*args)
    *notes, line = err.strip().splitlines()  # a ranks file's note on its split pattern first
    assert "Traceback" not in err and all(n.startswith("note: ") for n in notes), err
    assert (
        code != 0
        and f"error: {tokenizer}: the {engine} engine could not encode the text beginning 'zzz unknown'"
        in line
    )
    # nothing left beside the inputs: no output, no staging folder, no lock
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "tiny.tiktoken", "wl.json"]
    code, _, err = run(command, src, "-o", out)  # the corrected command (byte) runs
    assert code == 0, err


@pytest.mark.parametrize("engine", ["tokenizers", "tiktoken"])
@pytest.mark.parametrize("command", ["pack", "tokenize"])
@pytest.mark.parametrize("records", ["prompt_completion", "chat"])
def test_fine_tuning_records_a_tokenizer_cannot_encode_are_one_line(
    tmp_path, engine, command, records
):
    # Prompt/completion and chat records went to the engine's encoder directly, past the check
    # plain text has: a 57-79 line traceback (WordLevel "Missing [UNK] token", tiktoken's Rust
    # panic), where plain text gets the one line below.
    src = tmp_path / "c.jsonl"
    template = tmp_path / "t.jinja"
    template.write_text(
        "{%- for m in messages %}{%- if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{%- else %}{{ m.content }}{%- endif %}{{ ' ' }}{%- endfor %}"
    )
    if records == "chat":
        turns = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "zzz unknown"}]
        src.write_text(json.dumps({"messages": turns}) + "\n")
        extra, failing = ["--chat-template", template], "ab zzz unknown "
    else:
        src.write_text('{"prompt": "ab", "completion": "zzz unknown"}\n')
        extra, failing = [], "zzz unknown"
    tokenizer = _cannot_encode(tmp_path)[engine]
    out = tmp_path / ("o" if command == "pack" else "o.parquet")
    args = [command, src, "-o", out, "--tokenizer", tokenizer, "--tokenizer-engine", engine]
    code, _, err = run(*args, *extra, "--no-eos", *(["--max-len", 8] if command == "pack" else []))
    *notes, line = err.strip().splitlines()
    assert "Traceback" not in err and all(n.startswith("note: ") for n in notes), err
    assert code != 0 and line.startswith(
        f"error: {tokenizer}: the {engine} engine could not encode the text beginning {failing!r}"
    ), line
    assert not out.exists()


def test_a_text_of_no_token_is_an_empty_skip_to_tokenize_stats_and_pack_alike(tmp_path):
    # Whitespace under a stripping tokenizer, with --no-eos --no-bos: a length-0 row counted as
    # a document by `tokenize`, a document by `stats` (length min 0), an `empty` by `pack`.
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"real": 0, "[UNK]": 1}, unk_token="[UNK]"))
    tok.normalizer = normalizers.Strip()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "strip.json"))
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "   "}\n{"text": "real"}\n{"text": "\\t\\n"}\n')
    specials = ["--tokenizer", tmp_path / "strip.json", "--no-eos", "--no-bos"]
    examples = [f"{src}:1 (no token after tokenizing)", f"{src}:3 (no token after tokenizing)"]
    out = tmp_path / "o.parquet"
    code, stdout, err = run("tokenize", src, "-o", out, *specials)
    assert code == 0, err
    assert stdout.startswith("Tokenized 1 documents into 1 tokens")
    assert f"Skips: 2 skipped: empty 2 (e.g. {examples[0]}, {examples[1]})" in stdout
    assert pq.read_table(out).column("input_ids").to_pylist() == [[0]]
    code, stdout, err = run("stats", src, *specials, "--json")
    assert code == 0, err
    stats = json.loads(stdout)
    assert (stats["documents"], stats["length"]["min"]) == (1, 1)
    assert stats["inputs"]["skipped"] == {"empty": 2}
    code, stdout, err = run("pack", src, "-o", tmp_path / "p", "--max-len", 8, *specials, "--json")
    assert code == 0, err
    packed = json.loads(stdout)
    assert packed["counts"]["documents_in"] == 3 and packed["counts"]["documents_empty"] == 2
    assert packed["skips"] == {"empty": 2} and packed["skip_examples"]["empty"] == examples
    # nothing but such texts: no documents, as for empty texts
    src.write_text('{"text": "   "}\n')
    code, _, err = run("tokenize", src, "-o", tmp_path / "none.parquet", *specials)
    assert code == 1 and err.strip().splitlines()[-1] == (
        f"error: no documents in {src} (1 skipped: empty 1 (e.g. {src}:1 (no token after "
        "tokenizing)))"
    )


def test_option_messages_name_the_options(tmp_path):
    # `--text-field ''` was answered in the library's words ("text_field must be a non-empty
    # string"), and a tokenized input that `--no-bos` alone re-reads (the default tokenizer,
    # byte) was refused naming "the requested tokenizer byte:byte", which nobody requested.
    from tests.packtool.tokenizer_shapes import build

    src = write_corpus(tmp_path / "c.jsonl")
    for flag in ("--text-field", "--text-column"):
        code, _, err = run("stats", src, flag, "")
        assert code != 0 and one_error_line(err) == f"error: {flag} must name a field, got ''"
    made = tmp_path / "made.parquet"
    assert run("tokenize", src, "-o", made, "--tokenizer", build("gpt2", tmp_path / "tok"))[0] == 0
    # Without --tokenizer the file's own tokenizer is read, and --no-bos is what it records
    # (it was applied to `byte` and refused as another tokenizer); --bos-id 5 is not
    assert run("pack", made, "-o", tmp_path / "out", "--no-bos")[0] == 0
    code, _, err = run("pack", made, "-o", tmp_path / "out2", "--bos-id", "5")
    line = one_error_line(err)
    # the flag first, the Python argument beside it (the library's line reaches both)
    assert code != 0 and "options give bos 5; pass --no-bos / bos=None (what the file" in line


def test_the_engine_option_alone_reads_tokenized_parquet_with_its_own_tokenizer(tmp_path):
    """`--tokenizer-engine` (which never changes ids) made the commands load `byte` for
    tokenized Parquet, refused as unlike the tokenizer the files record; with `--tokenizer`
    given, `tokenize` recorded the option's engine for ids it never encoded (found by a second
    reader)."""
    from packtool.dataset.tokenized import tokenized_meta
    from tests.packtool.tokenizer_shapes import build

    src = write_corpus(tmp_path / "c.jsonl")
    tok = build("gpt2", tmp_path / "tok")
    made = tmp_path / "made.parquet"
    assert run("tokenize", src, "-o", made, "--tokenizer", tok)[0] == 0
    engine = tokenized_meta(made)["tokenizer"]["engine"]
    for command, out in (("tokenize", tmp_path / "again.parquet"), ("pack", tmp_path / "p")):
        code, _, err = run(command, made, "-o", out, "--tokenizer-engine", "auto")
        assert code == 0, err
    assert tokenized_meta(tmp_path / "again.parquet")["tokenizer"]["engine"] == engine
    other = "tokenizers" if engine != "tokenizers" else "fastokens"
    again = tmp_path / "again2.parquet"
    code, _, err = run(
        "tokenize", made, "-o", again, "--tokenizer", tok, "--tokenizer-engine", other
    )
    # The engine encodes nothing beside --tokenizer either: the same warning as alone (until
    # 2026-12-07 it was dropped without a word there)
    assert code == 0 and ENGINE_IGNORED in err.splitlines(), err
    assert tokenized_meta(again)["tokenizer"]["engine"] == engine  # the ids' maker, kept


def _bos_tokenizer(folder: Path) -> Path:
    """A word-level tokenizer.json with a BOS post-processor (`<s> $A`, id 0) and
    tokenizer_config.json naming `</s>` (id 1) its EOS: eos 1, bos 0 by default."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2, **{f"w{i}": 3 + i for i in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.add_special_tokens(["<s>", "</s>"])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return folder / "tokenizer.json"


def test_tokenized_parquet_takes_the_eos_and_bos_it_records_where_none_is_chosen(tmp_path):
    """Found by a second reader: pre-tokenized ids tokenized with tokA record eos None, bos
    None; `pack` of that output with the same --tokenizer was refused ("... but the options give
    ... (eos 1, bos 0); pass the same --tokenizer/--eos-id/--bos-id"), which the user had done.
    And `pack tA.parquet --eos-id 1 --bos-id 0`, exactly the ids recorded, was refused, the
    options being applied to `byte` without --tokenizer. Now the EOS / BOS not chosen are the
    file's (a note says so); a chosen one that differs is refused naming the flags that match."""
    tok = _bos_tokenizer(tmp_path / "tokA")
    pre = tmp_path / "pre.parquet"
    pq.write_table(pa.table({"input_ids": [[3, 4, 5], [6, 7]]}), pre)
    text = tmp_path / "c.jsonl"
    text.write_text('{"text": "w1 w2"}\n{"text": "w3"}\n')
    pa_, ta = tmp_path / "pA.parquet", tmp_path / "tA.parquet"
    assert run("tokenize", pre, "-o", pa_, "--tokenizer", tok)[0] == 0  # eos None, bos None
    assert run("tokenize", text, "-o", ta, "--tokenizer", tok)[0] == 0  # eos 1, bos 0

    code, _, err = run("pack", pa_, "-o", tmp_path / "p1", "--tokenizer", tok)
    assert code == 0, err
    assert f"note: {pa_} records eos None, bos None, not this tokenizer's eos 1, bos 0" in err
    manifest = read_manifest(tmp_path / "p1").tokenizer
    assert (manifest["eos_id"], manifest["bos_id"]) == (None, None)
    again = tmp_path / "again.parquet"
    assert run("tokenize", pa_, "-o", again, "--tokenizer", tok)[0] == 0
    assert pq.read_table(again).column("input_ids").to_pylist() == [[3, 4, 5], [6, 7]]

    code, _, err = run("pack", ta, "-o", tmp_path / "p2", "--eos-id", "1", "--bos-id", "0")
    assert code == 0, err
    manifest = read_manifest(tmp_path / "p2").tokenizer
    assert (manifest["kind"], manifest["eos_id"], manifest["bos_id"]) == ("hf", 1, 0)

    hf = ["--tokenizer", tok, "--tokenizer-engine", "tokenizers"]  # no note on the engines
    for inputs, args, hint in (
        (ta, ["--no-eos"], "options give eos None; pass --eos-id 1 / eos=1 (what the file"),
        (pa_, [*hf, "--eos-id", "1"], "bos None); pass --no-eos / eos=None (what the file"),
        (pa_, [*hf, "--bos-id", "0", "--no-eos"], "; pass --no-bos / bos=None (what the"),
        (ta, ["--tokenizer", "byte"], "; leave --tokenizer out / pass tokenizer=None (the file"),
    ):
        code, _, err = run("pack", inputs, "-o", tmp_path / "bad", *args)
        line = error_line(err, args)  # after the engine's warning: nothing is encoded
        assert code == 1 and line.startswith(f"error: {inputs}: tokenized with hf:{tok}"), line
        assert hint in line, line
    assert not (tmp_path / "bad").exists()
