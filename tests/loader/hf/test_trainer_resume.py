"""`PackedTrainer` resumes from the loader's position saved with each checkpoint: on another
world size, `rows_per_batch` or gradient accumulation every row is still trained once per
epoch (Trainer's own step count placed the data elsewhere: rows twice or never, without a
word), what Trainer's remaining steps cannot hold is counted in a warning, and a checkpoint
written without a position resumes only where it agrees with the run."""

from __future__ import annotations

import json
import shutil
import warnings
from collections import Counter

import pytest
from transformers import TrainingArguments

from loader import PackedDataLoader, PackedDataset
from loader.testing import write_dataset
from packtool.errors import ConfigError
from tests.loader.hf_helpers import (
    counting_rows,
    documents,
    gc_skips_the_imports,  # noqa: F401  (autouse: gc.freeze after the imports)
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    recording_trainer,
)

ROWS, EPOCHS = 24, 3


class RankArgs(TrainingArguments):
    """`TrainingArguments` of rank `RANK` of `WORLD` (set on the class before making them): a
    run on several ranks simulated one rank at a time in this process, as the loader's own
    elastic tests make each rank's dataset (the ranks' models do not sync, which the data's
    order does not depend on)."""

    RANK, WORLD = 0, 1
    world_size = property(lambda self: type(self).WORLD)
    process_index = property(lambda self: type(self).RANK)
    local_process_index = property(lambda self: type(self).RANK)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("hfr") / "ds"
    write_dataset(path, counting_rows(ROWS, seed=2), max_len=40, row_group_rows=4)
    return path


@pytest.fixture(scope="module")
def every_doc(data):
    """The documents of one epoch."""
    ds = PackedDataset(data, rows_per_batch=4, layout="hf", shuffle=False)
    return Counter(tuple(d.tolist()) for b in ds for d in documents(b))


def trainer(data, out, *, rpb, ga, stop_at=None, workers=0, rank=0, world=1, **overrides):
    ds = PackedDataset(data, rows_per_batch=rpb, layout="hf", seed=7, rank=rank, world_size=world)
    RankArgs.RANK, RankArgs.WORLD = rank, world
    return recording_trainer(
        ds, out, ga=ga, epochs=EPOCHS, stop_at=stop_at, workers=workers, args_type=RankArgs,
        **overrides,
    )  # fmt: skip


