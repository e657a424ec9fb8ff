"""The Slurm engine's fixed-share driver (packtool/engines/slurm/arrays.py) on the one-node
test cluster: what a discarded or resumed run's jobs become."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace

import pytest

from packtool.dataset.shards import ShardConfig
from packtool.engines import records
from packtool.engines.local import run_pack
from packtool.engines.output_folder import staging_folder
from packtool.engines.slurm.driver import SlurmConfig, logs_folder, run_pack_slurm
from packtool.errors import Detached
from tests.packtool.engines.slurm.test_driver import (
    PARTITION_SIZE,
    PARTITIONS,
    _config,
    _queue,
    _same_dataset,
    _wait_queue_empty,
)

HOLD = 'if [ "$PACKTOOL_SLURM_ROLE" = task ]; then sleep 600; fi'
"""An array task that never ends (its partitions stay unrecorded while the test acts)."""


def _detached_holding(out, slurm: SlurmConfig) -> list[str]:
    """A `--no-wait` run into `out` whose tasks never end: the ids of the jobs it queued."""
    with pytest.raises(Detached) as gone:
        run_pack_slurm(_config(out), replace(slurm, wait=False, setup=HOLD))
    return gone.value.job_ids


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster


def _rows_150(out):
    """`_config` in shards of 150 rows: the options of a run that overwrites one of `_config`."""
    return replace(_config(out), shards=ShardConfig(shard_rows=150))


@pytest.fixture(scope="module")
def local_150(tmp_path_factory):
    """`_rows_150`'s dataset, packed by the local engine."""
    out = tmp_path_factory.mktemp("local-150") / "packed"
    run_pack(_rows_150(out))
    return out


@pytest.mark.parametrize("engine", ["slurm", "local"])
def test_overwrite_cancels_a_detached_runs_jobs_before_it_discards_them(
    cluster, local_150, tmp_path, engine
):
    """A detached run replaced by --overwrite left its jobs running, and a task of it still
    running wrote old-option partitions into the new run's staging folder (same path): 9 of 12
    partitions with the old tokenizer's ids, verify OK."""
    out = tmp_path / "packed"
    jobs = _detached_holding(out, SlurmConfig(tasks_per_job=PARTITIONS))
    try:
        end = time.time() + 30
        while not any("_" in k and "_0" in k for k in _queue(jobs)) and time.time() < end:
            time.sleep(0.2)
        fixed = replace(_rows_150(out), overwrite=True)
        if engine == "slurm":
            run_pack_slurm(fixed, SlurmConfig(poll_seconds=0.3))
        else:
            run_pack(fixed)
        assert not _queue(jobs)  # cancelled, and gone before the staging folder was
        assert not logs_folder(out).exists()  # its logs too (left beside the output before)
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)
    _same_dataset(local_150, out)


def _megatron(prefix, **kw):
    """`tokenize --to megatron` of the sample corpus into `prefix`, `PARTITIONS` parts."""
    from packtool.engines.megatron.run import tokenize_megatron

    sample = _config(prefix).inputs[0]
    return tokenize_megatron([sample], prefix, partition_size=PARTITION_SIZE, progress=False, **kw)


def _detached_megatron(prefix) -> list[str]:
    """A `--no-wait` megatron run into `prefix` whose task never ends: the ids of its jobs."""
    with pytest.raises(Detached) as gone:
        _megatron(
            prefix,
            engine="slurm",
            engine_config=SlurmConfig(tasks_per_job=PARTITIONS, wait=False, setup=HOLD),
        )
    assert _queue(gone.value.job_ids)
    return gone.value.job_ids


@pytest.fixture(scope="module")
def megatron_ref(tmp_path_factory):
    """The `.bin` / `.idx` pair of a plain local `_megatron` run (its prefix)."""
    prefix = tmp_path_factory.mktemp("megatron") / "ref"
    _megatron(prefix)
    return prefix


