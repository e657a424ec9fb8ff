"""Packing benchmarks. Run from the repo root: `python -m benchmarks.bench_pack [--quick]`.

Parts (each a function returning its markdown; `main` runs them and writes docs/benchmarks.md blocks):
- `bench_assign`: assignment speed of the numba FFD/BFD kernels (`packtool.pack.kernels`) on one core,
  N = 1e5, 1e6, 1e7 skewed lengths at max_len 4096, sort included, I/O excluded, numba compile
  time excluded (a warm-up call compiles first). Baseline measured in the same run: the
  plain-Python references (`packtool.pack.reference`) at N = 1e5. docs/benchmarks.md block `pack-assign`.
- `pack_efficiency.bench_efficiency`: rows against the lower bound at max_len 2048/4096/8192,
  gains per extra round, whole-corpus BFD, and the cost of chunking. docs/benchmarks.md `pack-efficiency`.
- `pack_rounds.bench_rounds`: `--rounds` x `--group-by`, every group's extra rounds in one numba
  call against the Python call per group and round it replaced. docs/benchmarks.md `pack-rounds`.
- `pack_efficiency.bench_end_to_end`: `packtool pack` from raw JSONL with GPT-2 BPE against the
  tokenizer library alone on the same texts: time beyond tokenization, peak RSS. docs/benchmarks.md `pack-e2e`.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numba
import numpy as np

from benchmarks import pack_efficiency, pack_rounds
from benchmarks._common import best_of, markdown_table, peak_rss_mib, update_block
from packtool.pack.kernels import bfd_assign, ffd_assign
from packtool.pack.reference import bfd_reference, ffd_reference

MAX_LEN = 4096
SEED = 0
KERNELS = {"ffd": (ffd_assign, ffd_reference), "bfd": (bfd_assign, bfd_reference)}


def skewed_lengths(n: int, max_len: int = MAX_LEN, seed: int = SEED) -> np.ndarray:
    """Token lengths shaped like real corpora (and sample_data): log-normal, median 320, sigma 1,
    clipped to 1..max_len (int32)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(320), 1.0, n), 1, max_len).astype(np.int32)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def bench_assign(
    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000),
    reference_n: int = 100_000,
    repeat: int = 3,
) -> str:
    """Time FFD/BFD assignment; return the markdown block for docs/benchmarks.md `pack-assign`."""
    load_before = os.getloadavg()[0]
    numba.set_num_threads(1)  # the kernels are serial; pin anyway for an honest one-core figure
    for kernel, _ in KERNELS.values():  # compile (or load the cache) outside the timings
        kernel(skewed_lengths(1000), MAX_LEN)

    rows = []
    kernel_at_ref: dict[str, float] = {}
    for n in sizes:
        lengths = skewed_lengths(n)
        for name, (kernel, _) in KERNELS.items():
            seconds = best_of(lambda k=kernel, x=lengths: k(x, MAX_LEN), repeat)
            _, _, n_rows = kernel(lengths, MAX_LEN)
            eff = int(lengths.sum()) / (n_rows * MAX_LEN)
            rows.append(
                [
                    name,
                    f"{n:,}",
                    f"{seconds * 1e3:,.1f}",
                    f"{n / seconds / 1e6:.1f}",
                    f"{n_rows:,}",
                    f"{100 * eff:.3f}%",
                ]
            )
            print(f"{name} N={n:,}: {seconds:.3f} s, {n / seconds / 1e6:.1f} M docs/s", flush=True)
            if n == reference_n:
                kernel_at_ref[name] = seconds

    ref_rows = []
    lengths = skewed_lengths(reference_n)
    as_list = lengths.tolist()
    for name, (kernel, reference) in KERNELS.items():
        if name not in kernel_at_ref:
            kernel_at_ref[name] = best_of(lambda k=kernel, x=lengths: k(x, MAX_LEN), repeat)
        t0 = time.perf_counter()
        ref = reference(as_list, MAX_LEN)  # once: it is quadratic
        ref_s = time.perf_counter() - t0
        got = kernel(lengths, MAX_LEN)
        same = got[0].tolist() == ref[0] and got[1].tolist() == ref[1] and got[2] == ref[2]
        ref_rows.append(
            [
                name,
                f"{reference_n:,}",
                f"{ref_s:.2f}",
                f"{kernel_at_ref[name] * 1e3:.1f} ms",
                f"{ref_s / kernel_at_ref[name]:,.0f}x",
                "yes" if same else "NO",
            ]
        )
        print(
            f"{name} reference N={reference_n:,}: {ref_s:.2f} s (same assignment: {same})",
            flush=True,
        )

    table = markdown_table(["algorithm", "documents", "ms", "M docs/s", "rows", "efficiency"], rows)
    ref_table = markdown_table(
        ["algorithm", "documents", "plain Python (s)", "numba", "speed-up", "same assignment"],
        ref_rows,
    )
    body = (
        f"Assignment speed, one core ({_cpu_name()}, {os.cpu_count()} cores on the box, shared), "
        f"max_len {MAX_LEN:,}, log-normal lengths (median 320, sigma 1, clipped to 1..{MAX_LEN:,}), "
        f"best of {repeat}; sort included, I/O and numba compile time excluded "
        "(a warm-up call compiles first). `python -m benchmarks.bench_pack`\n\n"
        f"{table}\n\n"
        "Against the plain-Python references (`packtool/pack/reference.py`, O(N x rows) loops, run "
        f"once) at N = {reference_n:,}:\n\n{ref_table}\n\n"
        f"Peak RSS {peak_rss_mib():,.0f} MiB. Load average (1 min) {load_before:.1f} before and "
        f"{os.getloadavg()[0]:.1f} after the run: other work on the box slows the 1e7 rows most "
        "(their arrays do not fit in cache)."
    )
    return body


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, no docs/benchmarks.md update (for development)",
    )
    parser.add_argument(
        "--only",
        nargs="+",
        choices=["pack-assign", "pack-rounds", "pack-efficiency", "pack-e2e"],
        help="run only these parts",
    )
    args = parser.parse_args(argv)
    if args.quick:
        print(bench_assign(sizes=(10_000, 100_000), reference_n=10_000, repeat=1))
        print(pack_rounds.bench_rounds(groups=(300,), rounds=(4,), repeat=1))
        return
    parts = {
        "pack-assign": bench_assign,
        "pack-rounds": pack_rounds.bench_rounds,
        "pack-efficiency": pack_efficiency.bench_efficiency,
        "pack-e2e": pack_efficiency.bench_end_to_end,
    }
    for name, bench in parts.items():
        if args.only and name not in args.only:
            continue
        body = bench()
        print(body)
        update_block(name, body)
        print(f"docs/benchmarks.md block {name} updated", flush=True)


if __name__ == "__main__":
    main()
