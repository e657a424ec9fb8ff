"""Write small packtool datasets by hand (tests, benchmarks): Parquet shards + index.json.

Follows the shard contract of docs/CONTRACTS.md without the packing pipeline, so tests can pin
exact rows and benchmarks can make large synthetic datasets quickly.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

from loader.store.row_index import GroupStats, RowIndex, group_stats
from packtool.dataset import columns as shard_columns
from packtool.dataset.columns import names, required
from packtool.dataset.manifest import (
    FORMAT_VERSION,
    Manifest,
    ShardInfo,
    packed_schema,
    sha256_file,
    write_manifest,
)
from packtool.dataset.shards import ShardConfig, write_shards
from packtool.storage import local as storage
from packtool.storage import writing


def rows_table(
    tokens: np.ndarray,
    row_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    doc_offsets_offsets: np.ndarray,
    doc_ids: np.ndarray,
    token_type: pa.DataType,
    columns: dict[str, np.ndarray] | None = None,
) -> pa.Table:
    """A packed-shard table from flat arrays (the layout `loader.store.row_group.RowGroupData` uses).

    `columns`: optional declared columns' flat values (per-token ones as long as `tokens`).
    """
    n_docs_offsets = doc_offsets_offsets - np.arange(len(doc_offsets_offsets))
    data = {
        "input_ids": pa.ListArray.from_arrays(
            pa.array(row_offsets, pa.int32()), pa.array(tokens, token_type)
        ),
        "doc_offsets": pa.ListArray.from_arrays(
            pa.array(doc_offsets_offsets, pa.int32()), pa.array(doc_offsets, pa.int32())
        ),
        "doc_ids": pa.ListArray.from_arrays(
            pa.array(n_docs_offsets, pa.int32()), pa.array(doc_ids, pa.int64())
        ),
        "doc_chunks": pa.ListArray.from_arrays(
            pa.array(n_docs_offsets, pa.int32()),
            pa.array(np.zeros(len(doc_ids), np.int32), pa.int32()),
        ),
    }
    for name, values in (columns or {}).items():
        c = shard_columns.get(name)
        offsets = row_offsets if c.level == shard_columns.TOKEN else n_docs_offsets
        data[name] = c.array(offsets, values, token_type)
    schema = packed_schema(token_type, tuple(data))
    return pa.Table.from_arrays([data[n] for n in schema.names], schema=schema)


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
    loss_masks: Sequence[Sequence[Sequence[int]]] | None = None,
    columns: Mapping[str, Sequence[Sequence[Any]]] | None = None,
    format_version: int = FORMAT_VERSION,
    derived: bool = False,
) -> Manifest:
    """Write `rows` (each a list of documents, each a list of token ids) as a packtool dataset.

    Document ids default to a running count over all documents, in row order. `loss_masks`
    (shaped like `rows`: 0/1 per token) adds a `loss_mask` column; `columns` adds any declared
    optional column by name (a per-token one shaped like `rows`, a per-document one as one value
    per document of each row). `format_version=1` writes the manifest as packtool wrote it
    before optional columns (no `columns` list). `derived=True` also writes the derived columns
    (`seq_lengths`) as `packtool pack` does; without it the dataset is shaped like one packed
    before they were declared.
    """
    columns = dict(columns or {})
    if loss_masks is not None:
        columns["loss_mask"] = loss_masks
    if (columns or derived) and format_version < 2:
        raise ValueError("format 1 has no optional columns")
    path = Path(path)
    writing.make_dirs(path)
    token_type = token_type or pa.uint16()
    next_id = 0
    shards = []
    for s, start in enumerate(range(0, max(len(rows), 1), rows_per_shard)):
        chunk = rows[start : start + rows_per_shard]
        ids_col, off_col, tok_col, chunk_col = [], [], [], []
        extra: dict[str, list] = {name: [] for name in columns}
        for j, row in enumerate(chunk):
            lens = [len(d) for d in row]
            tok_col.append([t for d in row for t in d])
            for name, values in columns.items():
                c = shard_columns.get(name)
                given = values[start + j]
                if c.level == shard_columns.TOKEN:
                    flat = [v for d in given for v in d]
                    stored = c.storage == shard_columns.BYTES
                    given = np.asarray(flat, c.numpy_dtype()).tobytes() if stored else flat
                extra[name].append(given)
            off_col.append(np.concatenate([[0], np.cumsum(lens)]).astype(int).tolist())
            if doc_ids is None:
                ids_col.append(list(range(next_id, next_id + len(row))))
                next_id += len(row)
            else:
                ids_col.append(list(doc_ids[start + j]))
            chunk_col.append([0] * len(row))
        data = {
            "input_ids": tok_col,
            "doc_offsets": off_col,
            "doc_ids": ids_col,
            "doc_chunks": chunk_col,
        }
        data.update(extra)
        table = pa.table(data, schema=packed_schema(token_type, tuple(data)))
        if derived:
            table = shard_columns.with_derived(table)
        shards.append(_write_shard(path, s, table, row_group_rows, compression))
    in_order = names(shard_columns.resolve(table.column_names))
    return _finish(path, shards, max_len=max_len, columns=in_order, format_version=format_version)


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
    With `shard_config`, shards are written by `packtool.dataset.shards.write_shards` exactly as
    `packtool pack` writes them (its rows per shard, row group size and codec replace
    `rows_per_shard`, `row_group_rows` and `compression`).
    """
    if shard_config is not None:
        rows_per_shard = shard_config.shard_rows
    path = Path(path)
    writing.make_dirs(path)
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
    writing.write_parquet(table, file, row_group_size=row_group_rows, compression=compression)
    tokens = int(
        pa.compute.sum(pa.compute.list_value_length(table.column("input_ids"))).as_py() or 0
    )
    return ShardInfo(
        file=name,
        rows=table.num_rows,
        tokens=tokens,
        bytes=storage.size(file),
        sha256=sha256_file(file),
    )


