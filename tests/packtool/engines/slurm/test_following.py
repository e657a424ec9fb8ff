"""How the Slurm drivers (packtool/engines/slurm/arrays.py, pilots.py) follow their tasks, the
queue's answers faked (`commands.live_tasks` a scripted sequence), and the scripts they write,
run here with bash: no cluster needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from packtool.engines import records
from packtool.engines.base import workers_lost
from packtool.engines.output_folder import discard_staging
from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.arrays import ArrayDriver
from packtool.engines.slurm.config import PROBE_OK, SlurmConfig
from packtool.engines.slurm.pilots import PilotDriver
from packtool.engines.slurm.task import CANNOT_SEE
from packtool.errors import ConfigError, WorkersLost
from packtool.progress import Progress


class Stop(Exception):
    """The faked queue's end: the driver would poll on."""


def _driver(kind, tmp_path, monkeypatch, queue=(), **slurm):
    """A driver of `kind` over a run of 4 partitions in `tmp_path`, whose polls of the queue
    answer `queue` one after another (then `Stop`), and whose submits are only noted
    (`driver.submits`)."""
    answers = iter(queue)

    def live_tasks(jobs, retry=True, **_):
        try:
            return dict(next(answers))
        except StopIteration:
            raise Stop from None

    monkeypatch.setattr(cli, "live_tasks", live_tasks)
    monkeypatch.setattr(cli, "cancel", lambda jobs, wait=0.0: None)
    monkeypatch.setattr(cli, "max_array_size", lambda: 4)
    work = tmp_path / "staging"
    accounted: list[int] = []
    run = SimpleNamespace(
        work=work,
        out_dir=str(tmp_path / "out"),
        account=lambda record: accounted.append(record["partition"]),
        workers_lost=lambda what, advice: workers_lost(work, what, advice, 4),
        bar=Progress("test", enabled=False),
        context=None,
    )
    driver = kind(run, SlurmConfig(poll_seconds=0.01, **slurm), [])
    driver.accounted = accounted
    driver.submits = []
    monkeypatch.setattr(driver, "_submit", lambda parts: driver.submits.append(parts))
    monkeypatch.setattr(driver, "_submit_workers", lambda n: driver.submits.append(n), False)
    return driver


def _record(work: Path, p: int) -> None:
    records.write_record(work, {"partition": p, "shards": [], "counts": {}})


def test_a_released_partition_recorded_after_its_release_finishes_the_run(tmp_path, monkeypatch):
    """Pull mode: a claim released because its record was not seen yet (a file system's cached
    lookup; a requeued worker still holding it) was then followed only for a new claim, which
    no worker makes for a partition with a record: the run, all its partitions finished,
    failed with `Slurm workers ended 4 times without finishing a partition`."""
    driver = _driver(PilotDriver, tmp_path, monkeypatch, queue=[{}] * 20, workers=1)
    driver.jobs = {"7": {"array": "w0", "pilots": 1, "tasks": []}}
    driver.pool = [0, 1]
    (driver.claims / "000000").write_text("7_0")
    _record(driver.run.work, 0)
    driver.released = {1}  # its claim removed: its record was out of sight then
    _record(driver.run.work, 1)  # and is seen now
    driver._follow({0, 1}, {0})
    assert sorted(driver.accounted) == [0, 1]


def test_a_worker_back_in_the_queue_is_not_gone_once_more(tmp_path, monkeypatch):
    """Pull mode: a worker seen gone once is released only if gone at the next poll too
    (records may lag); one gone once, back, then gone once again (a requeue) counted as gone
    twice, and its partition ran a second time beside it."""
    driver = _driver(PilotDriver, tmp_path, monkeypatch, workers=1)
    driver.running = {0: "7_0"}
    (driver.claims / "000000").write_text("7_0")
    gone_once: set[str] = set()
    polls = [{}, {"7_0": "RUNNING"}, {}]
    assert [driver._release_lost(live, gone_once) for live in polls] == [0, 0, 0]
    assert (driver.claims / "000000").exists() and driver.running == {0: "7_0"}


