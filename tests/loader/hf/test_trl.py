"""TRL's SFTTrainer on a packtool dataset, taken as already packed (padding-free): straight from
`datasets.load_dataset` on a `packtool pack` folder, and through `hf_dataset` with a loss mask."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner

from loader.hf import CheckPackedModel, hf_dataset
from loader.testing import write_dataset
from packtool.cli.commands import cli
from packtool.dataset.manifest import read_manifest
from packtool.errors import ConfigError
from tests.loader.hf_helpers import (
    VOCAB,
    gc_skips_the_imports,  # noqa: F401  (autouse: gc.freeze after the imports)
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    per_document_loss,
    random_rows,
    tiny_model,
)


def word_tokenizer(vocab_size: int = VOCAB):
    """A tokenizer over ids 0..vocab_size-1 (SFTTrainer needs one; here only for its pad token)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {str(i): i for i in range(vocab_size)}
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


def documents_of(flat: list[int], rows: list[dict], *, masks: bool = False) -> list:
    """The stored documents of the rows a flat batch is made of (rows found by their tokens),
    cut at the stored doc_offsets; with `masks`, (tokens, loss_mask) pairs."""
    by_start = {tuple(r["input_ids"][:12]): r for r in rows}
    assert len(by_start) == len(rows)  # rows are told apart by their first tokens
    docs, pos = [], 0
    while pos < len(flat):
        row = next(r for k, r in by_start.items() if tuple(flat[pos : pos + len(k)]) == k)
        assert flat[pos : pos + len(row["input_ids"])] == row["input_ids"]
        offsets = row["doc_offsets"]
        for a, b in zip(offsets, offsets[1:], strict=False):
            doc = torch.tensor(row["input_ids"][a:b])
            docs.append((doc, torch.tensor(list(row["loss_mask"][a:b]))) if masks else doc)
        pos += len(row["input_ids"])
    return docs


def stored_rows(path) -> list[dict]:
    m = read_manifest(path)
    return pa.concat_tables(pq.read_table(path / s.file) for s in m.shards).to_pylist()