def _same_pair_as_a_plain_run(ref, tmp_path, name: str) -> None:
    for suffix in (".bin", ".idx"):
        want = ref.with_name(f"{ref.name}{suffix}").read_bytes()
        assert (tmp_path / f"{name}{suffix}").read_bytes() == want


def test_a_detached_megatron_run_resumed_on_another_engine_cancels_its_slurm_jobs(
    cluster, megatron_ref, tmp_path
):
    """`tokenize --to megatron --engine slurm --no-wait`, then `--resume` on the local engine:
    the queued tasks were left running beside the local workers (writing parts into the
    staging folder the local run then removed), as `pack` did before `taken_over`. The prefix
    spelled as its `.idx` file the first time: the logs folder was named after the spelling,
    so the resume (plain prefix) left the first one's."""
    jobs = _detached_megatron(tmp_path / "slurm.idx")
    try:
        _megatron(tmp_path / "slurm", resume=True)
        # Cancelled by the run that took over (scancel is asynchronous: a killed task shows as
        # completing for a moment; a task left alone would hold for 600 s).
        _wait_queue_empty(jobs, timeout=30)
        assert not _queue(jobs)
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)
    _same_pair_as_a_plain_run(megatron_ref, tmp_path, "slurm")
    for spelled in ("slurm", "slurm.idx"):  # the jobs' logs went with them
        assert not logs_folder(tmp_path / spelled).exists()


@pytest.mark.parametrize("engine", ["slurm", "local"])
def test_a_megatron_overwrite_cancels_a_detached_slurm_runs_jobs(
    cluster, megatron_ref, tmp_path, engine
):
    """As `pack --overwrite` (above): `tokenize --to megatron --overwrite` discarded a detached
    Slurm run's staging folder with its array task still running, free to write old parts
    into the new run's folder at the same path."""
    jobs = _detached_megatron(tmp_path / "slurm")
    try:
        config = SlurmConfig(poll_seconds=0.3) if engine == "slurm" else None
        _megatron(tmp_path / "slurm", overwrite=True, engine=engine, engine_config=config)
        assert not _queue(jobs)  # cancelled before the staging folder was discarded
        assert not logs_folder(tmp_path / "slurm").exists()  # its logs too
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)
    _same_pair_as_a_plain_run(megatron_ref, tmp_path, "slurm")


@pytest.mark.parametrize("first,then", [(None, 2), (1, None)])
def test_a_resume_in_the_other_mode_leaves_no_job_of_the_first(
    cluster, local, tmp_path, first, then
):
    """A detached fixed-share run resumed with --slurm-workers (and the reverse) finished with
    the first mode's jobs still queued: each driver looked only at its own mode's jobs."""
    out = tmp_path / "packed"
    slurm = SlurmConfig(tasks_per_job=PARTITIONS if first is None else 1, workers=first)
    # (one task of the first mode holds one of the two cores: the other runs the resume)
    jobs = _detached_holding(out, slurm)
    try:
        run_pack_slurm(_config(out, resume=True), SlurmConfig(workers=then, poll_seconds=0.3))
        assert not _queue(jobs)
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)
    _same_dataset(local, out)


def test_worker_arrays_split_by_max_array_size_log_apart(cluster, tmp_path):
    """Pull mode: the arrays of workers split by MaxArraySize (4 here) shared one log name, so
    workers of different arrays wrote the same log files."""
    import json

    out = tmp_path / "packed"
    jobs = _detached_holding(out, SlurmConfig(workers=6))
    subprocess.run(["scancel", *jobs], capture_output=True)
    folder = staging_folder(out) / records.RUN_DIR / "slurm" / "jobs"
    entries = [json.loads(p.read_text()) for p in folder.glob("*.json")]
    assert sorted(e["pilots"] for e in entries) == [2, 4]
    assert len({e["array"] for e in entries}) == 2  # the log names: NAME-%a.log


