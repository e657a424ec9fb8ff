"""The Slurm engine: the partitions as Slurm job arrays, the local engine's bytes.

    plan (driver) -> sbatch --array per MaxArraySize tasks -> each task: K partitions through
    worker.run_partition (records on the shared file system), or in pull mode N workers
    claiming partitions in turn (pilots.py) -> the driver waits, showing
    partitions done / running / pending / failed, and resubmits what a task left undone ->
    the tail tree's merge nodes and the root on the driver -> index.json -> the swap

The plan, the completion records, the tail tree and the root are the local engine's
(packtool/engines/base.py), so the dataset is byte for byte the one `--engine local` writes, and
a run started on one engine can be resumed on the other. The tail tree runs on the driver, not
as dependent jobs: each merge node packs at most F x 32 rows of tails (seconds), less than a
dependent job would wait in the queue, and the driver is running anyway to show progress.

Where the tasks run: each is `SLURM_PYTHON -m packtool.engines.slurm.task ...` with
`SLURM_PYTHON` this driver's interpreter (`sys.executable`), so the nodes must see it and
packtool (the usual venv or conda environment on the shared file system), with the
submitting shell's environment (`sbatch`'s default `--export=ALL`); `setup` puts one shell
line before it (`module load python/3.11`, `source /shared/venv/bin/activate`), after
`PACKTOOL_SLURM_ROLE` is set to `task` (or `probe` in the probe job, which runs the line too);
a line that ends non-zero stops the task with that status, and the task then goes back to the driver's
working folder (relative input paths). The probe also checks that `SLURM_PYTHON` imports
packtool there. The inputs and
the output must be on a file system every node sees, or in a bucket: then the tasks read and
upload their own bytes, and the jobs' scripts, state and logs go to `.packtool-slurm/` in the
current folder (`state.run_folders`), which the nodes must see.

Faults: a task that ends (failed, cancelled, preempted, timed out, node lost, killed) with
partitions unrecorded has them resubmitted, each partition at most `max_retries` times more;
beyond that the run stops with a one-line error naming the task's log, keeping the finished
partitions for `--resume`. A stopped (Ctrl-C, SIGTERM) or failed driver cancels its jobs (none is left in the
queue); `--no-wait` submits and returns (`Detached`), leaving them to run, and a later
`--resume` re-attaches to the jobs still queued (their ids are in the run state) and submits
only what no live job will do. Pull mode's faults: packtool/engines/slurm/pilots.py.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from packtool.engines import output_folder, worker
from packtool.engines.base import Driver, pack_with
from packtool.engines.config import RunConfig
from packtool.engines.interrupts import one_signal_let_through, sigterm_as_ctrl_c
from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.arrays import ArrayDriver
from packtool.engines.slurm.config import SlurmConfig
from packtool.engines.slurm.pilots import PilotDriver
from packtool.engines.slurm.state import check_logs_path, logs_folder, remove_run_folders
from packtool.engines.summary import PackSummary
from packtool.errors import Detached
from packtool.storage import writing
from packtool.tokenizer.tokenizers import Tokenizer

CANCEL_WAIT = 60.0
"""Seconds a failed run waits for its cancelled tasks to leave the queue before it goes on."""
CANCEL_SLACK_S = 5.0
"""Beyond scancel's and the wait's bounds, how long the forced exit waits for a cancel."""

__all__ = [
    "SlurmConfig",
    "drive_slurm",
    "logs_folder",
    "run_pack_slurm",
    "slurm_driver",
    "slurm_options",
]


def run_pack_slurm(
    config: RunConfig,
    slurm: SlurmConfig | None = None,
    tokenizer: Tokenizer | str | None = None,
    *,
    bos: int | str | None = "auto",
) -> PackSummary:
    """Pack `config.inputs` like `packtool.engines.local.run_pack`, the partitions run as Slurm
    job arrays (see the module docstring).

    Raises:
        ConfigError: no sbatch on PATH, a submission Slurm refuses, nodes that cannot see the
            output folder.
        Detached: `slurm.wait` is False: the jobs are queued, the staging folder kept.
        WorkersLost: a partition's tasks ended without it more than `max_retries` times.
    """
    return pack_with(
        config, tokenizer, slurm_driver(slurm or SlurmConfig(), config.out_dir), bos=bos
    )


def slurm_driver(slurm: SlurmConfig, out_dir: str | Path) -> Driver:
    """The Slurm engine's `Driver` for runs into `out_dir`, once the output is one the tasks
    can write (not `hf://`) and Slurm accepts the sbatch options (`slurm_options`). A finished
    run's scripts and logs go with it."""
    output_folder.built_here(out_dir, "slurm")
    options = slurm_options(slurm, out_dir)
    return Driver(
        lambda run: drive_slurm(run, slurm, options),
        cancels_slurm_jobs=False,  # its own jobs: the driver re-attaches to them
        after=lambda run: remove_run_folders(run.work, run.out_dir),
    )


