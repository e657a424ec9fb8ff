"""One packed row, read for display (`packtool inspect --row`), checked as `packtool verify`
checks it: the required columns' invariants (`verify.row_problem`), doc ids >= 0, and the
declared optional columns (`verify_columns.row_problem`: a mask's length and 0/1 values, no
document without a supervised token, a derived column equal to its rule), verify's piece-end
check (packtool/audit/piece_ends.py: with an `eos_id` recorded and no chat template, every piece
ends in `eos_id` or is `max_len` long), then doc ids >= 0, in verify's order. A row these checks
refuse is refused here in one line ending "run `packtool verify`", never shown (until
2026-12-07 the piece-end check was not repeated, and a row whose boundaries or recorded
`eos_id` were edited was shown). Only the row shown is checked: no pass over the dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.audit import piece_ends, verify, verify_columns
from packtool.dataset.columns import LOSS_MASK
from packtool.dataset.manifest import Manifest
from packtool.errors import DataError, one_line

__all__ = ["optional_problem", "row_values"]


def row_values(values: dict[str, Any], manifest: Manifest, where: str) -> tuple[Any, ...]:
    """(input_ids, doc_offsets, doc_ids, doc_chunks, loss_mask or None) of a row as arrays,
    once the row keeps the invariants verify checks (`DataError` else: a doc_offsets one entry
    short, a null token or chunk gave an IndexError or TypeError traceback)."""
    nulls = [c for c in verify.COLUMNS if values[c] is None or None in values[c]]
    if nulls:
        raise DataError(f"{where}: {nulls[0]} contains nulls; run `packtool verify`")
    try:
        ids, offsets, doc_ids, chunks = (
            np.asarray(values[c], dtype=np.int64) for c in verify.COLUMNS
        )
        mask = values.get(LOSS_MASK)  # bytes (its storage) or a list
        if isinstance(mask, bytes):
            mask = np.frombuffer(mask, np.uint8)
        mask = None if mask is None else np.asarray(mask, dtype=np.uint8)
    except (TypeError, ValueError, OverflowError) as exc:
        problem: str | None = f"unreadable values ({one_line(exc)})"
    else:
        problem = verify.row_problem(
            ids,
            offsets,
            doc_ids,
            chunks,
            max_len=manifest.max_len,
            vocab_size=manifest.tokenizer["vocab_size"],
        )
        if problem is None:  # the optional columns, as verify checks them (a mask value 2)
            row = dict(zip(verify.COLUMNS, (ids, offsets, doc_ids, chunks), strict=True))
            problem = optional_problem(values, row, manifest, mask)
        eos = piece_ends.ending_eos(manifest.tokenizer, manifest.extra)
        if problem is None and eos is not None:  # the offsets usable: where pieces end
            problem = piece_ends.row_problem(ids, offsets, eos_id=eos, max_len=manifest.max_len)
        negative = np.flatnonzero(doc_ids < 0)
        if problem is None and len(negative):  # every scheme numbers from 0 (as verify says)
            problem = f"doc id {int(doc_ids[negative[0]])} is negative"
    if problem is not None:
        raise DataError(f"{where}: {problem}; run `packtool verify`")
    return ids, offsets, doc_ids, chunks, mask


def optional_problem(
    values: dict[str, Any], row: dict[str, Any], manifest: Manifest, mask: NDArray | None
) -> str | None:
    """What is wrong with the row's declared optional columns (`loss_mask`, `seq_lengths`):
    `verify_columns.row_problem`, verify's own check, so inspect refuses the rows verify does
    (it checked the mask's length only, and drew a value of 2 as supervised)."""
    optional = verify_columns.optional_columns(manifest.columns)
    for c in optional:
        value = mask if c.name == LOSS_MASK else values.get(c.name)
        if value is None or (isinstance(value, list) and None in value):
            return f"{c.name} is null" if value is None else f"{c.name} contains nulls"
        row[c.name] = np.asarray(value)
    return verify_columns.row_problem(row, optional)
