"""Context-parallel batches: one CP rank's share of a packed batch.

Long-context training splits every packed sequence over the `size` ranks of a context-parallel
group: each rank holds a share of the queries, and the keys and values come from all of them
(gathered, or passed round a ring). `cp_split(batch, size, rank, style)` takes the whole
packtool-layout batch (loader/collate.py), which every rank of the group builds the same way
(the same rows: give the loader the data-parallel rank and world, not the global ones), and
returns this rank's share, with labels made before the split (no label crosses a document or a
rank boundary wrongly) and every key a rank needs to attend and to weigh its loss:

- `style="megatron"`: Megatron's THD convention (Megatron-Bridge #1867; TransformerEngine's
  `thd_get_partitioned_indices`). Each document is padded to a multiple of `2 * size` tokens and
  cut into `2 * size` equal chunks; rank `r` takes chunks `r` and `2 * size - 1 - r` of every
  document (the "zigzag": an early and a late chunk, so a document's causal work is even over
  the ranks where its padded length is its length; the padding of short documents is real
  tokens' work nowhere, so on many short documents a rank's real work reaches up to `size`
  times the mean: at size 4, 4x on one-token documents (rank 0 holds them all), 2x on
  three-token ones, 1.44x on lengths 1-8; `balanced` deals it evenly, within ~3%). `cu_seqlens` (the
  documents' real lengths) and `cu_seqlens_padded` (their padded offsets) are global, as
  TransformerEngine's THD attention takes them with `cp_size` / `cp_rank`.
- `style="balanced"`: the load-balanced split of torchtitan's varlen context parallelism
  (torchtitan #3431). The row is padded to a multiple of `size * block` tokens (the padding is
  one more document) and cut into blocks of `block` tokens; a block's work is the sum over its
  tokens of `t - doc_start(t) + 1` (what a token costs under document-causal attention); the
  blocks, heaviest first, are dealt to the ranks in snake order (0 .. size-1, size-1 .. 0, ...),
  each rank the same number, and each rank keeps its blocks in sequence order.

Every rank gets the same number of tokens. `token_index` (int64) is where each of its tokens sits
in the global padded layout (`global_tokens` long), `doc_index` (int32) its document, so a rank's
queries attend to the keys of the global layout with the rule: same document, key position <=
query position, key a real token (position < the document's length), positions here being
places in the global layout (`token_index` minus the document's offset): the padding's
`position_ids` wrap at `position_limit` (see `cp_split`). Padding carries no loss:
labels -100 and `loss_weights` 0. `loss_weights` (float32) is 1 / `num_targets` on every
labelled position, `num_targets` the labelled positions of the whole batch, so the sum over the
ranks of `sum(token_loss * loss_weights)` is the batch's token-mean loss with no all-reduce of
counts; `doc_targets` and `doc_ids` stay global (per-document normalisation), with an entry for
the balanced style's padding document. Pure numpy on the
host, per batch: no cost grows with the dataset.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from packtool.errors import ConfigError

IGNORE = -100
STYLES = ("megatron", "balanced")
PER_DOCUMENT = ("doc_ids", "doc_targets", "source")
"""Keys of the batch with one value per document: handed on whole to every rank."""
PADDING_ENTRY = {"doc_ids": -1, "doc_targets": 0, "source": -1}
"""Their value for a padding document (as the static-shape padding of loader/collate.py), so
they stay indexable by `doc_index` when the balanced style pads the row."""


def check_cp(size: int, rank: int, style: str, block: int) -> None:
    """Raise `ConfigError` for a group size, rank, style or block size that cannot be used."""
    for name, value in (("context-parallel size", size), ("context-parallel block", block)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < size:
        raise ConfigError(f"context-parallel rank must be in 0..{size - 1}, got {rank!r}")
    if style not in STYLES:
        raise ConfigError(
            f"context-parallel style {style!r} is unknown; choose {' or '.join(STYLES)}"
        )


def cp_split(
    batch: dict[str, Any],
    size: int,
    rank: int,
    style: str = "megatron",
    block: int = 64,
    *,
    position_limit: int | None = None,
    pad_id: int = 0,
    pin_memory: bool = False,
) -> dict[str, Any]:
    """Rank `rank`'s share of a packtool-layout `batch` for a context-parallel group of `size`
    (see the module docstring for the keys and the two styles).

    The padding the split adds takes its place in its padded document as position, wrapped at
    `position_limit` (the model's max_len, as `collate` wraps its padding; None: one past the
    batch's largest position), so every position stays inside a position table. The real
    tokens keep the batch's positions. `pin_memory`: the share's tensors in pinned memory
    (where CUDA is), as `collate` allocates a batch (the split makes new ones).

    Raises:
        ConfigError: bad `size`, `rank`, `style`, `block` or `position_limit`, or a batch of
            the hf layout.
    """
    check_cp(size, rank, style, block)
    for name, value, low in (("position_limit", position_limit, 1), ("pad_id", pad_id, 0)):
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, np.integer))
            or not low <= value < 2**63
        ):
            raise ConfigError(f"{name} must be an integer from {low} to 2**63-1, got {value!r}")
    if "cu_seqlens" not in batch:
        raise ConfigError("context parallelism splits packtool-layout batches (layout='packtool')")
    ids = batch["input_ids"].numpy()
    labels = batch["labels"].numpy()
    positions = batch["position_ids"].numpy()
    cu = batch["cu_seqlens"].numpy().astype(np.int64)
    lens = np.diff(cu)
    if style == "megatron":
        unit = 2 * size
        padded = -(-lens // unit) * unit
    else:
        padded = lens.copy()
        total = int(lens.sum())
        tail = -(-total // (size * block)) * size * block - total
        if tail or not len(lens):
            padded = np.append(padded, tail)  # the padding: one more document
            lens = np.append(lens, 0)
    offsets = np.zeros(len(padded) + 1, np.int64)
    np.cumsum(padded, out=offsets[1:])
    n_global = int(offsets[-1])
    # The global padded layout: each document's real tokens first, then its padding.
    doc = np.repeat(np.arange(len(padded), dtype=np.int64), padded)
    pos_in_doc = np.arange(n_global, dtype=np.int64) - offsets[doc]
    real = pos_in_doc < lens[doc]
    g_ids = np.full(n_global, pad_id, ids.dtype)
    g_labels = np.full(n_global, IGNORE, np.int64)
    source = cu[doc[real]] + pos_in_doc[real]  # where each real token sits in `batch`
    g_ids[real] = ids[source]
    g_labels[real] = labels[source]
    if position_limit is None:
        position_limit = int(positions.max()) + 1 if len(positions) else 1
    g_pos = pos_in_doc % position_limit
    g_pos[real] = positions[source]
    if style == "megatron":
        index = _zigzag(offsets, padded // (2 * size), size, rank)
    else:
        work = np.where(real, pos_in_doc + 1, 0)
        index = _balanced(work, size, rank, block)
    num_targets = int((g_labels != IGNORE).sum())
    local_labels = g_labels[index]
    weights = np.where(local_labels != IGNORE, 1.0 / max(num_targets, 1), 0.0).astype(np.float32)
    out: dict[str, Any] = {
        "input_ids": torch.from_numpy(g_ids[index].astype(np.int64)),
        "labels": torch.from_numpy(local_labels),
        "position_ids": torch.from_numpy(g_pos[index]),
        "loss_weights": torch.from_numpy(weights),
        "token_index": torch.from_numpy(index),
        "doc_index": torch.from_numpy(doc[index].astype(np.int32)),
        "global_tokens": n_global,
        "global_cu_seqlens": torch.from_numpy(offsets.astype(np.int32)),
        "doc_lengths": torch.from_numpy(lens.astype(np.int32)),
        "num_targets": num_targets,
        "cp_size": size,
        "cp_rank": rank,
    }
    for key in PER_DOCUMENT:  # global, as the documents are
        if key in batch:
            out[key] = batch[key]
            if len(batch[key]) < len(lens):  # balanced style's padding: one more entry
                extra = len(lens) - len(batch[key])
                fill = PADDING_ENTRY[key]
                out[key] = torch.cat([batch[key], batch[key].new_full((extra,), fill)])
    if "seq_idx" in batch:  # the document of each of this rank's tokens
        out["seq_idx"] = out["doc_index"]
    if style == "megatron":
        real_cu = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=real_cu[1:])
        out["cu_seqlens"] = torch.from_numpy(real_cu.astype(np.int32))
        out["cu_seqlens_padded"] = out["global_cu_seqlens"]
        out["max_seqlen"] = int(padded.max()) if len(padded) else 0
    if pin_memory and torch.cuda.is_available():
        out = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in out.items()}
    return out


def _zigzag(offsets: np.ndarray, chunk: np.ndarray, size: int, rank: int) -> np.ndarray:
    """The global positions of chunks `rank` and `2 * size - 1 - rank` of every document."""
    starts = np.stack(
        [offsets[:-1] + rank * chunk, offsets[:-1] + (2 * size - 1 - rank) * chunk], 1
    )
    return _ranges(starts.reshape(-1), np.repeat(chunk, 2))


def _balanced(work: np.ndarray, size: int, rank: int, block: int) -> np.ndarray:
    """The positions of the blocks dealt to `rank`: heaviest first, in snake order."""
    n_blocks = len(work) // block
    per_block = work.reshape(n_blocks, block).sum(axis=1)
    order = np.argsort(-per_block, kind="stable")
    rounds = np.arange(n_blocks) // size
    seat = np.arange(n_blocks) % size
    owner = np.where(rounds % 2 == 0, seat, size - 1 - seat)
    mine = np.sort(order[owner == rank])
    return _ranges(mine * block, np.full(len(mine), block, np.int64))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """`concat(arange(s, s + n) for s, n in zip(starts, lengths))`, in numpy."""
    total = int(lengths.sum())
    first = np.zeros(len(lengths), np.int64)
    np.cumsum(lengths[:-1], out=first[1:])
    return (np.repeat(starts - first, lengths) + np.arange(total, dtype=np.int64)).astype(np.int64)
