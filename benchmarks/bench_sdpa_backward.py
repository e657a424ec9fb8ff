"""The CPU `sdpa` backend's backward with many documents: one split per tensor against a slice
per document (the baseline, what the backend did before 2026-12-05).

A slice's backward writes its gradient into a zeroed tensor of all T tokens, so slicing each of
n documents costs O(n x T) per tensor and layer; `Tensor.split` backward concatenates the
pieces once. The batch is the loader's: `PackedDataset` rows of the sample corpus packed at
4096, whose rows hold many short documents.

    python -m benchmarks.bench_sdpa_backward            # ~1 minute on 2 cores
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

import torch
import torch.nn.functional as F

from attention import backends
from benchmarks._common import ROOT, markdown_table, publish

CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def sliced(q, k, v, cu_seqlens, *, max_seqlen, causal, scale, window):
    """The baseline: a slice of q, k and v per document (causal, no window)."""
    kx, vx = backends._expand_kv(k, q.shape[1]), backends._expand_kv(v, q.shape[1])
    outs = []
    for start, end in pairwise(cu_seqlens.tolist()):
        if end == start:
            continue
        qd, kd, vd = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, kx, vx))
        od = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)
        outs.append(od.squeeze(0).transpose(0, 1))
    return torch.cat(outs, dim=0)


def step_seconds(kernel, batch, heads: int, kv_heads: int, head_dim: int, repeats: int) -> float:
    """Best of `repeats` forward + backward of one attention call over the batch's tokens."""
    total = batch["input_ids"].numel()
    gen = torch.Generator().manual_seed(0)
    best = float("inf")
    for _ in range(repeats):
        q = torch.randn(total, heads, head_dim, generator=gen, requires_grad=True)
        k = torch.randn(total, kv_heads, head_dim, generator=gen, requires_grad=True)
        v = torch.randn(total, kv_heads, head_dim, generator=gen, requires_grad=True)
        t0 = time.perf_counter()
        out = kernel(
            q, k, v, batch["cu_seqlens"], max_seqlen=batch["max_seqlen"], causal=True,
            scale=head_dim**-0.5, window=(-1, 0),
        )  # fmt: skip
        out.float().pow(2).mean().backward()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="rows of 4096 tokens per batch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-docs", action="store_true", help="print only")
    args = parser.parse_args()
    torch.set_num_threads(1)
    from loader import PackedDataLoader, PackedDataset

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "packed"
        subprocess.run(
            [sys.executable, "-m", "packtool.cli", "pack", str(CORPUS), "-o", str(out)],
            check=True, capture_output=True,
        )  # fmt: skip
        batch = next(iter(PackedDataLoader(PackedDataset(out, rows_per_batch=args.rows))))
    n_docs = len(batch["cu_seqlens"]) - 1
    rows = []
    times = {}
    for name, kernel in (("slice per document (before)", sliced), ("split (now)", backends.sdpa)):
        times[name] = step_seconds(kernel, batch, 4, 2, 64, args.repeats)
    # Interleave a second pass so a busy neighbour hits both alike.
    for name, kernel in (("slice per document (before)", sliced), ("split (now)", backends.sdpa)):
        times[name] = min(times[name], step_seconds(kernel, batch, 4, 2, 64, args.repeats))
    base = times["slice per document (before)"]
    for name, seconds in times.items():
        rows.append([name, f"{seconds:.2f}", f"{base / seconds:.2f}x"])
    body = (
        f"CPU `sdpa` backend, forward + backward of one attention call "
        f"(`python -m benchmarks.bench_sdpa_backward`, {time.strftime('%Y-%m-%d')}; "
        f"{platform.machine()}, 1 torch thread, torch {torch.__version__}, float32): a batch of "
        f"{args.rows} rows of the sample corpus packed at 4096, {batch['input_ids'].numel():,} "
        f"tokens in {n_docs} documents, 4 query heads / 2 kv heads of 64; best of "
        f"{2 * args.repeats}, the two kernels interleaved.\n\n"
        + markdown_table(["q, k, v per document", "seconds", "vs before"], rows)
    )
    publish("sdpa-backward", body, docs=not args.no_docs)


if __name__ == "__main__":
    main()
