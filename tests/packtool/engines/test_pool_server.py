"""The local engine's fork server never dies of the terminal's Ctrl-C, even while it starts
(packtool/engines/pool_server.py, `local.start_pool_server`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The fork server's start made slow (a loaded machine, imports over NFS): it is still in the
# interpreter's start-up, before `pool_server` can ignore SIGINT, when the Ctrl-C comes.
SLOW_START = """
import os, sys, time
if "forkserver" in " ".join(sys.orig_argv):
    open(os.environ["FS_MARK"], "w").close()
    time.sleep(3)
"""

DRIVER = """
import os, signal, sys, time
from concurrent.futures import ProcessPoolExecutor

signal.signal(signal.SIGINT, lambda signum, frame: print("driver: Ctrl-C", flush=True))
from packtool.engines import local

mp = local.start_pool_server()
print("started", flush=True)
while not os.path.exists(os.environ["FS_MARK"]):
    time.sleep(0.01)
print("server starting", flush=True)
time.sleep(6)
with ProcessPoolExecutor(1, mp_context=mp) as pool:  # the server lived through it
    print("worker", pool.submit(os.getpid).result() != os.getpid(), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_while_the_fork_server_starts_prints_no_traceback(tmp_path):
    # Seen: Ctrl-C early in a multi-partition pack printed the fork server's KeyboardInterrupt
    # traceback (6 of 10 tries), since it started with SIGINT at its default and ignored it
    # only once `pool_server` was imported.
    (tmp_path / "sitecustomize.py").write_text(SLOW_START)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]),
        FS_MARK=str(tmp_path / "fork-server-started"),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", DRIVER],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's foreground job
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "started\n"
        assert proc.stdout.readline() == "server starting\n"
        time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)  # the terminal's Ctrl-C: to the whole group
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert out.splitlines() == ["driver: Ctrl-C", "worker True"], (out, err)
    assert proc.returncode == 0, err


KILLED_DRIVER = """
import os, signal
from packtool.engines import local

mp = local.start_pool_server()  # the resource tracker and the fork server, as a run starts them
lock = mp.Lock()  # a named semaphore, as the pool's queues hold: the tracker unlinks it if
print(lock._semlock.name, flush=True)  # its process dies before it does
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX semaphores in /dev/shm")
def test_a_driver_killed_outright_leaves_no_leak_warning_and_no_semaphore():
    # Seen: after `kill -9` of a multi-partition pack, the orphaned resource tracker printed
    # "UserWarning: resource_tracker: There appear to be 5 leaked semaphore objects to clean
    # up at shutdown" (two lines) on the terminal, after the shell's prompt.
    done = subprocess.run(
        [sys.executable, "-c", KILLED_DRIVER],
        cwd=ROOT,
        capture_output=True,  # until every holder of stderr (the tracker too) has closed it
        text=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL
    name = done.stdout.strip()
    assert name and "leaked" not in done.stderr and done.stderr == ""
    assert not Path("/dev/shm", "sem." + name.lstrip("/")).exists()  # cleaned up all the same


KERNELS = """
import multiprocessing.forkserver, os
from concurrent.futures import ProcessPoolExecutor
from packtool.engines import local
from packtool.pack import jit


def loaded_in_workers():
    mp = local.start_pool_server(kernels=True)  # as a pack's driver starts it
    with ProcessPoolExecutor(2, mp_context=mp) as pool:
        return [f.result() for f in [pool.submit(jit.loaded) for _ in range(4)]]


print(loaded_in_workers(), jit.loaded())
multiprocessing.forkserver._forkserver._stop()  # a server of its own for the second
os.environ["BREAK_KERNELS"] = "1"
print(loaded_in_workers(), jit.loaded())
"""

BROKEN_KERNELS = """
import os, sys
if os.environ.get("BREAK_KERNELS") and "forkserver" in " ".join(sys.orig_argv):
    import packtool.pack.warmup

    def broken(rounds=1):
        raise OSError("numba's cache cannot be written (stand-in)")

    packtool.pack.warmup.warm_up = broken
"""


def test_a_pack_s_fork_server_loads_the_kernels_once_for_every_worker(tmp_path):
    # Each partition worker imported numba and loaded the packer's kernels itself (~1.2 s of
    # CPU a process, every worker of every run): a pack's fork server loads them before it
    # forks any, and the driver, which starts it, loads none of them for it. A server that
    # cannot load them lives on, and its workers load them themselves.
    (tmp_path / "sitecustomize.py").write_text(BROKEN_KERNELS)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    done = subprocess.run(
        [sys.executable, "-c", KERNELS], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.stdout.splitlines() == [
        "[True, True, True, True] False",
        "[False, False, False, False] False",
    ], done.stderr[-2000:]


GONE_DRIVER = """
import multiprocessing.forkserver, os, pathlib, sys, time
from packtool.engines import local

local.start_pool_server(kernels=True)  # as a pack's driver starts it, then a preflight error
print(multiprocessing.forkserver._forkserver._forkserver_pid, flush=True)
if sys.argv[1] == "compiling":  # until the server has written its first kernel's cache
    cache = pathlib.Path(os.environ["NUMBA_CACHE_DIR"])
    while not any(cache.rglob("*.nbc")):
        time.sleep(0.02)
"""


def _server_running(pid: int) -> bool:
    """Whether fork server `pid` still runs (a zombie nobody reaps has ended)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return b"forkserver" in cmdline and state not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
@pytest.mark.parametrize("when", ["at once", "compiling"])
def test_a_fork_server_ends_with_a_driver_gone_during_its_preload(tmp_path, when):
    # Seen: `packtool pack ... -o <non-empty folder> --partition-size 300000` exited 1 at its
    # preflight while its fork server, started early, went on loading the kernels for nobody:
    # 3.8 s with numba's cache warm, 15 s cold (41 cache files written); the server sees its
    # driver's end in its own loop only, once its preload has run. A cold cache here: without
    # the watch it would still be compiling at the deadline. The driver ends at once, or once
    # the server is compiling the kernels.
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"), PYTHONPATH=str(ROOT))
    out, err = tmp_path / "out", tmp_path / "err"
    with out.open("w") as stdout, err.open("w") as stderr:  # files: the server holds them too
        done = subprocess.run(
            [sys.executable, "-c", GONE_DRIVER, when], cwd=ROOT, env=env, stdout=stdout,
            stderr=stderr, timeout=120,
        )  # fmt: skip
    assert done.returncode == 0, err.read_text()[-2000:]
    pid = int(out.read_text())
    try:
        deadline = time.monotonic() + 6
        while _server_running(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _server_running(pid), "the fork server outlived its driver"
    finally:
        if _server_running(pid):
            os.kill(pid, signal.SIGKILL)


SERVER_THREADS = """
import multiprocessing.forkserver, os
from concurrent.futures import ProcessPoolExecutor
from packtool.engines import local

mp = local.start_pool_server(kernels=True)
with ProcessPoolExecutor(1, mp_context=mp) as pool:
    pool.submit(os.getpid).result()  # the server has finished its preload
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    print(len(os.listdir(f"/proc/{pid}/task")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_a_fork_server_forks_its_workers_without_the_driver_watch():
    # The watch's thread ends with the preload (`pool_ready`): the server forks its workers
    # with the threads it has anyway, the interpreter's and pyarrow's jemalloc_bg_thd.
    done = subprocess.run(
        [sys.executable, "-c", SERVER_THREADS], cwd=ROOT, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.stdout.strip() == "2", done.stderr[-2000:]
