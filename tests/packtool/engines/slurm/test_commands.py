"""What the Slurm engine asks of Slurm's commands (packtool/engines/slurm/commands.py), with
fake `sbatch` and `squeue` scripts first on PATH: no cluster needed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.driver import SlurmConfig, slurm_options
from packtool.errors import ConfigError


def _fake(folder: Path, name: str, body: str) -> Path:
    """A fake Slurm command `name` in `folder`: it logs its arguments, then runs `body`."""
    folder.mkdir(exist_ok=True)
    script = folder / name
    script.write_text(f'#!/bin/bash\necho "$@" >> {folder / (name + ".args")}\n{body}\n')
    script.chmod(0o755)
    return folder / (name + ".args")


@pytest.fixture
def fake_bin(tmp_path, monkeypatch):
    folder = tmp_path / "bin"
    folder.mkdir()
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("SBATCH_CLUSTERS", raising=False)
    return folder


def test_a_refusal_quotes_the_error_not_the_warning_before_it(fake_bin):
    """sbatch prints its warnings first: the refusal quoted `sbatch: warning: ...`, not why."""
    _fake(
        fake_bin,
        "sbatch",
        "echo 'sbatch: warning: can not honor --mem-per-cpu with --mem' >&2\n"
        "echo 'sbatch: error: Batch job submission failed: Invalid account or account/partition "
        "combination specified' >&2\nexit 1",
    )
    with pytest.raises(cli.SlurmRefused) as refused:
        cli.test_only(["--account=nosuch"])
    assert str(refused.value) == (
        "--engine slurm / engine='slurm': sbatch (--test-only) refused: sbatch: error: Batch job submission "
        "failed: Invalid account or account/partition combination specified"
    )
    _fake(fake_bin, "sbatch", "echo '' >&2; echo 'no such thing' >&2; exit 2")
    with pytest.raises(cli.SlurmRefused, match=r"refused: no such thing$"):
        cli.test_only([])
    _fake(fake_bin, "sbatch", "exit 2")
    with pytest.raises(cli.SlurmRefused, match=r"refused: exit 2$"):
        cli.test_only([])


def test_squeue_asks_for_every_partition_and_special_exit_is_live(fake_bin):
    """squeue without --all leaves out the jobs of partitions hidden from the user (each such
    task counted gone, its partitions resubmitted); SPECIAL_EXIT, held as REQUEUE_HOLD is,
    counted gone too, so a released task ran its partitions beside their resubmission."""
    args = _fake(fake_bin, "squeue", "printf '7_0 SPECIAL_EXIT\\n7_1 RUNNING\\n7_2 COMPLETED\\n'")
    assert cli.live_tasks(["7"]) == {"7_0": "SPECIAL_EXIT", "7_1": "RUNNING"}
    assert args.read_text().split()[:1] == ["--all"]


@pytest.mark.parametrize(
    "given",
    [("--clusters=gpu",), ("--clusters", "gpu"), ("-M", "gpu"), ("-Mgpu",), ("--cluster=gpu",),
     ("-vMgpu",), "env"],
)  # fmt: skip
def test_sbatch_args_naming_another_cluster_are_refused_before_any_work(
    fake_bin, tmp_path, monkeypatch, given
):
    """`--sbatch-arg=--clusters=gpu`: sbatch answered `4567;gpu`, the driver kept `4567` and
    asked squeue and scancel of this cluster, where the job is not: every task looked gone,
    was resubmitted, and the run failed with its jobs still queued there. One line now, before
    sbatch is asked anything."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    if given == "env":
        monkeypatch.setenv("SBATCH_CLUSTERS", "gpu")
        given = ()
    with pytest.raises(ConfigError) as refused:
        slurm_options(SlurmConfig(sbatch_args=tuple(given)), tmp_path / "out")
    line = str(refused.value)
    assert "another Slurm cluster" in line and "gpu" in line and "\n" not in line, line
    assert not args.exists()  # nothing submitted, not even --test-only


def test_a_cluster_constraint_is_no_other_cluster(fake_bin, tmp_path):
    args = _fake(fake_bin, "sbatch", "exit 0")
    slurm_options(SlurmConfig(sbatch_args=("--cluster-constraint=a",)), tmp_path / "out")
    assert "--test-only" in args.read_text()


