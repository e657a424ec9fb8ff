"""Pull mode (`--slurm-workers N`): N long-lived array tasks take the partitions in turn.

With fixed shares (`arrays.ArrayDriver`) every array task pays its own start: Slurm's
scheduling of the task (on a busy cluster, seconds to minutes; on the test cluster up to its
1 s scheduling interval), the interpreter, the imports (numba) and the kernels' load, about 2
core-seconds a task on this project's test cluster (docs/benchmarks.md, "Slurm engine"). In
pull mode the driver submits N workers (one array; N at most the partitions left), and each
walks the run's pool of partitions in plan order, running every partition it can claim (no
record yet, and the claim file `claims/PPPPPP`, holding the worker's `JOB_TASK`, created by it:
`writing.create_exclusive`, written whole then hard-linked in), so the start is paid N times a run and a worker that finishes early takes what is
left (the balance of the local engine's pool). The bytes are the local engine's: the same
partitions through the same `worker.run_partition`.

The driver follows the claims, not the tasks: the workers claim in plan order, so every
partition before the first unclaimed one was claimed, and a poll stats the claims from there on
(new ones), the records of the claimed, unfinished partitions (at most N), and the claims the
driver itself released with their records (a partition recorded after its claim was released
is done: no worker claims it again); one squeue of the workers' jobs at most every `poll_seconds`. It never
lists or reads what is finished.

Faults: a worker that leaves the queue (killed, cancelled, preempted, timed out, node lost)
with a claimed partition unrecorded has the claim removed (the partition counts one attempt;
more than `max_retries` stop the run with the one-line error naming the worker's log) and new
workers are submitted for what it left; a requeued worker takes its own claims back first. All
workers gone with partitions never claimed (e.g. a setup line that fails) resubmits at most
`max_retries` times without progress before the same error. `--no-wait` and `--resume` work as
with fixed shares: a resumed driver re-reads the claims once, keeps the workers still queued
and releases the claims of those gone.

No probe job: only N tasks are submitted, and a worker that cannot see the run's folder stops
the run in one line as a probe would.

Cost of the claims: each worker tries each partition at most once (a stat of its record, and
of its claim: a claim another worker holds costs that one stat, not a create, link and unlink):
at 20,000 partitions and 100 workers ~4 x 10^6 metadata operations spread over the run, ~10^4
per worker per partition-hour, next to a partition's minutes of work.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from packtool.engines import records
from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.arrays import ArrayDriver, last_line, output_pattern
from packtool.engines.slurm.config import CLAIMS_DIR, SlurmConfig
from packtool.engines.slurm.task import task_error
from packtool.errors import option_choice
from packtool.storage import local as storage
from packtool.storage import writing

TICK = 0.25
"""Seconds between two looks at the claims and records (squeue: every `poll_seconds`)."""


class PilotDriver(ArrayDriver):
    """Submits N pull-mode workers, follows their claims, releases a lost worker's claims."""

    def __init__(self, run: Any, slurm: SlurmConfig, options: list[str]) -> None:
        super().__init__(run, slurm, options)
        self.claims = self.dir / CLAIMS_DIR
        writing.make_dirs(self.claims)
        self.pool: list[int] = []
        self.pool_name = ""
        self.running: dict[int, str] = {}
        """Claimed, not recorded: partition -> the claiming worker's `JOB_TASK` ("" unread)."""
        self.released: set[int] = set()
        self.cursor = 0

    def describe(self) -> str:
        return (
            f"Slurm: {self.tasks('worker')} taking partitions in turn "
            f"({option_choice('--slurm-workers', 'workers', self.slurm.workers)}), "
            f"{self.slurm.cpus_per_task or 1} CPU(s) each (stage times "
            "summed over tasks)"
        )

    def _claim(self, p: int) -> Any:
        return self.claims / f"{p:06d}"

    def _owner(self, p: int) -> str:
        try:
            return storage.read_text(self._claim(p)).strip()
        except OSError:
            return ""

    def _pilot_jobs(self) -> set[str]:
        return {job for job, entry in self.jobs.items() if entry.get("pilots")}

    def _submit_workers(self, n: int) -> None:
        """An array of `n` workers over the pool (its files written once per driver)."""
        self._write_context()
        if not self.pool_name:
            self.pool_name = f"pool{len(self.jobs)}-{time.time_ns()}"
            self._write_descriptors(self.pool_name, [[p] for p in self.pool])
            parts = np.asarray(self.pool, dtype=np.int64).tobytes()
            writing.write_atomic(self.dir / f"{self.pool_name}.parts", parts)
        for start in range(0, n, self.max_array):
            count = min(self.max_array, n - start)
            # A name per array: arrays split by MaxArraySize shared one, and their workers'
            # logs (`NAME-%a.log`) overwrote each other's; a script per array too (how a
            # timed-out sbatch's job is found in the queue)
            name = f"w{len(self.jobs)}-{time.time_ns()}"
            script = self._script(self.pool_name, "pilot", name)
            log = f"{output_pattern(self.logs)}/{name}-%a.log"
            entry = {"array": name, "pilots": count, "tasks": []}
            self._submit_job([*self.options, f"--output={log}"], count, str(script), entry)
            self.submitted += count

    def _log(self, key: str) -> Any:
        job, _, task = key.partition("_")
        entry = self.jobs.get(job, {})
        return self.logs / f"{entry.get('array', job)}-{task}.log"

    def run_partitions(self) -> None:
        todo = set(self.run.todo)
        if not todo:  # nothing to run: an earlier driver's jobs cancelled, squeue not asked
            self.cancel()
            return
        self.stop_other_mode(pilots=False)  # a fixed-share run's jobs: gone before the listing
        done = set(records.finished(self.run.work))
        self.pool = sorted(todo - done)
        live = cli.live_tasks(self._pilot_jobs())  # an earlier driver's workers: re-attach
        self.attached = len(live)
        for path in storage.list_dir(self.claims):  # once per driver: what they claimed
            if path.name.isdigit() and int(path.name) in todo and int(path.name) not in done:
                self.running[int(path.name)] = self._owner(int(path.name))
        # Claims of workers already gone (a stopped driver's): released now, for the workers
        # submitted below (released a poll later, they had as many workers again submitted
        # beside these: a --resume after Ctrl-C ran twice --slurm-workers)
        released = self._release_lost(
            live, {o for o in self.running.values() if o and o not in live}
        )
        self.cursor = 0
        # Workers for what is left, counting those still queued; at least one for released
        # claims, which live workers may have walked past (left to them, a released partition
        # waited until every live worker had ended)
        if self.pool and (not live or released):
            wanted = min(self.slurm.workers or 1, len(self.pool)) - len(live)
            self._submit_workers(max(wanted, 1))
        # --no-wait: detach while a partition is left; with none (every one has its record; a
        # worker may still be leaving the queue) finish now, as fixed shares do (it printed
        # "submitted 0 partition(s)" at every --resume and never finished)
        if not self.slurm.wait and self.pool:
            queued = {k.partition("_")[0] for k in cli.live_tasks(self._pilot_jobs())}
            raise self._detached(len(self.pool), queued or self._pilot_jobs())
        self._follow(todo, done)

    def _follow(self, todo: set[int], done: set[int]) -> None:
        for p in sorted(done & todo):
            self.run.account(records.read_record(self.run.work, p))
        done &= todo
        gone_once: set[str] = set()
        last_poll = 0.0
        stalled, done_at_submit = 0, len(done)
        while True:
            if self._look(todo, done):
                # Workers still queued have nothing left: cancelled, whatever is left of them,
                # without asking squeue which (it failed runs whose partitions all finished)
                self.cancel()
                return
            now = time.monotonic()
            if now - last_poll >= self.slurm.poll_seconds:
                last_poll = now
                try:
                    live = cli.live_tasks(
                        self._pilot_jobs(),
                        wanted=lambda: not self._look(todo, done),  # looked at between retries
                        look_every=self.slurm.poll_seconds,
                    )
                except cli.SlurmRefused:
                    if self._look(todo, done):  # finished while squeue was asked again
                        self.cancel()
                        return
                    raise
                self._say_held(live)
                lost = self._release_lost(live, gone_once)
                unclaimed = len(self.pool) - self.cursor + len(self.released)
                # Every worker gone: what they claimed is released at the next poll (above);
                # partitions nobody claimed get new workers now.
                if lost or (unclaimed and not live and not self.running):
                    if not lost:  # every worker gone, partitions never claimed
                        stalled = stalled + 1 if len(done) == done_at_submit else 0
                        if stalled > self.slurm.max_retries:
                            log = self._log(f"{max(self._pilot_jobs(), key=int)}_0")
                            self._check_visible(log)
                            raise self.run.workers_lost(
                                f"Slurm workers ended {stalled} times without finishing a "
                                f"partition (last task log: {log}{last_line(log)})",
                                "see the log",
                            )
                    done_at_submit = len(done)
                    # --slurm-workers in all, counting those still queued; at least one
                    # for released claims, which live workers may have walked past
                    wanted = min(self.slurm.workers or 1, max(unclaimed, 1)) - len(live)
                    self._submit_workers(max(wanted, 1))
                # Partitions, not workers: the claimed ones running, every other one pending.
                running = len(self.running)
                pending = len(todo) - len(done) - running
                self._progress(len(done), len(todo), running, pending, sum(self.attempts.values()))
            time.sleep(min(TICK, self.slurm.poll_seconds))

    def _look(self, todo: set[int], done: set[int]) -> bool:
        """One look at the claims and records (no squeue): the new claims, in pool order; the
        released claims (claimed again, or recorded after all); the records of the claimed,
        unfinished partitions, accounted and added to `done`. Whether all of `todo` is done."""
        # Claims in pool order; a released one is followed apart (below), so the claims
        # after it are followed now (they waited until it was claimed again)
        while self.cursor < len(self.pool) and (
            self.pool[self.cursor] in self.released
            or storage.exists(self._claim(self.pool[self.cursor]))
        ):
            p = self.pool[self.cursor]
            if p not in done and p not in self.released:
                self.running.setdefault(p, "")
            self.cursor += 1
        for p in list(self.released):
            if storage.exists(records.record_path(self.run.work, p)):
                # Finished all the same: its record was out of sight when the claim was
                # released (a file system's cached lookup, a requeued worker holding it),
                # and no worker claims a partition with a record (the run failed waiting)
                self.released.discard(p)
                self.run.account(records.read_record(self.run.work, p))
                done.add(p)
            elif storage.exists(self._claim(p)):
                self.released.discard(p)
                self.running[p] = ""
        for p in list(self.running):
            if storage.exists(records.record_path(self.run.work, p)):
                self.run.account(records.read_record(self.run.work, p))
                done.add(p)
                del self.running[p]
        return todo <= done

    def _release_lost(self, live: dict[str, str], gone_once: set[str]) -> int:
        """Release the claims of workers out of the queue (seen gone twice: records may lag);
        the number released. Raises `WorkersLost` past `max_retries` attempts of a partition."""
        released = 0
        for p in sorted(self.running):
            owner = self.running[p] or self._owner(p)
            self.running[p] = owner
            if not owner or owner in live:
                gone_once.discard(owner)  # back (a requeue): gone twice in a row counts
                continue
            if owner not in gone_once:
                gone_once.add(owner)
                continue
            if storage.exists(records.record_path(self.run.work, p)):
                continue  # recorded just now: the next look accounts it
            log = self._log(owner)
            self._check_visible(log)
            if (error := task_error(self.dir, p, owner)) is not None:
                raise error  # fails the same way again: raised as itself
            self.attempts[p] = self.attempts.get(p, 0) + 1
            if self.attempts[p] > self.slurm.max_retries:
                raise self.run.workers_lost(
                    f"partition {p} ended without a record {self.attempts[p]} times in Slurm "
                    f"(last task log: {log}{last_line(log)})",
                    "see the log",
                )
            writing.remove_file(self._claim(p))
            del self.running[p]
            self.released.add(p)
            released += 1
        return released
