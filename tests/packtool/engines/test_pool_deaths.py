"""The local engine's pool when worker processes die (packtool/engines/local.py `_run_pool`):
each unit runs again at most `MAX_RETRIES` times, counted per unit, not over the whole run.

The pool is the engine's own loop over a real `ProcessPoolExecutor` whose task ends its worker
process with `os._exit` on chosen units (the way an out-of-memory kill ends it: no exception,
no result), so the deaths come exactly where the test puts them."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from packtool.engines import local
from packtool.errors import WorkersLost


def die_on_chosen_units(descriptor: dict[str, Any]) -> dict[str, Any]:
    """The pool's task: a unit named in `die` ends its worker process the first `times` times
    it runs (a marker file per attempt under `marks`), then returns its record."""
    unit, marks = descriptor["unit"], Path(descriptor["marks"])
    if unit in descriptor["die"]:
        tried = len(list(marks.glob(f"{unit}.*")))
        (marks / f"{unit}.{tried}").touch()
        if tried < descriptor["times"]:
            os._exit(9)
    return {"unit": unit}


class FakeRun:
    """What `_run_pool` asks of a run: a descriptor per unit, `account` per record,
    `partitions`, `workers_lost`."""

    def __init__(self, units: int, die: set[int], times: int, marks: Path) -> None:
        self.partitions = units
        self.die, self.times, self.marks = die, times, marks
        self.records: list[int] = []

    def descriptor(self, p: int) -> dict[str, Any]:
        return {"unit": p, "die": self.die, "times": self.times, "marks": str(self.marks)}

    def account(self, record: dict[str, Any]) -> None:
        self.records.append(record["unit"])

    def workers_lost(self, what: str, advice: str) -> WorkersLost:
        return WorkersLost(f"{what} ({advice})")


@pytest.fixture
def spawn_pool(monkeypatch):
    """`_make_pool` with the test's task (a spawned pool: the task is imported from this file)."""

    def make(run, workers, threads, kind):
        ctx = multiprocessing.get_context("spawn")
        return ProcessPoolExecutor(workers, mp_context=ctx), die_on_chosen_units

    monkeypatch.setattr(local, "_make_pool", make)


def test_deaths_on_different_units_do_not_add_up_to_a_stop(spawn_pool, tmp_path):
    """Five units each kill their worker once: a run of 12 units finishes, every unit accounted
    once (the run used to stop at the fourth death, whichever units died)."""
    run = FakeRun(12, die={1, 3, 5, 8, 10}, times=1, marks=tmp_path)
    local._run_pool(run, [list(range(10)), [10, 11]], workers=1, threads=1, kind="process")
    assert sorted(run.records) == list(range(12))
    # Each of them ran twice: died, then finished.
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{unit}.{attempt}" for unit in (1, 3, 5, 8, 10) for attempt in (0, 1)
    )


def test_a_unit_that_kills_its_worker_every_time_stops_the_run(spawn_pool, tmp_path):
    """Unit 3 kills its worker on every attempt: it runs 1 + MAX_RETRIES times, then the run
    stops with a line naming it; the units before it were accounted."""
    run = FakeRun(8, die={3}, times=100, marks=tmp_path)
    with pytest.raises(WorkersLost) as caught:
        local._run_pool(run, [list(range(8))], workers=1, threads=1, kind="process")
    assert str(caught.value).startswith(
        f"worker processes died {local.MAX_RETRIES + 1} times while partition(s) 3, 4 ran or "
        "waited in the pool"
    )  # 4 was queued beside 3 at each death (one worker, two units in flight)
    assert len(list(tmp_path.glob("3.*"))) == local.MAX_RETRIES + 1
    assert {0, 1, 2} <= set(run.records) and 3 not in run.records


def test_a_lost_tail_tree_unit_is_named_as_one(spawn_pool, tmp_path):
    """A unit past the plan's partitions is a tail-tree merge node, and the line says so."""
    run = FakeRun(2, die={2}, times=100, marks=tmp_path)
    with pytest.raises(WorkersLost, match="while a tail-tree merge ran or waited in the pool"):
        local._run_pool(run, [[0, 1], [2]], workers=1, threads=1, kind="process")
    assert sorted(run.records) == [0, 1]


