"""The Ray engine: the partition workers as Ray tasks, anywhere in a cluster.

    driver (any node)                  Ray tasks, one per partition, 1 CPU each      driver
    plan -> partition descriptors ->   read -> tokenize -> pack chunks -> shards      -> records ->
    (a few hundred bytes each)         + tail + record, on the shared file system       root of the
                                       then one task per merge node of the tail tree,   tail tree,
                                       level by level (packtool/engines/merge.py)       index.json

Each task runs `worker.run_partition` (the local engine's function) on one partition: it reads
its own byte ranges / row groups straight from the shared file system and writes its shards
there under their final names, so no corpus byte passes through the driver or an object store;
the driver sends descriptors and receives records (a few KB). The run's context (options,
tokenizer) goes to the object store once and each worker process unpickles it once.

Plain tasks rather than a Ray Data pipeline: partitions are coarse (seconds to minutes each) and
independent, so there is nothing for a streaming executor to overlap; a task that dies with its
worker or its node is simply run again elsewhere by Ray (`max_retries`), and rewrites the same
bytes. At most two tasks per CPU are in flight, so the driver's memory does not grow with the
number of partitions. The state is in the output's staging folder: a killed driver is resumed
with `--resume` from any node that sees it, and a run started by the local engine can be
finished by this one (and the other way round).
"""

from __future__ import annotations

import hashlib
import logging
import pickle
from dataclasses import dataclass
from typing import Any

from packtool.engines import preflight, worker
from packtool.engines.base import Run
from packtool.engines.config import RunConfig
from packtool.engines.summary import PackSummary
from packtool.errors import ConfigError, MissingDependencyError, PacktoolError
from packtool.tokenizers import Tokenizer


def import_ray() -> Any:
    """Import ray, or raise `MissingDependencyError` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise MissingDependencyError(
            "--engine ray needs Ray: pip install 'packtool[ray]'"
        ) from None
    return ray


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Where and how wide the Ray engine runs."""

    address: str | None = None
    """Ray cluster to join (`auto`, `HOST:6379`, `ray://HOST:10001`); None starts a local Ray on
    this machine unless one is already initialised in this process (or RAY_ADDRESS is set)."""
    actors: int | None = None
    """Partition tasks in flight at most (default: twice the cluster's CPU count)."""
    max_retries: int = 3
    """Times a partition is run again when its worker process or node dies."""

    def __post_init__(self) -> None:
        if self.actors is not None and (not isinstance(self.actors, int) or self.actors < 1):
            raise ConfigError(f"actors must be a positive integer, got {self.actors!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")


# --- on the workers: the context is unpickled once per worker process ---

_CONTEXTS: dict[str, worker.WorkerContext] = {}


def _partition_task(key: str, blob: bytes, descriptor: dict[str, Any]) -> dict[str, Any]:
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        ctx = pickle.loads(blob)
        if ctx.tokenizer is not None:
            ctx.tokenizer.workers = 1  # one task per CPU: parallelism comes from the tasks
        worker.setup_process(1)
        ctx = worker.without_render_pool(ctx)  # a Ray worker (gRPC threads) forks no pool
        _CONTEXTS.clear()
        _CONTEXTS[key] = ctx
    return worker.run_partition(ctx, descriptor)


def run_pack_ray(
    config: RunConfig, ray_config: RayConfig | None = None, tokenizer: Tokenizer | None = None
) -> PackSummary:
    """Pack `config.inputs` like `packtool.engines.local.run_pack`, with Ray tasks doing the work.

    On a cluster, the inputs and `config.out_dir` must be paths every node sees (a shared file
    system), and packtool must be installed on every node.

    Raises:
        MissingDependencyError: ray is not installed.
    """
    ray_config = ray_config or RayConfig()
    ray = import_ray()
    # A missing path, a tokenizer mismatch or a max_len BOS + EOS fill fails before Ray starts.
    checked = preflight.check_inputs(config, tokenizer)
    with preflight.output_folder(config) as output:
        run = Run(config, checked, output)
        started = _connect(ray, ray_config.address)
        try:
            cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
            inflight = ray_config.actors or 2 * cpus
            for wave in run.waves():  # the partitions, then each level of the tail tree
                _execute(ray, run, wave, ray_config, inflight)
        except Exception as exc:
            cause = _packtool_cause(exc)
            if cause is not None:
                raise cause from None
            raise
        finally:
            if started:
                ray.shutdown()
        return run.finish(
            f"Ray: {cpus} CPU(s) in the cluster, one task per partition "
            f"(stage times summed over tasks)"
        )


def _connect(ray: Any, address: str | None) -> bool:
    """Join or start Ray; True when this call started it (and so must shut it down)."""
    if ray.is_initialized():
        return False
    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        ignore_reinit_error=True,
    )
    return True


def _execute(ray: Any, run: Run, todo: list[int], ray_config: RayConfig, inflight: int) -> None:
    """Submit the units `todo` (at most `inflight` at once); account each record."""
    if not todo:
        return
    blob = pickle.dumps(run.context)
    key = hashlib.sha256(blob).hexdigest()
    blob_ref = ray.put(blob)
    task = ray.remote(_partition_task).options(
        num_cpus=1, max_retries=ray_config.max_retries, retry_exceptions=False
    )
    todo = list(todo)
    pending: dict[Any, int] = {}
    try:
        while todo or pending:
            while todo and len(pending) < inflight:
                p = todo.pop(0)
                pending[task.remote(key, blob_ref, run.descriptor(p))] = p
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                pending.pop(ref)
                run.account(ray.get(ref))
    except BaseException:
        for ref in pending:
            ray.cancel(ref, force=True)
        raise


def _packtool_cause(exc: BaseException) -> PacktoolError | None:
    """The user-facing error inside a Ray task error, if there is one."""
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
        if isinstance(e, PacktoolError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None
