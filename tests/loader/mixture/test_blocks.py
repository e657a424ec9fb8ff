"""Planning a block of steps at once (`loader.mixture.steps.plan_blocks`) against the plain
planner it replaced: one rank batch cut after another, one step at a time (`reference_steps`
below, the code before blocks). For random batch settings, ranks, world sizes, balance, static
shapes, drop_last and lengths (hypothesis), every step is the same: its rows and every field of
them, filler, stream range and the state after it."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader import MixedDataset
from loader.mixture import steps as mixture_steps
from loader.mixture.steps import (
    STEP_FIELDS,
    RowStream,
    cut_steps,
    least_tokens,
    plan_blocks,
    plan_steps,
    rank_step,
)
from tests.loader.mixture.test_dataset import sources, spec

__all__ = ["sources"]  # the module fixture, shared with test_mixture.py


def reference_cut(ds, stream):
    """The next global step's rank batches, cut one after another (the planner before
    blocks)."""
    c = ds.config
    out = []
    p = stream.p
    for _ in range(ds.world_size):
        if c.rows_per_batch is not None:
            n = min(
                stream.ensure(p - stream.p + c.rows_per_batch) - (p - stream.p), c.rows_per_batch
            )
        else:
            want = max(64, 2 * c.tokens_per_batch // ds.max_len)
            while True:
                got = stream.ensure(p - stream.p + want) - (p - stream.p)
                i = p - stream.base
                n = int(
                    np.searchsorted(stream.cum_len, stream.cum_len[i] + c.tokens_per_batch, "right")
                ) - 1 - i  # fmt: skip
                if ds.max_docs is not None:
                    docs = np.searchsorted(
                        stream.cum_docs, stream.cum_docs[i] + ds.max_docs - 1, "right"
                    )
                    n = min(n, int(docs) - 1 - i)
                if n < got or got < want:
                    break
                want *= 2
            n = max(min(n, got), 1) if got else 0
        if n == 0:
            break
        out.append((p, p + n))
        p += n
    stream.p = p
    return out


def reference_steps(ds, stream, first):
    """Every global step from `first`, planned one at a time: (step, rows, filler, begin, end,
    state after it)."""
    c = ds.config
    total = ds.spec.total_steps
    step = first
    while total is None or step < total:
        ranges = reference_cut(ds, stream)
        if not ranges:
            return
        short = len(ranges) < ds.world_size or (
            c.rows_per_batch is not None and ranges[-1][1] - ranges[-1][0] < c.rows_per_batch
        )
        if short and c.drop_last:
            return
        end = ranges[-1][1]
        s = rank_step(ds, stream, step, ranges, end)
        start, chunk, _ = next(x for x in reversed(stream.chunks) if x[0] <= end)
        state = ds.state_at(step + 1, stream.schedule.state_after(chunk, end - start))
        yield s.step, s.rows, s.filler, s.begin, s.end, state
        step += 1
        if short:
            return


def planned(ds, first=0):
    stream = RowStream(ds, ds.start_state()["schedule"])
    for s in plan_steps(ds, stream, first, lambda k: True):
        yield s.step, s.rows, s.filler, s.begin, s.end, s.state


def assert_same_steps(ds_a, ds_b):
    ref = list(reference_steps(ds_a, RowStream(ds_a, ds_a.start_state()["schedule"]), 0))
    got = list(planned(ds_b))
    assert len(got) == len(ref)
    for g, r in zip(got, ref, strict=True):
        assert g[0] == r[0] and g[2:] == r[2:], (g[0], g[2:5], r[2:5])
        assert set(g[1]) == set(STEP_FIELDS)
        for f in STEP_FIELDS:
            np.testing.assert_array_equal(g[1][f], r[1][f], err_msg=f"step {g[0]} field {f}")


examples = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@examples
@given(
    batch=st.one_of(
        st.tuples(st.just("rows_per_batch"), st.integers(1, 9)),
        st.tuples(st.just("tokens_per_batch"), st.integers(64, 900)),
    ),
    world=st.integers(1, 4),
    rank_seed=st.integers(0, 3),
    balance=st.booleans(),
    drop_last=st.booleans(),
    length=st.one_of(
        st.tuples(st.just("total_tokens"), st.integers(100, 12_000)),
        st.tuples(st.just("total_steps"), st.integers(1, 90)),
    ),
    window=st.sampled_from([0, 2]),
    sizes=st.tuples(
        st.sampled_from([4096, 5, 37]),
        st.sampled_from([65536, 3, 50]),
        st.sampled_from([64, 1, 3]),
        st.sampled_from([None, 1, 7]),
    ),
)
def test_blocks_plan_the_steps_one_step_at_a_time_planned(
    sources, batch, world, rank_seed, balance, drop_last, length, window, sizes
):
    """`sizes`: rows read from the schedule at a time, rows kept before forgetting, steps per
    block, rows a rank batch is guessed to hold (small ones put chunk ends, forgetting, block
    ends and the end of the rows read inside rank batches)."""
    rank = rank_seed % world
    kw = {length[0]: length[1]}
    if length[0] == "total_steps":
        kw["total_tokens"] = None

    def make():
        return MixedDataset(
            spec(sources, **kw),
            rank=rank,
            world_size=world,
            balance=balance,
            drop_last=drop_last,
            shuffle_window=window,
            **{batch[0]: batch[1]},
        )

    read, forget, block, guess = sizes
    real_guess = mixture_steps._batch_rows_guess
    with (
        mock.patch.object(mixture_steps, "_batch_rows_guess", lambda ds: guess or real_guess(ds)),
        mock.patch.object(mixture_steps, "READ_ROWS", read),
        mock.patch.object(mixture_steps, "FORGET_ROWS", forget),
        mock.patch.object(mixture_steps, "BLOCK_STEPS", block),
    ):
        assert_same_steps(make(), make())


@pytest.mark.parametrize("batch", [{"tokens_per_batch": 256}, {"rows_per_batch": 3}])
def test_static_shape_document_cap_is_cut_as_one_step_at_a_time(sources, batch):
    def make():
        return MixedDataset(
            spec(sources, total_tokens=20_000), static_shape=True, max_docs_per_batch=24, **batch
        )

    assert_same_steps(make(), make())


def test_a_block_is_one_gather_its_steps_slices_of_it(sources):
    """A block's steps are consecutive slices of its rows, each step's rows grouped by source
    in mixture order and in stream order within a source."""
    ds = MixedDataset(spec(sources, total_tokens=20_000), tokens_per_batch=200, world_size=2)
    stream = RowStream(ds, None)
    blocks = list(plan_blocks(ds, stream, 0, lambda k: True))
    assert len(blocks) > 1 and max(len(b.steps) for b in blocks) > 1
    for b in blocks:
        assert b.offsets[0] == 0 and b.offsets[-1] == len(b.rows["src"])
        for s, lo, hi in zip(b.steps, b.offsets, b.offsets[1:], strict=False):
            for f in STEP_FIELDS:
                assert np.shares_memory(s.rows[f], b.rows[f]) or hi == lo
                np.testing.assert_array_equal(s.rows[f], b.rows[f][lo:hi])
            src = s.rows["src"]
            assert (np.diff(src) >= 0).all()


def test_cut_steps_stops_at_the_end_of_the_stream(sources):
    """The last step of a finished stream may have fewer ranks' batches; nothing after it."""
    ds = MixedDataset(spec(sources, total_tokens=3000), tokens_per_batch=300, world_size=3)
    stream = RowStream(ds, None)
    steps = cut_steps(ds, stream, 10_000)
    flat = [r for step in steps for r in step]
    assert flat[0][0] == 0 and all(a[1] == b[0] for a, b in zip(flat, flat[1:], strict=False))
    assert all(len(step) == 3 for step in steps[:-1]) and 1 <= len(steps[-1]) <= 3
    assert stream.schedule.done is not None and flat[-1][1] == stream.end
    assert cut_steps(ds, stream, 5) == []


