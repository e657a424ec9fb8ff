"""Mixtures: loader throughput, proportion error against HF `interleave_datasets`, schedule cost.

Run: `python -m benchmarks.bench_mixture [--quick] [--short 32e6] [--long 352e6] [--repeat 3]
[--workers 0,1,2]`.
Writes the docs/benchmarks.md block `mixture`. Measures, in one run:

- Loader throughput (real tokens/s, 64k-token batches, `tokens_per_batch` the same for both) of
  a 3-source `MixedDataset` (weights 0.5 / 0.3 / 0.2 in tokens) through `MixedDataLoader`,
  against one `PackedDataset` through `PackedDataLoader` over the largest of the three (same
  workers, prefetch_factor 8, shuffle window and seed), in-process and with 1 and 2 workers.
  Each setting runs whole, from a cold iterator, for `--short` and for `--long` tokens (both
  inside one epoch of the single dataset); the figures are the marginal cost of the tokens in
  between: (CPU of the long run - CPU of the short one) / (tokens between), CPU of every process
  and thread, workers joined; tokens/s likewise from wall time. Startup (forks, opening the
  sources, the first shuffle windows) and the row groups decoded ahead and never used at the end
  (a window per source: the mixture has three) are in both runs and cancel; they are in the
  whole-run column. Rounds are interleaved (one and mixture adjacent, their order alternating),
  medians of `--repeat`. The sources are synthetic random token ids written the way
  `packtool pack` writes shards (lz4, 256-row row groups: the costliest to decode), in
  bench_data/ (made once, reused).
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

from benchmarks._common import ROOT, markdown_table, update_block
from loader import MixedDataLoader, MixedDataset, PackedDataLoader, PackedDataset
from loader.testing import write_random_dataset
from packtool.dataset.shards import ShardConfig
from packtool.mixture.schedule import load_kernel
from packtool.mixture.spec import MixtureSpec, SourceSpec

BUDGET = 65_536
MAX_LEN = 4096
WEIGHTS = {"web": 0.5, "code": 0.3, "books": 0.2}


def sources(quick: bool) -> dict[str, Path]:
    """Three synthetic packed datasets (random ids, `packtool pack`'s shard layout)."""
    rows = {"web": 120_000, "code": 48_000, "books": 16_000}
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


def _whole_cpu() -> float:
    """CPU seconds of this process (every thread) and of its finished (waited-for) children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run(dl, total: float) -> tuple[float, float, int]:
    """(CPU seconds over every process, wall seconds, tokens) of a whole run of `total` tokens
    from a cold iterator: workers forked, first windows decoded, to the last batch (wall) and
    the workers joined (CPU: the row groups decoded ahead and never used included)."""
    gc.collect()
    c0, t0, tokens = _whole_cpu(), time.perf_counter(), 0
    it = iter(dl)
    for b in it:
        tokens += int(b["cu_seqlens"][-1])
        if tokens >= total:
            break
    wall = time.perf_counter() - t0
    del it, b
    gc.collect()  # the DataLoader iterator joins its workers
    time.sleep(0.2)
    return _whole_cpu() - c0, wall, tokens


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


def throughput(
    paths: dict[str, Path], short: float, long: float, repeat: int, counts=(0, 1, 2)
) -> tuple[list[list[object]], list[str]]:
    """Per worker count: the marginal cost of the tokens between a short and a long whole run
    (what a token costs once the loader runs: startup, the first shuffle windows and the end's
    unused decode-ahead cancel), median over `repeat` interleaved rounds, and the whole long
    run's CPU per token."""
    makers = {
        "one": lambda w, n: single_loader(paths["web"], w),
        "mix": lambda w, n: mixture_loader(paths, w, n),
    }
    got: dict[tuple[str, int, str], list[tuple[float, float, int]]] = {}
    loads = []
    load_kernel()  # the schedule's compiled kernel, once per process (an import, not a run)
    for r in range(repeat):
        for workers in counts:
            for length, total in (("short", short), ("long", long)):
                order = ("one", "mix") if r % 2 == 0 else ("mix", "one")
                for name in order:
                    cpu, wall, tokens = run(makers[name](workers, total), total)
                    got.setdefault((name, workers, length), []).append((cpu, wall, tokens))
                    print(
                        f"  round {r} {name} workers={workers} {length}: {tokens / wall / 1e6:.1f} "
                        f"M tokens/s, {1e3 * cpu / tokens * 1e6:.1f} ms CPU per M tokens",
                        flush=True,
                    )
        loads.append(f"{os.getloadavg()[0]:.1f}")
    rows = []
    for workers in counts:
        per = {}
        for name in ("one", "mix"):
            marg_cpu, marg_rate, whole = [], [], []
            for (c1, w1, t1), (c2, w2, t2) in zip(
                got[(name, workers, "short")], got[(name, workers, "long")], strict=True
            ):
                marg_cpu.append((c2 - c1) / (t2 - t1) * 1e9)  # ms per M tokens
                # a long run faster than the short one (a loaded box): no rate to report
                marg_rate.append((t2 - t1) / (w2 - w1) if w2 > w1 else float("nan"))
                whole.append(c2 / t2 * 1e9)
            per[name] = [float(np.median(x)) for x in (marg_rate, marg_cpu, whole)]
            per[name + "_ratios"] = marg_cpu
        (r1, c1, w1), (r2, c2, w2) = per["one"], per["mix"]
        ratios = [m / o for o, m in zip(per["one_ratios"], per["mix_ratios"], strict=True)]
        label = "in-process" if workers == 0 else f"{workers} worker{'s' if workers > 1 else ''}"
        rows.append([
            label, f"{r1 / 1e6:.0f} M", f"{r2 / 1e6:.0f} M", f"{r2 / r1:.2f}x",
            f"{c1:.1f} / {c2:.1f} ({c2 / c1:.2f}x; rounds {min(ratios):.2f}-{max(ratios):.2f}x)",
            f"{w1:.1f} / {w2:.1f} ({w2 / w1:.2f}x)",
        ])  # fmt: skip
    return rows, loads


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
        from packtool.mixture.schedule import Schedule

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
from packtool.mixture.spec import SourceSpec
from packtool.mixture.schedule import Schedule, SyntheticLengths
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
    ap.add_argument("--short", type=float, default=None, help="tokens of the short run")
    ap.add_argument("--long", type=float, default=None, help="tokens of the long run")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--schedule-rows", type=float, default=None, help="rows for the schedule cost")
    ap.add_argument(
        "--workers",
        default="0,1,2",
        help="worker counts to measure, e.g. 2 (anything but 0,1,2 prints the throughput table "
        "only and leaves docs/benchmarks.md as it is)",
    )
    args = ap.parse_args(argv)
    counts = tuple(int(w) for w in args.workers.split(","))
    # Both runs stay inside one epoch of the single dataset (web: ~470 M tokens): an epoch's end
    # (nothing left to decode ahead) would make it cheaper than a loader in mid-run. The long
    # run is ~20 shuffle windows of every source, so where a run stops inside a window (its
    # unused decode-ahead) moves the marginal CPU by a few per cent at most.
    short = args.short or (4e6 if args.quick else 32e6)
    long = args.long or (40e6 if args.quick else 352e6)
    n_sched = int(args.schedule_rows or (1e6 if args.quick else 1e8))
    marks = [1_000, 10_000] if args.quick else [1_000, 10_000, 100_000]
    paths = sources(args.quick)
    print("throughput", flush=True)
    tput, loads = throughput(paths, short, long, args.repeat, counts)
    if counts != (0, 1, 2):
        print(markdown_table(["loader", "one", "mixture", "mixture / one", "CPU", "whole"], tput))
        return
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
        "Loader throughput, real tokens/s in 64k-token batches (`tokens_per_batch` 65,536 for "
        "both), one `PackedDataset` (the largest source) through `PackedDataLoader` against a "
        f"3-source `MixedDataset` through `MixedDataLoader` (weights in tokens; {sizes}; random "
        "token ids in `packtool pack`'s shard layout, lz4, 256-row row groups, page cache warm; "
        "the same workers, prefetch_factor 8, shuffle window 16 row groups). Marginal figures: "
        f"each setting runs whole from a cold iterator for {short / 1e6:,.0f} M and for "
        f"{long / 1e6:,.0f} M tokens, and the tokens in between are charged (CPU of every "
        "process and thread, workers joined, and wall time): startup, the first shuffle windows "
        "and the decode-ahead never used at the end cancel. Median of "
        f"{args.repeat} interleaved rounds (load average {' / '.join(loads)} after each); the "
        "CPU ratio of each round in brackets. tokens/s on this shared box moves with other "
        "work; CPU per token is the steadier figure. The last column is the whole long run, "
        "fixed costs included (the mixture opens three sources and keeps a shuffle window in "
        "flight per source).",
        markdown_table(
            ["loader", "one PackedDataset tokens/s", "3-source mixture tokens/s", "mixture / one",
             "CPU ms per M tokens, one / mixture",
             f"whole {long / 1e6:,.0f} M-token run: CPU ms per M tokens"],
            tput,
        ),  # fmt: skip
        "Proportion error after n rows, weights 0.5 / 0.3 / 0.2: the largest |share - weight| "
        "over the sources (percentage points) and the largest |delivered - target| (rows; in "
        "tokens mode in rows of max_len 4,096 tokens). packtool: `packtool.mixture.schedule` (one "
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
    update_block("mixture", body)


if __name__ == "__main__":
    main()
