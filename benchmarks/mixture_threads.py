"""Where a loader's CPU goes, thread by thread: one `PackedDataset` against the 3-source mixture
of `benchmarks.bench_mixture`, with DataLoader workers.

Run: `python -m benchmarks.mixture_threads [--workers 2] [--short 32e6] [--long 300e6]
[--repeat 2]`. Prints a table (nothing is written to docs/benchmarks.md; `bench_mixture` has the
figures). For each loader, a whole run of `--short` and of `--long` tokens from a cold
iterator; the CPU of every thread (read from /proc/<pid>/task/<tid>/stat before the workers are
joined) over the tokens in between, in ms per M tokens: the trainer's main thread and its other
threads, and per worker its main thread (planning, gathering) and its other threads (the decode
thread). Linux only.
"""

from __future__ import annotations

import argparse
import gc
import os
import time

from benchmarks._common import markdown_table
from benchmarks.bench_mixture import mixture_loader, single_loader, sources
from packtool.mixture.schedule import load_kernel

TICKS = os.sysconf("SC_CLK_TCK")


def _threads(pid: int) -> dict[int, float]:
    """CPU seconds of each thread of a process."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def _children() -> list[int]:
    me = os.getpid()
    with open(f"/proc/{me}/task/{me}/children") as f:
        return [int(p) for p in f.read().split()]


def run(dl, total: float) -> tuple[dict[str, float], int]:
    """CPU seconds per thread kind over a whole run of `total` tokens, and the tokens."""
    me = os.getpid()
    before = _threads(me)
    tokens = 0
    it = iter(dl)
    for b in it:
        tokens += int(b["cu_seqlens"][-1])
        if tokens >= total:
            break
    now = _threads(me)
    out = {
        "trainer main": now[me] - before.get(me, 0.0),
        "trainer other": sum(v - before.get(t, 0.0) for t, v in now.items() if t != me),
    }
    for i, child in enumerate(sorted(_children())):
        cpu = _threads(child)
        out[f"worker {i} main"] = cpu.get(child, 0.0)
        out[f"worker {i} other"] = sum(v for t, v in cpu.items() if t != child)
    del it, b
    gc.collect()  # joins the workers
    time.sleep(0.3)
    return out, tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--short", type=float, default=32e6)
    ap.add_argument("--long", type=float, default=300e6)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    load_kernel()
    paths = sources(False)
    rows = []
    for r in range(args.repeat):
        for name in ("one", "mixture"):
            got = []
            for total in (args.short, args.long):
                if name == "one":
                    dl = single_loader(paths["web"], args.workers)
                else:
                    dl = mixture_loader(paths, args.workers, total)
                got.append(run(dl, total))
            (a, ta), (b, tb) = got
            per = {k: (b[k] - a.get(k, 0.0)) / (tb - ta) * 1e9 for k in b}
            rows.append(
                [
                    f"{name} (round {r})",
                    *(f"{v:.2f}" for v in per.values()),
                    f"{sum(per.values()):.2f}",
                ]
            )
            print(rows[-1], flush=True)
            header = list(per)
    print(f"\nCPU ms per M tokens between {args.short / 1e6:.0f} M and {args.long / 1e6:.0f} M "
          f"tokens, {args.workers} workers, load average {os.getloadavg()[0]:.1f}:\n")  # fmt: skip
    print(markdown_table(["loader", *header, "all"], rows))


if __name__ == "__main__":
    main()
