"""Ctrl-C belongs to the driver: the local engine's fork server and every worker it forks
ignore SIGINT from their birth.

The terminal sends Ctrl-C to the whole foreground process group, the fork server and its
workers included. The driver answers it (it stops the pool, says `interrupted; ...`, exits
130); a worker ignores it once its initializer ran, but one still starting (unpickling its
task from the driver's pipe) died of it with a traceback printed after the shell prompt came
back. `multiprocessing.forkserver.main` imports its preload modules first, then takes the
handlers it gives every child from the server's own; this module is the first of
`engines.local`'s preload list, so the handler the children get is "ignore". Before it is
imported the server has SIGINT blocked (the driver starts it so: `local.start_pool_server`),
so a Ctrl-C in the interpreter's start-up or the first imports waits, and is dropped here.

It also ends the server when its driver is gone before its preload has finished
(`watch_driver`, `end_watch`). The server notices its driver's end in its own loop (EOF on its
"alive" pipe), which it starts only once its preload has run: a driver that stopped earlier (a
preflight error, Ctrl-C, `kill -9`) left it importing, and, for a pack, loading or compiling the
packer's kernels (`pool_kernels`) for nobody: seen 3.8 s with numba's cache warm, 15-54 s cold.

Imported anywhere else (not in a fork server's `main`) it does nothing.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
from types import FrameType

EXIT_CODE = 70
"""The server's exit code when its driver ended during its preload (EX_SOFTWARE, as
`lifeline.EXIT_CODE`: nobody is left to read it)."""

_WATCH: tuple[threading.Thread, int] | None = None
"""The thread `watch_driver` started, and the pipe end that stops it."""


def _server_main() -> FrameType | None:
    """The frame of the fork server's `main` this import runs in, or None."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith("forkserver.py"):
            return frame
        frame = frame.f_back
    return None


def in_fork_server() -> bool:
    """Whether this import runs in a fork server's `main` (its preload)."""
    return _server_main() is not None


def watch_driver() -> None:
    """End this fork server (`os._exit`) as soon as its driver is gone, until `end_watch`.

    The server's `main` was given the read end of a pipe only its driver holds the write end
    of (`alive_r`; the driver never writes to it): EOF there is the driver's end, however it
    ended, and is already there where it ended before this runs. A thread waits for it, as the
    server's own loop does once it runs. Not a `PR_SET_PDEATHSIG`: that fires when the
    *thread* that started the server ends, and a server started by one run's thread of a
    program serves the program's later runs too. Does nothing outside a fork server's preload.
    """
    global _WATCH
    main = _server_main()
    alive_r = None if main is None else main.f_locals.get("alive_r")
    if not isinstance(alive_r, int) or _WATCH is not None:
        return  # not a fork server's preload, or a `main` of another shape: no watch
    wake_r, wake_w = os.pipe()

    def wait() -> None:
        ready, _, _ = select.select([alive_r, wake_r], [], [])
        if alive_r in ready:
            # Mid-import or mid-compile: numba writes each cache file beside and renames it,
            # so none is left half-written.
            os._exit(EXIT_CODE)
        os.close(wake_r)

    thread = threading.Thread(target=wait, name="packtool-driver-watch", daemon=True)
    thread.start()
    _WATCH = (thread, wake_w)


def end_watch() -> None:
    """Stop `watch_driver`'s thread and wait for its end: the server then forks its workers
    from the threads it had before, and its own loop watches the pipe (`pool_ready`)."""
    global _WATCH
    if _WATCH is None:
        return
    thread, wake_w = _WATCH
    os.write(wake_w, b"x")
    thread.join()
    os.close(wake_w)
    _WATCH = None


if in_fork_server():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The driver started the server with SIGINT blocked (`local.start_pool_server`): a Ctrl-C
    # during the start-up is pending until now, and is dropped here, ignored.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    watch_driver()  # the preload's slow part is still to come: until `pool_ready`
