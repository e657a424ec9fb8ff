"""The Ray engine's overhead on a real two-node Ray cluster on this machine (#13).

    python -m benchmarks.bench_ray [--repeat 3] [--quick]

A `ray.cluster_utils.Cluster` of two nodes with 1 CPU each (the test suite's cluster), then
`run_pack_ray` on two corpora, each against the local engine (`--workers 2`) on the same
options, checking the bytes are the same:

- sample_data/corpus.jsonl (3.0 MB, byte tokenizer, max_len 2048, 6 partitions of 600 kB);
- the Ray tests' generated corpus (tests/packtool/scale_corpus.py: 1,000 tiny JSONL files,
  byte ranges of a big one, .zst, Parquet, bad lines; max_len 1024, 150 kB partitions).

*first* is the first Ray run in the session (the pool's worker processes start and load the
tokenizer and numba kernels); *then* the best of `--repeat` later runs. Wall time in this
process, the cluster start (~5 s) excluded. Writes the docs/benchmarks.md block `ray`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import ROOT, markdown_table, update_block


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="no docs/benchmarks.md update")
    args = ap.parse_args()

    import ray
    from ray.cluster_utils import Cluster

    from packtool.dataset.shards import ShardConfig
    from packtool.engines.local import RunConfig, run_pack
    from packtool.engines.ray import RayConfig, run_pack_ray
    from packtool.pack.chunk import PackConfig
    from tests.packtool.scale_corpus import make_corpus

    before = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-ray-"))
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False}
    )
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    make_corpus(tmp / "gen", big_bytes=600_000)
    corpora = {
        "sample_data (3.0 MB)": ((ROOT / "sample_data" / "corpus.jsonl",), 2048, 600_000, 400),
        "1,000-file test corpus": ((tmp / "gen",), 1024, 150_000, 500),
    }
    rows = []
    try:
        for name, (inputs, max_len, size, chunk) in corpora.items():

            def cfg(
                out: Path, workers: int | None = None, inputs=inputs, m=max_len, s=size, c=chunk
            ):
                return RunConfig(
                    inputs=tuple(str(p) for p in inputs),
                    out_dir=str(out),
                    pack=PackConfig(max_len=m),
                    shards=ShardConfig(shard_rows=100),
                    partition_size=s,
                    chunk_docs=c,
                    workers=workers,
                    progress=False,
                )

            t0 = time.perf_counter()
            local = run_pack(cfg(tmp / "local", workers=2))
            local_s = time.perf_counter() - t0
            times = []
            for i in range(1 + args.repeat):
                out = tmp / f"ray{i}"
                t0 = time.perf_counter()
                run_pack_ray(cfg(out), RayConfig())
                times.append(time.perf_counter() - t0)
                same = {p.name: p.read_bytes() for p in out.glob("shard-*")} == {
                    p.name: p.read_bytes() for p in (tmp / "local").glob("shard-*")
                }
                assert same, f"{name}: the Ray engine's shards differ from the local engine's"
                shutil.rmtree(out)
            shutil.rmtree(tmp / "local")
            row = [name, local.partitions, f"{local_s:.2f}", f"{times[0]:.2f}"]
            row += [f"{min(times[1:]):.2f}"]
            print(" | ".join(map(str, row)), file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    after = os.getloadavg()[0]
    import packtool.engines.ray as engine

    how = (engine.__doc__ or "").strip().splitlines()[0]
    head = ["corpus", "partitions", "local, 2 workers (s)", "Ray, first (s)", "Ray, then (s)"]
    body = f"""`python -m benchmarks.bench_ray --repeat {args.repeat}` ({time.strftime("%Y-%m-%d")}; 2-core box shared with other work, load average (1 min) {before:.1f} before, {after:.1f} after). {how} On a two-node `ray.cluster_utils.Cluster` (1 CPU each), wall time of a whole run, same bytes as the local engine:

{markdown_table(head, rows)}
"""
    print(body)
    if not args.quick:
        update_block("ray", body)


if __name__ == "__main__":
    main()
