"""What the stored `seq_lengths` column costs `packtool pack`: shard bytes and pack + write time.

Baseline: the same rows packed with the declaration as it was before `seq_lengths` (the
declaration is read at call time, packtool/dataset/columns.py), in the same run, interleaved, best of N.
Three corpora: sample_data with the byte tokenizer (long documents, ~700 tokens each), and
synthetic tokenized documents of about 400 and 60 tokens (BPE-sized web text and SFT-sized
turns: the column costs ~4 bytes a document before compression, so short documents pay most).
Each is one chunk through `pack_table` + `write_shards` (default lz4, and zstd). Writes the table
into docs/benchmarks.md block `seq-lengths`.

    python -m benchmarks.bench_seq_lengths [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from benchmarks._common import ROOT, markdown_table, update_block
from packtool.dataset import columns as shard_columns
from packtool.dataset.shards import ShardConfig, write_shards
from packtool.pack.chunk import PackConfig, pack_table
from packtool.read.documents import ReadConfig
from packtool.tokenize.tokenize import tokenized_batches

MAX_LEN = 4096


@contextlib.contextmanager
def declaration(with_seq_lengths: bool) -> Iterator[None]:
    saved = shard_columns.SHARD_COLUMNS
    if not with_seq_lengths:
        shard_columns.SHARD_COLUMNS = tuple(c for c in saved if c.name != shard_columns.SEQ_LENGTHS)
    try:
        yield
    finally:
        shard_columns.SHARD_COLUMNS = saved


def sample_table(repeat: int) -> pa.Table:
    tables = list(
        tokenized_batches([str(ROOT / "sample_data" / "corpus.jsonl")], read_config=ReadConfig())
    )
    return pa.concat_tables(tables * repeat).combine_chunks()


def synthetic_table(n_docs: int, mean: float, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.geometric(1 / mean, n_docs), 1, MAX_LEN).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = rng.integers(0, 50_000, int(offsets[-1]), dtype=np.uint16)
    return pa.table(
        {
            "doc_id": pa.array(np.arange(n_docs), pa.int64()),
            "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)),
            "length": pa.array(lengths.astype(np.int32)),
        }
    )


def pack_and_write(table: pa.Table, out: Path, codec: str) -> tuple[float, int]:
    for p in out.glob("*.parquet"):
        p.unlink()
    t0 = time.perf_counter()
    packed = pack_table(table, PackConfig(max_len=MAX_LEN)).table
    infos = write_shards(out, packed, 0, ShardConfig(compression=codec))
    return time.perf_counter() - t0, sum(i.bytes for i in infos)


def measure(name: str, table: pa.Table, repeat: int, tmp: Path) -> list[list[str]]:
    docs = table.num_rows
    tokens = int(table.column("input_ids").combine_chunks().offsets[-1].as_py())
    with declaration(False):
        bare = pack_table(table, PackConfig(max_len=MAX_LEN)).table
    # The column's own cost, free of the write's noise: computing it for the packed chunk.
    derive_ms = 1e3 * min(
        _seconds(lambda: shard_columns.with_derived(bare)) for _ in range(max(repeat, 3))
    )
    rows = []
    for codec in ("lz4", "zstd"):
        best = {False: float("inf"), True: float("inf")}
        size = {}
        for _ in range(repeat):  # interleaved: both see the same load
            for stored in (False, True):
                out = tmp / f"{len(rows)}-{codec}-{stored}"
                out.mkdir(exist_ok=True)
                with declaration(stored):
                    seconds, size[stored] = pack_and_write(table, out, codec)
                best[stored] = min(best[stored], seconds)
        extra = size[True] - size[False]
        rows.append(
            [
                name,
                f"{docs:,}",
                f"{tokens / docs:.0f}",
                codec,
                f"{size[False] / tokens:.3f}",
                f"{size[True] / tokens:.3f}",
                f"{extra / tokens:.4f} ({extra / size[False]:.2%})",
                f"{extra / docs:.2f}",
                f"{best[False]:.3f}",
                f"{best[True]:.3f}",
                f"{best[True] / best[False]:.3f}",
                f"{derive_ms:.1f}",
            ]
        )
        print(*rows[-1], sep="\t", flush=True)
    return rows


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller corpora, fewer repeats")
    args = parser.parse_args()
    scale, repeat = (1, 2) if args.quick else (4, 5)
    corpora = [
        (f"sample_data x{scale} (byte)", sample_table(scale)),
        ("synthetic ~400 tok/doc", synthetic_table(25_000 * scale, 400)),
        ("synthetic ~60 tok/doc", synthetic_table(100_000 * scale, 60)),
    ]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, table in corpora:
            pack_and_write(table, Path(tmp), "lz4")  # warm the kernels (numba) and the caches
            rows += measure(name, table, repeat, Path(tmp))
    headers = [
        "corpus",
        "documents",
        "tokens/doc",
        "codec",
        "bytes/token before",
        "with seq_lengths",
        "extra bytes/token",
        "extra bytes/doc",
        "pack+write s before",
        "with",
        "ratio",
        "computing it ms",
    ]
    body = markdown_table(headers, rows)
    note = (
        "What the stored `seq_lengths` column costs, measured by "
        f"`python -m benchmarks.bench_seq_lengths{' --quick' if args.quick else ''}` "
        f"(one chunk, max_len {MAX_LEN}, pack_table + write_shards, best of {repeat} "
        "interleaved with the declaration without it; the last column times computing the "
        "column alone, `columns.with_derived`, for the packed chunk). Pack + write times move "
        "by several percent run to run on the shared box; the column's own cost is the last "
        "column:"
    )
    print(body)
    update_block("seq-lengths", note + "\n\n" + body)


if __name__ == "__main__":
    main()
