"""The Slurm engine's submit / wait / resubmit loop for job arrays of fixed shares.

`ArrayDriver` gives each array task `tasks_per_job` partitions (one line of descriptors each),
polls the queue and the records, and resubmits what a task that left the queue did not record;
`pilots.PilotDriver` (`--slurm-workers`) builds on it. The state is one small file per
submitted job under the run's Slurm folder, so a resumed driver re-attaches to the jobs still
queued. See packtool/engines/slurm/driver.py for the whole engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from packtool.engines import records
from packtool.engines.config import resume_command
from packtool.engines.slurm import commands as cli
from packtool.engines.slurm.config import JOBS_DIR, PROBE_OK, SlurmConfig
from packtool.engines.slurm.state import (
    cancel_and_wait,
    recorded_jobs,
    refuse_without_slurm,
    remove_run_folders,
    run_folders,
    slurm_folder,
)
from packtool.engines.slurm.task import CANNOT_SEE, task_error
from packtool.errors import OVERWRITE, RESUME, ConfigError, DataError, Detached, json_value
from packtool.storage import local as storage
from packtool.storage import writing


@contextlib.contextmanager
def taken_over(run: Any) -> Iterator[int]:
    """A run the Slurm engine started, resumed by another engine (local, Ray): the jobs its
    driver submitted are cancelled first (their tasks would run partitions beside this run's
    workers, then fail on the folder this run removes), and their logs go when it finishes.
    Yields how many jobs there were (0 for a run no Slurm driver started). One line, and
    nothing changed, where scancel is not on this machine's PATH."""
    jobs = recorded_jobs(run.work)
    if jobs:
        refuse_without_slurm(
            jobs, f"{RESUME}: the run it resumes", ("scancel",),
            f"resume it where Slurm's commands are, or delete {slurm_folder(run.work) / JOBS_DIR} "
            "once those jobs have ended (their partitions are kept)",
        )  # fmt: skip
    cli.cancel(jobs)
    yield len(jobs)
    if jobs:
        remove_run_folders(run.work, run.out_dir)


