"""Ctrl-C held back over a step that must not be cut in two.

Some steps start something outside this process and then record it: a pool's submit may fork a
worker and then add it to the pool's list (`local.py`); `sbatch` queues a job and then the
driver writes down its id (`slurm/arrays.py`). A Ctrl-C between the two left what was started
unknown to the code that stops a run (a worker never killed, a job never cancelled).
`ctrl_c_after()` lets the block finish and raises the Ctrl-C (or SIGTERM) at its end; with
`at_once`, the handler in place still runs at each signal (the CLI's watchdog and its second
Ctrl-C), only its `KeyboardInterrupt` waiting for the block's end.
`sigterm_as_ctrl_c()` makes SIGTERM stop a run as Ctrl-C does (the Slurm and Ray drivers):
under the CLI its 5 s forced exit included, from the Python API only a second SIGTERM.
`forced_exit_held()` makes that forced exit wait for a step that must end first (the Slurm
driver's scancel), within the step's own bound, its line saying what the step leaves undone;
`one_signal_let_through()` runs such a step to its end through a first Ctrl-C or SIGTERM, a
second ending the process at once with that line.

Records in: nothing. Out: nothing (the SIGINT handler restored as it was).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_held: list[tuple[float, str]] = []
"""The steps the forced exit waits for (`forced_exit_held`): their `time.monotonic()` deadline,
and what each leaves undone if the process ends in it (`force_exit` says it)."""


@contextmanager
def forced_exit_held(bound_s: float, left: str = "") -> Iterator[None]:
    """The CLI's timed forced exit (`cli/interrupt.on_sigint`'s watchdog, 5 s after a Ctrl-C or
    SIGTERM) waits for the block, at most `bound_s` seconds from its start: a step that stops
    what a run started elsewhere (the Slurm driver's `scancel`, up to 60 s) is not cut short,
    which left jobs queued. A second signal still ends the process at once; a forced exit in
    the block adds `left` to its line (`force_exit`: which jobs may still be queued)."""
    held = (time.monotonic() + bound_s, left)
    _held.append(held)
    try:
        yield
    finally:
        _held.remove(held)


def exit_held_for() -> float:
    """Seconds the forced exit still waits for (`forced_exit_held`); 0.0 where nothing holds it."""
    return max((d - time.monotonic() for d, _ in list(_held)), default=0.0) if _held else 0.0


@contextmanager
def one_signal_let_through(
    bound_s: float, left: str, first: str, stopping: bool = False
) -> Iterator[None]:
    """A step that stops what a run started elsewhere (the Slurm driver's `scancel` and its wait
    for the jobs to leave the queue), run to its end through a Ctrl-C or SIGTERM: the first is
    answered with the line `first` on stderr and the step goes on (the caller's error, if it
    has one, is raised after it; the run was stopping anyway); a second ends the process at
    once, exit 130, its line naming `left` (the jobs that may still be queued and how to
    cancel them). `stopping`: the run is stopping on a signal already, so the next one is the
    second (under the CLI its own handler ends the process, its resume line and `left` said).
    Until 2026-12-07 a signal in the step cut it short: SIGTERM killed the process without a
    word (the jobs of a run that failed left queued), a terminal's Ctrl-C killed `scancel`
    too, and the run's error was lost. The CLI's timed forced exit waits for the block
    (`forced_exit_held`, `bound_s`). Main thread only, as `ctrl_c_after`."""
    with forced_exit_held(bound_s, left):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        seen = [0] if stopping else []
        held = (signal.SIGINT, signal.SIGTERM)
        previous = [signal.getsignal(s) for s in held]

        def on_signal(signum: int, frame: Any) -> None:
            seen.append(signum)
            if len(seen) == 1:
                with contextlib.suppress(OSError):
                    os.write(2, f"{_line_start()}{first}\n".encode())
                return
            handler = previous[0]
            if stopping and callable(handler) and handler is not signal.default_int_handler:
                with contextlib.suppress(BaseException):  # the CLI's ends the process here
                    handler(signal.SIGINT, frame)
            force_exit()

        for s in held:
            signal.signal(s, on_signal)
        try:
            yield
        finally:
            for s, handler in zip(held, previous, strict=True):
                signal.signal(s, handler)


def _line_start() -> str:
    """A newline on a terminal, which has echoed `^C` (the CLI's lines start so too)."""
    try:
        return "\n" if os.isatty(2) else ""
    except OSError:
        return ""


@contextmanager
def ctrl_c_after(at_once: bool = False) -> Iterator[None]:
    """Ctrl-C held back until the block ends (the main thread only; elsewhere no handler can
    be set, and the main thread gets the signal).

    `at_once`: the handler in place runs at each signal, and only what it raises (the
    `KeyboardInterrupt`) waits for the block's end. The CLI's handler then starts its watchdog
    at the first Ctrl-C and exits at once at the second (`cli/interrupt.on_sigint`), as
    docs/pack.md promises: for a block that may wait long and whose process may end midway (a
    pool's first submit waits for the fork server's imports, 20 s and more on a loaded machine,
    and a worker forked for a driver that is gone follows it out: `lifeline`). Without it, both
    Ctrl-Cs were noted and nothing else until the block ended."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A handler that notes the signal, not a blocked signal mask: the kernel hands a process's
    # SIGINT to any thread that does not block it (a tokenizer or prefetch thread), and Python
    # then raised it in the main thread all the same.
    # SIGTERM too: the Slurm driver handles it as Ctrl-C (`sigterm_as_ctrl_c`).
    pending: list[int] = []  # signals whose handler has not run yet
    raised: list[BaseException] = []  # what a handler run at once raised
    held = (signal.SIGINT, signal.SIGTERM)
    previous: list[Any] = []

    def hold(signum: int, frame: Any) -> None:
        # `previous` is filled before `hold` is installed: a signal landing between two
        # installs finds its own handler there, not an IndexError
        handler = previous[held.index(signum)]
        if not (at_once and callable(handler)):
            pending.append(signum)
            return
        try:
            handler(signum, frame)
        except BaseException as exc:  # raised where the block ends
            raised.append(exc)

    previous.extend(signal.getsignal(s) for s in held)
    for s in held:
        signal.signal(s, hold)
    try:
        yield
    finally:
        for s, handler in zip(held, previous, strict=True):
            signal.signal(s, handler)
        if raised:
            raise raised[0]
        if pending:
            signal.raise_signal(pending[0])  # the held signal, through the handler restored


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """SIGTERM raised as a Ctrl-C (`KeyboardInterrupt`) over the block, so that what stops a
    run on Ctrl-C (the Slurm driver cancels its jobs) runs on SIGTERM too, where the signal's
    default action ended the process at once (every job left queued, no message). The main
    thread only, as `ctrl_c_after`.

    Under the CLI, SIGTERM runs its SIGINT handler (`cli/interrupt.on_sigint`), so a stop that
    hangs is bounded as after a Ctrl-C: the process exits 5 s later with the resume line (later
    where a step holds it: `forced_exit_held`), at once at a second signal. With no such
    handler (the Python API) there is no timed exit: the program may catch the
    `KeyboardInterrupt` and go on (for part of 2026-12-07 a watchdog ended it 5 s later, exit
    130, whatever it did); a second SIGTERM in the block ends the process at once (exit 130),
    and after the block SIGTERM is the caller's again (by default, the end of the process).
    Until 2026-12-07 a SIGTERM whose stop hung left the driver running for good.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    terminated: list[int] = []  # SIGTERMs answered with a KeyboardInterrupt (no CLI handler)

    def on_term(signum: int, frame: Any) -> None:
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler) and handler is not signal.default_int_handler:
            handler(signal.SIGINT, frame)  # the CLI's: its watchdog, its note, its 2nd signal
        if terminated:
            force_exit()  # a second SIGTERM: at once, as a second Ctrl-C
        terminated.append(signum)
        raise KeyboardInterrupt  # no timer: a program that catches it may go on

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def force_exit(line: str = "interrupted (forced exit)") -> None:
    """End the process now, exit 130, `line` on stderr (no cleanup runs: a stop that hung, or a
    second signal; the CLI's watchdog words its own line), followed by what the steps it cuts
    short leave undone (`forced_exit_held`'s `left`), on the same line."""
    undone = [left for _, left in list(_held) if left]
    with contextlib.suppress(OSError):  # stderr closed or full: the exit code says it
        os.write(2, f"{'; '.join([line, *undone])}\n".encode())
    os._exit(130)