class Recording:
    """An SFTTrainer subclass that records each step's flat input_ids and loss."""

    def __new__(cls, **kwargs):
        from trl import SFTTrainer

        seen: list = []

        class _Recording(SFTTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
                seen.append((inputs["input_ids"][0].tolist(), loss.item()))
                return loss

        trainer = _Recording(**kwargs)
        trainer.seen = seen
        return trainer


def pack_cli(*args: str) -> None:
    result = CliRunner().invoke(cli, ["pack", *args, "--workers", "1", "--shard-rows", "8"])
    assert result.exit_code == 0, result.output


BYTE_VOCAB = 258  # packtool's byte tokenizer: 256 bytes, EOS, BOS


@pytest.fixture(scope="module")
def packed_text(tmp_path_factory):
    """A `packtool pack` folder (byte tokenizer) of short random texts, as packtool writes it."""
    folder = tmp_path_factory.mktemp("trl_text")
    rng = np.random.default_rng(5)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    with (folder / "corpus.jsonl").open("w") as f:
        for _ in range(120):
            text = "".join(rng.choice(letters, int(rng.integers(4, 40))))
            f.write(json.dumps({"text": text}) + "\n")
    pack_cli(str(folder / "corpus.jsonl"), "-o", str(folder / "packed"), "--max-len", "64")
    return folder / "packed"


def load(how: str, path, cache):
    """The dataset as a user gets it: `datasets.load_dataset` as typed, or `hf_dataset`."""
    import datasets

    if how == "load_dataset(folder)":
        return datasets.load_dataset(str(path), split="train", cache_dir=cache)
    if how == "load_dataset(parquet, data_dir)":
        return datasets.load_dataset(
            "parquet", data_dir=str(path), data_files="*.parquet", split="train", cache_dir=cache
        )
    return hf_dataset(path, cache_dir=cache)


@pytest.mark.parametrize("how", ["load_dataset(folder)", "load_dataset(parquet, data_dir)"])
def test_sft_trainer_trains_on_load_dataset_of_a_pack_folder_as_it_is(packed_text, tmp_path, how):
    """No conversion code: the stored rows (with the seq_lengths pack writes) go to SFTTrainer."""
    train = load(how, packed_text, str(tmp_path / "c"))
    assert "seq_lengths" in train.column_names
    model = tiny_model("llama", vocab=BYTE_VOCAB)
    initial = copy.deepcopy(model)
    trainer = Recording(
        model=model,
        args=sft_config(tmp_path / "out"),
        train_dataset=train,
        processing_class=word_tokenizer(BYTE_VOCAB),
        callbacks=[CheckPackedModel()],
    )
    trainer.train()
    assert len(trainer.seen) == 4
    flat, loss = trainer.seen[0]
    docs = documents_of(flat, stored_rows(packed_text))
    assert len(docs) > 3  # three rows' documents
    with torch.no_grad():
        ref = per_document_loss(initial, docs).item()
    assert abs(loss - ref) <= 1e-5


def test_sft_trainer_trains_on_packtool_rows_with_the_per_document_loss(tmp_path):
    """An older dataset (no stored seq_lengths) through hf_dataset, which computes them."""
    path = tmp_path / "ds"
    write_dataset(path, random_rows(30, seed=6), max_len=48, rows_per_shard=10)
    stored = stored_rows(path)
    assert "seq_lengths" not in stored[0]
    model = tiny_model("llama")
    initial = copy.deepcopy(model)
    trainer = Recording(
        model=model,
        args=sft_config(tmp_path / "out"),
        train_dataset=hf_dataset(path, cache_dir=tmp_path / "c"),
        processing_class=word_tokenizer(),
        callbacks=[CheckPackedModel()],
    )
    trainer.train()
    seen = trainer.seen
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


def test_check_callback_refuses_sft_trainer_without_padding_free(packed_text, tmp_path):
    """TRL's default (padding_free=False) pads each packed row as one sequence with an
    attention_mask: its documents would attend to each other, with a model that passes."""
    train = load("load_dataset(folder)", packed_text, str(tmp_path / "c"))
    trainer = Recording(
        model=tiny_model("llama", vocab=BYTE_VOCAB),
        args=sft_config(tmp_path / "out", padding_free=False),
        train_dataset=train,
        processing_class=word_tokenizer(BYTE_VOCAB),
        callbacks=[CheckPackedModel()],
    )
    with pytest.raises(ConfigError, match=r"attention_mask.*SFTConfig\(padding_free=True\)"):
        trainer.train()
    assert trainer.seen == []  # refused before the first step


def streamed(how: str, path):
    import datasets

    if how == "hf_dataset(streaming=True)":
        return hf_dataset(path, streaming=True)
    return datasets.load_dataset(str(path), split="train", streaming=True)


@pytest.mark.parametrize("how", ["hf_dataset(streaming=True)", "load_dataset(streaming=True)"])
def test_check_callback_looks_at_the_first_batch_of_a_streaming_dataset(packed_text, tmp_path, how):
    """A streaming dataset is an IterableDataset too: its first row is taken from a fresh
    iterator, so the attention_mask batches of padding_free=False are refused all the same,
    and the run that is then allowed still starts at the first row."""
    trainer = Recording(
        model=tiny_model("llama", vocab=BYTE_VOCAB),
        args=sft_config(tmp_path / "out", padding_free=False),
        train_dataset=streamed(how, packed_text),
        processing_class=word_tokenizer(BYTE_VOCAB),
        callbacks=[CheckPackedModel()],
    )
    with pytest.raises(ConfigError, match=r"attention_mask.*SFTConfig\(padding_free=True\)"):
        trainer.train()
    assert trainer.seen == []  # refused before the first step
    trainer = Recording(
        model=tiny_model("llama", vocab=BYTE_VOCAB),
        args=sft_config(tmp_path / "out2", max_steps=1),
        train_dataset=streamed(how, packed_text),
        processing_class=word_tokenizer(BYTE_VOCAB),
        callbacks=[CheckPackedModel()],
    )
    trainer.train()
    rows = stored_rows(packed_text)
    flat = trainer.seen[0][0]
    assert flat[: len(rows[0]["input_ids"])] == rows[0]["input_ids"]  # nothing was consumed


def test_first_batch_leaves_packtools_own_datasets_and_one_pass_iterators_alone(tmp_path):
    from types import SimpleNamespace

    from torch.utils.data import IterableDataset

    from loader import PackedDataset
    from loader.hf.trainer import first_batch

    class OnePass(IterableDataset):
        def __init__(self):
            self.rows = iter([{"input_ids": [5]}, {"input_ids": [6]}])

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.rows)

    path = tmp_path / "ds"
    write_dataset(path, random_rows(4, seed=2), max_len=48)
    own = PackedDataset(path, rows_per_batch=2, layout="hf")
    one_pass = OnePass()
    for dataset in (own, one_pass):
        assert first_batch(SimpleNamespace(dataset=dataset, collate_fn=list)) is None
    assert next(one_pass) == {"input_ids": [5]}  # nothing taken
    stream = hf_dataset(path, streaming=True)
    got = first_batch(SimpleNamespace(dataset=stream, collate_fn=list))
    assert got == [next(iter(stream))]