@pytest.mark.parametrize(
    "given",
    [("--array=0",), ("--array", "0-3"), ("-a", "0"), ("-a0",), ("--arr=0",), ("--output=x",),
     ("-o", "x"), ("-vo", "x"), ("--out", "x"), ("--error=x",), ("-e", "x"), ("--wrap=true",),
     ("--dependency=afterok:1",), ("-d", "afterok:1"), ("--dep=afterok:1",), ("--test-only",),
     ("--wait",), ("-W",), "SBATCH_ERROR", "SBATCH_WAIT"],
)  # fmt: skip
def test_sbatch_options_that_are_the_drivers_own_are_refused_before_any_work(
    fake_bin, tmp_path, monkeypatch, given
):
    """`--sbatch-arg=--array=0` came after the driver's own `--array` on sbatch's line and won:
    one task ran of each array, the others counted lost, and the run failed naming a log of no
    use. Its logs (`--output`, `--error`), its script (`--wrap`), the order of its jobs after
    the probe (`--dependency`), `--test-only` and `--wait` are the driver's too (short forms,
    bundles and sbatch's abbreviations as sbatch reads them): one line, nothing asked."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    if isinstance(given, str):
        monkeypatch.setenv(given, "/tmp/x" if given == "SBATCH_ERROR" else "1")
        given = ()
    with pytest.raises(ConfigError) as refused:
        slurm_options(SlurmConfig(sbatch_args=tuple(given)), tmp_path / "out")
    line = str(refused.value)
    assert "which is the driver's own" in line and "\n" not in line, line
    assert " ".join(given) in line or "SBATCH_" in line, line
    assert not args.exists()


def test_sbatch_args_the_driver_leaves_alone_are_passed_on(fake_bin, tmp_path):
    args = _fake(fake_bin, "sbatch", "exit 0")
    given = ("--wait-all-nodes=1", "--job-name=mine", "-J", "mine", "--parsable", "-vH",
             "--open-mode=append", "--exclude=n1", "-c2", "-J", "-a")  # fmt: skip
    assert slurm_options(SlurmConfig(sbatch_args=given), tmp_path / "out")[-len(given) :] == [
        *given
    ]
    assert "--test-only" in args.read_text()


@pytest.mark.parametrize(
    "given",
    [("--comment", "-o"), ("--job-name", "-oops"), ("--comm", "-a0"), ("--mem", "-a"),
     ("--comment", "--array=3"), ("--begin", "now", "--comment", "-Mgpu"), ("--comment=-o",),
     ("--comment", "-e", "-J", "-d"), ("--wait-all-nodes", "-W"), ("-J", "--"),
     ("--comment", "--"), ("--comment", "job.sh"), ("--exclusive=user",)],
)  # fmt: skip
def test_an_option_s_value_that_looks_like_an_option_is_a_value(fake_bin, tmp_path, given):
    """`--sbatch-arg=--comment --sbatch-arg=-o`: sbatch reads `-o` as the comment (getopt takes
    the next argument as the value of a long option that needs one, whatever it starts with),
    but the driver took it for the refused `-o` (`--output`) and refused the run."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    assert slurm_options(SlurmConfig(sbatch_args=given), tmp_path / "out")[-len(given) :] == [
        *given
    ]
    assert "--test-only" in args.read_text()


