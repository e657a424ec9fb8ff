"""What the Slurm engine asks of Slurm, through its commands: `sbatch`, `squeue`, `scancel`,
`scontrol`. Each call is one subprocess with its output parsed here; a refusal is a one-line
`SlurmRefused` (a `ConfigError`) quoting Slurm's own line (its first error line, not a warning
printed before it). The queue's state is asked
again a few times before a refusal counts: a busy controller answers "Socket timed out" now and
then, and one such answer must not stop a long run. So is sbatch, after the queue is asked
whether the job was queued before its answer was lost (`submit_array`).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from packtool.engines.interrupts import ctrl_c_after
from packtool.errors import ConfigError, option_choice
from packtool.storage import local as storage

SLURM = option_choice("--engine", "engine", "slurm")
"""What the Slurm engine's messages open with: `--engine slurm / engine='slurm'`."""
LIVE_STATES = frozenset(
    {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
     "RESIZING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESV_DEL_HOLD",
     "SPECIAL_EXIT"}
)  # fmt: skip
"""squeue states of a task that may still write its records. SPECIAL_EXIT is held as
REQUEUE_HOLD is (Slurm's own words): counted gone, its partitions were resubmitted, and ran
twice once it was released."""

HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin"})
"""squeue reasons of a PENDING task held by its user or an admin (`scontrol hold`, `sbatch
--hold`): `live_tasks` reports the reason as the task's state."""

HELD_STATES = {
    "REQUEUE_HOLD": "scontrol release",
    "SPECIAL_EXIT": "scontrol release",
    "RESV_DEL_HOLD": "scontrol release",
    "SUSPENDED": "scontrol resume",
    "STOPPED": "scancel --signal=CONT",
    **dict.fromkeys(sorted(HELD_REASONS), "scontrol release"),
}
"""Live states (and held pending tasks' reasons) in which a task runs nothing until someone
acts: what releases it."""

WAITING = frozenset({"PENDING", *HELD_REASONS})
"""What `live_tasks` says of a task that has not started."""

RETRY_SECONDS = (2.0, 5.0, 10.0, 20.0, 30.0)
"""The waits before squeue is asked again after a refusal or a timeout (about a minute in all)."""


class SlurmRefused(ConfigError):
    """A Slurm command refused or failed. Before the run (`sbatch --test-only`): its options.
    During it (a poll, a resubmit): the cluster, not the command, so the driver keeps the
    finished partitions for `--resume` (`driver.drive_slurm`)."""


def require(program: str = "sbatch") -> str:
    """The path of a Slurm command, or a `ConfigError` saying where to run."""
    path = storage.which(program)
    if path is None:
        raise ConfigError(
            f"{SLURM}: no {program} on PATH; run on a Slurm login node (or load its module)"
        )
    return path


def _run(args: Sequence[str], what: str, timeout: float = 120, own_session: bool = False) -> str:
    try:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            start_new_session=own_session,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SlurmRefused(f"{SLURM}: {what} failed ({exc})") from None
    if done.returncode != 0:
        raise SlurmRefused(f"{SLURM}: {what} refused: {refusal_line(done)}")
    return done.stdout


def refusal_line(done: subprocess.CompletedProcess) -> str:
    """The line of a failed command's stderr that says why: the first naming an error (sbatch
    prints its warnings first: "sbatch: warning: ..." was quoted before "sbatch: error: Invalid
    account"), else the first line, else the exit status."""
    lines = [s.strip() for s in done.stderr.splitlines() if s.strip()]
    return next((s for s in lines if "error" in s.lower()), lines[0] if lines else "") or (
        f"exit {done.returncode}"
    )


