"""Ctrl-C and SIGTERM while a Slurm driver cancels its jobs (packtool/engines/slurm/driver.py),
on the real one-node cluster (scripts/slurm-test-cluster.sh): one signal lets the cancel finish,
a second ends the driver at once naming the jobs that may still be queued. The driver runs as
the console script does, in a process of its own; `scancel` is the cluster's, after 3 s (a
busy controller), so that the signals land while it runs."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
SAMPLE = ROOT / "sample_data" / "corpus.jsonl"

PROBE_FAILS = '[ "$PACKTOOL_SLURM_ROLE" = probe ] && exit 3'
"""A setup line the probe job fails on: the run fails, its arrays pending behind the probe."""
PROBE_WAITS = '[ "$PACKTOOL_SLURM_ROLE" = probe ] && sleep 300'
"""A setup line the probe job waits on: the run waits, its arrays pending behind the probe."""

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster


class Driver:
    """`packtool pack ... --engine slurm --slurm-setup SETUP` (11 partitions: a probe job and
    three arrays) in a session of its own, its `scancel` slowed by 3 s."""

    def __init__(self, tmp_path: Path, setup: str) -> None:
        self.name = f"sig{uuid.uuid4().hex[:10]}"  # its jobs' name, this test's alone
        self.started = tmp_path / "scancel-started"
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        scancel = bin_dir / "scancel"
        scancel.write_text(
            f'#!/bin/bash\ntouch {self.started}\nsleep 3\nexec {shutil.which("scancel")} "$@"\n'
        )
        scancel.chmod(0o755)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        args = ["pack", str(SAMPLE), "-o", str(tmp_path / self.name), "--max-len", "1024",
                "--shard-rows", "200", "--partition-size", "300000", "--engine", "slurm",
                "--slurm-setup", setup]  # fmt: skip
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "packtool.cli.commands", *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: a terminal's Ctrl-C is sent to it
        )

    def jobs(self) -> list[str]:
        """The ids of its jobs in the queue (an array's own id)."""
        out = subprocess.run(
            ["squeue", "-h", "-n", f"packtool-{self.name}", "-o", "%F"],
            capture_output=True,
            text=True,
        ).stdout
        return sorted(set(out.split()), key=int)

    def wait_for(self, what, timeout: float = 60) -> None:
        end = time.time() + timeout
        while not what():
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.time() < end, "timed out"
            time.sleep(0.1)

    def signal(self, sig: int) -> None:
        """SIGINT as a terminal's Ctrl-C sends it (to the whole foreground process group, the
        commands the driver runs too); SIGTERM as `kill` does (to the driver alone)."""
        if sig == signal.SIGINT:
            os.killpg(self.proc.pid, sig)
        else:
            os.kill(self.proc.pid, sig)

    def end(self, timeout: float = 120) -> tuple[int, list[str], float]:
        """Its exit status, its stderr's lines, and the seconds it took to end."""
        t0 = time.monotonic()
        try:
            _, err = self.proc.communicate(timeout=timeout)
        finally:
            self.proc.kill()
        return self.proc.returncode, err.strip().splitlines(), time.monotonic() - t0

    def queue_left(self, timeout: float = 30) -> list[str]:
        """Its jobs still queued once none is left or `timeout` has passed (scancel is
        asynchronous)."""
        end = time.time() + timeout
        while (left := self.jobs()) and time.time() < end:
            time.sleep(0.3)
        return left

    def clean(self) -> None:
        subprocess.run(["scancel", "-n", f"packtool-{self.name}"], capture_output=True)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_one_signal_while_a_failed_run_cancels_its_jobs_lets_the_cancel_finish(
    cluster, tmp_path, sig
):
    driver = Driver(tmp_path, PROBE_FAILS)
    try:
        driver.wait_for(driver.started.exists)  # the probe failed: the run cancels its arrays
        assert len(driver.jobs()) == 3
        driver.signal(sig)
        code, lines, _ = driver.end()
        # The run's own error, one line after the note the signal got; no job left behind.
        assert code == 1, lines
        assert not any("Traceback" in line for line in lines), lines
        assert lines[-1].startswith("error: ") and "the probe job" in lines[-1], lines
        assert "cancelling" in "\n".join(lines[:-1]), lines
        assert driver.queue_left() == []
    finally:
        driver.clean()


def _says_the_jobs(line: str, jobs: list[str]) -> None:
    """`line` names each of `jobs` and the scancel line that cancels them all."""
    named = re.search(r"`scancel ([\d ]+)`", line)
    assert named, line
    assert set(jobs) <= set(named.group(1).split()), line
    assert all(re.search(rf"\b{job}\b", line.split("`scancel")[0]) for job in jobs), line


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_second_signal_while_a_failed_run_cancels_ends_at_once_naming_the_jobs(
    cluster, tmp_path, sig
):
    driver = Driver(tmp_path, PROBE_FAILS)
    try:
        driver.wait_for(driver.started.exists)
        jobs = driver.jobs()
        assert len(jobs) == 3
        driver.signal(sig)
        time.sleep(0.3)
        driver.signal(sig)
        code, lines, took = driver.end()
        assert took < 2 and code == 130, lines  # at once: scancel still had 2.5 s to go
        assert lines[-1].startswith("interrupted") and "(forced exit)" in lines[-1], lines
        _says_the_jobs(lines[-1], jobs)
    finally:
        driver.clean()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_second_signal_while_a_stopped_run_cancels_ends_at_once_naming_the_jobs(
    cluster, tmp_path, sig
):
    driver = Driver(tmp_path, PROBE_WAITS)
    try:
        driver.wait_for(lambda: len(driver.jobs()) == 4)  # the probe and three arrays
        jobs = driver.jobs()
        driver.signal(sig)  # the run stops: its jobs are cancelled
        driver.wait_for(driver.started.exists)
        driver.signal(sig)
        code, lines, took = driver.end()
        assert took < 2 and code == 130, lines
        assert lines[-1].startswith("interrupted") and "(forced exit)" in lines[-1], lines
        _says_the_jobs(lines[-1], jobs)
    finally:
        driver.clean()
