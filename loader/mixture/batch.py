"""A mixture batch's sources: `HFMixedBatch` (the hf layout's batch, `source` an attribute),
`batch_sources` and `token_sources` (each document's and each token's source, either layout).

`loader.mixture.dataset` re-exports them (`loader.token_sources`).
"""

from __future__ import annotations

from typing import Any

import torch

from packtool.errors import ConfigError


class HFMixedBatch(dict):
    """A `layout="hf"` mixture batch: exactly the keys of `PackedDataset`'s hf batch, so
    `model(**batch)` and `loader.hf.check_packed_model` take it unchanged, and the
    per-document source as the attribute `source` (int64 `(n_docs,)`). Trainer trains on a
    `MixedDataset` through `loader.hf.PackedTrainer` (a plain `Trainer`'s loader would batch
    these batches again).

    Not a key: transformers hands keys its forward does not name on to attention and loss
    (`source` is a parameter of its cross entropy, so `model(**batch)` would fail). A copy
    made by a device move (`type(batch)({...})`) has `source` None: read it first.
    """

    source: torch.Tensor | None = None


def batch_sources(batch: dict[str, Any]) -> torch.Tensor:
    """The per-document source of a mixture batch, either layout (`source`)."""
    source = batch["source"] if "source" in batch else getattr(batch, "source", None)
    if source is None:
        raise ConfigError(
            "this batch carries no mixture sources (not a MixedDataset batch, or an hf batch "
            "copied by a device move: read batch.source before moving it)"
        )
    return source


def token_sources(batch: dict[str, Any]) -> torch.Tensor:
    """The source of every token of a mixture batch, int64 `(total_tokens,)` (-1 for padding),
    from its per-document `source` and `cu_seqlens` (either layout): e.g. to average a
    per-token loss by source. A context-parallel share (`cp_split`): of each of this rank's
    tokens, by its `doc_index` (the batch's `cu_seqlens` are the whole batch's, not the
    share's: they gave another length and other sources), -1 for the padding the split adds
    (a place past its document's length)."""
    if "doc_index" in batch:
        doc = batch["doc_index"].long()
        start = batch["global_cu_seqlens"].long()[doc]
        real = batch["token_index"].long() - start < batch["doc_lengths"].long()[doc]
        return torch.where(real, batch_sources(batch)[doc], -1)
    cu = batch["cu_seqlens"] if "cu_seqlens" in batch else batch["cu_seq_lens_q"]
    return torch.repeat_interleave(batch_sources(batch), torch.diff(cu).long())
