"""Tiny random transformers models, packed datasets and per-document references (HF tests)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.torch_threads import one_torch_thread  # noqa: F401  (re-exported: autouse)

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
    if arch in LEAKING_ARCHS:
        return _leaking_model(arch, impl, vocab)
    raise ValueError(arch)


LEAKING_ARCHS = ("opt", "biogpt", "xglm")
"""Architectures whose forward takes position_ids but builds no block-diagonal mask from them
(transformers 5.x calls create_causal_mask without position_ids): packed documents see each
other under sdpa and eager. XGLM has no sdpa."""


def _leaking_model(arch: str, impl: str, vocab: int):
    import transformers as tf

    common = {"vocab_size": vocab, "attn_implementation": impl, "max_position_embeddings": 128}
    if arch == "opt":
        config = tf.OPTConfig(
            hidden_size=32,
            ffn_dim=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            word_embed_proj_dim=32,
            dropout=0.0,
            **common,
        )
        return tf.OPTForCausalLM(config)
    if arch == "biogpt":
        config = tf.BioGptConfig(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            **common,
        )
        return tf.BioGptForCausalLM(config)
    config = tf.XGLMConfig(
        d_model=32, ffn_dim=64, num_layers=2, attention_heads=4, dropout=0.0, **common
    )
    return tf.XGLMForCausalLM(config)


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


ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "integrations.md"


def snippet(name: str) -> str:
    """The python block after `<!-- snippet: name -->` in docs/integrations.md."""
    text = DOCS.read_text(encoding="utf-8")
    match = re.search(rf"<!-- snippet: {name} -->\n```python\n(.*?)\n```", text, re.S)
    assert match, f"no snippet {name!r} in {DOCS}"
    return match.group(1)


def shell_commands() -> list[str]:
    """The `packtool ...` lines of the page's bash blocks."""
    text = DOCS.read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", text, re.S)
    return [line for b in blocks for line in b.splitlines() if line.startswith("packtool ")]


def docs_workspace(folder: Path) -> Path:
    """What the page starts from: corpus.jsonl (40 sample documents), tok/tokenizer.json (a BPE
    trained on them), sft.parquet (those documents tokenized, `labels` -100 on each one's first
    third: a made-up prompt), then the page's own `packtool pack` commands, run in `folder`."""
    import shlex

    from click.testing import CliRunner
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from packtool.cli.commands import cli

    folder.mkdir(parents=True, exist_ok=True)
    lines = (ROOT / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:40]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [json.loads(line)["text"] for line in lines]
    bpe.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    (folder / "tok").mkdir()
    bpe.save(str(folder / "tok" / "tokenizer.json"))
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [e.ids[:120] for e in bpe.encode_batch(texts)]
    labels = [[-100] * (len(d) // 3) + d[len(d) // 3 :] for d in ids]
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), folder / "sft.parquet")
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        for command in shell_commands():
            result = CliRunner().invoke(cli, shlex.split(command)[1:])
            assert result.exit_code == 0, result.output
    finally:
        os.chdir(cwd)
    return folder


@pytest.fixture(autouse=True, scope="module")
def gc_skips_the_imports():
    """Every `Trainer.train()` runs a full `gc.collect()` (accelerate's `free_memory`), which
    walked the ~0.5M objects torch, transformers and pytest hold: ~0.3-0.5 s a run, nearly half
    of these tests' time. Frozen (`gc.freeze`) after one collection, those objects are left out
    of every collection until the module ends; what the tests make is still collected."""
    import gc

    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def recording_trainer(
    train, out, *, ga: int, epochs: int = 1, stop_at=None, workers=0, args_type=None, **overrides
):
    """A `loader.hf.PackedTrainer` on `train` (a PackedDataset or MixedDataset) with the tiny
    Llama model, CPU settings the Trainer tests share, `trainer.seen`: each training step's
    `(input_ids, loss)`, and `trainer.docs`: the documents trained on, in order (token tuples).
    `stop_at`: save and stop at that global step. `args_type`: a `TrainingArguments` subclass
    to make the arguments with."""
    from transformers import TrainerCallback, TrainingArguments

    from loader.hf import PackedTrainer

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == stop_at:
                control.should_save = control.should_training_stop = True

    class Recording(PackedTrainer):
        seen: list

        def training_step(self, model, inputs, *args, **kwargs):
            loss = super().training_step(model, inputs, *args, **kwargs)
            self.seen.append((inputs["input_ids"].clone(), loss.item()))
            self.docs.extend(tuple(d.tolist()) for d in documents(inputs))
            return loss

    settings = dict(
        num_train_epochs=epochs,
        gradient_accumulation_steps=ga,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        save_strategy="no",
        report_to=[],
        logging_steps=1000,
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=workers,
        seed=0,
    )
    settings.update(overrides)
    trainer = Recording(
        model=tiny_model("llama"),
        args=(args_type or TrainingArguments)(str(out), **settings),
        train_dataset=train,
        callbacks=[StopAt()] if stop_at else [],
    )
    trainer.seen, trainer.docs = [], []
    return trainer


def assert_same_steps(resumed: list, seen: list) -> None:
    """Two `recording_trainer` runs' steps, `(input_ids, loss)` each: the same batches, the
    same losses (to 1e-6)."""
    assert len(resumed) == len(seen)
    for (a, la), (b, lb) in zip(resumed, seen, strict=True):
        assert torch.equal(a, b)
        assert abs(la - lb) < 1e-6