SBATCH_VALUED = frozenset({
    "account", "acctg-freq", "array", "autocomplete", "batch", "bb", "bbf", "begin", "chdir",
    "cluster", "cluster-constraint", "clusters", "comment", "constraint", "container",
    "container-id", "context", "core-spec", "cores-per-socket", "cpu-freq", "cpus-per-gpu",
    "cpus-per-task", "deadline", "delay-boot", "dependency", "distribution", "error",
    "exclude", "export", "export-file", "extra", "extra-node-info", "gid", "gpu-bind",
    "gpu-freq", "gpus", "gpus-per-node", "gpus-per-socket", "gpus-per-task", "gres",
    "gres-flags", "hint", "input", "job-name", "kill-on-invalid-dep", "licenses", "mail-type",
    "mail-user", "mcs-label", "mem", "mem-bind", "mem-per-cpu", "mem-per-gpu", "mem-update",
    "mincpus", "network", "nodefile", "nodelist", "nodes", "ntasks", "ntasks-per-core",
    "ntasks-per-gpu", "ntasks-per-node", "ntasks-per-socket", "ntasks-per-tres", "open-mode",
    "output", "partition", "prefer", "priority", "profile", "qos", "reservation", "resources",
    "runtime", "segment", "signal", "sockets-per-node", "switches", "tasks-per-node",
    "thread-spec", "threads-per-core", "time", "time-min", "tmp", "tres-bind", "tres-per-task",
    "uid", "wait-all-nodes", "wckey", "wrap",
})  # fmt: skip
"""sbatch's long options that need a value (`required_argument` in Slurm's
src/common/slurm_opt.c, 26.11): given without `=`, getopt takes the next argument as it,
whatever it starts with (`--comment -o` is a comment)."""
SBATCH_UNVALUED = frozenset({
    "consolidate-segments", "contiguous", "exclusive", "external", "get-user-env", "help",
    "hold", "ignore-pbs", "nice", "no-kill", "no-requeue", "oom-kill-step", "overcommit",
    "oversubscribe", "parsable", "propagate", "quiet", "reboot", "requeue", "resv-ports",
    "spread-job", "spread-segments", "stepmgr", "test-only", "usage", "use-min-nodes",
    "verbose", "version", "wait",
})  # fmt: skip
"""sbatch's other long options: no value, or one given only as `--name=value`
(`optional_argument`: `--exclusive=user`); the next argument is never theirs. (Both lists
together: what an abbreviation is resolved against, as getopt does.)"""
SHORT_FLAGS = "HhkOQsuVvW"
"""sbatch's short options that take no argument: in a bundle (`-vo FILE`) the letter after one
is another option; after any other the rest of the bundle is that option's argument."""


def named_options(
    options: Sequence[str], names: dict[str, str], flags: Collection[str] = ()
) -> list[tuple[str, str]]:
    """The sbatch arguments of `options` that set one of `names` (a long name -> its short
    letter, or ""), as sbatch reads them: abbreviated too (getopt takes any unambiguous start
    of a long name: `--arr=0` is `--array=0`), short ones alone (`-a0`, `-a 0`) or bundled
    (`-va0`). Each as (the long name, the argument as given, with its value where apart:
    `-o x`, `--output x`). `flags`: the names that take no value."""
    shorts = {letter: name for name, letter in names.items() if letter}
    found: list[tuple[str, str]] = []
    skip = False
    for i, arg in enumerate(options):
        if skip:  # the value of an option given apart (`-J -a`, `--comment -o`: not options)
            skip = False
            continue
        value = list(options[i + 1 : i + 2])
        if arg.startswith("--") and len(arg) > 2:
            given, eq, _ = arg[2:].partition("=")
            name = next((n for n in names if n.startswith(given)), None)
            if name is not None:
                found.append((name, " ".join([arg, *([] if eq or name in flags else value)])))
            valued = name not in flags if name is not None else _long_option(given) is not None
            skip = not eq and valued
            continue
        if not arg.startswith("-") or len(arg) < 2:
            continue
        for j, letter in enumerate(arg[1:], 2):
            if letter in shorts:
                apart = j == len(arg) and shorts[letter] not in flags
                found.append((shorts[letter], " ".join([arg, *(value if apart else [])])))
                break
            if letter not in SHORT_FLAGS:
                skip = j == len(arg)  # its value is the next argument
                break
    return found


def _long_option(given: str) -> str | None:
    """The sbatch option `--given` is where it needs a value (`SBATCH_VALUED`), as getopt reads
    a name: whole, else the one option it begins (`--comm`: `--comment`). None for one that
    takes no next argument, and for one sbatch does not know or cannot tell (ambiguous): taken
    as a flag, the argument after it is read as an option, and one of the driver's own is
    refused with `--name=value` as the fix, where taken as a value it would pass unseen."""
    if given in SBATCH_VALUED or given in SBATCH_UNVALUED:
        return given if given in SBATCH_VALUED else None
    begun = [n for n in (*SBATCH_VALUED, *SBATCH_UNVALUED) if n.startswith(given)]
    return begun[0] if len(begun) == 1 and begun[0] in SBATCH_VALUED else None


def _takes_next(arg: str) -> bool:
    """Whether sbatch reads the argument after the option `arg` as its value: a long one that
    needs a value given without `=` (`_long_option`), a short one (alone or ending a bundle:
    `-J`, `-vJ`) that is not one of `SHORT_FLAGS`."""
    if arg.startswith("--"):
        given, eq, _ = arg[2:].partition("=")
        return not eq and _long_option(given) is not None
    for j, letter in enumerate(arg[1:], 2):
        if letter not in SHORT_FLAGS:
            return j == len(arg)  # else the rest of the bundle is its value
    return False


