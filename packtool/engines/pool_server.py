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
Imported anywhere else (not in a fork server's `main`) it does nothing.
"""

from __future__ import annotations

import signal
import sys


def in_fork_server() -> bool:
    """Whether this import runs in a fork server's `main` (its preload)."""
    frame = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "main" and code.co_filename.endswith("forkserver.py"):
            return True
        frame = frame.f_back
    return False


if in_fork_server():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The driver started the server with SIGINT blocked (`local.start_pool_server`): a Ctrl-C
    # during the start-up is pending until now, and is dropped here, ignored.
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