def test_a_resume_after_a_stopped_driver_submits_the_workers_asked_for(cluster, local, tmp_path):
    """Pull mode: a --resume of a run whose workers died holding claims (a Ctrl-C of the driver)
    submitted --slurm-workers workers, then released the dead claims at a later poll and
    submitted as many again while the first ran (2 asked for, 4 run)."""
    out = tmp_path / "packed"
    jobs = _detached_holding(out, SlurmConfig(workers=1))
    subprocess.run(["scancel", *jobs], capture_output=True)
    end = time.time() + 30
    while _queue(jobs) and time.time() < end:
        time.sleep(0.2)
    claims = staging_folder(out) / records.RUN_DIR / "slurm" / "claims"
    for p in (0, 1, 2):  # what the cancelled worker held
        (claims / f"{p:06d}").write_text(f"{jobs[0]}_0")
    summary = run_pack_slurm(_config(out, resume=True), SlurmConfig(workers=2, poll_seconds=0.3))
    assert "Slurm: 2 worker task(s)" in summary.cores_used
    _same_dataset(local, out)


def test_a_resume_beside_a_live_worker_gives_a_dead_workers_claim_a_worker(
    cluster, local, tmp_path
):
    """Pull mode: a --resume released the claim of a worker already gone but submitted workers
    only where none was left alive, so with one still queued (here: one that never takes a
    partition) the released partition waited for it to end: the run never finished."""
    import sys

    out = tmp_path / "packed"
    jobs = _detached_holding(out, SlurmConfig(workers=1))  # a worker that stays, claiming none
    try:
        claims = staging_folder(out) / records.RUN_DIR / "slurm" / "claims"
        claims.mkdir(parents=True, exist_ok=True)
        (claims / "000000").write_text("1_0")  # a worker long gone held partition 0
        args = ["pack", str(_config(out).inputs[0]), "-o", str(out), "--max-len", "1024",
                "--shard-rows", "200", "--partition-size", str(PARTITION_SIZE), "--engine", "slurm",
                "--slurm-workers", "1", "--resume"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "packtool.cli.commands", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        _same_dataset(local, out)
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)


@pytest.mark.parametrize("workers", [None, 2])
def test_sigterm_to_the_driver_cancels_its_jobs_as_ctrl_c_does(cluster, tmp_path, workers):
    """SIGTERM to the driver (a job scheduler's or a terminal's kill) left every job queued,
    with no message; Ctrl-C cancels them all."""
    import os
    import signal
    import sys

    from tests.packtool.engines.slurm.test_driver import ROOT, SAMPLE

    out = tmp_path / "packed"
    args = ["pack", str(SAMPLE), "-o", str(out), "--max-len", "1024", "--shard-rows", "200",
            "--partition-size", str(PARTITION_SIZE), "--engine", "slurm",
            "--slurm-setup", HOLD]  # fmt: skip
    if workers:
        args += ["--slurm-workers", str(workers)]
    cmd = [sys.executable, "-m", "packtool.cli.commands", *args]
    driver = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    folder = staging_folder(out) / records.RUN_DIR / "slurm" / "jobs"
    end = time.time() + 60
    while not list(folder.glob("*.json")) and time.time() < end:
        time.sleep(0.1)
    time.sleep(1)  # the driver is waiting on its jobs
    jobs = [p.stem for p in folder.glob("*.json")]
    try:
        os.kill(driver.pid, signal.SIGTERM)
        _, err = driver.communicate(timeout=60)
        assert driver.returncode == 130 and err.strip().startswith("interrupted"), err
        end = time.time() + 10
        while _queue(jobs) and time.time() < end:  # scancel is asynchronous
            time.sleep(0.2)
        assert jobs and not _queue(jobs)
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)


