"""What a loss mask costs: the same packed rows with and without a `loss_mask` column.

Run: `python -m benchmarks.bench_mask [--copies 20] [--repeat 3] [--quick]`.

Data (bench_data/, git-ignored, made once): sample_data/corpus.jsonl's documents as byte token
ids (+ EOS), `--copies` times, written as pre-tokenized Parquet twice: with `labels` (a made-up
conversation mask: alternating prompt and answer runs of 10-200 tokens, the last token always
supervised) and without. Both are packed with `--long-docs truncate --max-len 4096`, so the two
datasets hold exactly the same rows and the only difference is the mask. Then, interleaved and
best of `--repeat`, the baseline (no mask) against the masked data:

- `packtool pack` wall time from the pre-tokenized Parquet (reading and checking int64 `labels`
  is part of it), `packtool tokenize` of it (the pass-through to packtool's tokenized Parquet),
  and `pack` from that tokenized Parquet (packing's own cost of the mask);
- shard bytes per token on disk (lz4, the default);
- `packtool verify` wall time (checksums included);
- loader tokens/s in-process (decode, gather, collate: what one worker produces) and through a
  one-worker `PackedDataLoader` (the shared-memory ring carries one more byte per token).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._common import ROOT, markdown_table, update_block
from loader import PackedDataLoader, PackedDataset
from packtool.audit.verify import verify_dataset
from packtool.engines.local import RunConfig, run_pack
from packtool.pack.chunk import PackConfig
from packtool.tokenize.tokenize import tokenize_corpus

MAX_LEN = 4096
BUDGET = 65_536
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def inputs(copies: int) -> tuple[Path, Path]:
    """(masked, plain) pre-tokenized Parquet of the same documents."""
    folder = ROOT / "bench_data" / f"mask_{copies}"
    masked, plain = folder / "masked.parquet", folder / "plain.parquet"
    if masked.is_file() and plain.is_file():
        return masked, plain
    folder.mkdir(parents=True, exist_ok=True)
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    docs = [np.frombuffer(t.encode(), np.uint8).astype(np.int64) for t in texts if t]
    rng = np.random.default_rng(0)
    ids, labels = [], []
    for _ in range(copies):
        for d in docs:
            d = np.append(d, 256)  # EOS of the byte tokenizer
            runs = rng.integers(10, 200, size=len(d) // 10 + 2)
            mask = np.repeat(np.arange(len(runs)) % 2, runs)[: len(d)]
            mask = np.pad(mask, (0, len(d) - len(mask)))
            mask[-1] = 1
            ids.append(d)
            labels.append(np.where(mask == 1, d, -100))
    ids_col = pa.array(ids, pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": ids_col}), plain, row_group_size=8192)
    lab_col = pa.array(labels, pa.list_(pa.int64()))
    pq.write_table(pa.table({"input_ids": ids_col, "labels": lab_col}), masked, row_group_size=8192)
    return masked, plain


def tokenize(src: Path, out: Path) -> float:
    t0 = time.perf_counter()
    tokenize_corpus([src], out, overwrite=True)
    return time.perf_counter() - t0


def pack(src: Path, out: Path) -> float:
    config = RunConfig(
        inputs=(str(src),),
        out_dir=str(out),
        pack=PackConfig(max_len=MAX_LEN, long_docs="truncate"),
        overwrite=True,
        progress=False,
    )
    t0 = time.perf_counter()
    run_pack(config)
    return time.perf_counter() - t0


def in_process(path: Path) -> float:
    ds = PackedDataset(path, tokens_per_batch=BUDGET, seed=0)
    tokens = 0
    t0 = time.perf_counter()
    for b in ds:
        tokens += int(b["cu_seqlens"][-1])
    return tokens / (time.perf_counter() - t0)


def one_worker(path: Path) -> float:
    ds = PackedDataset(path, tokens_per_batch=BUDGET, seed=0)
    dl = PackedDataLoader(ds, num_workers=1, prefetch_factor=4)
    it = iter(dl)
    next(it)  # start-up is not throughput
    tokens = 0
    t0 = time.perf_counter()
    for b in it:
        tokens += int(b["cu_seqlens"][-1])
    return tokens / (time.perf_counter() - t0)


def verify(path: Path) -> float:
    t0 = time.perf_counter()
    verify_dataset(path)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=20, help="copies of the sample corpus")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved runs, best kept")
    ap.add_argument("--quick", action="store_true", help="3 copies, 2 runs")
    ap.add_argument("--no-readme", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if args.quick:
        args.copies, args.repeat = 3, 2
    load_before = os.getloadavg()[0]
    masked_src, plain_src = inputs(args.copies)
    out = ROOT / "bench_data" / f"mask_{args.copies}"
    best: dict[tuple[str, str], float] = {}

    def keep(key: tuple[str, str], value: float, low: bool) -> None:
        old = best.get(key)
        best[key] = value if old is None else (min(old, value) if low else max(old, value))

    for _ in range(args.repeat):
        for name, src in (("plain", plain_src), ("masked", masked_src)):
            path = out / f"packed_{name}"
            keep((name, "pack"), pack(src, path), low=True)
            tok = out / f"tokenized_{name}.parquet"
            keep((name, "tokenize"), tokenize(src, tok), low=True)
            keep((name, "pack-tok"), pack(tok, out / f"packed_tok_{name}"), low=True)
            keep((name, "verify"), verify(path), low=True)
            keep((name, "in-process"), in_process(path), low=False)
            keep((name, "worker"), one_worker(path), low=False)
    sizes, tokens = {}, {}
    for name in ("plain", "masked"):
        shards = list((out / f"packed_{name}").glob("shard-*.parquet"))
        sizes[name] = sum(p.stat().st_size for p in shards)
        index = json.loads((out / f"packed_{name}" / "index.json").read_text())
        tokens[name] = index["counts"]["tokens_out"]
        if name == "masked":
            supervised = index["counts"]["tokens_supervised"]
    assert tokens["plain"] == tokens["masked"], "the two datasets must hold the same rows"
    n = tokens["plain"]
    rows = [
        [
            "`pack` from pre-tokenized Parquet, wall (s)",
            *(f"{best[(k, 'pack')]:.2f}" for k in ("plain", "masked")),
        ],
        [
            "`tokenize` (ids and mask passed through), wall (s)",
            *(f"{best[(k, 'tokenize')]:.2f}" for k in ("plain", "masked")),
        ],
        [
            "`pack` from tokenized Parquet, wall (s)",
            *(f"{best[(k, 'pack-tok')]:.2f}" for k in ("plain", "masked")),
        ],
        ["shard bytes / token", *(f"{sizes[k] / n:.3f}" for k in ("plain", "masked"))],
        ["`verify` wall (s)", *(f"{best[(k, 'verify')]:.2f}" for k in ("plain", "masked"))],
        [
            "loader in-process (M tokens/s)",
            *(f"{best[(k, 'in-process')] / 1e6:.1f}" for k in ("plain", "masked")),
        ],
        [
            "loader, 1 worker (M tokens/s)",
            *(f"{best[(k, 'worker')] / 1e6:.1f}" for k in ("plain", "masked")),
        ],
    ]
    for r in rows:
        a, b = float(r[1]), float(r[2])
        r.append(f"{b / a:.2f}x" if a else "-")
    table = markdown_table(["", "no mask (baseline)", "with loss_mask", "masked / plain"], rows)
    load_after = os.getloadavg()[0]
    head = (
        f"`python -m benchmarks.bench_mask{' --quick' if args.quick else ''}`: sample_data x"
        f"{args.copies} as byte ids ({n:,} tokens, {supervised / n:.0%} supervised), pre-tokenized"
        f" Parquet packed at max_len {MAX_LEN} with `--long-docs truncate` (same rows with and "
        f"without the mask); best of {args.repeat}, interleaved; {platform.machine()}, "
        f"{os.cpu_count()} cores, load average (1 min) {load_before:.1f} before, "
        f"{load_after:.1f} after."
    )
    body = f"{head}\n\n{table}"
    print(body)
    if not args.no_readme:
        update_block("mask", body)


if __name__ == "__main__":
    main()