def resumed(data, checkpoint, **settings):
    """A run resumed from `checkpoint`, and the warnings it gave."""
    second = trainer(data, checkpoint.parent, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second.train(resume_from_checkpoint=str(checkpoint))
    return second, [str(w.message) for w in caught if "checkpoint" in str(w.message)]


def position(checkpoint) -> dict:
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["stateful_callbacks"]["PackedPosition"]["attributes"]


def test_every_checkpoint_holds_the_loaders_position(data, tmp_path):
    first = trainer(data, tmp_path, rpb=4, ga=2, stop_at=4)  # 8 batches: 6 of epoch 0, 2 of 1
    first.train()
    saved = position(tmp_path / "checkpoint-4")
    loader = PackedDataLoader(PackedDataset(data, rows_per_batch=4, layout="hf", seed=7))
    loader.set_epoch(1)
    for i, _ in enumerate(loader):
        if i == 1:
            break
    assert json.loads(saved["position"]) == json.loads(json.dumps(loader.state_dict()))
    assert saved["gradient_accumulation_steps"] == 2


ELASTIC = [
    # (first run, resumed run): rows_per_batch, gradient accumulation, ranks; stop at step
    pytest.param(dict(rpb=4, ga=2), dict(rpb=2, ga=2), 2, id="4-rows-then-2"),
    pytest.param(dict(rpb=4, ga=2), dict(rpb=4, ga=1, workers=1), 2, id="accumulation-2-then-1"),
    pytest.param(dict(rpb=3, ga=1), dict(rpb=2, ga=1), 9, id="3-rows-then-2-from-epoch-1"),
    pytest.param(dict(rpb=2, ga=2, world=2), dict(rpb=2, ga=2), 2, id="2-ranks-then-1"),
]


@pytest.mark.parametrize(("was", "now", "stop"), ELASTIC)
def test_a_resume_on_other_ranks_or_batches_trains_every_row_once_an_epoch(
    data, every_doc, tmp_path, was, now, stop
):
    # Before: Trainer's step count placed the data (4 rows -> 2: 8 rows trained twice; 2 ranks
    # x 5 steps -> 1 rank: rows 10-19 twice), without a word.
    docs = []
    for rank in range(was.get("world", 1)):
        first = trainer(data, tmp_path, stop_at=stop, rank=rank, **was)
        first.train()
        docs += first.docs
    second, said = resumed(data, tmp_path / f"checkpoint-{stop}", **now)
    assert said == []
    got = Counter(docs + second.docs)
    assert got == Counter({doc: EPOCHS * n for doc, n in every_doc.items()})


def test_a_checkpoint_of_a_resumed_stream_resumes_it_again(data, every_doc, tmp_path):
    # 4 rows a batch to step 2, then 2 rows (the stream goes on from row 16) to step 8, then
    # from that checkpoint again: its position (cut from row 16 on) is not Trainer's either.
    first = trainer(data, tmp_path, rpb=4, ga=2, stop_at=2)
    first.train()
    second = trainer(data, tmp_path, rpb=2, ga=2, stop_at=8)
    second.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    third, said = resumed(data, tmp_path / "checkpoint-8", rpb=2, ga=2, workers=1)
    assert said == []
    got = Counter(first.docs + second.docs + third.docs)
    assert got == Counter({doc: EPOCHS * n for doc, n in every_doc.items()})


def test_a_resume_onto_larger_batches_counts_the_batches_its_steps_leave_out(
    data, every_doc, tmp_path
):
    # 2 rows a batch for 4 steps (16 rows of epoch 0), then 4 rows: Trainer takes its 4 steps
    # as 4 of this size (epoch 1, batch 2), and its 5 remaining steps hold 10 batches where
    # the data left of 3 epochs is 14. Before: 16 rows never trained, without a word.
    first = trainer(data, tmp_path, rpb=2, ga=2, stop_at=4)
    first.train()
    second, said = resumed(data, tmp_path / "checkpoint-4", rpb=4, ga=2)
    assert len(said) == 1 and "the 4 last batch(es) of epoch 2" in said[0], said
    assert "1 rank(s) x 2 rows, gradient accumulation 2 on 1 rank(s) x 4 rows" in said[0]
    last = PackedDataset(data, rows_per_batch=4, layout="hf", seed=7)
    last.set_epoch(2)
    left_out = Counter(tuple(d.tolist()) for b in list(last)[-4:] for d in documents(b))
    want = Counter({doc: EPOCHS * n for doc, n in every_doc.items()})
    assert Counter(first.docs + second.docs) == want - left_out


def test_a_resume_onto_smaller_batches_says_where_the_data_ends_inside_a_step(
    data, every_doc, tmp_path
):
    # 4 rows a batch to step 2 (16 rows), then 3: the 19 batches left of 3 epochs end one
    # batch into an accumulation step of 2 (Trainer's steps would hold 20), whose gradients no
    # optimizer step applies: said, not silent.
    first = trainer(data, tmp_path, rpb=4, ga=2, stop_at=2)
    first.train()
    second, said = resumed(data, tmp_path / "checkpoint-2", rpb=3, ga=2)
    assert len(said) == 1 and "ends 1 batch(es) into a gradient accumulation step" in said[0]
    assert len(second.seen) == 19 and second.state.global_step == 2 + 9
    got = Counter(first.docs + second.docs)
    assert got == Counter({doc: EPOCHS * n for doc, n in every_doc.items()})


@pytest.fixture
def unrecorded(data, tmp_path):
    """A checkpoint (4 rows, accumulation 2, step 4) as written before positions were saved."""
    first = trainer(data, tmp_path, rpb=4, ga=2, stop_at=4)
    first.train()
    checkpoint = tmp_path / "checkpoint-4"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    del state["stateful_callbacks"]["PackedPosition"]
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    return first, checkpoint


def test_a_checkpoint_without_a_position_resumes_where_it_agrees_with_the_run(
    data, every_doc, unrecorded
):
    first, checkpoint = unrecorded
    second, said = resumed(data, checkpoint, rpb=4, ga=2)
    assert len(said) == 1 and "holds no data position" in said[0], said
    got = Counter(first.docs + second.docs)
    assert got == Counter({doc: EPOCHS * n for doc, n in every_doc.items()})


def test_a_checkpoint_without_a_position_is_refused_where_it_disagrees(data, unrecorded):
    _, checkpoint = unrecorded
    with pytest.raises(
        ConfigError, match=r"planned 9 optimizer steps in 3 epoch\(s\), this run 18"
    ):
        trainer(data, checkpoint.parent, rpb=2, ga=2).train(resume_from_checkpoint=str(checkpoint))
    # written by two ranks (Trainer names its RNG files by rank then)
    rng = checkpoint / "rng_state.pth"
    for rank in range(2):
        shutil.copy(rng, checkpoint / f"rng_state_{rank}.pth")
    rng.unlink()
    with pytest.raises(ConfigError) as info:
        trainer(data, checkpoint.parent, rpb=4, ga=2).train(resume_from_checkpoint=str(checkpoint))
    message = str(info.value)
    assert "was written by 2 process(es), this run has 1" in message and "\n" not in message
    assert "ignore_data_skip=True to start epoch 1 over" in message


def test_a_damaged_position_is_refused(data, tmp_path):
    trainer(data, tmp_path, rpb=4, ga=2, stop_at=4).train()
    checkpoint = tmp_path / "checkpoint-4"
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    state["stateful_callbacks"]["PackedPosition"]["attributes"]["position"] = "{not json"
    (checkpoint / "trainer_state.json").write_text(json.dumps(state))
    with pytest.raises(ConfigError, match="PackedPosition in its trainer_state.json.*damaged"):
        trainer(data, tmp_path, rpb=4, ga=2).train(resume_from_checkpoint=str(checkpoint))
