"""Opening a dataset of many shards in a bucket: `PackedDataset("s3://...")`, cold and warm.

Run from the repository root: `python -m benchmarks.bench_bucket_open [--copies 8]
[--max-len 1024] [--latency-ms 50]` (a few minutes; needs the dev extras: moto's server, s3fs).

`--copies` copies of sample_data/corpus.jsonl are packed with `--max-len 1024 --shard-rows 64
--row-group-rows 32` (8 copies: ~350 shards) into `s3://benchopen/ds` on moto's S3 server over
loopback, a process of its own. Then `PackedDataset(url, rows_per_batch=2, cache_dir=EMPTY)` is
timed: cold (an empty cache: the open reads `index.json`, the version's, and every shard's
footer, a ranged GET each on the 4 fetch threads) and warm (the cache the cold open filled:
the footers come from it), directly on the server and through the tests' proxy
(tests/packtool/storage/faulty_proxy.py), which holds every request `--latency-ms` (a store's
round trip over a real network, which moto's sub-millisecond loopback answers hide). Best of
`--repeat`, the range beside it. This is the figure docs/remote.md quotes for the open
("Row groups by range").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import ROOT, markdown_table, publish
from benchmarks.bench_remote import _proxy, _server

CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def _pack(url: str, copies: int, max_len: int, folder: Path) -> None:
    """`copies` copies of the sample corpus packed into `url` in shards of 64 rows."""
    inputs = []
    for i in range(copies):
        inputs.append(folder / f"corpus-{i}.jsonl")
        shutil.copyfile(CORPUS, inputs[-1])
    cmd = [sys.executable, "-m", "packtool.cli", "pack", *map(str, inputs), "-o", url]
    cmd += ["--max-len", str(max_len), "--shard-rows", "64", "--row-group-rows", "32"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {done.stderr.strip()[-400:]}")


def _opens(url: str, repeat: int) -> tuple[list[float], list[float], int]:
    """Seconds of `repeat` cold opens (each with an empty cache) and of the warm open after
    each, and the shards opened."""
    from loader import PackedDataset

    cold, warm, shards = [], [], 0
    for _ in range(repeat):
        cache = Path(tempfile.mkdtemp(prefix="packtool-bench-cache-"))
        try:
            for times in (cold, warm):
                t0 = time.perf_counter()
                ds = PackedDataset(url, rows_per_batch=2, cache_dir=str(cache))
                times.append(time.perf_counter() - t0)
                shards = len(ds.store.manifest.shards)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    return cold, warm, shards


def _seconds(times: list[float]) -> str:
    low, high = min(times), max(times)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f} ({low:.2f}-{high:.2f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=8, help="copies of the sample corpus packed")
    ap.add_argument("--max-len", type=int, default=1024, help="pack's --max-len")
    ap.add_argument("--latency-ms", type=float, default=50, help="held per request (proxy)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    if min(args.copies, args.repeat, args.max_len) < 1 or not args.latency_ms > 0:
        ap.error("--copies, --repeat and --max-len must be >= 1, --latency-ms > 0")
    load_before = os.getloadavg()[0]
    server, endpoint = _server()
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
        AWS_DEFAULT_REGION="us-east-1",
    )  # fmt: skip
    url = "s3://benchopen/ds"
    folder = Path(tempfile.mkdtemp(prefix="packtool-bench-open-"))
    proxy = None
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket="benchopen")
        _pack(url, args.copies, args.max_len, folder)
        _opens(url, 1)  # untimed: the imports and the client's first connections
        direct = _opens(url, args.repeat)
        proxy, os.environ["AWS_ENDPOINT_URL"] = _proxy(endpoint, args.latency_ms)
        held = _opens(url, args.repeat)
    finally:
        if proxy is not None:
            proxy.terminate()
            proxy.wait()
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)
    shards, load_after = held[2], os.getloadavg()[0]
    rows = [
        [f"moto over loopback, {name}", _seconds(times)]
        for name, times in (("cold", direct[0]), ("warm", direct[1]))
    ]
    rows += [
        [f"every request held {args.latency_ms:g} ms, {name}", _seconds(times)]
        for name, times in (("cold", held[0]), ("warm", held[1]))
    ]
    table = markdown_table([f"open of {shards} shards", "seconds (best (range))"], rows)
    body = (
        f"Opening a dataset in a bucket (`python -m benchmarks.bench_bucket_open --copies "
        f"{args.copies} --max-len {args.max_len} --latency-ms {args.latency_ms:g}`, {time.strftime('%Y-%m-%d')}, best "
        f"of {args.repeat}, the range in brackets; load average (1 min) {load_before:.1f} before, "
        f"{load_after:.1f} after, on this box's 2 cores): `PackedDataset(url, rows_per_batch=2, "
        f"cache_dir=EMPTY)` over {shards} shards ({args.copies} copies of "
        f"sample_data/corpus.jsonl packed with `--max-len {args.max_len} --shard-rows 64 "
        "--row-group-rows 32`) on moto's "
        "S3 server (a process of its own, over loopback), directly and through the tests' "
        f"proxy holding every request {args.latency_ms:g} ms. A cold open reads index.json, "
        "the version's, and each shard's footer (a ranged GET, on the 4 fetch threads, read in "
        "manifest order); a warm one finds the footers in the node's cache and downloads only "
        f"the two index files. Cold through the proxy: **{min(held[0]):.2f} s** "
        f"({min(held[0]) / shards * 1000:.1f} ms a shard).\n\n{table}"
    )
    publish("bucket-open", body, docs=not args.no_docs)


if __name__ == "__main__":
    main()