def refuse_stray_arguments(options: Sequence[str]) -> None:
    """One line, before any work, for an sbatch argument that is not an option nor an option's
    value, as sbatch reads them: `--` ends its options (the driver's own after it, `--array`
    and `--output`, and its script were read as the job's script and its arguments: "Unable to
    open file --wrap", naming no --sbatch-arg); any other (`job.sh`, `a b`, ``, `-`) is the
    job's script (an existing one ran in place of the driver's); and an option that needs a
    value with none after it (`--comment` last) took the driver's next option for it."""
    i = 0
    while i < len(options):
        arg = options[i]
        shown = shlex.quote(arg)
        if arg == "--":
            raise ConfigError(
                f"{SLURM}: -- in --sbatch-arg / sbatch_args ends sbatch's options: the driver's "
                "own after it and its script would be read as the job's script and its "
                "arguments; leave it out"
            )
        if not arg.startswith("-") or arg == "-":
            raise ConfigError(
                f"{SLURM}: {shown} in --sbatch-arg / sbatch_args is no sbatch option nor an "
                "option's value: sbatch would run it as the job's script, in place of the "
                "driver's; give sbatch options only, each value after its option's `=`"
            )
        if _takes_next(arg):
            if i + 1 == len(options):
                raise ConfigError(
                    f"{SLURM}: {shown} in --sbatch-arg / sbatch_args needs a value, and sbatch "
                    "would take the driver's next option for it; give it one, after `=` in the "
                    "same argument or as the next argument"
                )
            i += 1  # its value, whatever it looks like (`--comment --`, `-J job.sh`)
        i += 1


def refuse_other_clusters(options: Sequence[str]) -> None:
    """sbatch `--clusters` / `-M` (or `SBATCH_CLUSTERS`) submits to another cluster, where this
    driver's squeue and scancel (asking this one) never see its jobs: every task looked gone
    and was resubmitted. Refused in one line before any work (`--cluster=gpu`, sbatch's
    abbreviation, went through until 2026-12-06)."""
    named = [shown for _, shown in named_options(options, {"clusters": "M"})]
    if os.environ.get("SBATCH_CLUSTERS"):
        named.append(f"SBATCH_CLUSTERS={os.environ['SBATCH_CLUSTERS']}")
    if named:
        raise ConfigError(
            f"{SLURM}: {named[0]} submits to another Slurm cluster, whose jobs this "
            "driver cannot follow (its squeue and scancel ask this cluster); run packtool on a "
            "login node of that cluster, without it"
        )


_LOGS = "the tasks' logs, which it reads and its errors name"
DRIVER_OPTIONS = {
    "array": ("a", "each array's task range"),
    "output": ("o", _LOGS),
    "error": ("e", _LOGS),
    "wrap": ("", "each array runs the driver's script"),
    "dependency": ("d", "its arrays wait for its probe job"),
    "test-only": ("", "its jobs must be queued"),
    "wait": ("W", "sbatch must answer at once"),
}
"""sbatch options that are the driver's own (a long name -> its short letter, why): given again,
the later one on sbatch's line won (`--array=0`: one task of each array ran, the others counted
lost) or the run failed mid-way (`--wrap` beside the array's script)."""
DRIVER_ENV = {"SBATCH_ERROR": "error", "SBATCH_WAIT": "wait"}
"""sbatch's input variables for them that the driver's own options do not override."""


def refuse_driver_options(options: Sequence[str]) -> None:
    """One line, before any work, for an sbatch option that is the driver's own (`DRIVER_OPTIONS`)
    among the run's sbatch arguments or in sbatch's environment (`DRIVER_ENV`)."""
    named = named_options(
        options, {n: short for n, (short, _) in DRIVER_OPTIONS.items()}, ("test-only", "wait")
    )
    given = [
        (name, f"{shown} in --sbatch-arg / sbatch_args", "leave it out") for name, shown in named
    ]
    given += [
        (name, f"{var}={os.environ[var]}", f"unset {var}")
        for var, name in DRIVER_ENV.items()
        if os.environ.get(var)
    ]
    if given:
        name, shown, fix = given[0]
        raise ConfigError(
            f"{SLURM}: {shown} sets --{name}, which is the driver's own "
            f"({DRIVER_OPTIONS[name][1]}); {fix}"
        )


def max_array_size() -> int:
    """The cluster's `MaxArraySize` (task indices 0 .. MaxArraySize - 1 in one array)."""
    out = _run([require("scontrol"), "show", "config"], "scontrol show config")
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.M)
    return max(1, int(m.group(1))) if m else 1001


