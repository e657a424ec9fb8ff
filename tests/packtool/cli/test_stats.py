"""`packtool stats` through the CLI: table, --json, --plot, one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from packtool.cli.commands import cli
from tests.cli import ENGINE_IGNORED, error_line, one_error_line, run

SAMPLE = "sample_data/corpus.jsonl"


def run_main(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`packtool ARGS` through `main()` (tests.cli.run; capsys kept for the call sites)."""
    return run(*args)


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "small.jsonl"
    texts = ["a" * 9, "b" * 19, "", "c" * 39, "d" * 99]  # byte tokenizer + EOS: 10, 20, 40, 100
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def test_table(small_corpus):
    result = CliRunner().invoke(cli, ["stats", str(small_corpus), "--max-len", "64"])
    assert result.exit_code == 0, result.output
    assert "documents   4\n" in result.output
    assert "tokens      170\n" in result.output
    assert "min 10  mean 42.5  p50 20  p90 100  p99 100  max 100" in result.output
    assert "skipped     1 skipped: empty 1" in result.output
    # the 100-token document becomes 2 chunks; the corpus is 5 pieces after splitting
    assert "1 documents, 100 tokens -> 2 chunks after splitting (5 pieces in all)" in result.output
    assert "suggested max length:" in result.output


def test_json(small_corpus):
    result = CliRunner().invoke(
        cli, ["stats", str(small_corpus), "--max-len", "64", "--batch-size", "2", "--json"]
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert (d["documents"], d["tokens"], d["max_len"]) == (4, 170, 64)
    # chunks 10, 20, 40, 64, 36 -> batches (10, 20), (40, 64), (36)
    assert d["padding"]["pad_per_batch"] == {
        "batch_size": 2,
        "slots": 2 * 20 + 2 * 64 + 36,
        "waste": pytest.approx(1 - 170 / 204),
    }
    assert d["lower_bound_rows"] == {"l1": 3, "l2": 3}
    assert d["inputs"]["kind"] == "raw" and d["inputs"]["skipped"] == {"empty": 1}
    assert [c["max_len"] for c in d["candidates"]] == [512, 1024, 2048, 4096, 8192, 16384, 32768]


def test_candidates_option(small_corpus):
    result = CliRunner().invoke(
        cli, ["stats", str(small_corpus), "--candidates", "32, 128", "--json"]
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.output)
    assert [c["max_len"] for c in d["candidates"]] == [32, 128]
    assert d["suggested_max_len"] == 128  # 32 would split 2 of 4 documents
    repeated = CliRunner().invoke(
        cli, ["stats", str(small_corpus), "--candidates", "128,32,128", "--json"]
    )
    assert [c["max_len"] for c in json.loads(repeated.output)["candidates"]] == [128, 32]


def test_plot_writes_png(small_corpus, tmp_path):
    out = tmp_path / "lengths.png"
    result = CliRunner().invoke(
        cli, ["stats", str(small_corpus), "--max-len", "64", "--plot", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000


@pytest.mark.parametrize("as_json", [False, True])
def test_a_plot_that_cannot_be_written_keeps_the_report(small_corpus, as_json):
    # The plot was drawn before the report was printed: a write that failed (here /proc, which
    # exists but takes no file) after a long pass over the corpus took the figures with it.
    code, out, err = run(
        "stats", small_corpus, "--max-len", "64", "--plot", "/proc/x.png", *(["--json"] * as_json)
    )
    assert code == 1 and one_error_line(err).startswith("error: "), err
    assert json.loads(out)["documents"] if as_json else "documents" in out, out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-len", "0"], "error: --max-len must be an integer >= 2 (tokens), got '0'"),
        (["--max-len", "4k"], "error: --max-len must be an integer >= 2 (tokens), got '4k'"),
        (
            ["--batch-size", "-1"],
            "error: --batch-size must be a positive integer (chunks), got '-1'",
        ),
        (
            ["--candidates", "512,x"],
            "error: --candidates must be a positive integer (tokens), got 'x'",
        ),
        (["--plot", "out.txt"], "error: plot file 'out.txt': unsupported image type '.txt'"),
    ],
)
def test_bad_options_are_one_line_errors(small_corpus, capsys, args, message):
    code, out, err = run_main(["stats", str(small_corpus), *args], capsys)
    assert code == 1
    assert err.startswith(message)
    assert err.count("\n") == 1
    assert out == ""


def test_missing_input_is_one_line_error(tmp_path, capsys):
    code, _, err = run_main(["stats", str(tmp_path / "nope.jsonl")], capsys)
    assert code == 1
    assert err.startswith("error: ") and "nope.jsonl" in err and err.count("\n") == 1


def test_sample_data_end_to_end(capsys):
    code, out, err = run_main(["stats", SAMPLE, "--max-len", "4096", "--json"], capsys)
    assert code == 0, err
    d = json.loads(out)
    assert d["documents"] == 4024
    assert d["inputs"]["skipped"] == {"empty": 6}
    assert d["lower_bound_rows"]["l1"] <= d["lower_bound_rows"]["l2"] <= d["packed"]["rows"]
    assert d["suggested_max_len"] in [c["max_len"] for c in d["candidates"]]


@pytest.mark.parametrize(
    "args",
    [
        ["--max-len", "1"],
        ["--max-len", "1", "--no-eos"],
        ["--max-len", "2", "--bos-id", "default"],
    ],
)
def test_max_lengths_pack_refuses_are_refused_with_packs_message(small_corpus, tmp_path, args):
    code, _, err = run("stats", small_corpus, *args)
    assert code == 1
    line = one_error_line(err)
    code, _, pack_err = run("pack", small_corpus, "-o", tmp_path / "p", *args)
    assert code == 1
    assert line == one_error_line(pack_err)


def test_pre_tokenized_ids_record_no_eos_and_refuse_eos_id_as_pack_does(tmp_path):
    """Before: stats said `eos 256` for ids it counted unchanged (5 tokens for [1,2,3],[4,5])
    and took --eos-id 3, which pack refuses."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = tmp_path / "ids.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([[1, 2, 3], [4, 5]], pa.list_(pa.int32()))}), ids
    )
    code, out, err = run("stats", ids, "--max-len", "8", "--candidates", "8", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert d["tokens"] == 5
    assert (d["inputs"]["tokenizer"]["eos_id"], d["inputs"]["tokenizer"]["bos_id"]) == (None, None)
    code, out, _ = run("stats", ids, "--max-len", "8", "--candidates", "8")
    assert code == 0 and "eos none, bos none" in out
    code, _, err = run("stats", ids, "--max-len", "8", "--eos-id", "3")
    assert code == 1
    code, _, pack_err = run("pack", ids, "-o", tmp_path / "p", "--max-len", "8", "--eos-id", "3")
    assert code == 1 and one_error_line(err) == one_error_line(pack_err)


def test_a_batch_size_past_the_chunks_is_one_batch_not_a_traceback(small_corpus):
    # Before: --batch-size 9223372036854775807 was numpy's "array is too big" traceback, and a
    # 10-digit one ran into its figure ("pad batches of 100000000000.00% of slots wasted").
    for size in ("9223372036854775807", "10000000000"):
        code, out, err = run("stats", small_corpus, "--batch-size", size, "--json")
        assert code == 0, err
        # One batch of the four chunks (10, 20, 40, 100 tokens), each padded to the longest.
        assert json.loads(out)["padding"]["pad_per_batch"]["slots"] == 4 * 100
    code, out, _ = run("stats", small_corpus, "--batch-size", "10000000000")
    line = next(s for s in out.splitlines() if "pad batches of" in s)
    assert "pad batches of 10,000,000,000 " in line and line.split("of 10,000,000,000 ")[1].strip()


def test_tokenizer_engine_on_tokenized_parquet_is_warned_about(small_corpus, tmp_path):
    # Before: --tokenizer-engine was dropped without a word. Nothing is encoded for tokenized
    # Parquet, so the engine changes nothing: one warning line, the run goes on.
    out_dir = tmp_path / "tok"
    code, _, err = run("tokenize", small_corpus, "-o", out_dir)
    assert code == 0, err
    code, _, err = run("stats", out_dir, "--tokenizer-engine", "tokenizers")
    assert code == 0 and "warning: the inputs are tokenized Parquet" in err
    assert "--tokenizer-engine" in err


def test_every_command_warns_alike_of_a_tokenizer_engine_over_tokenized_parquet(
    small_corpus, tmp_path
):
    # Before: stats warned, pack and tokenize dropped --tokenizer-engine without a word.
    made = tmp_path / "tok"
    assert run("tokenize", small_corpus, "-o", made)[0] == 0
    outputs = {"pack": ["-o", tmp_path / "packed"], "tokenize": ["-o", tmp_path / "again"]}
    warned = {}
    for command in ("pack", "tokenize", "stats"):
        code, _, err = run(command, made, *outputs.get(command, []), "--tokenizer-engine", "auto")
        assert code == 0, err
        warned[command] = [line for line in err.splitlines() if "--tokenizer-engine" in line]
    assert warned["stats"] == [ENGINE_IGNORED]
    assert warned["pack"] == warned["tokenize"] == warned["stats"]


def _word_tokenizer(folder):
    """A word-level tokenizer.json (vocab 13, `</s>` id 1 its EOS): another tokenizer than byte."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "[UNK]": 2, **{f"w{i}": 3 + i for i in range(10)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<s>", "</s>"])
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')
    return folder / "tokenizer.json"


