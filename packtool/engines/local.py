"""The local engine: the partition workers over this machine's cores.

    plan (driver) -> partition workers, one per core, each a process   -> records -> root of the
                     read -> tokenize -> pack chunks -> final-named         tail tree (driver)
                     shards + tail + completion record;                   -> index.json
                     then the tail tree's merge nodes, level by level,
                     on the same workers

One partition to do (a corpus under `--partition-size`, or a resume with one left) runs in this
process, with the tokenizer's threads on every core and packing overlapped with reading, as
before partitions existed. More run in a pool of worker processes (`--workers`, default one per
core, at most one per partition), each with its share of the cores for its tokenizer. Processes
rather than threads: a worker that dies (out of memory, killed) then loses only its partition,
its memory goes back to the system when it exits, and JSON parsing, which holds the GIL, does
not serialise the workers. On this project's shared 2-core box the two measured within each
other's noise (README, "Scale-out": processes 1.4x faster in one run, threads 1.4x in the next);
`PACKTOOL_WORKER_POOL=thread` selects threads. The pool is a `forkserver` pool, so the workers
do not inherit this process's threads, and only small partition descriptors go to them; each
loads the tokenizer once, and usually finds the numba kernels the server loaded
(`pool_kernels`). Not where the server already ran without them (started earlier in this
process by a `tokenize --to megatron` run, whose server loads none: a later pack keeps it),
nor where the server's loading failed (a numba cache it cannot write): each worker then loads
them itself in its first partition. The extra rounds' kernel (`--rounds`) is never among them.

A worker process that dies (killed, out of memory) loses only its partition, and a fork server
that dies loses the partition it was starting a worker for: the pool is rebuilt and the unfinished partitions run again, each at most `MAX_RETRIES` times, with the same
bytes as a first attempt (packtool/engines/worker.py). The pool does not say which of its
workers died, so every partition it lost (running or queued) counts one loss: a partition that
kills its worker every time stops the run, deaths spread over a long run do not. Ctrl-C stops the workers at once; the
finished partitions stay in the staging folder for `--resume`.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import multiprocessing.forkserver
import os
import signal
from collections import deque
from collections.abc import Callable
from concurrent.futures import (
    FIRST_COMPLETED,
    Future,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    wait,
)
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

from packtool import lifeline
from packtool.engines import context
from packtool.engines.base import Driver, pack_with
from packtool.engines.config import RunConfig
from packtool.engines.context import WorkerContext
from packtool.engines.interrupts import ctrl_c_after
from packtool.engines.summary import PackSummary
from packtool.engines.worker import rechunk, run_partition
from packtool.errors import option_choice
from packtool.storage import local as storage
from packtool.storage import remote
from packtool.tokenizer.tokenizers import Tokenizer

POOL_ENV = "PACKTOOL_WORKER_POOL"
"""`process` (the default) or `thread`: how the local engine runs several partition workers
(`thread` exists to measure the choice; README, "Scale-out")."""
MAX_RETRIES = 3
"""Times one partition (or tail-tree unit) runs again after a worker process died while it was
in the pool; a unit lost once more stops the run."""

__all__ = ["PackSummary", "RunConfig", "drive_local", "local_driver", "rechunk", "run_pack"]


def run_pack(
    config: RunConfig, tokenizer: Tokenizer | str | None = None, *, bos: int | str | None = "auto"
) -> PackSummary:
    """Pack `config.inputs` into shards + `index.json` in `config.out_dir`.

    Args:
        config: inputs, output folder and every option.
        tokenizer: encodes raw corpora: a `Tokenizer` or a `load_tokenizer` spec. For tokenized
            Parquet inputs it must match the recorded tokenizer; None accepts the recorded one
            (and means `byte` for raw corpora).
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).
    """
    return pack_with(config, tokenizer, local_driver(config.workers), bos=bos)


def local_driver(workers: int | None) -> Driver:
    """The local engine's `Driver`: `workers` partition workers (None: one per core), their
    processes' server started while the inputs are checked (`_start_early`)."""
    return Driver(lambda run: drive_local(run, workers), early=_start_early)


