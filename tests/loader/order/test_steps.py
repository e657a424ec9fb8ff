"""loader/order/steps.py + dataset iteration: global order, rank/worker split, exactly once."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import loader.order.steps as order_module
from loader import LoaderConfig, PackedDataLoader, PackedDataset
from loader.order.permutation import EpochOrder
from loader.order.steps import (
    EpochPlan,
    block_steps_bound,
    cut_batches,
    epoch_permutation,
    iter_blocks,
    plan_epoch,
)
from loader.testing import held_bytes, synthetic_index, write_random_dataset
from packtool.errors import ConfigError, DataError
from tests.loader.conftest import all_doc_ids


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
    # More than int32 cu_seqlens hold: 10^12 sized the workers' ring (or the static padding)
    # by the budget, a failed 33 TB allocation inside torch.
    for kw, says in (
        ({"tokens_per_batch": 10**12}, "tokens_per_batch 1,000,000,000,000 is more tokens"),
        ({"rows_per_batch": 2**29}, "rows_per_batch 536,870,912 x max_len 6 is more tokens"),
        (
            {"tokens_per_batch": 2**31, "static_shape": True, "max_docs_per_batch": 4},
            "2,147,483,648",
        ),
    ):
        with pytest.raises(ConfigError, match=f"{says}.*cu_seqlens is int32"):
            PackedDataset(hand_dataset, **kw)
    assert PackedDataset(hand_dataset, tokens_per_batch=2**31 - 1).config.tokens_per_batch
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


def test_a_config_of_another_type_is_a_config_error(hand_dataset):
    # Before: AttributeError "'dict' object has no attribute 'verify'".
    with pytest.raises(ConfigError, match="^config must be a LoaderConfig, got dict; give the"):
        PackedDataset(hand_dataset, {"rows_per_batch": 2})
    assert PackedDataset(hand_dataset, LoaderConfig(rows_per_batch=2)).config.rows_per_batch == 2


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


# ---- the lazy plan against the plain reference ------------------------------------------------


def _reference_plan(order, origin, world, rows, budget, max_docs, lengths, n_docs, drop_last):
    """The old eager plan: the whole order cut at once (what EpochPlan must equal)."""
    bounds = origin + cut_batches(
        order[origin:],
        rows_per_batch=rows,
        tokens_per_batch=budget,
        max_docs=max_docs,
        lengths=lengths,
        n_docs=n_docs,
    )
    n_batches = len(bounds) - 1
    if drop_last:
        steps = n_batches // world
        if steps and rows is not None and bounds[steps * world] - bounds[steps * world - 1] < rows:
            steps -= 1
    else:
        steps = -(-n_batches // world)

    def step_rows(k):
        out = []
        for b in range(k * world, k * world + world):
            out.append(order[bounds[b] : bounds[b + 1]] if b + 1 < len(bounds) else order[:0])
        return out

    def cursor_after(k):
        return origin if k <= 0 else int(bounds[min(k * world, n_batches)])

    return steps, step_rows, cursor_after


@st.composite
def plans(draw):
    sizes = draw(st.lists(st.integers(1, 12), min_size=0, max_size=20))
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    n = int(starts[-1])
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    lengths = rng.integers(1, 17, size=n)  # max_len 16
    n_docs = rng.integers(1, 6, size=n)
    if draw(st.booleans()):
        rows, budget, max_docs = draw(st.integers(1, 5)), None, None
    else:
        rows, budget = None, draw(st.integers(16, 60))
        max_docs = draw(st.none() | st.integers(1, 12))
    kind = draw(st.sampled_from(["windowed", "free", "stored"]))
    return {
        "starts": starts,
        "lengths": lengths,
        "n_docs": n_docs,
        "rows": rows,
        "budget": budget,
        "max_docs": max_docs,
        "world": draw(st.sampled_from([1, 2, 4])),
        "drop_last": draw(st.booleans()),
        "origin": draw(st.integers(0, n)),
        "shuffle": kind != "stored",
        "window": 0 if kind == "free" else draw(st.integers(1, 4)),
        "epoch": draw(st.integers(0, 2)),
    }


def _plan(p, **over):
    kw = dict(
        num_rows=int(p["starts"][-1]),
        fingerprint="f",
        seed=3,
        epoch=p["epoch"],
        world_size=p["world"],
        origin=p["origin"],
        shuffle=p["shuffle"],
        drop_last=p["drop_last"],
        rows_per_batch=p["rows"],
        tokens_per_batch=p["budget"],
        max_docs=p["max_docs"],
        lengths=p["lengths"],
        n_docs=p["n_docs"],
        group_starts=p["starts"],
        window=p["window"],
    )
    return plan_epoch(**{**kw, **over})


@settings(max_examples=300, deadline=None)
@given(
    p=plans(),
    chunk=st.integers(1, 6),
    first=st.integers(1, 3),
    piece=st.integers(1, 9),
    data=st.data(),
)
def test_lazy_plan_equals_the_eager_reference(p, chunk, first, piece, data):
    with (
        mock.patch.object(order_module, "CHUNK", chunk),
        mock.patch.object(order_module, "FIRST_CHUNK", first),
        mock.patch.object(order_module, "PIECE", piece),
    ):
        plan = _plan(p)
        full = np.asarray(plan.order)
        steps, ref_rows, ref_cursor = _reference_plan(
            full,
            plan.origin,
            p["world"],
            p["rows"],
            p["budget"],
            p["max_docs"],
            p["lengths"],
            p["n_docs"],
            p["drop_last"],
        )
        assert plan.num_steps == steps
        assert [plan.has_step(k) for k in range(steps + 2)] == [True] * steps + [False] * 2
        delivered = []
        for k in range(steps):
            got = plan.step_rows(k)
            assert [r.tolist() for r in got] == [r.tolist() for r in ref_rows(k)]
            delivered += [int(x) for r in got for x in r]
            # Some ranks' batches alone (a rank's own, a node's) are those ranks' of the step,
            # asked of a fresh plan (nothing of the step cut before).
            a = data.draw(st.integers(0, p["world"] - 1))
            n = data.draw(st.integers(1, p["world"] - a))
            some = _plan(p).step_rows(k, a, n)
            assert [r.tolist() for r in some] == [r.tolist() for r in ref_rows(k)[a : a + n]]
        for k in range(steps + 2):
            assert plan.cursor_after(k) == ref_cursor(k)
        # Every row from the origin exactly once per epoch across the ranks (none twice even
        # with drop_last, which only leaves out the tail).
        assert len(delivered) == len(set(delivered))
        if not p["drop_last"]:
            assert sorted(delivered) == sorted(full[plan.origin :].tolist())
        # A resume at a random step: a fresh plan told only where that step starts (the
        # state's cursor) continues with the same steps, and never cuts from the origin.
        k = data.draw(st.integers(0, steps))
        resumed = _plan(p)
        resumed.anchor(k * p["world"], ref_cursor(k))
        assert [[r.tolist() for r in resumed.step_rows(j)] for j in range(k, steps)] == [
            [r.tolist() for r in ref_rows(j)] for j in range(k, steps)
        ]
        assert resumed.num_steps == steps
        if p["budget"] is not None and k * p["world"] > chunk and ref_cursor(k) < len(full):
            assert min(resumed._anchors) == 0 and 0 not in resumed._chunks  # origin untouched


@settings(max_examples=150, deadline=None)
@given(p=plans(), data=st.data())
def test_worker_splits_deliver_every_step_once_in_order(p, data):
    plan = _plan(p)
    steps = plan.num_steps
    per_step = p["shuffle"] and p["window"] == 0
    first = data.draw(st.integers(0, steps))
    blocks = list(iter_blocks(plan, first, per_step=per_step))
    flat = [s for a, b in blocks for s in range(a, b)]
    assert flat == list(range(first, steps))  # contiguous blocks, in order, from `first`
    assert all(b > a for a, b in blocks)
    if not per_step and blocks:
        bound = PackedDatasetBound(plan)
        assert max(b - a for a, b in blocks) <= bound
    for workers in (1, 2, 3):
        # PackedDataLoader: block b to worker b % N, put back in step order by the trainer.
        mine = [
            [s for i, (a, b) in enumerate(blocks) if i % workers == w for s in range(a, b)]
            for w in range(workers)
        ]
        assert sorted(s for m in mine for s in m) == flat
        # Plain DataLoader workers: steps w, w + N, ... (the round robin restores the order).
        strided = [list(plan.steps(first + w, workers)) for w in range(workers)]
        assert sorted(s for m in strided for s in m) == flat


def PackedDatasetBound(plan) -> int:  # noqa: N802 - reads as the quantity it returns
    return block_steps_bound(plan, max_len=16)


def test_a_cursor_off_the_plan_is_found_where_the_cut_reaches_it():
    lengths = np.full(40, 10)
    kw = dict(num_rows=40, fingerprint="f", seed=0, epoch=0, world_size=1, lengths=lengths)
    plan = plan_epoch(tokens_per_batch=20, **kw)  # 2 rows a batch: batch 5 starts at row 10
    with mock.patch.object(order_module, "CHUNK", 2):
        plan.anchor(5, 11)
        with pytest.raises(DataError, match="rank batch 5 at a row where this plan has none"):
            plan.step_rows(4)
        plan = plan_epoch(tokens_per_batch=20, **kw)
        plan.anchor(30, 39)  # beyond the epoch's 20 batches
        with pytest.raises(DataError, match="rank batch 30"):
            plan.step_rows(25)  # cut from the origin, which ends before batch 30


def test_check_position_refuses_impossible_cursors():
    lengths = np.full(40, 10)
    kw = dict(num_rows=40, fingerprint="f", seed=0, epoch=0, world_size=2, lengths=lengths)
    rows = plan_epoch(rows_per_batch=3, **kw)
    rows.check_position(epoch=0, step=2, cursor=12, own_step=False)
    with pytest.raises(DataError, match="but that step starts at row 12"):
        rows.check_position(epoch=0, step=2, cursor=13, own_step=False)
    budget = plan_epoch(tokens_per_batch=20, **kw)
    budget.check_position(epoch=0, step=3, cursor=12, own_step=False)
    budget.check_position(epoch=0, step=30, cursor=40, own_step=True)  # past the end: at N
    for step, cursor in ((0, 1), (3, 4), (3, 13 * 20)):
        with pytest.raises(DataError, match="cannot consume"):
            budget.check_position(epoch=0, step=step, cursor=cursor, own_step=False)


def test_huge_synthetic_dataset_keeps_the_order_state_small():
    # 10^9 rows in 256-row row groups, row counts generated per row group: the state of the
    # order, the plan and the row index after a fresh start and a resume in the middle of the
    # epoch stays far under 256 MB (an eager order: 8 GB for the row ids alone).
    n = 10**9
    index = synthetic_index(n, group_rows=256, max_len=4096)
    for kw in ({"window": 16}, {"window": 0}, {"shuffle": False}):
        order = EpochOrder(index.group_starts, fingerprint="f", seed=0, epoch=0, **kw)
        plan = EpochPlan(order, world_size=8, tokens_per_batch=65_536, index=index)
        first = plan.step_rows(0)
        assert sum(len(r) for r in first) >= 8 * 16
        # A resume in the middle of the epoch (with other settings, which needs no cut before).
        middle = EpochPlan(order, origin=n // 2, world_size=8, tokens_per_batch=65_536, index=index)
        rows = np.concatenate(middle.step_rows(0) + middle.step_rows(1))
        assert len(np.unique(rows)) == len(rows) and rows.min() >= 0 and rows.max() < n
        held = held_bytes(plan, middle)
        assert held < 256 << 20, (kw, held)
        if kw != {"window": 0}:  # a free shuffle's rows lie in a row group each
            assert index.groups_read < 1_000  # a few windows' row groups, not 3.9 M
        index.groups_read = 0


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@settings(max_examples=8, deadline=None)
@given(
    n_rows=st.integers(1, 40),
    group_rows=st.integers(1, 6),
    world=st.sampled_from([1, 2, 4]),
    workers=st.sampled_from([0, 1, 2]),
    kw=st.sampled_from(
        [
            {"tokens_per_batch": 100},
            {"tokens_per_batch": 64, "shuffle_window": 1, "drop_last": True},
            {"rows_per_batch": 2, "shuffle_window": 3},
            {"rows_per_batch": 3, "shuffle_window": 0},
            {"rows_per_batch": 1, "shuffle": False, "balance": True},
        ]
    ),
    seed=st.integers(0, 5),
)
def test_every_document_once_over_ranks_and_workers_on_random_datasets(
    n_rows, group_rows, world, workers, kw, seed
):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ds"
        write_random_dataset(
            path,
            n_rows=n_rows,
            max_len=64,
            mean_doc=9,
            rows_per_shard=7,
            row_group_rows=group_rows,
            seed=seed,
        )
        expected = all_doc_ids(path).tolist()
        seen, streams = [], []
        for rank in range(world):
            ds = PackedDataset(path, rank=rank, world_size=world, seed=seed, **kw)
            batches = list(PackedDataLoader(ds, num_workers=workers))
            single = list(PackedDataset(path, rank=rank, world_size=world, seed=seed, **kw))
            assert [b["input_ids"].tolist() for b in batches] == [
                b["input_ids"].tolist() for b in single
            ]  # the same stream with 0 or N workers
            streams.append(len(batches))
            seen += [i for b in batches for i in _docs(b)]
        assert len(set(streams)) == 1
        assert len(seen) == len(set(seen))
        if not kw.get("drop_last"):
            assert sorted(seen) == expected


def test_pad_id_outside_the_vocabulary_is_refused_at_open(hand_dataset):
    """A static-shape pad_id the tokenizer has no such id for reached `input_ids` (70000 on a
    258-id vocabulary): a ConfigError when the dataset (or a mixture of it) opens."""
    from loader import MixedDataset
    from packtool.mixture.spec import MixtureSpec, SourceSpec

    vocab = PackedDataset(hand_dataset, rows_per_batch=1).store.vocab_size
    settings_ = {"rows_per_batch": 2, "static_shape": True}
    with pytest.raises(ConfigError, match=f"pad_id {vocab} is not a token id .* {vocab}"):
        PackedDataset(hand_dataset, pad_id=vocab, **settings_)
    spec = MixtureSpec(sources=(SourceSpec(name="a", path=str(hand_dataset), weight=1),))
    spec = MixtureSpec(sources=spec.sources, total_steps=1)
    with pytest.raises(ConfigError, match=f"pad_id {vocab + 5} is not a token id"):
        MixedDataset(spec, pad_id=vocab + 5, **settings_)
    # the largest id pads, and is what the padding holds
    batch = next(iter(PackedDataset(hand_dataset, pad_id=vocab - 1, shuffle=False, **settings_)))
    assert int(batch["input_ids"].max()) == vocab - 1
