"""Tails: the under-filled rows a chunk sets aside, so that chunk and partition ends cost no rows.

FFD on one chunk fills almost every row; only the last few rows it opens (filled with whatever
small documents were left) stay part-empty. Packing a corpus in many chunks, each alone, would
pay those rows once per chunk. Instead `pack.pack_table(..., tail=TailPolicy())` keeps the
well-filled rows and returns the pieces of the least-filled ones as a *tail*: a tokenized table
of pieces (each at most `max_len` tokens, with its `doc_chunk`), which the next chunk packs
again with its own documents (`carry=`). A partition's last tail goes to the run's tail tree
(packtool/engines/merge.py): merge nodes of at most F children (64) pack their children's tails
together and set aside their own least-filled rows, with this same policy, for the level above;
the root keeps none. So what is lost is about one chunk's worth of part-empty rows for the
whole corpus, not one per chunk or per partition.

Bounds (they keep every merge node small: at most F x max_rows x max_len tokens in, whatever
the number of partitions):

- at most `rows_per_group` rows per group and `max_rows` rows in all, least-filled first (ties:
  the earlier row), and only rows with at least `min_free` free slots;
- no rows of groups that can receive no more documents (`open_groups`): with `--group-by
  source`, a file read to its end is closed, so many small files do not pile up in the tails.

Pure, like packtool/pack/chunk.py: arrays and tables in, tables out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.arrow_numpy import from_numpy
from packtool.dataset import columns as shard_columns
from packtool.dataset.tokenized import DOC_CHUNK
from packtool.errors import ConfigError
from packtool.pack import kernels
from packtool.pack.columns import token_values

if TYPE_CHECKING:
    from packtool.pack.flat_ids import FlatIds


@dataclass(frozen=True, kw_only=True)
class TailPolicy:
    """Which rows a chunk sets aside for later packing."""

    rows_per_group: int = 32
    """At most this many rows per group. Not only FFD's last, nearly empty rows: the rows
    before them have gaps of a few tokens that only the small documents of other partitions
    can fill (on the 1,000-file test corpus, 4 rows per partition lost 0.24 points of
    efficiency against one chunk, 32 rows 0.04)."""
    max_rows: int = 32
    """At most this many rows in all, whatever the number of groups."""
    min_free: int = 1
    """Only rows with at least this many free token slots are set aside."""
    open_groups: frozenset[str] | None = None
    """Groups that may still receive documents (None: every group)."""

    def __post_init__(self) -> None:
        for name in ("rows_per_group", "max_rows", "min_free"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name} must be an integer >= 0, got {value!r}")


def tail_rows(
    fill: NDArray[np.int64],
    row_group: NDArray[np.int64],
    group_names: list[str],
    max_len: int,
    policy: TailPolicy,
) -> NDArray[np.bool_]:
    """Which rows to set aside: a boolean per row.

    Args:
        fill: tokens in each row.
        row_group: each row's group code (an index into `group_names`).
        group_names: the group values ("" when there is no grouping).
        max_len: tokens per row at most.
        policy: the bounds.
    """
    n = len(fill)
    chosen = np.zeros(n, dtype=bool)
    free = max_len - fill
    candidate = free >= max(policy.min_free, 1)
    if policy.open_groups is not None:
        open_codes = [g for g, name in enumerate(group_names) if name in policy.open_groups]
        candidate &= np.isin(row_group, np.asarray(open_codes, dtype=np.int64))
    rows = np.flatnonzero(candidate)
    if not len(rows) or not policy.rows_per_group or not policy.max_rows:
        return chosen
    # Least-filled first, earlier row on ties; then the first `rows_per_group` of each group.
    rows = rows[np.lexsort((rows, fill[rows]))]
    groups = row_group[rows]
    order = np.argsort(groups, kind="stable")
    rank = np.empty(len(rows), dtype=np.int64)
    sorted_groups = groups[order]
    starts = np.flatnonzero(np.r_[True, sorted_groups[1:] != sorted_groups[:-1]])
    rank[order] = np.arange(len(rows)) - np.repeat(starts, np.diff(np.r_[starts, len(rows)]))
    rows = rows[rank < policy.rows_per_group][: policy.max_rows]
    chosen[rows] = True
    return chosen


def pieces_table(
    table: pa.Table,
    values: FlatIds,
    doc_start: NDArray[np.int64],
    seg_doc: NDArray[np.int64],
    seg_start: NDArray[np.int64],
    seg_len: NDArray[np.int64],
    seg_chunk: NDArray[np.int32],
    flat: dict[str, np.ndarray],
) -> pa.Table:
    """The pieces `table[seg_doc][seg_start : seg_start + seg_len]` as a tokenized table.

    The result has `table`'s schema plus `doc_chunk` (int32): per-token columns (`input_ids`,
    a loss mask) cut like the ids, in `table`'s types (a mask stored as bytes or as a list stays
    so, for `carry=` to pack it with the next chunk's table), every other column one value per
    piece.

    Args:
        table: tokenized documents.
        values: their token ids (`doc_start` indexes them).
        doc_start: each document's first token in `values` (n + 1 entries).
        seg_doc, seg_start, seg_len, seg_chunk: the pieces: document, first token inside it,
            length, chunk index.
        flat: flat values of per-token optional columns already read, by name.
    """
    src = doc_start[seg_doc] + seg_start
    offsets = np.zeros(len(seg_len) + 1, dtype=np.int64)
    np.cumsum(seg_len, out=offsets[1:])
    per_token = {"input_ids"} | {
        c.name
        for c in shard_columns.tokenized_optional(table.column_names)
        if c.level == shard_columns.TOKEN
    }
    rest = [n for n in table.column_names if n not in per_token and n != "length"]
    taken = table.select(rest).take(from_numpy(np.asarray(seg_doc, np.int64)))
    token_type = table.schema.field("input_ids").type.value_type
    arrays: dict[str, pa.Array] = {n: taken.column(n) for n in rest}
    ids = values.gather(src, seg_len)
    arrays["input_ids"] = pa.ListArray.from_arrays(
        from_numpy(offsets.astype(np.int32)), from_numpy(ids, token_type)
    )
    arrays["length"] = from_numpy(seg_len.astype(np.int32))
    for name in sorted(per_token - {"input_ids"}):
        c = shard_columns.get(name)
        values_c = flat[name] if name in flat else token_values(table, name, doc_start)
        gathered = kernels.gather_segments(
            values_c.astype(c.numpy_dtype(), copy=False), src, seg_len
        )
        kind = table.schema.field(name).type
        if pa.types.is_binary(kind):  # the shards' storage (tokenized Parquet's too)
            arrays[name] = c.array(offsets, gathered, token_type)
        else:  # a list, as a library caller may pass (`token_values` reads both): kept a list
            lists = pa.ListArray.from_arrays(from_numpy(offsets.astype(np.int32)), gathered)
            arrays[name] = lists.cast(kind)
    out = pa.table({n: arrays[n] for n in table.column_names}, schema=table.schema)
    return out.append_column(DOC_CHUNK, from_numpy(np.asarray(seg_chunk, np.int32)))