def test_only(options: Sequence[str], given: int = 0) -> None:
    """`sbatch --test-only` with the run's options: a bad partition, account or QoS is refused
    here, before any work (nothing is queued). `given`: how many of the last `options` are the
    run's own sbatch arguments (`--sbatch-arg`); where sbatch refuses the options with them
    and takes them without, the line names the one whose addition made it refuse, with its
    value where apart (sbatch's "allocation failure: Invalid feature specification" named
    none). Only a refusal costs those further checks (one sbatch each, at most `given` + 1)."""
    try:
        _test_only(options)
    except SlurmRefused:
        base, extra = list(options[: len(options) - given]), list(options[len(options) - given :])
        if not extra or _test_only(base, quiet=True) is not None:
            raise
        i = 0
        while i < len(extra):  # one argument at a time, an option's value apart with it
            n = 2 if _takes_next(extra[i]) else 1
            refused = _test_only([*base, *extra[: i + n]], quiet=True)
            if refused is not None:
                shown = shlex.join(extra[i : i + n])
                raise SlurmRefused(
                    f"{SLURM}: sbatch (--test-only) refused {shown} in --sbatch-arg / "
                    f"sbatch_args: {refused}"
                ) from None
            i += n
        raise


def _test_only(options: Sequence[str], quiet: bool = False) -> str | None:
    """`sbatch --test-only` of `options`; its refusal line (`quiet`) or `SlurmRefused`, else
    None."""
    try:
        _run([require(), "--test-only", *options, "--wrap", "true"], "sbatch (--test-only)")
    except SlurmRefused as exc:
        if not quiet:
            raise
        return str(exc).partition(" refused: ")[2] or str(exc)
    return None


TRANSIENT = (
    "socket timed out",
    "unable to contact slurm controller",
    "temporarily unavailable",
    "temporarily unable",
    "zero bytes were transmitted",
    "timed out after",
)
"""What a busy or restarting controller answers (lowercased): sbatch's answer may have been
lost after the job was queued, so the queue is asked before it is submitted again."""


def submit_array(
    options: Sequence[str], tasks: int, script: str, record: Callable[[str], None] | None = None
) -> str:
    """Submit `script` as an array of `tasks` tasks (indices 0 .. tasks - 1); its job id, given
    to `record` before Ctrl-C is let through (the driver writes it down: a stopped run cancels
    what it recorded).

    sbatch runs in a session of its own: the terminal's Ctrl-C, sent to the foreground process
    group, would otherwise kill it mid-request, the job queued or not, and its id unknown; the
    driver's own Ctrl-C (and SIGTERM) is held over each try and its record (`ctrl_c_after`).

    A transient refusal (`TRANSIENT`: a busy controller's "Socket timed out") is tried again
    after each of `RETRY_SECONDS`, but first the queue is asked (at once, and again after the
    wait) for a job running `script` (each array has a script of its own): a timed-out sbatch
    may have queued the job, and submitting it again would run its tasks twice; the last try's
    refusal is raised only where the queue holds nothing of it. A job that was queued and already left the
    queue is submitted again; its tasks skip the partitions it finished (`task.py`). Ctrl-C is
    let through during the waits (they were held for a minute): the queue is asked once, what
    is found recorded, then the run stops. After a later try, a job an earlier one queued
    unseen (its answer lost, and the queue's too) is cancelled."""
    args = [require(), "--parsable", f"--array=0-{tasks - 1}", *options, script]
    record = record or (lambda job: None)
    for attempt, wait in enumerate((*RETRY_SECONDS, None)):
        # Held over the try and, after a transient refusal, a look at the queue: a Ctrl-C in a
        # try that timed out (sbatch waits out the controller's time-out) stopped the run with
        # the job it may have queued unrecorded.
        with ctrl_c_after():
            try:
                job = _run(args, "sbatch", own_session=True).strip().split(";")[0]
            except SlurmRefused as exc:
                if not any(t in str(exc).lower() for t in TRANSIENT):
                    raise
                if found := _take_queued(script, record):
                    return found
                if wait is None:  # the last try, and nothing of it queued
                    raise
            else:
                record(job)
                if attempt:
                    cancel([j for j in queued_with_script(script) if j != job])
                return job
        try:
            time.sleep(wait)
        finally:  # (a Ctrl-C in the wait too: what the last try queued is recorded first)
            with ctrl_c_after():
                found = _take_queued(script, record)
        if found:
            return found
    raise AssertionError("unreachable")  # the last try returns or raises


