"""One Slurm array task: `python -m packtool.engines.slurm.task SLURM_DIR ARRAY TASK`, or a
pull-mode worker: `... SLURM_DIR POOL pilot`.

A task of fixed share reads the run's context (pickled once by the driver) and this task's
partition descriptors (its line of `ARRAY.jsonl`, found through `ARRAY.offsets`: one small read,
whatever the number of tasks), then runs `worker.run_partition` for each partition that has no
completion record yet, as the local engine does, so the shards are the local engine's bytes. A
requeued or resubmitted task skips what an earlier attempt finished; a task killed mid-partition
leaves only hidden temporary files (removed by the run's finish) and no record, so the partition
runs again whole.

A pull-mode worker (`--slurm-workers`, packtool/engines/slurm/pilots.py) walks the run's pool of
partitions (`POOL.parts`, in plan order) and runs each one it can claim: no record yet, and its
claim file created by this task (`writing.create_exclusive`: written whole, then hard-linked
in, one worker per partition on every node; a claim already there costs one stat). A requeued
worker first takes back the claims its earlier run left. It ends when the walk does.

A node that cannot see the run's staging folder exits at once with a line the driver recognises
(`CANNOT_SEE`) and turns into its one-line error. A partition that raises one of packtool's own
errors (a bad document under `--strict`, a changed input, an unreachable store after the
client's retries) writes it to `errors/` (`keep_error`) before the task fails: the driver then
raises it as itself (`task_error`), as the local and Ray engines do, instead of resubmitting a
partition that fails the same way every time.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

CANNOT_SEE = "packtool-slurm: cannot see"


def _error_path(slurm_dir: Path, partition: int, key: str) -> Path:
    from packtool.engines.slurm.config import ERRORS_DIR

    return slurm_dir / ERRORS_DIR / f"{partition:06d}-{key}.json"


def keep_error(slurm_dir: Path, partition: int, exc: Exception) -> None:
    """Record that this task's run of `partition` raised `exc` (a `PacktoolError`): its class
    and message, as JSON (the driver unpickles nothing a task wrote)."""
    from packtool.storage import writing

    data = json.dumps({"class": type(exc).__name__, "message": str(exc)}).encode()
    writing.write_atomic(_error_path(slurm_dir, partition, worker_key()), data, make_parent=True)


def task_error(slurm_dir: Path, partition: int, key: str) -> Exception | None:
    """The packtool error the task `key` (`JOB_TASK`) recorded for `partition`, rebuilt as its
    class (`ConfigError`, `MissingDependencyError`, else `DataError`), or None. Named by the
    task, so the record of an earlier attempt (a --resume retries) is never raised again."""
    from packtool.errors import ConfigError, DataError, MissingDependencyError, json_value
    from packtool.storage import local as storage

    path = _error_path(slurm_dir, partition, key)
    try:
        found = json_value(storage.read_bytes(path)) if storage.exists(path) else None
    except (OSError, ValueError):
        return None  # unreadable: the partition counts an attempt, as a task without a record
    if not isinstance(found, dict) or not isinstance(found.get("message"), str):
        return None
    kinds = {"ConfigError": ConfigError, "MissingDependencyError": MissingDependencyError}
    return kinds.get(found.get("class"), DataError)(found["message"])


def _cpus() -> int:
    """The task's tokenizer threads: the CPUs it may run on (`sched_getaffinity`: Slurm's
    cgroup or affinity binding), at most Slurm's count for it. SLURM_CPUS_PER_TASK alone was
    trusted, and a driver inside `salloc -c 32` exports it to tasks submitted without
    --cpus-per-task: 32 threads on one core."""
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity call on this system
        usable = os.cpu_count() or 1
    counts = [
        int(value)
        for value in (os.environ.get(n, "") for n in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"))
        if value.isdigit() and int(value) > 0
    ]
    return max(1, min(usable, *counts)) if counts else 1


def _claim_owner(claim: Path) -> str:
    """Who holds `claim` ("" for a claim the driver removed since the listing: a traceback and
    one more attempt of the partition before)."""
    from packtool.storage import local as storage

    try:
        return storage.read_text(claim)
    except OSError:
        return ""


def worker_key() -> str:
    """This array task as squeue names it: `ARRAYJOB_TASK`."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID", "0")
    return f"{job}_{os.environ.get('SLURM_ARRAY_TASK_ID', '0')}"


def main(argv: list[str]) -> int:
    slurm_dir, array = Path(argv[0]), argv[1]
    from packtool.storage import local as storage

    if not storage.is_dir(slurm_dir):
        print(f"{CANNOT_SEE} {slurm_dir} from {os.uname().nodename}", file=sys.stderr, flush=True)
        return 3
    import numpy as np

    from packtool.engines import context, records, worker
    from packtool.errors import PacktoolError

    offsets = np.frombuffer(storage.read_bytes(slurm_dir / f"{array}.offsets"), dtype=np.int64)
    ctx = pickle.loads(storage.read_bytes(slurm_dir / "context.pkl"))
    threads = _cpus()
    context.setup_process(threads)
    if ctx.tokenizer is not None:
        ctx.tokenizer.workers = threads
    work = storage.as_path(ctx.work)

    def line(f: Any, i: int) -> list[dict[str, Any]]:
        f.seek(int(offsets[i]))
        return json.loads(f.read(int(offsets[i + 1] - offsets[i])))

    def run(descriptor: dict[str, Any]) -> None:
        try:
            record = worker.run_partition(ctx, descriptor)
        except PacktoolError as exc:
            keep_error(slurm_dir, int(descriptor["index"]), exc)
            raise
        print(f"partition {descriptor['index']}: {record['documents']} documents", flush=True)

    with storage.open_input(slurm_dir / f"{array}.jsonl") as f:
        if argv[2] != "pilot":
            for descriptor in line(f, int(argv[2])):
                p = int(descriptor["index"])
                if storage.exists(records.record_path(work, p)):
                    print(f"partition {p}: finished by an earlier attempt", flush=True)
                    continue
                run(descriptor)
            return 0
        from packtool.engines.slurm.config import CLAIMS_DIR
        from packtool.storage import writing

        key = worker_key()
        claims = slurm_dir / CLAIMS_DIR
        own: set[int] = set()
        if os.environ.get("SLURM_RESTART_COUNT", "0") not in ("", "0"):  # requeued
            own = {  # (a claim's temporary, hidden, is no claim: `writing.create_exclusive`)
                int(c.name)
                for c in storage.list_dir(claims)
                if c.name.isdigit() and _claim_owner(c) == key
            }
        parts = np.frombuffer(storage.read_bytes(slurm_dir / f"{array}.parts"), dtype=np.int64)
        for i, p in enumerate(parts.tolist()):
            if storage.exists(records.record_path(work, p)):
                continue
            claim = claims / f"{p:06d}"
            if p not in own and (
                storage.exists(claim) or not writing.create_exclusive(claim, key.encode())
            ):
                continue  # another worker has it (a stat, where a create, a link, an unlink)
            run(line(f, i)[0])
    return 0


if __name__ == "__main__":
    # packtool's own process, as the CLI's: numba's extension entry points skipped (awkward's
    # import, ~0.2 s of CPU in every task of a run started from Python; packtool/pack/jit.py).
    os.environ.setdefault("PACKTOOL_NUMBA_EXTENSIONS", "0")
    sys.exit(main(sys.argv[1:]))