def test_a_task_back_in_the_queue_is_not_gone_once_more(tmp_path, monkeypatch):
    """Fixed shares: as pull mode's (above), its partitions resubmitted while it ran them."""
    polls = [{}, {"5_0": "RUNNING"}, {}]
    driver = _driver(ArrayDriver, tmp_path, monkeypatch, queue=polls)
    driver._add_job("5", {"array": "a0", "tasks": [[0]]})
    with pytest.raises(Stop):
        driver._wait({0})
    assert driver.submits == []


@pytest.mark.parametrize("kind", [ArrayDriver, PilotDriver])
@pytest.mark.parametrize("lands", ["asked", "waiting"])
def test_a_run_whose_last_record_comes_while_squeue_is_retried_ends_without_the_retries(
    tmp_path, monkeypatch, kind, lands
):
    """A run whose last partition was recorded while squeue kept refusing (a controller timing
    out) waited out every retry of that squeue (`RETRY_SECONDS`, 67 s) before the records were
    looked at again. Now they are looked at before each wait and during it: the run ends at
    once. The real `live_tasks` asks a fake squeue; its waits are counted, not slept. The
    record lands while squeue is asked (its first call), or 12 s into the retries' waits."""
    real_live_tasks = cli.live_tasks
    driver = _driver(kind, tmp_path, monkeypatch, workers=1)
    monkeypatch.setattr(cli, "live_tasks", real_live_tasks)
    cancelled: list[set[str]] = []
    monkeypatch.setattr(cli, "cancel", lambda jobs, wait=0.0: cancelled.append(set(jobs)))
    work = driver.run.work
    records.write_record(tmp_path / "aside", {"partition": 1, "shards": [], "counts": {}})
    made, due = records.record_path(tmp_path / "aside", 1), records.record_path(work, 1)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    squeue = bin_dir / "squeue"
    squeue.write_text(  # refuses for good ("asked": the last record landing as it is asked)
        f"#!/bin/bash\necho x >> {tmp_path / 'squeue.calls'}\n"
        + (f"cp -n {made} {due}\n" if lands == "asked" else "")
        + "echo 'squeue: error: slurm_load_jobs error: Socket timed out on send/recv' >&2\n"
        "exit 1\n"
    )
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    waits: list[float] = []

    def sleep(seconds):
        waits.append(seconds)
        if lands == "waiting" and sum(waits) >= 12:
            shutil.copyfile(made, due)

    monkeypatch.setattr(cli, "time", SimpleNamespace(sleep=sleep, monotonic=time.monotonic))
    driver._add_job("5", {"array": "a0", "pilots": 2, "tasks": [[0], [1]]})
    _record(work, 0)
    if kind is PilotDriver:
        driver.pool = [0, 1]
        for p in (0, 1):
            (driver.claims / f"{p:06d}").write_text(f"5_{p}")
        driver._follow({0, 1}, set())
    else:
        driver._wait({0, 1})
    assert sorted(driver.accounted) == [0, 1]
    landed = 0 if lands == "asked" else 12  # before: 2 + 5 + 10 + 20 + 30 s in either case
    assert landed <= sum(waits) < landed + 0.1, sum(waits)  # (a look every poll_seconds)
    asked = (tmp_path / "squeue.calls").read_text().count("x")
    assert asked == (1 if lands == "asked" else 3)  # at 0 s, and after the waits of 2 and 5
    assert cancelled == [{"5"}]


@pytest.mark.parametrize("kind", [ArrayDriver, PilotDriver])
def test_a_held_task_is_named_once(tmp_path, monkeypatch, capsys, kind):
    """A task Slurm holds (SPECIAL_EXIT, REQUEUE_HOLD, SUSPENDED, ...) runs nothing until
    someone acts, and the driver waited on it without a word."""
    held = {"5_0": "SPECIAL_EXIT", "5_1": "SPECIAL_EXIT", "5_2": "SUSPENDED", "5_3": "RUNNING"}
    driver = _driver(kind, tmp_path, monkeypatch, queue=[held] * 3, workers=1)
    driver._add_job("5", {"array": "a0", "pilots": 4, "tasks": [[0], [1], [2], [3]]})
    if kind is PilotDriver:
        driver.pool = [0, 1, 2, 3]
        driver.running = {p: f"5_{p}" for p in range(4)}
        run = lambda: driver._follow({0, 1, 2, 3}, set())  # noqa: E731
    else:
        run = lambda: driver._wait({0, 1, 2, 3})  # noqa: E731
    with pytest.raises(Stop):
        run()
    lines = [s for s in capsys.readouterr().err.splitlines() if s.strip()]
    assert lines == [
        "packtool: Slurm holds 2 task(s) of job 5 (SPECIAL_EXIT); the run waits for them: "
        "`scontrol release 5` lets them run",
        "packtool: Slurm holds 1 task(s) of job 5 (SUSPENDED); the run waits for them: "
        "`scontrol resume 5` lets them run",
    ]


