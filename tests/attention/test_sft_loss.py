"""Supervised fine-tuning batches: packing changes no logit, no loss term and no gradient.

A packed batch of conversations with loss masks (labels -100 on prompt targets) gives, within
1e-5 in fp32, the logits, the masked per-token losses, both loss normalisations and the
gradients of each conversation run alone; and a prompt token is never a target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention import ModelConfig, Transformer
from tests.attention.helpers import make_sft_batch

VOCAB = 61
TOL = 1e-5


def model(normalization: str = "token") -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        attn_backend="sdpa",
        loss_normalization=normalization,
    )
    return Transformer(cfg)  # fp32, a fixed seed


@st.composite
def conversations(draw):
    """Documents as (ids, mask): a prompt (mask 0), then an answer (mask 1), maybe twice."""
    docs = []
    for _ in range(draw(st.integers(1, 5))):
        ids, mask = [], []
        for _turn in range(draw(st.integers(1, 2))):
            p = draw(st.integers(1, 8))
            a = draw(st.integers(0, 8))
            ids += draw(st.lists(st.integers(0, VOCAB - 1), min_size=p + a, max_size=p + a))
            mask += [0] * p + [1] * a
        docs.append((ids, mask))
    return docs


def terms(m: Transformer, batch: dict) -> tuple[torch.Tensor, torch.Tensor, object]:
    with torch.no_grad():
        out = m(batch)
    per_token = F.cross_entropy(out.logits, batch["labels"], ignore_index=-100, reduction="none")
    return out.logits, per_token, out


def grads(m: Transformer, loss: torch.Tensor) -> list[torch.Tensor]:
    m.zero_grad(set_to_none=True)
    loss.backward()
    return [p.grad.clone() for p in m.parameters()]


@settings(max_examples=25, deadline=None)
@given(docs=conversations())
def test_packed_sft_batch_equals_each_conversation_alone(docs):
    m = model()
    ids, masks = [d for d, _ in docs], [k for _, k in docs]
    packed = make_sft_batch(ids, masks)
    logits, per_token, out = terms(m, packed)
    start, loss_sum, seq_sum, n_seq = 0, 0.0, 0.0, 0
    for d, k in docs:
        alone = make_sft_batch([d], [k])
        a_logits, a_terms, a_out = terms(m, alone)
        n = len(d)
        assert torch.allclose(logits[start : start + n], a_logits, atol=TOL, rtol=0)
        assert torch.allclose(per_token[start : start + n], a_terms, atol=TOL, rtol=0)
        loss_sum += float(a_out.loss_sum)
        if int(a_out.num_targets):
            seq_sum += float(a_out.loss_sum) / int(a_out.num_targets)
            n_seq += 1
        start += n
    assert abs(float(out.loss_sum) - loss_sum) <= TOL * max(1, len(docs))
    assert abs(float(out.sequence_loss_sum) - seq_sum) <= TOL * max(1, len(docs))
    assert int(out.num_sequences) == n_seq
    # Gradients: of the packed sums, and of the sums of the conversations alone.
    for which in ("loss_sum", "sequence_loss_sum"):
        g_packed = grads(m, getattr(m(packed), which))
        total = None
        for d, k in docs:
            g = grads(m, getattr(m(make_sft_batch([d], [k])), which))
            total = g if total is None else [a + b for a, b in zip(total, g, strict=True)]
        for a, b in zip(g_packed, total, strict=True):
            assert torch.allclose(a, b, atol=TOL, rtol=0), which


def test_the_two_normalisations_by_hand():
    docs = [[1, 2, 3, 4, 5], [6, 7, 8]]
    masks = [[0, 1, 1, 1, 1], [0, 0, 1]]  # 4 targets, then 1
    batch = make_sft_batch(docs, masks)
    assert batch["doc_targets"].tolist() == [4, 1]
    token, sequence = model("token"), model("sequence")
    _, per_token, out_t = terms(token, batch)
    out_s = sequence(batch)
    first, second = per_token[:5].sum() / 4, per_token[5:].sum() / 1
    assert torch.allclose(out_t.loss, per_token.sum() / 5, atol=TOL)
    assert torch.allclose(out_s.loss, (first + second) / 2, atol=TOL)
    # Without doc_targets (another loader's batch) the model counts them from the labels.
    del batch["doc_targets"]
    assert torch.allclose(sequence(batch).loss, out_s.loss, atol=TOL)
    # Labels masked after collate (the first document out of the loss): the weights follow the
    # labels, not a stale doc_targets.
    batch["doc_targets"] = torch.tensor([4, 1])
    batch["labels"][:5] = -100
    out = sequence(batch)
    assert out.num_sequences.item() == 1
    assert torch.allclose(out.loss, second, atol=TOL)


@settings(max_examples=25, deadline=None)
@given(docs=conversations(), data=st.data())
def test_changing_a_prompt_token_never_changes_a_loss_term(docs, data):
    m = model()
    ids, masks = [d for d, _ in docs], [k for _, k in docs]
    flat_mask = [x for k in masks for x in k]
    prompt = [t for t, x in enumerate(flat_mask) if not x]
    p = data.draw(st.sampled_from(prompt))
    before = make_sft_batch(ids, masks)
    flat = [t for d in ids for t in d]
    flat[p] = (flat[p] + 1) % VOCAB
    changed, at = [], 0
    for d in ids:
        changed.append(flat[at : at + len(d)])
        at += len(d)
    after = make_sft_batch(changed, masks)
    # No label names the prompt token: the labels are the same, token for token.
    assert torch.equal(before["labels"], after["labels"])
    if p:
        assert before["labels"][p - 1] == -100  # the position that would predict it
    # And no loss term before it moves (causal: nothing there sees it), in any document.
    _, t_before, _ = terms(m, before)
    _, t_after, _ = terms(m, after)
    assert torch.allclose(t_before[:p], t_after[:p], atol=TOL, rtol=0)
    doc_end = next(e for e in torch.cumsum(torch.tensor([len(d) for d in ids]), 0) if e > p)
    assert torch.allclose(t_before[doc_end:], t_after[doc_end:], atol=TOL, rtol=0)
