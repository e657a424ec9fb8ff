"""Online packing and request batching: efficiency vs buffer size, packer throughput, serving latency.

Run from the repo root: `python -m benchmarks.bench_online [--quick]`. Writes docs/benchmarks.md block `online`.

1. Efficiency (tokens / (rows × max_len)) of `loader.OnlinePacker` against buffer size, on
   sample_data (byte tokenizer, `packtool.tokenize.tokenize.tokenized_batches`) and on the Python standard
   library's sources (lengths = file bytes + 1 EOS, as the byte tokenizer counts them), each
   repeated in a seeded shuffled order to 200k+ documents; baseline: offline FFD
   (`packtool.pack.kernels.ffd_assign`) over the whole set after `make_segments`, in the same run.
2. Throughput on one core (numba kernels are single-threaded): documents pushed in chunks of 8192,
   timed from the first push to the last row out after the final flush: long-document split,
   buffer bookkeeping, FFD per buffer, hold-back of under-filled rows and the emitted row layout
   (`PackedRows`: per-row segment offsets, lengths, doc ids). "lengths only" moves no tokens;
   "with tokens" also gathers every token into its row (sample_data's real byte tokens).
   Compile time excluded (one warm-up run). Baseline: offline FFD on the same lengths.
3. Serving: Poisson arrivals of log-normal requests (median 256 tokens, clipped to 1..4096) into
   `loader.RequestBatcher` with a fake model of fixed cost; added latency = submit -> result minus
   the model's own time; batch fill = tokens / token budget. Baseline: max_wait_ms = 0.
"""

from __future__ import annotations

import argparse
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks._common import markdown_table, update_block
from loader.online.packer import OnlinePacker
from loader.online.serving import RequestBatcher
from packtool.pack import kernels
from packtool.pack.chunk import make_segments
from packtool.tokenize.tokenize import tokenized_batches

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 4096


def sample_data() -> tuple[np.ndarray, np.ndarray]:
    """(flat byte tokens, lengths) of sample_data/corpus.jsonl."""
    toks, lens = [], []
    for t in tokenized_batches([str(ROOT / "sample_data" / "corpus.jsonl")]):
        ids = t.column("input_ids").combine_chunks()
        toks.append(ids.values.to_numpy())
        lens.append(t.column("length").to_numpy().astype(np.int64))
    return np.concatenate(toks), np.concatenate(lens)


def stdlib_lengths() -> np.ndarray:
    lib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in lib.rglob("*.py") if "site-packages" not in p.parts)
    return np.array([p.stat().st_size + 1 for p in files], np.int64)


