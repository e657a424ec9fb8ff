"""The Slurm engine on a real one-node Slurm cluster (scripts/slurm-test-cluster.sh: munged,
slurmctld and slurmd on this machine, MaxArraySize 4): the local engine's bytes, several
arrays, --no-wait then --resume, scancel then --resume, a task killed, a requeued task, a
partition that always fails, and the one-line errors."""

from __future__ import annotations

import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from packtool.dataset.shards import ShardConfig
from packtool.engines import records
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import staging_folder
from packtool.engines.slurm.driver import SlurmConfig, run_pack_slurm
from packtool.errors import ConfigError, DataError, Detached, WorkersLost
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from tests.cli import one_error_line, run

ROOT = Path(__file__).resolve().parents[4]
SAMPLE = ROOT / "sample_data" / "corpus.jsonl"
PARTITION_SIZE = 550_000
"""The sample corpus (3.1 MB) in `PARTITIONS` partitions: with one a task, two arrays of at most
MaxArraySize (4) tasks; six pull-mode workers are two arrays too. (300,000 made 11 partitions,
three arrays: five task starts more a run, each ~1.7 s of CPU for the interpreter, the imports
and the kernels' load, on the two cores every test shares.)"""
PARTITIONS = 6


@pytest.fixture(scope="module")
def cluster(slurm_cluster):
    return slurm_cluster


def _config(out: Path, **kw) -> RunConfig:
    return RunConfig(
        inputs=(str(SAMPLE),),
        out_dir=str(out),
        pack=PackConfig(max_len=1024),
        shards=ShardConfig(shard_rows=200),
        partition_size=PARTITION_SIZE,  # PARTITIONS partitions: two arrays of at most 4 tasks
        progress=False,
        **kw,
    )


def _same_dataset(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for name in names:
        if name != "index.json":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name

    def strip(p):
        lines = (p / "index.json").read_text().splitlines()
        return [ln for ln in lines if '"command"' not in ln]

    assert strip(a) == strip(b)


def _queue(jobs) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "-r", "-j", ",".join(jobs), "-o", "%i"], capture_output=True, text=True
    )
    return out.stdout.split()


def _wait_queue_empty(jobs, timeout=120) -> None:
    end = time.time() + timeout
    while _queue(jobs) and time.time() < end:
        time.sleep(0.3)


def _named_in_queue(name: str, timeout: float = 30) -> str:
    """The queue's jobs named `name`, once none is left or `timeout` has passed: scancel is
    asynchronous, and a killed task shows as completing (CG) for a moment."""
    end = time.time() + timeout
    while True:
        out = subprocess.run(["squeue", "-h", "-n", name], capture_output=True, text=True)
        if not out.stdout.strip() or time.time() > end:
            return out.stdout.strip()
        time.sleep(0.3)


def _requeue_now(key: str) -> None:
    """`scontrol requeue` a task and let it start again at once: Slurm holds a requeued job back
    (its begin time ~2 minutes on), so once it is pending again its start time is set to now."""
    subprocess.run(["scontrol", "requeue", key], capture_output=True)
    end = time.time() + 10
    while time.time() < end:
        state = subprocess.run(
            ["squeue", "-h", "-j", key, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if state in ("PENDING", ""):
            break
        time.sleep(0.05)
    subprocess.run(["scontrol", "update", f"JobId={key}", "StartTime=now"], capture_output=True)


@pytest.fixture(scope="module")
def odd_path_run(cluster, tmp_path_factory):
    """One Slurm run of `_config` (one partition a task, several arrays) into a folder whose
    path holds quotes, `$(...)`, backquotes and `%j`: (the run's own tmp folder, the output,
    the summary). Two tests read it: the bytes and arrays, and the path taken as it is."""
    root = tmp_path_factory.mktemp("odd-path")
    out = root / 'run_%j "q" $(touch PWNED) `touch PWNED2`' / "packed"
    return root, out, run_pack_slurm(_config(out), SlurmConfig(poll_seconds=0.3))


def test_slurm_writes_the_local_bytes_in_several_arrays(odd_path_run, local):
    from packtool.engines.slurm.commands import max_array_size

    _, out, summary = odd_path_run
    _same_dataset(local, out)
    assert summary.partitions == PARTITIONS
    assert f"{PARTITIONS} array task(s)" in summary.cores_used
    assert max_array_size() < PARTITIONS  # so the tasks went in several arrays
    assert not staging_folder(out).exists()


def test_tokenize_to_megatron_writes_the_local_pair_and_resumes_detached_jobs(cluster, tmp_path):
    from packtool.engines.megatron.run import tokenize_megatron

    tokenize_megatron([SAMPLE], tmp_path / "local", partition_size=PARTITION_SIZE, progress=False)
    prefix = tmp_path / "slurm"
    code, out, err = run(
        "tokenize", SAMPLE, "--to", "megatron", "-o", prefix, "--partition-size", PARTITION_SIZE,
        "--engine", "slurm", "--tasks-per-job", "3", "--no-wait",
    )  # fmt: skip
    assert code == 0 and "--resume" in out, err
    summary = tokenize_megatron(
        [SAMPLE],
        prefix,
        partition_size=PARTITION_SIZE,
        resume=True,
        engine="slurm",
        engine_config=SlurmConfig(tasks_per_job=3, poll_seconds=0.3),
        progress=False,
    )
    assert summary.partitions == PARTITIONS
    assert "array task(s) of 3 partition(s)" in summary.engine
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"slurm{suffix}").read_bytes() == (
            tmp_path / f"local{suffix}"
        ).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["local.bin", "local.idx", "slurm.bin", "slurm.idx"]
        + [".local.idx.packtool.json", ".slurm.idx.packtool.json"]  # the runs' records
    )  # no staging folder, no task logs


