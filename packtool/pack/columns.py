"""The optional columns in packing: what moves with `input_ids`, and what a loss mask asks of it.

Pure, like packtool/pack/chunk.py (arrays and tables in, tables out). Which optional columns a tokenized
table carries comes from the declaration (packtool/dataset/columns.py): per-token columns are cut and
laid out exactly as the ids (the same segment starts and lengths, so the same offsets), and
per-document columns give one value per packed piece.

A loss mask (`loss_mask`) adds two rules:

- a document is never split across rows (the prompt and its answer belong together; a split
  piece would lose its context): `long_docs="split"` is refused, `truncate` (what `long_docs`
  left out, None, means for such data: `policy_for`) keeps the first `max_len` tokens with their
  mask, `drop` leaves long documents out;
- a piece that holds no supervised token trains on nothing: it is left out and counted
  (`documents_unsupervised`, inside `documents_dropped`), which only happens to a document whose
  supervised tokens were all truncated away, or to a table made by hand (readers skip documents
  whose mask is all zeros before they get here).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.dataset import columns as shard_columns
from packtool.errors import ConfigError, DataError
from packtool.pack import kernels


def carried(table: pa.Table) -> tuple[shard_columns.Column, ...]:
    """The declared optional columns `table` carries, in declaration order."""
    return shard_columns.tokenized_optional(table.column_names)


def policy_for(names: tuple[str, ...], long_docs: str | None) -> str:
    """`long_docs` as given or, None, decided by the columns `names`: `truncate` for data with a
    loss mask (its documents are never split), else `split`."""
    if long_docs is not None:
        return long_docs
    return "truncate" if shard_columns.LOSS_MASK in names else "split"


def check_policy(names: tuple[str, ...], long_docs: str, *, api: bool = False) -> None:
    """Refuse splitting documents of a dataset with a loss mask (`ConfigError`, one line), in
    the words of the CLI (`--long-docs split`) or, `api`, of the Python setting."""
    if shard_columns.LOSS_MASK in names and long_docs == "split":
        said, fix = (
            ("long_docs='split'", "long_docs='truncate' or 'drop'")
            if api
            else ("--long-docs split", "--long-docs truncate or drop")
        )
        raise ConfigError(
            f"{said} cuts documents across rows, which a loss mask forbids (a completion would "
            f"lose its prompt); use {fix}"
        )


def token_values(table: pa.Table, name: str, doc_start: NDArray[np.int64]) -> NDArray:
    """The flat values of per-token column `name`, checked to have the ids' offsets."""
    col = table.column(name).combine_chunks()
    if col.null_count or (hasattr(col, "values") and col.values.null_count):
        raise DataError(f"tokenized table: {name} holds nulls")
    offsets, values = shard_columns.flat_parts(col)  # a list, or bytes
    if len(offsets) != len(doc_start) or not np.array_equal(offsets, doc_start):
        raise DataError(f"tokenized table: {name} does not have one value per token of input_ids")
    return values


def supervised_per_segment(
    mask: NDArray, src: NDArray[np.int64], length: NDArray[np.int64]
) -> NDArray[np.int64]:
    """Supervised tokens in each segment `mask[src : src + length]`."""
    return kernels.segment_sums(mask, src, length)


def gather(
    table: pa.Table,
    columns: tuple[shard_columns.Column, ...],
    doc_start: NDArray[np.int64],
    seg_doc: NDArray[np.int64],
    src: NDArray[np.int64],
    seg_len: NDArray[np.int64],
    row_offsets: NDArray[np.int32],
    seg_offsets: NDArray[np.int32],
    values: dict[str, NDArray] | None = None,
) -> dict[str, pa.Array]:
    """The packed rows' optional columns: per-token ones like the ids, per-document ones per piece.

    Args:
        table: the tokenized chunk.
        columns: the optional columns to carry (`carried(table)`).
        doc_start: the documents' token offsets in the chunk.
        seg_doc: each packed piece's document (in output order).
        src: each piece's first token in the chunk's flat ids (output order).
        seg_len: each piece's length (output order).
        row_offsets: token offsets of the rows.
        seg_offsets: piece offsets of the rows.
        values: flat per-token values already read (`token_values`), by name.
    """
    out: dict[str, pa.Array] = {}
    for c in columns:
        if c.level == shard_columns.TOKEN:
            flat = (values or {}).get(c.name)
            if flat is None:
                flat = token_values(table, c.name, doc_start)
            packed = kernels.gather_segments(flat.astype(c.numpy_dtype(), copy=False), src, seg_len)
            out[c.name] = c.array(row_offsets, packed)  # a list, or bytes (`Column.storage`)
        else:  # DOCUMENT: one value per document of the chunk, one per piece in the rows
            per_doc = table.column(c.name).to_numpy().astype(c.numpy_dtype(), copy=False)
            out[c.name] = c.array(seg_offsets, per_doc[seg_doc])
    return out
