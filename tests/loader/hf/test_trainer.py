"""`PackedTrainer` (a real transformers Trainer) on a PackedDataset: epochs, exact resume."""

from __future__ import annotations

import math

import pytest
import torch

from loader import PackedDataset
from loader.testing import write_dataset
from packtool.errors import ConfigError
from tests.loader.hf_helpers import (
    assert_same_steps,
    counting_rows,
    gc_skips_the_imports,  # noqa: F401  (autouse: gc.freeze after the imports)
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    recording_trainer,
    tiny_model,
)

ROWS, RPB, GA, EPOCHS = 24, 4, 2, 3  # 6 batches = 3 optimizer steps per epoch, 9 in all


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("hft") / "ds"
    write_dataset(path, counting_rows(ROWS, seed=2), max_len=40, row_group_rows=4)
    return path


def make_trainer(data, out, *, stop_at=None, workers=0, **overrides):
    ds = PackedDataset(data, rows_per_batch=RPB, layout="hf", seed=7)
    return recording_trainer(
        ds, out, ga=GA, epochs=EPOCHS, stop_at=stop_at, workers=workers, **overrides
    )


@pytest.fixture(scope="module")
def full(data, tmp_path_factory):
    trainer = make_trainer(data, tmp_path_factory.mktemp("full"))
    trainer.train()
    metrics = trainer.evaluate(PackedDataset(data, rows_per_batch=RPB, layout="hf", shuffle=False))
    return trainer.seen, metrics


def epoch_stream(data, epoch):
    ds = PackedDataset(data, rows_per_batch=RPB, layout="hf", seed=7)
    ds.set_epoch(epoch)
    return [b["input_ids"] for b in ds]


def test_each_epoch_is_that_epochs_permutation_and_the_loss_goes_down(data, full):
    seen, metrics = full
    per_epoch = ROWS // RPB
    assert len(seen) == EPOCHS * per_epoch
    streams = [epoch_stream(data, e) for e in range(EPOCHS)]
    for e, stream in enumerate(streams):
        got = [ids for ids, _ in seen[e * per_epoch : (e + 1) * per_epoch]]
        assert all(torch.equal(a, b) for a, b in zip(got, stream, strict=True)), e
    assert not all(torch.equal(a, b) for a, b in zip(streams[0], streams[1], strict=True))
    losses = [loss for _, loss in seen]
    first, last = losses[:per_epoch], losses[-per_epoch:]
    assert sum(last) / per_epoch < 0.8 * sum(first) / per_epoch
    assert math.isfinite(metrics["eval_loss"]) and metrics["eval_loss"] < max(first)


@pytest.mark.parametrize("stop_at", [4, 3], ids=["mid-epoch-1", "end-of-epoch-0"])
def test_resume_from_checkpoint_continues_the_token_stream_exactly(data, full, tmp_path, stop_at):
    seen, _ = full
    first = make_trainer(data, tmp_path, stop_at=stop_at)
    first.train()
    (checkpoint,) = tmp_path.glob("checkpoint-*")
    # The resumed run also loads in a worker process: the stream does not depend on it.
    second = make_trainer(data, tmp_path, workers=1)
    second.train(resume_from_checkpoint=str(checkpoint))
    assert len(first.seen) == stop_at * GA
    assert_same_steps(first.seen + second.seen, seen)


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("ckpt")
    make_trainer(data, out, stop_at=4).train()
    (path,) = out.glob("checkpoint-*")
    return path


@pytest.mark.parametrize("delta", [1, -1])
def test_a_skip_count_other_than_packtools_fails_loudly(data, checkpoint, monkeypatch, delta):
    import transformers.trainer

    real = transformers.trainer.skip_first_batches
    monkeypatch.setattr(
        transformers.trainer, "skip_first_batches", lambda dl, n: real(dl, n + delta)
    )
    trainer = make_trainer(data, checkpoint.parent)
    with pytest.raises(RuntimeError, match=f"skipped {'more' if delta > 0 else 'fewer'} batches"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def test_settings_trainer_cannot_follow_are_refused(data, tmp_path):
    from transformers import TrainingArguments

    from loader.hf import PackedTrainer

    args = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[])
    cases = [
        (dict(tokens_per_batch=80), "tokens_per_batch the number of steps changes"),
        (dict(rows_per_batch=2, layout="packtool"), "layout='hf'"),
        (dict(rows_per_batch=2, layout="hf", rank=1, world_size=2), "rank 1 of 2"),
    ]
    for settings, message in cases:
        settings.setdefault("layout", "hf")
        with pytest.raises(ConfigError, match=message):
            PackedTrainer(
                model=tiny_model(), args=args, train_dataset=PackedDataset(data, **settings)
            )
    # it was ignored: the last batch still came short (the dataset makes the batches)
    drop = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], dataloader_drop_last=True)
    for role in ("train_dataset", "eval_dataset"):
        ds = PackedDataset(data, rows_per_batch=5, layout="hf")
        with pytest.raises(ConfigError, match=r"PackedDataset\(\.\.\., drop_last=True\)"):
            PackedTrainer(model=tiny_model(), args=drop, **{role: ds})
    cache_on = TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], use_cache=True)
    ds = PackedDataset(data, rows_per_batch=2, layout="hf")
    with pytest.raises(ConfigError, match="use_cache is on"):
        PackedTrainer(model=tiny_model(), args=cache_on, train_dataset=ds)


def test_a_plain_trainer_with_row_collator_trains_on_the_documents(data, tmp_path):
    import copy

    from transformers import Trainer, TrainingArguments

    from loader.hf import RowCollator, hf_dataset
    from tests.loader.hf_helpers import documents, per_document_loss

    seen = []

    class Recording(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            seen.append(({k: v for k, v in inputs.items()}, loss.item()))
            return loss

    args = TrainingArguments(
        str(tmp_path), max_steps=2, per_device_train_batch_size=3, use_cpu=True, report_to=[],
        remove_unused_columns=False, save_strategy="no", disable_tqdm=True,
    )  # fmt: skip
    model = tiny_model("gpt2")
    initial = copy.deepcopy(model)
    train = hf_dataset(data, cache_dir=tmp_path / "c")
    Recording(model=model, args=args, train_dataset=train, data_collator=RowCollator()).train()
    batch, loss = seen[0]
    assert "attention_mask" not in batch and len(documents(batch)) == 9  # 3 rows x 3 documents
    with torch.no_grad():
        assert abs(loss - per_document_loss(initial, documents(batch)).item()) <= 1e-5