def test_tasks_per_job_and_no_wait_then_resume(cluster, local, tmp_path):
    out = tmp_path / "packed"
    with pytest.raises(Detached) as gone:
        run_pack_slurm(_config(out), SlurmConfig(tasks_per_job=3, wait=False))
    jobs = gone.value.job_ids
    assert jobs and "--resume" in str(gone.value)
    assert staging_folder(out).exists() and not out.exists()  # the jobs write into the staging
    # The driver comes back (re-attaching to the jobs still queued) and finishes.
    summary = run_pack_slurm(
        _config(out, resume=True), SlurmConfig(tasks_per_job=3, poll_seconds=0.3)
    )
    _same_dataset(local, out)
    assert summary.partitions == PARTITIONS
    _wait_queue_empty(jobs, timeout=30)  # what was left is cancelled (scancel is asynchronous)
    assert not _queue(jobs)


def test_a_slurm_run_finished_by_the_local_engine_leaves_no_job_and_no_logs(
    cluster, local, tmp_path
):
    """The docs say a killed driver is resumed by either engine: the local one finished the
    dataset but left the dead driver's array tasks queued (they then failed on the removed run
    folder) and its logs folder beside the output for good."""
    from packtool.engines.slurm.state import logs_folder

    out = tmp_path / "packed"
    with pytest.raises(Detached) as gone:
        run_pack_slurm(_config(out), SlurmConfig(tasks_per_job=3, wait=False))
    jobs = gone.value.job_ids
    assert _queue(jobs) and logs_folder(out).exists()
    run_pack(_config(out, resume=True))
    _same_dataset(local, out)
    _wait_queue_empty(jobs, timeout=30)  # scancel is asynchronous
    assert not _queue(jobs)
    assert not logs_folder(out).exists()


def test_scancel_then_resume_runs_only_what_is_left(cluster, local, tmp_path):
    out = tmp_path / "packed"
    # Only the first task to start runs; the others wait for a gate never opened, until the
    # scancel. (Without it, on a machine of as many cores as tasks every task ran at once and all
    # could finish before the scancel came.)
    first, gate = tmp_path / "first", tmp_path / "gate"
    setup = (
        f'if [ "$PACKTOOL_SLURM_ROLE" = task ] && ! mkdir {first} 2>/dev/null; then '
        f"until [ -e {gate} ]; do sleep 0.05; done; fi"
    )
    with pytest.raises(Detached) as gone:
        run_pack_slurm(_config(out), SlurmConfig(wait=False, setup=setup))
    jobs = gone.value.job_ids
    work = staging_folder(out)
    end = time.time() + 60
    while not records.finished(work) and time.time() < end:
        time.sleep(0.2)
    subprocess.run(["scancel", *jobs], check=True)
    _wait_queue_empty(jobs)
    kept = set(records.finished(work))
    assert 0 < len(kept) < PARTITIONS  # the first task's partitions finished, the rest cancelled
    code, stdout, err = run(
        "pack",
        SAMPLE,
        "-o",
        out,
        "--max-len",
        "1024",
        "--shard-rows",
        "200",
        "--partition-size",
        PARTITION_SIZE,
        "--engine",
        "slurm",
        "--resume",
    )
    assert code == 0, err
    assert f"resumed {len(kept)}" in stdout or "resumed" in stdout
    _same_dataset(local, out)


