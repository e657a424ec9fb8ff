"""loader/order.py + dataset iteration: global order, rank/worker split, exactly once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from loader import LoaderConfig, PackedDataLoader, PackedDataset
from loader.order import cut_batches, epoch_permutation, plan_epoch
from packtool.errors import ConfigError

from .conftest import all_doc_ids


def test_permutation_depends_only_on_fingerprint_seed_epoch():
    a = epoch_permutation(100, fingerprint="f", seed=1, epoch=0)
    assert np.array_equal(a, epoch_permutation(100, fingerprint="f", seed=1, epoch=0))
    assert sorted(a.tolist()) == list(range(100))
    assert not np.array_equal(a, epoch_permutation(100, fingerprint="f", seed=1, epoch=1))
    assert not np.array_equal(a, epoch_permutation(100, fingerprint="f", seed=2, epoch=0))
    assert not np.array_equal(a, epoch_permutation(100, fingerprint="g", seed=1, epoch=0))


def test_token_budget_is_greedy_in_order():
    lengths = np.array([5, 4, 3, 6, 1, 6])
    bounds = cut_batches(np.arange(6), rows_per_batch=None, tokens_per_batch=9, lengths=lengths)
    assert bounds.tolist() == [0, 2, 4, 6]  # [5,4] [3,6] [1,6]
    n_docs = np.array([2, 1, 3, 1, 1, 1])
    bounds = cut_batches(
        np.arange(6),
        rows_per_batch=None,
        tokens_per_batch=9,
        max_docs=3,
        lengths=lengths,
        n_docs=n_docs,
    )
    assert bounds.tolist() == [0, 2, 3, 5, 6]
    bounds = cut_batches(
        np.arange(6),
        rows_per_batch=None,
        tokens_per_batch=9,
        max_docs=2,
        lengths=lengths,
        n_docs=n_docs,
    )
    assert bounds.tolist() == [0, 1, 2, 3, 5, 6]  # a row over the cap still goes alone


def test_steps_and_fillers():
    plan = plan_epoch(
        num_rows=7, fingerprint="f", seed=0, epoch=0, world_size=2, rows_per_batch=2, shuffle=False
    )
    assert plan.num_steps == 2
    assert [r.tolist() for r in plan.step_rows(0)] == [[0, 1], [2, 3]]
    assert [r.tolist() for r in plan.step_rows(1)] == [[4, 5], [6]]
    plan = plan_epoch(
        num_rows=5, fingerprint="f", seed=0, epoch=0, world_size=2, rows_per_batch=2, shuffle=False
    )
    assert [r.tolist() for r in plan.step_rows(1)] == [[4], []]  # rank 1 gets a filler
    dropped = plan_epoch(
        num_rows=7,
        fingerprint="f",
        seed=0,
        epoch=0,
        world_size=2,
        rows_per_batch=2,
        shuffle=False,
        drop_last=True,
    )
    assert dropped.num_steps == 1
    assert plan.cursor_after(1) == 4 and plan.cursor_after(2) == 5


def test_hand_checked_batches(hand_dataset):
    ds = PackedDataset(hand_dataset, rows_per_batch=2, shuffle=False)
    b0, b1 = list(ds)
    assert b0["input_ids"].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert b0["cu_seqlens"].tolist() == [0, 3, 5, 9]
    assert b0["labels"].tolist() == [2, 3, -100, 5, -100, 7, 8, 9, -100]
    assert b0["position_ids"].tolist() == [0, 1, 2, 0, 1, 0, 1, 2, 3]
    assert b0["doc_ids"].tolist() == [0, 1, 2]
    assert b1["input_ids"].tolist() == [10, 11, 12]
    assert b1["labels"].tolist() == [-100, -100, -100]
    # Rank 1 of 2 in the same step order: step 0 -> row 1, step 1 -> filler (row 0, all -100).
    r1 = list(PackedDataset(hand_dataset, rows_per_batch=1, shuffle=False, rank=1, world_size=2))
    assert [b["input_ids"].tolist() for b in r1] == [[6, 7, 8, 9], [1, 2, 3, 4, 5]]
    assert r1[1]["labels"].tolist() == [-100] * 5 and r1[1]["doc_ids"].tolist() == [-1, -1]


def test_static_token_budget_batches(hand_dataset):
    ds = PackedDataset(
        hand_dataset, tokens_per_batch=8, max_docs_per_batch=5, static_shape=True, shuffle=False
    )
    b = list(ds)
    assert [x["input_ids"].tolist() for x in b] == [
        [1, 2, 3, 4, 5, 0, 0, 0],
        [6, 7, 8, 9, 10, 11, 12, 0],
    ]
    assert [x["cu_seqlens"].tolist() for x in b] == [[0, 3, 5, 8, 8, 8], [0, 4, 5, 6, 7, 8]]
    assert all(x["max_seqlen"] == 8 for x in b)


def test_config_validation(hand_dataset):
    with pytest.raises(ConfigError, match="exactly one of"):
        LoaderConfig()
    with pytest.raises(ConfigError, match="exactly one of"):
        LoaderConfig(rows_per_batch=1, tokens_per_batch=8)
    with pytest.raises(ConfigError, match="rows_per_batch must be >= 1"):
        LoaderConfig(rows_per_batch=0)
    with pytest.raises(ConfigError, match="tokens_per_batch must be >= 1"):
        LoaderConfig(tokens_per_batch=0)
    with pytest.raises(ConfigError, match="needs max_docs_per_batch"):
        LoaderConfig(tokens_per_batch=8, static_shape=True)
    with pytest.raises(ConfigError, match="max_docs_per_batch must be >= 2"):
        LoaderConfig(rows_per_batch=1, max_docs_per_batch=1)
    with pytest.raises(ConfigError, match="layout 'x' is unknown"):
        LoaderConfig(rows_per_batch=1, layout="x")
    with pytest.raises(ConfigError, match="cache_bytes must be >= 0"):
        LoaderConfig(rows_per_batch=1, cache_bytes=-1)
    with pytest.raises(ConfigError, match="smaller than the dataset's max_len 6"):
        PackedDataset(hand_dataset, tokens_per_batch=5)
    with pytest.raises(ConfigError, match="rank must be in"):
        PackedDataset(hand_dataset, rows_per_batch=1, rank=2, world_size=2)


def _docs(batch) -> list[int]:
    ids = batch["doc_ids"]
    return ids[ids >= 0].tolist()


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("budget", ["rows", "tokens"])
def test_exactly_once_over_ranks_workers_epochs(random_dataset, world_size, workers, budget):
    expected = all_doc_ids(random_dataset).tolist()
    settings = {"rows_per_batch": 3} if budget == "rows" else {"tokens_per_batch": 150}
    ranks = [
        PackedDataset(random_dataset, rank=r, world_size=world_size, seed=5, **settings)
        for r in range(world_size)
    ]
    loaders = [
        PackedDataLoader(ds, num_workers=workers, persistent_workers=workers > 0) for ds in ranks
    ]
    streams = []
    for epoch in range(2):
        seen, steps = [], []
        for ds, dl in zip(ranks, loaders, strict=True):
            ds.set_epoch(epoch)
            batches = list(dl)
            steps.append(len(batches))
            assert len(batches) == len(ds)
            for b in batches:
                seen += _docs(b)
                assert b["cu_seqlens"][-1] == b["input_ids"].numel()
                if budget == "tokens":
                    assert b["input_ids"].numel() <= 150
            streams.append([b["input_ids"] for b in batches])
        assert len(set(steps)) == 1, "every rank must run the same number of steps"
        assert sorted(seen) == expected
    # The same stream whatever the worker count: compare against single-process rank 0.
    ref = PackedDataset(random_dataset, rank=0, world_size=world_size, seed=5, **settings)
    ref.set_epoch(1)
    assert all(
        torch.equal(a, b)
        for a, b in zip(streams[world_size], [b["input_ids"] for b in ref], strict=True)
    )


def test_epochs_differ_and_drop_last_drops_only_the_tail(random_dataset):
    ds = PackedDataset(
        random_dataset, rows_per_batch=4, seed=1, world_size=2, rank=0, drop_last=True
    )
    assert len(ds) == 4  # 37 rows -> 9 full batches + 1 partial -> 4 full steps of 2
    e0 = [_docs(b) for b in ds]
    ds.set_epoch(1)
    e1 = [_docs(b) for b in ds]
    assert e0 != e1
    assert all(b["labels"].ne(-100).any() for b in ds)


def test_windowed_shuffle_keeps_windows_of_row_groups_together():
    starts = np.array([0, 4, 8, 10, 14, 20])
    p = epoch_permutation(20, fingerprint="f", seed=0, epoch=0, group_starts=starts, window=2)
    assert sorted(p.tolist()) == list(range(20))
    group = np.searchsorted(starts, p, side="right") - 1
    order = list(dict.fromkeys(group.tolist()))  # groups by first appearance
    windows = [order[i : i + 2] for i in range(0, len(order), 2)]
    last = -1
    for w in windows:  # a window's rows all come after the previous window's rows
        pos = np.flatnonzero(np.isin(group, w))
        assert pos.min() == last + 1 and len(pos) == sum(np.diff(starts)[g] for g in w)
        last = pos.max()
    assert not np.array_equal(
        p, epoch_permutation(20, fingerprint="f", seed=0, epoch=1, group_starts=starts, window=2)
    )


@pytest.mark.parametrize(
    ("settings_", "match"),
    [
        # 1.5 rows per batch used to cut batches of 1 and 2 rows in turn, silently.
        ({"rows_per_batch": 1.5}, "rows_per_batch must be an integer, got 1.5"),
        ({"rows_per_batch": "2"}, "rows_per_batch must be an integer, got '2'"),
        ({"tokens_per_batch": 64.0}, "tokens_per_batch must be an integer"),
        ({"rows_per_batch": 1, "seed": "a"}, "seed must be an integer"),
        ({"rows_per_batch": 1, "drop_last": "False"}, "drop_last must be True or False"),
        ({"rows_per_batch": 1, "pad_id": -1}, "pad_id must be a token id >= 0"),
        ({"rows_per_batch": 1, "pad_id": 2**70}, "pad_id must be a token id >= 0"),
        ({"rows_per_batch": 1, "balance_linear": -1.0}, "balance_linear must be a finite"),
        ({"rows_per_batch": 1, "max_docs_per_batch": 4}, "only applies with static_shape"),
    ],
)
def test_config_types_are_checked(settings_, match):
    with pytest.raises(ConfigError, match=match):
        LoaderConfig(**settings_)


def test_unknown_setting_is_a_config_error_naming_the_valid_ones(hand_dataset):
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'batch_size'; .*rows_per_batch"):
        PackedDataset(hand_dataset, batch_size=4)
    with pytest.raises(ConfigError, match="rank must be an integer"):
        PackedDataset(hand_dataset, rows_per_batch=1, rank="0", world_size=2)


@pytest.mark.parametrize(
    ("settings_", "need", "enough"),
    [
        # The third row holds 3 documents: 2 entries (one is padding) can never fit it.
        ({"tokens_per_batch": 6, "max_docs_per_batch": 2}, "one row holds 3", 4),
        # Two rows with the most documents hold 3 + 2; + padding = 6 > 5.
        ({"rows_per_batch": 2, "max_docs_per_batch": 5}, "a batch of 2 rows can hold 5", 6),
    ],
)
def test_static_shape_too_few_docs_is_refused_upfront(hand_dataset, settings_, need, enough):
    # Before: a DataError from collate in the middle of the epoch, at the first such batch.
    with pytest.raises(ConfigError, match=f"{need} documents, plus one entry for padding"):
        PackedDataset(hand_dataset, static_shape=True, shuffle=False, **settings_)
    ok = {**settings_, "max_docs_per_batch": enough}
    batches = list(PackedDataset(hand_dataset, static_shape=True, **ok))
    assert sorted(i for b in batches for i in _docs(b)) == list(range(6))
