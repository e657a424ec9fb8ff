"""The Ray engine: the partition workers as a Ray Data actor pool, anywhere in a cluster.

    driver (any node)                 Ray Data: from_items(descriptors)           driver
    plan -> partition descriptors  -> map_batches(PartitionActor, batch_size=1)  -> records ->
    (a few hundred bytes each)        one actor per CPU: read -> tokenize ->        root of the
                                      pack chunks -> shards + tail + record,        tail tree,
                                      on the shared file system; then a pool per    index.json
                                      level of merge nodes of the tail tree
                                      (packtool/engines/merge.py)

`_execute` feeds the descriptors of the partitions to do to `ray.data.from_items` (one block
each), and `map_batches` runs them on a pool of `PartitionActor`s (1 CPU each, one per CPU of
the cluster unless `actors` says fewer; the pool may shrink when nodes go). Each actor unpickles
the run's context (options, tokenizer) once and calls `worker.run_partition` (the local engine's
function) on one partition per batch: it reads its own byte ranges / row groups straight from
the shared file system and writes its shards there under their final names. What comes back
through Ray Data is the partition's record (a few KB, as JSON); the driver accounts each as it
arrives (`Run.account`), so for `pack` and `tokenize` no corpus byte passes through the driver
or any object store, and the streaming executor's backpressure bounds the records and blocks
in flight (not all of the driver's memory: Ray's own native bookkeeping grows ~2-5 KB a
partition done, docs/scale-out.md). `tokenize --to megatron` is the exception: its output is one `.bin`, so the
driver appends every part but the first (renamed) to it in the shared staging folder
(packtool/engines/megatron/merge.py, `copy_file_range`). A file system that copies on its
servers (an NFS 4.2 server-side copy) moves no byte through the driver's node; one without
(Lustre, most FUSE mounts) reads every such token byte into the driver's node and writes it
back: about twice the `.bin` over its network link (docs/scale-out.md).

Faults: an actor whose process or node dies is restarted (at most `max_retries` times each,
elsewhere if its node is gone) and Ray retries its partition there; a partition rewrites the
same bytes. A `PacktoolError` raised in an actor (a bad document under `--strict`, a changed
input) is not retried and surfaces as its own one-line message. The state is in the output's
staging folder: a killed driver is resumed with `--resume` from any node that sees it, and a
run started by the local engine can be finished by this one (and the other way round).

Cost: starting the pool (an actor process per CPU, importing packtool, unpickling the context)
takes ~2-3 s per `_execute` on this project's 2-core box against ~0.3 s for plain Ray tasks on
warm workers (README, "Ray engine"); a partition is seconds to minutes of work, so at scale the
pool's start vanishes, and in exchange a lost node or worker is Ray Data's to handle.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import pickle
import re
import signal
import socket
import threading
import time
import warnings
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from packtool import lifeline
from packtool.engines import context, output_folder, worker
from packtool.engines.base import Driver, pack_with
from packtool.engines.config import RunConfig
from packtool.engines.interrupts import sigterm_as_ctrl_c
from packtool.engines.summary import PackSummary
from packtool.errors import ConfigError, MissingDependencyError, PacktoolError, option_choice
from packtool.storage import local as storage
from packtool.storage import remote
from packtool.tokenizer.tokenizers import Tokenizer


def import_ray() -> Any:
    """Import ray, or raise `MissingDependencyError` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "the ray engine needs Ray: pip install 'packtool[ray]'"
        ) from None
    return ray


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Where and how wide the Ray engine runs."""

    address: str | None = None
    """Ray cluster to join (`auto`, `HOST:6379`); None starts a private Ray on this machine
    unless one is already initialised in this process or RAY_ADDRESS is set (never a cluster
    `ray start` left recorded in /tmp/ray: that is `auto`)."""
    actors: int | None = None
    """Partition actors at most, 1 CPU each (default: the cluster's CPU count at the start)."""
    max_retries: int = 3
    """Times each actor is restarted after its worker process or node died (the partition it
    was running then runs again); beyond that the run stops, its finished partitions kept."""

    def __post_init__(self) -> None:
        if self.actors is not None and (not isinstance(self.actors, int) or self.actors < 1):
            raise ConfigError(f"actors must be a positive integer, got {self.actors!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")


# --- on the workers: the context is unpickled once per worker process ---

_CONTEXTS: dict[str, context.WorkerContext] = {}


def _partition_task(key: str, blob: bytes, descriptor: dict[str, Any]) -> dict[str, Any]:
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        ctx = pickle.loads(blob)
        if ctx.tokenizer is not None:
            ctx.tokenizer.workers = 1  # one actor per CPU: parallelism comes from the actors
        context.setup_process(1)
        ctx = context.without_render_pool(ctx)  # a Ray worker (gRPC threads) forks no pool
        _CONTEXTS.clear()
        _CONTEXTS[key] = ctx
    return worker.run_partition(ctx, descriptor)


def run_pack_ray(
    config: RunConfig,
    ray_config: RayConfig | None = None,
    tokenizer: Tokenizer | str | None = None,
    *,
    bos: int | str | None = "auto",
) -> PackSummary:
    """Pack `config.inputs` like `packtool.engines.local.run_pack`, a Ray Data actor pool doing
    the work.

    On a cluster, the inputs and `config.out_dir` must be paths every node sees: a shared file
    system, or URLs of a bucket (docs/remote.md: the actors read and upload their own bytes);
    and packtool must be installed on every node.

    Raises:
        MissingDependencyError: ray is not installed.
    """
    driver = ray_driver(ray_config or RayConfig(), config.out_dir)
    return pack_with(config, tokenizer, driver, bos=bos)


def ray_driver(ray_config: RayConfig, out_dir: str | os.PathLike) -> Driver:
    """The Ray engine's `Driver` for runs into `out_dir`, once Ray imports and the output is one
    the actors can write (not `hf://`): a missing path, a tokenizer mismatch or a max_len
    BOS + EOS fill then fails before Ray starts."""
    output_folder.built_here(out_dir, "ray")
    import_ray()  # no Ray: one line, before any check
    return Driver(lambda run: drive_ray(run, ray_config))


def drive_ray(run: Any, ray_config: RayConfig) -> str:
    """Run every wave of `run` (a `base.Run`, or another job's run of the same shape:
    packtool/engines/megatron/run.py) on a Ray Data actor pool; what was used, in words."""
    ray = import_ray()
    started = _connect(ray, ray_config.address)
    # A private Ray's actors follow this process out (`lifeline`): after a kill -9 of the
    # driver they ran on ~15 s, still writing partition records into the staging folder.
    follow = os.getpid() if started and _started_here(ray) else 0
    finished = False
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        waves = run.waves()  # the partitions, then each level of the tail tree
        # at most one actor per unit of a wave, as the pool starts (`_execute`): the summary
        # said "a pool of up to 1000" for --workers 1000 and 6 partitions (until 2026-12-08)
        actors = min(ray_config.actors or cpus, max(map(len, waves), default=1))
        # SIGTERM stops the run as Ctrl-C does (after ray.init, whose core worker's handler
        # printed a 6-line "*** SIGTERM received" dump and exited 15 without the --resume line)
        with sigterm_as_ctrl_c():
            for wave in waves:
                _execute(ray, run, ray_config, actors, wave, follow=follow)
        finished = True
    except Exception as exc:
        cause = _user_cause(exc)
        if cause is not None:
            raise cause from None
        if _caused_by(exc, ray.exceptions.RayActorError):
            raise run.workers_lost(
                f"a partition actor's process or node died more than {ray_config.max_retries} "
                "time(s)",
                f"fewer {option_choice('--workers', 'actors', 'N')} if memory is short",
            ) from None
        raise
    finally:
        # A failed or stopped run leaves the Ray it started to Ray's own exit handler, which
        # runs once the error is reported and the run's folder dealt with: shut down here,
        # while Ray Data's threads still ran (its prefetcher, its executor), Ray ended the
        # process first ("the core worker has already been shutdown"): exit 1, no message,
        # the run's folder and lock left behind (3 of 8 runs whose partition raised an error).
        if started and finished:
            _let_prefetchers_end()
            ray.shutdown()
    return (
        f"Ray: {cpus} CPU(s) in the cluster, a Ray Data pool of up to {actors} partition "
        "actor(s) (stage times summed over actors)"
    )


def _started_here(ray: Any) -> bool:
    """Whether `ray.init` started Ray's head in this process (a private Ray, whose nodes are
    this machine's and whose processes see this one's pid), not joined a running one."""
    node = getattr(getattr(getattr(ray, "_private", None), "worker", None), "_global_node", None)
    return getattr(node, "head", False) is True


def _let_prefetchers_end(timeout: float = 10.0) -> None:
    """Stop Ray Data's block prefetch threads and wait for them (at most `timeout` s) before
    `ray.shutdown` (one that ran on can have Ray end the process). Ray stops a prefetcher when
    it is collected, which its own thread prevents (its target is the prefetcher's method)."""
    end = time.monotonic() + timeout
    for thread in threading.enumerate():
        if thread.name != "Prefetcher" or thread is threading.current_thread():
            continue
        owner = getattr(getattr(thread, "_target", None), "__self__", None)
        stop = getattr(owner, "stop", None)
        if callable(stop):
            stop()
        thread.join(max(0.0, end - time.monotonic()))


_DEFAULT_RAY = "a private Ray (no --ray-address / address nor RAY_ADDRESS given)"
"""What a message names where no address was given (`local` is asked for: `_connect`)."""


def _connect(ray: Any, address: str | None) -> bool:
    """Join or start Ray; True when this call started it (and so must shut it down)."""
    if ray.is_initialized():
        return False
    _check_address(address)
    name, value = _given(address)  # what the user gave, before `local` stands in for none
    shown = _shown(name, value) if value is not None else _DEFAULT_RAY
    if address is None and not os.environ.get("RAY_ADDRESS"):
        # Ray's own default joins a cluster `ray start` left recorded in
        # /tmp/ray/ray_current_cluster: the default here is a private Ray (docs/scale-out.md)
        address = "local"
    # ray.init puts its own SIGTERM handler (sys.exit) in place of the caller's: the CLI's, which
    # stops a run as Ctrl-C does, is put back, or a SIGTERM after the waves (the pool's end, the
    # root, the finish) ended the run with exit 143 and no line (until 2026-12-08)
    term = signal.getsignal(signal.SIGTERM)
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.ERROR,
            ignore_reinit_error=True,
        )
    except ValueError as exc:  # an address Ray still refuses: its traceback ran to 62-73 lines
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{shown}: Ray refused it ({why}); give {_FORMS}") from None
    except (ConnectionError, ray.exceptions.AuthenticationError) as exc:
        if "Could not find any running Ray instance" in str(exc):
            # Ray's line told to set "the `--address` flag", which packtool has not
            raise ConfigError(
                f"{shown}: no Ray cluster runs on this node (`auto` joins one `ray start` "
                "started); start one with `ray start --head`, give a cluster's HOST:PORT, or "
                "leave the option out to start one here"
            ) from None
        if not _refused_token(exc, ray.exceptions.AuthenticationError):
            raise
        raise ConfigError(
            f"{shown}: the Ray cluster there requires an authentication token, and "
            "this process gave none or another one; set RAY_AUTH_MODE=token and the cluster's "
            "token in RAY_AUTH_TOKEN (or in a file named by RAY_AUTH_TOKEN_PATH, by default "
            "~/.ray/auth_token)"
        ) from None
    if callable(term) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, term)
    return True


