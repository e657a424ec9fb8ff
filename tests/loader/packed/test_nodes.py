"""`PackedDataset(nodes=N)`: each node's ranks read rows of the node's own windows, every row
once over the world, with workers, balance and resume as without."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import MixedDataset, PackedDataLoader, PackedDataset
from loader.testing import write_random_dataset
from packtool.errors import ConfigError, DataError
from packtool.mixture.spec import SourceSpec
from tests.loader.conftest import all_doc_ids, block_row_groups

NODES, RANKS = 2, 4  # 2 nodes of 2 ranks
KW = {"rows_per_batch": 2, "seed": 5, "shuffle_window": 2}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """240 rows in 60 row groups of 4 (30 windows of 2 row groups); doc ids unique."""
    path = tmp_path_factory.mktemp("nodes") / "ds"
    write_random_dataset(
        path, n_rows=240, max_len=64, mean_doc=9, rows_per_shard=40, row_group_rows=4, seed=11
    )
    return path


def _doc_ids(batch) -> list[int]:
    ids = batch["doc_ids"]
    return ids[ids >= 0].tolist()


def _node_groups(ds: PackedDataset, rows: list[np.ndarray]) -> set[int]:
    return set(ds.store.row_group_of(np.concatenate(rows)).tolist()) if rows else set()


@pytest.mark.parametrize(("workers", "balance"), [(0, False), (2, False), (0, True)])
def test_every_row_once_and_each_node_reads_about_its_share(dataset, workers, balance):
    seen, groups = [], {}
    for rank in range(RANKS):
        ds = PackedDataset(dataset, rank=rank, world_size=RANKS, nodes=NODES, balance=balance, **KW)
        for b in PackedDataLoader(ds, num_workers=workers):
            seen += _doc_ids(b)
        plan = ds.plan(0)
        rows = [ds.rows_for(plan, s) for s in range(plan.num_steps)]
        groups.setdefault(rank // (RANKS // NODES), set()).update(_node_groups(ds, rows))
    assert sorted(seen) == all_doc_ids(dataset).tolist()
    n = ds.store.num_row_groups
    # Without nodes each node reads rows of every row group (the test below); here ~1/2 (and
    # the rows of the streams' tail).
    assert all(len(g) <= 0.65 * n for g in groups.values()), [len(g) for g in groups.values()]
    assert len(groups[0] & groups[1]) <= 0.15 * n


def test_without_nodes_every_node_reads_nearly_every_row_group(dataset):
    groups = {}
    for rank in range(RANKS):
        ds = PackedDataset(dataset, rank=rank, world_size=RANKS, **KW)
        plan = ds.plan(0)
        rows = [ds.rows_for(plan, s) for s in range(plan.num_steps)]
        groups.setdefault(rank // 2, set()).update(_node_groups(ds, rows))
    assert all(len(g) >= 0.9 * ds.store.num_row_groups for g in groups.values())


def test_balance_moves_rows_only_between_the_ranks_of_a_node(dataset):
    plain = [PackedDataset(dataset, rank=r, world_size=RANKS, nodes=NODES, **KW) for r in (0, 1)]
    even = [
        PackedDataset(dataset, rank=r, world_size=RANKS, nodes=NODES, balance=True, **KW)
        for r in (0, 1)
    ]
    plan, moved = plain[0].plan(0), 0
    for step in range(plan.num_steps):
        before = [d.rows_for(plan, step) for d in plain]
        after = [d.rows_for(d.plan(0), step) for d in even]
        assert sorted(np.concatenate(before).tolist()) == sorted(np.concatenate(after).tolist())
        moved += any(not np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert moved  # balance did move rows (between node 0's two ranks)


def _stream(dataset, *, rank, state=None, take=None, world=RANKS, nodes=NODES, **kw):
    ds = PackedDataset(dataset, rank=rank, world_size=world, nodes=nodes, **{**KW, **kw})
    dl = PackedDataLoader(ds, num_workers=1)
    if state is not None:
        dl.load_state_dict(state)
    out = [tuple(b["doc_ids"].tolist()) for b in itertools.islice(dl, take)]
    return out, dl.state_dict()


def test_a_resume_with_the_same_layout_continues_the_stream(dataset):
    for rank in (0, 3):
        whole, _ = _stream(dataset, rank=rank)
        first, state = _stream(dataset, rank=rank, take=7)
        rest, _ = _stream(dataset, rank=rank, state=state)
        assert first + rest == whole


def test_a_resume_into_other_ranks_per_node_waits_for_the_next_epoch(dataset):
    # The order depends on the ranks per node (a block's rows a node): inside an epoch the rest
    # of it exists only in the saved order.
    _, state = _stream(dataset, rank=0, take=3)
    with pytest.raises(DataError, match=r"nodes=2, world_size=4, rows_per_batch=2 but this"):
        _stream(dataset, rank=0, state=state, world=2, nodes=1)
    with pytest.raises(DataError, match=r"saved with .*nodes=2.* but this loader uses .*nodes=1"):
        _stream(dataset, rank=0, state=state, nodes=1)
    # At an epoch's end any layout goes on with the next epoch.
    _, ended = _stream(dataset, rank=0)
    got, _ = _stream(dataset, rank=0, state=ended, world=2, nodes=1)
    assert got == []  # nothing of epoch 0 is left


def test_a_resume_into_other_ranks_with_the_same_rows_a_node_goes_on(dataset):
    # The order depends on the nodes and each node's rows a step (ranks per node x rows): 2
    # nodes of 2 ranks x 2 rows and 2 nodes of 4 ranks x 1 row deal the same order.
    _, state = _stream(dataset, rank=0, take=5)
    seen = set()
    for rank in range(RANKS):
        ds = PackedDataset(dataset, rank=rank, world_size=RANKS, nodes=NODES, **KW)
        dl = PackedDataLoader(ds)
        seen |= {d for b in itertools.islice(dl, 5) for d in _doc_ids(b)}
    rest = []
    for rank in range(8):
        got, _ = _stream(dataset, rank=rank, state=state, world=8, rows_per_batch=1)
        rest += [d for b in got for d in b if d >= 0]
    assert sorted([*seen, *rest]) == all_doc_ids(dataset).tolist()


def test_a_state_without_nodes_keeps_the_layout_it_always_had(dataset):
    ds = PackedDataset(dataset, **KW)
    assert "nodes" not in PackedDataLoader(ds).state_dict()["packed_dataset"]["layout"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"nodes": 0}, "nodes must be an integer >= 1, got 0"),
        ({"nodes": 1.5}, "nodes must be an integer"),
        ({"nodes": "two"}, "nodes must be an integer >= 1, got 'two'"),
        ({"nodes": 2, "rows_per_batch": None, "tokens_per_batch": 256}, "needs rows_per_batch"),
        ({"nodes": 2, "shuffle_window": 0}, "needs shuffle windows"),
        ({"nodes": 3}, "nodes=3 does not divide the 4"),
    ],
)
def test_settings_nodes_cannot_take_are_one_line(dataset, kw, message):
    with pytest.raises(ConfigError, match=message):
        PackedDataset(dataset, rank=0, world_size=RANKS, **{**KW, **kw})


def test_the_stored_order_is_dealt_to_nodes_too(dataset):
    seen = []
    for rank in range(RANKS):
        ds = PackedDataset(dataset, rank=rank, world_size=RANKS, nodes=NODES, shuffle=False, **KW)
        seen += [d for b in ds for d in _doc_ids(b)]
    assert sorted(seen) == all_doc_ids(dataset).tolist()


def test_a_mixture_refuses_nodes(dataset):
    with pytest.raises(ConfigError, match="nodes > 1 is for a PackedDataset"):
        MixedDataset([SourceSpec(name="a", path=str(dataset), weight=1)], rows_per_batch=2, nodes=2)


@pytest.mark.parametrize(
    ("env", "nodes"),
    [
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "SLURM_NNODES": "9"}, 2),  # torchrun
        ({"SLURM_NNODES": "2"}, 2),  # srun starting every rank
        ({}, 1),
    ],
)
def test_auto_takes_the_launchers_node_count(dataset, monkeypatch, env, nodes):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ds = PackedDataset(dataset, rank=1, world_size=RANKS, nodes="auto", **KW)
    assert ds.config.nodes == nodes
    want = PackedDataset(dataset, rank=1, world_size=RANKS, nodes=nodes, **KW)
    assert [b["doc_ids"].tolist() for b in ds] == [b["doc_ids"].tolist() for b in want]
    layout = PackedDataLoader(ds).state_dict()["packed_dataset"]["layout"]
    assert layout.get("nodes", 1) == nodes  # the number, not "auto", decides a resume


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2"}, "not a multiple of LOCAL_WORLD_SIZE=2"),
        ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "x"}, "are not process counts"),
        ({"SLURM_NNODES": "0"}, "is not a node count"),
    ],
)
def test_auto_with_launcher_values_it_cannot_use_is_one_line(dataset, monkeypatch, env, message):
    for name in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        PackedDataset(dataset, rank=0, world_size=RANKS, nodes="auto", **KW)


def test_auto_on_one_node_takes_any_batch_setting(dataset, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    budget = {"tokens_per_batch": 256, "rows_per_batch": None}
    ds = PackedDataset(dataset, rank=0, world_size=2, nodes="auto", **{**KW, **budget})
    assert ds.config.nodes == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # two nodes: a token budget cannot be dealt
    with pytest.raises(ConfigError, match="needs rows_per_batch"):
        PackedDataset(dataset, rank=0, world_size=2, nodes="auto", **{**KW, **budget})


@pytest.mark.parametrize("window", [1, 2, 3])
def test_each_ranks_worker_blocks_follow_its_own_nodes_windows(random_dataset, window):
    # One row a rank a step: a block of rank r is one window of its node's stream, so no row
    # group of its is in two blocks and its workers decode its rows' row groups once between
    # them. Blocks used to follow the middle node's windows (node 1 here): where windows differ
    # in size (shards' short last row groups) node 0's blocks cut its windows in two, and two
    # workers decoded each (1.85x the row groups of a node-0 rank over 4 workers, 8 nodes x 8
    # ranks of a 1.5 M-row dataset of 5,000-row shards).
    for rank in range(2):
        ds = PackedDataset(
            random_dataset, rank=rank, world_size=2, nodes=2, rows_per_batch=1,
            shuffle_window=window, seed=window,
        )  # fmt: skip
        block_row_groups(ds)


@settings(max_examples=40, deadline=None)
@given(
    n_rows=st.integers(1, 60),
    group_rows=st.integers(1, 5),
    shard_rows=st.integers(1, 20),
    nodes=st.integers(1, 3),
    ranks=st.integers(1, 3),
    rows=st.integers(1, 3),
    window=st.integers(1, 3),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    balance=st.booleans(),
)
def test_every_row_at_most_once_and_all_without_drop_last(
    tmp_path_factory, n_rows, group_rows, shard_rows, nodes, ranks, rows, window, shuffle,
    drop_last, balance,
):  # fmt: skip
    path = tmp_path_factory.mktemp("any") / "ds"
    write_random_dataset(
        path, n_rows=n_rows, max_len=32, mean_doc=5, rows_per_shard=shard_rows,
        row_group_rows=group_rows, seed=n_rows,
    )  # fmt: skip
    world, seen, steps = nodes * ranks, [], set()
    for rank in range(world):
        ds = PackedDataset(
            path, rank=rank, world_size=world, nodes=nodes, rows_per_batch=rows,
            shuffle_window=window, shuffle=shuffle, drop_last=drop_last, balance=balance, seed=3,
        )  # fmt: skip
        batches = list(ds)
        steps.add(len(batches))  # every rank runs the same steps (collectives never hang)
        seen += [d for b in batches for d in _doc_ids(b)]
    assert len(steps) == 1
    want = all_doc_ids(path).tolist()
    assert len(seen) == len(set(seen)) and set(seen) <= set(want)
    if not drop_last:
        assert sorted(seen) == want


def test_a_filler_batch_repeats_a_row_of_its_own_node(dataset):
    # 2 nodes x 1 rank, 7 rows a batch: the last step leaves a rank short, which repeats a row
    # as a filler; one of another node's windows was a row group downloaded for nothing.
    fillers = 0
    for rank in range(2):
        kw = {**KW, "rows_per_batch": 7}
        ds = PackedDataset(dataset, rank=rank, world_size=2, nodes=2, **kw)
        plan = ds.plan(0)
        rows = [ds.rows_for(plan, s) for s in range(plan.num_steps)]
        fillers += sum(len(r) == 0 for r in rows)
        mine = _node_groups(ds, [r for r in rows if len(r)])
        assert int(ds.store.row_group_of(np.array([ds.filler_row(plan)]))[0]) in mine
    assert fillers  # the case arises