# --- a loss mask: TRL trains on the supervised tokens only -----------------------------------


def conversations(n: int, *, seed: int, change_tails: bool = False):
    """Token ids and masks: a masked prompt, a supervised answer, then a masked tail (say, the
    next user turn). `change_tails` changes every tail token and nothing else."""
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for _ in range(n):
        p, a, t = (int(k) for k in rng.integers(2, 9, 3))
        doc = rng.integers(2, 250, p + a + t)
        if change_tails:
            doc[p + a :] = (doc[p + a :] - 2 + 97) % 248 + 2  # another id in 2..249
        ids.append(doc.tolist())
        masks.append([0] * p + [1] * a + [0] * t)
    return ids, masks


def packed_sft(folder, **kw):
    """Pre-tokenized Parquet (input_ids, labels -100 off the mask) through `packtool pack`."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, masks = conversations(90, seed=11, **kw)
    labels = [
        [t if m else -100 for t, m in zip(d, k, strict=True)]
        for d, k in zip(ids, masks, strict=True)
    ]
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), folder / "sft.parquet")
    pack_cli(str(folder / "sft.parquet"), "-o", str(folder / "packed"), "--max-len", "64")
    return folder / "packed"


def masked_reference(model, docs) -> float:
    """Mean next-token loss over the supervised targets of every document run alone."""
    total, count = torch.zeros(()), 0
    with torch.no_grad():
        for doc, mask in docs:
            labels = torch.where(mask.bool(), doc, torch.full_like(doc, -100))
            n = int((labels[1:] != -100).sum())
            if n:
                out = model(input_ids=doc[None], labels=labels[None], use_cache=False)
                total, count = total + out.loss * n, count + n
    return (total / count).item()


def first_loss(path, out, how: str) -> tuple[float, list[int]]:
    model = tiny_model("llama", vocab=BYTE_VOCAB)
    trainer = Recording(
        model=model,
        args=sft_config(out, max_steps=1),
        train_dataset=load(how, path, str(out / "c")),
        processing_class=word_tokenizer(BYTE_VOCAB),
        callbacks=[CheckPackedModel()],
    )
    trainer.train()
    flat, loss = trainer.seen[0]
    return loss, flat


def test_sft_trainer_on_masked_rows_trains_on_the_supervised_tokens_only(tmp_path):
    path = packed_sft(tmp_path / "a")
    assert "loss_mask" in read_manifest(path).columns
    loss, flat = first_loss(path, tmp_path / "run", "hf_dataset")
    docs = documents_of(flat, stored_rows(path), masks=True)
    assert len(docs) > 3
    assert abs(loss - masked_reference(tiny_model("llama", vocab=BYTE_VOCAB), docs)) <= 1e-5
    # Changing masked tokens that no supervised token sees (the tails) changes only targets
    # outside the mask: the loss does not move. Trained on every token (load_dataset alone,
    # whose binary loss_mask TRL does not read), it does, so the check can fail.
    other = packed_sft(tmp_path / "b", change_tails=True)
    a, b = stored_rows(path), stored_rows(other)
    assert [r["doc_offsets"] for r in a] == [r["doc_offsets"] for r in b]  # same layout
    assert [r["input_ids"] for r in a] != [r["input_ids"] for r in b]
    changed, _ = first_loss(other, tmp_path / "run2", "hf_dataset")
    assert abs(changed - loss) <= 1e-6
    plain = [
        first_loss(p, tmp_path / f"plain{i}", "load_dataset(folder)")[0]
        for i, p in enumerate((path, other))
    ]
    assert abs(plain[0] - plain[1]) > 1e-4  # measured: 2.3e-3