def _refused_token(exc: BaseException, auth_error: type) -> bool:
    """Whether `ray.init` failed for want of the cluster's token: Ray 2.60 raised only
    `ConnectionError("Failed to connect to Ray cluster at ...")`, the GCS's "Unauthenticated:
    ... InvalidAuthToken" in the text of its cause (or an `AuthenticationError` where
    RAY_AUTH_MODE=token is set without a token)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, auth_error) or re.search(r"Unauthenticated|InvalidAuthToken", str(e)):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


_FORMS = (
    "`auto` (the cluster this node is in), `local` (a private Ray here), HOST:PORT or "
    "[IPv6]:PORT (the GCS address `ray start --head` printed, port 6379 by default)"
)
_HOST_PORT = re.compile(
    r"(?:\[(?P<v6>[0-9A-Za-z:.%_-]+)\]|(?P<host>[A-Za-z0-9._-]+)):(?P<port>\d+)"
)


def _given(address: str | None) -> tuple[str, str | None]:
    """The address `ray.init(address)` goes to and where it came from: RAY_ADDRESS stands in
    for no address and for `auto` (as Ray does)."""
    env = os.environ.get("RAY_ADDRESS")
    if env and address in (None, "auto"):
        return "RAY_ADDRESS", env
    return "--ray-address", address


def _shown(name: str, address: str) -> str:
    """The address as a message names it: `RAY_ADDRESS x`, or both callers' forms of the
    option (`--ray-address x / address='x'`: `RayConfig(address=)`)."""
    return f"{name} {address}" if name == "RAY_ADDRESS" else option_choice(name, "address", address)


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a `HOST:PORT` or `[IPv6]:PORT` address; None for any other form."""
    match = _HOST_PORT.fullmatch(address)
    if match is None or not match["port"].isascii() or not 0 < int(match["port"]) < 65536:
        return None
    return match["v6"] or match["host"], int(match["port"])


