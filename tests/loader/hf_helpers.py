"""Tiny random transformers models, packed datasets and per-document references (HF tests)."""

from __future__ import annotations

import numpy as np
import torch

VOCAB = 96


def tiny_model(arch: str = "llama", impl: str = "sdpa", *, vocab: int = VOCAB, seed: int = 0):
    """A 2-layer random model (fp32, no dropout) with `attn_implementation=impl`."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.manual_seed(seed)
    if arch == "llama":
        config = LlamaConfig(
            vocab_size=vocab,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            attn_implementation=impl,
        )
        return LlamaForCausalLM(config)
    if arch == "gpt2":
        config = GPT2Config(
            vocab_size=vocab,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=128,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=0,
            eos_token_id=0,
            attn_implementation=impl,
        )
        return GPT2LMHeadModel(config)
    raise ValueError(arch)


def random_rows(n_rows: int, *, seed: int, max_len: int = 48, vocab: int = VOCAB) -> list:
    """Rows of 1-4 random documents (lengths 1..20, at most max_len tokens a row)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        docs, used = [], 0
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, 21))
            if used + n > max_len:
                break
            docs.append(rng.integers(2, vocab, n).tolist())
            used += n
        rows.append(docs or [[int(rng.integers(2, vocab))]])
    return rows


def counting_rows(n_rows: int, *, seed: int, vocab: int = VOCAB) -> list:
    """Learnable rows: each document counts up from a random start (mod vocab)."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        docs = []
        for _ in range(3):
            start, n = int(rng.integers(0, vocab)), int(rng.integers(4, 13))
            docs.append([(start + i) % vocab for i in range(n)])
        rows.append(docs)
    return rows


def documents(batch: dict) -> list[torch.Tensor]:
    """The documents of a `layout="hf"` batch, cut at its cu_seq_lens."""
    cu = batch["cu_seq_lens_q"].tolist()
    ids = batch["input_ids"].reshape(-1)
    return [ids[a:b] for a, b in zip(cu[:-1], cu[1:], strict=True)]


def per_document_loss(model, docs: list[torch.Tensor]) -> torch.Tensor:
    """Mean next-token loss over every document run through `model` alone (no cache)."""
    total, count = torch.zeros(()), 0
    for doc in docs:
        if len(doc) < 2:
            continue
        out = model(input_ids=doc[None], labels=doc[None], use_cache=False)
        total = total + out.loss * (len(doc) - 1)
        count += len(doc) - 1
    return total / count


def logit_gap(model, batch: dict, **kwargs) -> float:
    """Largest |packed logit - logit of the document run alone| over the batch (no grad)."""
    with torch.no_grad():
        packed = model(**batch, **kwargs).logits[0]
        alone = torch.cat(
            [model(input_ids=d[None], use_cache=False).logits[0] for d in documents(batch)]
        )
    return float((packed - alone).abs().max())
