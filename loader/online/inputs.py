"""What the online packer is given: one token sequence per document, checked one by one.

A document is checked before it joins others, so a bad one fails alone and names itself, and
every document leaves here as a 1-D integer array whose ids fit the batch's int64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.errors import DataError

INT64_MAX = int(np.iinfo(np.int64).max)
"""The largest id a batch's int64 `input_ids` hold."""


def several_sequences(arr: np.ndarray) -> bool:
    """Whether `arr` holds more than one sequence: `(B, T)` with B > 1, flattened, would become
    one of B sequences; `(1, T)` (a tokenizer's batch of one) is one."""
    return arr.ndim > 1 and (arr.shape[0] > 1 or sum(d > 1 for d in arr.shape) > 1)


def doc_array(doc: Any, i: int) -> NDArray:
    """One document's token ids as a 1-D array; `(1, T)` (a tokenizer's batch of one) is fine.

    A `(B, T)` array with B > 1 is refused: flattened, B sequences would become one document.
    """
    try:
        arr = np.asarray(doc)
    except ValueError as exc:  # ragged nested lists
        raise DataError(f"document {i} is not one sequence of token ids ({exc})") from None
    if several_sequences(arr):
        raise DataError(
            f"document {i} has shape {arr.shape}; give one 1-D token array per document"
        )
    if arr.dtype.kind not in "iu" and arr.size:
        raise DataError(f"document {i}: token ids must be integers, got dtype {arr.dtype}")
    arr = arr.reshape(-1)
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > INT64_MAX):
        # Per document, before it joins others: a bad one fails alone, naming itself.
        bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
        raise DataError(f"document {i}: token id {bad} is not in 0..2^63-1 (the batch's int64)")
    # One dtype for every document: a uint64 beside an int64 would meet in float64.
    return arr.astype(np.int64, copy=False) if arr.dtype == np.uint64 else arr