def _check_address(address: str | None, timeout: float = 10.0) -> None:
    """A `host:port` where no Ray answers is one line: `ray.init` retried it for ever, deaf to
    Ctrl-C and SIGTERM, both where nothing listened (the engines audit waited 500 s, then
    kill -9) and where something else did (a dashboard's HTTP port: over 5 minutes). Ray's GCS
    speaks gRPC, so it answers HTTP/2's connection preface with a SETTINGS frame; other
    servers answer otherwise or not at all. With `RAY_USE_TLS` the GCS expects TLS first, so
    only the connection is checked. A Ray Client address is refused (below), and so is any
    other form: `foo`, `localhost:` or `:6379` went on to `ray.init`, a 62-73 line traceback;
    `http://HOST:6379` was taken for host `http://HOST` ("nothing answers there")."""
    name, address = _given(address)
    if not address or address in ("auto", "local"):
        return
    if address.startswith("ray://"):
        # Ray Data runs its executor in the driver and needs the driver's core worker, which a
        # Ray Client connection has not: Ray 2.60 failed inside Ray Data with a 60-line
        # traceback ("'Worker' object has no attribute 'core_worker'").
        raise ConfigError(
            f"{_shown(name, address)}: Ray Data cannot run through Ray Client (ray://); run "
            f"packtool on a node of the cluster with "
            f"{option_choice('--ray-address', 'address', 'auto')} (or HOST:6379), or "
            "submit it there as a job: ray job submit -- packtool pack ..."
        )
    host_port = _host_port(address)
    if host_port is None:
        raise ConfigError(f"{_shown(name, address)}: not a Ray address; give {_FORMS}")
    start = "start Ray there (`ray start --head`) or leave the option out to start one here"
    try:
        conn = socket.create_connection(host_port, timeout=timeout)
    except OSError as exc:
        raise ConfigError(
            f"{_shown(name, address)}: nothing answers there ({exc.strerror or exc}); {start}"
        ) from None
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return
        try:
            answer = _h2_answer(conn, time.monotonic() + timeout)
        except OSError as exc:  # accepted, then reset: something listens, not Ray
            answer = f"reset the connection ({exc.strerror or exc})"
    if not isinstance(answer, bytes) or len(answer) < 9 or answer[3] != _H2_SETTINGS:
        if answer is None:
            what = f"did not answer within {timeout:g} s"
        elif isinstance(answer, str):
            what = answer
        else:
            what = f"answered {answer[:16]!r}" if answer else "closed the connection"
        raise ConfigError(
            f"{_shown(name, address)}: something listens there but it is not Ray (it {what} "
            "where Ray's GCS answers gRPC); give the GCS port `ray start --head` printed (6379 "
            "by default), not the dashboard's"
        )