@examples
@given(
    reads=st.lists(
        st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=25,
    )
)
def test_a_source_describes_its_rows_as_computed_afresh(sources, reads):
    """`PackedSource.lengths` / `describe_rows` (served from the ranges read recently) give
    what the epoch order and the row counts give for any sequence of reads."""
    ds = MixedDataset(spec(sources), tokens_per_batch=200, shuffle_window=2)
    src = ds.sources[0]
    for epoch, start, n, lengths in reads:
        ids = src.order(epoch).rows(start, start + n)
        want_len, want_docs, want_sq = src.index.stats(ids)
        groups = src.store.row_group_of(ids)
        if lengths:
            np.testing.assert_array_equal(src.lengths(epoch, start, n), want_len)
        else:
            got = src.describe_rows(epoch, start, n)
            want = (ids, want_docs, want_sq, groups, ids - src.store.row_group_starts[groups])
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g, w)


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 8), min_size=1, max_size=6),
    first=st.integers(0, 20),
    count=st.integers(0, 20),
    seed=st.integers(0, 2**16),
)
def test_least_tokens_is_at_most_what_the_rows_hold_in_any_order(lengths, first, count, seed):
    """`len()` in tokens skips counting the steps where a cap is out of reach of this bound:
    it must never exceed the tokens of those rows, whatever each epoch's order."""
    n, rng = len(lengths), np.random.default_rng(seed)
    rows = np.concatenate([rng.permutation(lengths) for _ in range((first + count) // n + 1)])
    held = int(rows[first : first + count].sum())
    assert least_tokens(first, first + count, n, sum(lengths), 8) <= held


def test_least_tokens_counts_whole_epochs_exactly():
    # 3 rows of <= 8 tokens, 20 an epoch: from row 2 to row 11 (epoch 0's last row, epochs
    # 1 and 2 whole, epoch 3's first 2 rows): at least 20 - 2 * 8, 2 x 20, 20 - 8
    assert least_tokens(2, 11, 3, 20, 8) == 4 + 40 + 12
    assert least_tokens(0, 3 * 10**6, 3, 20, 8) == 20 * 10**6  # O(1), not a loop of epochs
    assert least_tokens(5, 5, 3, 20, 8) == least_tokens(6, 5, 3, 20, 8) == 0
