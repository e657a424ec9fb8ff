"""One Slurm array task: `python -m packtool.engines.slurm.task SLURM_DIR ARRAY TASK`.

Reads the run's context (pickled once by the driver) and this task's partition descriptors (its
line of `ARRAY.jsonl`, found through `ARRAY.offsets`: one small read, whatever the number of
tasks), then runs `worker.run_partition` for each partition that has no completion record yet, as
the local engine does, so the shards are the local engine's bytes. A requeued or resubmitted task
skips what an earlier attempt finished; a task killed mid-partition leaves only hidden temporary
files (removed by the run's finish) and no record, so the partition runs again whole.

A node that cannot see the run's staging folder exits at once with a line the driver recognises
(`CANNOT_SEE`) and turns into its one-line error.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

CANNOT_SEE = "packtool-slurm: cannot see"


def _cpus() -> int:
    for name in ("SLURM_CPUS_PER_TASK", "SLURM_CPUS_ON_NODE"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def main(argv: list[str]) -> int:
    slurm_dir, array, task = Path(argv[0]), argv[1], int(argv[2])
    from packtool.storage import local as storage

    if not storage.is_dir(slurm_dir):
        print(f"{CANNOT_SEE} {slurm_dir} from {os.uname().nodename}", file=sys.stderr, flush=True)
        return 3
    import numpy as np

    from packtool.engines import context, records, worker

    offsets = np.frombuffer(storage.read_bytes(slurm_dir / f"{array}.offsets"), dtype=np.int64)
    with storage.open_input(slurm_dir / f"{array}.jsonl") as f:
        f.seek(int(offsets[task]))
        descriptors = json.loads(f.read(int(offsets[task + 1] - offsets[task])))
    ctx = pickle.loads(storage.read_bytes(slurm_dir / "context.pkl"))
    threads = _cpus()
    context.setup_process(threads)
    if ctx.tokenizer is not None:
        ctx.tokenizer.workers = threads
    work = Path(ctx.work)
    for descriptor in descriptors:
        p = int(descriptor["index"])
        if storage.exists(records.record_path(work, p)):
            print(f"partition {p}: finished by an earlier attempt", flush=True)
            continue
        record = worker.run_partition(ctx, descriptor)
        print(f"partition {p}: {record['documents']} documents", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
