"""`PackedTrainer` (a real transformers Trainer) on a MixedDataset: the mixture's batches, read
once, its position saved with every checkpoint and resumed, Trainer's steps held to it."""

from __future__ import annotations

import json
import math
import warnings

import pytest
import torch

from loader import MixedDataLoader, MixedDataset
from loader.testing import write_dataset
from packtool.errors import ConfigError
from packtool.mixture.spec import MixtureSpec, SourceSpec
from tests.loader.hf_helpers import (
    assert_same_steps,
    counting_rows,
    gc_skips_the_imports,  # noqa: F401  (autouse: gc.freeze after the imports)
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    recording_trainer,
    tiny_model,
)

GA, STEPS = 2, 10  # 10 batches = 5 optimizer steps


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfmix")
    for name, n, seed in (("web", 16, 2), ("code", 6, 3)):
        write_dataset(root / name, counting_rows(n, seed=seed), max_len=40, row_group_rows=4)
    return root


def mixture(sources, weights=(0.7, 0.3), **kw):
    kw.setdefault("total_steps", STEPS)
    return MixtureSpec(
        sources=tuple(
            SourceSpec(name=n, path=str(sources / n), weight=w, **kw.pop(n, {}))
            for n, w in zip(("web", "code"), weights, strict=True)
        ),
        seed=5,
        **kw,
    )


def dataset(spec, **kw):
    return MixedDataset(spec, rows_per_batch=2, layout="hf", **kw)


def make_trainer(train, out, *, stop_at=None, workers=0, **overrides):
    return recording_trainer(train, out, ga=GA, stop_at=stop_at, workers=workers, **overrides)


def ids(batches):
    return [b["input_ids"] for b in batches]


def same_ids(seen, want):
    return len(seen) == len(want) and all(
        torch.equal(a, b) for (a, _), b in zip(seen, want, strict=True)
    )


@pytest.fixture(scope="module")
def full(sources, tmp_path_factory):
    trainer = make_trainer(dataset(mixture(sources)), tmp_path_factory.mktemp("full"))
    trainer.train()
    metrics = trainer.evaluate(dataset(mixture(sources, total_steps=3)))
    return trainer.seen, metrics


def test_the_mixtures_batches_train_in_order_once(sources, full):
    # It crashed ("expand(...)"): the mixin handed a MixedDataset to Trainer's own loader,
    # which batched its batches again.
    seen, metrics = full
    assert same_ids(seen, ids(MixedDataLoader(dataset(mixture(sources)))))
    assert len(seen) == STEPS and math.isfinite(metrics["eval_loss"])