def test_tokenizer_options_on_tokenized_parquet_follow_packs_rule(small_corpus, tmp_path):
    """Before: `stats tok/ --tokenizer X` (or --eos-id, --no-eos, --bos-id, --no-bos) only
    warned that they were ignored and reported the file's figures, where `pack` of the same file
    refuses a tokenizer unlike the recorded one. Now stats takes pack's and tokenize's rule
    (packtool/tokenize/recorded.py): the recorded tokenizer (or its EOS / BOS) is accepted, with
    no warning; another is their one-line error, the same line at the four commands: it named
    the input as given at `pack` and `tokenize --to megatron` (`tok`), the first part file at
    `stats` and `tokenize` (`tok/part-00000.parquet`)."""
    out_dir = tmp_path / "tok"
    assert run("tokenize", small_corpus, "-o", out_dir)[0] == 0  # byte: eos 256, bos None
    code, plain, err = run("stats", out_dir, "--json")
    assert code == 0, err
    for same in (["--tokenizer", "byte"], ["--no-bos"], ["--eos-id", "256"]):
        code, out, err = run("stats", out_dir, "--json", *same)
        assert code == 0 and out == plain and err == "", (same, err)
    other = str(_word_tokenizer(tmp_path / "words"))
    hf = ["--tokenizer-engine", "tokenizers", "--tokenizer"]  # no note on the engines tried
    for args, hint in (
        ([*hf, other], "leave --tokenizer out / pass tokenizer=None (the file is read with"),
        (["--tokenizer", "byte", "--no-eos"], "pass --eos-id 256 / eos=256 (what the file"),
        (["--bos-id", "5"], "pass --no-bos / bos=None (what the file records)"),
    ):
        code, _, err = run("stats", out_dir, *args)
        line = error_line(err, args)
        assert code == 1 and line.startswith(f"error: {out_dir}: tokenized with byte:byte"), line
        assert hint in line, line
        for command, out in (
            ("tokenize", ["-o", tmp_path / "t.parquet"]),
            ("tokenize", ["--to", "megatron", "-o", tmp_path / "m"]),
            ("pack", ["-o", tmp_path / "p"]),
        ):
            code, _, other_err = run(command, out_dir, *out, *args)
            assert code == 1 and error_line(other_err, args) == line, (command, out, other_err)


