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
claim file created by this task (`O_EXCL`: one worker per partition, on every node). A requeued
worker first takes back the claims its earlier run left. It ends when the walk does.

A node that cannot see the run's staging folder exits at once with a line the driver recognises
(`CANNOT_SEE`) and turns into its one-line error.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

CANNOT_SEE = "packtool-slurm: cannot see"


def _cpus() -> int:
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


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
        record = worker.run_partition(ctx, descriptor)
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
            own = {int(c.name) for c in storage.list_dir(claims) if storage.read_text(c) == key}
        parts = np.frombuffer(storage.read_bytes(slurm_dir / f"{array}.parts"), dtype=np.int64)
        for i, p in enumerate(parts.tolist()):
            if storage.exists(records.record_path(work, p)):
                continue
            if p not in own and not writing.create_exclusive(claims / f"{p:06d}", key.encode()):
                continue  # another worker has it
            run(line(f, i)[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
