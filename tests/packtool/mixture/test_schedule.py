"""The mixture schedule (packtool/mixture/schedule.py): exact proportions on every prefix, epochs, caps,
the numba kernel against the plain reference, and resume (same and changed mixtures)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError, DataError
from packtool.mixture.deficit import mix_kernel
from packtool.mixture.schedule import Schedule, SyntheticLengths
from packtool.mixture.spec import SourceSpec
from packtool.pack.reference import mix_reference


class ListReader:
    """Row lengths of a source: `base` permuted per epoch (a stand-in for an epoch order)."""

    def __init__(self, base, window=None):
        self.base = np.asarray(base, dtype=np.int64)
        if window:
            self.window = window

    def epoch_rows(self, epoch):
        return len(self.base)

    def order(self, epoch):
        return np.random.default_rng(epoch).permutation(len(self.base))

    def lengths(self, epoch, start, n):
        return self.base[self.order(epoch)][start : start + n]


class StreamReader(ListReader):
    """Like an online-packed source: the epoch length is not known ahead."""

    def epoch_rows(self, epoch):
        return None


def specs(weights, **kw):
    return [SourceSpec(name=f"s{i}", path="x", weight=w, **kw) for i, w in enumerate(weights)]


def run(schedule, n_rows, step=97):
    """(src, epoch, pos, length) of the next `n_rows` rows, pulled `step` at a time."""
    out = []
    got = 0
    while got < n_rows and schedule.done is None:
        c = schedule.next(min(step, n_rows - got))
        out.append(np.stack([c.src.astype(np.int64), c.epoch, c.pos, c.length]))
        got += len(c)
    return np.concatenate(out, axis=1) if out else np.zeros((4, 0), np.int64)


def max_lag(weights, src, length, unit):
    """The largest |d_i - w_i D| over every prefix, in exact fractions (units of a row: tokens
    in tokens mode, rows in rows mode)."""
    total = sum(Fraction(w) for w in weights)
    w = [Fraction(x) / total for x in weights]
    d = [0] * len(weights)
    big = Fraction(0)
    D = 0
    for s, n in zip(src.tolist(), length.tolist(), strict=True):
        u = n if unit == "tokens" else 1
        d[s] += u
        D += u
        big = max(big, *(abs(di - wi * D) for di, wi in zip(d, w, strict=True)))
    return big


weights_st = st.lists(
    st.one_of(st.floats(0.001, 1.0), st.integers(1, 9).map(float)), min_size=1, max_size=6
)


@settings(max_examples=150, deadline=None)
@given(
    weights=weights_st,
    data=st.data(),
    unit=st.sampled_from(["tokens", "rows"]),
    max_len=st.sampled_from([1, 7, 64]),
)
def test_every_prefix_is_within_one_row_of_its_target(weights, data, unit, max_len):
    bases = [data.draw(st.lists(st.integers(1, max_len), min_size=1, max_size=30)) for _ in weights]
    sch = Schedule(specs(weights), [ListReader(b) for b in bases], unit=unit, max_len=max_len)
    rows = run(sch, 600)
    assert rows.shape[1] == 600
    one_row = max_len if unit == "tokens" else 1
    assert max_lag(weights, rows[0], rows[3], unit) < one_row + 1e-9


def test_megatron_greedy_drifts_past_one_row_where_this_rule_does_not():
    # The classic largest-deficit choice (Megatron's build_blending_indices) on one small case.
    weights = [0.01, 0.87, 0.04]
    w = np.array(weights) / sum(weights)
    counts, worst = np.zeros(3), 0.0
    for n in range(1, 200):
        i = int(np.argmax(w * max(n - 1, 1) - counts))
        counts[i] += 1
        worst = max(worst, float(np.abs(counts - w * n).max()))
    ours = run(Schedule(specs(weights), [ListReader([1])] * 3, unit="rows", max_len=1), 199)
    assert worst > 1.0
    assert max_lag(weights, ours[0], ours[3], "rows") < 1


@settings(max_examples=100, deadline=None)
@given(
    weights=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=5).filter(lambda w: sum(w) > 0),
    data=st.data(),
    tokens_mode=st.booleans(),
)
def test_kernel_matches_the_plain_reference(weights, data, tokens_mode):
    k = len(weights)
    windows = [data.draw(st.lists(st.integers(1, 50), max_size=20)) for _ in range(k)]
    seg = data.draw(st.lists(st.integers(0, 300), min_size=k, max_size=k))
    caps = data.draw(st.lists(st.integers(-1, 10), min_size=k, max_size=k))
    caps = [c if c != 0 else -1 for c in caps]
    left = data.draw(st.integers(1, 2000))
    w = np.asarray(weights, np.float64) / sum(weights)
    buf = np.asarray([x for win in windows for x in win], np.int64)
    wpos = np.cumsum([0] + [len(x) for x in windows[:-1]]).astype(np.int64)
    wend = wpos + np.asarray([len(x) for x in windows], np.int64)
    seg_k = np.asarray(seg, np.int64)
    cap_k = np.asarray(caps, np.int64)
    src, length, idx, status, which, left_k = mix_kernel(
        w,
        seg_k,
        buf,
        wpos,
        wend,
        cap_k,
        tokens_mode=tokens_mode,
        max_units=50,
        tokens_left=left,
        n_out=40,
    )
    seg_r, cap_r = list(seg), list(caps)
    ref = mix_reference(
        w.tolist(),
        seg_r,
        [list(x) for x in windows],
        cap_r,
        tokens_mode=tokens_mode,
        max_units=50,
        tokens_left=left,
        n_out=40,
    )
    assert src.tolist() == ref[0]
    assert (status, left_k) == (ref[1], ref[3])
    if status in (1, 2):
        assert which == ref[2]
    assert seg_k.tolist() == seg_r and cap_k.tolist() == cap_r
    assert [
        windows[a][b] for a, b in zip(src.tolist(), idx.tolist(), strict=True)
    ] == length.tolist()


def test_every_row_of_every_epoch_once_in_epoch_order():
    bases = [[3, 1, 2, 5], [4] * 7, [1, 1]]
    readers = [ListReader(b) for b in bases]
    sch = Schedule(specs([0.5, 0.3, 0.2]), readers, unit="tokens", max_len=5)
    rows = run(sch, 500)
    for i, reader in enumerate(readers):
        mine = rows[:, rows[0] == i]
        n = len(bases[i])
        # positions run 0..n-1 in each epoch, epochs 0, 1, 2, ... in turn
        expect_epoch = np.arange(mine.shape[1]) // n
        assert mine[1].tolist() == expect_epoch.tolist()
        assert mine[2].tolist() == (np.arange(mine.shape[1]) % n).tolist()
        for e in np.unique(mine[1]):
            got = mine[3, mine[1] == e]
            assert got.tolist() == reader.lengths(int(e), 0, n)[: len(got)].tolist()


def test_stop_at_cap_ends_the_mixture_after_the_sources_last_row():
    sch = Schedule(
        [
            SourceSpec(name="big", path="x", weight=1),
            SourceSpec(name="small", path="x", weight=1, max_epochs=2, at_cap="stop"),
        ],
        [ListReader([2] * 100), ListReader([2] * 3)],
        unit="tokens",
        max_len=2,
    )
    rows = run(sch, 10_000)
    assert sch.done == "source 'small' reached max_epochs 2"
    assert int((rows[0] == 1).sum()) == 6  # two epochs of 3 rows
    assert rows[0, -1] == 1  # it ended right after the source's last row
    assert [e["what"] for e in sch.events] == ["stopped"]


def test_drop_at_cap_renormalises_and_each_segment_is_exact():
    weights = [0.5, 0.3, 0.2]
    sources = specs(weights)
    sources[2] = SourceSpec(name="s2", path="x", weight=0.2, max_epochs=1.5, at_cap="drop")
    readers = [ListReader([3] * 40), ListReader([1, 2, 3]), ListReader([2, 3] * 10)]
    sch = Schedule(sources, readers, unit="tokens", max_len=3)
    rows = run(sch, 400)
    assert int((rows[0] == 2).sum()) == 30  # 1.5 epochs of 20 rows
    (drop,) = [e for e in sch.events if e["what"] == "dropped"]
    assert drop["source"] == "s2" and "renormalised" in drop["message"]
    cut = drop["rows"]
    assert rows[0, cut - 1] == 2 and not (rows[0, cut:] == 2).any()
    assert max_lag(weights, rows[0, :cut], rows[3, :cut], "tokens") < 3
    assert max_lag([0.5, 0.3], rows[0, cut:], rows[3, cut:], "tokens") < 3
    assert sch.state()["sources"]["s2"]["capped"] is True


def test_every_source_capped_with_drop_ends_the_mixture():
    sch = Schedule(
        specs([1, 1], max_epochs=1, at_cap="drop"),
        [ListReader([1] * 4), ListReader([1] * 2)],
        unit="rows",
        max_len=1,
    )
    rows = run(sch, 100)
    assert rows.shape[1] == 6 and sch.done == "every source reached its max_epochs"


@pytest.mark.parametrize("weights", [[1, 2], [0, 1]])
def test_a_changed_mixture_resumed_with_every_weighted_source_capped_ends_at_once(weights):
    # A finished mixture of two `drop` sources, resumed with a weight changed (or the uncapped
    # one's weight 0): a changed mixture's `done` is not restored, the caps are, and `next`
    # spun forever (no weight left, nothing to refill).
    def schedule(w, state=None):
        return Schedule(
            [SourceSpec(name=f"s{i}", path="x", weight=x, max_epochs=1, at_cap="drop")
             for i, x in enumerate(w)],
            [ListReader([1] * 4), ListReader([1] * 2)], unit="rows", max_len=1, state=state,
        )  # fmt: skip

    first = schedule([1, 1])
    assert run(first, 100).shape[1] == 6 and first.done is not None
    again = schedule(weights, first.state())
    assert again.changes  # (the loader warns "resuming a changed mixture")
    assert again.done == "every source reached its max_epochs"
    assert len(again.next(10)) == 0


def capped_to(cap, n, state=None):
    """A one-source schedule of `n` one-token rows under max_epochs `cap`, at_cap stop."""
    source = SourceSpec(name="s", path="x", weight=1, max_epochs=cap, at_cap="stop")
    return Schedule([source], [ListReader([1] * n)], unit="rows", max_len=1, state=state)


@pytest.mark.parametrize("n", [10, 100, 400])
def test_a_fractional_cap_delivers_that_part_of_the_epoch_exactly(n):
    # (1.15 - 1) * 400 is 59.99999999999996 in floats: the cap delivered 459 rows, not 460
    for cap in ("0.29", "0.5", "0.57", "1.15", "1.2", "1.37", "2.3", "2.65", "3.9"):
        want = math.floor(Fraction(cap) * n)
        if want:
            assert run(capped_to(float(cap), n), 10 * n).shape[1] == want, cap
    # a cap computed as a ratio counts as that ratio: k/n of an epoch is k rows
    for k in range(1, n, max(n // 7, 1)):
        assert run(capped_to(k / n, n), 10 * n).shape[1] == k, (k, n)


def test_a_state_saved_at_a_fractional_cap_resumes_sensibly():
    # before exact caps, 1.15 x 400 rows ended at 459: such a state stays ended, with no
    # single row more; a state saved before the cap continues to the exact count, 460
    whole = capped_to(1.15, 400)
    run(whole, 10_000)
    old = whole.state()
    assert (old["sources"]["s"]["epoch"], old["sources"]["s"]["pos"]) == (1, 60)
    for key in ("pos", "rows", "tokens", "seg"):
        old["sources"]["s"][key] -= 1
    old["rows"] -= 1
    old["tokens"] -= 1
    ended = capped_to(1.15, 400, state=old)
    assert run(ended, 10_000).shape[1] == 0 and ended.done.endswith("max_epochs 1.15")
    early = capped_to(1.15, 400)
    first = run(early, 300)
    rest = run(capped_to(1.15, 400, state=early.state()), 10_000)
    assert first.shape[1] + rest.shape[1] == 460


def test_the_end_with_only_weight_0_sources_left_says_so():
    """A weight-0 source without max_epochs never reaches a cap: the end message said "every
    source reached its max_epochs" all the same (warning, describe()["events"], packtool mix)."""
    sources = [
        SourceSpec(name="a", path="x", weight=1, max_epochs=1, at_cap="drop"),
        SourceSpec(name="idle", path="x", weight=0),
    ]
    sch = Schedule(sources, [ListReader([1] * 4), ListReader([1] * 2)], unit="rows", max_len=1)
    rows = run(sch, 100)
    assert rows.shape[1] == 4 and set(rows[0].tolist()) == {0}
    assert "every source reached" not in sch.done
    assert sch.done == (
        "every source with a weight reached its max_epochs; only weight-0 source(s) 'idle' "
        "remain, which are never drawn from"
    )
    (stop,) = [e for e in sch.events if e["what"] == "stopped"]
    assert stop["message"] == f"the mixture ended: {sch.done}"


