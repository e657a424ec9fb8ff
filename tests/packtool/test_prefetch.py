"""`prefetch.map_ordered`: parallel per-file reads that behave exactly like a sequential loop."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.prefetch import io_threads, map_ordered


@settings(max_examples=40, deadline=None)
@given(
    items=st.lists(st.integers(0, 50), max_size=60),
    threads=st.integers(1, 9),
    batch=st.integers(1, 5),
    fail=st.sets(st.integers(0, 59), max_size=4),
    listed=st.booleans(),
)
def test_same_results_and_same_error_as_map(items, threads, batch, fail, listed):
    """Random delays: results in input order, and the error raised is the first failing item's
    in input order (never the first to fail in time), after exactly the results before it."""

    def fn(i: int) -> int:
        x = items[i]
        time.sleep((x % 7) / 5000)  # later items often finish first
        if i in fail:
            raise ValueError(f"item {i}")
        return x * 2

    def run(n: int) -> tuple[list[int], str | None]:
        got: list[int] = []
        try:
            order = list(range(len(items))) if listed else range(len(items))  # a list: batch cut
            for r in map_ordered(fn, order, threads=n, batch=batch):
                got.append(r)
        except ValueError as exc:
            return got, str(exc)
        return got, None

    assert run(threads) == run(1)
    first = min((i for i in fail if i < len(items)), default=None)
    got, err = run(threads)
    assert err == (None if first is None else f"item {first}")
    assert got == [x * 2 for x in items[: len(items) if first is None else first]]


@pytest.mark.parametrize("batch", [1, 4])
def test_reads_overlap_and_at_most_twice_the_threads_are_held(batch):
    lock = threading.Lock()
    running, most_running, submitted = 0, 0, 0
    # The first item of each of the first 8 batches waits until all 8 are running at once:
    # it passes only if 8 threads overlap (a wall-time bound proved it less surely).
    together = threading.Barrier(8)

    def fn(i: int) -> int:
        nonlocal running, most_running
        with lock:
            running += 1
            most_running = max(most_running, running)
        if i % batch == 0 and i < 8 * batch:
            together.wait(timeout=30)
        time.sleep(0.001)  # latency, as a read on an object store
        with lock:
            running -= 1
        return i

    def items():
        nonlocal submitted
        for i in range(200):
            submitted += 1
            yield i

    consumed = 0
    for r in map_ordered(fn, items(), threads=8, batch=batch):
        assert r == consumed
        consumed += 1
        assert submitted - consumed < 2 * 8 * batch  # results held (or in flight) are bounded
    assert consumed == 200
    assert most_running == 8


def test_io_threads_from_the_environment(monkeypatch):
    monkeypatch.setenv("PACKTOOL_IO_THREADS", "3")
    assert io_threads() == 3
    monkeypatch.setenv("PACKTOOL_IO_THREADS", "0")
    with pytest.raises(ConfigError, match="PACKTOOL_IO_THREADS must be a positive integer"):
        io_threads()
    monkeypatch.delenv("PACKTOOL_IO_THREADS")
    assert io_threads() == 32


def test_a_short_list_runs_on_as_many_threads_as_it_has_items():
    """12 objects' first records: 12 requests at once (each item waits for all 12 to start), not
    a batch of 8 on one thread and 4 on another, one after the other."""
    everyone = threading.Barrier(12, timeout=5)

    def fn(i: int) -> int:
        everyone.wait()
        return i

    assert list(map_ordered(fn, list(range(12)), threads=32)) == list(range(12))