class ArrayDriver:
    """Submits the partitions without a record, waits for them, resubmits what is lost."""

    def __init__(self, run: Any, slurm: SlurmConfig, options: list[str]) -> None:
        self.run, self.slurm, self.options = run, slurm, options
        self.dir, self.logs = run_folders(run.work, run.out_dir)
        self.max_array = cli.max_array_size()  # (before the logs folder: a refusal leaves none)
        writing.make_dirs(self.dir / JOBS_DIR)
        writing.make_dirs(self.logs)
        self.jobs: dict[str, dict[str, Any]] = self._load_jobs()  # job id -> {array, tasks}
        self.open: set[str] = set()
        """The `JOB_TASK` keys whose partitions are not all recorded: what a poll looks at."""
        self.attempts: dict[int, int] = {}
        self.submitted = 0
        self.attached = 0
        """Tasks an earlier driver queued that this one re-attached to (`describe`)."""
        self.probe_job: str | None = None
        self.probe_target = self.dir  # the folder the probe must see (tests point it elsewhere)
        self.held_said: set[tuple[str, str]] = set()
        """(job, state) pairs of held tasks already named on stderr (`_say_held`)."""

    # --- the run state: which job runs which partitions (a resumed driver re-attaches) ---

    def _load_jobs(self) -> dict[str, dict[str, Any]]:
        """The jobs submitted so far, in submission order: job ids as numbers (as names, `9` came
        after `10`, and a resumed driver took an older probe for the last one)."""
        jobs = {}
        found = storage.glob(self.dir / JOBS_DIR, "*.json")
        for path in sorted(found, key=lambda f: (len(f.stem), f.stem)):
            try:
                jobs[path.stem] = json_value(storage.read_text(path))
            except (OSError, ValueError) as exc:
                raise DataError(f"{path}: unreadable ({exc}); use {OVERWRITE}") from None
        return jobs

    def _add_job(self, job: str, entry: dict[str, Any]) -> None:
        """Record a submitted job (its own file: nothing written before is rewritten)."""
        writing.write_atomic(self.dir / JOBS_DIR / f"{job}.json", json.dumps(entry).encode())
        self.jobs[job] = entry
        self.open.update(f"{job}_{i}" for i, parts in enumerate(entry["tasks"]) if parts)

    # --- submitting ---

    def _submit_job(self, options: list[str], tasks: int, script: str, entry: dict) -> str:
        """sbatch, then the job recorded, as one step: a Ctrl-C while sbatch ran (the job
        queued) came out before the record, so the stopped run's cancel missed the job and it
        ran on; it now waits for the record (`commands.submit_array`, interrupts.py)."""
        return cli.submit_array(options, tasks, script, lambda job: self._add_job(job, entry))

    def _submit(self, partitions: list[int]) -> None:
        """Submit `partitions` as arrays of at most MaxArraySize tasks of `tasks_per_job`."""
        k = self.slurm.tasks_per_job
        tasks = [partitions[i : i + k] for i in range(0, len(partitions), k)]
        self._write_context()
        for start in range(0, len(tasks), self.max_array):
            chunk = tasks[start : start + self.max_array]
            array = f"a{len(self.jobs)}-{time.time_ns()}"
            self._write_descriptors(array, chunk)
            script = self._script(array)
            log = f"{output_pattern(self.logs)}/{array}-%a.log"
            after = [f"--dependency=afterok:{self.probe_job}"] if self.probe_job else []
            options = [*self.options, *after, f"--output={log}"]
            self._submit_job(options, len(chunk), str(script), {"array": array, "tasks": chunk})
            self.submitted += len(chunk)

    def _write_context(self) -> None:
        """The run's context for the tasks, written by this driver before its first submit,
        whatever is there: every task unpickles it, so one left in the staging folder (by
        anyone who can write there) would run its code on every node; a resumed run's is the
        same run's (its options are checked equal), so tasks still running read it alike."""
        if not getattr(self, "_context_written", False):
            writing.write_atomic(self.dir / "context.pkl", pickle.dumps(self.run.context))
            self._context_written = True

    def _write_descriptors(self, array: str, tasks: list[list[int]]) -> None:
        lines = [json.dumps([self.run.descriptor(p) for p in t]).encode() + b"\n" for t in tasks]
        offsets = np.zeros(len(lines) + 1, dtype=np.int64)
        np.cumsum([len(line) for line in lines], out=offsets[1:])
        writing.write_atomic(self.dir / f"{array}.jsonl", b"".join(lines))
        writing.write_atomic(self.dir / f"{array}.offsets", offsets.tobytes())

    def _setup(self, stop: bool = True) -> str:
        """The setup line for a job's script, then (`stop`: a task's script) a stop with its
        exit status where it ended non-zero (the task ran on without what it set up), then back
        to the driver's folder, which the inputs' relative paths start from (`cd /proj &&
        source venv/bin/activate` left the task in /proj). The probe goes on past a non-zero
        status: `[ "$PACKTOOL_SLURM_ROLE" = task ] && ...` ends 1 there, and its own checks
        (the interpreter, the folder) say what a task needs."""
        if not self.slurm.setup:
            return ""
        check = (
            'if [ "$packtool_setup" -ne 0 ]; then\n'
            '  echo "packtool-slurm: the setup line ended with exit status $packtool_setup; the '
            'task stops (a condition: if ...; then ...; fi)" >&2\n'
            '  exit "$packtool_setup"\n'
            "fi\n"
        )
        # A line that ends the shell itself (`exit 3`, a failing `set -e` step) left the probe's
        # log empty: "the probe job failed (log: ...)" and nothing in it (until 2026-12-08)
        said = shlex.quote(
            "echo \"packtool-slurm: the setup line ended the job's shell (exit status $?) before "
            'packtool ran" >&2'
        )
        return (
            f"trap {said} EXIT\n{self.slurm.setup}\npacktool_setup=$?\ntrap - EXIT\n"
            f"{check if stop else ''}cd {shlex.quote(os.getcwd())}\n"
        )

    def _script(self, array: str, task: str = '"$SLURM_ARRAY_TASK_ID"', name: str = "") -> Path:
        """The script of an array running `array`'s descriptors, in `NAME.sh` (`name`, else
        `array`): one file per submitted array, which is how a timed-out sbatch's job is found
        in the queue (`commands.submit_array`)."""
        python = shlex.quote(sys.executable)
        body = (
            "#!/bin/bash\n"
            "export PACKTOOL_SLURM_ROLE=task\n"
            f"{self._setup()}"
            f"exec {python} -m packtool.engines.slurm.task {shlex.quote(str(self.dir))} "
            f"{array} {task}\n"
        )
        path = self.dir / f"{name or array}.sh"
        writing.write_atomic(path, body.encode())
        return path

    # --- waiting ---

    def run_partitions(self) -> None:
        todo = set(self.run.todo)  # the partitions without a record when the run was opened
        if not todo:  # nothing to run: an earlier driver's jobs cancelled, squeue not asked
            self.cancel()
            return
        self.stop_other_mode(pilots=True)  # pull-mode workers: gone before the listing
        done = set(records.finished(self.run.work))
        live = cli.live_tasks(self.jobs)  # jobs of an earlier driver still queued: re-attach
        # The others ended: what they left is submitted now.
        self.open = {key for key in live if self._partitions_of(key)}
        self.attached = len(self.open)
        covered = {p for key in self.open for p in self._partitions_of(key)}
        self._probe(live)
        self._submit(sorted(p for p in todo if p not in done and p not in covered))
        # --no-wait: detach while a task has work left; with none (every partition has its
        # record; a task may still be leaving the queue) finish now, as --resume does
        busy = {k for k in self.open if any(p not in done for p in self._partitions_of(k))}
        if not self.slurm.wait and busy:
            raise self._detached(len(todo - done), {key.partition("_")[0] for key in busy})
        self._wait(todo)

    def stop_other_mode(self, pilots: bool) -> None:
        """A run resumed in the other mode (fixed shares <-> `--slurm-workers`): the first
        mode's jobs, which this driver does not follow, are cancelled and gone before it
        submits (they were left queued, running partitions beside this driver's tasks)."""
        other = {job for job, entry in self.jobs.items() if bool(entry.get("pilots")) == pilots}
        cancel_and_wait(other, f"{RESUME} in the other mode")

    def _detached(self, partitions: int, jobs: set[str]) -> Detached:
        """`--no-wait`: what the command prints (the jobs run on; `--resume` re-attaches)."""
        queued = sorted(jobs, key=int)
        ids = ", ".join(queued)
        line = resume_command(self.run.command) if self.run.command else None
        again = f"`{line}`" if line else f"the same command with {RESUME}"
        return Detached(
            f"submitted {partitions} partition(s) to Slurm (job(s) {ids}); the run goes on "
            f"there: {again} waits for it and finishes {self.run.out_dir} (it re-attaches to "
            "these jobs)",
            queued,
        )

    def tasks(self, kind: str) -> str:
        """`N {kind} task(s)`, saying which an earlier driver queued (a --resume that only
        re-attached said `0 array task(s)`)."""
        if not self.attached:
            return f"{self.submitted} {kind} task(s)"
        if not self.submitted:
            return f"re-attached to {self.attached} {kind} task(s)"
        return f"{self.submitted} {kind} task(s) (and re-attached to {self.attached})"

    def describe(self) -> str:
        """What ran the partitions, in words (the summary's line)."""
        return (
            f"Slurm: {self.tasks('array')} of {self.slurm.tasks_per_job} partition(s), "
            f"{self.slurm.cpus_per_task or 1} CPU(s) each (stage times summed over tasks)"
        )

    def _probe(self, live: dict[str, str]) -> None:
        """A one-second job, with the run's options and setup line, that proves the nodes see
        the run's folder (it writes `PROBE_OK` there); the arrays depend on it (`afterok`), so
        on a cluster that cannot see the folder no partition starts and the driver says so in
        one line. Skipped once a probe succeeded (a resumed run)."""
        self.probe_job = None
        if storage.is_file(self.dir / PROBE_OK):
            return
        probes = [j for j, e in self.jobs.items() if e["array"] == "probe"]
        if probes and f"{probes[-1]}_0" in live:  # a detached run's probe, still to run
            self.probe_job = probes[-1]
            return
        # None yet, or the last one ended without its mark: failed, or cancelled before it ran
        # (the driver's Ctrl-C cancels every job it submitted; reusing that probe made every
        # --resume fail on it). A new probe decides: a real failure fails again, in one line.
        # The driver's Python must start there and import packtool (a node without the
        # environment passed the probe, and every task failed after it).
        target = shlex.quote(str(self.probe_target))
        python = shlex.quote(sys.executable)
        cannot_import = shlex.quote(f"packtool-slurm: {sys.executable} cannot import packtool on")
        body = (
            "#!/bin/bash\n"
            "export PACKTOOL_SLURM_ROLE=probe\n"
            f"{self._setup(stop=False)}"
            f"if ! {python} -c 'import packtool'; then\n"
            f'  echo {cannot_import} "$(hostname)" >&2\n'
            "  exit 3\n"
            "fi\n"
            f"if [ -d {target} ] && touch {target}/{PROBE_OK}; then exit 0; fi\n"
            f'echo {shlex.quote(f"{CANNOT_SEE} {self.probe_target} from")} "$(hostname)" >&2\n'
            "exit 3\n"
        )
        script = self.dir / "probe.sh"
        writing.write_atomic(script, body.encode())
        options = [*self.options, f"--output={output_pattern(self.logs / 'probe.log')}"]
        self.probe_job = self._submit_job(
            options, 1, str(script), {"array": "probe", "tasks": [[]]}
        )

    def _check_probe(self, live: dict[str, str]) -> None:
        """Once the probe left the queue without its mark: the one-line error (arrays cancelled
        by the caller)."""
        if self.probe_job is None or f"{self.probe_job}_0" in live:
            return
        if storage.is_file(self.dir / PROBE_OK):
            self.probe_job = None
            return
        self._check_visible(self.logs / "probe.log", probe=True)
        raise ConfigError(
            f"{cli.SLURM}: the probe job {self.probe_job} failed before any partition ran "
            f"(log: {self.logs / 'probe.log'}{last_line(self.logs / 'probe.log')})"
        )

    def _partitions_of(self, key: str) -> list[int]:
        job, _, task = key.partition("_")
        entry = self.jobs.get(job)
        if entry is None or not task.isdigit() or int(task) >= len(entry["tasks"]):
            return []
        return entry["tasks"][int(task)]

    def _wait(self, todo: set[int]) -> None:
        """Poll until every partition of `todo` is recorded. Each poll costs the tasks still to
        finish (a stat of their partitions' records, then one squeue of their jobs), never the
        run's whole history. The records come first, and are looked at again when squeue
        refuses for good: a run whose partitions all finished needs no answer from squeue (it
        failed so while the controller timed out), and ends cancelling its jobs, whatever is
        left of them, without asking which (`cancel`: scancel of a finished job does nothing).
        """
        done = set(records.finished(self.run.work)) & todo  # one listing, at the start
        for p in sorted(done):
            self.run.account(records.read_record(self.run.work, p))
        gone_once: set[str] = set()
        while True:
            if self._recorded(todo, done):
                # Tasks still queued have nothing left (exiting, or requeued after finishing):
                # a finished run leaves no job behind, also one dropped from `open` once
                # another task recorded its partitions.
                self.cancel()
                return
            jobs = {key.partition("_")[0] for key in self.open}
            if self.probe_job is not None:
                jobs.add(self.probe_job)
            try:
                # Asked after the records: a task seen gone counts only when seen gone at the
                # next poll too, after its records were looked at again (they may lag).
                live = cli.live_tasks(
                    jobs,
                    wanted=lambda: not self._recorded(todo, done),  # looked at between retries
                    look_every=self.slurm.poll_seconds,
                )
            except cli.SlurmRefused:
                if self._recorded(todo, done):  # finished while squeue was asked again
                    self.cancel()
                    return
                raise
            self._say_held(live)
            self._check_probe(live)
            resubmit = []
            for key in sorted(self.open):
                missing = [p for p in self._partitions_of(key) if p in todo and p not in done]
                if not missing:
                    self.open.discard(key)
                    continue
                if key in live:
                    gone_once.discard(key)  # back (a requeue): gone twice in a row counts
                    continue
                if key not in gone_once:  # out of the queue: look again (records may lag)
                    gone_once.add(key)
                    continue
                gone_once.discard(key)
                self.open.discard(key)
                job, _, task = key.partition("_")
                log = self.logs / f"{self.jobs[job]['array']}-{task}.log"
                self._check_visible(log)
                for p in missing:
                    if (error := task_error(self.dir, p, key)) is not None:
                        raise error  # fails the same way again: raised as itself
                    self.attempts[p] = self.attempts.get(p, 0) + 1
                    if self.attempts[p] > self.slurm.max_retries:
                        raise self.run.workers_lost(
                            f"partition {p} ended without a record {self.attempts[p]} times in "
                            f"Slurm (last task log: {log}{last_line(log)})",
                            "see the log",
                        )
                resubmit += missing
            if resubmit:
                self._submit(sorted(resubmit))
            # Partitions, not tasks (nor the probe): one running in each running task with
            # work left, every other one not done pending (held ones too).
            running = sum(1 for key in self.open if live.get(key, "PENDING") not in cli.WAITING)
            pending = len(todo) - len(done) - running
            self._progress(len(done), len(todo), running, pending, sum(self.attempts.values()))
            time.sleep(self.slurm.poll_seconds)

    def _recorded(self, todo: set[int], done: set[int]) -> bool:
        """Account the partitions of the open tasks that have a record now (added to `done`; a
        stat each, pending tasks' too: one requeued after its last record finished the run);
        whether every partition of `todo` has one."""
        for key in sorted(self.open):
            for p in self._partitions_of(key):
                if (
                    p in todo
                    and p not in done
                    and storage.exists(records.record_path(self.run.work, p))
                ):
                    self.run.account(records.read_record(self.run.work, p))
                    done.add(p)
        return todo <= done

    def _check_visible(self, log: Path, probe: bool = False) -> None:
        """A node that cannot see the run's folder: one line now, not retries. Found by the
        probe, or before any partition finished, a `ConfigError` (nothing to keep); mid-run
        (a node without the mount among nodes with it), `WorkersLost`, which keeps the finished
        partitions for `--resume` (as a ConfigError, a fresh run's staging folder was removed
        with them: `output_folder.discard_staging`)."""
        try:
            text = storage.read_text(log) if storage.is_file(log) else ""
        except (OSError, UnicodeDecodeError):
            return
        line = next((s for s in text.splitlines() if s.startswith(CANNOT_SEE)), None)
        if line is None:
            return
        where = line.removeprefix(CANNOT_SEE).strip()
        if probe or not records.finished(self.run.work):
            raise ConfigError(
                f"{cli.SLURM}: the cluster's nodes cannot see the run's folder ({where}); "
                "write the output to a file system every node mounts"
            )
        raise self.run.workers_lost(
            f"{cli.SLURM}: a node cannot see the run's folder mid-run ({where})",
            "keep that node out with --sbatch-arg=--exclude=NODE / "
            "sbatch_args=('--exclude=NODE',), or write the output to a file system every node "
            "mounts",
        )

    def _say_held(self, live: dict[str, str]) -> None:
        """A line on stderr, once per job and state, for tasks Slurm holds (REQUEUE_HOLD,
        SPECIAL_EXIT, SUSPENDED, ..., and pending ones held by their user or an admin,
        JobHeldUser, JobHeldAdmin: `commands.HELD_STATES`): the run waits for them, and said
        nothing."""
        held: dict[tuple[str, str], int] = {}
        for key, state in live.items():
            if state in cli.HELD_STATES:
                job = key.partition("_")[0]
                held[job, state] = held.get((job, state), 0) + 1
        for (job, state), n in sorted(held.items()):
            if (job, state) not in self.held_said:
                self.held_said.add((job, state))
                self.run.bar.write(
                    f"packtool: Slurm holds {n} task(s) of job {job} ({state}); the run waits "
                    f"for them: `{cli.HELD_STATES[state]} {job}` lets them run"
                )

    def _progress(self, done: int, total: int, running: int, pending: int, failed: int) -> None:
        self.run.bar.note(
            f"partitions {done}/{total} done, {running} running, {pending} pending, {failed} failed"
        )

    def job_ids(self) -> list[str]:
        """Every job of this run (its run state's, and what is open), in submission order."""
        ids = {key.partition("_")[0] for key in self.open} | set(self.jobs)
        return sorted(ids, key=lambda job: (len(job), job))

    def cancel(self, wait: float = 0.0) -> None:
        """scancel every job of this run (`wait`: `commands.cancel`'s)."""
        cli.cancel(self.job_ids(), wait)


def output_pattern(path: Path | str) -> str:
    """`path` as sbatch's `--output` takes it: its `%` doubled (sbatch reads `%j`, `%a`, ... in
    a file name as the job's id, the task's index: `/scratch/run_%j/` became another folder).
    A path with a `\\` is refused before any work (`state.check_logs_path`): sbatch then reads
    no pattern, `%%` included, and removes the `\\`."""
    return str(path).replace("%", "%%")


def last_line(log: Path) -> str:
    try:
        lines = [s for s in storage.read_text(log).splitlines() if s.strip()]
    except (OSError, UnicodeDecodeError):
        return ""
    return f": {lines[-1].strip()[:200]}" if lines else ""
