"""Write small packtool datasets by hand (tests, benchmarks): Parquet shards + index.json.

Follows the shard contract of docs/CONTRACTS.md without the packing pipeline, so tests can pin
exact rows and benchmarks can make large synthetic datasets quickly.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq

from packtool.manifest import Manifest, ShardInfo, packed_schema, sha256_file, write_manifest
from packtool.shards import ShardConfig, write_shards


def rows_table(
    tokens: np.ndarray,
    row_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    doc_offsets_offsets: np.ndarray,
    doc_ids: np.ndarray,
    token_type: pa.DataType,
) -> pa.Table:
    """A packed-shard table from flat arrays (the layout `loader.shards.RowGroupData` uses)."""
    n_docs_offsets = doc_offsets_offsets - np.arange(len(doc_offsets_offsets))
    cols = [
        pa.ListArray.from_arrays(pa.array(row_offsets, pa.int32()), pa.array(tokens, token_type)),
        pa.ListArray.from_arrays(
            pa.array(doc_offsets_offsets, pa.int32()), pa.array(doc_offsets, pa.int32())
        ),
        pa.ListArray.from_arrays(
            pa.array(n_docs_offsets, pa.int32()), pa.array(doc_ids, pa.int64())
        ),
        pa.ListArray.from_arrays(
            pa.array(n_docs_offsets, pa.int32()),
            pa.array(np.zeros(len(doc_ids), np.int32), pa.int32()),
        ),
    ]
    return pa.Table.from_arrays(cols, schema=packed_schema(token_type))


def write_dataset(
    path: str | os.PathLike,
    rows: Sequence[Sequence[Sequence[int]]],
    *,
    max_len: int,
    doc_ids: Sequence[Sequence[int]] | None = None,
    rows_per_shard: int = 1000,
    row_group_rows: int = 256,
    token_type: pa.DataType | None = None,
    compression: str | None = "zstd",
) -> Manifest:
    """Write `rows` (each a list of documents, each a list of token ids) as a packtool dataset.

    Document ids default to a running count over all documents, in row order.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    token_type = token_type or pa.uint16()
    next_id = 0
    shards = []
    for s, start in enumerate(range(0, max(len(rows), 1), rows_per_shard)):
        chunk = rows[start : start + rows_per_shard]
        ids_col, off_col, tok_col, chunk_col = [], [], [], []
        for j, row in enumerate(chunk):
            lens = [len(d) for d in row]
            tok_col.append([t for d in row for t in d])
            off_col.append(np.concatenate([[0], np.cumsum(lens)]).astype(int).tolist())
            if doc_ids is None:
                ids_col.append(list(range(next_id, next_id + len(row))))
                next_id += len(row)
            else:
                ids_col.append(list(doc_ids[start + j]))
            chunk_col.append([0] * len(row))
        table = pa.table(
            {
                "input_ids": tok_col,
                "doc_offsets": off_col,
                "doc_ids": ids_col,
                "doc_chunks": chunk_col,
            },
            schema=packed_schema(token_type),
        )
        shards.append(_write_shard(path, s, table, row_group_rows, compression))
    return _finish(path, shards, max_len=max_len)


def write_random_dataset(
    path: str | os.PathLike,
    *,
    n_rows: int,
    max_len: int,
    seed: int = 0,
    mean_doc: float = 200.0,
    fill: float = 0.98,
    vocab: int = 50_000,
    rows_per_shard: int = 1000,
    row_group_rows: int = 256,
    compression: str | None = "zstd",
    shard_config: ShardConfig | None = None,
) -> Manifest:
    """A synthetic dataset: rows about `fill` full of documents with geometric-ish lengths.

    Vectorised, so it makes gigabytes in seconds (benchmarks); document ids are sequential.
    With `shard_config`, shards are written by `packtool.shards.write_shards` exactly as
    `packtool pack` writes them (its rows per shard, row group size and codec replace
    `rows_per_shard`, `row_group_rows` and `compression`).
    """
    if shard_config is not None:
        rows_per_shard = shard_config.shard_rows
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    token_type = pa.uint16() if vocab <= 65_536 else pa.uint32()
    shards = []
    next_id = 0
    for s, start in enumerate(range(0, n_rows, rows_per_shard)):
        n = min(rows_per_shard, n_rows - start)
        row_lens = np.clip(
            rng.normal(fill * max_len, 0.02 * max_len, n).astype(np.int64), 1, max_len
        )
        # Documents per row: cut each row at random points (expected length mean_doc).
        offs, off_off = [], [0]
        for length in row_lens.tolist():
            k = max(int(length / mean_doc), 1)
            cuts = (
                np.unique(rng.integers(1, length, size=k - 1))
                if length > 1 and k > 1
                else np.zeros(0, np.int64)
            )
            o = np.concatenate([[0], cuts, [length]])
            offs.append(o)
            off_off.append(off_off[-1] + len(o))
        doc_offsets = np.concatenate(offs).astype(np.int32)
        n_docs = len(doc_offsets) - n
        row_offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(row_lens, out=row_offsets[1:])
        dtype = np.uint16 if vocab <= 65_536 else np.uint32
        tokens = rng.integers(0, vocab, size=int(row_offsets[-1]), dtype=dtype)
        table = rows_table(
            tokens,
            row_offsets,
            doc_offsets,
            np.asarray(off_off, dtype=np.int64),
            np.arange(next_id, next_id + n_docs, dtype=np.int64),
            token_type,
        )
        next_id += n_docs
        if shard_config is not None:
            shards += write_shards(path, table, s, shard_config)
        else:
            shards.append(_write_shard(path, s, table, row_group_rows, compression))
    return _finish(path, shards, max_len=max_len)


def _write_shard(
    path: Path, index: int, table: pa.Table, row_group_rows: int, compression: str | None
) -> ShardInfo:
    name = f"shard-{index:05d}.parquet"
    file = path / name
    pq.write_table(table, file, row_group_size=row_group_rows, compression=compression)
    tokens = int(
        pa.compute.sum(pa.compute.list_value_length(table.column("input_ids"))).as_py() or 0
    )
    return ShardInfo(
        file=name,
        rows=table.num_rows,
        tokens=tokens,
        bytes=file.stat().st_size,
        sha256=sha256_file(file),
    )


def _finish(path: Path, shards: list[ShardInfo], *, max_len: int) -> Manifest:
    rows = sum(s.rows for s in shards)
    tokens = sum(s.tokens for s in shards)
    manifest = Manifest(
        tokenizer={
            "kind": "test",
            "name": "test",
            "vocab_size": 65536,
            "eos_id": 0,
            "bos_id": None,
            "sha256": "",
        },
        max_len=max_len,
        algorithm="ffd",  # the manifest check accepts only real algorithms
        seed=0,
        rounds=1,
        long_docs="split",
        counts={"rows": rows, "tokens_out": tokens},
        efficiency=tokens / max(rows * max_len, 1),
        lower_bound_rows=-(-tokens // max_len),
        shards=tuple(shards),
        command="loader.testing",
    )
    write_manifest(path, manifest)
    return manifest
