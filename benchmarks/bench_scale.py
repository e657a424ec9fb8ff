"""Scale-out benchmark: `packtool pack` with the local engine on 1 core, on all cores, and with
the Ray engine on the same cores, on a >= 100 MB corpus. Run from the repo root:

    python -m benchmarks.bench_scale [--repeat 1] [--tokenizer tiktoken:bench_data/gpt2.tiktoken]

The corpus is sample_data/corpus.jsonl repeated 35 times (bench_data/scale_corpus_x35.jsonl,
~108 MB, made on first use; bench_data/ is git-ignored). The tokenizer is the GPT-2 BPE at
bench_data/gpt2.tiktoken when present, else `byte`. Every run is a separate `packtool pack`
process (`--json`), timed from outside (wall clock, interpreter start and Ray start included).
"1 core" = `taskset -c 0`, `--workers 1`, and numba / Arrow / OpenMP / Rayon threads set to 1.
The baseline is that 1-core run, measured in the same invocation. Also measured: the reader alone
(one core: the Ray engine's one sequential stage, hence its ceiling), and the Ray start-up cost
on the 3 MB sample corpus. README block `scale`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import ROOT, markdown_table, update_readme

DATA = ROOT / "bench_data"
SAMPLE = ROOT / "sample_data" / "corpus.jsonl"
CORPUS = DATA / "scale_corpus_x35.jsonl"
OUT = DATA / "scale_out"
GPT2 = DATA / "gpt2.tiktoken"
ONE_THREAD = {
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",  # also caps Arrow's CPU pool
    "RAYON_NUM_THREADS": "1",  # HF tokenizers
    "TOKENIZERS_PARALLELISM": "false",
}


def make_corpus(copies: int = 35) -> Path:
    """sample_data/corpus.jsonl repeated `copies` times (written once)."""
    if not CORPUS.exists():
        DATA.mkdir(exist_ok=True)
        data = SAMPLE.read_bytes()
        tmp = CORPUS.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            for _ in range(copies):
                f.write(data)
        tmp.replace(CORPUS)
    return CORPUS


def run_pack(
    name: str,
    corpus: Path,
    tokenizer: str,
    extra: list[str],
    *,
    chunk_docs: int,
    one_core: bool = False,
) -> dict:
    """One `packtool pack` process; returns its JSON summary plus the outside wall time."""
    out = OUT / name
    cmd = [sys.executable, "-m", "packtool.cli", "pack", str(corpus), "-o", str(out)]
    cmd += ["--overwrite", "--max-len", "4096", "--tokenizer", tokenizer, "--json", *extra]
    cmd += ["--chunk-docs", str(chunk_docs)]
    env = dict(os.environ)
    if one_core:
        cmd = ["taskset", "-c", "0", *cmd, "--workers", "1"]
        env.update(ONE_THREAD)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout)
    summary["wall"] = wall
    summary["sha256"] = [s["sha256"] for s in summary["shards"]]
    return summary


def reader_rate(corpus: Path) -> tuple[float, float]:
    """Documents and bytes per second of `read_corpus` alone, in this process (one core)."""
    from packtool.corpus import read_corpus

    t0 = time.perf_counter()
    docs = nbytes = 0
    for batch in read_corpus([corpus]):
        docs += len(batch)
        nbytes += batch.nbytes
    seconds = time.perf_counter() - t0
    return docs / seconds, nbytes / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="runs per setting (best kept)")
    parser.add_argument(
        "--chunk-docs",
        type=int,
        default=10_000,
        help="documents per chunk (the Ray engine's unit of parallelism: 14 chunks here)",
    )
    parser.add_argument(
        "--tokenizer", default=None, help="default: GPT-2 BPE if present, else byte"
    )
    args = parser.parse_args()
    tokenizer = args.tokenizer or (f"tiktoken:{GPT2}" if GPT2.exists() else "byte")
    corpus = make_corpus()
    size_mb = corpus.stat().st_size / 1e6
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()
    print(f"corpus {corpus} ({size_mb:.0f} MB), tokenizer {tokenizer}, {cores} cores")

    settings = [
        ("local-1", "local, 1 core", [], True),
        ("local-all", f"local, {cores} cores", [], False),
        ("ray", f"ray, {cores} CPUs", ["--engine", "ray"], False),
    ]
    results: dict[str, dict] = {}
    for name, label, extra, one_core in settings:
        best = None
        for _ in range(args.repeat):
            r = run_pack(
                name, corpus, tokenizer, extra, chunk_docs=args.chunk_docs, one_core=one_core
            )
            print(f"  {label}: {r['wall']:.1f} s")
            best = r if best is None or r["wall"] < best["wall"] else best
        results[label] = best

    # Ray start-up on a small corpus: the same command on the 3 MB sample, both engines.
    small = {
        engine: run_pack(
            f"small-{engine}", SAMPLE, tokenizer, ["--engine", engine], chunk_docs=args.chunk_docs
        )
        for engine in ("local", "ray")
    }
    docs_s, bytes_s = reader_rate(corpus)
    load_after = os.getloadavg()

    base = results["local, 1 core"]
    tokens = base["counts"]["tokens_in"]
    rows = []
    for label, r in results.items():
        rows.append(
            [
                label,
                f"{r['wall']:.1f}",
                f"{r['counts']['tokens_in'] / r['wall'] / 1e6:.2f}",
                f"{base['wall'] / r['wall']:.2f}x",
                f"{r['efficiency']:.4%}",
            ]
        )
    local_all = results[f"local, {cores} cores"]
    ray_run = results[f"ray, {cores} CPUs"]
    identical = ray_run["sha256"] == local_all["sha256"] == base["sha256"]
    same_counts = ray_run["counts"] == local_all["counts"]
    ray_s = ray_run["seconds"]
    actor_seconds = ray_s["tokenize"] + ray_s["pack"] + ray_s["write"]
    per_actor = tokens / actor_seconds  # tokens/s one Ray actor (one core) sustains
    tokens_per_byte = tokens / (size_mb * 1e6)
    reader_tokens = bytes_s * tokens_per_byte
    per_core = tokens / base["wall"]  # the 1-core local run, start-up included: conservative
    node_rate = per_core * cores
    small_cost = small["ray"]["wall"] - small["local"]["wall"]

    body = "\n".join(
        [
            f"`python -m benchmarks.bench_scale`: `packtool pack` on {size_mb:.0f} MB of JSONL "
            f"(sample_data x35, {base['counts']['documents_in']:,} documents, {tokens / 1e6:.1f} M "
            f"tokens), tokenizer `{tokenizer.replace(str(ROOT) + '/', '')}`, max_len 4096, "
            f"`--chunk-docs {args.chunk_docs:,}` (the Ray engine's unit of parallelism: "
            f"{-(-base['counts']['documents_in'] // args.chunk_docs)} chunks) for every run; wall clock of the whole process, best of {args.repeat}. "
            f"{cores}-core box shared with other work: load average (1 min) {load_before[0]:.1f} "
            f"before, {load_after[0]:.1f} after.",
            "",
            markdown_table(["run", "seconds", "M tokens/s", "speed-up", "efficiency"], rows),
            "",
            f"- Same answer: shards of all three runs byte-identical: **{identical}**; Ray's "
            f"counts equal the local engine's: **{same_counts}**.",
            f"- Ray start-up, measured on the 3 MB sample corpus: `--engine ray` "
            f"{small['ray']['wall']:.1f} s against {small['local']['wall']:.1f} s locally, "
            f"so about **{small_cost:.0f} s** of fixed cost (of which `ray.init` "
            f"{small['ray']['seconds']['ray start']:.1f} s; the rest is starting workers and "
            f"actors that import packtool and load the tokenizer and numba kernels).",
            f"- Per core: the 1-core local run gives {per_core / 1e6:.2f} M tokens/s; one Ray "
            f"actor sustained {per_actor / 1e6:.2f} M tokens/s (tokenize+pack+write, summed "
            f"actor time, sharing {cores} cores with the reader and the driver). The reader "
            f"alone (one core; the Ray engine's only sequential stage) reads {bytes_s / 1e6:.0f} "
            f"MB/s = {docs_s:,.0f} documents/s ~ {reader_tokens / 1e6:.1f} M tokens/s of this "
            f"tokenizer.",
            f"- On paper, N nodes of C cores: chunks are independent (no shuffle; each chunk is "
            f"read once, sent to one actor, written by it), so throughput ~ "
            f"min(N x C x {per_core / 1e6:.2f}, {reader_tokens / 1e6:.1f}) M tokens/s after the "
            f"~{small_cost:.0f} s start-up: the single reader saturates at about "
            f"{reader_tokens / per_core:.0f} busy cores (~{reader_tokens / node_rate:.0f} nodes "
            f"like this one) with this tokenizer, sooner with a cheaper one (byte).",
        ]
    )
    print(body)
    update_readme("scale", body)
    shutil.rmtree(OUT, ignore_errors=True)


if __name__ == "__main__":
    main()
