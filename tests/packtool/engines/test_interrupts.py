"""Ctrl-C held over a step (`ctrl_c_after`) and the CLI's promise around it: a stall over 5 s
or a second Ctrl-C ends the run at once (docs/pack.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packtool.engines.interrupts import ctrl_c_after

ROOT = Path(__file__).resolve().parents[3]


def test_at_once_runs_the_handler_in_place_and_raises_after_the_block():
    calls = []

    def handler(signum, frame):
        calls.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt), ctrl_c_after(at_once=True):
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(100_000))  # where a pending signal's handler runs
            assert calls == [signal.SIGINT]  # at once, not at the block's end
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(100_000))
            reached.append("the rest of the block")
        assert reached == ["the rest of the block"]
        assert calls == [signal.SIGINT, signal.SIGINT]  # not run a third time at the end
        assert signal.getsignal(signal.SIGINT) is handler  # restored
    finally:
        signal.signal(signal.SIGINT, previous)


def test_without_at_once_the_handler_runs_once_after_the_block():
    calls = []

    def handler(signum, frame):
        calls.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        with pytest.raises(KeyboardInterrupt), ctrl_c_after():
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(100_000))
            assert calls == []
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


# The local engine's first submit, standing in: it waits for the fork server's imports (20 s
# and more on a loaded box) inside `ctrl_c_after`. The CLI's handler is installed as `main`
# installs it, with a 1 s grace instead of 5.
STALLED_SUBMIT = """
import sys, time
import packtool.cli.interrupt as interrupt
from packtool.engines import local

interrupt.FORCE_EXIT_AFTER_S = 1.0
interrupt.install_sigint()


class Pool:
    def submit(self, task, descriptor):
        print("submitting", flush=True)
        time.sleep(60)  # the fork server still importing


class Run:
    def descriptor(self, unit):
        return {"unit": unit}


local._make_pool = lambda run, workers, threads, kind: (Pool(), None)
local._stop = lambda pool: None
local._run_pool(Run(), [[0, 1]], 2, 1, "process")
"""


def _signalled(
    script: list[str], ready: str, signum: int, signals: int = 1
) -> tuple[subprocess.Popen, str, str, float]:
    """Run `python -c SCRIPT ARGS`, wait for its `ready` line, send `signum` `signals` times
    (0.2 s apart); the process, the rest of its stdout, its stderr and the seconds from the
    first signal to its end."""
    proc = subprocess.Popen(
        [sys.executable, "-c", *script],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == f"{ready}\n"
        t0 = time.monotonic()
        for _ in range(signals):
            proc.send_signal(signum)
            time.sleep(0.2)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    return proc, out, err, time.monotonic() - t0


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("signals", [1, 2])
def test_ctrl_c_while_the_pool_starts_is_not_held_for_the_whole_start(signals):
    proc, _, err, took = _signalled([STALLED_SUBMIT], "submitting", signal.SIGINT, signals)
    # One Ctrl-C: out after the grace period (1 s here); a second one: at once.
    assert took < (10 if signals == 1 else 3), err
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted (forced exit)"


# A driver's graceful stop that hangs after SIGTERM (the Ray and Slurm drivers run their waves
# inside `sigterm_as_ctrl_c`): a `finally` that never returns stands in for a stuck cleanup.
HUNG_STOP = """
import sys, time
import packtool.cli.interrupt as interrupt
from packtool.engines import interrupts

interrupt.FORCE_EXIT_AFTER_S = 1.0
if sys.argv[1] == "cli":
    interrupt.install_sigint()
with interrupts.sigterm_as_ctrl_c():
    try:
        print("running", flush=True)
        time.sleep(60)
    finally:
        time.sleep(60)  # the graceful stop, stuck
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize(("caller", "signals"), [("cli", 1), ("cli", 2), ("python", 2)])
def test_sigterm_whose_graceful_stop_hangs_still_exits(caller, signals):
    # From the Python API one SIGTERM sets no timer (the program may catch it and go on:
    # `test_a_python_caller_that_catches_sigterm_goes_on`): only a second one forces the exit.
    proc, _, err, took = _signalled([HUNG_STOP, caller], "running", signal.SIGTERM, signals)
    # One SIGTERM under the CLI: out after the grace period (1 s here), as after a Ctrl-C; a
    # second: at once.
    assert took < (10 if signals == 1 else 3), err
    assert proc.returncode == 130, err
    assert err.strip() == "interrupted (forced exit)", err


