"""`Documents`: the loader's one record type, documents laid end to end before collation.

What `ShardStore.gather` returns, what the worker transport carries (`loader/packed/transport.py`), what
`OnlinePacker`'s rows and the serving batcher hand over, and what `loader.collate.collate`
turns into a batch dict. It holds the three arrays every batch needs (tokens, document lengths,
document ids) and, by name, the optional columns the data carries (`loss_mask`; declared in
packtool/dataset/columns.py with `loaded=True`): per-token ones as long as `tokens`, per-document ones as
long as `doc_lens`. Code that only moves records (gather, transport, slicing, concatenating)
treats every optional column alike; only `collate` gives one a meaning.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import DTypeLike, NDArray

from packtool.dataset.columns import LOSS_MASK, TOKEN, Column
from packtool.errors import DataError


@dataclass(frozen=True)
class Documents:
    """Documents laid end to end (a batch before collation, or some packed rows)."""

    tokens: NDArray[np.integer]
    """Token ids of every document back to back, `(total,)` (the stored uint16/uint32, or any
    integer dtype; in a mixture step spliced from workers' parts, a `TokenRuns`, which
    `collate` writes straight into the batch)."""
    doc_lens: NDArray[np.integer]
    """Length of each document, `(n_docs,)`, positive, summing to `total`."""
    doc_ids: NDArray[np.integer]
    """Source document id of each document, `(n_docs,)`."""
    columns: Mapping[str, NDArray] = field(default_factory=dict)
    """Optional columns by name: per-token ones `(total,)`, per-document ones `(n_docs,)`."""

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_docs(self) -> int:
        return int(self.doc_lens.shape[0])

    @property
    def loss_mask(self) -> NDArray | None:
        """uint8 `(total,)`, 1 where the token is a target of the loss; None without a mask."""
        return self.columns.get(LOSS_MASK)


class TokenRuns:
    """Tokens as runs of arrays laid end to end, in place of `Documents.tokens`: a batch
    spliced from several parts (`loader.mixture.dataloader.splice`), whose tokens `collate` writes
    straight into the batch instead of joining them first (one copy of every token less)."""

    def __init__(self, runs: list[NDArray[np.integer]]) -> None:
        self.runs = runs
        self.shape = (sum(len(r) for r in runs),)

    def write(self, out: NDArray) -> None:
        """Copy the runs into `out` (`(total,)`, any dtype the ids fit)."""
        at = 0
        for r in self.runs:
            out[at : at + len(r)] = r
            at += len(r)

    def __array__(self, dtype: DTypeLike = None, copy: bool | None = None) -> NDArray:
        return np.concatenate(self.runs).astype(dtype, copy=False)


def empty_documents(
    n_tokens: int, n_docs: int, token_dtype: DTypeLike, columns: Iterable[Column] = ()
) -> Documents:
    """Uninitialised `Documents` for `n_tokens` tokens and `n_docs` documents: tokens in
    `token_dtype`, lengths int32, ids int64, and each optional column in its declared dtype (what
    `ShardStore.gather_into` writes; a mixture's record has every source's columns)."""
    return Documents(
        np.empty(n_tokens, token_dtype),
        np.empty(n_docs, np.int32),
        np.empty(n_docs, np.int64),
        {
            c.name: np.empty(n_tokens if c.level == TOKEN else n_docs, c.numpy_dtype())
            for c in columns
        },
    )


INT64_MAX = int(np.iinfo(np.int64).max)
"""The largest id a batch's int64 `input_ids` holds."""


def check_ids(arr: np.ndarray, where: str, name: str = "token ids") -> None:
    """Refuse ids a batch's int64 `input_ids` cannot hold as they are, naming `where` (a float
    id would be truncated, a negative one reaches the embedding, `[2**64]` is numpy's dtype
    object): the online packer's documents and `RowCollator`'s rows alike.

    Raises:
        DataError: Ids that are not integers in 0..2^63-1.
    """
    if (bad := outside_int64(arr)) is None and arr.size and arr.dtype.kind not in "iu":
        raise DataError(f"{where}: {name} must be integers, got dtype {arr.dtype}")
    if bad is None and arr.size and (int(arr.min()) < 0 or int(arr.max()) > INT64_MAX):
        bad = int(arr.min()) if int(arr.min()) < 0 else int(arr.max())
    if bad is not None:
        raise DataError(f"{where}: token id {bad} is not in 0..2^63-1 (the batch's int64)")


def tensor_ids(value: Any, where: str, *, floats: bool = False) -> Any:
    """`value` as numpy sees it, a torch tensor (on any device, grad-tracking or not) made a
    CPU numpy array first; anything else as it is, for the id checks that follow. `floats`
    (a per-token column such as a loss mask, not ids): a float tensor of a type numpy lacks
    (bfloat16, float8) is read in float32, exact for 0/1, and the value checks follow.

    Raises:
        DataError: A tensor of a dtype numpy lacks (bfloat16, float8, ...): no ids, named by
            `where` ("document 3: token ids", "request token ids").
    """
    if not hasattr(value, "detach") or not hasattr(value, "is_floating_point"):
        return value
    tensor = value.detach()
    # Neither holds ids numpy can read: a meta tensor (torch's NotImplementedError "Cannot
    # copy out of meta tensor") and a sparse one ("must be integers, got torch.int64").
    if getattr(tensor, "is_meta", False):
        raise DataError(f"{where}: a tensor on the meta device holds no values")
    if str(getattr(tensor, "layout", "torch.strided")) != "torch.strided":
        raise DataError(f"{where} must be a dense tensor, got layout {tensor.layout}")
    tensor = tensor.cpu()
    try:
        return tensor.numpy()
    except TypeError:  # "Got unsupported ScalarType BFloat16"
        if floats and tensor.is_floating_point():
            return tensor.float().numpy()
        kind = "numbers" if floats else "integers"
        raise DataError(f"{where} must be {kind}, got {tensor.dtype}") from None


def outside_int64(arr: np.ndarray) -> int | None:
    """An id outside 0..2^63-1 among Python ints numpy kept as objects (what it makes of ids
    past uint64, e.g. `[2**64]`), else None."""
    if arr.dtype != object or not arr.size:
        return None
    ints = arr.reshape(-1).tolist()
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in ints):
        return None
    low, high = min(ints), max(ints)
    return high if high > INT64_MAX else (low if low < 0 else None)
