"""`packtool pack` through the real entry point, as the README runs it."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.manifest import read_manifest
from tests.cli import one_error_line, run

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def test_readme_pack_command_and_summary(tmp_path):
    code, out, err = run("pack", CORPUS, "-o", tmp_path / "packed", "--max-len", "4096")
    assert code == 0, err
    assert "packed 4,024 of 4,030 documents" in out
    assert "efficiency" in out and "lower bound" in out and "skips: empty 6" in out
    manifest = read_manifest(tmp_path / "packed")
    # The command as `main` was given it, not the argv of the process that called `main`
    # (pytest's own options were recorded, and a `--no-wait` run's resume line repeated them).
    assert manifest.command == f"packtool pack {CORPUS} -o {tmp_path / 'packed'} --max-len 4096"
    code, out, err = run("verify", tmp_path / "packed")
    assert code == 0, err


def test_pack_json_summary_and_options(tmp_path):
    code, out, err = run(
        "pack",
        ROOT / "sample_data" / "corpus.parquet",
        "-o",
        tmp_path / "p",
        "--max-len",
        "1024",
        "--algorithm",
        "bfd",
        "--rounds",
        "3",
        "--seed",
        "5",
        "--group-by",
        "source",
        "--long-docs",
        "truncate",
        "--shard-rows",
        "300",
        "--compression",
        "lz4",
        "--json",
    )
    assert code == 0, err
    summary = json.loads(out)
    c = summary["counts"]
    assert c["tokens_in"] == c["tokens_out"] + c["tokens_truncated"]
    assert len(summary["rows_per_round"]) == 3
    manifest = read_manifest(tmp_path / "p")
    assert (manifest.algorithm, manifest.rounds, manifest.seed) == ("bfd", 3, 5)
    assert len(manifest.shards) == -(-c["rows"] // 300)


def test_pack_tokenized_input_uses_the_recorded_tokenizer(tmp_path):
    assert run("tokenize", CORPUS, "-o", tmp_path / "tok.parquet", "--no-eos")[0] == 0
    code, _, err = run("pack", tmp_path / "tok.parquet", "-o", tmp_path / "p", "--max-len", "512")
    assert code == 0, err
    assert read_manifest(tmp_path / "p").tokenizer["eos_id"] is None
    # --tokenizer byte is the recorded tokenizer; the EOS not chosen is the file's (none), said
    # in a note (it was refused: "the options give byte:byte (..., eos 256 ...)")
    code, _, err = run(
        "pack", tmp_path / "tok.parquet", "-o", tmp_path / "q", "--tokenizer", "byte"
    )
    assert code == 0, err
    assert f"note: {tmp_path / 'tok.parquet'} records eos None, not this tokenizer's eos 256" in err
    assert read_manifest(tmp_path / "q").tokenizer["eos_id"] is None
    code, _, err = run(
        "pack", tmp_path / "tok.parquet", "-o", tmp_path / "r", "--tokenizer", "byte",
        "--eos-id", "256",
    )  # fmt: skip
    line = one_error_line(err)
    assert code == 1 and "the options give byte:byte (vocab 258, eos 256" in line
    assert line.endswith(
        "pass --no-eos / eos=None (what the file records) or leave the EOS/BOS options out"
    )


@pytest.mark.parametrize(
    "args, code, message",
    [
        # Out of range: a usage error naming the option (the library's field names leaked).
        (["--max-len", "1"], 1, "--max-len must be an integer >= 2 (tokens), got '1'"),
        (["--chunk-docs", "0"], 1, "Invalid value for '--chunk-docs': 0 is not in the range"),
        (["--rounds", "0"], 1, "Invalid value for '--rounds': 0 is not in the range 1<=x<=1000"),
        (["--shard-rows", "0"], 1, "Invalid value for '--shard-rows': 0 is not in the range"),
        (["--row-group-rows", "0"], 1, "Invalid value for '--row-group-rows': 0 is not in"),
        (["--seed", "-1"], 1, "Invalid value for '--seed': -1 is not in the range x>=0"),
        (["--max-len", "99999999"], 1, "--max-len 99999999 is too large"),
        (["--group-by", "domain"], 1, "--group-by"),
        (["--overwrite", "--resume"], 1, "exclude each other"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path, args, code, message):
    got, _, err = run("pack", CORPUS, "-o", tmp_path / "p", *args)
    assert got == code, err
    assert message in one_error_line(err), err


def test_bad_inputs_are_one_line_errors(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run("pack", empty, "-o", tmp_path / "a")
    assert code == 1 and "no documents" in one_error_line(err)

    code, _, err = run("pack", tmp_path / "missing.jsonl", "-o", tmp_path / "b")
    assert code == 1 and "missing.jsonl" in one_error_line(err)

    corrupt = tmp_path / "corrupt.parquet"
    corrupt.write_bytes(b"PAR1 this is not parquet")
    code, _, err = run("pack", corrupt, "-o", tmp_path / "c")
    assert code == 1 and "corrupt.parquet" in one_error_line(err)

    wrong = tmp_path / "wrong.parquet"
    pq.write_table(pa.table({"body": ["x"]}), wrong)
    code, _, err = run("pack", wrong, "-o", tmp_path / "d")
    assert code == 1 and "body" in one_error_line(err)

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    code, _, err = run("pack", CORPUS, "-o", tmp_path / "full")
    assert code == 1 and "--overwrite" in one_error_line(err)


@pytest.mark.parametrize(
    ("text", "want"),
    [("65536", 65536), ("64MB", 64 << 20), ("1G", 1 << 30), ("1.5KiB", 1536), ("2 mb", 2 << 20)],
)
def test_partition_size_parses(text, want):
    from packtool.quantities import parse_size

    assert parse_size(text, "--partition-size") == want


@pytest.mark.parametrize("text", ["0", "lots", "-1MB", "12PB"])
def test_a_bad_partition_size_is_one_line(tmp_path, text):
    code, _, err = run("pack", CORPUS, "-o", tmp_path / "o", "--partition-size", text)
    assert code != 0
    assert one_error_line(err).startswith(f"error: --partition-size {text!r}")


def test_partition_size_cuts_the_corpus_and_says_so(tmp_path):
    code, out, err = run(
        "pack", CORPUS, "-o", tmp_path / "o", "--partition-size", "1MB", "--workers", "1"
    )
    assert code == 0, err
    assert "3 partition(s)" in out  # 3.0 MB in byte ranges of 1 MiB
    assert read_manifest(tmp_path / "o").extra["partitions"] == 3


def test_the_console_script_freezes_the_collector_before_exit_and_callers_keep_it(
    monkeypatch, capsys
):
    """`main()` (sys.argv: the process ends next) freezes the collector so the shutdown's
    collections skip the imports' objects; `main(argv)` (tests, other programs) does not."""
    import gc
    import sys

    from packtool.cli import commands as cli

    frozen: list[int] = []
    monkeypatch.setattr(gc, "freeze", lambda: frozen.append(1))
    monkeypatch.setattr(sys, "argv", ["packtool", "--version"])
    cli.main()
    assert frozen == [1]
    assert "packtool, version" in capsys.readouterr().out
    cli.main(["--version"])
    assert frozen == [1]
    monkeypatch.setattr(sys, "argv", ["packtool", "no-such-command"])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    assert exc.value.code == 2 and frozen == [1, 1]  # errors too: the process ends either way


