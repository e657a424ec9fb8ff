"""loader/order/permutation.py: every lazy order is a permutation, computed window by window."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.order.permutation import EpochOrder, FeistelPermutation


def _starts(sizes: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


group_sizes = st.lists(st.integers(0, 40), min_size=0, max_size=30)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 5000), key=st.integers(0, 2**64 - 1))
def test_feistel_is_a_bijection(n, key):
    perm = FeistelPermutation(n, np.array([key, key ^ 0xFFFF, 7], dtype=np.uint64))
    out = perm(np.arange(n))
    assert np.array_equal(np.sort(out), np.arange(n))
    # Any sub-range gives the same images as the whole (positions are independent).
    a, b = n // 3, (2 * n) // 3
    assert np.array_equal(perm(np.arange(a, b)), out[a:b])


@settings(max_examples=150, deadline=None)
@given(
    sizes=group_sizes,
    kind=st.sampled_from(["stored", "free", "windowed"]),
    window=st.integers(1, 5),
    seed=st.integers(0, 3),
    epoch=st.integers(0, 3),
    data=st.data(),
)
def test_every_order_is_a_permutation_and_any_range_agrees(sizes, kind, window, seed, epoch, data):
    starts = _starts(sizes)
    n = int(starts[-1])
    order = EpochOrder(
        starts,
        fingerprint="f",
        seed=seed,
        epoch=epoch,
        shuffle=kind != "stored",
        window=0 if kind == "free" else window,
    )
    full = np.asarray(order)
    assert len(order) == n and np.array_equal(np.sort(full), np.arange(n))
    if kind == "stored":
        assert np.array_equal(full, np.arange(n))  # shuffle=False keeps the stored order
    a = data.draw(st.integers(0, n))
    b = data.draw(st.integers(a, n))
    # A fresh order (nothing cached) computes any range alone, equal to the whole order's.
    fresh = EpochOrder(
        starts,
        fingerprint="f",
        seed=seed,
        epoch=epoch,
        shuffle=kind != "stored",
        window=0 if kind == "free" else window,
    )
    assert np.array_equal(fresh.rows(a, b), full[a:b])
    if n:
        i = data.draw(st.integers(0, n - 1))
        assert fresh[i] == full[i] and fresh[-1] == full[-1]


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 12), min_size=1, max_size=25), window=st.integers(1, 4))
def test_windowed_order_keeps_each_window_of_row_groups_together(sizes, window):
    starts = _starts(sizes)
    order = EpochOrder(starts, fingerprint="f", seed=0, epoch=0, window=window)
    full = np.asarray(order)
    group = np.searchsorted(starts, full, side="right") - 1
    for j in range(order.num_windows):
        a, b = order.window_starts[j : j + 2]
        inside = set(group[a:b].tolist())
        assert len(inside) <= window
        assert sum(sizes[g] for g in inside) == b - a  # the window holds whole row groups
        assert (order.window_of(np.arange(a, b)) == j).all()


def test_orders_depend_on_fingerprint_seed_epoch_only():
    starts = _starts([10] * 20)

    def make(fp="f", seed=0, epoch=0, window=4):
        return np.asarray(EpochOrder(starts, fingerprint=fp, seed=seed, epoch=epoch, window=window))

    assert np.array_equal(make(), make())
    for other in (make(fp="g"), make(seed=1), make(epoch=1)):
        assert not np.array_equal(make(), other)
    assert not np.array_equal(make(window=0), make(window=0, epoch=1))


def test_state_grows_with_row_groups_not_rows():
    # 10^8 rows in 256-row row groups: the order holds ~4 bytes per row group.
    starts = np.arange(0, 10**8 + 1, 256, dtype=np.int64)
    order = EpochOrder(starts, fingerprint="f", seed=0, epoch=0, window=16)
    rows = order.rows(5 * 10**7, 5 * 10**7 + 10_000)  # the middle of the epoch
    assert len(np.unique(rows)) == 10_000 and rows.min() >= 0 and rows.max() < 10**8
    assert order.nbytes < 8 * len(starts)  # vs 800 MB for the row ids
    free = EpochOrder(starts, fingerprint="f", seed=0, epoch=0, window=0)
    assert free.nbytes < 1024
    assert len(np.unique(free.rows(0, 10_000))) == 10_000


def test_slicing_with_a_step_is_refused():
    order = EpochOrder(_starts([4, 4]), fingerprint="f", seed=0, epoch=0)
    with pytest.raises(ValueError, match="step 1 only"):
        order[::2]
    with pytest.raises(IndexError):
        order[8]


def test_row_groups_come_in_the_order_of_the_earlier_version():
    # Only the rows inside each window are shuffled differently from before (docs/loader.md).
    from loader.order.permutation import order_entropy

    sizes = [7, 3, 9, 4, 4, 1, 8, 2, 6, 5]
    starts = _starts(sizes)
    order = EpochOrder(starts, fingerprint="f", seed=2, epoch=1, window=3)
    before = np.random.default_rng(order_entropy("f", 2, 1)).permutation(len(sizes))
    full = np.asarray(order)
    groups = np.searchsorted(starts, full, side="right") - 1
    for j in range(order.num_windows):
        a, b = order.window_starts[j : j + 2]
        assert set(groups[a:b].tolist()) == set(before[3 * j : 3 * j + 3].tolist())


def _feistel_as_written(n: int, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The free order's Feistel network as first written (new arrays at every step): a run
    resumed by a later version must see the same order, so the in-place one must agree."""

    def mix(x):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))

    half = max(1, -(-max(n - 1, 1).bit_length() // 2))
    mask, shift = np.uint64((1 << half) - 1), np.uint64(half)

    def encrypt(x):
        left, right = x >> shift, x & mask
        for key in keys:
            left, right = right, left ^ (mix(right ^ key) & mask)
        return (left << shift) | right

    y = encrypt(positions.astype(np.uint64))
    while (y >= np.uint64(n)).any():
        walk = y >= np.uint64(n)
        y[walk] = encrypt(y[walk])
    return y.astype(np.int64)


@pytest.mark.parametrize("n", [1, 2, 6, 23, 1000, 70_001])
def test_feistel_gives_the_images_it_gave_when_first_written(n):
    keys = np.random.default_rng(n).integers(0, 2**64 - 1, size=6, dtype=np.uint64)
    positions = np.arange(n, dtype=np.int64)
    assert np.array_equal(
        FeistelPermutation(n, keys)(positions), _feistel_as_written(n, keys, positions)
    )