# The client's connection preface, then an empty SETTINGS frame (length 0, type 4, no flags,
# stream 0): a gRPC server answers with a SETTINGS frame of its own.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_H2_SETTINGS = 4  # an HTTP/2 frame header is 9 bytes: length (3), type (1), flags, stream id


def _h2_answer(conn: socket.socket, deadline: float) -> bytes | None:
    """The first 9 bytes a server sends back to HTTP/2's connection preface (fewer if it
    closes first; None if it sends nothing before `deadline`, a `time.monotonic()` time for
    the whole answer: a server sending a byte at a time cannot stretch it)."""
    conn.sendall(_H2_PREFACE)
    got = b""
    while len(got) < 9:
        left = deadline - time.monotonic()
        if left <= 0:
            return got or None
        conn.settimeout(left)
        try:
            chunk = conn.recv(9 - len(got))
        except TimeoutError:
            return got or None
        if not chunk:
            break
        got += chunk
    return got


class PartitionActor:
    """A Ray Data actor: runs one partition per batch with the run's context (`task`)."""

    def __init__(self, task: Any, key: str, blob: Any, cwd: str = "", follow: int = 0) -> None:
        import ray

        if follow:
            lifeline.follow(follow)  # a private Ray's driver: its death ends this actor
        self.task, self.key = task, key  # task: `_partition_task` (tests pass a faulty one)
        self.blob = ray.get(blob) if isinstance(blob, ray.ObjectRef) else blob
        if cwd and storage.is_dir(cwd):
            # Relative inputs and outputs mean what they meant where packtool ran (a Ray
            # worker starts elsewhere); on another node the folder exists on a shared disk.
            os.chdir(cwd)

    def __call__(self, batch: dict[str, Any]) -> dict[str, list[str]]:
        # batch: {"descriptor": (1,) JSON strings}; returns {"record": (1,) JSON strings}
        out = []
        for d in batch["descriptor"]:
            try:
                out.append(json.dumps({"record": self.task(self.key, self.blob, json.loads(d))}))
            except PacktoolError as exc:
                # A mistake in the inputs or options: sent back as data, so it is not retried
                # and the driver raises it as itself (Ray Data would wrap it in a
                # UserCodeException that no longer carries it).
                error = base64.b64encode(pickle.dumps(exc)).decode()
                out.append(json.dumps({"error": error}))
        return {"record": out}