@pytest.mark.parametrize(
    ("given", "shown"),
    [(("--",), "--"), (("--requeue", "--", "--exclusive"), "--"), (("job.sh",), "job.sh"),
     (("",), "''"), (("-",), "-"), (("--comment", "x", "job.sh"), "job.sh"),
     (("--exclusive", "user"), "user"), (("a b",), "'a b'")],
)  # fmt: skip
def test_an_argument_sbatch_would_read_as_the_job_s_script_is_refused_before_any_work(
    fake_bin, tmp_path, given, shown
):
    """`--sbatch-arg=--` ended sbatch's options: the driver's own after it were read as the
    script ("Unable to open file --wrap", naming no --sbatch-arg). An argument that is no option
    nor an option's value is sbatch's script: `--sbatch-arg=job.sh` (a script that exists) ran
    in place of the driver's, its options for arguments, and the run failed naming a probe log
    that was never written. One line naming it now, sbatch not asked."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    with pytest.raises(ConfigError) as refused:
        slurm_options(SlurmConfig(sbatch_args=given), tmp_path / "out")
    line = str(refused.value)
    assert line.startswith(f"--engine slurm / engine='slurm': {shown} in --sbatch-arg / "), line
    assert ("ends sbatch's options" if shown == "--" else "the job's script") in line, line
    assert "\n" not in line and not args.exists()


@pytest.mark.parametrize("given", [("--comment",), ("--requeue", "-J"), ("--comm",), ("-vJ",)])
def test_an_option_without_its_value_at_the_end_is_refused_before_any_work(
    fake_bin, tmp_path, given
):
    """`--sbatch-arg=--comment` alone took the driver's next option for its value (its
    `--dependency` or `--output` at a submit; at the check, `--wrap`, and sbatch's refusal
    spoke of the script's first line). One line naming it now, sbatch not asked."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    with pytest.raises(ConfigError) as refused:
        slurm_options(SlurmConfig(sbatch_args=given), tmp_path / "out")
    line = str(refused.value)
    assert f": {given[-1]} in --sbatch-arg / sbatch_args needs a value" in line, line
    assert "\n" not in line and not args.exists()


@pytest.mark.parametrize(
    ("given", "shown"),
    [(("--comment", "x", "-o", "y"), "-o y"), (("--parsable", "-o", "y"), "-o y"),
     (("--exclusive", "-o", "y"), "-o y"), (("--output", "-a"), "--output -a"),
     (("--out", "-a0"), "--out -a0"), (("--nosuchoption", "-o", "y"), "-o y")],
)  # fmt: skip
def test_an_option_after_a_flag_or_a_value_is_still_read(fake_bin, tmp_path, given, shown):
    """A flag (`--parsable`) or an optional value (`--exclusive`: only as `--exclusive=user`)
    takes no next argument, nor does an option sbatch does not know (not guessed a value: a
    refusal with `=` as its fix beats a driver's own option passed through); the value of the
    driver's own `--output` is not read as `-a` (`--array`) either."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    with pytest.raises(ConfigError) as refused:
        slurm_options(SlurmConfig(sbatch_args=given), tmp_path / "out")
    assert f"{shown} in --sbatch-arg / sbatch_args sets --output" in str(refused.value), (
        refused.value
    )
    assert not args.exists()


@pytest.mark.parametrize("missing", ["squeue", "scancel", "scontrol"])
def test_the_commands_that_follow_and_stop_jobs_are_required_before_any_work(
    fake_bin, tmp_path, monkeypatch, missing
):
    """Without scancel on PATH a stopped or failed run left its jobs queued without a word;
    without squeue or scontrol it failed after its first submissions. One line now, before
    sbatch is asked anything."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    for name in {"squeue", "scancel", "scontrol"} - {missing}:
        _fake(fake_bin, name, "exit 0")
    monkeypatch.setenv("PATH", str(fake_bin))
    with pytest.raises(
        ConfigError, match=f"^--engine slurm / engine='slurm': no {missing} on PATH"
    ):
        slurm_options(SlurmConfig(), tmp_path / "out")
    assert not args.exists()


@pytest.mark.parametrize("remote", [False, True])
def test_a_logs_folder_with_a_backslash_is_refused_before_any_work(
    fake_bin, tmp_path, monkeypatch, remote
):
    """sbatch reads a `\\` in `--output` as "no % patterns" and drops it: the logs' path named a
    folder that is not there, and the probe failed without a reason (its log unwritten). The
    driver's `%%` (a `%` in the path doubled) would not be undone either. The logs of a run into
    a bucket go under the current folder."""
    args = _fake(fake_bin, "sbatch", "exit 0")
    here = tmp_path / "back\\slash"
    here.mkdir()
    monkeypatch.chdir(here)
    out = "s3://bucket/packed" if remote else "out"
    with pytest.raises(ConfigError, match="backslash") as refused:
        slurm_options(SlurmConfig(), out)
    assert str(here) in str(refused.value) and "\n" not in str(refused.value)
    assert not args.exists()