def test_total_tokens_ends_at_the_row_that_reaches_it():
    sch = Schedule(
        specs([1, 1]),
        [ListReader([3]), ListReader([5])],
        unit="tokens",
        max_len=5,
        total_tokens=100,
    )
    rows = run(sch, 10_000)
    assert 100 <= rows[3].sum() < 105 and rows[3][:-1].sum() < 100
    assert sch.done == "total_tokens 100 reached"


def test_zero_weight_source_keeps_its_cursor_and_is_never_drawn():
    sch = Schedule(specs([1, 0]), [ListReader([1]), ListReader([1])], unit="rows", max_len=1)
    rows = run(sch, 50)
    assert (rows[0] == 0).all()


def test_streaming_style_reader_caps_at_whole_epochs_only():
    with pytest.raises(ConfigError, match="fractional"):
        Schedule(
            [SourceSpec(name="s", path="x", max_epochs=0.5, weight=1)],
            [StreamReader([1, 2])],
            unit="rows",
            max_len=2,
        ).next(5)
    sch = Schedule(
        [
            SourceSpec(name="a", path="x", weight=1),
            SourceSpec(name="s", path="x", max_epochs=2, weight=1),
        ],
        [ListReader([1]), StreamReader([1, 2, 2])],
        unit="rows",
        max_len=2,
    )
    rows = run(sch, 1000)
    assert int((rows[0] == 1).sum()) == 6 and rows[0, -1] == 1


