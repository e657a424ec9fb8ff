"""Where a Slurm run keeps its files (the Slurm folder: context, scripts, job files, claims;
the logs folder), and the jobs its run state records: what a finished run removes, and what
`--overwrite` cancels (and waits out) before it discards the staging folder. Apart from
`arrays.py` so that the output checks (packtool/engines/output_folder.py) can stop a discarded
run's jobs without importing the task and worker code.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packtool.dataset.output import output_paths
from packtool.engines import records
from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.config import JOBS_DIR, SLURM_DIR
from packtool.errors import OVERWRITE, ConfigError
from packtool.storage import local as storage
from packtool.storage import writing

LOCAL_HOME = ".packtool-slurm"
"""For a bucket output: the folder, in the current one, that holds each run's Slurm files."""


def logs_folder(out_dir: str | Path) -> Path:
    """Where the tasks' logs go: beside the output (hidden), so that a failed run's logs, which
    its error names, outlive its staging folder; removed when the run finishes."""
    target = output_paths(out_dir).target
    return target.parent / f".{target.name}.packtool-slurm-logs"


def check_logs_path(out_dir: str | Path) -> None:
    """One line, before any work, where the logs of a run into `out_dir` would go to a path
    with a backslash (beside the output; a bucket's under the current folder: `local_home`):
    sbatch reads a `\\` in `--output` as "no % patterns" and removes it, so the path named a
    folder that is not there (the driver's `%a` and its `%%` for a `%` not read either), every
    task failed unable to open its log, and the probe's error had no reason to give."""
    logs = Path.cwd() / LOCAL_HOME if storage.is_remote(out_dir) else logs_folder(out_dir)
    if "\\" in str(logs):
        where = "the current folder" if storage.is_remote(out_dir) else "the output"
        raise ConfigError(
            f"{cli.SLURM}: the tasks' logs would go to {logs}, and sbatch cannot write to a "
            f"path with a backslash (its --output drops it); use a path without one for {where}"
        )


def local_home(work: Any) -> Path:
    """A bucket output's Slurm files: sbatch runs scripts and writes logs on a file system, so
    they go to `.packtool-slurm/<run>` in the current folder (a folder every node must see,
    which the probe job checks), one per run (by the run's staging prefix, which a `--resume`
    reuses), removed when the run finishes."""
    digest = hashlib.sha256(str(work).encode()).hexdigest()[:16]
    return Path.cwd() / LOCAL_HOME / digest


def slurm_folder(work: Any) -> Path:
    """A run's Slurm folder (context, scripts, job files, claims): in its staging folder `work`
    on a file system, in `local_home` for a bucket. Found from `work` alone: no request to
    the output's store."""
    if storage.is_remote(work):
        return local_home(work) / SLURM_DIR
    return records.run_dir(work) / SLURM_DIR


def run_folders(work: Any, out_dir: str | Path) -> tuple[Path, Path]:
    """(the Slurm folder, the logs folder) of a run: the logs beside its output on a file
    system, in `local_home` for a bucket."""
    if storage.is_remote(work):
        return slurm_folder(work), local_home(work) / "logs"
    return slurm_folder(work), logs_folder(out_dir)


def remove_run_folders(work: Any, out_dir: str | Path) -> None:
    """What a finished run leaves of its Slurm files: nothing (its staging folder holds the
    rest)."""
    if storage.is_remote(work):
        writing.remove_tree(local_home(work))
        writing.remove_empty_dir(Path.cwd() / LOCAL_HOME)  # the last run from this folder
    else:
        writing.remove_tree(logs_folder(out_dir))


def remove_scratch(work: Any) -> None:
    """A failed bucket run whose staging prefix `work` is discarded (nothing can resume it):
    its Slurm files in the current folder go, as they go with a staging folder on a file
    system; its logs stay where a task wrote one (the run's error may name it), as beside a
    folder output."""
    home = local_home(work)
    writing.remove_tree(home / SLURM_DIR)
    for folder in (home / "logs", home, home.parent):
        if storage.is_dir(folder) and not writing.remove_empty_dir(folder):
            break  # a log, or another run's files


def recorded_jobs(work: Any) -> list[str]:
    """The ids of every job a Slurm driver submitted for the run in `work` (none for a run no
    Slurm driver started)."""
    folder = slurm_folder(work) / JOBS_DIR
    return [p.stem for p in storage.glob(folder, "*.json")] if storage.is_dir(folder) else []


def stop_jobs(work: Any, out_dir: str | Path, timeout: float = 60) -> None:
    """Before `--overwrite` discards the staging folder `work`: the jobs a Slurm driver
    submitted for it are cancelled, and waited for until they leave the queue (a detached
    run's task still running wrote its old-option partitions into the new run's staging
    folder, at the same path), then its Slurm files and logs removed. One line if they do not
    leave within `timeout` seconds, and where Slurm's commands are not on this machine's PATH
    (the jobs could neither be cancelled nor seen to have ended: the overwrite went ahead, and
    a task of the old run still running could write into the new run's folder)."""
    jobs = recorded_jobs(work)
    if not jobs:
        return
    refuse_without_slurm(
        jobs, f"{OVERWRITE}: the run it replaces", ("scancel", "squeue"),
        f"run it where Slurm's commands are, or delete {work} once those jobs have ended",
    )  # fmt: skip
    cancel_and_wait(jobs, OVERWRITE, timeout)
    remove_run_folders(work, out_dir)  # its logs beside the output too (the run is gone)


def refuse_without_slurm(jobs: list[str], what: str, commands: tuple[str, ...], fix: str) -> None:
    """One line where the jobs `jobs` of an earlier run must be stopped and Slurm's `commands`
    are not on this machine's PATH (they could neither be cancelled nor seen to end)."""
    if all(storage.which(command) for command in commands):
        return
    ids = ", ".join(sorted(jobs, key=lambda j: (len(j), j))[:5]) + ", ..." * (len(jobs) > 5)
    needed = " and ".join(commands)
    raise ConfigError(
        f"{what} submitted Slurm job(s) {ids}, and {needed} {'are' if len(commands) > 1 else 'is'} "
        f"not on this machine's PATH to stop them: {fix}"
    )


def cancel_and_wait(jobs: Iterable[str], what: str, timeout: float = 60) -> None:
    """scancel `jobs` and wait until none is in the queue (scancel is asynchronous: a task
    still running could yet write a record); one line past `timeout` seconds."""
    jobs = set(jobs)
    if not cli.live_tasks(jobs):
        return
    cli.cancel(jobs, wait=timeout)  # scancel, then the queue watched until they have left it
    if live := cli.live_tasks(jobs):
        queued = ", ".join(sorted({key.partition("_")[0] for key in live}, key=int))
        raise ConfigError(
            f"{what}: the earlier run's Slurm job(s) {queued} are still in the queue "
            f"{timeout:.0f} s after scancel; run again once they have left it"
        )