def drive_local(run: Any, workers: int | None) -> str:
    """Run every wave of `run` (a `base.Run`, or another job's run of the same shape:
    packtool/engines/megatron/run.py) on this machine's cores; what was used, in words.

    `workers`: the `--workers` option (None: one per core, at most one per unit of a wave)."""
    cores = _cores()
    waves = run.waves()
    n = min(workers or cores, max(map(len, waves), default=1))
    if n <= 1:
        tok = run.context.tokenizer
        if tok is not None:
            tok.workers = workers or tok.workers  # --workers: the cores to use
        ctx = run.context
        if isinstance(ctx, WorkerContext):
            # One partition at a time, with the machine to itself: its shards are encoded on
            # two threads too (packtool/dataset/shards.py), the only work left after its last token.
            ctx = replace(ctx, shard_threads=min(2, workers or cores))
        for wave in waves:
            for p in wave:
                run.account(run_partition(ctx, run.descriptor(p)))
        threads = f"{tok.workers} tokenizer thread(s), " if tok is not None else ""
        return f"1 partition worker in this process ({threads}{cores} cores)"
    threads = max(1, cores // n)
    kind = os.environ.get(POOL_ENV, "process")
    _run_pool(run, waves, n, threads, kind)
    return (
        f"{n} partition worker {'process' if kind != 'thread' else 'thread'}(es) x "
        f"{threads} tokenizer thread(s) ({cores} cores; stage times summed over workers)"
    )


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


# --- the worker processes: a context shipped once per process, then one descriptor per task ---


def _start_early(config: RunConfig, paths: list[Any]) -> None:
    """Start the worker processes' server while the driver goes on checking and planning,
    when the inputs make more than one partition (more bytes than `--partition-size`: the plan
    groups files up to it) and more than one worker may run; one partition runs in this
    process, where the server's imports would only take a core from it."""
    if config.workers == 1 or _cores() < 2:
        return
    if sum(st.st_size for st in storage.stat_all(paths)) > config.partition_size:
        start_pool_server((*map(str, paths), str(config.out_dir)), kernels=True)


def start_pool_server(paths: tuple[str, ...] = (), kernels: bool = False) -> Any:
    """The `forkserver` context the worker processes come from, its server started now.

    Started before the driver checks the inputs and plans, so its imports (the worker's
    modules, and the store's client library for `paths` in a bucket: `remote.client_modules`)
    and, for `kernels` (a pack's workers), the packer's numba kernels (`pool_kernels`) run on
    another core meanwhile, once, and every worker forked from it has them; no run waits for
    them at its first partition. A server started earlier (another run in this process) is
    kept as it is. Does nothing with `PACKTOOL_WORKER_POOL=thread`."""
    mp = multiprocessing.get_context("forkserver")
    if os.environ.get(POOL_ENV, "process") == "process":
        mp.set_forkserver_preload(_preload(paths, kernels))
        _start_deaf(multiprocessing.forkserver.ensure_running)
    return mp


def _start_deaf(start: Callable[[], None]) -> None:
    """`start()` the fork server with SIGINT blocked in this thread, so that the server starts
    with it blocked (a mask outlives fork and exec; a handler does not) and a Ctrl-C in its
    start-up waits until `pool_server` ignores it and unblocks it: before that, its imports
    died of it with a traceback (6 of 10 early Ctrl-Cs of a multi-partition pack). This
    process loses nothing: another thread takes the signal meanwhile, or this one once it is
    unblocked. As CPython starts its resource tracker, which is started first here (its own
    start unblocks SIGINT when it ends: `_start_tracker`)."""
    _start_tracker()
    if not hasattr(signal, "pthread_sigmask"):  # pragma: no cover - not POSIX
        start()
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # as it was


def _start_tracker() -> None:
    """CPython's resource tracker, started where it is not yet, without its leak warning.

    The pool's queues hold named semaphores (a worker the fork server starts later opens them
    by name, so they cannot be unlinked at once), which the tracker unlinks if this process
    dies first. After a `kill -9` of the driver it did, and printed "UserWarning:
    resource_tracker: There appear to be 5 leaked semaphore objects to clean up at shutdown"
    (two lines, after the shell's prompt) for what it was cleaning up as it should. It starts
    with `sys.warnoptions` as its flags (`-W`): one more, for its process alone, turns its own
    warnings off ("resource_tracker: ..."; it still unlinks). A tracker already running
    (a program's own, started before) is left as it is."""
    import sys
    from multiprocessing import resource_tracker

    given = list(sys.warnoptions)
    sys.warnoptions.append("ignore:resource_tracker:UserWarning")
    try:
        resource_tracker.ensure_running()
    finally:
        sys.warnoptions[:] = given  # this process's filters never read it: only the tracker's


def _preload(paths: tuple[str, ...], kernels: bool = False) -> list[str]:
    """`pool_server` first (the server and its workers ignore Ctrl-C: the driver answers it;
    and the server ends if its driver does before `pool_ready`, last), then what every worker
    process imports sooner or later: this module (the pool's initializer and task live here),
    the store clients for `paths`, and pandas where it is installed: pyarrow imports it at a
    process's first `pa.array` / `to_numpy` (~0.45 s of one core here), which every worker that
    keeps a tail reaches. Then, for `kernels` (the workers of a pack), `pool_kernels`: the
    packer's numba kernels, loaded once for all workers (0.6-1.3 s of CPU a process: what that
    measures is in `pool_kernels`)."""
    modules = ["packtool.engines.pool_server", "packtool.engines.local"]
    modules += remote.client_modules(paths)
    if importlib.util.find_spec("pandas") is not None:
        modules.append("pandas")
    if kernels:
        modules.append("packtool.engines.pool_kernels")
    modules.append("packtool.engines.pool_ready")
    return modules


_CONTEXT: WorkerContext | None = None


def _init_process(ctx: WorkerContext, threads: int, env: dict[str, str], driver: int) -> None:
    global _CONTEXT
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver stops the pool on Ctrl-C
    lifeline.follow(driver)  # and a driver killed outright takes the pool with it
    # Where and as whom buckets are read, as the driver has it now: the forkserver the workers
    # come from may have been started before (packtool/storage/remote.py, "FORWARDED").
    os.environ.update(env)
    if ctx.tokenizer is not None:
        ctx.tokenizer.workers = threads
    context.setup_process(threads)
    _CONTEXT = context.without_render_pool(ctx)


def _run_in_process(descriptor: dict[str, Any]) -> dict[str, Any]:
    assert _CONTEXT is not None, "the pool initializer did not run"
    return run_partition(_CONTEXT, descriptor)


def _make_pool(run: Any, workers: int, threads: int, kind: str) -> tuple[Any, Callable]:
    if kind == "thread":
        ctx = run.context
        if ctx.tokenizer is not None:
            ctx.tokenizer.workers = threads
        pool = ThreadPoolExecutor(workers, thread_name_prefix="packtool-partition")
        return pool, lambda d: run_partition(ctx, d)
    # already running when run_pack started it; a pack's workers run the packer's kernels
    mp = start_pool_server(kernels=isinstance(run.context, WorkerContext))
    pool = ProcessPoolExecutor(
        workers,
        mp_context=mp,
        initializer=_init_process,
        initargs=(run.context, threads, remote.forwarded_env(), os.getpid()),
    )
    return pool, _run_in_process


def _run_pool(run: Any, waves: list[list[int]], workers: int, threads: int, kind: str) -> None:
    """Run each wave's units on `workers` workers, a wave once the one before it is done, at
    most two units queued per worker; the pool is kept from wave to wave."""
    lost: dict[int, int] = {}  # unit -> times it was lost with a dead worker (units lost only)
    pool = task = None
    try:
        for wave in waves:
            todo = deque(wave)  # popped from the front: O(1) a unit at 10^5 partitions
            while todo:
                if pool is None:
                    pool, task = _make_pool(run, workers, threads, kind)
                inflight: dict[Future, int] = {}
                try:
                    while todo or inflight:
                        while todo and len(inflight) < 2 * workers:
                            # A submit may start a worker process (held: its Ctrl-C is raised
                            # after it); the first waits for the fork server's imports, so the
                            # CLI's watchdog and second Ctrl-C still end the run meanwhile.
                            with ctrl_c_after(at_once=True):
                                # raises BrokenProcessPool if a worker died: the unit stays todo
                                inflight[_submit(pool, task, run.descriptor(todo[0]))] = todo[0]
                            todo.popleft()
                        finished, _ = wait(inflight, return_when=FIRST_COMPLETED)
                        for fut in finished:
                            record = fut.result()  # raises BrokenProcessPool if its worker died
                            del inflight[fut]  # only now: a unit lost with its worker runs again
                            run.account(record)
                except BrokenProcessPool:
                    # A worker process died (killed, out of memory); its units run again.
                    _stop(pool)
                    pool = None
                    units = list(inflight.values()) or [todo[0]]  # [todo[0]]: broke at submit
                    for unit in units:
                        lost[unit] = lost.get(unit, 0) + 1
                    over = sorted(u for u in units if lost[u] > MAX_RETRIES)
                    if over:
                        raise run.workers_lost(
                            f"worker processes died {lost[over[0]]} times while "
                            f"{_units_named(over, run.partitions)} ran or waited in the pool "
                            "(which unit's worker died, the pool does not say)",
                            f"fewer {option_choice('--workers', 'workers', 'N')} if memory is "
                            "short",
                        ) from None
                    todo = deque(sorted(set(todo) | set(inflight.values())))
    except BaseException:
        if pool is not None:
            _stop(pool)
        raise
    if pool is not None:
        pool.shutdown(wait=True)


def _submit(pool: Any, task: Callable, descriptor: dict[str, Any]) -> Future:
    """`pool.submit`, a fork server that died (killed, out of memory) raised as the worker
    death it is: the server's end of the socket closed while it was to fork a worker, an
    `EOFError` that reached click as a Ctrl-C ("interrupted", exit 130). Only here: a unit
    that raises `EOFError` itself is that unit's error, not a lost worker."""
    try:
        return pool.submit(task, descriptor)
    except EOFError as exc:
        raise BrokenProcessPool(f"the worker processes' fork server died ({exc})") from exc


def _units_named(units: list[int], partitions: int) -> str:
    """`partition(s) 3, 4` (the first 8), and/or `a tail-tree merge` (units from `partitions`
    on): every unit at the limit, since the others in the pool with the one that kills its
    worker reach it at the same break (naming the lowest named a partition that never failed)."""
    named = [u for u in units if u < partitions]
    words = []
    if named:
        more = f" and {len(named) - 8} more" if len(named) > 8 else ""
        words.append(f"partition(s) {', '.join(map(str, named[:8]))}{more}")
    if len(named) < len(units):
        words.append("a tail-tree merge")
    return " and ".join(words)


def _stop(pool: Any) -> None:
    """Stop a pool now: queued partitions cancelled, running worker processes killed and gone
    before this returns (so none writes into a staging output its run's failure then deletes).
    The processes are taken before `shutdown`, which forgets them (Python 3.11-3.13: the kill
    that followed it never ran, and a failed run's other workers wrote on after its discard).
    Threads (`PACKTOOL_WORKER_POOL=thread`) cannot be killed: the running units finish first
    (a failed run's discard raced them: "parts: Directory not empty", the real error lost)."""
    if isinstance(pool, ThreadPoolExecutor):
        pool.shutdown(wait=True, cancel_futures=True)
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())
    terminate = getattr(pool, "terminate_workers", None)  # Python 3.14+
    if terminate is not None:
        terminate()
    else:
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.kill()
    for proc in procs:
        proc.join(timeout=10)