def test_two_runs_at_once_record_their_own_command(tmp_path, monkeypatch):
    # `main` kept its arguments in one slot for the process: a run in another thread that
    # started and finished meanwhile left its own there (or none), and index.json named the
    # other run's output and options.
    import threading

    from packtool.cli import commands

    other_done = threading.Event()
    real = commands.check_input_options

    def held(*args, **kwargs):  # the first run waits, past its start, for the second's end
        if threading.current_thread().name == "first":
            assert other_done.wait(120)
        return real(*args, **kwargs)

    monkeypatch.setattr(commands, "check_input_options", held)
    results = {}

    def pack(name: str, max_len: str) -> None:
        results[name] = run("pack", CORPUS, "-o", tmp_path / name, "--max-len", max_len)

    first = threading.Thread(target=pack, args=("a", "256"), name="first")
    first.start()
    pack("b", "512")
    other_done.set()
    first.join(120)
    for name, max_len in (("a", "256"), ("b", "512")):
        assert results[name][0] == 0, results[name][2]
        command = read_manifest(tmp_path / name).command
        assert command == f"packtool pack {CORPUS} -o {tmp_path / name} --max-len {max_len}"


def test_a_failed_run_in_one_thread_says_its_own_resume_note(tmp_path, monkeypatch):
    # `interrupt.note` was one slot for the process: a run in another thread that set its note
    # meanwhile (its output holding finished partitions) had this run's full-disk line end
    # with "finished partitions are kept in" the other run's folder.
    import errno
    import threading

    from packtool.cli import engine_options
    from packtool.engines import records
    from packtool.engines.output_folder import staging_folder

    noted, other_done = threading.Event(), threading.Event()

    def held(self, config, tokenizer, workers):
        if threading.current_thread().name == "first":  # a run with finished partitions
            staging = staging_folder(config.out_dir)  # one partition's record committed
            records.write_record(staging, {"partition": 0, "shards": [], "counts": {}})
            noted.set()
            assert other_done.wait(120)
            raise KeyboardInterrupt
        assert noted.wait(120)  # this run fails once the first has said its note
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(engine_options.EngineOptions, "run", held)
    results = {}

    def pack(name: str) -> None:
        results[name] = run("pack", CORPUS, "-o", tmp_path / name)

    first = threading.Thread(target=pack, args=("a",), name="first")
    first.start()
    pack("b")
    other_done.set()
    first.join(120)
    assert results["b"][0] == 1
    assert one_error_line(results["b"][2]) == "error: No space left on device"
    code, _, err = results["a"]
    assert code == 130
    assert err.strip() == (
        f"interrupted; finished partitions are kept in {staging_folder(str(tmp_path / 'a'))}: "
        "run the same command with --resume to finish"
    )


@pytest.mark.parametrize("command", ["pack", "stats", "tokenize"])
def test_a_command_lists_its_inputs_once(tmp_path, monkeypatch, command):
    # pack listed a folder (or a bucket prefix: 1,000 keys a request) three times: for the
    # tokenizer's check of the inputs' kind (in a thread of its own), their columns and the plan.
    import shutil

    import packtool.read.corpus as corpus_mod

    folder = tmp_path / "in"
    folder.mkdir()
    shutil.copy(CORPUS, folder / "a.jsonl")
    calls = []
    real = corpus_mod.expand
    monkeypatch.setattr(corpus_mod, "expand", lambda *x: calls.append(x) or real(*x))
    out = ["-o", tmp_path / "out"] if command != "stats" else ["--max-len", "512"]
    code, _, err = run(command, folder, *out)
    assert code == 0, err
    assert len(calls) == 1
