"""Worker processes that end when the process that started them ends, however it ends.

A pool's workers wait for work on a queue whose pipe they hold both ends of, and those of a
`forkserver` pool are children of the fork server, not of the driver: when the driver is
killed (`kill -9`, the out-of-memory killer, a node's job limit) nothing tells them, and they
wait forever, holding the server and its resource tracker alive with them (each worker keeps
the server's "alive" pipe open). `follow(pid)`, called in a worker's initializer with the
driver's pid, starts a thread that ends the worker as soon as the driver has ended: through a
pidfd (Linux 5.3+: the driver's exit wakes it at once, and a reused pid cannot fool it), else by
checking the pid once a second. What the worker was writing is left as a killed run leaves it
(`--resume` picks it up).

Records in: the driver's pid. Out: nothing; the worker process ends with exit code `EXIT_CODE`.
"""

from __future__ import annotations

import os
import select
import threading
import time

EXIT_CODE = 70
"""A worker's exit code when its driver is gone (EX_SOFTWARE: nobody is left to read it)."""
POLL_SECONDS = 1.0
"""How often the fallback (no pidfd) checks that the driver still runs."""


def follow(pid: int) -> None:
    """End this process as soon as process `pid` (the driver that started it) has ended.

    Called once per worker process, in its pool's initializer; does nothing in `pid` itself.
    """
    if pid == os.getpid():
        return
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(EXIT_CODE)  # already gone before this worker started
    except (AttributeError, OSError):  # not Linux, or a kernel before 5.3
        fd = None
    threading.Thread(target=_watch, args=(pid, fd), name="packtool-lifeline", daemon=True).start()


def _watch(pid: int, fd: int | None) -> None:
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has exited
        os._exit(EXIT_CODE)
    while _alive(pid):
        time.sleep(POLL_SECONDS)
    os._exit(EXIT_CODE)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of another user took the pid: ours is gone
        return False
    return True