def test_a_task_killed_mid_partition_and_a_requeued_one_are_run_again(
    cluster, local_small, tmp_path
):
    # Small chunks and row groups (`_small`): a partition writes its shard over many steps, so
    # the hidden temporary shard exists for most of its time.
    config = _small
    out = tmp_path / "packed"
    mark = tmp_path / "killed-once"
    work = staging_folder(out)
    # The first task to start: a watcher SIGKILLs its Python (the shell exec's it: same pid) as
    # soon as it writes a shard, i.e. in the middle of a partition.
    setup = _killer(mark, work)
    with pytest.raises(Detached) as gone:
        run_pack_slurm(
            config(out), SlurmConfig(setup=setup, wait=False, sbatch_args=("--requeue",))
        )
    jobs = gone.value.job_ids
    # The kill first (a requeue of the watched task before it would stop the watcher: under
    # load a task can take more than a second to reach its first shard).
    end = time.time() + 60
    while not (mark / "fired").exists() and time.time() < end:
        time.sleep(0.05)
    live = [key for key in _queue(jobs) if "_" in key]
    if live:  # requeue a task that is queued or running: it runs again, skipping what is done
        _requeue_now(live[-1])
    summary = run_pack_slurm(config(out, resume=True), SlurmConfig(setup=setup, poll_seconds=0.3))
    assert (mark / "fired").exists()  # the kill came while a shard was being written
    _same_dataset(local_small, out)  # no half-written shard survived, none is missing
    assert summary.partitions == PARTITIONS


def test_a_partition_that_always_fails_stops_the_run_naming_its_log(cluster, tmp_path):
    out = tmp_path / "packed"
    with pytest.raises(WorkersLost) as failed:
        run_pack_slurm(
            _config(out),
            SlurmConfig(
                setup='[ "$PACKTOOL_SLURM_ROLE" = task ] && exit 7', max_retries=1, poll_seconds=0.3
            ),
        )
    message = str(failed.value)
    assert "ended without a record 2 times in Slurm" in message and ".log" in message
    assert "\n" not in message
    log = Path(message.split("last task log: ")[1].split(".log")[0] + ".log")
    assert log.exists()
    assert not subprocess.run(
        ["squeue", "-h", "-n", "packtool-packed"], capture_output=True, text=True
    ).stdout.strip()