def test_squeue_names_the_tasks_held_by_a_user_or_an_admin(fake_bin):
    """`scontrol hold` leaves a task PENDING (reason JobHeldUser, JobHeldAdmin): the driver
    waited for it without a word. squeue's reason is asked too, and a held task's state is its
    hold (`commands.HELD_STATES`: named once with `scontrol release`)."""
    args = _fake(
        fake_bin,
        "squeue",
        "printf '7_0 PENDING JobHeldUser\\n7_1 PENDING JobHeldAdmin\\n7_2 PENDING Resources\\n"
        "7_3 PENDING ReqNodeNotAvail, UnavailableNodes:n1\\n7_4 RUNNING None\\n'",
    )
    assert cli.live_tasks(["7"]) == {
        "7_0": "JobHeldUser",
        "7_1": "JobHeldAdmin",
        "7_2": "PENDING",
        "7_3": "PENDING",
        "7_4": "RUNNING",
    }
    assert "%r" in args.read_text().split()  # the reason, asked with the state
    assert cli.HELD_STATES["JobHeldUser"] == cli.HELD_STATES["JobHeldAdmin"] == "scontrol release"


_TIMED_OUT = (
    "echo 'sbatch: error: Batch job submission failed: Socket timed out on send/recv "
    "operation' >&2; exit 1"
)


def _fail_first(folder: Path, body: str) -> str:
    """A fake sbatch body: the first call runs `body` (what a busy controller answers), the
    later ones print job id 41."""
    flag = folder / "sbatch.failed"
    return f"if [ ! -e {flag} ]; then touch {flag}; {body}; fi\necho 41"


def test_a_timed_out_sbatch_whose_job_was_queued_is_not_submitted_again(fake_bin, monkeypatch):
    """Before: a busy controller's "Socket timed out" from sbatch stopped the run (as a refused
    squeue did until it was asked again). Now it is tried again, but first the queue is asked
    for the array's script: the job was queued before the answer was lost, so it is taken."""
    monkeypatch.setattr(cli, "RETRY_SECONDS", (0.0, 0.0))
    sbatch = _fake(fake_bin, "sbatch", _fail_first(fake_bin, _TIMED_OUT))
    squeue = _fake(fake_bin, "squeue", "printf '9|/other/a0-1.sh\\n40|/run/slurm/a1-2.sh\\n'")
    assert cli.submit_array(["--job-name=x"], 3, "/run/slurm/a1-2.sh") == "40"
    assert len(sbatch.read_text().splitlines()) == 1  # not submitted twice
    assert squeue.read_text().split() == ["--me", "--all", "-h", "-o", "%F|%o"]


def test_a_timed_out_sbatch_whose_job_is_not_queued_is_submitted_again(fake_bin, monkeypatch):
    monkeypatch.setattr(cli, "RETRY_SECONDS", (0.0, 0.0))
    sbatch = _fake(fake_bin, "sbatch", _fail_first(fake_bin, _TIMED_OUT))
    _fake(fake_bin, "squeue", "printf '9|/other/a0-1.sh\\n'")
    assert cli.submit_array([], 2, "/run/slurm/a1-2.sh") == "41"
    assert len(sbatch.read_text().splitlines()) == 2


def test_sbatch_refusals_that_last_or_are_not_transient_stop_at_once_or_after_the_retries(
    fake_bin, monkeypatch
):
    monkeypatch.setattr(cli, "RETRY_SECONDS", (0.0, 0.0))
    _fake(fake_bin, "squeue", "exit 0")
    sbatch = _fake(fake_bin, "sbatch", _TIMED_OUT)
    with pytest.raises(cli.SlurmRefused, match="Socket timed out"):
        cli.submit_array([], 2, "/run/a.sh")
    assert len(sbatch.read_text().splitlines()) == 3  # the first try and two more
    sbatch.unlink()
    _fake(fake_bin, "sbatch", "echo 'sbatch: error: Invalid account' >&2; exit 1")
    with pytest.raises(cli.SlurmRefused, match="Invalid account"):
        cli.submit_array([], 2, "/run/a.sh")
    assert len(sbatch.read_text().splitlines()) == 1  # a refusal of the job is not retried