def test_a_task_held_by_a_user_is_named_once_and_not_counted_running(tmp_path, monkeypatch, capsys):
    """`scontrol hold` (squeue: PENDING, reason JobHeldUser, `commands.live_tasks` reports the
    hold) was waited for without a word; docs/scale-out.md promised a line."""
    seen = []
    monkeypatch.setattr(ArrayDriver, "_progress", lambda self, *counts: seen.append(counts))
    held = {"5_0": "JobHeldUser", "5_1": "JobHeldAdmin"}
    driver = _driver(ArrayDriver, tmp_path, monkeypatch, queue=[held] * 3)
    driver._add_job("5", {"array": "a0", "tasks": [[0], [1]]})
    with pytest.raises(Stop):
        driver._wait({0, 1})
    lines = [s for s in capsys.readouterr().err.splitlines() if s.strip()]
    assert lines == [
        f"packtool: Slurm holds 1 task(s) of job 5 ({state}); the run waits for them: "
        "`scontrol release 5` lets them run"
        for state in ("JobHeldAdmin", "JobHeldUser")
    ]
    assert {counts[2] for counts in seen} == {0}  # none running: both pending


def _refusing(work: Path, record: int | None, calls: list[int]):
    """A `commands.live_tasks` that refuses as squeue does after its retries (a controller that
    keeps timing out), partition `record` recorded meanwhile (None: none)."""

    def live_tasks(jobs, retry=True, **_):
        calls.append(1)
        if record is not None:
            _record(work, record)
        raise cli.SlurmRefused(f"{cli.SLURM}: squeue refused: Socket timed out")

    return live_tasks


@pytest.mark.parametrize("kind", [ArrayDriver, PilotDriver])
@pytest.mark.parametrize("last", ["before", "meanwhile", "never"])
def test_a_run_whose_partitions_all_finished_needs_no_answer_of_squeue(
    tmp_path, monkeypatch, kind, last
):
    """squeue refusing for good (a controller that keeps timing out) failed runs whose every
    partition had its record: the queue was asked before the records were looked at, once more
    after the last one was seen (what to cancel), and a refusal that lasted was the end, though
    the partitions finished while it was asked again. The records come first now, once more
    after a refusal, and a finished run cancels its jobs without asking which are left."""
    driver = _driver(kind, tmp_path, monkeypatch, workers=1)
    cancelled: list[set[str]] = []
    monkeypatch.setattr(cli, "cancel", lambda jobs, wait=0.0: cancelled.append(set(jobs)))
    calls: list[int] = []
    work = driver.run.work
    record = {"before": None, "meanwhile": 1, "never": None}[last]
    monkeypatch.setattr(cli, "live_tasks", _refusing(work, record, calls))
    driver._add_job("5", {"array": "a0", "pilots": 2, "tasks": [[0], [1]]})
    _record(work, 0)
    if last == "before":
        _record(work, 1)
    if kind is PilotDriver:
        driver.pool = [0, 1]
        for p in (0, 1):
            (driver.claims / f"{p:06d}").write_text(f"5_{p}")
        run = lambda: driver._follow({0, 1}, set())  # noqa: E731
    else:
        run = lambda: driver._wait({0, 1})  # noqa: E731
    if last == "never":
        with pytest.raises(cli.SlurmRefused):
            run()
        return
    run()
    assert sorted(driver.accounted) == [0, 1]
    assert len(calls) == (last == "meanwhile")  # squeue asked only while a partition was left
    assert cancelled == [{"5"}]  # the run's jobs, whatever is left of them


