"""Shard layout: which Parquet codec and row-group size load fastest.

Packs sample_data (byte tokenizer, repeated to ~11 M tokens, max_len 4096) once, writes the same
rows with each codec and row-group size, then measures what the loader does: decode every row
group into flat numpy arrays (throughput), and open a file + fetch one random row group
(latency). Writes the table into docs/benchmarks.md block `shards`.

    python -m benchmarks.bench_shards
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks._common import ROOT, markdown_table, update_block
from packtool.dataset.shards import ShardConfig, write_shards
from packtool.pack.chunk import PackConfig, pack_table
from packtool.read.documents import ReadConfig
from packtool.tokenize.tokenize import tokenized_batches

REPEAT = 4
MAX_LEN = 4096


def packed_rows() -> pa.Table:
    tables = list(
        tokenized_batches([str(ROOT / "sample_data" / "corpus.jsonl")], read_config=ReadConfig())
    )
    table = pa.concat_tables(tables * REPEAT).combine_chunks()
    return pack_table(table, PackConfig(max_len=MAX_LEN)).table


def decode_all(path: Path) -> int:
    pf = pq.ParquetFile(pa.memory_map(str(path)))
    tokens = 0
    for rg in range(pf.num_row_groups):
        col = pf.read_row_group(rg, columns=["input_ids", "doc_offsets"]).column(0).combine_chunks()
        tokens += len(col.values.to_numpy())
    return tokens


def one_row_group(path: Path, rng: np.random.Generator) -> None:
    pf = pq.ParquetFile(pa.memory_map(str(path)))
    rg = int(rng.integers(pf.num_row_groups))
    pf.read_row_group(rg).column(0).combine_chunks().values.to_numpy()


def main() -> None:
    table = packed_rows()
    tokens = sum(len(x) for x in table.column("input_ids").to_numpy(zero_copy_only=False))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for codec in ("none", "snappy", "lz4", "zstd"):
            for rg_rows in (64, 256, 1024):
                d = Path(tmp) / f"{codec}-{rg_rows}"
                d.mkdir()
                cfg = ShardConfig(
                    shard_rows=table.num_rows, row_group_rows=rg_rows, compression=codec
                )
                t0 = time.perf_counter()
                (info,) = write_shards(d, table, 0, cfg)
                write_s = time.perf_counter() - t0
                path = d / info.file
                decode_all(path)  # warm the page cache: the loader reads from it too
                best = min(_timed(lambda p=path: decode_all(p)) for _ in range(3))
                rng = np.random.default_rng(0)
                lat = sorted(_timed(lambda p=path, r=rng: one_row_group(p, r)) for _ in range(50))
                rows.append(
                    [
                        codec,
                        rg_rows,
                        f"{info.bytes / 2**20:.1f}",
                        f"{info.bytes / tokens:.2f}",
                        f"{tokens / write_s / 1e6:.0f}",
                        f"{tokens / best / 1e6:.0f}",
                        f"{lat[len(lat) // 2] * 1e3:.2f}",
                    ]
                )
                print(*rows[-1], sep="\t", flush=True)
    headers = [
        "codec",
        "rows/row group",
        "MiB",
        "bytes/token",
        "write M tok/s",
        "decode M tok/s",
        "1 row group ms (p50)",
    ]
    body = markdown_table(headers, rows)
    note = (
        f"Shard layout, measured by `python -m benchmarks.bench_shards` on {tokens / 1e6:.1f} M "
        f"byte-level tokens of sample_data x{REPEAT} packed at max_len {MAX_LEN} "
        "(one core, page cache warm):"
    )
    print(body)
    update_block("shards", note + "\n\n" + body)


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


if __name__ == "__main__":
    main()
