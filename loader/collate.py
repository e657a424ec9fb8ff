"""Varlen collation: concatenated documents -> the batch dict of docs/CONTRACTS.md.

Pure numpy (concatenate, cumsum, repeat, arange) and `torch.from_numpy`; no per-token Python.

Labels: a label never crosses a document (the last token of each document predicts nothing), and
with a loss mask (`Documents.loss_mask`, 1 = supervised) a position whose target token is not
supervised gets -100 too, so a masked token is never a target, in both layouts and with static
shapes. The first token of a document is never a target either (nothing before it in the same
document predicts it).

Static-shape convention (`pad_tokens`/`pad_docs`, for CUDA graphs and torch.compile): tokens are
padded with `pad_id` up to `pad_tokens`; the padding forms one trailing pseudo-document whose
`labels` are -100 and whose `doc_ids` entry is -1; `cu_seqlens` always has `pad_docs + 1`
entries, the extra ones repeating `total` (empty documents), with `doc_ids` -1 for them; and
`max_seqlen` is `pad_tokens` (a fixed upper bound) so nothing in the batch changes shape or value
type from step to step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loader.config import MAX_BATCH_TOKENS
from loader.record import Documents, TokenRuns
from packtool.dataset.columns import IGNORE_INDEX
from packtool.errors import ConfigError, DataError

_ARANGE = np.arange(0, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    """`np.arange(n)` int64, a read-only view of a cached array (saves a fill per batch)."""
    global _ARANGE
    if len(_ARANGE) < n:
        _ARANGE = np.arange(max(n, 2 * len(_ARANGE)), dtype=np.int64)
        _ARANGE.flags.writeable = False
    return _ARANGE[:n]


def _alloc_int64(n: int, pin_memory: bool = False) -> torch.Tensor:
    """An uninitialised int64 tensor; in a DataLoader worker, directly in shared memory.

    torch would otherwise copy every tensor of a batch into its own shared-memory segment when
    the worker sends it; allocating there up front saves that copy and most of the set-up cost.
    """
    if pin_memory and torch.cuda.is_available():
        return torch.empty(n, dtype=torch.int64, pin_memory=True)
    if get_worker_info() is not None:
        try:
            storage = torch.UntypedStorage._new_shared(max(n, 1) * 8)
            return torch.empty(0, dtype=torch.int64).set_(storage, 0, (n,))
        except (AttributeError, RuntimeError):  # private API: fall back to a plain tensor
            pass
    return torch.empty(n, dtype=torch.int64)


def collate(
    docs: Documents,
    *,
    pad_tokens: int | None = None,
    pad_docs: int | None = None,
    pad_id: int = 0,
    position_limit: int | None = None,
    layout: str = "packtool",
    seq_idx: bool = False,
    varlen_keys: bool = False,
    pin_memory: bool = False,
) -> dict[str, torch.Tensor | int]:
    """Build one varlen batch from documents laid end to end.

    Args:
        docs: The documents (`loader.record.Documents`): tokens `(total,)` of any integer
            dtype, positive lengths summing to `total`, ids, and optionally a `loss_mask`
            `(total,)` (1 = the token is a target of the loss).
        pad_tokens: Static shape: pad the token axis to exactly this many tokens.
        pad_docs: Static shape: `cu_seqlens` gets exactly `pad_docs + 1` entries (the padding
            pseudo-document counts as one document).
        pad_id: Token id used for padding.
        position_limit: Padding positions wrap at this value (the model's max_len) so they stay
            inside position tables.
        layout: `"packtool"` (the contract batch) or `"hf"` (transformers' padding-free
            convention: `input_ids`/`labels`/`position_ids` of shape `(1, T)`, labels unshifted
            with -100 at each document's first token, `cu_seq_lens_q/k`, `max_length_q/k`).
        seq_idx: Add `seq_idx`, int32, one per token: the index of its document (its
            `cu_seqlens` entry) in the batch, 0, 1, ...; static-shape padding is one more
            document. What mamba_ssm's kernels and transformers' hybrid models (Mamba-2, gated
            delta-net layers) take to keep a state from flowing across documents; `(T,)`, or
            `(1, T)` with `layout="hf"` (as `DataCollatorWithFlattening(return_seq_idx=True)`).
        varlen_keys: Add transformers' explicit varlen keys to the packtool layout too:
            `cu_seq_lens_q`, `cu_seq_lens_k` (both `cu_seqlens`) and `max_length_q`,
            `max_length_k` (both `max_seqlen`). The hf layout always has them.
        pin_memory: Allocate the batch in pinned memory (when CUDA is available).

    Returns:
        The batch dict: `input_ids` int64 `(T,)`, `cu_seqlens` int32 `(n_docs + 1,)`,
        `max_seqlen` int, `position_ids` int64 `(T,)`, `labels` int64 `(T,)` (labels[t] =
        input_ids[t + 1] inside a document, else -100; with a loss mask also -100 where the
        target token input_ids[t + 1] is not supervised), `doc_ids` int64 `(n_docs,)`,
        `doc_targets` int64 `(n_docs,)`: the positions of each document (`cu_seqlens` entry)
        that have a label (0 for padding entries), what per-sequence loss normalisation divides
        by. `layout="hf"` has `doc_targets` too, beside transformers' keys.

    Raises:
        DataError: The documents do not fit the static shape.
    """
    if layout not in ("packtool", "hf"):
        raise ValueError(f"layout must be 'packtool' or 'hf', got {layout!r}")
    tokens, doc_ids, mask = docs.tokens, docs.doc_ids, docs.loss_mask
    total = int(tokens.shape[0])
    doc_lens = np.asarray(docs.doc_lens, dtype=np.int64)
    if mask is not None and mask.shape[0] != total:
        raise DataError(f"loss_mask has {mask.shape[0]} values for {total} tokens")
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
    n_cu = n_entries + 1 if pad_docs is None else pad_docs + 1
    n_out = n_cu - 1
    # Every array of the batch lives in one int64 buffer: one allocation, and in a DataLoader
    # worker one shared-memory segment per batch instead of one per tensor (half the IPC cost).
    # layout: [input_ids T | labels T | position_ids T | doc_ids n_out | doc_targets n_out |
    #          cu_seqlens (int32) n_cu | seq_idx (int32) T, when asked for]
    cu_words = (n_cu + 1) // 2
    words = 3 * T + 2 * n_out + cu_words + ((T + 1) // 2 if seq_idx else 0)
    flat = _alloc_int64(words, pin_memory)
    buf = flat.numpy()
    ids, labels, pos = buf[:T], buf[T : 2 * T], buf[2 * T : 3 * T]
    out_ids = buf[3 * T : 3 * T + n_out]
    cu_t = flat[3 * T + 2 * n_out :].view(torch.int32)[:n_cu]
    cu = cu_t.numpy()
    if isinstance(tokens, TokenRuns):
        tokens.write(ids[:total])
    else:
        ids[:total] = tokens
    ids[total:] = pad_id
    cu[0] = 0
    np.cumsum(doc_lens, out=cu[1 : n_docs + 1])
    cu[n_docs + 1 :] = T
    starts = np.repeat(cu[:n_docs].astype(np.int64), doc_lens)
    np.subtract(_arange(total), starts, out=pos[:total])
    if pad:
        pad_pos = np.arange(pad, dtype=np.int64)
        pos[total:] = pad_pos % position_limit if position_limit else pad_pos
    out_ids[:n_docs] = doc_ids
    out_ids[n_docs:] = -1
    targets = buf[3 * T + n_out : 3 * T + 2 * n_out]  # doc_targets: labelled positions per entry
    targets[n_docs:] = 0
    if mask is None:  # every position but a document's last has a target
        np.subtract(doc_lens, 1, out=targets[:n_docs])
        np.maximum(targets[:n_docs], 0, out=targets[:n_docs])
    elif n_docs:  # the supervised tokens but the first (nothing in its document predicts it)
        cum = np.zeros(total + 1, np.int64)
        np.cumsum(mask, dtype=np.int64, out=cum[1:])
        bounds = cu[: n_docs + 1].astype(np.int64)
        targets[:n_docs] = cum[bounds[1:]] - cum[bounds[:-1]] - mask[bounds[:-1]]
    doc_targets = flat[3 * T + n_out : 3 * T + 2 * n_out]
    extra: dict[str, torch.Tensor | int] = {}
    if seq_idx:
        seq_t = flat[3 * T + 2 * n_out + cu_words :].view(torch.int32)[:T]
        seq = seq_t.numpy()
        seq[:total] = np.repeat(np.arange(n_docs, dtype=np.int32), doc_lens)
        seq[total:] = n_docs  # the padding pseudo-document
        extra["seq_idx"] = seq_t
    if layout == "packtool":
        # labels[t] = input_ids[t + 1]; the last token of every document predicts nothing.
        labels[: T - 1] = ids[1:]
        labels[T - 1 :] = IGNORE_INDEX
        if mask is not None and total > 1:  # the target of position t is token t + 1
            labels[: total - 1][mask[1:] == 0] = IGNORE_INDEX
        if n_docs:
            labels[cu[1 : n_docs + 1] - 1] = IGNORE_INDEX
        labels[total:] = IGNORE_INDEX
        if pad_tokens is not None:
            max_seqlen = int(pad_tokens)
        if varlen_keys:
            extra |= {"cu_seq_lens_q": cu_t, "cu_seq_lens_k": cu_t}
            extra |= {"max_length_q": max_seqlen, "max_length_k": max_seqlen}
        return {
            "input_ids": flat[:T],
            "cu_seqlens": cu_t,
            "max_seqlen": max_seqlen,
            "position_ids": flat[2 * T : 3 * T],
            "labels": flat[T : 2 * T],
            "doc_ids": flat[3 * T : 3 * T + n_out],
            "doc_targets": doc_targets,
            **extra,
        }
    # transformers shifts labels inside the model: labels[t] = input_ids[t], -100 at each
    # document's first token (and at padding), as DataCollatorWithFlattening builds them.
    labels[:] = ids
    if mask is not None:  # unshifted: the target at t is token t itself
        labels[:total][mask == 0] = IGNORE_INDEX
    labels[cu[:n_docs]] = IGNORE_INDEX
    labels[total:] = IGNORE_INDEX
    if pad:
        max_seqlen = max(max_seqlen, pad)
    if pad_tokens is not None:
        max_seqlen = int(pad_tokens)
    return {
        "input_ids": flat[:T].unsqueeze(0),
        "labels": flat[T : 2 * T].unsqueeze(0),
        "position_ids": flat[2 * T : 3 * T].unsqueeze(0),
        "cu_seq_lens_q": cu_t,
        "cu_seq_lens_k": cu_t,
        "max_length_q": max_seqlen,
        "max_length_k": max_seqlen,
        "doc_targets": doc_targets,
        **{k: v.unsqueeze(0) for k, v in extra.items()},
    }


def blank(batch: dict[str, Any]) -> None:
    """Make a collated batch a filler (a rank's step with no rows left, docs/CONTRACTS.md): no
    targets, no documents, in place: labels -100, `doc_targets` 0, `doc_ids` -1. The one
    place both datasets blank theirs (the mixture's kept its `doc_targets`)."""
    batch["labels"].fill_(IGNORE_INDEX)
    if "doc_targets" in batch:
        batch["doc_targets"].zero_()
    if "doc_ids" in batch:
        batch["doc_ids"].fill_(-1)


def collate_kwargs_dict(value: Any) -> dict[str, Any]:
    """`collate_kwargs` as given to a dataset or batcher, as a new dict (None: none), or a
    `ConfigError`: a list or a string was `dict()`'s bare TypeError / ValueError."""
    try:
        return dict(value or {})
    except (TypeError, ValueError):
        raise ConfigError(
            f"collate_kwargs must be a dict of loader.collate keyword arguments, got "
            f"{type(value).__name__}"
        ) from None


def check_collate_kwargs(
    kwargs: dict[str, Any], batch_tokens: tuple[int, str] | None = None
) -> None:
    """Refuse keyword arguments `collate` does not take, or values it refuses, when they are
    given (a bad one would fail every batch, from the first one on, in a DataLoader worker).

    Args:
        kwargs: The keyword arguments.
        batch_tokens: The most tokens a batch can hold and what sets that, in words (e.g.
            `(96, "rows_per_batch=3 × max_len=32 = 96 tokens")`): `pad_tokens` must be at
            least that, and `pad_docs` too (one-token documents), plus one for the padding
            entry when `pad_tokens` is larger.

    Raises:
        ConfigError: naming the unknown ones and the valid ones, or the bad value.
    """
    import inspect

    valid = set(inspect.signature(collate).parameters) - {"docs"}
    unknown = sorted(set(kwargs) - valid)
    if unknown:
        raise ConfigError(f"collate_kwargs {unknown} unknown; loader.collate takes {sorted(valid)}")
    for name, low in (("pad_tokens", 1), ("pad_docs", 1), ("pad_id", 0), ("position_limit", 1)):
        value = kwargs.get(name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or not low <= value < 2**63
        ):
            raise ConfigError(
                f"collate_kwargs {name} must be an integer from {low} to 2**63-1, got {value!r}"
            )
    for name in ("seq_idx", "varlen_keys", "pin_memory"):
        if name in kwargs and not isinstance(kwargs[name], bool):
            raise ConfigError(f"collate_kwargs {name} must be True or False, got {kwargs[name]!r}")
    if (pad := kwargs.get("pad_tokens")) is not None and pad > MAX_BATCH_TOKENS:
        # allocated (3 x 8 bytes a token) and failed deep in torch at the first batch, or past
        # int32 made a cu_seqlens that does not hold the batch
        raise ConfigError(
            f"collate_kwargs pad_tokens={pad:,} is more tokens than a batch can hold: cu_seqlens "
            f"is int32, so at most {MAX_BATCH_TOKENS:,}"
        )
    layout = kwargs.get("layout", "packtool")
    if not isinstance(layout, str) or layout not in ("packtool", "hf"):
        raise ConfigError(f"collate_kwargs layout must be 'packtool' or 'hf', got {layout!r}")
    pad = kwargs.get("pad_tokens")
    if batch_tokens is not None and pad is not None and pad < batch_tokens[0]:
        most, why = batch_tokens
        raise ConfigError(
            f"collate_kwargs pad_tokens={pad} is smaller than a batch can hold ({why}); raise "
            f"pad_tokens to at least {most}"
        )
    pad_docs = kwargs.get("pad_docs")
    if batch_tokens is not None and pad_docs is not None:
        # Documents have a token at least, so a batch holds up to `most` of them, and the
        # padding entry when it pads below `pad_tokens`: a lower pad_docs failed mid-stream at
        # the first batch of many short documents (a cap per batch would split rows instead).
        most, why = batch_tokens
        padded = pad is not None and pad > most
        if pad_docs < most + padded:
            raise ConfigError(
                f"collate_kwargs pad_docs={pad_docs} is smaller than the documents a batch can "
                f"hold ({why}: up to {most} one-token documents{' and the padding' * padded}); "
                f"raise pad_docs to at least {most + padded}"
            )