def test_a_pool_found_broken_at_submit_keeps_the_unit_it_was_given(monkeypatch, tmp_path):
    """A worker that dies between two submits makes the next `submit` raise BrokenProcessPool:
    the unit it was given runs in the next pool (it used to be dropped from the run)."""
    from concurrent.futures.process import BrokenProcessPool

    class BreaksAtUnit4(ProcessPoolExecutor):
        broke = False

        def submit(self, fn, descriptor):
            if descriptor["unit"] == 4 and not BreaksAtUnit4.broke:
                BreaksAtUnit4.broke = True
                raise BrokenProcessPool("a worker died")
            return super().submit(fn, descriptor)

    def make(run, workers, threads, kind):
        return BreaksAtUnit4(workers, mp_context=multiprocessing.get_context("spawn")), (
            die_on_chosen_units
        )

    monkeypatch.setattr(local, "_make_pool", make)
    run = FakeRun(8, die=set(), times=0, marks=tmp_path)
    local._run_pool(run, [list(range(8))], workers=1, threads=1, kind="process")
    assert BreaksAtUnit4.broke and sorted(run.records) == list(range(8))


def test_the_stop_names_every_unit_at_the_limit_not_the_lowest(spawn_pool, tmp_path):
    """Two workers: unit 1 kills its worker every time, unit 0 runs beside it and is lost with
    it. Both reach the limit at one break; the line named the lowest, 0, which never failed."""
    run = FakeRun(6, die={1}, times=100, marks=tmp_path)
    with pytest.raises(WorkersLost) as caught:
        local._run_pool(run, [list(range(6))], workers=2, threads=1, kind="process")
    named = str(caught.value).partition("partition(s) ")[2].partition(" ran")[0]
    assert 1 in {int(n) for n in named.split(", ")}, caught.value


def eof_error(descriptor: dict[str, Any]) -> dict[str, Any]:
    raise EOFError("a truncated stream")


class ForkServerDiesAt(ProcessPoolExecutor):
    """A pool whose fork server dies as it is asked for a worker while `unit` is submitted:
    `submit` raises the `EOFError` multiprocessing raises then (the server's socket closed
    before it sent the new worker's pid), `times` times."""

    unit, times, died = 0, 0, 0

    def submit(self, fn, descriptor):
        if descriptor["unit"] == type(self).unit and type(self).died < type(self).times:
            type(self).died += 1
            raise EOFError
        return super().submit(fn, descriptor)


def fork_server_dies(monkeypatch, unit: int, times: int) -> type:
    pool = type("Pool", (ForkServerDiesAt,), {"unit": unit, "times": times, "died": 0})

    def make(run, workers, threads, kind):
        return pool(workers, mp_context=multiprocessing.get_context("spawn")), die_on_chosen_units

    monkeypatch.setattr(local, "_make_pool", make)
    return pool


def test_a_fork_server_that_dies_at_a_submit_is_a_lost_worker(monkeypatch, tmp_path):
    """The fork server killed while a worker is forked: `submit` raised EOFError, which ended
    the run as a Ctrl-C ("interrupted", exit 130). It is a lost worker now: the pool is rebuilt
    and every unit runs."""
    pool = fork_server_dies(monkeypatch, unit=3, times=1)
    run = FakeRun(8, die=set(), times=0, marks=tmp_path)
    local._run_pool(run, [list(range(8))], workers=1, threads=1, kind="process")
    assert pool.died == 1 and sorted(run.records) == list(range(8))


def test_a_fork_server_that_keeps_dying_stops_the_run_as_lost_workers(monkeypatch, tmp_path):
    """A fork server that dies at every try stops the run with the lost workers' one line."""
    fork_server_dies(monkeypatch, unit=2, times=100)
    run = FakeRun(8, die=set(), times=0, marks=tmp_path)
    with pytest.raises(WorkersLost, match=r"^worker processes died \d+ times while partition"):
        local._run_pool(run, [list(range(8))], workers=1, threads=1, kind="process")
    assert 0 in run.records and 2 not in run.records


def test_an_eof_error_of_a_unit_itself_is_its_error_not_a_lost_worker(monkeypatch, tmp_path):
    """Only `submit`'s EOFError is the fork server's: a task that raises one is not run again."""

    def make(run, workers, threads, kind):
        return ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn")
        ), eof_error

    monkeypatch.setattr(local, "_make_pool", make)
    with pytest.raises(EOFError, match="a truncated stream"):
        local._run_pool(
            FakeRun(2, set(), 0, tmp_path), [[0, 1]], workers=1, threads=1, kind="process"
        )