def test_an_empty_source_is_a_one_line_error():
    sch = Schedule(specs([1, 1]), [ListReader([1]), ListReader([])], unit="rows", max_len=1)
    with pytest.raises(DataError, match="source 's1' has no rows"):
        run(sch, 10)


def test_synthetic_lengths_hold_the_epoch_total_exactly():
    r = SyntheticLengths(7, 30)
    lens = r.lengths(0, 0, 100)
    assert lens.sum() == 30 and len(lens) == 7 and set(lens.tolist()) <= {4, 5}
    assert r.lengths(0, 3, 2).tolist() == lens[3:5].tolist()
    huge = SyntheticLengths(10**12, 4 * 10**15)
    assert huge.lengths(0, 10**12 - 2, 5).tolist() == [4000, 4000]


# --- resume -------------------------------------------------------------------------------


def make(weights=(0.5, 0.3, 0.2), fps=None, state=None, unit="tokens", total_tokens=None):
    bases = [[3, 1, 2, 5, 5], [4] * 7, [1, 1, 5]]
    return Schedule(
        specs(weights),
        [ListReader(b) for b in bases[: len(weights)]],
        unit=unit,
        max_len=5,
        fingerprints=fps,
        state=state,
        total_tokens=total_tokens,
    )


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(0, 300), step=st.integers(1, 50), unit=st.sampled_from(["tokens", "rows"]))
def test_resume_from_any_row_gives_the_same_stream(cut, step, unit):
    whole = run(make(unit=unit), 400)
    first = make(unit=unit)
    got = run(first, cut, step=step)
    # the state at a boundary inside the last chunk, as the loader takes it at a step boundary
    resumed = make(unit=unit, state=first.state())
    rest = run(resumed, 400 - got.shape[1], step=step)
    assert np.array_equal(np.concatenate([got, rest], axis=1), whole)
    assert resumed.changes == []