@pytest.mark.parametrize("workers", [None, 2])
def test_the_progress_counts_partitions_not_tasks(cluster, tmp_path, monkeypatch, workers):
    """The bar's `partitions done / running / pending` counted array tasks (and the probe job):
    one task of 11 partitions showed as 2 pending partitions, then 1 running (here: one task of
    all `PARTITIONS`)."""
    from packtool.engines.slurm.arrays import ArrayDriver

    seen = []
    monkeypatch.setattr(ArrayDriver, "_progress", lambda self, *counts: seen.append(counts))
    slow = 'if [ "$PACKTOOL_SLURM_ROLE" = task ]; then sleep 1; fi'
    slurm = SlurmConfig(tasks_per_job=1 if workers else PARTITIONS, workers=workers, setup=slow)
    run_pack_slurm(_config(tmp_path / "packed"), replace(slurm, poll_seconds=0.3))
    assert seen
    for done, total, running, pending, _ in seen:
        assert total == PARTITIONS and done + running + pending == total, seen
        assert running <= (workers or 1), seen  # one partition at a time per task


@pytest.mark.parametrize("workers", [None, 1])
def test_a_resume_that_only_re_attached_says_so(cluster, local, tmp_path, workers):
    """A --resume that submitted nothing, only re-attached to a detached run's jobs, reported
    `Slurm: 0 array task(s)`."""
    out = tmp_path / "packed"
    slow = 'if [ "$PACKTOOL_SLURM_ROLE" = task ]; then sleep 3; fi'
    slurm = SlurmConfig(tasks_per_job=1 if workers else PARTITIONS, workers=workers, setup=slow)
    with pytest.raises(Detached):
        run_pack_slurm(_config(out), replace(slurm, wait=False))
    summary = run_pack_slurm(_config(out, resume=True), replace(slurm, poll_seconds=0.3))
    kind = "worker" if workers else "array"
    assert summary.cores_used.startswith(f"Slurm: re-attached to 1 {kind} task(s)"), summary
    _same_dataset(local, out)


def test_overwrite_of_a_slurm_run_where_slurm_commands_are_missing_stops(tmp_path, monkeypatch):
    """Without scancel and squeue on PATH, --overwrite of a run that submitted Slurm jobs went
    ahead: jobs it could neither cancel nor see end could write into the new run's folder."""
    from packtool.engines.slurm import state
    from packtool.engines.slurm.config import JOBS_DIR
    from packtool.errors import ConfigError
    from packtool.storage import local as storage

    out = tmp_path / "packed"
    staging = staging_folder(out)
    jobs = state.run_folders(staging, out)[0] / JOBS_DIR
    jobs.mkdir(parents=True)
    (jobs / "4242.json").write_text("{}")
    monkeypatch.setattr(storage, "which", lambda name: None)
    with pytest.raises(ConfigError) as stopped:
        run_pack(_config(out, overwrite=True))
    message = str(stopped.value)
    assert "4242" in message and str(staging) in message and "\n" not in message
    assert (jobs / "4242.json").exists()  # the old run's folder kept: nothing discarded
    assert not out.exists()


def test_a_resume_of_a_slurm_run_on_another_engine_where_scancel_is_missing_stops(
    tmp_path, monkeypatch
):
    """Resumed on the local engine where scancel is not on PATH, a Slurm run's jobs were
    neither cancelled nor mentioned (they could run partitions beside the local workers), and
    their record was removed when the run finished: one line now, nothing changed."""
    from types import SimpleNamespace

    from packtool.engines.slurm import arrays, state
    from packtool.engines.slurm.config import JOBS_DIR
    from packtool.errors import ConfigError
    from packtool.storage import local as storage

    out = tmp_path / "packed"
    staging = staging_folder(out)
    jobs = state.run_folders(staging, out)[0] / JOBS_DIR
    jobs.mkdir(parents=True)
    (jobs / "4243.json").write_text("{}")
    logs = logs_folder(out)
    logs.mkdir()
    monkeypatch.setattr(storage, "which", lambda name: None)
    run = SimpleNamespace(work=staging, out_dir=out)
    with pytest.raises(ConfigError) as stopped, arrays.taken_over(run):
        raise AssertionError("the run went ahead")
    message = str(stopped.value)
    assert message.startswith("--resume / resume=True: ") and "\n" not in message
    assert "4243" in message and "scancel" in message and str(jobs) in message
    assert (jobs / "4243.json").exists() and logs.exists()  # nothing changed