def test_a_fresh_run_whose_staging_is_discarded_leaves_no_empty_logs_folder(fake_bin, tmp_path):
    """A fresh run that failed before a task ran (here sbatch refuses the probe job: a submit
    limit) had its staging folder removed, and left `.NAME.packtool-slurm-logs/`, empty, beside
    the output for ever."""
    from packtool.engines.output_folder import staging_folder
    from packtool.engines.slurm.driver import logs_folder, run_pack_slurm
    from packtool.errors import PacktoolError
    from tests.packtool.engines.slurm.test_driver import _config

    _fake(
        fake_bin,
        "sbatch",
        'case "$*" in *--test-only*) exit 0;; esac\n'
        "echo 'sbatch: error: Batch job submission failed: Job violates accounting/QOS policy "
        "(job submit limit)' >&2; exit 1",
    )
    _fake(fake_bin, "scontrol", "echo 'MaxArraySize            = 4'")
    for name in ("squeue", "scancel"):
        _fake(fake_bin, name, "exit 0")
    out = tmp_path / "packed"
    with pytest.raises(PacktoolError, match="job submit limit"):
        run_pack_slurm(_config(out))
    assert not staging_folder(out).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin"]
    assert not logs_folder(out).exists()


def test_ctrl_c_in_a_wait_between_sbatch_tries_records_what_was_queued_then_stops(
    fake_bin, monkeypatch
):
    """Ctrl-C (and SIGTERM) were held for the whole retry loop (about a minute, up to ~18 with
    every command timing out), past Slurm's KillWait: the driver was killed before it
    cancelled. The waits let it through now, after the queue is asked once and what the last
    try queued is recorded (so the stopped run cancels it)."""
    _fake(fake_bin, "sbatch", _TIMED_OUT)
    seen = fake_bin / "squeue.seen"
    _fake(  # nothing queued at once: the job shows after the try's time-out
        fake_bin,
        "squeue",
        f"if [ ! -e {seen} ]; then touch {seen}; exit 0; fi\nprintf '40|/run/slurm/a1-2.sh\\n'",
    )

    real, waits = cli.time.sleep, []

    def interrupted(seconds):  # the first wait (subprocess polls with short ones of its own)
        if waits or seconds < 1:
            return real(seconds)
        waits.append(seconds)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.time, "sleep", interrupted)
    recorded = []
    with pytest.raises(KeyboardInterrupt):
        cli.submit_array([], 2, "/run/slurm/a1-2.sh", recorded.append)
    assert recorded == ["40"] and waits == [cli.RETRY_SECONDS[0]]


def test_a_job_an_earlier_try_queued_unseen_is_cancelled_after_a_later_try(fake_bin, monkeypatch):
    """The first try's answer lost and the queue's answer too: the second try's job is the
    run's, and the first one, found queued afterwards, was left running unrecorded."""
    monkeypatch.setattr(cli, "RETRY_SECONDS", (0.0, 0.0))
    _fake(fake_bin, "sbatch", _fail_first(fake_bin, _TIMED_OUT))
    seen = fake_bin / "squeue.seen"
    _fake(  # no answer the two times it is asked after the first try, then both jobs
        fake_bin,
        "squeue",
        f"echo >> {seen}; if [ $(wc -l < {seen}) -le 2 ]; then exit 1; fi\n"
        "printf '40|/run/slurm/a1-2.sh\\n41|/run/slurm/a1-2.sh\\n'",
    )
    scancel = _fake(fake_bin, "scancel", "exit 0")
    recorded = []
    assert cli.submit_array([], 2, "/run/slurm/a1-2.sh", recorded.append) == "41"
    assert recorded == ["41"]
    assert scancel.read_text().split() == ["40"]


def test_ctrl_c_during_a_try_that_times_out_records_what_it_queued_then_stops(fake_bin):
    """The reviewer of the retry: a Ctrl-C while sbatch waited out the controller's time-out
    was let through as the try ended, before the queue was asked: the job that try queued ran
    on unrecorded. Now the queue is asked inside the held block."""
    _fake(fake_bin, "sbatch", "kill -INT $PPID\n" + _TIMED_OUT)
    _fake(fake_bin, "squeue", "printf '777|/run/slurm/a1-2.sh\\n'")
    recorded = []
    with pytest.raises(KeyboardInterrupt):
        cli.submit_array([], 2, "/run/slurm/a1-2.sh", recorded.append)
    assert recorded == ["777"]