@settings(max_examples=40, deadline=None)
@given(cut=st.integers(1, 300), j=st.integers(0, 200), direct=st.booleans())
def test_state_after_inside_a_chunk_is_the_state_of_that_prefix(cut, j, direct):
    from unittest import mock

    import packtool.mixture.schedule

    sch = make()
    run(sch, cut)
    chunk = sch.next(200)
    j = min(j, len(chunk))
    # direct: counted from the chunk's first j rows, as for a chunk too big for prefix matrices
    with mock.patch.object(packtool.mixture.schedule, "PREFIX_CELLS", 0 if direct else 1 << 22):
        mid = sch.state_after(chunk, j)
    other = make()
    run(other, cut + j, step=1000)
    assert mid == other.state()


def per_source(rows):
    return {int(i): rows[1:3, rows[0] == i] for i in np.unique(rows[0])}


def assert_continues(before, after, kept):
    """Each kept source's (epoch, pos) continues where it stopped: nothing repeated or skipped."""
    for name, (i_old, i_new) in kept.items():
        a = before[1:3, before[0] == i_old]
        b = after[1:3, after[0] == i_new]
        if not a.shape[1] or not b.shape[1]:
            continue
        last, first = a[:, -1], b[:, 0]
        assert (first[0], first[1]) in ((last[0], last[1] + 1), (last[0] + 1, 0)), name


