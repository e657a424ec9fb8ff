"""A tiny batch builder and a plain per-document attention reference for the attention tests.

Built here from token-id lists so the tests never depend on loader/.
"""

from __future__ import annotations

import torch


def make_batch(docs: list[list[int]]) -> dict:
    """The loader batch dict (docs/CONTRACTS.md) for documents given as token-id lists."""
    lengths = [len(d) for d in docs]
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    input_ids = torch.tensor([t for d in docs for t in d], dtype=torch.int64)
    position_ids = torch.tensor([i for n in lengths for i in range(n)], dtype=torch.int64)
    # labels[t] = input_ids[t + 1] inside a document, -100 at each document's last token.
    labels = torch.tensor(
        [d[i + 1] if i + 1 < len(d) else -100 for d in docs for i in range(len(d))],
        dtype=torch.int64,
    )
    return {
        "input_ids": input_ids,
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "max_seqlen": max(lengths, default=0),
        "position_ids": position_ids,
        "labels": labels,
        "doc_ids": torch.arange(len(docs), dtype=torch.int64),
    }


def cu_from_lengths(lengths: list[int], device: str | torch.device = "cpu") -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    lengths: list[int],
    *,
    causal: bool,
    scale: float,
    left: int = -1,
    right: int = -1,
) -> torch.Tensor:
    """Each document on its own: softmax(q k^T * scale + causal/window mask) v, with einsum.

    ``left``/``right``: keys j with i - left <= j <= i + right are kept (-1 = unbounded).
    """
    group = q.shape[1] // k.shape[1]
    outs = []
    start = 0
    for n in lengths:
        qd, kd, vd = q[start : start + n], k[start : start + n], v[start : start + n]
        start += n
        if n == 0:
            continue
        kd = kd.repeat_interleave(group, dim=1)  # query head h reads kv head h // group
        vd = vd.repeat_interleave(group, dim=1)
        scores = torch.einsum("ihd,jhd->hij", qd, kd) * scale  # (H, L, L)
        i = torch.arange(n)[:, None]
        j = torch.arange(n)[None, :]
        keep = torch.ones(n, n, dtype=torch.bool)
        if causal:
            keep &= j <= i
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
        scores = scores.masked_fill(~keep, float("-inf"))
        outs.append(torch.einsum("hij,jhd->ihd", scores.softmax(dim=-1), vd))
    if not outs:
        return q.new_zeros(q.shape)
    return torch.cat(outs)


def make_sft_batch(docs: list[list[int]], masks: list[list[int]]) -> dict:
    """`make_batch` with a loss mask: the target t + 1 of position t must be supervised.

    As the loader builds it (docs/CONTRACTS.md): labels -100 where the next token is masked,
    and `doc_targets`, the labelled positions per document.
    """
    batch = make_batch(docs)
    flat_mask = [m for d in masks for m in d]
    labels = batch["labels"].clone()
    pos = 0
    for d in docs:
        for i in range(len(d) - 1):
            if not flat_mask[pos + i + 1]:
                labels[pos + i] = -100
        pos += len(d)
    batch["labels"] = labels
    counts, pos = [], 0
    for d in docs:
        counts.append(int((labels[pos : pos + len(d)] != -100).sum()))
        pos += len(d)
    batch["doc_targets"] = torch.tensor(counts, dtype=torch.int64)
    return batch