def _execute(
    ray: Any,
    run: Any,
    ray_config: RayConfig,
    actors: int,
    units: list[int] | None = None,
    follow: int = 0,
) -> None:
    """Run the units `units` (default `run.todo`; or a level of merge nodes) to completion on
    a pool of at most `actors` actors, accounting each record as it arrives; on any exception
    (Ctrl-C included) the pool is shut down, its actors killed, before it propagates.
    `follow`: the driver's pid, which the actors follow out (`lifeline`), or 0."""
    todo = list(run.todo if units is None else units)
    if not todo:
        return
    try:
        import ray.data
    except ImportError:
        raise MissingDependencyError(
            "the ray engine needs Ray Data: pip install 'packtool[ray]'"
        ) from None
    blob = pickle.dumps(run.context)
    key = hashlib.sha256(blob).hexdigest()
    args = (key, ray.put(blob), follow)
    items = [{"descriptor": json.dumps(run.descriptor(p))} for p in todo]
    n = min(actors, len(items))
    data = ray.data.DataContext.get_current()
    saved = data.enable_progress_bars
    data.enable_progress_bars = False
    logging.getLogger("ray.data").setLevel(logging.ERROR)  # its per-run INFO lines
    quiet = _ReportedHere(ray)
    screens = [h for h in logging.getLogger("ray.data").handlers if _on_screen(h)]
    for handler in screens:
        handler.addFilter(quiet)
    try:
        source = ray.data.from_items(items, override_num_blocks=len(items))
        try:
            ds = _pool(source, ray_config, args, (1, n, n))  # start n at once
        except (TypeError, ValueError):  # a Ray without an initial pool size (ray#56370)
            ds = _pool(source, ray_config, args, (1, n))
        with closing(iter(ds.iter_rows())) as rows:  # closing shuts the pool down
            for row in rows:
                got = json.loads(row["record"])
                if "error" in got:
                    raise pickle.loads(base64.b64decode(got["error"]))
                run.account(got["record"])
    finally:
        data.enable_progress_bars = saved
        for handler in screens:
            handler.removeFilter(quiet)


