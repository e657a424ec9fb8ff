"""The Slurm engine's cost per array task, against the local engine on the same node.

Run from the repository root, as root, with the test cluster up (`bash
scripts/slurm-test-cluster.sh`): `python -m benchmarks.bench_slurm [--mb 20]` (about a minute).

The same corpus (real text, benchmarks/real_corpus.py) and options are packed with `--engine
local` (a process pool of one worker per core) and with `--engine slurm` at `--tasks-per-job` 1
and 4 (one core per task, so as many tasks run at once as the local engine runs workers). The
outputs are compared byte for byte (index.json but its command line). Overhead per task =
(Slurm seconds - local seconds) x cores / tasks: the core-seconds each task costs beyond the
work itself (Slurm's start of the task, the interpreter's start and imports, loading the
tokenizer and the numba kernels, and the driver's polling). The test cluster's scheduler starts
a task as soon as a core is free (scripts/slurm-test-cluster.sh); a production cluster's
scheduling interval adds to it, and `--tasks-per-job` divides it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import real_corpus
from benchmarks._common import ROOT, markdown_table, update_block

DATA = ROOT / "bench_data"
GOAL = 1.0


def pack(corpus: Path, out: Path, partition: str, *extra: str) -> float:
    cmd = [sys.executable, "-m", "packtool.cli.commands", "pack", str(corpus), "-o", str(out),
           "--max-len", "4096", "--partition-size", partition, "--overwrite", *extra]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def same(a: Path, b: Path) -> bool:
    for f in sorted(p.name for p in a.iterdir()):
        x, y = (a / f).read_bytes(), (b / f).read_bytes()
        if f == "index.json":
            x, y = (
                b"\n".join(ln for ln in t.splitlines() if b'"command"' not in ln) for t in (x, y)
            )
        if x != y:
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=20, help="MB of real text")
    ap.add_argument("--partitions", type=int, default=16, help="about this many partitions")
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    corpus = DATA / f"real_corpus_{args.mb}mb.jsonl"
    real_corpus.build(corpus, args.mb * 1_000_000)
    partition = str(max(1, corpus.stat().st_size // args.partitions))
    cores = len(os.sched_getaffinity(0))
    out = DATA / "slurm"
    local = pack(corpus, out / "local", partition, "--engine", "local")
    n = int(json.loads((out / "local" / "index.json").read_text())["extra"]["partitions"])
    rows, worst = [], 0.0
    for k in (1, 4):
        t = pack(
            corpus, out / f"slurm{k}", partition, "--engine", "slurm", "--tasks-per-job", str(k)
        )
        if not same(out / "local", out / f"slurm{k}"):
            raise SystemExit(f"--tasks-per-job {k}: not the local engine's bytes")
        tasks = -(-n // k)
        per_task = (t - local) * cores / tasks
        worst = max(worst, per_task) if k == 1 else worst
        per_partition = (t - local) * cores / n
        rows.append(
            [
                f"slurm, --tasks-per-job {k}",
                f"{t:.1f}",
                tasks,
                f"{per_task:.2f}",
                f"{per_partition:.2f}",
            ]
        )
    rows.insert(0, ["local (process pool)", f"{local:.1f}", "-", "-", "-"])
    headers = ["engine", "seconds", "array tasks", "overhead core-s / task", "per partition"]
    table = markdown_table(headers, rows)
    body = (
        f"Slurm engine (`python -m benchmarks.bench_slurm`, {time.strftime('%Y-%m-%d')}): "
        f"{corpus.stat().st_size / 1e6:.0f} MB of real text in {n} partitions, "
        f"max_len 4096, on the one-node test cluster (scripts/slurm-test-cluster.sh, {cores} "
        "cores, one core per task); outputs byte-identical to the local engine's (checked in "
        f"the run). Overhead per task at one partition a task: {worst:.2f} core-s (goal "
        f"{GOAL:.0f} s: {'met' if worst <= GOAL else 'missed'}): about 0.9 s of it is the "
        "task's Python start, imports (numba) and kernel load, which the local engine pays once "
        "per worker process, the rest Slurm's start of the task and the probe job. "
        "`--tasks-per-job` divides it among a task's partitions.\n\n"
        f"{table}"
    )
    print(body)
    if not args.no_docs:
        update_block("slurm", body)
        print("\ndocs/benchmarks.md block `slurm` updated.")


if __name__ == "__main__":
    main()