def test_input_options_are_checked_before_the_tokenizer_loads(small_corpus, tmp_path):
    """As `tokenize` does: a misspelt field is named before a (large, remote) tokenizer is
    loaded; stats loaded it first and said the tokenizer file was missing."""
    missing = tmp_path / "none" / "tokenizer.json"
    for command in ("stats", "tokenize"):
        extra = ["-o", tmp_path / "out"] if command == "tokenize" else []
        code, _, err = run(command, small_corpus, *extra, "--tokenizer", missing,
                           "--prompt-field", "nosuchfield")  # fmt: skip
        assert code != 0 and "nosuchfield" in one_error_line(err), (command, err)


def test_a_tokenizer_engine_beside_a_tokenizer_over_tokenized_parquet_is_warned_about(
    small_corpus, tmp_path
):
    # Before: `--tokenizer-engine` alone warned, but beside `--tokenizer byte` (the recorded
    # tokenizer, only compared with the file's) the engine was dropped without a word: nothing
    # is encoded either way. Now the same line at the three commands.
    made = tmp_path / "tok"
    assert run("tokenize", small_corpus, "-o", made)[0] == 0
    outputs = {"pack": ["-o", tmp_path / "packed"], "tokenize": ["-o", tmp_path / "again"]}
    for command in ("pack", "tokenize", "stats"):
        options = ["--tokenizer", "byte", "--tokenizer-engine", "auto"]
        code, _, err = run(command, made, *outputs.get(command, []), *options)
        assert code == 0, err
        assert [line for line in err.splitlines() if "--tokenizer-engine" in line] == [
            ENGINE_IGNORED
        ], command
    # Raw inputs encode with the engine: no warning there.
    code, _, err = run("stats", small_corpus, "--tokenizer", "byte", "--tokenizer-engine", "auto")
    assert code == 0 and "--tokenizer-engine" not in err