@pytest.mark.parametrize("kind", [ArrayDriver, PilotDriver])
def test_a_resume_with_nothing_left_cancels_its_jobs_without_squeue(tmp_path, monkeypatch, kind):
    driver = _driver(kind, tmp_path, monkeypatch, workers=1)
    cancelled: list[set[str]] = []
    monkeypatch.setattr(cli, "cancel", lambda jobs, wait=0.0: cancelled.append(set(jobs)))
    calls: list[int] = []
    monkeypatch.setattr(cli, "live_tasks", _refusing(driver.run.work, None, calls))
    driver._add_job("5", {"array": "a0", "pilots": 1, "tasks": [[0]]})
    driver.run.todo = []  # every partition had its record when the run was opened
    driver.run_partitions()
    assert not calls and cancelled == [{"5"}] and driver.submits == []


def test_a_node_without_the_mount_mid_run_keeps_the_finished_work(tmp_path, monkeypatch):
    """A task that could not see the run's folder raised a ConfigError wherever it came: mid-
    run, a fresh run's staging folder then went with its finished partitions (a ConfigError
    is the command's mistake). Only the probe, or a run with nothing finished, says so now."""
    driver = _driver(ArrayDriver, tmp_path, monkeypatch)
    log = tmp_path / "task.log"
    log.write_text(f"{CANNOT_SEE} {driver.dir} from node7\n")
    with pytest.raises(ConfigError, match="nodes cannot see the run's folder"):
        driver._check_visible(log)  # nothing finished: the command's mistake
    _record(driver.run.work, 2)
    with pytest.raises(WorkersLost) as lost:
        driver._check_visible(log)
    line = str(lost.value)
    assert "node7" in line and "its 1 finished partition(s) are kept" in line, line
    assert not discard_staging(lost.value, None, driver.run.work)
    with pytest.raises(ConfigError):
        driver._check_visible(log, probe=True)


def _fake_python(folder: Path) -> Path:
    """An interpreter that says where it ran and with what (and cannot import packtool)."""
    folder.mkdir()
    python = folder / "python"
    python.write_text('#!/bin/bash\nif [ "$1" = -c ]; then exit 1; fi\necho "ran in $PWD: $*"\n')
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("setup", ["cd / && true", "(exit 5)"])
def test_the_task_script_goes_back_to_the_submit_folder_and_stops_on_a_failed_setup(
    tmp_path, monkeypatch, setup
):
    """`--slurm-setup 'cd /proj && source venv/bin/activate'` left the task in /proj, where the
    inputs' relative paths are not; a setup line that failed went on to run the task."""
    here = tmp_path / "sub mit 'q'"
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.setattr(sys, "executable", str(_fake_python(tmp_path / "bin")))
    driver = _driver(ArrayDriver, tmp_path, monkeypatch, setup=setup)
    script = driver._script("a0")
    env = {**os.environ, "SLURM_ARRAY_TASK_ID": "0"}
    done = subprocess.run(["bash", str(script)], cwd=here, capture_output=True, text=True, env=env)
    if setup.startswith("cd"):
        assert done.returncode == 0 and done.stdout.startswith(f"ran in {here}: "), done
    else:
        assert done.returncode == 5 and not done.stdout, done
        assert "the setup line ended with exit status 5; the task stops" in done.stderr


def test_the_probe_fails_where_the_drivers_python_cannot_import_packtool(tmp_path, monkeypatch):
    """The probe only touched the run's folder: a node without the driver's environment passed
    it, and every task failed after it. A setup line that ends non-zero in the probe (a
    condition on the role) does not stop it."""
    real = sys.executable
    python = _fake_python(tmp_path / "bin")
    setup = '[ "$PACKTOOL_SLURM_ROLE" = task ] && exit 7'
    driver = _driver(ArrayDriver, tmp_path, monkeypatch, setup=setup)
    monkeypatch.setattr(
        cli, "submit_array", lambda options, tasks, script, record: record("9") or "9"
    )
    for interpreter, code in ((str(python), 3), (real, 0)):
        monkeypatch.setattr(sys, "executable", interpreter)
        driver._probe({})
        probe = driver.dir / "probe.sh"
        done = subprocess.run(["bash", str(probe)], capture_output=True, text=True)
        assert done.returncode == code, done
        assert (driver.dir / PROBE_OK).exists() == (code == 0)
        assert (f"{python} cannot import packtool on" in done.stderr) == (code == 3), done
