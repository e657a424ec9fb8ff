"""Ctrl-C in the command line: a short message, exit code 130, and never a hang.

The CLI installs `on_sigint` for the length of a command; a command that can be resumed sets
`note` to say how. Only os-level calls on the forced path: the orderly one may be stuck holding
locks (see `on_sigint`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from packtool.engines.interrupts import exit_held_for, force_exit
from packtool.storage import local as storage

FORCE_EXIT_AFTER_S = 5.0
"""After Ctrl-C, how long the orderly shutdown may take before the process exits anyway."""
note: ContextVar[Callable[[], str]] = ContextVar("note", default=lambda: "")
"""What to tell the user after an interrupt or a failed write (pack: how to resume); set by the
command, per thread (two runs at once in one process each name their own folder)."""
_interrupted = threading.Event()


def resume_note(output: str, overwrite: bool) -> str:
    """`pack`'s note: what the interrupted run keeps and how to finish it. "Finished
    partitions" only where a partition's record was written (`records.any_finished`: it stops
    at the first record, whatever the number of partitions); a run stopped earlier, its plan saved, keeps only that
    (a rerun without --resume is refused, naming it); one stopped before it saved its plan
    keeps nothing to resume."""
    from packtool.engines import records
    from packtool.engines.output_folder import staging_folder

    staging = staging_folder(output)
    how = "--resume instead of --overwrite" if overwrite else "--resume"
    run = records.run_dir(staging)
    if records.any_finished(staging):
        return (
            f"; finished partitions are kept in {staging}: run the same command with {how} to "
            "finish"
        )
    if storage.exists(run / records.PLAN_FILE):
        return (
            f"; no partition had finished (the run's plan is kept in {staging}): run the same "
            f"command with {how} to finish"
        )
    return ""


def _force_exit(said: Callable[[], str]) -> None:
    start = "\n" if os.isatty(2) else ""  # a terminal's `^C` line ended first (`exits.report`)
    force_exit(f"{start}interrupted{said()} (forced exit)")


def _exit_later(said: Callable[[], str]) -> None:
    time.sleep(FORCE_EXIT_AFTER_S)
    # a step that must end first holds it, within its own bound (the Slurm driver's scancel:
    # cut at 5 s, it left jobs queued)
    while (left := exit_held_for()) > 0:
        time.sleep(min(left, 0.1))
    _force_exit(said)


def on_sigint(signum: int, frame: Any) -> None:
    """First Ctrl-C: raise KeyboardInterrupt as usual, and exit anyway if that stalls.

    A KeyboardInterrupt that lands while the main thread imports a module can be swallowed by
    the import machinery and leave its lock held; the reader, tokenizer and packer threads then
    wait on it forever (seen in `pack` under load). The watchdog bounds that. A second Ctrl-C
    exits at once. A step under `engines.interrupts.forced_exit_held` (the Slurm driver's
    scancel) holds the watchdog within its own bound. Either way `pack --resume` works: shards
    and partition records are written atomically, and only finished partitions are recorded.
    """
    said = note.get()  # the main thread's note: the watchdog thread has a context of its own
    if _interrupted.is_set():
        _force_exit(said)
    _interrupted.set()
    watchdog = threading.Thread(target=_exit_later, args=(said,), name="packtool-interrupt")
    watchdog.daemon = True
    watchdog.start()
    raise KeyboardInterrupt


def install_sigint() -> Any:
    """Install `on_sigint`; returns the previous handler (None when not on the main thread)."""
    try:
        return signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread (e.g. an embedding application)
        return None


def install_sigterm() -> Any:
    """Install `on_sigint` for SIGTERM too (a scheduler's time limit, `kill`): a command stops on
    it as on Ctrl-C, with the resume line and exit 130, on every engine and at every step.
    Returns the previous handler (None when not on the main thread). Until 2026-12-08 only the
    Ray and Slurm drivers' waves handled it: a local run, a Slurm run's tail tree or any run's
    finish killed by SIGTERM ended at once, exit 143 and not a word (its --resume worked)."""
    try:
        return signal.signal(signal.SIGTERM, on_sigint)
    except ValueError:  # not the main thread (e.g. an embedding application)
        return None
