"""loader/order/balance.py: LPT assignment, caps, and balanced ranks still see every row once."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataset
from loader.order.balance import balance_step, imbalance, step_loads
from loader.testing import write_dataset
from tests.loader.conftest import all_doc_ids


def test_lpt_exact_assignment():
    cost = np.array([10.0, 9, 8, 1, 1, 1])
    a = balance_step(np.arange(6), cost, 2)
    assert a.tolist() == [0, 1, 1, 0, 0, 0]
    assert step_loads(cost, a, 2).tolist() == [13.0, 17.0]
    capped = balance_step(np.arange(6), cost, 2, rows_cap=3)
    assert capped.tolist() == [0, 1, 1, 0, 0, 1]
    lengths = np.array([5, 5, 5, 1, 1, 1])
    assert balance_step(np.arange(6), cost, 2, lengths=lengths, tokens_cap=4) is None


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 100), min_size=1, max_size=7), st.integers(1, 3))
def test_lpt_is_within_four_thirds_of_optimal(costs, world):
    cost = np.array(costs, dtype=np.float64)
    a = balance_step(np.arange(len(cost)), cost, world)
    got = step_loads(cost, a, world).max()
    best = min(
        np.bincount(np.array(p), weights=cost, minlength=world).max()
        for p in itertools.product(range(world), repeat=len(cost))
    )
    assert got <= 4 / 3 * best + 1e-9
    assert imbalance(step_loads(cost, a, world)) >= 1.0


@pytest.fixture(scope="module")
def skewed(tmp_path_factory):
    path = tmp_path_factory.mktemp("bal") / "skewed"
    # Rows of one long document mixed with rows of many short ones: equal tokens, unequal Σ len².
    rows = []
    rng = np.random.default_rng(0)
    for i in range(24):
        if i % 3 == 0:
            rows.append([list(rng.integers(0, 100, 250))])
        else:
            rows.append([list(rng.integers(0, 100, 25)) for _ in range(10)])
    write_dataset(path, rows, max_len=256, rows_per_shard=24, row_group_rows=8)
    return path


@pytest.mark.parametrize("settings_", [{"rows_per_batch": 2}, {"tokens_per_batch": 520}])
def test_balanced_ranks_keep_exactly_once_and_caps(skewed, settings_):
    expected = all_doc_ids(skewed).tolist()
    seen, steps = [], set()
    for rank in range(3):
        ds = PackedDataset(skewed, rank=rank, world_size=3, balance=True, seed=2, **settings_)
        batches = list(ds)
        steps.add(len(batches))
        for b in batches:
            seen += b["doc_ids"][b["doc_ids"] >= 0].tolist()
            if "tokens_per_batch" in settings_:
                assert b["input_ids"].numel() <= 520
            else:
                assert b["doc_ids"].numel() <= 2 * 10
    assert sorted(seen) == expected
    assert len(steps) == 1


def test_balance_report_improves_on_skewed_rows(skewed):
    ds = PackedDataset(skewed, rows_per_batch=2, world_size=3, rank=0, balance=True, seed=2)
    report = ds.balance_report()
    assert report["imbalance_after"] < report["imbalance_before"]
    assert report["imbalance_after"] >= 1.0


def test_loader_md_quotes_the_skewed_datasets_report(skewed):
    # docs/loader.md said 1.08 -> 1.03, a figure no seed gives; seed 2 (this module's) gives
    # 1.058 -> 1.033.
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "loader.md").read_text(encoding="utf-8")
    match = re.search(r"seed (\d+)[^\n]*\n?[^\n]*drops from (\d\.\d+) to (\d\.\d+)", doc)
    assert match, "docs/loader.md: no 'seed N ... drops from X to Y' in Rank balance"
    seed, before, after = int(match.group(1)), match.group(2), match.group(3)
    report = PackedDataset(
        skewed, rows_per_batch=2, world_size=3, rank=0, balance=True, seed=seed
    ).balance_report()
    assert (before, after) == (
        f"{report['imbalance_before']:.3f}",
        f"{report['imbalance_after']:.3f}",
    )


def _rank_cost(batch: dict, linear: float) -> float:
    """Σ len² + linear × tokens over a batch's real documents (padding and filler excluded)."""
    lens = np.diff(batch["cu_seqlens"].numpy()).astype(np.float64)
    lens = lens[batch["doc_ids"].numpy() >= 0]
    return float((lens**2).sum() + linear * lens.sum())


@pytest.mark.parametrize(
    "settings_",
    [
        # A document cap tighter than the budget's: the balanced split of some steps does not
        # fit it, so those steps keep the plain split. Before, the report ignored the cap and
        # said 1.197 where the ranks got 1.246.
        {"tokens_per_batch": 520, "static_shape": True, "max_docs_per_batch": 12},
        {"tokens_per_batch": 520},
        {"rows_per_batch": 2, "static_shape": True},
    ],
)
def test_balance_report_matches_what_the_ranks_receive(skewed, settings_):
    world = 3
    common = dict(world_size=world, balance=True, seed=2, **settings_)
    report = PackedDataset(skewed, rank=0, **common).balance_report()
    per_rank = [
        [_rank_cost(b, 1024.0) for b in PackedDataset(skewed, rank=r, **common)]
        for r in range(world)
    ]
    assert len({len(c) for c in per_rank}) == 1 and len(per_rank[0]) == report["steps"]
    got = float(np.mean([imbalance(np.array(step)) for step in zip(*per_rank, strict=True)]))
    assert report["imbalance_after"] == pytest.approx(got, rel=1e-12)
