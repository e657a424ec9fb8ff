"""Varlen collation: concatenated documents -> the batch dict of docs/CONTRACTS.md.

Pure numpy (concatenate, cumsum, repeat, arange) and `torch.from_numpy`; no per-token Python.

Static-shape convention (`pad_tokens`/`pad_docs`, for CUDA graphs and torch.compile): tokens are
padded with `pad_id` up to `pad_tokens`; the padding forms one trailing pseudo-document whose
`labels` are -100 and whose `doc_ids` entry is -1; `cu_seqlens` always has `pad_docs + 1`
entries, the extra ones repeating `total` (empty documents), with `doc_ids` -1 for them; and
`max_seqlen` is `pad_tokens` (a fixed upper bound) so nothing in the batch changes shape or value
type from step to step.
"""

from __future__ import annotations

import numpy as np
import torch

from packtool.errors import DataError

IGNORE_INDEX = -100


def collate(
    tokens: np.ndarray,
    doc_lens: np.ndarray,
    doc_ids: np.ndarray,
    *,
    pad_tokens: int | None = None,
    pad_docs: int | None = None,
    pad_id: int = 0,
    position_limit: int | None = None,
    layout: str = "packtool",
) -> dict[str, torch.Tensor | int]:
    """Build one varlen batch from documents laid end to end.

    Args:
        tokens: Token ids of every document back to back, any integer dtype, `(total,)`.
        doc_lens: Length of each document, `(n_docs,)`, positive, summing to `total`.
        doc_ids: Source document id of each document, `(n_docs,)`.
        pad_tokens: Static shape: pad the token axis to exactly this many tokens.
        pad_docs: Static shape: `cu_seqlens` gets exactly `pad_docs + 1` entries (the padding
            pseudo-document counts as one document).
        pad_id: Token id used for padding.
        position_limit: Padding positions wrap at this value (the model's max_len) so they stay
            inside position tables.
        layout: `"packtool"` (the contract batch) or `"hf"` (transformers' padding-free
            convention: `input_ids`/`labels`/`position_ids` of shape `(1, T)`, labels unshifted
            with -100 at each document's first token, `cu_seq_lens_q/k`, `max_length_q/k`).

    Returns:
        The batch dict: `input_ids` int64 `(T,)`, `cu_seqlens` int32 `(n_docs + 1,)`,
        `max_seqlen` int, `position_ids` int64 `(T,)`, `labels` int64 `(T,)` (labels[t] =
        input_ids[t + 1] inside a document, else -100), `doc_ids` int64 `(n_docs,)`.

    Raises:
        DataError: The documents do not fit the static shape.
    """
    if layout not in ("packtool", "hf"):
        raise ValueError(f"layout must be 'packtool' or 'hf', got {layout!r}")
    total = int(tokens.shape[0])
    doc_lens = np.asarray(doc_lens, dtype=np.int64)
    n_docs = int(doc_lens.shape[0])
    max_seqlen = int(doc_lens.max()) if n_docs else 0
    pad = 0
    if pad_tokens is not None:
        if total > pad_tokens:
            raise DataError(f"batch holds {total} tokens, more than the static budget {pad_tokens}")
        pad = pad_tokens - total
    n_entries = n_docs + (1 if pad else 0)
    if pad_docs is not None and n_entries > pad_docs:
        raise DataError(
            f"batch holds {n_entries} documents (padding included), more than pad_docs={pad_docs}"
        )
    T = total + pad
    # One int64 buffer holds input_ids, labels and position_ids: a single allocation, and a
    # single shared-memory storage when a DataLoader worker sends the batch.
    buf = np.empty((3, T), dtype=np.int64)
    ids, labels, pos = buf[0], buf[1], buf[2]
    ids[:total] = tokens
    ids[total:] = pad_id
    cu = np.zeros(n_entries + 1 if pad_docs is None else pad_docs + 1, dtype=np.int32)
    np.cumsum(doc_lens, out=cu[1 : n_docs + 1])
    cu[n_docs + 1 :] = T
    starts = np.repeat(cu[:n_docs].astype(np.int64), doc_lens)
    pos[:total] = np.arange(total, dtype=np.int64) - starts
    if pad:
        pad_pos = np.arange(pad, dtype=np.int64)
        pos[total:] = pad_pos % position_limit if position_limit else pad_pos
    out_ids = np.full(cu.shape[0] - 1, -1, dtype=np.int64)
    out_ids[:n_docs] = doc_ids
    if layout == "packtool":
        # labels[t] = input_ids[t + 1]; the last token of every document predicts nothing.
        labels[: T - 1] = ids[1:]
        labels[T - 1 :] = IGNORE_INDEX
        if n_docs:
            labels[cu[1 : n_docs + 1] - 1] = IGNORE_INDEX
        labels[total:] = IGNORE_INDEX
        if pad_tokens is not None:
            max_seqlen = int(pad_tokens)
        t = torch.from_numpy(buf)
        return {
            "input_ids": t[0],
            "cu_seqlens": torch.from_numpy(cu),
            "max_seqlen": max_seqlen,
            "position_ids": t[2],
            "labels": t[1],
            "doc_ids": torch.from_numpy(out_ids),
        }
    # transformers shifts labels inside the model: labels[t] = input_ids[t], -100 at each
    # document's first token (and at padding), as DataCollatorWithFlattening builds them.
    labels[:] = ids
    labels[cu[:n_docs]] = IGNORE_INDEX
    labels[total:] = IGNORE_INDEX
    if pad:
        max_seqlen = max(max_seqlen, pad)
    if pad_tokens is not None:
        max_seqlen = int(pad_tokens)
    t = torch.from_numpy(buf)
    cu_t = torch.from_numpy(cu)
    return {
        "input_ids": t[0].unsqueeze(0),
        "labels": t[1].unsqueeze(0),
        "position_ids": t[2].unsqueeze(0),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
    }