def _finish(
    path: Path,
    shards: list[ShardInfo],
    *,
    max_len: int,
    columns: tuple[str, ...] | None = None,
    format_version: int = FORMAT_VERSION,
) -> Manifest:
    rows = sum(s.rows for s in shards)
    tokens = sum(s.tokens for s in shards)
    manifest = Manifest(
        tokenizer={
            "kind": "test",
            "name": "test",
            "vocab_size": 65536,
            "eos_id": None,  # these ids end in no EOS (verify: audit/piece_ends.py)
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
        columns=columns or names(required()),
        format_version=format_version,
    )
    write_manifest(path, manifest)
    return manifest


def synthetic_index(
    n_rows: int,
    *,
    group_rows: int = 256,
    max_len: int = 4096,
    seed: int = 0,
    cache_bytes: int = 32 << 20,
) -> RowIndex:
    """A `RowIndex` over `n_rows` rows with no shards behind it (order and plan at any scale).

    Rows come in row groups of `group_rows` (the last one shorter); a row group's counts are
    generated from `(seed, group)` when first asked for: lengths uniform in `max_len/2 ..
    max_len`, 1 to 15 documents a row. Nothing per row is stored beyond the index's cache.
    """
    starts = np.minimum(np.arange(0, n_rows + group_rows, group_rows, dtype=np.int64), n_rows)
    if len(starts) > 1 and starts[-2] == n_rows:
        starts = starts[:-1]

    def read(g: int) -> GroupStats:
        rng = np.random.default_rng((seed, g))
        n = int(starts[g + 1] - starts[g])
        lengths = rng.integers(max(max_len // 2, 1), max_len + 1, size=n)
        n_docs = rng.integers(1, 16, size=n)
        return group_stats(lengths, n_docs, lengths.astype(np.float64) ** 2 / n_docs)

    return RowIndex(starts, read, cache_bytes=cache_bytes)


_NOT_FOLLOWED = (
    type,
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    types.ModuleType,
)


def held_bytes(*objects: object) -> int:
    """Bytes held by `objects` and everything reachable from them through attributes and
    containers: numpy arrays by `nbytes` (a view by its base), other objects by
    `sys.getsizeof`, each counted once. Functions and modules are not followed."""
    seen: set[int] = set()
    todo = list(objects)
    total = 0
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, _NOT_FOLLOWED):
            continue
        seen.add(id(obj))
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            if base is not obj:
                todo.append(base)
                continue
            total += obj.nbytes + sys.getsizeof(np.empty(0))
            continue
        total += sys.getsizeof(obj)
        if isinstance(obj, dict):
            todo += list(obj.keys()) + list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += list(obj)
        if hasattr(obj, "__dict__"):
            todo.append(vars(obj))
        for slot in getattr(type(obj), "__slots__", ()):
            if hasattr(obj, slot):
                todo.append(getattr(obj, slot))
    return total
