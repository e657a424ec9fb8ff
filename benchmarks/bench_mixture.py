"""Mixtures: loader throughput, proportion error against HF `interleave_datasets`, schedule cost.

Run: `python -m benchmarks.bench_mixture [--quick] [--tokens 64e6] [--warm 48e6] [--repeat 2]`.
Writes the README block `mixture`. Measures, in one run:

- Loader throughput (real tokens/s, 64k-token batches) of a 3-source `MixedDataset` (weights
  0.5 / 0.3 / 0.2 in tokens) through `MixedDataLoader`, against one `PackedDataset` through
  `PackedDataLoader` over the largest of the three, in-process and with 1 and 2 workers;
  interleaved, best of `--repeat`, each timed over `--tokens` after `--warm` tokens (both
  inside one epoch of the single dataset), and the CPU of a whole run of both from a cold
  iterator. The sources are synthetic random token ids written the way `packtool pack` writes
  shards (lz4, 256-row row groups: the costliest to decode), in bench_data/ (made once,
  reused).
- Proportion error after 1k, 10k and 100k rows: packtool's schedule against
  `datasets.interleave_datasets(probabilities=...)` with the same weights (5 seeds), in rows,
  and in tokens for sources of different row lengths (HF's probabilities then set to
  weight / mean row length, which makes its token shares right on average).
- Time and peak memory to build the schedule for 10^8 rows (3 sources), in a child process,
  against the floor of a process that only imports it.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks._common import ROOT, markdown_table, update_readme
from loader import MixedDataLoader, MixedDataset, PackedDataLoader, PackedDataset
from loader.testing import write_random_dataset
from packtool.mixture import MixtureSpec, SourceSpec
from packtool.shards import ShardConfig

BUDGET = 65_536
MAX_LEN = 4096
WEIGHTS = {"web": 0.5, "code": 0.3, "books": 0.2}


def sources(quick: bool) -> dict[str, Path]:
    """Three synthetic packed datasets (random ids, `packtool pack`'s shard layout)."""
    rows = {"web": 30_000, "code": 12_000, "books": 4_000}
    if quick:
        rows = {k: v // 10 for k, v in rows.items()}
    out = {}
    for i, (name, n) in enumerate(rows.items()):
        path = ROOT / "bench_data" / f"mix2_{name}_{n}"  # format 2, page checksums
        if not (path / "index.json").is_file():
            t0 = time.perf_counter()
            write_random_dataset(
                path, n_rows=n, max_len=MAX_LEN, mean_doc=300, seed=100 + i,
                shard_config=ShardConfig(),
            )  # fmt: skip
            print(f"wrote {path} in {time.perf_counter() - t0:.1f}s", flush=True)
        out[name] = path
    return out


def _children_cpu() -> dict[int, float]:
    """CPU seconds of each live child process (DataLoader workers), every thread."""
    import glob

    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for f in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        for pid in Path(f).read_text().split():
            try:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(pid)] = (int(stat[11]) + int(stat[12])) / tick
    return out


def _drain(dl, goal: float, warm: float) -> tuple[float, float]:
    """(tokens/s, CPU seconds per million tokens over every process) over `goal` tokens, after
    `warm` tokens untimed: workers started, and every source's decode-ahead (a shuffle window
    of row groups each) under way, so the ahead-work at the start and at the end of the timed
    stretch roughly cancel. Without it the mixture's first windows (three sources, not one)
    would be decoded inside the timed stretch and charged to it."""
    it = iter(dl)
    tokens = 0
    for b in it:
        tokens += int(b["cu_seqlens"][-1])
        if tokens >= warm:
            break
    tokens = 0
    start, seen = _children_cpu(), {}
    main, t0 = time.process_time(), time.perf_counter()
    for n, b in enumerate(it, 1):
        tokens += int(b["cu_seqlens"][-1])
        if n % 16 == 0:  # workers exit at the end: keep their last reading
            seen.update(_children_cpu())
        if tokens >= goal:
            break
    rate = tokens / (time.perf_counter() - t0)
    seen.update(_children_cpu())
    used = time.process_time() - main + sum(v - start.get(p, 0.0) for p, v in seen.items())
    del it
    return rate, used / tokens * 1e6


def _whole_cpu() -> float:
    """CPU seconds of this process and of its finished (waited-for) children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def whole_run(dl, total: float) -> float:
    """CPU seconds per million tokens over a whole run of `total` tokens, from the iterator's
    start (workers forked, first windows decoded) to its end (workers joined, the row groups
    decoded ahead and never used included)."""
    c0, tokens = _whole_cpu(), 0
    it = iter(dl)
    for b in it:
        tokens += int(b["cu_seqlens"][-1])
        if tokens >= total:
            break
    del it, b
    gc.collect()  # the DataLoader iterator joins its workers
    time.sleep(0.2)
    return (_whole_cpu() - c0) / tokens * 1e6


def single_loader(path: Path, workers: int):
    ds = PackedDataset(path, tokens_per_batch=BUDGET, seed=0)
    return ds if workers == 0 else PackedDataLoader(ds, num_workers=workers, prefetch_factor=8)


def mixture_loader(paths: dict[str, Path], workers: int, total: float):
    spec = MixtureSpec(
        sources=tuple(SourceSpec(name=n, path=str(p), weight=WEIGHTS[n]) for n, p in paths.items()),
        total_tokens=int(total),
    )
    ds = MixedDataset(spec, tokens_per_batch=BUDGET)
    return ds if workers == 0 else MixedDataLoader(ds, num_workers=workers, prefetch_factor=8)


def single(path: Path, workers: int, goal: float, warm: float) -> tuple[float, float]:
    ds = PackedDataset(path, tokens_per_batch=BUDGET, seed=0)
    if workers == 0:
        return _drain(ds, goal, warm)
    return _drain(PackedDataLoader(ds, num_workers=workers, prefetch_factor=8), goal, warm)


def mixture(paths: dict[str, Path], workers: int, goal: float, warm: float) -> tuple[float, float]:
    spec = MixtureSpec(
        sources=tuple(SourceSpec(name=n, path=str(p), weight=WEIGHTS[n]) for n, p in paths.items()),
        total_tokens=int(10 * (goal + warm)),
    )
    ds = MixedDataset(spec, tokens_per_batch=BUDGET)
    if workers == 0:
        return _drain(ds, goal, warm)
    return _drain(MixedDataLoader(ds, num_workers=workers, prefetch_factor=8), goal, warm)


def throughput(paths: dict[str, Path], goal: float, warm: float, repeat: int) -> list[list[object]]:
    best: dict[tuple[str, int], float] = {}
    cpu: dict[tuple[str, int], float] = {}
    runs = (
        ("one", lambda w: single(paths["web"], w, goal, warm)),
        ("mix", lambda w: mixture(paths, w, goal, warm)),
    )
    whole: dict[tuple[str, int], float] = {}
    total = goal + warm
    loaders = (
        ("one", lambda w: single_loader(paths["web"], w)),
        ("mix", lambda w: mixture_loader(paths, w, total)),
    )
    for _ in range(repeat):
        for workers in (0, 1, 2):
            for name, fn in runs:
                rate, secs = fn(workers)
                best[(name, workers)] = max(best.get((name, workers), 0.0), rate)
                cpu[(name, workers)] = min(cpu.get((name, workers), float("inf")), secs)
                print(
                    f"  {name} workers={workers}: {rate / 1e6:.1f} M tokens/s, "
                    f"{1e3 * secs:.1f} ms CPU per M tokens",
                    flush=True,
                )
            for name, make in loaders:
                secs = whole_run(make(workers), total)
                whole[(name, workers)] = min(whole.get((name, workers), float("inf")), secs)
                print(f"  {name} workers={workers}: whole run {1e3 * secs:.1f} ms CPU per M")
    rows = []
    for workers in (0, 1, 2):
        one, mix = best[("one", workers)], best[("mix", workers)]
        c1, c2 = cpu[("one", workers)], cpu[("mix", workers)]
        w1, w2 = whole[("one", workers)], whole[("mix", workers)]
        label = "in-process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
        rows.append([
            label, f"{one / 1e6:.0f} M", f"{mix / 1e6:.0f} M", f"{mix / one:.2f}x",
            f"{1e3 * c1:.1f} / {1e3 * c2:.1f} ({c2 / c1:.2f}x)",
            f"{1e3 * w1:.1f} / {1e3 * w2:.1f} ({w2 / w1:.2f}x)",
        ])  # fmt: skip
    return rows


# --- proportion error ------------------------------------------------------------------------


class _Lengths:
    def __init__(self, lengths: np.ndarray) -> None:
        self.base = lengths

    def epoch_rows(self, epoch: int) -> int:
        return len(self.base)

    def lengths(self, epoch: int, start: int, n: int) -> np.ndarray:
        return self.base[start : start + n]


def _row_lengths(n: int, seed: int) -> dict[str, np.ndarray]:
    """Rows of three kinds: nearly full (web), mixed (code), short (chat-like)."""
    rng = np.random.default_rng(seed)
    return {
        "web": np.clip(rng.normal(4000, 60, n), 1, MAX_LEN).astype(np.int64),
        "code": rng.integers(1000, MAX_LEN + 1, n).astype(np.int64),
        "books": rng.integers(200, 1500, n).astype(np.int64),
    }


def _errors(src: np.ndarray, lengths: np.ndarray, weights: np.ndarray, marks, unit: str):
    """Per mark: (largest |share - weight| in percentage points, largest |delivered - target|
    in rows, or in rows' worth of max_len tokens)."""
    out = []
    for n in marks:
        s, length = src[:n], lengths[:n]
        units = np.ones(n) if unit == "rows" else length.astype(np.float64)
        got = np.bincount(s, weights=units, minlength=len(weights))
        total = got.sum()
        dev = np.abs(got - weights * total)
        scale = 1.0 if unit == "rows" else MAX_LEN
        out.append((100 * float((dev / total).max()), float(dev.max() / scale)))
    return out


def proportion_table(marks: list[int], seeds: int) -> list[list[object]]:
    import datasets

    datasets.disable_progress_bars()
    n = max(marks)
    names = list(WEIGHTS)
    w = np.array([WEIGHTS[k] for k in names])
    lens = _row_lengths(n, 0)
    rows = []
    for unit in ("rows", "tokens"):
        from packtool.schedule import Schedule

        specs = [SourceSpec(name=k, path="-", weight=WEIGHTS[k]) for k in names]
        sch = Schedule(specs, [_Lengths(lens[k]) for k in names], unit=unit, max_len=MAX_LEN)
        chunk = sch.next(n)
        ours = _errors(chunk.src.astype(np.int64), chunk.length, w, marks, unit)
        # HF: probabilities per sample; in tokens mode divide by mean row length so the
        # expected token shares are the weights (its best case).
        p = w if unit == "rows" else w / np.array([lens[k].mean() for k in names])
        p = (p / p.sum()).tolist()
        hf = []
        for seed in range(seeds):
            parts = [
                datasets.Dataset.from_dict({"src": [i] * n, "length": lens[k].tolist()})
                for i, k in enumerate(names)
            ]
            mixed = datasets.interleave_datasets(
                parts, probabilities=p, seed=seed, stopping_strategy="all_exhausted"
            )
            src = np.asarray(mixed.select(range(n))["src"], np.int64)
            length = np.asarray(mixed.select(range(n))["length"], np.int64)
            hf.append(_errors(src, length, w, marks, unit))
        for j, m in enumerate(marks):
            hf_pp = [h[j][0] for h in hf]
            hf_rows = [h[j][1] for h in hf]
            what = "rows" if unit == "rows" else "rows of max_len"
            rows.append([
                unit, f"{m:,}", f"{ours[j][0]:.4f} pp ({ours[j][1]:.2f} {what})",
                f"{np.mean(hf_pp):.3f} pp (worst {max(hf_pp):.3f}; {np.mean(hf_rows):.1f} {what})",
            ])  # fmt: skip
    return rows


# --- schedule cost ---------------------------------------------------------------------------

_CHILD = """
import json, sys, time
import numpy as np
from packtool.mixture import SourceSpec
from packtool.schedule import Schedule, SyntheticLengths
n, unit, build = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
def hwm():  # this process's peak RSS (ru_maxrss would include the parent's, kept across exec)
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM")) / 1024
sch = Schedule(
    [SourceSpec(name=k, path="-", weight=w) for k, w in (("web", 0.5), ("code", 0.3), ("books", 0.2))],
    [SyntheticLengths(10**7, 10**7 * 4000), SyntheticLengths(10**6, 10**6 * 2500), SyntheticLengths(10**5, 10**5 * 800)],
    unit=unit, max_len=4096,
)
sch.next(1000)  # numba kernel loaded from its cache
t0 = time.perf_counter()
done = 0
while build and done < n:
    done += len(sch.next(min(1 << 20, n - done)))
seconds = time.perf_counter() - t0
state = json.dumps(sch.state())
print(json.dumps({"seconds": seconds, "rows": done, "peak": hwm(), "state_bytes": len(state)}))
"""


def schedule_cost(n: int) -> list[list[object]]:
    rows = []
    for unit in ("tokens", "rows"):
        runs = []
        for build in ("0", "1"):
            out = subprocess.run(
                [sys.executable, "-c", _CHILD, str(n), unit, build], capture_output=True,
                text=True, cwd=ROOT, check=True,
            )  # fmt: skip
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        idle, built = runs
        rows.append([
            unit, f"{built['rows']:,}", f"{built['seconds']:.2f}",
            f"{built['seconds'] / built['rows'] * 1e9:.0f}",
            f"{built['peak']:.0f} (floor {idle['peak']:.0f})", f"{built['state_bytes']:,}",
        ])  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    ap.add_argument("--tokens", type=float, default=None, help="tokens per throughput run")
    ap.add_argument("--warm", type=float, default=None, help="tokens read before timing")
    ap.add_argument("--repeat", type=int, default=2, help="interleaved runs per setting")
    ap.add_argument("--schedule-rows", type=float, default=None, help="rows for the schedule cost")
    args = ap.parse_args(argv)
    # warm + timed stay inside one epoch of the single dataset (web: ~118 M tokens): an epoch's
    # end (nothing left to decode ahead) would make the single dataset's stretch cheaper than a
    # loader (in its timed stretch). The warm-up lets each source's decode-ahead (up to 16 row
    # groups, a shuffle window, per source and worker) fill before timing starts.
    goal = args.tokens or (6e6 if args.quick else 64e6)
    warm = args.warm if args.warm is not None else (4e6 if args.quick else 48e6)
    n_sched = int(args.schedule_rows or (1e6 if args.quick else 1e8))
    marks = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    paths = sources(args.quick)
    print("throughput", flush=True)
    tput = throughput(paths, goal, warm, args.repeat)
    print("proportion error", flush=True)
    prop = proportion_table(marks, seeds=5)
    print("schedule cost", flush=True)
    cost = schedule_cost(n_sched)
    load = os.getloadavg()
    sizes = ", ".join(
        f"{n} {json.loads((p / 'index.json').read_text())['counts']['rows']:,} rows ({WEIGHTS[n]})"
        for n, p in paths.items()
    )
    body = "\n\n".join([
        f"Mixtures (`python -m benchmarks.bench_mixture{' --quick' if args.quick else ''}`, "
        f"{time.strftime('%Y-%m-%d')}; {os.cpu_count()} cores ({platform.machine()}), torch "
        f"{torch.__version__}, load average {load[0]:.1f} / {load[1]:.1f} (1 / 5 min) at the end).",
        f"Loader throughput, real tokens/s in 64k-token batches, best of {args.repeat} interleaved "
        f"runs of {goal / 1e6:,.0f} M tokens timed after {warm / 1e6:,.0f} M untimed (workers "
        "started, every source's decode-ahead under way): one `PackedDataset` (the largest "
        "source) through "
        "`PackedDataLoader` against a 3-source `MixedDataset` through `MixedDataLoader` (weights "
        f"in tokens; {sizes}; random token ids in `packtool pack`'s shard layout, lz4, 256-row "
        "row groups, page cache warm). On a shared box the tokens/s ratio swings from run to "
        "run (other work takes the cores at random); the CPU time per token over every process "
        "and thread (best of the runs) is the steadier comparison. The last column counts "
        "every CPU second of a whole run from a cold iterator to its last batch (startup, the "
        "first shuffle windows, and the row groups decoded ahead and never used at the end "
        "included: the mixture has a window in flight per source, the single dataset one).",
        markdown_table(
            ["loader", "one PackedDataset", "3-source mixture", "mixture / one",
             "CPU ms per M tokens, one / mixture (every process and thread)",
             f"whole {(goal + warm) / 1e6:,.0f} M-token run: CPU ms per M tokens"],
            tput,
        ),  # fmt: skip
        "Proportion error after n rows, weights 0.5 / 0.3 / 0.2: the largest |share - weight| "
        "over the sources (percentage points) and the largest |delivered - target| (rows; in "
        "tokens mode in rows of max_len 4,096 tokens). packtool: `packtool.schedule` (one "
        "deterministic stream). HF: `datasets.interleave_datasets(probabilities=...)`, mean "
        "over 5 seeds (worst seed in brackets); in tokens mode the rows are ~4,000 / 1,000-4,096 "
        "/ 200-1,500 tokens and HF's probabilities are weight / mean row length.",
        markdown_table(["unit", "rows", "packtool", "HF interleave_datasets"], prop),
        f"Schedule cost: {n_sched:,} rows of a 3-source mixture, in a child process (numba "
        "kernel from its cache). Memory does not grow with the rows: the state is a cursor and "
        "counters per source (JSON size in the last column). A precomputed blending index "
        f"(Megatron's int16 dataset index + int64 sample index) would hold {n_sched * 10 / 2**20:,.0f} MiB.",
        markdown_table(["unit", "rows", "seconds", "ns / row", "peak RSS MiB", "state bytes"], cost),
    ])  # fmt: skip
    print(body)
    update_readme("mixture", body)


if __name__ == "__main__":
    main()