def _take_queued(script: str, record: Callable[[str], None]) -> str:
    """The queued job running `script` (a try's whose answer was lost), recorded, the others
    running it cancelled; "" where none is queued."""
    found = queued_with_script(script)
    if found:
        record(found[0])
        cancel(found[1:])
    return found[0] if found else ""


def queued_with_script(script: str) -> list[str]:
    """The job ids of this user's queued jobs that run `script` (squeue's `%F`: an array's own
    id, whichever of its tasks is listed; `--all`: in partitions hidden from the user too), in
    the queue's order; none where squeue did not answer."""
    try:
        out = _run([require("squeue"), "--me", "--all", "-h", "-o", "%F|%o"], "squeue", 60)
    except SlurmRefused:
        return []
    names = {script, os.path.abspath(script)}
    found = []
    for line in out.splitlines():
        job, _, command = line.partition("|")
        if command.strip() in names and job.strip() and job.strip() not in found:
            found.append(job.strip())
    return found


def live_tasks(
    job_ids: Iterable[str],
    retry: bool = True,
    wanted: Callable[[], bool] | None = None,
    look_every: float = 1.0,
) -> dict[str, str]:
    """{`JOB_TASK` -> state} of the array tasks of `job_ids` still in the queue (one squeue;
    pending tasks listed one by one; a pending task held by its user or an admin has its
    reason, `JobHeldUser` / `JobHeldAdmin`, for its state). A refusal or a timeout is asked
    again after each of `RETRY_SECONDS` (`retry`) before it is raised. `wanted`, asked before
    each of those waits and every `look_every` seconds of it: False (the driver's run has all
    its records: no answer is needed any more) raises the refusal at once; without it a run
    that finished while squeue refused waited out every retry, 67 s, to end."""
    ids = [j for j in job_ids]
    if not ids:
        return {}
    # --all: the tasks in partitions hidden from this user too (squeue's default leaves them
    # out, and a task left out counts gone); %r: why a pending task waits (a hold)
    args = [require("squeue"), "--all", "-h", "-r", "-j", ",".join(ids), "-o", "%i %T %r"]
    for wait in (*(RETRY_SECONDS if retry else ()), None):
        try:
            out = _run(args, "squeue", 60, own_session=True)  # (a Ctrl-C: as `cancel`)
            break
        except SlurmRefused as exc:
            if "Invalid job id" in str(exc):  # every one of them finished and was purged
                return {}
            if wait is None or not _waited(wait, wanted, look_every):
                raise
    states = {}
    for line in out.splitlines():
        parts = line.split(maxsplit=2)  # a reason may hold spaces ("ReqNodeNotAvail, ...")
        if len(parts) >= 2 and parts[1] in LIVE_STATES:
            reason = parts[2].strip() if len(parts) == 3 else ""
            held = parts[1] == "PENDING" and reason in HELD_REASONS
            states[parts[0]] = reason if held else parts[1]
    return states


def _waited(seconds: float, wanted: Callable[[], bool] | None, look_every: float) -> bool:
    """Sleep `seconds` (in steps of `look_every` where `wanted` is given); False, at once,
    where `wanted` says no before a step."""
    left = seconds
    while left > 0:
        if wanted is not None and not wanted():
            return False
        step = min(left, max(look_every, 0.01)) if wanted is not None else left
        time.sleep(step)
        left -= step
    return True


SCANCEL_TIMEOUT_S = 60.0
"""How long `cancel` lets scancel run (a hung controller)."""


def cancel(job_ids: Iterable[str], wait: float = 0.0) -> None:
    """`scancel` the jobs (best effort: a run that stops leaves none in the queue; a refusal or
    a hung controller is no error of its own). `wait`: at most that many seconds until none
    is in the queue (scancel is asynchronous: a task still running could yet write into the
    staging folder a failed run removes next)."""
    ids = list(job_ids)
    if not ids or not storage.which("scancel"):
        return
    try:
        # In a session of its own: a terminal's Ctrl-C, sent to the foreground process group,
        # killed it mid-request (the driver goes on with the cancel through one signal:
        # `driver._cancel`), and the jobs of a failed run were left queued.
        subprocess.run(
            ["scancel", *ids],
            capture_output=True,
            timeout=SCANCEL_TIMEOUT_S,
            check=False,
            start_new_session=True,
        )
    except (OSError, subprocess.TimeoutExpired):
        return
    end = time.monotonic() + wait
    while wait and time.monotonic() < end:
        try:
            if not live_tasks(ids, retry=False):
                return
        except ConfigError:
            return
        time.sleep(0.3)