def test_a_library_tokenizer_with_an_engine_over_tokenized_parquet_is_warned_about(
    tmp_path, capsys
):
    # The warning is the check's (packtool/tokenize/recorded.py), not the CLI's: the CLI read
    # every input's Parquet footer once more to decide it (10^5 objects in a bucket: 10^5 more
    # GETs), and a Python caller's engine was never warned of.
    from packtool.stats.lengths import compute_stats
    from packtool.tokenize.tokenize import tokenize_corpus
    from packtool.tokenizer.tokenizers import load_tokenizer

    words = _word_tokenizer(tmp_path / "words")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n')
    made = tmp_path / "tok"
    tokenize_corpus(corpus, made, tokenizer=str(words), progress=False)
    capsys.readouterr()
    for engine, warned in (("tokenizers", [ENGINE_IGNORED]), ("auto", [])):
        for run_it in (
            lambda tok: compute_stats(made, tokenizer=tok, progress=False),
            lambda tok: tokenize_corpus(made, tmp_path / "again", tokenizer=tok, overwrite=True),
        ):
            run_it(load_tokenizer(str(words), engine=engine))
            err = capsys.readouterr().err
            assert [line for line in err.splitlines() if "engine" in line] == warned, err


def test_long_docs_option(small_corpus):
    # 10, 20, 40, 100 at max length 64: the 100-token document truncated to 64 (36 cut) or
    # dropped; stats had no such option (until 2026-12-08).
    def stats(*args):
        result = CliRunner().invoke(
            cli, ["stats", str(small_corpus), "--max-len", "64", "--candidates", "64", *args]
        )
        assert result.exit_code == 0, result.output
        return result.output

    d = json.loads(stats("--json"))
    assert (d["long_docs"], d["packed"]["tokens"]) == ("split", 170)
    d = json.loads(stats("--long-docs", "truncate", "--json"))
    assert (d["long_docs"], d["packed"]["tokens"], d["packed"]["rows"]) == ("truncate", 134, 3)
    assert d["candidates"][0]["tokens"] == 134 and d["tokens"] == 170  # the corpus's tokens
    d = json.loads(stats("--long-docs", "drop", "--json"))
    assert (d["packed"]["tokens"], d["packed"]["rows"], d["lower_bound_rows"]["l2"]) == (70, 2, 2)
    assert "1 documents, 100 tokens -> dropped (3 pieces in all)" in stats("--long-docs", "drop")


def test_a_bad_long_docs_is_one_line(small_corpus, capsys):
    code, out, err = run_main(["stats", str(small_corpus), "--long-docs", "keep"], capsys)
    assert code == 1 and one_error_line(err) == (
        "error: Invalid value for '--long-docs': 'keep' is not one of 'split', 'truncate', "
        "'drop'. (see packtool stats --help)"
    )