class _ReportedHere(logging.Filter):
    """Keeps off the screen Ray Data's records of failures this engine reports in one line (an
    actor that died too often, a `PacktoolError` or `OSError` in an actor): they came before
    that line as ~40 lines, two tracebacks among them. Ray Data's log file (its session folder)
    still gets every record; other failures still show theirs."""

    def __init__(self, ray: Any) -> None:
        super().__init__()
        self.died = ray.exceptions.RayActorError

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return exc is None or not (_caused_by(exc, self.died) or _user_cause(exc) is not None)


def _on_screen(handler: logging.Handler) -> bool:
    """A handler that writes to a stream (the terminal), not Ray Data's log file."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


def _pool(source: Any, ray_config: RayConfig, args: tuple, size: tuple) -> Any:
    """`source` (descriptors) mapped by a pool of `size` (min, max[, initial]) actors; `args`:
    their (context key, context ref, pid to follow)."""
    key, blob, follow = args
    with warnings.catch_warnings():
        # Ray 2.60 deprecates passing actor options (max_restarts) this way, and has no other:
        # without them Ray Data restarts an actor without bound.
        warnings.filterwarnings("ignore", "`ray_remote_args` is deprecated")
        return source.map_batches(
            PartitionActor,
            fn_constructor_args=(_partition_task, key, blob, os.getcwd(), follow),
            batch_size=1,
            concurrency=size,  # fewer than n when nodes are lost
            num_cpus=1,
            max_restarts=ray_config.max_retries,
            # Where and as whom a bucket is read: Ray's workers do not inherit this process's
            # environment (packtool/storage/remote.py, "FORWARDED").
            **({"runtime_env": {"env_vars": env}} if (env := remote.forwarded_env()) else {}),
            max_task_retries=-1,  # a partition waits for its actor's restart, then reruns
        )


def _caused_by(exc: BaseException, kind: type) -> bool:
    """Whether `exc` or an exception it was raised from is a `kind`."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        if isinstance(e, kind):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _user_cause(exc: BaseException) -> PacktoolError | OSError | None:
    """The user-facing error inside a Ray error, if there is one: a `PacktoolError`, or an
    `OSError` (a full disk in an actor: one line naming the file and the resume hint, as on
    the local engine, where it was Ray Data's 159-line `UserCodeException` traceback)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        inner = getattr(e, "cause", None)
        if isinstance(inner, BaseException):  # a RayTaskError: also a subclass of its cause,
            todo.append(inner)  # but its text is the remote traceback; the cause's is one line
            continue
        if isinstance(e, (PacktoolError, OSError)):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None
