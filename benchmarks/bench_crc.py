"""The range cache's CRC32s: zlib's against python-isal's (ISA-L), the one the cache uses.

Run: `python -m benchmarks.bench_crc [--epochs N] [--mb 180] [--no-docs]` (writes its block
into docs/benchmarks.md, "Range cache checksums", unless `--no-docs`).

Every cached range of a bucket dataset ends with a CRC32 of each 16 KiB block
(packtool/storage/cache_format.py), computed at download and checked at every read. Both
libraries compute the same values (zlib's polynomial); this prints their speed on 16 KiB blocks
of random bytes and the trailer of a 64 MiB range as the cache computes it (best of 5). With
`--epochs N`: N warm epochs of `benchmarks.bench_bucket_loader`'s kind (2 ranks x 2 workers,
`tokens_per_batch=65_536`, the bench corpus packed into moto's S3 server, one cold epoch first
to fill the cache) alternating with isal and without it (hidden from the subprocess), wall and
CPU seconds of each subprocess with its workers.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path

from benchmarks import real_corpus
from benchmarks._common import ROOT, best_of, markdown_table, publish

BLOCK = 16 << 10

EPOCH = """
import time, resource
from loader import PackedDataLoader, PackedDataset
from packtool.storage import cache_format
t0 = time.perf_counter()
tokens = 0
for rank in range(2):
    ds = PackedDataset({url!r}, tokens_per_batch=65_536, rank=rank, world_size=2, seed=1,
                       cache_dir={cache!r})
    for b in PackedDataLoader(ds, num_workers=2):
        tokens += b["input_ids"].numel()
wall = time.perf_counter() - t0
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
print(cache_format._crc32.__module__, tokens, wall, cpu)
"""


def _speeds() -> list[list[object]]:
    from packtool.storage import cache_format

    data = os.urandom(64 << 20)
    view = memoryview(data)
    crcs = {"zlib": zlib.crc32}
    try:
        from isal.isal_zlib import crc32

        crcs["isal"] = crc32
    except ImportError:
        pass
    rows = []
    for name, fn in crcs.items():
        t = best_of(lambda fn=fn: [fn(view[i : i + BLOCK]) for i in range(0, len(view), BLOCK)], 5)
        rows.append([f"{name}.crc32, 16 KiB blocks", f"{len(data) / t / 1e9:.2f}"])
    t = best_of(lambda: cache_format.trailer(view), 5)
    used = cache_format._crc32.__module__
    rows.append([f"cache_format.trailer (with {used}), 64 MiB", f"{len(data) / t / 1e9:.2f}"])
    return rows


def _epochs(n: int, mb: int) -> list[list[object]]:
    import boto3

    from benchmarks.bench_remote import _server
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    corpus = ROOT / "bench_data" / f"real_corpus_{mb}mb.jsonl"
    real_corpus.build(corpus, mb * 1_000_000)
    server, endpoint = _server()
    env = dict(os.environ, AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="bench",
               AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    hidden = Path(tempfile.mkdtemp(prefix="packtool-bench-noisal-"))
    (hidden / "isal").mkdir()
    (hidden / "isal" / "__init__.py").write_text("raise ImportError('hidden by bench_crc')\n")
    cache = tempfile.mkdtemp(prefix="packtool-bench-cache-")
    try:
        os.environ.update(env)
        boto3.client("s3").create_bucket(Bucket="benchcrc")
        url = "s3://benchcrc/ds"
        run_pack(RunConfig(inputs=(str(corpus),), out_dir=url, pack=PackConfig(max_len=4096),
                           overwrite=True, progress=False))  # fmt: skip
        code = EPOCH.format(url=url, cache=cache)

        def epoch(extra: dict[str, str]) -> list[str]:
            out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**env, **extra},
                                 capture_output=True, text=True, check=True)  # fmt: skip
            return out.stdout.split()

        epoch({})  # cold: fills the cache
        got: dict[str, list[tuple[float, float]]] = {}
        tokens = set()
        for _ in range(n):
            for extra in ({}, {"PYTHONPATH": str(hidden)}):
                name, n_tokens, wall, cpu = epoch(extra)
                tokens.add(n_tokens)
                got.setdefault(name, []).append((float(wall), float(cpu)))
        if len(tokens) != 1:
            raise SystemExit(f"the epochs delivered different token counts: {tokens}")
    finally:
        server.terminate()
        server.wait()
    rows = []
    for name, runs in got.items():
        walls = " / ".join(f"{w:.2f}" for w, _ in runs)
        cpus = " / ".join(f"{c:.2f}" for _, c in runs)
        rows.append([f"warm epoch, {mb} MB, CRC32 by {name}: wall s", walls])
        rows.append([f"warm epoch, {mb} MB, CRC32 by {name}: CPU s", cpus])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=0, help="warm epochs with and without isal")
    ap.add_argument("--mb", type=int, default=180, help="MB of real text for --epochs")
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    rows = _speeds()
    if args.epochs:
        rows += _epochs(args.epochs, args.mb)
    head = (
        f"The range cache's CRC32s (`python -m benchmarks.bench_crc"
        f"{f' --epochs {args.epochs}' if args.epochs else ''}`, {time.strftime('%Y-%m-%d')}, "
        f"{os.cpu_count()} cores): GB/s on 64 MiB of random bytes, best of 5; the warm epochs "
        "alternate with isal and without it (hidden from the subprocess), in run order."
    )
    publish("crc", head + "\n\n" + markdown_table(["what", "GB/s, or seconds"], rows),
            docs=not args.no_docs)  # fmt: skip


if __name__ == "__main__":
    main()
