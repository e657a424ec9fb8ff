"""`packtool verify`'s check of where each packed piece ends, when documents end in EOS.

A dataset whose `index.json` records an `eos_id` and no chat template had that EOS appended to
every document (docs/tokenize.md, "BOS and EOS"; chat records end where their template ends
them, so they are not checked). The long-document policies then leave three kinds of piece
(docs/pack.md): a whole document, which ends in `eos_id`; a chunk of a split document, all but
the last exactly `max_len` tokens (the last ends in `eos_id`); a truncated head, exactly
`max_len`. So every piece ends in `eos_id` or is `max_len` long. A moved document boundary (with
`seq_lengths` recomputed and the checksums rewritten) or an edited `eos_id` breaks that; it
passed verify before. Per row group, in memory bounded by the group: no whole-dataset state.

`first_bad_row` is the vectorised check over a row group, `row_problem` the plain reference for
one row that names what is wrong (tests hold the two to the same answer). Both assume the row
invariants hold (packtool/audit/verify.py checks them first).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

__all__ = ["ending_eos", "first_bad_row", "row_problem"]


def ending_eos(tokenizer: dict[str, Any], extra: dict[str, Any] | None) -> int | None:
    """The id every document ends in (`tokenizer.eos_id`), or None: no EOS recorded, or chat
    records (`extra.chat_template`), which end where their template ends them."""
    eos = tokenizer.get("eos_id")
    if eos is None or "chat_template" in (extra or {}):
        return None
    return int(eos)


def first_bad_row(
    parts: dict[str, tuple[NDArray[np.int64], np.ndarray]], *, eos_id: int, max_len: int
) -> int | None:
    """The first row (in this batch) with a piece that neither ends in `eos_id` nor is
    `max_len` long, or None."""
    ids_off, ids = parts["input_ids"]
    off_off, off = parts["doc_offsets"]
    n_off = np.diff(off_off)
    if not len(off):
        return None
    row_of = np.repeat(np.arange(len(n_off), dtype=np.int64), n_off)
    is_start = np.zeros(len(off), dtype=bool)
    is_start[off_off[:-1][n_off > 0]] = True
    ends = np.flatnonzero(~is_start)  # each piece's end: every offset but a row's first
    end = off[ends].astype(np.int64)
    length = end - off[ends - 1]
    rows = row_of[ends]
    last = ids[ids_off[rows] + end - 1]
    hits = np.flatnonzero((last != eos_id) & (length != max_len))
    return int(rows[hits[0]]) if len(hits) else None


def row_problem(
    input_ids: NDArray[np.integer], doc_offsets: NDArray[np.integer], *, eos_id: int, max_len: int
) -> str | None:
    """What is wrong with where one row's pieces end, or None (the plain reference)."""
    off = [int(x) for x in doc_offsets]
    for k in range(len(off) - 1):
        start, end = off[k], off[k + 1]
        last = int(input_ids[end - 1])
        if last != eos_id and end - start != max_len:
            return (
                f"document {k} (tokens {start}..{end}) ends in token {last}, not eos_id "
                f"{eos_id}, and is {end - start} tokens, not max_len {max_len}: only a chunk of "
                "a split document or a truncated head ends elsewhere (a moved document "
                "boundary, or an edited eos_id in index.json?)"
            )
    return None
