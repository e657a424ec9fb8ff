"""TRL's SFTTrainer on a packtool dataset, taken as already packed (padding-free)."""

from __future__ import annotations

import copy

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loader.hf import CheckPackedModel, hf_dataset
from loader.testing import write_dataset
from packtool.errors import ConfigError
from packtool.manifest import read_manifest

from .hf_helpers import (
    VOCAB,
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    per_document_loss,
    random_rows,
    tiny_model,
)


def word_tokenizer():
    """A tokenizer over ids 0..VOCAB-1 (SFTTrainer needs one; here only for its pad token)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(VOCAB)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="0")),
        pad_token="0",
        eos_token="1",
    )


def sft_config(out, **overrides):
    from trl import SFTConfig

    settings = dict(
        padding_free=True,
        max_length=None,
        bf16=False,  # TRL's default is bf16; the comparison is in fp32
        dataset_kwargs={"skip_prepare_dataset": True},
        per_device_train_batch_size=3,
        max_steps=4,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1000,
        disable_tqdm=True,
        seed=0,
    )
    settings.update(overrides)
    return SFTConfig(str(out), **settings)


def documents_of(flat: list[int], rows: list[dict]) -> list[torch.Tensor]:
    """The stored documents of the rows a flat batch is made of (rows found by their tokens)."""
    by_start = {tuple(r["input_ids"][:12]): r for r in rows}
    docs, pos = [], 0
    while pos < len(flat):
        row = next(r for k, r in by_start.items() if tuple(flat[pos : pos + len(k)]) == k)
        assert flat[pos : pos + len(row["input_ids"])] == row["input_ids"]
        offsets = row["doc_offsets"]
        docs += [
            torch.tensor(row["input_ids"][a:b]) for a, b in zip(offsets, offsets[1:], strict=False)
        ]
        pos += len(row["input_ids"])
    return docs


def test_sft_trainer_trains_on_packtool_rows_with_the_per_document_loss(tmp_path):
    from trl import SFTTrainer

    path = tmp_path / "ds"
    write_dataset(path, random_rows(30, seed=6), max_len=48, rows_per_shard=10)
    m = read_manifest(path)
    stored = pa.concat_tables(pq.read_table(path / s.file) for s in m.shards).to_pylist()
    model = tiny_model("llama")
    initial = copy.deepcopy(model)
    seen = []

    class Recording(SFTTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            seen.append((inputs["input_ids"][0].tolist(), loss.item()))
            return loss

    trainer = Recording(
        model=model,
        args=sft_config(tmp_path / "out"),
        train_dataset=hf_dataset(path, cache_dir=tmp_path / "c"),
        processing_class=word_tokenizer(),
        callbacks=[CheckPackedModel()],
    )
    trainer.train()
    assert len(seen) == 4
    flat, loss = seen[0]
    docs = documents_of(flat, stored)
    assert len(docs) > 3  # three rows' documents
    with torch.no_grad():
        ref = per_document_loss(initial, docs).item()
    assert abs(loss - ref) <= 1e-5
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(
        not torch.equal(a, b) for a, b in zip(model.parameters(), initial.parameters(), strict=True)
    )


def test_check_callback_refuses_a_leaking_model_under_sft_trainer(tmp_path):
    from trl import SFTTrainer

    path = tmp_path / "ds"
    write_dataset(path, random_rows(6, seed=1), max_len=48)
    trainer = SFTTrainer(
        model=tiny_model("gpt2"),
        # TRL checkpoints activations by default, which turns the cache off in training.
        args=sft_config(tmp_path / "out", use_cache=True, activation_checkpointing=False),
        train_dataset=hf_dataset(path, cache_dir=tmp_path / "c"),
        processing_class=word_tokenizer(),
        callbacks=[CheckPackedModel()],
    )
    with pytest.raises(ConfigError, match="use_cache is on"):
        trainer.train()
