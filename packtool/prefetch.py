"""Read ahead in background threads: an iterator a few items ahead (reading overlaps encoding),
and one small read per file over many files at once (`map_ordered`)."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")

IO_THREADS_ENV = "PACKTOOL_IO_THREADS"
"""Threads `map_ordered` reads files with (default `IO_THREADS`; 1 reads one file at a time)."""
IO_THREADS = 32
"""Per-file reads before a run (a Parquet footer, a first record, a stat) wait on latency, not
on a core: on an object-store mount each costs milliseconds, and 32 in flight make 10^5 files
take ~1/32 of the sequential time (README, "Scale-out"); pyarrow and file reads release the GIL."""


BATCH = 8
"""Consecutive items a `map_ordered` thread reads per task."""


def io_threads() -> int:
    """The thread count `map_ordered` uses: `PACKTOOL_IO_THREADS`, else `IO_THREADS`."""
    raw = os.environ.get(IO_THREADS_ENV, "")
    if not raw:
        return IO_THREADS
    from packtool.quantities import positive_int

    return positive_int(IO_THREADS_ENV, raw, "threads")


def map_ordered(
    fn: Callable[[T], R], items: Iterable[T], threads: int | None = None, batch: int = BATCH
) -> Iterator[R]:
    """`fn(item)` for every item, `threads` at a time, yielded in the items' order.

    Exactly what `map(fn, items)` yields, raises and stops at: results come in input order and
    an exception re-raises when its item is reached, so the first failing item in input order
    is the one reported, never the first to fail in time (items after it may have been read;
    their results are dropped). A thread takes `batch` consecutive items at a time (one task
    per item costs more than a read from the page cache), fewer where a list of items would
    leave threads idle (12 objects' first records: 12 requests at once, not 8 then 4); at
    most `2 * threads * batch` results are held at once, whatever the number of items. Close
    the iterator (`contextlib.closing`) when stopping early.
    """
    n = threads or io_threads()
    if n <= 1 or (isinstance(items, list | tuple) and len(items) < 2):
        yield from map(fn, items)
        return
    if isinstance(items, list | tuple):  # a short list spread over the threads, not 8 on one
        batch = max(1, min(batch, -(-len(items) // n)))
    pool = ThreadPoolExecutor(n, thread_name_prefix="packtool-io")
    window: deque[Future[tuple[list[R], BaseException | None]]] = deque()
    it = iter(items)
    try:
        while True:
            chunk = list(itertools.islice(it, batch))
            if chunk:
                window.append(pool.submit(_run_batch, fn, chunk))
            if window and (len(window) >= 2 * n or not chunk):
                results, error = window.popleft().result()
                yield from results
                if error is not None:
                    raise error
            elif not chunk:
                return
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # reads in flight are small: let them end


def _run_batch(fn: Callable[[T], R], chunk: list[T]) -> tuple[list[R], BaseException | None]:
    """`fn` over `chunk` in order, up to its first exception (returned with the results)."""
    out: list[R] = []
    for item in chunk:
        try:
            out.append(fn(item))
        except Exception as exc:
            return out, exc
    return out, None


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