@pytest.mark.parametrize("workers", [None, 2])
def test_a_packtool_error_in_a_task_stops_the_run_as_itself_not_retried(cluster, tmp_path, workers):
    """A bad document under --strict fails the same way on every attempt. Before: the task's
    partition was resubmitted max_retries (3) times, then WorkersLost named a log instead of
    the line at fault; the local and Ray engines raise the error itself at once."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    lines = SAMPLE.read_text().splitlines(keepends=True)
    (corpus / "a.jsonl").write_text("".join(lines[:50]))
    (corpus / "b.jsonl").write_text("".join(lines[200:300]) + "{not json\n")
    out = tmp_path / "packed"
    # 3 partitions (a.jsonl; b.jsonl in two pieces), the bad document in the last one
    config = replace(
        _config(out), inputs=(str(corpus),), read=ReadConfig(strict=True), partition_size=50_000
    )
    started = time.monotonic()
    with pytest.raises(DataError) as failed:
        run_pack_slurm(config, SlurmConfig(workers=workers, poll_seconds=0.3))
    assert type(failed.value) is DataError, failed.value  # not WorkersLost after retries
    bad = f"b.jsonl:byte {len(''.join(lines[200:300]).encode())}: malformed json"
    assert bad in str(failed.value) and "\n" not in str(failed.value)
    assert time.monotonic() - started < 60
    assert not _named_in_queue("packtool-packed")
    assert not staging_folder(out).exists()  # as the local engine leaves a failed run


@pytest.mark.parametrize("workers", [None, 2])
def test_ctrl_c_while_sbatch_runs_leaves_no_job_in_the_queue(
    cluster, tmp_path, monkeypatch, workers
):
    """Before: a Ctrl-C that landed while sbatch ran (it had queued the job) came out before
    the driver recorded the job, so the cancel of the stopped run missed it and it ran on."""
    import os
    import signal

    from packtool.engines.slurm import commands

    real = commands.submit_array
    submitted = []

    def interrupted(options, tasks, script, record):
        def ctrl_c_then_record(job):
            if not script.endswith("probe.sh"):  # the first array of partitions (or workers)
                submitted.append(job)
                os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C as sbatch returns, before the record
            record(job)

        return real(options, tasks, script, ctrl_c_then_record)

    monkeypatch.setattr(commands, "submit_array", interrupted)
    out = tmp_path / "packed"
    with pytest.raises(KeyboardInterrupt):
        run_pack_slurm(_config(out), SlurmConfig(workers=workers, poll_seconds=0.3))
    assert len(submitted) == 1  # the Ctrl-C stopped the run after that submit
    # Every task of the job was cancelled (squeue -t all shows ended jobs for MinJobAge).
    end = time.time() + 10
    while True:
        states = subprocess.run(
            ["squeue", "-h", "-r", "-t", "all", "-j", submitted[0], "-o", "%T"],
            capture_output=True,
            text=True,
        ).stdout.split()
        if (states and set(states) == {"CANCELLED"}) or time.time() > end:
            break
        time.sleep(0.2)
    assert states and set(states) == {"CANCELLED"}, states


def test_the_one_line_errors(cluster, tmp_path, monkeypatch):
    code, _, err = run(
        "pack", SAMPLE, "-o", tmp_path / "a", "--engine", "slurm", "--slurm-partition", "nosuch"
    )
    assert code != 0
    line = one_error_line(err)
    assert "sbatch (--test-only) refused" in line and "partition" in line.lower()
    code, _, err = run("pack", SAMPLE, "-o", tmp_path / "b", "--slurm-partition", "debug")
    assert code != 0 and "--slurm-partition needs --engine slurm" in one_error_line(err)
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="no sbatch on PATH"):
        run_pack_slurm(_config(tmp_path / "c"))
    assert shutil.which("sbatch") is None
    assert not (tmp_path / "a").exists() and not (tmp_path / "c").exists()


@pytest.mark.parametrize(
    ("given", "shown", "why"),
    [(["--sbatch-arg=--constraint=nosuch"], "--constraint=nosuch", "Invalid feature"),
     (["--sbatch-arg", "--exclusive", "--sbatch-arg", "--nodelist", "--sbatch-arg", "nosuch"],
      "--nodelist nosuch", "node"),
     (["--sbatch-arg=--exclude node1"], "'--exclude node1'", "unrecognized option")],
)  # fmt: skip
def test_an_sbatch_arg_slurm_refuses_is_named_in_one_line(cluster, tmp_path, given, shown, why):
    """sbatch's refusal alone ("allocation failure: Invalid feature specification") named no
    --sbatch-arg: the one whose addition makes sbatch refuse is named now, its value with it
    (`--nodelist nosuch`), quoted as a shell would need it."""
    code, _, err = run("pack", SAMPLE, "-o", tmp_path / "a", "--engine", "slurm",
                       "--sbatch-arg=--requeue", *given)  # fmt: skip
    assert code != 0
    line = one_error_line(err)
    assert f"sbatch (--test-only) refused {shown} in --sbatch-arg / sbatch_args: " in line, line
    assert why in line, line
    assert not (tmp_path / "a").exists()


def test_sbatch_args_reach_sbatch_as_given(cluster, tmp_path):
    """`--sbatch-arg --exclusive` (a value that is an sbatch option, given apart) and a value with
    spaces, quotes, `$` and `;` reach sbatch as one argument each, as given (no shell between):
    the job's comment reads back whole, `--exclusive` holds, and the printed command that
    finishes the run gives the value back as it was."""
    import re
    import shlex

    comment = "a b 'c' \"d\" $HOME;x"
    code, out, err = run("pack", SAMPLE, "-o", tmp_path / "packed", "--engine", "slurm",
                         "--no-wait", "--sbatch-arg", "--exclusive",
                         f"--sbatch-arg=--comment={comment}")  # fmt: skip
    assert code == 0, err
    jobs = re.search(r"job\(s\) ([\d, ]+)\)", out).group(1).split(", ")
    try:
        for job in jobs:
            shown = subprocess.run(
                ["scontrol", "show", "job", job], capture_output=True, text=True
            ).stdout
            assert f"Comment={comment} " in shown or f"Comment={comment}\n" in shown, shown
            assert "OverSubscribe=NO" in shown, shown
        finish = shlex.split(re.search(r"`([^`]*)` waits", out).group(1))
        assert f"--sbatch-arg=--comment={comment}" in finish
        assert finish[finish.index("--exclusive") - 1] == "--sbatch-arg"
    finally:
        subprocess.run(["scancel", *jobs], capture_output=True)


def test_nodes_that_cannot_see_the_output_stop_the_run_before_any_partition(
    cluster, tmp_path, monkeypatch
):
    from packtool.engines.slurm.arrays import ArrayDriver

    real_init = ArrayDriver.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        # What a node without the shared mount sees: no such folder (the probe looks for it).
        self.probe_target = tmp_path / "not-mounted-on-the-nodes"

    monkeypatch.setattr(ArrayDriver, "__init__", init)
    out = tmp_path / "packed"
    with pytest.raises(ConfigError, match="cannot see the run's folder") as failed:
        run_pack_slurm(_config(out), SlurmConfig(poll_seconds=0.3))
    assert "\n" not in str(failed.value) and "not-mounted-on-the-nodes" in str(failed.value)
    assert not staging_folder(out).exists()  # a mistake: nothing kept, nothing ran
    assert not subprocess.run(
        ["squeue", "-h", "-n", "packtool-packed"], capture_output=True, text=True
    ).stdout.strip()


def test_the_driver_killed_while_jobs_run_is_resumed(cluster, local, tmp_path):
    import os
    import signal
    import sys

    out = tmp_path / "packed"
    args = ["pack", str(SAMPLE), "-o", str(out), "--max-len", "1024", "--shard-rows", "200",
            "--partition-size", str(PARTITION_SIZE), "--engine", "slurm"]  # fmt: skip
    # Only the first task runs until the gate opens, so the driver dies with work left to do
    # on any machine (else all could finish first, and the resume would prove nothing).
    first, gate = tmp_path / "first", tmp_path / "gate"
    setup = (
        f'if [ "$PACKTOOL_SLURM_ROLE" = task ] && ! mkdir {first} 2>/dev/null; then '
        f"until [ -e {gate} ]; do sleep 0.05; done; fi"
    )
    cmd = [sys.executable, "-m", "packtool.cli.commands", *args, "--slurm-setup", setup]
    driver = subprocess.Popen(cmd, cwd=ROOT)
    work = staging_folder(out)
    end = time.time() + 60
    while not records.finished(work) and time.time() < end:
        time.sleep(0.2)
    os.kill(driver.pid, signal.SIGKILL)  # no chance to cancel its jobs
    driver.wait()
    assert 0 < len(records.finished(work)) < PARTITIONS
    gate.touch()  # the jobs it left run on; the resumed driver re-attaches to them
    code, stdout, err = run(*args, "--resume")
    assert code == 0, err
    _same_dataset(local, out)


def _refusing_squeue(folder: Path, flag: Path, once: bool) -> None:
    """A `squeue` in `folder` (put first on PATH) that answers what a busy controller answers
    while `flag` exists (and removes it: `once`), else the cluster's own squeue's answer."""
    real = shutil.which("squeue")
    folder.mkdir()
    script = folder / "squeue"
    script.write_text(
        "#!/bin/bash\n"
        f"if [ -e {flag} ]; then {'rm -f ' + str(flag) + '; ' if once else ''}"
        'echo "slurm_load_jobs error: Socket timed out on send/recv operation" >&2; exit 1; fi\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)


@pytest.mark.parametrize("once", [True, False])
def test_a_refusing_squeue_mid_run_never_costs_the_finished_partitions(
    cluster, local, tmp_path, monkeypatch, once
):
    """Before: one refused squeue (a busy controller's "Socket timed out") was a ConfigError, so
    the failed run removed its staging folder with every finished partition. Now squeue is
    asked again; a refusal that lasts stops the run keeping them for --resume."""
    import os
    import threading

    from packtool.engines.slurm import commands

    flag, first, gate = tmp_path / "refuse", tmp_path / "first", tmp_path / "gate"
    _refusing_squeue(tmp_path / "bin", flag, once)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(commands, "RETRY_SECONDS", (0.2, 0.2))
    out = tmp_path / "packed"
    work = staging_folder(out)
    setup = (  # one task runs; the others wait for the gate (opened after the refusal)
        f'if [ "$PACKTOOL_SLURM_ROLE" = task ] && ! mkdir {first} 2>/dev/null; then '
        f"until [ -e {gate} ]; do sleep 0.05; done; fi"
    )

    def refuse_once_a_partition_finished():
        end = time.time() + 60
        while not records.finished(work) and time.time() < end:
            time.sleep(0.1)
        flag.touch()
        if once:  # the run goes on: the others may run now
            gate.touch()

    threading.Thread(target=refuse_once_a_partition_finished, daemon=True).start()
    config = SlurmConfig(poll_seconds=0.3, setup=setup)
    if once:
        run_pack_slurm(_config(out), config)
        assert not flag.exists()  # it was refused, and asked again
        _same_dataset(local, out)
        return
    with pytest.raises(WorkersLost) as stopped:
        run_pack_slurm(_config(out), config)
    line = str(stopped.value)
    assert "squeue refused: slurm_load_jobs error: Socket timed out" in line, line
    assert "finished partition(s) are kept: rerun with --resume / resume=True" in line, line
    assert records.finished(work)
    flag.unlink()
    gate.touch()
    run_pack_slurm(replace(_config(out), resume=True), SlurmConfig(poll_seconds=0.3))
    _same_dataset(local, out)


def test_an_output_path_with_quotes_dollars_and_percents_is_taken_as_it_is(odd_path_run, local):
    """Before: the probe script put the folder raw inside double quotes (a `"` in it broke the
    script, `$(...)` ran), and sbatch read a `%j` in the logs' path as the job id. (The run is
    `odd_path_run`'s, which test_slurm_writes_the_local_bytes_in_several_arrays reads too.)"""
    root, out, _ = odd_path_run
    _same_dataset(local, out)
    assert not list(root.rglob("PWNED*")) and not list(ROOT.glob("PWNED*"))
    assert sorted(p.name for p in root.iterdir()) == [out.parent.name]


# --- pull mode (--slurm-workers): long-lived workers take the partitions in turn ---


def test_workers_take_the_partitions_in_turn_and_write_the_local_bytes(cluster, local, tmp_path):
    out = tmp_path / "packed"
    code, stdout, err = run(
        "pack", SAMPLE, "-o", out, "--max-len", "1024", "--shard-rows", "200",
        "--partition-size", PARTITION_SIZE, "--engine", "slurm", "--slurm-workers", "2",
    )  # fmt: skip
    assert code == 0, err
    assert "2 worker task(s) taking partitions in turn" in stdout
    _same_dataset(local, out)
    assert not staging_folder(out).exists()
    code, _, err = run(
        "pack", SAMPLE, "-o", tmp_path / "x", "--engine", "slurm", "--slurm-workers", "2",
        "--tasks-per-job", "2",
    )  # fmt: skip
    assert code != 0 and "exclude each other" in one_error_line(err)


def _killer(mark: Path, work: Path) -> str:
    """A setup line that SIGKILLs the first worker to start while it writes a shard of its own
    (mid-partition): the temporary shard's name holds its writer's pid, which is the task
    shell's (`$$`: the shell exec's Python), so another task's shard does not set it off."""
    return (
        f'if [ "$PACKTOOL_SLURM_ROLE" = task ] && mkdir {mark} 2>/dev/null; then '
        f"(until ls {work}/.shard-*.$$-*.tmp >/dev/null 2>&1; do kill -0 $$ || exit 0; "
        f"sleep 0.005; done; touch {mark}/fired; kill -9 $$) & fi"
    )


def _small(out: Path, **kw) -> RunConfig:
    # Small chunks and row groups: a partition writes its shard over many steps.
    return replace(
        _config(out, chunk_docs=20, **kw), shards=ShardConfig(shard_rows=200, row_group_rows=4)
    )


def test_a_worker_killed_mid_partition_a_requeued_one_and_no_wait_then_resume(
    cluster, local_small, tmp_path
):
    out = tmp_path / "packed"
    mark = tmp_path / "killed-once"
    setup = _killer(mark, staging_folder(out))
    slurm = SlurmConfig(workers=2, setup=setup, sbatch_args=("--requeue",), poll_seconds=0.3)
    with pytest.raises(Detached) as gone:
        run_pack_slurm(_small(out), replace(slurm, wait=False))
    jobs = gone.value.job_ids
    end = time.time() + 60
    while not (mark / "fired").exists() and time.time() < end:
        time.sleep(0.05)
    live = [key for key in _queue(jobs) if "_" in key]
    if live:  # requeue a worker: it comes back, takes its own claims back first, goes on
        _requeue_now(live[-1])
    summary = run_pack_slurm(_small(out, resume=True), slurm)
    assert (mark / "fired").exists()  # a worker was killed while it wrote a shard
    _same_dataset(local_small, out)
    assert summary.partitions == PARTITIONS


def test_a_partition_whose_worker_always_dies_stops_the_run_naming_its_log(cluster, tmp_path):
    out = tmp_path / "packed"
    claims = staging_folder(out) / records.RUN_DIR / "slurm" / "claims"
    # Every worker is SIGKILLed as soon as its first claim is seen: inside that partition, whose
    # first steps in a fresh process (tokenizer, kernels: 0.6 s on this box) outlast the 5 ms
    # poll. A fixed delay after the claim raced a fast machine, whose worker finished a partition
    # or more before it died, so no partition failed twice.
    setup = (
        '[ "$PACKTOOL_SLURM_ROLE" = task ] && (key="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"; '
        f'until grep -qsx "$key" {claims}/*; do kill -0 $$ || exit 0; sleep 0.005; done; '
        "kill -9 $$) &"
    )
    with pytest.raises(WorkersLost) as failed:
        run_pack_slurm(
            _small(out), SlurmConfig(workers=2, setup=setup, max_retries=1, poll_seconds=0.3)
        )
    message = str(failed.value)
    assert "ended without a record 2 times in Slurm" in message and ".log" in message
    assert "\n" not in message
    assert not _named_in_queue("packtool-packed")


def test_workers_that_never_start_a_partition_stop_the_run(cluster, tmp_path):
    out = tmp_path / "packed"
    with pytest.raises(WorkersLost) as failed:
        run_pack_slurm(
            _config(out),
            SlurmConfig(
                workers=2,
                setup='[ "$PACKTOOL_SLURM_ROLE" = task ] && exit 7',
                max_retries=1,
                poll_seconds=0.3,
            ),
        )
    message = str(failed.value)
    assert "Slurm workers ended 2 times without finishing a partition" in message
    assert "no partition had finished" in message and ".log" in message
    assert not _named_in_queue("packtool-packed")


def test_the_command_no_wait_prints_finishes_the_run(cluster, local, tmp_path, monkeypatch):
    # It kept --overwrite (refused with --resume) and --no-wait (it waited for nothing and
    # printed "the run goes on there" with nothing queued), and added a --resume each time.
    import shlex
    import sys

    out = tmp_path / "packed"
    out.mkdir()
    args = [
        "pack", SAMPLE, "-o", out, "--max-len", "1024", "--shard-rows", "200",
        "--partition-size", PARTITION_SIZE, "--engine", "slurm", "--overwrite", "--no-wait",
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", ["packtool", *map(str, args)])
    code, text, err = run(*args)
    assert code == 0, err
    printed = (text + err).split("`")[1]
    assert printed.endswith(" --resume") and printed.count("--resume") == 1
    assert "--overwrite" not in printed and "--no-wait" not in printed
    again = shlex.split(printed)[1:]
    monkeypatch.setattr(sys, "argv", ["packtool", *again])
    code, _, err = run(*again)
    assert code == 0, err
    _same_dataset(local, out)


@pytest.mark.parametrize("workers", [None, 2])
def test_no_wait_with_nothing_left_to_run_finishes_the_run(cluster, local, tmp_path, workers):
    """Pull mode (`--slurm-workers`) printed "submitted 0 partition(s)" at every --no-wait
    --resume once every partition had its record, and never finished (the engines audit)."""
    out = tmp_path / "packed"
    # Fixed shares of 3 partitions (two tasks), else two workers: what is left is none either way
    share = 1 if workers else 3
    with pytest.raises(Detached):
        run_pack_slurm(_config(out), SlurmConfig(wait=False, workers=workers, tasks_per_job=share))
    staging = staging_folder(out)
    deadline = time.monotonic() + 120
    while len(records.finished(staging)) < PARTITIONS and time.monotonic() < deadline:
        time.sleep(0.3)  # every partition's record: the jobs are done
    again = SlurmConfig(wait=False, poll_seconds=0.3, workers=workers, tasks_per_job=share)
    run_pack_slurm(_config(out, resume=True), again)
    _same_dataset(local, out)  # finished, not "submitted 0 partition(s) ... goes on there"


def test_a_context_left_in_the_staging_folder_is_replaced_before_the_first_submit(tmp_path):
    """Every array task unpickles `context.pkl`; the driver wrote it only when none was there,
    so one planted in the staging folder before a --resume ran its code on every node. No
    cluster needed: the driver's writer alone, on an object made without its Slurm set-up."""
    import pickle

    from packtool.engines.slurm.arrays import ArrayDriver

    arrays = object.__new__(ArrayDriver)
    arrays.dir = tmp_path
    arrays.run = type("Run", (), {"context": {"the": "run's own"}})()
    (tmp_path / "context.pkl").write_bytes(pickle.dumps("planted"))
    arrays._write_context()
    assert pickle.loads((tmp_path / "context.pkl").read_bytes()) == {"the": "run's own"}


def test_a_probe_cancelled_before_it_ran_is_submitted_again_at_resume(cluster, local, tmp_path):
    """Ctrl-C while the probe waits in the queue: the driver cancels every job it submitted,
    the probe included, and every `--resume` then failed on that cancelled probe ("the probe
    job ... failed before any partition ran"; the engines audit). A probe that ended without
    its mark is not reused: a new one decides."""
    out = tmp_path / "packed"
    # (Three partitions a task: the probe is what is tested, two tasks run the partitions.)
    later = SlurmConfig(wait=False, tasks_per_job=3, sbatch_args=("--begin=now+300",))
    with pytest.raises(Detached):  # queued, not started
        run_pack_slurm(_config(out), later)
    # What the driver's Ctrl-C does: every job it submitted cancelled, the probe's too.
    subprocess.run(["scancel", "--name", "packtool-packed"], capture_output=True)
    assert not _named_in_queue("packtool-packed")
    run_pack_slurm(_config(out, resume=True), SlurmConfig(tasks_per_job=3, poll_seconds=0.3))
    _same_dataset(local, out)
    assert not _named_in_queue("packtool-packed")


@pytest.mark.parametrize("to", [(), ("--to", "megatron")])
def test_workers_with_the_slurm_engine_is_refused_not_ignored(tmp_path, to):
    """`--engine slurm --workers 1` ran its 8 array tasks as if the option were not there (the
    engines audit): it counts this machine's processes, which a Slurm run does not use."""
    command = "tokenize" if to else "pack"
    out = tmp_path / "out"
    code, _, err = run(command, SAMPLE, "-o", out, *to, "--engine", "slurm", "--workers", "1")
    assert code == 1
    assert one_error_line(err) == (
        "error: --workers counts this machine's worker processes (or Ray's actors); with "
        "--engine slurm the work runs in Slurm tasks: pass --slurm-workers N (pull mode) or "
        "--cpus-per-task N instead"
    )
    assert not out.exists()


def test_a_setup_line_that_ends_the_probes_shell_is_named_in_the_one_line(cluster, tmp_path):
    """`--slurm-setup 'exit 3'` ends the probe job's shell before its checks: the probe's log
    was empty, and the line said only "the probe job failed before any partition ran (log:
    ...)" (until 2026-12-08)."""
    out = tmp_path / "packed"
    with pytest.raises(ConfigError) as failed:
        run_pack_slurm(_config(out), SlurmConfig(setup="exit 3", poll_seconds=0.3))
    message = str(failed.value)
    assert "the probe job" in message and "\n" not in message
    assert message.endswith(
        "probe.log: packtool-slurm: the setup line ended the job's shell (exit status 3) before "
        "packtool ran)"
    ), message
