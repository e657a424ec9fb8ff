"""loader/order/nodes.py: the order dealt to nodes against a plain reference, and its locality."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.order.nodes import NodeOrder
from loader.order.permutation import EpochOrder
from loader.order.steps import EpochPlan, block_steps_bound, iter_blocks


def _starts(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


def reference(base: EpochOrder, nodes: int, stripe: int) -> np.ndarray:
    """The module docstring's layout, built whole: window j's rows go to stream j % nodes; block
    b holds rows `b*stripe ..` of each stream in turn while every stream fills its stripe; then
    what is left of each stream, one stream after another."""
    full = np.asarray(base)
    cuts = base.window_starts
    streams = [
        np.concatenate([full[cuts[j] : cuts[j + 1]] for j in range(c, base.num_windows, nodes)])
        if c < base.num_windows
        else np.zeros(0, np.int64)
        for c in range(nodes)
    ]
    blocks = min(len(s) for s in streams) // stripe
    out = [s[b * stripe : (b + 1) * stripe] for b in range(blocks) for s in streams]
    out += [s[blocks * stripe :] for s in streams]
    return np.concatenate(out).astype(np.int64)


@settings(max_examples=150, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 40), min_size=0, max_size=40),
    stored=st.booleans(),
    window=st.integers(1, 5),
    nodes=st.integers(1, 6),
    stripe=st.integers(1, 30),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_node_order_is_the_reference_and_any_range_agrees(
    sizes, stored, window, nodes, stripe, seed, data
):
    starts = _starts(sizes)
    n = int(starts[-1])

    def base() -> EpochOrder:
        return EpochOrder(
            starts, fingerprint="f", seed=seed, epoch=1, shuffle=not stored, window=window
        )

    order = NodeOrder(base(), nodes=nodes, stripe=stripe)
    full = np.asarray(order)
    want = reference(base(), nodes, stripe)
    assert np.array_equal(full, want)
    assert np.array_equal(np.sort(full), np.arange(n))  # every row once
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    fresh = NodeOrder(base(), nodes=nodes, stripe=stripe)  # nothing cached
    assert np.array_equal(fresh.rows(a, b), full[a:b])
    if a < n:
        assert fresh[a] == full[a]
    # Each position's window is the plain order's window of its row (where that row lies in
    # the plain order: the inverse of its permutation).
    where = np.empty(n, dtype=np.int64)
    where[np.asarray(base())] = np.arange(n)
    assert np.array_equal(order.window_of(np.arange(a, b)), base().window_of(where[full[a:b]]))


@pytest.mark.parametrize(
    ("sizes", "nodes", "ranks", "rows", "stored"),
    [
        ([16] * 200, 4, 2, 3, False),
        ([16] * 199 + [5], 3, 4, 2, False),
        ([7, 16, 16, 3] * 40, 2, 8, 1, True),
    ],
)
def test_each_node_reads_rows_of_its_own_windows_until_the_tail(sizes, nodes, ranks, rows, stored):
    starts = _starts(sizes)
    base = EpochOrder(starts, fingerprint="f", seed=5, epoch=0, shuffle=not stored, window=4)
    order = NodeOrder(base, nodes=nodes, stripe=ranks * rows)
    plan = EpochPlan(order, world_size=nodes * ranks, rows_per_batch=rows)
    position = {int(r): p for p, r in enumerate(np.asarray(base))}
    checked = 0
    for step in range(plan.num_steps):
        if (step + 1) * nodes * ranks * rows > order.tail_start:
            break  # the tail: the streams' last rows, one after another
        for rank, got in enumerate(plan.step_rows(step)):
            windows = base.window_of(np.array([position[int(r)] for r in got]))
            assert (windows % nodes == rank // ranks).all()  # node n's windows: n, n + nodes..
            checked += len(got)
    assert checked > 0.8 * int(starts[-1])  # the tail is short
    # Every row once over the whole plan, tail included.
    seen = np.concatenate([r for s in range(plan.num_steps) for r in plan.step_rows(s)])
    assert np.array_equal(np.sort(seen), np.arange(int(starts[-1])))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=60),
    window=st.integers(1, 6),
    nodes=st.integers(2, 5),
    ranks=st.integers(1, 4),
    rows=st.integers(1, 6),
)
def test_worker_blocks_stay_within_the_bound(sizes, window, nodes, ranks, rows):
    # The transport ring has block_steps_bound slots: a block with more steps would not fit.
    base = EpochOrder(_starts(sizes), fingerprint="f", seed=0, epoch=0, window=window)
    order = NodeOrder(base, nodes=nodes, stripe=ranks * rows)
    plan = EpochPlan(order, world_size=nodes * ranks, rows_per_batch=rows)
    bound = block_steps_bound(plan, max_len=64)
    for node in (None, *range(nodes)):  # a rank's blocks follow its node's windows
        assert max((b - a for a, b in iter_blocks(plan, 0, node=node)), default=0) <= bound


def test_the_free_order_has_no_windows_to_deal():
    base = EpochOrder(_starts([10] * 5), fingerprint="f", seed=0, epoch=0, window=0)
    with pytest.raises(ValueError, match="no windows"):
        NodeOrder(base, nodes=2, stripe=4)