def repeat_shuffled(lengths: np.ndarray, n_min: int, seed: int = 0) -> np.ndarray:
    reps = -(-n_min // len(lengths))
    rep = np.tile(lengths, reps)
    return rep[np.random.default_rng(seed).permutation(len(rep))]


def offline_efficiency(lengths: np.ndarray) -> tuple[float, int]:
    segs, _ = make_segments(lengths, MAX_LEN, "split")
    _, _, n_rows = kernels.ffd_assign(segs.length, MAX_LEN)
    return float(segs.length.sum()) / (n_rows * MAX_LEN), n_rows


def online_run(lengths: np.ndarray, tokens: np.ndarray | None = None, chunk: int = 8192, **cfg):
    p = OnlinePacker(max_len=MAX_LEN, **cfg)
    starts = np.r_[0, np.cumsum(lengths)] if tokens is not None else None
    rows = 0
    for a in range(0, len(lengths), chunk):
        b = min(a + chunk, len(lengths))
        if tokens is None:
            p.push_lengths(lengths[a:b])
        else:
            p.push(tokens[starts[a] : starts[b]], lengths[a:b])
        rows += p.pop().n_rows
    p.flush()
    rows += p.pop().n_rows
    return p.stats


def efficiency_table(quick: bool) -> tuple[str, list[str]]:
    n_min = 50_000 if quick else 220_000
    sets = {
        "sample_data": repeat_shuffled(sample_data()[1], n_min),
        "stdlib": repeat_shuffled(stdlib_lengths(), n_min // 4),  # long files split ~4 ways
    }
    buffers = [100, 1_000, 10_000] + ([] if quick else [100_000])
    rows_out, notes = [], []
    for name, lengths in sets.items():
        off, off_rows = offline_efficiency(lengths)
        segs = make_segments(lengths, MAX_LEN, "split")[0].length.size
        rows_out.append(
            [
                name,
                f"{len(lengths):,} docs / {segs:,} segs",
                "offline FFD",
                "-",
                f"{off:.4f}",
                off_rows,
                "1.0000",
            ]
        )
        for buf in buffers:
            for label, cfg in [
                ("online FFD", {}),
                ("online FFD, no hold-back", {"min_fill": 0.0}),
                ("online bucketed (2-level)", {"strategy": "bucketed"}),
            ]:
                if label != "online FFD" and buf not in (1_000, 10_000):
                    continue
                s = online_run(lengths, buffer_docs=buf, **cfg)
                rows_out.append(
                    [
                        name,
                        "",
                        label,
                        f"{buf:,}",
                        f"{s['efficiency']:.4f}",
                        s["rows"],
                        f"{s['efficiency'] / off:.4f}",
                    ]
                )
                if label == "online FFD" and buf == 10_000:
                    notes.append(
                        f"{name}: online/offline at a 10k buffer = {s['efficiency'] / off:.4f}"
                    )
    headers = ["corpus", "size", "packer", "buffer", "efficiency", "rows", "vs offline"]
    return markdown_table(headers, rows_out), notes


def throughput_table(quick: bool) -> str:
    toks, lens = sample_data()
    n_min = 100_000 if quick else 1_000_000
    lengths = np.tile(lens, -(-n_min // len(lens)))
    # with tokens: 200k documents (~140M tokens) keep memory modest
    tok_docs = min(n_min, 200_000)
    tokens = np.tile(toks, -(-tok_docs // len(lens)))
    stdlib = repeat_shuffled(stdlib_lengths(), n_min)
    rows = []
    for name, L, T in [("sample_data", lengths, tokens), ("stdlib", stdlib, None)]:
        online_run(L[:20_000], buffer_docs=10_000)  # warm-up: numba compile / cache load
        t = min(
            _timed(
                lambda L=L: kernels.ffd_assign(
                    make_segments(L, MAX_LEN, "split")[0].length, MAX_LEN
                )
            )
            for _ in range(2)
        )
        rows.append(
            [
                name,
                f"{len(L):,}",
                "offline FFD (split + assign, no rows)",
                "-",
                f"{len(L) / t / 1e6:.2f}",
                "-",
            ]
        )
        for buf in (1_000, 10_000, 100_000):
            t = min(_timed(lambda L=L, buf=buf: online_run(L, buffer_docs=buf)) for _ in range(2))
            rows.append(
                [
                    name,
                    f"{len(L):,}",
                    "online, lengths only",
                    f"{buf:,}",
                    f"{len(L) / t / 1e6:.2f}",
                    "-",
                ]
            )
        if T is not None:
            Lt = np.tile(lens, -(-tok_docs // len(lens)))
            t = min(
                _timed(lambda Lt=Lt, T=T: online_run(Lt, T, buffer_docs=10_000)) for _ in range(2)
            )
            rows.append(
                [
                    name,
                    f"{len(Lt):,}",
                    "online, with tokens",
                    "10,000",
                    f"{len(Lt) / t / 1e6:.2f}",
                    f"{len(T) / t / 1e6:.0f}",
                ]
            )
    headers = ["corpus", "documents", "what", "buffer", "M docs/s", "M tokens/s"]
    return markdown_table(headers, rows)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def serving_table(quick: bool) -> str:
    duration = 1.5 if quick else 3.0
    model_ms = 5.0
    budget = 16_384
    rows = []
    for rate in (200, 1_000, 4_000):
        for wait in (0.0, 10.0, 50.0):
            r = _serve(rate, wait, model_ms, budget, duration)
            rows.append(
                [
                    rate,
                    wait,
                    r["requests"],
                    r["batches"],
                    f"{r['per_batch']:.1f}",
                    f"{r['fill']:.2f}",
                    f"{r['p50']:.1f}",
                    f"{r['p99']:.1f}",
                    f"{r['wait_p99']:.1f}",
                ]
            )
    headers = [
        "arrivals/s",
        "max_wait_ms",
        "requests",
        "batches",
        "requests/batch",
        "batch fill",
        "added p50 ms",
        "added p99 ms",
        "batcher wait p99 ms",
    ]
    return markdown_table(headers, rows)


def _serve(rate: float, wait_ms: float, model_ms: float, budget: int, duration: float) -> dict:
    rng = np.random.default_rng(int(rate))
    n = int(rate * duration)
    gaps = rng.exponential(1.0 / rate, n)
    lengths = np.clip(rng.lognormal(np.log(256), 1.0, n).astype(np.int64), 1, MAX_LEN)

    def model(batch):
        time.sleep(model_ms / 1000.0)  # fixed cost per call
        return batch["input_ids"]

    done = np.zeros(n)
    sent = np.zeros(n)
    lock = threading.Lock()
    with RequestBatcher(run_batch=model, max_wait_ms=wait_ms, token_budget=budget) as batcher:
        t0 = time.monotonic()
        due = t0
        for i in range(n):
            due += gaps[i]
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            sent[i] = time.monotonic()
            fut = batcher.submit(np.ones(lengths[i], np.int64))

            def finish(_f, i=i):
                with lock:
                    done[i] = time.monotonic()

            fut.add_done_callback(finish)
    stats = batcher.stats
    added = (done - sent) * 1000.0 - model_ms
    return {
        "requests": n,
        "batches": stats["batches"],
        "per_batch": n / max(stats["batches"], 1),
        "fill": stats["mean_fill"],
        "p50": float(np.percentile(added, 50)),
        "p99": float(np.percentile(added, 99)),
        "wait_p99": stats["wait_ms_p99"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    ap.add_argument("--no-readme", action="store_true", help="print only")
    args = ap.parse_args()
    eff, notes = efficiency_table(args.quick)
    print(eff, *notes, sep="\n")
    thr = throughput_table(args.quick)
    print(thr)
    srv = serving_table(args.quick)
    print(srv)
    body = (
        f"Online packing at max_len {MAX_LEN} (`python -m benchmarks.bench_online`; "
        "see docs/online.md for what each column includes).\n\n"
        f"Efficiency against buffer size:\n\n{eff}\n\n"
        + "\n".join(f"- {n}" for n in notes)
        + f"\n\nThroughput, one core:\n\n{thr}\n\n"
        f"Request batcher (fake model 5 ms per call, token budget 16,384, Poisson arrivals, "
        f"log-normal lengths, median 256):\n\n{srv}\n"
    )
    if not args.quick and not args.no_readme:
        update_block("online", body)


if __name__ == "__main__":
    main()
