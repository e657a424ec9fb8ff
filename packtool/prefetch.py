"""Run an iterator in a background thread a few items ahead (reading overlaps encoding)."""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator
from typing import Any, TypeVar

T = TypeVar("T")


def prefetch(iterator: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Run `iterator` in a thread, `depth` items ahead; its exceptions re-raise here."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    # Close a generator here, in the thread that runs it, so that stages it
                    # reads from (nested prefetches) stop too.
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
                    return
            q.put(("done", None))
        except BaseException as exc:  # forwarded to the consumer
            q.put(("error", exc))

    thread = threading.Thread(target=produce, name="packtool-read", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)
