"""`tokenize --to megatron --resume` of a finished pair: checked against the run that wrote it
(the record beside the pair, packtool/engines/megatron/record.py), as `pack --resume` checks a
finished dataset's `index.json`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from packtool.engines.megatron.record import record_path
from tests.cli import one_error_line, run


def _corpus(path: Path, n: int, word: str) -> Path:
    path.write_text("".join(json.dumps({"text": f"{word} {i} " * 30}) + "\n" for i in range(n)))
    return path


def _pair(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


def test_resume_of_a_finished_pair_refuses_other_options_or_inputs(tmp_path):
    """A requeued job whose corpus or flags changed said "already complete" (exit 0) and kept
    the old pair; now it is refused as `pack` refuses it, and the same request still succeeds."""
    a, b = _corpus(tmp_path / "a.jsonl", 40, "alpha"), _corpus(tmp_path / "b.jsonl", 30, "beta")
    out = tmp_path / "out"
    out.mkdir()
    prefix = out / "d"
    megatron = ["--to", "megatron", "-o", prefix, "--workers", "1"]
    code, _, err = run("tokenize", a, *megatron)
    assert code == 0, err
    before = _pair(prefix)
    assert sorted(p.name for p in out.iterdir()) == [
        record_path(Path(f"{prefix}.idx")).name,
        "d.bin",
        "d.idx",
    ]
    assert record_path(Path(f"{prefix}.idx")).name == ".d.idx.packtool.json"  # hidden

    code, text, err = run("tokenize", a, *megatron, "--resume")
    assert code == 0 and "already complete" in text and "not checked" not in text, err
    for other, named in (
        ([b], "(inputs: other files or sizes)"),
        ([a, b], "(inputs: 2 files, not 1)"),
        ([a, "--no-eos"], "(tokenizer.eos_id: 256 -> none)"),
        ([a, "--no-eos", "--partition-size", "1MB"], "(tokenizer.eos_id: 256 -> none)"),
    ):
        code, _, err = run("tokenize", *other, *megatron, "--resume")
        line = one_error_line(err)
        assert code != 0 and "cannot resume" in line and "--overwrite" in line, (other, line)
        assert f"a finished pair of other options or inputs {named}" in line, line
    assert _pair(prefix) == before

    # A pair written before the record was kept: today's answer, saying it was not checked.
    record = record_path(Path(f"{prefix}.idx"))
    saved = record.read_bytes()
    record.unlink()
    code, text, err = run("tokenize", b, *megatron, "--resume")
    assert code == 0 and "already complete" in text and "not checked" in text, err
    # A pair another tool wrote over this one (the record's sizes are not the pair's): the
    # record is of other files, so it decides nothing either.
    code, _, err = run("tokenize", b, "--to", "megatron", "-o", tmp_path / "e")
    assert code == 0, err
    for suffix in (".bin", ".idx"):
        shutil.copyfile(tmp_path / f"e{suffix}", f"{prefix}{suffix}")
    record.write_bytes(saved)
    code, text, err = run("tokenize", b, *megatron, "--resume")
    assert code == 0 and "already complete" in text and "not checked" in text, err
    # A damaged record: the same, never a traceback.
    record.write_text("{not json")
    code, text, err = run("tokenize", a, *megatron, "--resume")
    assert code == 0 and "not checked" in text, err
    # --overwrite writes the pair and its record again; then --resume checks again.
    code, _, err = run("tokenize", b, *megatron, "--overwrite")
    assert code == 0, err
    code, text, err = run("tokenize", b, *megatron, "--resume")
    assert code == 0 and "not checked" not in text, err
    code, _, err = run("tokenize", a, *megatron, "--resume")
    assert code != 0 and "cannot resume" in one_error_line(err)


def test_resume_of_a_finished_pair_takes_any_partition_size(tmp_path, monkeypatch):
    """The pair is byte for byte the same whatever the partition size, workers or engine, but
    `--resume` of a finished pair with another `--partition-size` was refused as "a finished
    pair of other options" (the record's digest covered it). An interrupted run's saved plan
    does depend on it: resuming that with another one is still refused, and with its own
    finishes the pair of an uninterrupted run."""
    from tests.packtool.engines.test_megatron import _interrupt_after

    a = _corpus(tmp_path / "a.jsonl", 900, "alpha")
    prefix = tmp_path / "d"
    megatron = ["--to", "megatron", "-o", prefix]
    code, _, err = run("tokenize", a, *megatron, "--partition-size", "100000", "--workers", "1")
    assert code == 0, err
    before = _pair(prefix)
    for options in (["--partition-size", "1MB"], ["--partition-size", "20000", "--workers", "2"]):
        code, text, err = run("tokenize", a, *megatron, *options, "--resume")
        assert code == 0 and "already complete" in text and "not checked" not in text, err
    assert _pair(prefix) == before
    # The same pair written with another partition size: the same bytes, so nothing to resume.
    code, _, err = run("tokenize", a, "--to", "megatron", "-o", tmp_path / "big")
    assert code == 0 and _pair(tmp_path / "big") == before, err

    # Interrupted: its plan is of 100 kB partitions.
    cut = tmp_path / "cut"
    _interrupt_after(cut, [a], 1, monkeypatch, partition_size=100_000)
    code, _, err = run("tokenize", a, "--to", "megatron", "-o", cut, "--resume")
    line = one_error_line(err)
    assert code != 0 and "options or inputs differ (partition_size: 100000 -> 268435456)" in line
    code, text, err = run(
        "tokenize", a, "--to", "megatron", "-o", cut, "--partition-size", "100000", "--resume"
    )
    assert code == 0 and "kept from the interrupted run" in text, err
    assert _pair(cut) == before


def test_resume_of_a_pair_without_its_bin_is_refused(tmp_path):
    """Only the `.idx` (and the record) copied: the missing `.bin`'s size read as "no record",
    so `--resume` said "already complete" and exited 0, and a requeued job went on to train on
    an index alone. Now one line names the missing `.bin` and says what to do."""
    a = _corpus(tmp_path / "a.jsonl", 40, "alpha")
    out = tmp_path / "out"
    code, _, err = run("tokenize", a, "--to", "megatron", "-o", out / "c", "--workers", "1")
    assert code == 0, err
    for name in ("c.idx", ".c.idx.packtool.json"):
        shutil.copyfile(out / name, out / name.replace("c.", "c2."))
    for copied in (True, False):  # with the record beside it, and without
        if not copied:
            record_path(out / "c2.idx").unlink()
        code, text, err = run("tokenize", a, "--to", "megatron", "-o", out / "c2", "--resume")
        line = one_error_line(err)
        assert code != 0 and "already complete" not in text, (text, err)
        assert f"cannot resume {out / 'c2'}: {out / 'c2.idx'} exists but {out / 'c2.bin'}" in line
        assert line.endswith("rerun with --overwrite / overwrite=True to write the pair again"), (
            line
        )
    assert not (out / "c2.bin").exists()
    code, _, err = run("tokenize", a, "--to", "megatron", "-o", out / "c2", "--overwrite")
    assert code == 0 and _pair(out / "c2") == _pair(out / "c"), err


def test_a_resumed_runs_summary_rates_its_own_work(tmp_path, monkeypatch):
    """The rate divided every token, the kept parts' too, by this run's time."""
    from packtool.engines import records
    from packtool.engines.megatron.run import tokenize_megatron
    from tests.packtool.engines.test_megatron import _interrupt_after

    corpus = _corpus(tmp_path / "a.jsonl", 3000, "alpha")
    prefix, kw = tmp_path / "d", {"partition_size": 100_000, "workers": 1, "progress": False}
    staging = _interrupt_after(prefix, [corpus], 3, monkeypatch, partition_size=100_000)
    kept = sum(records.read_record(staging, p)["tokens"] for p in records.finished(staging))
    summary = tokenize_megatron([corpus], prefix, resume=True, **kw)
    assert summary.resumed_partitions == 3 and summary.partitions > 3
    own = summary.tokens - kept
    assert summary.resumed_tokens == kept > 0
    text = summary.format()
    assert f"{own / summary.seconds:,.0f} tokens/s ({own:,} of {summary.tokens:,} tokens" in text


def _merge_step(name: str, args: tuple) -> bool:
    """A step of the merge: a part's file renamed to, appended to or removed after the merged
    pair (the workers' own renames, of their temporaries, are not)."""
    source = Path(args[0]).name
    if name == "replace":
        return source.startswith("part-") and Path(args[1]).name.startswith("merged.")
    return source.startswith("part-")


def _killed_after(step: int, run_it, monkeypatch) -> list[tuple[str, str]]:
    """`run_it()` cut right after the `step`-th step of the merge (a KeyboardInterrupt there,
    which keeps the staging folder as a kill does); the steps made. No cut: fewer steps."""
    from packtool.storage import writing

    real = {name: getattr(writing, name) for name in ("replace", "append_range", "remove_file")}
    calls: list[tuple[str, str]] = []

    def cut(name, *args):
        real[name](*args)
        if _merge_step(name, args):
            calls.append((name, Path(args[0]).name))
            if len(calls) == step:
                raise KeyboardInterrupt

    for name in real:
        monkeypatch.setattr(writing, name, lambda *a, _n=name: cut(_n, *a))
    try:
        run_it()
    except KeyboardInterrupt:
        assert len(calls) == step
    finally:
        monkeypatch.undo()
    return calls


def test_a_kill_at_any_step_of_the_merge_is_resumed(tmp_path, monkeypatch):
    """A kill after each step of the merge (the first part's two renames; each later part's
    two appends and two removals), then --resume: the pair of an uninterrupted run. A kill
    between the first part's renames left `merged.bin` without `merged.lengths`, and --resume
    gave up ("a finished partition's part is missing"), losing every finished partition."""
    from packtool.engines.megatron.run import tokenize_megatron

    corpus = _corpus(tmp_path / "a.jsonl", 900, "alpha")
    kw = {"partition_size": 100_000, "workers": 1, "progress": False}
    whole = tokenize_megatron([corpus], tmp_path / "whole", **kw)
    assert whole.partitions == 3
    steps = 2 + 4 * (whole.partitions - 1)
    for step in range(1, steps + 2):
        prefix = tmp_path / f"k{step}"
        calls = _killed_after(
            step, lambda p=prefix: tokenize_megatron([corpus], p, **kw), monkeypatch
        )
        if step > steps:  # every step was cut once
            assert len(calls) == steps and _pair(prefix) == _pair(tmp_path / "whole")
            break
        code, out, err = run(
            "tokenize", corpus, "--to", "megatron", "-o", prefix, "--partition-size", "100000",
            "--workers", "1", "--resume",
        )  # fmt: skip
        assert code == 0, (calls[-1], err)
        assert "kept from the interrupted run" in out, (calls[-1], out)
        assert _pair(prefix) == _pair(tmp_path / "whole"), calls[-1]


@pytest.mark.parametrize("left", ["empty", "plan temporary"])
def test_a_run_killed_before_it_saved_its_plan_is_started_again_by_a_plain_run(tmp_path, left):
    """kill -9 between the staging folder's creation and the plan's rename left it empty, or
    holding the plan's temporary: a plain rerun said 'left its finished partitions ... pass
    --resume', and --resume said 'no interrupted run to resume; drop --resume' (or 'plan.json:
    unreadable ... use --overwrite'): only --overwrite got out, though no partition had run."""
    from packtool.engines import records
    from packtool.engines.output_folder import staging_folder

    corpus = _corpus(tmp_path / "a.jsonl", 300, "alpha")
    out = tmp_path / "out"
    out.mkdir()
    megatron = ["--to", "megatron", "--partition-size", "20000", "--workers", "1"]
    code, _, err = run("tokenize", corpus, *megatron, "-o", tmp_path / "whole")
    assert code == 0, err
    prefix = out / "d"
    staging = staging_folder(Path(f"{prefix}.idx"))
    staging.mkdir()
    if left == "plan temporary":
        records.run_dir(staging).mkdir()
        (records.run_dir(staging) / ".plan.json.4242-0123abcd.tmp").write_text('{"fingerprint"')
    code, _, err = run("tokenize", corpus, *megatron, "-o", prefix, "--resume")
    line = one_error_line(err)
    assert code != 0 and "stopped before it saved its plan" in line, line
    assert "nothing to resume; run again without --resume / resume=True" in line, line
    assert staging.is_dir()  # a refused --resume removes nothing
    code, _, err = run("tokenize", corpus, *megatron, "-o", prefix)
    assert code == 0, err
    assert _pair(prefix) == _pair(tmp_path / "whole")
    assert sorted(p.name for p in out.iterdir()) == [".d.idx.packtool.json", "d.bin", "d.idx"]


def test_a_staging_folder_holding_more_than_a_plan_temporary_is_kept(tmp_path):
    """A part file beside the plan's temporary is work: refused without --overwrite, kept."""
    from packtool.engines import records
    from packtool.engines.output_folder import staging_folder

    corpus = _corpus(tmp_path / "a.jsonl", 30, "alpha")
    prefix = tmp_path / "d"
    staging = staging_folder(Path(f"{prefix}.idx"))
    records.run_dir(staging).mkdir(parents=True)
    (records.run_dir(staging) / ".plan.json.4242-0123abcd.tmp").write_text('{"fingerprint"')
    (staging / "merged.bin").write_bytes(b"tokens")
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", prefix)
    assert code != 0 and "pass --resume / resume=True to finish it" in one_error_line(err)
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", prefix, "--resume")
    assert code != 0 and "use --overwrite / overwrite=True" in one_error_line(err)
    assert (staging / "merged.bin").read_bytes() == b"tokens"