def test_the_jobs_of_a_run_load_in_submission_order(tmp_path):
    """Job files loaded sorted as names put job 9 after job 10: a resumed driver took an older
    probe job for the last one and submitted a probe it did not need (a reader's find)."""
    import json

    from packtool.engines.slurm.arrays import ArrayDriver
    from packtool.engines.slurm.config import JOBS_DIR

    driver = ArrayDriver.__new__(ArrayDriver)  # only its folder: no cluster asked
    driver.dir = tmp_path
    (tmp_path / JOBS_DIR).mkdir()
    for job in ("10", "9", "100", "11"):
        (tmp_path / JOBS_DIR / f"{job}.json").write_text(json.dumps({"array": "probe"}))
    assert list(driver._load_jobs()) == ["9", "10", "11", "100"]


def _answer_losing_sbatch(folder, log) -> None:
    """An `sbatch` in `folder` (put first on PATH) that queues each array's first submission
    with the cluster's sbatch, then answers what a busy controller answers when its reply is
    lost ("Socket timed out"); `log` gets a line per job queued."""
    import shutil

    real = shutil.which("sbatch")
    folder.mkdir()
    script = folder / "sbatch"
    script.write_text(
        "#!/bin/bash\n"
        'for a; do case "$a" in --output=*) log="$a";; esac; done\n'
        'mark="$(echo "$log" | md5sum | cut -c1-16)"\n'
        f'case "$*" in *--test-only*) exec {real} "$@";; esac\n'
        f'job=$({real} "$@") || exit $?\necho "$job" >> {log}\n'
        f'if [ ! -e {folder}/"$mark" ]; then touch {folder}/"$mark"\n'
        '  echo "sbatch: error: Batch job submission failed: Socket timed out on send/recv '
        'operation" >&2; exit 1\nfi\necho "$job"\n'
    )
    script.chmod(0o755)


def test_a_lost_sbatch_answer_neither_stops_the_run_nor_queues_the_job_twice(
    cluster, local, tmp_path, monkeypatch
):
    """Before: sbatch's "Socket timed out" (a busy controller) stopped the run, the job it had
    queued running on unrecorded. Now the queue is asked for the array's script and the job
    found there is the one recorded; nothing is submitted twice. Pull mode, six workers: two
    arrays (MaxArraySize 4) over one pool, whose shared script made the second array's retry
    take the first's job; fixed shares go through the same `submit_array` (test_commands.py)."""
    workers = 6
    import contextlib
    import os

    from packtool.engines.slurm import commands

    log = tmp_path / "queued.log"
    _answer_losing_sbatch(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(commands, "RETRY_SECONDS", (0.2, 0.2))
    out = tmp_path / "packed"
    slurm = SlurmConfig(poll_seconds=0.3, workers=workers, wait=False)
    with contextlib.suppress(Detached):  # detached: its jobs' records are read while it runs
        run_pack_slurm(_config(out), slurm)
    folder = staging_folder(out) / records.RUN_DIR / "slurm" / "jobs"
    recorded = sorted(p.stem for p in folder.glob("*.json"))
    queued = sorted(log.read_text().split())
    assert recorded == queued and len(queued) >= 2, (recorded, queued)
    run_pack_slurm(replace(_config(out), resume=True), replace(slurm, wait=True))
    _same_dataset(local, out)
    assert sorted(log.read_text().split()) == queued  # the resume had nothing to submit