def test_a_cap_that_ends_the_mixture_first_ends_training_there(sources, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # code stops the mixture at its cap
        spec = mixture(sources, total_steps=100, code={"max_epochs": 1})
        want = ids(MixedDataLoader(dataset(spec)))
        assert 0 < len(want) < 100 and len(dataset(spec)) == len(want)
        trainer = make_trainer(dataset(spec), tmp_path)
        trainer.train()
    assert same_ids(trainer.seen, want)
    assert trainer.state.global_step == math.ceil(len(want) / GA)


def test_a_mixture_without_length_ends_where_it_ends_never_starting_over(sources, tmp_path):
    spec = mixture(sources, total_steps=None, total_tokens=1500)
    want = ids(MixedDataLoader(dataset(spec)))
    trainer = make_trainer(dataset(spec), tmp_path, max_steps=len(want))  # more than it holds
    trainer.train()
    assert same_ids(trainer.seen, want)


@pytest.mark.parametrize("stop_at", [2, 3])
def test_resume_from_checkpoint_continues_the_mixture_exactly(sources, full, tmp_path, stop_at):
    seen, _ = full
    first = make_trainer(dataset(mixture(sources)), tmp_path, stop_at=stop_at)
    first.train()
    (checkpoint,) = tmp_path.glob("checkpoint-*")
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["MixturePosition"]["attributes"]["position"]
    # The resumed run loads in a worker process: the stream does not depend on it.
    second = make_trainer(dataset(mixture(sources)), tmp_path, workers=1)
    second.train(resume_from_checkpoint=str(checkpoint))
    assert len(first.seen) == stop_at * GA
    assert_same_steps(first.seen + second.seen, seen)


def test_a_resumed_run_saves_its_position_too(sources, full, tmp_path):
    seen, _ = full
    runs = []
    for stop_at, checkpoint in ((1, None), (3, "checkpoint-1"), (None, "checkpoint-3")):
        trainer = make_trainer(dataset(mixture(sources)), tmp_path, stop_at=stop_at)
        trainer.train(resume_from_checkpoint=checkpoint and str(tmp_path / checkpoint))
        runs += trainer.seen
    assert len(runs) == len(seen) and all(
        torch.equal(a, b) for (a, _), (b, _) in zip(runs, seen, strict=True)
    )


def test_a_changed_mixture_resumes_from_the_saved_position(sources, tmp_path):
    first = make_trainer(dataset(mixture(sources)), tmp_path, stop_at=2)
    first.train()
    (checkpoint,) = tmp_path.glob("checkpoint-*")
    saved = json.loads((checkpoint / "trainer_state.json").read_text())
    position = json.loads(saved["stateful_callbacks"]["MixturePosition"]["attributes"]["position"])
    changed = mixture(sources, weights=(0.3, 0.7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # resuming a changed mixture
        want = MixedDataLoader(dataset(changed))
        want.load_state_dict(position)  # each source from its cursor, not a replay
        want = ids(want)
        second = make_trainer(dataset(changed), tmp_path)
        with pytest.warns(UserWarning, match="resuming a changed mixture"):
            second.train(resume_from_checkpoint=str(checkpoint))
    assert same_ids(second.seen, want)


def test_a_checkpoint_without_the_mixtures_position_is_refused(sources, tmp_path):
    make_trainer(dataset(mixture(sources)), tmp_path, stop_at=2).train()
    (checkpoint,) = tmp_path.glob("checkpoint-*")
    path = checkpoint / "trainer_state.json"
    saved = json.loads(path.read_text())
    del saved["stateful_callbacks"]["MixturePosition"]
    path.write_text(json.dumps(saved))
    trainer = make_trainer(dataset(mixture(sources)), tmp_path)
    with pytest.raises(ConfigError, match="holds no mixture position"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def test_a_checkpoint_whose_position_is_nested_too_deeply_is_one_line(sources, tmp_path):
    # json.loads raised RecursionError (a traceback) for the position's text nested past
    # Python's recursion limit; now it is the "damaged" ConfigError any unreadable position is.
    make_trainer(dataset(mixture(sources)), tmp_path, stop_at=2).train()
    (checkpoint,) = tmp_path.glob("checkpoint-*")
    path = checkpoint / "trainer_state.json"
    saved = json.loads(path.read_text())
    attributes = saved["stateful_callbacks"]["MixturePosition"]["attributes"]
    attributes["position"] = "[" * 100_000 + "]" * 100_000
    path.write_text(json.dumps(saved))
    trainer = make_trainer(dataset(mixture(sources)), tmp_path)
    with pytest.raises(ConfigError, match="loader position .* is not JSON; the checkpoint is"):
        trainer.train(resume_from_checkpoint=str(checkpoint))


def test_settings_trainer_cannot_follow_on_a_mixture_are_refused(sources, tmp_path):
    from transformers import TrainingArguments

    from loader.hf import PackedTrainer

    def args(**kw):
        return TrainingArguments(str(tmp_path), use_cpu=True, report_to=[], **kw)

    one = dict(num_train_epochs=1)
    cases = [
        (dataset(mixture(sources)), args(max_steps=6, gradient_accumulation_steps=2), "max_steps 6 is more than the 5"),
        (dataset(mixture(sources)), args(), "num_train_epochs 3 would read"),
        (dataset(mixture(sources, total_steps=None, total_tokens=900)), args(**one), "no length in steps"),
        (MixedDataset(mixture(sources), rows_per_batch=2), args(**one), "layout='hf'"),
        (dataset(mixture(sources), rank=1, world_size=2), args(**one), "rank 1 of 2"),
        (dataset(mixture(sources)), args(dataloader_drop_last=True, **one), r"MixedDataset\(\.\.\., drop_last=True\)"),
    ]  # fmt: skip
    for train, targs, message in cases:
        with pytest.raises(ConfigError, match=message):
            PackedTrainer(model=tiny_model(), args=targs, train_dataset=train)
    with pytest.raises(ConfigError, match="eval MixedDataset gives layout='packtool'"):
        PackedTrainer(
            model=tiny_model(),
            args=args(**one),
            eval_dataset=MixedDataset(mixture(sources), rows_per_batch=2),
        )
