"""Worker processes end when their driver ends, however it ends (packtool/lifeline.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from packtool import lifeline

FOLLOWER = """
import os, sys, time
from packtool import lifeline
if sys.argv[2] == "poll":
    del os.pidfd_open  # as on a system without pidfds
    lifeline.POLL_SECONDS = 0.05
lifeline.follow(int(sys.argv[1]))
print("following", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["pidfd", "poll"])
def test_a_follower_ends_when_the_process_it_follows_ends(how):
    driver = subprocess.Popen(["sleep", "600"])
    follower = subprocess.Popen(
        [sys.executable, "-c", FOLLOWER, str(driver.pid), how], stdout=subprocess.PIPE, text=True
    )
    try:
        assert follower.stdout.readline().strip() == "following"
        assert follower.poll() is None  # it waits while the driver runs
        driver.kill()
        driver.wait()
        assert follower.wait(timeout=30) == lifeline.EXIT_CODE
    finally:
        for p in (driver, follower):
            p.kill()
            p.wait()


def test_following_a_process_already_gone_ends_at_once():
    gone = subprocess.Popen(["true"])
    gone.wait()
    code = (
        f"from packtool import lifeline; lifeline.follow({gone.pid}); import time; time.sleep(600)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=30).returncode == lifeline.EXIT_CODE


def test_following_itself_does_nothing():
    lifeline.follow(os.getpid())  # a thread pool's "worker" is the driver


def _descendants(pid: int) -> set[int]:
    """Every process below `pid` now (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in found:
                found.add(c)
                todo.append(c)
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_pack_killed_outright_leaves_no_worker_process(tmp_path):
    # Before: the fork server, its resource tracker and the pool's workers stayed, idle,
    # for good (each worker holds the server's "alive" pipe and both ends of its own queue).
    corpus = tmp_path / "c.jsonl"
    line = json.dumps({"text": "a few words of text " * 40}) + "\n"
    corpus.write_text(line * 40_000)  # ~33 MB: seconds of work on any machine
    cmd = [sys.executable, "-c", "from packtool.cli.commands import main; main()", "pack"]
    cmd += [str(corpus)]
    cmd += ["-o", str(tmp_path / "out"), "--max-len", "512", "--partition-size", "1MB"]
    driver = subprocess.Popen(
        [*cmd, "--workers", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    below: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while len(below) < 4 and time.monotonic() < deadline:  # server, tracker, 2 workers
            below = _descendants(driver.pid)
            time.sleep(0.02)
        assert len(below) >= 4, f"the pool did not start: {below}"
        assert driver.poll() is None, "the pack ended before it was killed: make the corpus larger"
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        deadline = time.monotonic() + 30
        while any(_running(p) for p in below) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [p for p in below if _running(p)]
    finally:
        driver.kill()
        driver.wait()
        for p in below | _descendants(driver.pid):
            if _running(p):
                os.kill(p, signal.SIGKILL)


def test_pool_workers_are_born_ignoring_ctrl_c():
    # A Ctrl-C reaching a worker still unpickling its first task printed its traceback after
    # the driver's "interrupted" line (an audit, 1 in 3 interrupts at the pool's start).
    code = (
        "import signal\n"
        "from concurrent.futures import ProcessPoolExecutor\n"
        "from packtool.engines.local import start_pool_server\n"
        "with ProcessPoolExecutor(1, mp_context=start_pool_server()) as pool:\n"
        "    print(pool.submit(signal.getsignal, signal.SIGINT).result() == signal.SIG_IGN)\n"
        "print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)\n"  # the driver's
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True", "True"], out.stdout + out.stderr
