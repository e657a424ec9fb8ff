"""The tokenized table of the documents a reader keeps: one builder for every reader.

Pre-tokenized Parquet (`pretokenized.py`) and fine-tuning records (packtool/sft/encode.py) both end a
batch the same way: drop the documents they skipped, gather the kept ones' tokens (and loss
mask) in order, and build the `doc_id, source, input_ids, length[, loss_mask], extras...`
table. Straight from numpy buffers (packtool/arrow_numpy.py: `pa.array` would import pandas);
no per-token Python.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from packtool.arrow_numpy import from_numpy, strings
from packtool.dataset.columns import LOSS_MASK, get
from packtool.errors import ConfigError


def kept_documents(
    ids: np.ndarray, mask: np.ndarray | None, offsets: np.ndarray, rows: np.ndarray, *, too_big: str
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """`(ids, mask, offsets)` of documents `rows` (indices into `offsets`, ascending), in order.

    Raises:
        ConfigError(too_big): the kept documents hold >= 2**31 tokens (int32 list offsets).
    """
    offsets = np.asarray(offsets, np.int64)
    lengths = (offsets[1:] - offsets[:-1])[rows]
    new_off = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=new_off[1:])
    if new_off[-1] >= 2**31:
        raise ConfigError(too_big)
    if len(rows) == len(offsets) - 1:  # the usual case: every document kept, nothing to gather
        return ids, mask, new_off
    take = np.repeat(offsets[rows] - new_off[:-1], lengths) + np.arange(new_off[-1])
    return ids[take], None if mask is None else mask[take], new_off


def tokenized_table(
    schema: pa.Schema,
    *,
    doc_ids: np.ndarray,
    sources: Sequence[str],
    ids: np.ndarray,
    offsets: np.ndarray,
    mask: np.ndarray | None = None,
    extras: Mapping[str, pa.Array] | None = None,
) -> pa.Table:
    """The tokenized table of documents given by flat `ids` and int64 `offsets` (n + 1)."""
    token_type = schema.field("input_ids").type.value_type
    columns: dict[str, pa.Array] = {
        "doc_id": from_numpy(np.asarray(doc_ids, np.int64)),
        "source": strings(sources),
        "input_ids": pa.ListArray.from_arrays(
            from_numpy(offsets.astype(np.int32)), from_numpy(ids, token_type)
        ),
        "length": from_numpy(np.diff(offsets).astype(np.int32)),
    }
    if mask is not None:
        columns[LOSS_MASK] = get(LOSS_MASK).array(offsets, mask)  # bytes, as in the shards
    columns.update(extras or {})
    return pa.Table.from_pydict(columns, schema=schema)