@settings(max_examples=30, deadline=None)
@given(
    cut=st.integers(1, 200),
    new_weights=st.lists(st.floats(0.05, 1.0), min_size=3, max_size=3),
)
def test_changed_weights_continue_every_source_from_its_cursor(cut, new_weights):
    first = make()
    before = run(first, cut)
    resumed = make(weights=new_weights, state=first.state())
    after = run(resumed, 300)
    assert_continues(before, after, {"s0": (0, 0), "s1": (1, 1), "s2": (2, 2)})
    assert resumed.changes and resumed.events[-1]["what"] == "changed"
    assert max_lag(new_weights, after[0], after[3], "tokens") < 5 + 1e-9  # a new segment


def test_removed_and_added_sources_and_a_source_added_back():
    first = make()
    before = run(first, 120)
    two = Schedule(
        specs([0.5, 0.5])[:1] + [SourceSpec(name="new", path="x", weight=0.5)],
        [ListReader([3, 1, 2, 5, 5]), ListReader([2])],
        unit="tokens",
        max_len=5,
        state=first.state(),
    )
    mid = run(two, 100)
    assert_continues(before, mid, {"s0": (0, 0)})
    assert (mid[1:3, mid[0] == 1][:, 0] == [0, 0]).all()  # the new source starts at its first row
    assert any("removed 's1'" in c for c in two.changes)
    assert any("added 'new'" in c for c in two.changes)
    assert set(two.state()["dormant"]) == {"s1", "s2"}
    back = make(state=two.state())
    after = run(back, 100)
    assert_continues(before, after, {"s1": (1, 1), "s2": (2, 2)})
    assert_continues(mid, after, {"s0": (0, 0)})
    assert any("added back 's1'" in c for c in back.changes)


def test_other_data_under_the_same_name_is_refused():
    first = make(fps=["a", "b", "c"])
    run(first, 10)
    with pytest.raises(
        DataError, match=r"source 's1': the state was saved on data b but 's1' is now z"
    ):
        make(fps=["a", "z", "c"], state=first.state())


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.pop("sources"),
        lambda s: s.__setitem__("version", 99),
        lambda s: s["sources"]["s0"].__setitem__("pos", -1),
        lambda s: s["sources"]["s0"].__setitem__("epoch", "x"),
        lambda s: s["sources"]["s0"].__setitem__("capped", 1),
        lambda s: s["segment"].__setitem__("index", None),
        lambda s: s.__setitem__("max_len", 6),
        lambda s: s.pop("done"),
        lambda s: s.__setitem__("events", [1]),
        lambda s: s.__setitem__("events", [{"what": "stopped"}]),
        lambda s: s["sources"]["s0"].__setitem__("max_epochs", "x"),
    ],
)
def test_a_damaged_state_is_refused_in_one_line(edit):
    first = make()
    run(first, 10)
    state = first.state()
    edit(state)
    with pytest.raises(DataError) as info:
        make(state=state)
    assert "\n" not in str(info.value)


def test_raising_the_total_continues_a_finished_mixture():
    first = make(total_tokens=50)
    whole = run(first, 1000)
    assert first.done.startswith("total_tokens")
    longer = make(total_tokens=100, state=first.state())
    more = run(longer, 1000)
    ref = run(make(total_tokens=100), 1000)
    assert np.array_equal(np.concatenate([whole, more], axis=1), ref)


def test_lowering_the_total_of_a_finished_mixture_is_said():
    # as it is mid-run: resuming a run that reached total_tokens 100 with 60 said nothing
    first = make(total_tokens=100)
    run(first, 1000)
    state = first.state()
    assert first.done == "total_tokens 100 reached" and state["tokens"] >= 100
    for total in (60, state["tokens"]):  # lower, or above the old total yet reached
        lower = make(total_tokens=total, state=state)
        assert run(lower, 1000).shape[1] == 0
        (said,) = lower.changes
        assert said.startswith(f"total_tokens {total:,} is at most the {state['tokens']:,} tokens")
    same = make(total_tokens=100, state=state)
    assert run(same, 1000).shape[1] == 0 and same.changes == []