def test_the_last_tries_job_found_queued_is_the_run_s(fake_bin, monkeypatch):
    """Every try timed out, the last one's job queued all the same: it was raised unasked."""
    monkeypatch.setattr(cli, "RETRY_SECONDS", ())
    _fake(fake_bin, "sbatch", _TIMED_OUT)
    _fake(fake_bin, "squeue", "printf '5|/run/slurm/a1-2.sh\\n'")
    recorded = []
    assert cli.submit_array([], 2, "/run/slurm/a1-2.sh", recorded.append) == "5"
    assert recorded == ["5"]


_WRITES_ITS_LOG = (
    'for a in "$@"; do case "$a" in --output=*probe.log) f="${a#--output=}"; mkdir -p "${f%/*}"; '
    'echo "the probe said why" > "$f";; esac; done'
)


@pytest.mark.parametrize("log", [False, True], ids=["no_log", "log"])
@pytest.mark.parametrize("remote", [False, True], ids=["folder", "bucket"])
def test_a_failed_fresh_run_leaves_no_slurm_files(
    fake_bin, tmp_path, monkeypatch, remote, log, request
):
    """A fresh run whose probe job fails (a `ConfigError`: its staging folder is removed, there
    is nothing to resume) left, into a bucket, its Slurm files (job records, context, probe
    script) in `.packtool-slurm/<run>/` in the current folder for ever (12 entries); into a
    folder they go with the staging folder. Neither leaves anything now but the probe's log
    where it wrote one (the error names it), and the bucket's staging is gone too."""
    from packtool.engines.config import RunConfig
    from packtool.engines.slurm.driver import run_pack_slurm
    from packtool.engines.slurm.state import LOCAL_HOME
    from packtool.pack.chunk import PackConfig

    submit = f"{_WRITES_ITS_LOG}; echo 7" if log else "echo 7"
    _fake(fake_bin, "sbatch", f'case "$*" in *--test-only*) exit 0;; esac; {submit}')
    _fake(fake_bin, "squeue", "exit 0")  # the probe left the queue without its mark: failed
    _fake(fake_bin, "scancel", "exit 0")
    _fake(fake_bin, "scontrol", "echo 'MaxArraySize = 1001'")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    corpus = here / "corpus.jsonl"
    corpus.write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(50)))
    if remote:
        import boto3

        request.getfixturevalue("s3_server")
        boto3.client("s3").create_bucket(Bucket=f"slurm-fresh-{log:d}")
    out = f"s3://slurm-fresh-{log:d}/ds" if remote else str(tmp_path / "out")
    config = RunConfig(
        inputs=(str(corpus),), out_dir=out, pack=PackConfig(max_len=64), progress=False
    )
    with pytest.raises(ConfigError, match="probe job 7 failed before any partition ran") as e:
        run_pack_slurm(config, SlurmConfig(poll_seconds=0.01))
    left = {p for p in tmp_path.rglob("*") if p.is_file() and "bin" not in p.parts}
    logs = [p for p in left if p.name == "probe.log"]
    assert left == {corpus, *logs}, left
    assert len(logs) == log and all(f"log: {p}" in str(e.value) for p in logs)
    assert (here / LOCAL_HOME).exists() == (remote and log)
    if remote:  # the staging prefix too
        assert boto3.client("s3").list_objects_v2(Bucket=f"slurm-fresh-{log:d}")["KeyCount"] == 0


@pytest.mark.parametrize(
    ("name", "flag"),
    [
        ("workers", "--slurm-workers"),
        ("tasks_per_job", "--tasks-per-job"),
        ("cpus_per_task", "--cpus-per-task"),
    ],
)
def test_a_slurm_count_below_1_names_its_own_flag_and_argument(name, flag):
    # Before: SlurmConfig(workers=0) said "--workers must be ...", pack's other option.
    with pytest.raises(ConfigError, match=f"^{flag} / {name} must be an integer >= 1, got 0$"):
        SlurmConfig(**{name: 0})