# A program that calls the Python API, catches the Ctrl-C that SIGTERM became and goes on
# (/tmp/review-b/term.py: a watchdog ended it 5 s later, exit 130, "done" never printed).
CAUGHT = """
import os, signal, sys, time
from packtool.engines import interrupts

try:
    with interrupts.sigterm_as_ctrl_c():
        print("running", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    print("stopped", flush=True)
time.sleep(float(sys.argv[1]))
print("done", flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_python_caller_that_catches_sigterm_goes_on():
    proc, out, err, _ = _signalled([CAUGHT, "6"], "running", signal.SIGTERM)
    assert proc.returncode == 0, err
    assert out.split() == ["stopped", "done"], err


# The Slurm driver's cancel after a Ctrl-C or SIGTERM under the CLI (scancel may take up to
# 60 s): a stand-in driver whose cancel takes longer than the CLI's grace (1 s here). The
# forced exit cut it short and left the jobs queued.
SLOW_CANCEL = """
import signal, sys, time
import packtool.cli.interrupt as interrupt
from packtool.engines.slurm import driver as slurm_driver

interrupt.FORCE_EXIT_AFTER_S = 1.0
interrupt.install_sigint()


class StandIn:
    def __init__(self, run, slurm, options):
        self.logs = None

    def run_partitions(self):
        print("running", flush=True)
        time.sleep(60)

    def job_ids(self):
        return ["7"]

    def cancel(self, wait=0.0):
        time.sleep(3)  # scancel, slow
        print("cancelled", flush=True)


slurm_driver.ArrayDriver = StandIn
try:
    slurm_driver.drive_slurm(None, type("S", (), {"workers": 0})(), [])
except KeyboardInterrupt:
    print("stopped", flush=True)
sys.exit(130)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_cli_s_forced_exit_waits_for_the_slurm_cancel(sig):
    proc, out, err, _ = _signalled([SLOW_CANCEL], "running", sig)
    assert out.split() == ["cancelled", "stopped"], err
    assert proc.returncode == 130, err


def test_sigterm_stops_a_local_cli_run_as_ctrl_c_and_resume_finishes_it(tmp_path):
    """SIGTERM (a scheduler's time limit, `kill`) to a local `packtool pack`: the resume line and
    exit 130, as Ctrl-C and the Ray and Slurm drivers give; until 2026-12-08 it ended at once,
    exit 143 (-15 here) and not a word. `--resume` then gives the uninterrupted run's bytes."""
    from packtool.engines import records
    from packtool.engines.output_folder import staging_folder

    corpus = tmp_path / "x4.jsonl"
    corpus.write_bytes((ROOT / "sample_data" / "corpus.jsonl").read_bytes() * 4)
    args = [str(corpus), "--max-len", "1024", "--partition-size", "1MB", "--workers", "1"]
    cmd = [sys.executable, "-m", "packtool.cli.commands", "pack", *args]
    env = {**os.environ, "PACKTOOL_NO_PROGRESS": "1"}
    whole = subprocess.run([*cmd, "-o", str(tmp_path / "whole")], env=env, capture_output=True)
    assert whole.returncode == 0, whole.stderr

    cut = tmp_path / "cut"
    proc = subprocess.Popen(
        [*cmd, "-o", str(cut)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60  # stopped once two of its 12 partitions are recorded
    while len(records.finished(staging_folder(cut))) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    if cut.exists():
        pytest.fail("the run finished before it could be stopped; make the corpus larger")
    assert proc.returncode == 130, err
    last = err.decode().strip().splitlines()[-1]
    kept = f"interrupted; finished partitions are kept in {staging_folder(cut)}: run the same"
    assert last.startswith(f"{kept} command with --resume"), err

    done = subprocess.run([*cmd, "-o", str(cut), "--resume"], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    shards = sorted(p.name for p in (tmp_path / "whole").glob("shard-*.parquet"))
    assert shards == sorted(p.name for p in cut.glob("shard-*.parquet"))
    for name in shards:
        assert (cut / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