def slurm_options(slurm: SlurmConfig, out_dir: str | Path) -> list[str]:
    """The sbatch options of a run into `out_dir`, checked with Slurm (`sbatch --test-only`)
    before any work: a bad partition, account or QoS is one line, nothing written (a refused
    --sbatch-arg named: `commands.test_only`); so are an argument sbatch would read as the
    job's script or that ends its options (`commands.refuse_stray_arguments`), `--clusters`
    (`commands.refuse_other_clusters`), an option that is the driver's own
    (`commands.refuse_driver_options`), a logs folder sbatch cannot name
    (`state.check_logs_path`) and a missing squeue, scancel or scontrol (without scancel a
    stopped run's jobs were left queued without a word)."""
    for program in ("sbatch", "squeue", "scancel", "scontrol"):
        cli.require(program)
    options = slurm.options(f"packtool-{Path(out_dir).name}")
    cli.refuse_stray_arguments(options)
    cli.refuse_other_clusters(options)
    cli.refuse_driver_options(options)
    check_logs_path(out_dir)
    cli.test_only(options, given=len(slurm.sbatch_args))
    return options


def drive_slurm(run: Any, slurm: SlurmConfig, options: list[str]) -> str:
    """Run `run` (a `base.Run`, or another job's run of the same shape:
    packtool/engines/megatron/run.py): its first wave as Slurm job arrays, the waves after it (the
    tail tree) here; what was used, in words. The caller removes `logs_folder` once the run
    is finished."""
    driver = (PilotDriver if slurm.workers else ArrayDriver)(run, slurm, options)
    try:
        with sigterm_as_ctrl_c():  # SIGTERM cancels the jobs too (it left them all queued)
            driver.run_partitions()
    except Detached:
        raise
    except cli.SlurmRefused as exc:  # the cluster failed the run: its finished work stays
        _cancel(driver, CANCEL_WAIT, stopping=False)
        with contextlib.suppress(OSError):  # a task that started in the wait: its log stays
            writing.remove_empty_dir(driver.logs)
        raise run.workers_lost(str(exc), "Slurm failed, not the run's options") from None
    except BaseException as exc:
        # No job of a stopped or failed run stays in the queue; a failure's staging folder may
        # be removed next, so its tasks are gone first (Ctrl-C keeps the folder: no wait).
        failed = isinstance(exc, Exception)
        _cancel(driver, CANCEL_WAIT if failed else 0.0, stopping=not failed)
        if isinstance(exc, Exception):
            # No task wrote a log (its jobs gone): a fresh run's staging folder may go next,
            # and the empty folder stayed beside the output for ever (a --resume makes it again)
            with contextlib.suppress(OSError):  # never in place of the run's own error
                writing.remove_empty_dir(driver.logs)
        raise
    for wave in run.waves()[1:] if run.todo else run.waves():  # the tail tree, here
        for u in wave:
            run.account(worker.run_partition(run.context, run.descriptor(u)))
    return driver.describe()


def _cancel(driver: Any, wait: float, stopping: bool) -> None:
    """`driver.cancel(wait)`, run to its end through a first Ctrl-C or SIGTERM (the run's error,
    if it failed, raised after it), the CLI's forced exit after a Ctrl-C or SIGTERM (5 s) held
    until it ends, within scancel's own bound: cut short, it left jobs queued. A second signal
    (`stopping`: the run stops on one already, so the next) ends the process at once, its one
    line naming the jobs that may still be queued and the scancel line that cancels them
    (`interrupts.one_signal_let_through`)."""
    ids = driver.job_ids()
    left = (
        f"Slurm job(s) {', '.join(ids)} may still be queued: run `scancel {' '.join(ids)}`"
        if ids
        else ""
    )
    first = (
        "packtool: cancelling the run's Slurm job(s) before it stops; a second Ctrl-C or "
        "SIGTERM ends it at once and may leave them queued"
    )
    bound = cli.SCANCEL_TIMEOUT_S + wait + CANCEL_SLACK_S
    with one_signal_let_through(bound, left, first, stopping):
        driver.cancel(wait=wait)
