"""Ctrl-C held back over a step that must not be cut in two.

Some steps start something outside this process and then record it: a pool's submit may fork a
worker and then add it to the pool's list (`local.py`); `sbatch` queues a job and then the
driver writes down its id (`slurm/arrays.py`). A Ctrl-C between the two left what was started
unknown to the code that stops a run (a worker never killed, a job never cancelled).
`ctrl_c_after()` lets the block finish and raises the Ctrl-C at its end.

Records in: nothing. Out: nothing (the SIGINT handler restored as it was).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def ctrl_c_after() -> Iterator[None]:
    """Ctrl-C held back until the block ends (the main thread only; elsewhere no handler can
    be set, and the main thread gets the signal)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # A handler that notes the signal, not a blocked signal mask: the kernel hands a process's
    # SIGINT to any thread that does not block it (a tokenizer or prefetch thread), and Python
    # then raised it in the main thread all the same.
    pending: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: pending.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if pending:
            signal.raise_signal(signal.SIGINT)  # the held Ctrl-C, through the handler restored
