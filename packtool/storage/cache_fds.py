"""The descriptors the range cache locks, closed in a process forked while they are open.

A `flock` belongs to the open file description, which a fork shares: a DataLoader worker forked
while the main process downloads a range (its `.part` locked) or reads one would hold that lock
as long as it lives, after the main process let go of its own, and every reader of the range
(the worker itself, the node's other ranks) would wait on it. packtool/storage/cache.py opens
every file it locks through `open_held` and closes it through `close_held`; a forked child
closes those open at the fork (`os.register_at_fork`), which drops nothing of the parent's: a
lock goes only when every descriptor of its open file description is closed.

Records in: a path to open, a descriptor to close. Out: descriptors.
"""

from __future__ import annotations

import contextlib
import os
import threading

_held: set[int] = set()
"""The descriptors `open_held` gave that this process holds."""
_guard = threading.Lock()
"""Held from each open to its record, and across a fork: no child inherits a descriptor the
registry does not know of yet."""


def open_held(path: str | os.PathLike, flags: int, mode: int = 0o600) -> int:
    """`os.open`, the descriptor recorded so that a forked child closes it."""
    with _guard:
        fd = os.open(path, flags, mode)
        _held.add(fd)
    return fd


def close_held(fd: int) -> None:
    """Close a descriptor `open_held` gave; one this process no longer holds (a forked child's
    copy, closed at the fork) is left alone. Under the guard: a fork between the record's
    removal and the close would hand the child a locked descriptor it does not know of."""
    with _guard:
        if fd in _held:
            _held.discard(fd)
            os.close(fd)


def _in_child() -> None:
    for fd in list(_held):
        with contextlib.suppress(OSError):
            os.close(fd)
    _held.clear()
    _guard.release()


os.register_at_fork(
    before=lambda: _guard.acquire(),
    after_in_parent=lambda: _guard.release(),
    after_in_child=_in_child,
)
