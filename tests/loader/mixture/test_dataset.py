"""MixedDataset / MixedDataLoader: exact shares, exactly once per source epoch over ranks x
workers, determinism, layouts, resume (same and changed mixtures) and bad input."""

from __future__ import annotations

import json
import os
import re
import warnings
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from loader import MixedDataLoader, MixedDataset, PackedDataset
from loader.mixture.steps import RowStream, plan_steps
from loader.store.shard_files import OPEN_FILES
from loader.testing import write_dataset, write_random_dataset
from packtool.dataset.manifest import INDEX_FILE
from packtool.errors import ConfigError, DataError
from packtool.mixture.spec import MixtureSpec, SourceSpec
from tests.loader.conftest import all_doc_ids

ROWS = (23, 17, 6)
WEIGHTS = (0.5, 0.3, 0.2)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Three packed datasets of max_len 64 (23, 17 and 6 rows; doc ids unique in each)."""
    root = tmp_path_factory.mktemp("mix")
    paths = []
    for i, n in enumerate(ROWS):
        p = root / f"src{i}"
        write_random_dataset(
            p, n_rows=n, max_len=64, mean_doc=9, rows_per_shard=7, row_group_rows=3, seed=10 + i
        )
        paths.append(p)
    return paths


def spec(paths, weights=WEIGHTS, names=("web", "code", "books"), **kw):
    kw.setdefault("total_tokens", 6000)
    return MixtureSpec(
        sources=tuple(
            SourceSpec(name=n, path=str(p), weight=w)
            for n, p, w in zip(names, paths, weights, strict=False)
        ),
        **kw,
    )


def rows_of(batch):
    """Per document: (source, doc id, length)."""
    lens = np.diff(batch["cu_seqlens"].numpy())
    return list(
        zip(batch["source"].tolist(), batch["doc_ids"].tolist(), lens.tolist(), strict=True)
    )


def stream(ds, *, workers=0, take=None, state=None):
    dl = MixedDataLoader(ds, num_workers=workers)
    if state is not None:
        dl.load_state_dict(state)
    out = []
    for b in dl:
        out.append(b)
        if take is not None and len(out) == take:
            break
    return out, dl.state_dict()


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys()
        and all(torch.equal(x[k], y[k]) if torch.is_tensor(x[k]) else x[k] == y[k] for k in x)
        for x, y in zip(a, b, strict=True)
    )


def test_batch_dict_carries_the_source_of_every_document(sources):
    ds = MixedDataset(spec(sources), rows_per_batch=4)
    (b, *_), _ = stream(ds, take=1)
    assert set(b) == {
        "input_ids",
        "cu_seqlens",
        "max_seqlen",
        "position_ids",
        "labels",
        "doc_ids",
        "doc_targets",
        "source",
    }
    assert b["source"].dtype == torch.int64 and b["source"].shape == b["doc_ids"].shape
    # The fine-tuning loss's per-document counts (docs/loader.md) come through the mixture too.
    assert b["doc_targets"].shape == b["doc_ids"].shape
    assert int(b["doc_targets"].sum()) == int((b["labels"] != -100).sum())
    assert set(b["source"].tolist()) <= {0, 1, 2}
    assert ds.names == ["web", "code", "books"]


def test_the_sources_share_one_cache_budget_each_keeping_a_window(sources):
    """cache_bytes bounds a process's decoded row groups, as for one dataset: split over the
    sources, each still holding a whole shuffle window (and one row group more)."""
    ds = MixedDataset(spec(sources), tokens_per_batch=128, cache_bytes=3000, shuffle_window=4)
    assert [s.store.cache_bytes for s in ds.sources] == [1000] * 3
    assert [s.store.min_row_groups for s in ds.sources] == [5] * 3
    got = [rows_of(b) for b in ds]
    for s in ds.sources:
        assert 1 <= len(s.store._cache) <= 5
    plain = MixedDataset(spec(sources), tokens_per_batch=128, shuffle_window=4)
    assert got == [rows_of(b) for b in plain]  # the cache changes no batch


def test_the_sources_share_one_bound_on_open_shard_files(sources):
    """A process keeps at most OPEN_FILES shard files open, as for one dataset: split over the
    sources, each still keeping as many as its shuffle window's row groups (and one more)."""
    ds = MixedDataset(spec(sources), rows_per_batch=4, shuffle_window=4)
    assert [s.store.open_files for s in ds.sources] == [OPEN_FILES // 3] * 3
    wide = MixedDataset(spec(sources), rows_per_batch=4, shuffle_window=OPEN_FILES)
    assert [s.store.open_files for s in wide.sources] == [OPEN_FILES + 1] * 3
    assert PackedDataset(sources[0], rows_per_batch=4).store.open_files == OPEN_FILES


@pytest.mark.parametrize("unit", ["tokens", "rows"])
def test_every_batch_prefix_is_within_one_row_of_the_weights(sources, unit):
    ds = MixedDataset(spec(sources, unit=unit, total_tokens=20_000), tokens_per_batch=150)
    batches, state = stream(ds)
    assert state["mixed_dataset"]["schedule"]["done"] == "total_tokens 20,000 reached"
    w = [Fraction(x) / sum(Fraction(y) for y in WEIGHTS) for x in WEIGHTS]
    done = [0, 0, 0]
    # a row is at most max_len tokens; a document of a row counts with its row
    one_row = 64 if unit == "tokens" else 1
    starts = {(s, d) for b in batches for s, d, _ in rows_of(b)}
    assert starts
    for b in batches:
        for s, _, n in rows_of(b):
            done[s] += n
        if unit == "rows":
            continue  # rows are checked on the schedule itself (tests/packtool/mixture/test_schedule.py)
        total = sum(done)
        assert all(abs(d - wi * total) < one_row for d, wi in zip(done, w, strict=True))


def global_stream(paths, world, workers, **kw):
    """Per source, the rows delivered over all ranks in stream order: [(step, rank, doc ids)]."""
    per_rank = []
    for r in range(world):
        ds = MixedDataset(spec(paths, total_tokens=4000), rank=r, world_size=world, **kw)
        batches, _ = stream(ds, workers=workers)
        per_rank.append(batches)
    assert len({len(b) for b in per_rank}) == 1  # every rank runs the same number of steps
    out = []
    for step in range(len(per_rank[0])):
        for r in range(world):
            out.append(per_rank[r][step])
    return out


def source_rows(batches):
    """Per source, its documents (doc ids) in stream order, fillers left out."""
    got = {0: [], 1: [], 2: []}
    for b in batches:
        for s, d, _ in rows_of(b):
            if s >= 0:
                got.setdefault(s, []).append(d)
    return got


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_row_once_per_source_epoch_over_ranks_and_workers(sources, world, workers):
    batches = global_stream(sources, world, workers, rows_per_batch=2)
    got = source_rows(batches)
    for i, path in enumerate(sources):
        every = all_doc_ids(path).tolist()
        docs = got[i]
        assert docs, i
        n = len(every)
        epochs = [docs[k : k + n] for k in range(0, len(docs), n)]
        for e in epochs[:-1]:
            assert sorted(e) == every  # a whole epoch: each document once
        assert len(set(epochs[-1])) == len(epochs[-1]) and set(epochs[-1]) <= set(every)
    if (world, workers) != (1, 0):
        ref = global_stream(sources, 1, 0, rows_per_batch=2)
        assert source_rows(ref) == got  # the same rows in the same order whatever the split


def test_rank_balance_keeps_every_row_once(sources):
    batches = global_stream(sources, 2, 0, rows_per_batch=3, balance=True)
    plain = global_stream(sources, 2, 0, rows_per_batch=3)
    a, b = source_rows(batches), source_rows(plain)
    for i in range(3):
        assert sorted(a[i]) == sorted(b[i])


def test_worker_count_and_seed(sources):
    ref, _ = stream(MixedDataset(spec(sources), tokens_per_batch=200))
    for workers in (1, 2):
        got, _ = stream(MixedDataset(spec(sources), tokens_per_batch=200), workers=workers)
        assert same(got, ref)
    again, _ = stream(MixedDataset(spec(sources), tokens_per_batch=200))
    assert same(again, ref)
    other, _ = stream(MixedDataset(spec(sources, seed=1), tokens_per_batch=200))
    assert not same(other, ref)


def test_parts_too_big_for_the_ring_travel_outside_it(sources, monkeypatch):
    """A worker's part with more documents than a ring slot holds (gather_into answers None) is
    sent on its own: the same batches."""
    ref, _ = stream(MixedDataset(spec(sources), tokens_per_batch=200))
    monkeypatch.setattr(MixedDataset, "max_batch_docs", lambda self: 1)
    ds = MixedDataset(spec(sources), tokens_per_batch=200)
    got, _ = stream(ds, workers=2)
    assert same(got, ref)
    rows = next(iter(ds.look_ahead(plan_steps(ds, RowStream(ds, None), 0, lambda k: True), None)))
    small = ds.empty_record(1, 1)
    assert ds.gather_into(rows.rows, small) is None  # nothing written: too small


def test_static_shape_and_hf_layout(sources):
    ds = MixedDataset(spec(sources), tokens_per_batch=256, static_shape=True, max_docs_per_batch=64)
    batches, _ = stream(ds, workers=2)
    assert {b["input_ids"].shape for b in batches} == {(256,)}
    assert {b["source"].shape for b in batches} == {(64,)}
    assert (batches[0]["source"][batches[0]["doc_ids"] < 0] == -1).all()
    hf = MixedDataset(spec(sources), rows_per_batch=2, layout="hf")
    (b, *_), _ = stream(hf, take=1)
    assert "cu_seq_lens_q" in b and "source" not in b  # model(**b) sees model inputs only
    assert len(b.source) == len(b["cu_seq_lens_q"]) - 1


def test_total_steps_and_drop_last(sources):
    ds = MixedDataset(spec(sources, total_tokens=None, total_steps=7), rows_per_batch=2)
    assert len(ds) == 7
    batches, state = stream(ds)
    assert len(batches) == 7 and state["mixed_dataset"]["step"] == 7
    # the last step of a length in tokens is short: filler for a rank with nothing, or dropped
    last = [
        stream(
            MixedDataset(spec(sources, total_tokens=900), rows_per_batch=3, rank=r, world_size=4)
        )[0]
        for r in range(4)
    ]
    assert len({len(x) for x in last}) == 1
    fillers = [x[-1] for x in last if (x[-1]["labels"] == -100).all()]
    assert fillers and all((f["source"] == -1).all() for f in fillers)
    # no documents and no targets (docs/CONTRACTS.md): its doc_targets counted the rows' targets
    assert all((f["doc_ids"] == -1).all() and int(f["doc_targets"].sum()) == 0 for f in fillers)
    kept = stream(
        MixedDataset(
            spec(sources, total_tokens=900), rows_per_batch=3, rank=0, world_size=4, drop_last=True
        )
    )[0]
    assert len(kept) == len(last[0]) - 1


def capped(paths, caps, total_steps=100):
    """`spec` in steps with some sources capped: {index: (max_epochs, at_cap)}."""
    names = ("web", "code", "books")
    return MixtureSpec(
        sources=tuple(
            SourceSpec(
                name=n,
                path=str(p),
                weight=w,
                **dict(zip(("max_epochs", "at_cap"), caps.get(i, ()), strict=False)),
            )
            for i, (n, p, w) in enumerate(zip(names, paths, WEIGHTS, strict=True))
        ),
        total_steps=total_steps,
    )


@pytest.mark.parametrize(
    ("caps", "kw"),
    [
        ({2: (1, "stop")}, dict(rows_per_batch=2)),
        ({2: (1.5, "stop")}, dict(tokens_per_batch=200, world_size=2)),
        ({2: (1, "stop")}, dict(rows_per_batch=3, world_size=2, drop_last=True)),
        ({0: (1, "drop"), 1: (1, "drop"), 2: (2, "drop")}, dict(rows_per_batch=2)),
    ],
)
def test_len_is_the_steps_that_come_when_a_cap_ends_the_mixture_first(sources, caps, kw):
    # len said total_steps less the steps done (100) where a cap stopped the mixture after 10
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the cap's stop / drops
        world = kw.pop("world_size", 1)
        datasets = [
            MixedDataset(capped(sources, caps), rank=r, world_size=world, **kw)
            for r in range(world)
        ]
        n = len(datasets[0])
        assert 0 < n < 100
        for ds in datasets:
            assert len(ds) == len(MixedDataLoader(ds)) == n == len(stream(ds, workers=1)[0])
        # from a loaded state: the steps left
        ds = MixedDataset(capped(sources, caps), world_size=world, **kw)
        _, state = stream(ds, take=4)
        ds.load_state_dict(state)
        assert len(ds) == n - 4 == len(stream(ds)[0])
        ds.load_state_dict(stream(ds)[1])  # at the end
        assert len(ds) == 0


def test_len_of_a_cap_out_of_reach_is_not_counted(sources, monkeypatch):
    import loader.mixture.dataset as dataset_module

    def no_count(*args):
        raise AssertionError("counted")

    # books (6 rows, 0.2 of the tokens) cannot reach 100 epochs in 5 steps of 2 rows
    ds = MixedDataset(capped(sources, {2: (100, "stop")}, total_steps=5), rows_per_batch=2)
    monkeypatch.setattr(dataset_module, "count_steps", no_count)
    assert len(ds) == 5
    monkeypatch.undo()
    assert len(stream(ds)[0]) == 5


def test_len_of_a_cap_out_of_reach_in_tokens_is_not_counted(sources, monkeypatch):
    """tokens_per_batch was taken for rows: books' 100 epochs (600 rows) looked within reach
    of 50 steps of 64 "rows", so len planned the whole run (7 s at 100,000 steps). In tokens
    the 50 steps hold at most 3,200, and 99 whole epochs of books hold far more."""
    import loader.mixture.dataset as dataset_module

    def no_count(*args):
        raise AssertionError("counted")

    books = PackedDataset(sources[2], rows_per_batch=1).store.manifest.num_tokens
    assert 100 * ROWS[2] <= 50 * 64 < 99 * books
    mix = capped(sources, {2: (100, "stop")}, total_steps=50)
    ds = MixedDataset(mix, tokens_per_batch=64)
    monkeypatch.setattr(dataset_module, "count_steps", no_count)
    assert len(ds) == 50
    monkeypatch.undo()
    assert len(stream(ds)[0]) == 50


def test_len_of_a_streaming_source_whose_cap_may_end_the_mixture_is_unknown(online):
    mix = replace(capped_live_spec(online), total_tokens=None, total_steps=10**6)
    with pytest.raises(TypeError, match="streaming source's cap may end it"):
        len(MixedDataset(mix, rows_per_batch=2))
    packed, live = mix.sources  # a packed source's cap out of reach: nothing to count
    far = (replace(packed, max_epochs=50), replace(live, max_epochs=None))
    assert len(MixedDataset(replace(mix, sources=far, total_steps=30), rows_per_batch=2)) == 30


# --- resume -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cut", "before", "after", "sort_keys"),
    [(1, 0, 2, False), (5, 2, 0, False), (13, 1, 1, True), (20, 2, 2, False)],
)
def test_resume_with_the_same_mixture_is_exact(sources, cut, before, after, sort_keys):
    ref, _ = stream(MixedDataset(spec(sources), tokens_per_batch=150))
    first, state = stream(
        MixedDataset(spec(sources), tokens_per_batch=150), workers=before, take=cut
    )
    # A checkpoint survives JSON, its keys sorted too (the sources web, code, books became
    # books, code, web: "source order changed", a new segment, other batches).
    state = json.loads(json.dumps(state, sort_keys=sort_keys))
    rest, _ = stream(MixedDataset(spec(sources), tokens_per_batch=150), workers=after, state=state)
    assert same(first + rest, ref)


def per_source_reference(paths):
    """Each source's documents in its own epoch order (what any mixture delivers from it)."""
    out = {}
    for i in range(3):
        only = MixtureSpec(
            sources=(SourceSpec(name=["web", "code", "books"][i], path=str(paths[i]), weight=1),),
            total_tokens=40_000,
        )
        batches, _ = stream(MixedDataset(only, rows_per_batch=4))
        out[i] = source_rows(batches)[0]
    return out


@pytest.mark.parametrize(
    "change",
    ["weights", "added", "removed"],
)
def test_resume_with_a_changed_mixture_repeats_and_skips_nothing(sources, change, tmp_path):
    ref = per_source_reference(sources)
    first, state = stream(MixedDataset(spec(sources), tokens_per_batch=150), take=9)
    before = source_rows(first)
    if change == "weights":
        new = spec(sources, weights=(0.1, 0.1, 0.8))
        kept = {0: 0, 1: 1, 2: 2}
    elif change == "removed":
        new = spec(sources[:2], names=("web", "code"))
        kept = {0: 0, 1: 1}
    else:  # other data (the same data as a kept source is refused: its rows would come twice)
        extra = tmp_path / "extra"
        write_random_dataset(extra, n_rows=11, max_len=64, mean_doc=9, row_group_rows=3, seed=20)
        added = SourceSpec(name="extra", path=str(extra), weight=1.0)
        new = MixtureSpec(sources=spec(sources).sources + (added,), total_tokens=6000)
        kept = {0: 0, 1: 1, 2: 2}
    ds = MixedDataset(new, tokens_per_batch=150)
    with pytest.warns(UserWarning, match="resuming a changed mixture"):
        ds.load_state_dict(state)
    assert ds.describe()["changes"]
    rest, _ = stream(ds)
    after = source_rows(rest)
    for old_i, new_i in kept.items():
        delivered = before[old_i] + after[new_i]
        assert delivered == ref[old_i][: len(delivered)]  # its epoch order, no repeat, no gap
    if change == "added":
        assert after[3]  # the new source is drawn from, from its first row
        alone = MixtureSpec(sources=(replace(added, name="web"),), total_tokens=40_000)
        own = source_rows(stream(MixedDataset(alone, rows_per_batch=4))[0])[0]
        assert after[3] == own[: len(after[3])]


def test_resume_onto_other_data_under_the_same_name_is_refused(sources):
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    swapped = spec([sources[1], sources[0], sources[2]])
    with pytest.raises(
        DataError, match=r"^source 'web': the state was saved on data \w+ but 'web' is now \w+"
    ):
        MixedDataset(swapped, rows_per_batch=2).load_state_dict(state)


def test_a_source_renamed_at_a_resume_is_warned_that_its_rows_come_again(sources):
    """A resume continues a source by its name: the data of a saved source under a new name
    is an added source, from its first row. The warning says it is the same data."""
    first, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=6)
    assert source_rows(first)[2]  # 'books' delivered rows before the checkpoint
    ds = MixedDataset(spec(sources, names=("web", "code", "tomes")), rows_per_batch=2)
    with pytest.warns(
        UserWarning,
        match=r"added 'tomes' \(starts at its first row: the same data as the saved source "
        r"'books', whose rows come again; keep the name 'books' to continue its cursor\)",
    ):
        ds.load_state_dict(state)
    assert any("same data as the saved source 'books'" in c for c in ds.describe()["changes"])


def test_resume_refuses_another_seed_and_other_states(sources, tmp_path):
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    with pytest.raises(DataError, match="seed"):
        MixedDataset(spec(sources, seed=3), rows_per_batch=2).load_state_dict(state)
    packed = PackedDataset(sources[0], rows_per_batch=2)
    with pytest.raises(DataError, match="not a MixedDataset state"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(packed.state_dict())
    damaged = json.loads(json.dumps(state))
    damaged["mixed_dataset"]["schedule"]["sources"]["web"]["pos"] = "x"
    with pytest.raises(DataError, match="malformed mixture state: sources.web.pos"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(damaged)
    damaged = json.loads(json.dumps(state))
    damaged["mixed_dataset"]["schedule"]["order"] = ["web", "code"]  # one source short
    with pytest.raises(DataError, match="malformed mixture state: order is"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(damaged)


@pytest.mark.parametrize(
    "edit",
    [
        # each was accepted: a cursor past the epoch skipped the rest of it, a `done` or a step
        # past the total ended the mixture at once
        lambda s: s["schedule"]["sources"]["web"].__setitem__("pos", 10**6),
        lambda s: s["schedule"].__setitem__("done", "x"),
        lambda s: s.__setitem__("step", 10**6),
        lambda s: s["schedule"]["sources"]["web"].__setitem__("fingerprint", None),
    ],
)
def test_an_edited_mixture_state_is_refused_by_its_check_value(sources, edit):
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    edited = json.loads(json.dumps(state))
    edit(edited["mixed_dataset"])
    with pytest.raises(DataError, match="does not match its check value"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(edited)


def test_a_state_without_a_check_value_resumes_and_its_cursors_are_still_checked(sources):
    whole, _ = stream(MixedDataset(spec(sources), rows_per_batch=2), take=6)
    first, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    old = json.loads(json.dumps(state))
    del old["mixed_dataset"]["check"]  # as saved before the check value came in: version 1
    old["mixed_dataset"]["version"] = 1
    rest, _ = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3, state=old)
    assert same(first + rest, whole)
    rows = PackedDataset(sources[0], rows_per_batch=2).store.num_rows
    old["mixed_dataset"]["schedule"]["sources"]["web"]["pos"] = rows + 1
    with pytest.raises(DataError, match=f"sources.web.pos is {rows + 1} but an epoch of 'web'"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(old)


def test_a_current_state_without_its_check_value_is_refused(sources):
    """Removing `check` made an edited state pass as one saved before check values came in (an
    edited `done`: 0 batches). A legacy state is version 1; a current one needs its check. A
    version 1 state that has a check (saved between the two) is held to it."""
    from loader.mixture.resume import state_check

    whole, _ = stream(MixedDataset(spec(sources), rows_per_batch=2), take=6)
    first, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    for edit in (lambda s: None, lambda s: s["schedule"].__setitem__("done", "x")):
        stripped = json.loads(json.dumps(state))
        del stripped["mixed_dataset"]["check"]
        edit(stripped["mixed_dataset"])
        with pytest.raises(DataError, match=r"\(step 3\) has no check value"):
            MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(stripped)
    between = json.loads(json.dumps(state))["mixed_dataset"]
    between["version"] = 1
    between["check"] = state_check(between)
    rest, _ = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3, state=between)
    assert same(first + rest, whole)
    between["schedule"]["done"] = "x"
    with pytest.raises(DataError, match="does not match its check value"):
        MixedDataset(spec(sources), rows_per_batch=2).load_state_dict(between)


@pytest.mark.parametrize("key", ["total_tokens", "total_steps"])
def test_a_total_lowered_below_what_was_delivered_is_said_at_resume(sources, key):
    """Resuming with total_tokens (or total_steps) below what the saved run had already
    delivered gave 0 batches without a word: the "resuming a changed mixture" warning says so.
    The same total, reached, or a raised one, says nothing of it."""
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=4)
    done = {"total_tokens": state["mixed_dataset"]["schedule"]["tokens"], "total_steps": 4}[key]
    other = "total_steps" if key == "total_tokens" else "total_tokens"
    lowered = spec(sources, **{key: done // 2, other: None})
    ds = MixedDataset(lowered, rows_per_batch=2)
    with pytest.warns(UserWarning, match=f"resuming a changed mixture: {key} {done // 2:,} is"):
        ds.load_state_dict(state)
    assert "with no more batches" in ds.describe()["changes"][-1]
    assert stream(ds)[0] == []  # from the state loaded above
    # the saved run's own total (tokens: 6000; steps: the 4 run, then ended) or a larger one
    for total in ({"total_tokens": 6000, "total_steps": 4}[key], 2 * done + 6000):
        ds = MixedDataset(spec(sources, **{key: total, other: None}), rows_per_batch=2)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ds.load_state_dict(state)
        assert ds.changes == []


def test_a_total_lowered_after_the_run_reached_its_total_is_said_at_resume(sources):
    """The same, for a run that ran to its end: resuming it with a lower total_tokens gave 0
    batches without a word (the check ran only for a run not yet ended)."""
    _, state = stream(MixedDataset(spec(sources, total_tokens=3000), rows_per_batch=2))
    assert state["mixed_dataset"]["schedule"]["done"] == "total_tokens 3,000 reached"
    ds = MixedDataset(spec(sources, total_tokens=2000), rows_per_batch=2)
    with pytest.warns(UserWarning, match="resuming a changed mixture: total_tokens 2,000 is at"):
        ds.load_state_dict(state)
    assert stream(ds)[0] == []
    ds = MixedDataset(spec(sources, total_tokens=3000), rows_per_batch=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds.load_state_dict(state)
    assert ds.changes == [] and stream(ds)[0] == []


@pytest.mark.parametrize("changed", [{"shuffle": False}, {"shuffle_window": 2}])
def test_a_mixture_resumed_under_another_row_order_is_refused(sources, changed):
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=3)
    with pytest.raises(DataError, match="saved with shuffle=True, shuffle_window=16 but this"):
        MixedDataset(spec(sources), rows_per_batch=2, **changed).load_state_dict(state)


def test_a_source_dropped_at_its_cap_is_reported(sources):
    capped = MixtureSpec(
        sources=(
            SourceSpec(name="web", path=str(sources[0]), weight=1),
            SourceSpec(name="books", path=str(sources[2]), max_epochs=1, at_cap="drop", weight=1),
        ),
        total_tokens=6000,
    )
    ds = MixedDataset(capped, rows_per_batch=2)
    with pytest.warns(UserWarning, match="source 'books' reached max_epochs 1 .* dropped"):
        batches, _ = stream(ds)
    got = source_rows(batches)
    assert sorted(got[1]) == all_doc_ids(sources[2]).tolist()  # one whole epoch, then no more
    assert any(e["what"] == "dropped" for e in ds.describe()["events"])


@pytest.mark.parametrize("at_cap", ["drop", "stop"])
def test_a_cap_already_passed_at_a_resume_is_warned(sources, at_cap):
    """A resume with a cap below what the source already delivered drops it (or ends the
    mixture) at once: only "resuming a changed mixture" was said, the drop or the stop never
    (with stop: no batch and no word of why)."""
    _, state = stream(MixedDataset(spec(sources), rows_per_batch=2), take=5)
    assert state["mixed_dataset"]["schedule"]["sources"]["code"]["rows"] > 1
    lowered = spec(sources)
    code = replace(lowered.sources[1], max_epochs=1 / 17, at_cap=at_cap)  # 1 row of its 17
    lowered = replace(lowered, sources=(lowered.sources[0], code, lowered.sources[2]))
    ds = MixedDataset(lowered, rows_per_batch=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches, _ = stream(ds, state=state)
    said = [str(w.message) for w in caught if "reached max_epochs" in str(w.message)]
    what = "was dropped" if at_cap == "drop" else "the mixture ended"
    assert len(said) == 1 and what in said[0] and "'code'" in said[0], said
    if at_cap == "stop":
        assert batches == [] and ds.describe()["done"].startswith("source 'code' reached")
    else:
        assert batches and not source_rows(batches)[1]


def test_a_dropped_source_resumed_with_stop_ends_the_mixture_saying_so(sources):
    """A source already dropped at its cap, resumed with `at_cap: stop`, ended the mixture (no
    batch) with no word of it: only "resuming a changed mixture: at_cap ... drop -> stop"."""
    books = SourceSpec(name="books", path=str(sources[2]), max_epochs=1, at_cap="drop", weight=1)
    web = SourceSpec(name="web", path=str(sources[0]), weight=1)
    drop = MixtureSpec(sources=(web, books), total_tokens=60_000)
    ds = MixedDataset(drop, rows_per_batch=2)
    dl = MixedDataLoader(ds, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in dl:
            if any(e["what"] == "dropped" for e in ds.describe()["events"]):
                break
    state = dl.state_dict()
    stop = replace(drop, sources=(web, replace(books, at_cap="stop")))
    resumed = MixedDataset(stop, rows_per_batch=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches, _ = stream(resumed, state=state)
    said = [str(w.message) for w in caught if "the mixture ended" in str(w.message)]
    assert batches == [] and len(said) == 1 and "'books' reached max_epochs 1" in said[0], said
    assert [e["what"] for e in resumed.describe()["events"]][-1] == "stopped"


def _warned_at(ds, *, state=None, take=None):
    """(step after the batch, message) of each drop/stop warning, in-process; the state."""
    dl = MixedDataLoader(ds, num_workers=0)
    if state is not None:
        dl.load_state_dict(state)
    said = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i, _ in enumerate(dl):
            step = int(dl.state_dict()["mixed_dataset"]["step"])
            said += [(step, str(w.message)) for w in caught[len(said) :]]
            if take is not None and i + 1 == take:
                break
    return said, dl.state_dict()


@pytest.mark.parametrize("at_cap", ["drop", "stop"])
def test_a_cap_after_a_resume_is_warned_at_its_step_in_process(sources, at_cap):
    """Resumed without workers, the drop came late (the stream's rows counted from the resume,
    the events' from the start) and the stop never: each is warned at the step it was warned at
    in the run that was not interrupted."""
    books = SourceSpec(name="books", path=str(sources[2]), max_epochs=1, at_cap=at_cap, weight=1)
    web = SourceSpec(name="web", path=str(sources[0]), weight=1)
    capped = MixtureSpec(sources=(web, books), total_tokens=3000)
    whole, _ = _warned_at(MixedDataset(capped, rows_per_batch=2))
    assert len(whole) == 1 and "'books' reached max_epochs 1" in whole[0][1], whole
    _, state = _warned_at(MixedDataset(capped, rows_per_batch=2), take=2)
    assert whole[0][0] > 2  # the cap comes after the resume
    resumed, _ = _warned_at(MixedDataset(capped, rows_per_batch=2), state=state)
    assert resumed == whole


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: SourceSpec(name="a", path=p, weight=-1), "weight must be a finite number >= 0"),
        (lambda p: SourceSpec(name="a", path=p, weight="0.5"), "weight must be a number"),
        (lambda p: SourceSpec(name="a", path=p, weight=float("nan")), "finite"),
        (lambda p: SourceSpec(name="", path=p, weight=1), "non-empty string"),
        (
            lambda p: SourceSpec(name="a", path=p, max_epochs=0, weight=1),
            "max_epochs must be a number > 0",
        ),
        (
            lambda p: SourceSpec(name="a", path=p, at_cap="wrap", weight=1),
            "at_cap 'wrap' is unknown",
        ),
        (
            lambda p: MixtureSpec(sources=(SourceSpec(name="a", path=p, weight=0),), total_steps=1),
            "every source has weight 0",
        ),
        (
            lambda p: MixtureSpec(
                sources=(
                    SourceSpec(name="a", path=p, weight=1),
                    SourceSpec(name="a", path=p, weight=1),
                ),
                total_steps=1,
            ),
            "duplicate source name",
        ),
        (
            lambda p: MixtureSpec(
                sources=(SourceSpec(name="a", path=p, weight=1),), total_steps=1
            ).with_weights({"b": 1}),
            "unknown source 'b'; the mixture has a",
        ),
        (
            lambda p: MixtureSpec(
                sources=(SourceSpec(name="a", path=p, weight=1),), total_steps=1, total_tokens=5
            ),
            "not both",
        ),
        (
            lambda p: MixtureSpec(sources=(SourceSpec(name="a", path=p, weight=1),), total_steps=0),
            "total_steps must be",
        ),
        (
            lambda p: MixtureSpec(sources=(SourceSpec(name="a", path=p, weight=1),), unit="docs"),
            "unit 'docs'",
        ),
    ],
)
def test_bad_specs_are_one_line_errors(sources, make, message):
    with pytest.raises(ConfigError, match=message) as info:
        make(str(sources[0]))
    assert "\n" not in str(info.value)


def test_a_batch_past_int32_cu_seqlens_is_one_line(sources):
    # tokens_per_batch=10**12 read the schedule for a whole step: a 29 GiB MemoryError.
    with pytest.raises(ConfigError, match="tokens_per_batch 1,000,000,000,000 is more tokens"):
        MixedDataset(spec(sources), tokens_per_batch=10**12)
    with pytest.raises(ConfigError, match=r"rows_per_batch 33,554,432 x max_len \d+ is more"):
        MixedDataset(spec(sources), rows_per_batch=2**25)


def _copy_with(path, tmp_path, name, **changes):
    import shutil

    out = tmp_path / name
    shutil.copytree(path, out)
    index = json.loads((out / INDEX_FILE).read_text())
    for key, value in changes.items():
        if key == "tokenizer":
            index["tokenizer"].update(value)
        else:
            index[key] = value
    (out / INDEX_FILE).write_text(json.dumps(index))
    return out


def test_sources_must_share_tokenizer_and_max_len(sources, tmp_path):
    other_tok = _copy_with(
        sources[1], tmp_path, "tok", tokenizer={"kind": "tiktoken", "vocab_size": 50257}
    )
    with pytest.raises(
        ConfigError,
        match=r"different tokenizers \(web test \(kind 'test'\), code test \(kind 'tiktoken'\)",
    ):
        MixedDataset(spec([sources[0], other_tok]), rows_per_batch=2)
    other_len = tmp_path / "len"  # a real dataset: index.json is checked as a whole
    write_random_dataset(other_len, n_rows=5, max_len=128, mean_doc=9, seed=3)
    with pytest.raises(ConfigError, match=r"different max_len \(web 64, code 128\)"):
        MixedDataset(spec([sources[0], other_len]), rows_per_batch=2)


def test_two_sources_on_the_same_data_are_refused(sources, tmp_path):
    """The same data under two names walks the same epoch order twice: every row would come
    twice. One line naming both sources, saying to use one with the summed weight."""
    import shutil

    copy = tmp_path / "copy"  # another folder holding the same data: the same rows too
    shutil.copytree(sources[0], copy)
    for other in (str(sources[0]), copy, PackedDataset(sources[0], rows_per_batch=3)):
        mix = MixtureSpec(
            sources=(
                SourceSpec(name="web", path=str(sources[0]), weight=1),
                SourceSpec(name="code", path=str(sources[1]), weight=1),
                SourceSpec(name="web2", path=other, weight=0.5),
            ),
            total_tokens=6000,
        )
        with pytest.raises(
            ConfigError,
            match=r"^sources 'web' and 'web2' are the same data .*one source with their summed "
            r"weight \(1\.5\)",
        ):
            MixedDataset(mix, rows_per_batch=2)


def test_two_different_empty_sources_are_refused_as_empty_not_as_the_same_data(sources, tmp_path):
    # Before: "sources 'code' and 'books' are the same data (fingerprint ...)": the fingerprint
    # of no shards is the max_len alone, and the same-data check ran before the empty one.
    for name in ("empty", "void"):
        write_dataset(tmp_path / name, [], max_len=64)
    with pytest.raises(ConfigError, match=r"^source 'code' \(.*empty\) has no rows; remove it"):
        MixedDataset(spec([sources[0], tmp_path / "empty", tmp_path / "void"]), rows_per_batch=2)


def test_an_empty_source_and_a_mixture_without_end_are_refused(sources, tmp_path):
    empty = tmp_path / "empty"
    write_dataset(empty, [], max_len=64)
    with pytest.raises(ConfigError, match=r"source 'code' \(.*empty\) has no rows"):
        MixedDataset(spec([sources[0], empty]), rows_per_batch=2)
    with pytest.raises(ConfigError, match="this mixture never ends"):
        MixedDataset(spec(sources, total_tokens=None), rows_per_batch=2)
    with pytest.raises(ConfigError, match="seed of a mixture is the mixture's"):
        MixedDataset(spec(sources), rows_per_batch=2, seed=3)
    with pytest.raises(ConfigError, match="tokens_per_batch 32 is smaller"):
        MixedDataset(spec(sources), tokens_per_batch=32)


def test_sources_given_as_datasets_and_a_mixture_file(sources, tmp_path):
    as_objects = [
        SourceSpec(name="web", path=PackedDataset(sources[0], rows_per_batch=9), weight=1)
    ]
    ds = MixedDataset(MixtureSpec(sources=tuple(as_objects), total_steps=3), rows_per_batch=2)
    batches, _ = stream(ds)
    assert len(batches) == 3
    file = tmp_path / "mix.json"
    file.write_text(
        json.dumps(
            {
                "seed": 0,
                "total_tokens": 6000,
                "sources": [
                    {"name": n, "path": str(p), "weight": w}
                    for n, p, w in zip(["web", "code", "books"], sources, WEIGHTS, strict=True)
                ],
            }
        )
    )
    from_file, _ = stream(MixedDataset(str(file), rows_per_batch=2))
    direct, _ = stream(MixedDataset(spec(sources), rows_per_batch=2))
    assert same(from_file, direct)


def test_numpy_numbers_in_a_spec_give_the_plain_numbers_stream(sources):
    # np.int64 / np.float32 passed the spec's checks, then the fingerprint's json and a
    # fractional cap's Fraction failed with a traceback.
    def make(num, **kw):
        return MixtureSpec(
            sources=(
                SourceSpec(name="web", path=str(sources[0]), weight=num(1)),
                SourceSpec(
                    name="books", path=str(sources[2]), weight=num(0.5), max_epochs=num(1.5)
                ),
            ),
            seed=kw.get("seed", 3),
            total_tokens=2000,
        )

    plain = MixedDataset(make(float), rows_per_batch=2)
    for num, seed in ((np.float32, np.int64(3)), (np.float64, np.int32(3))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # books reaches its cap
            ds = MixedDataset(make(num, seed=seed), rows_per_batch=2)
            got, state = stream(ds)
            ref, ref_state = stream(plain)
        assert ds.fingerprint == plain.fingerprint and same(got, ref)
        assert json.loads(json.dumps(state)) == ref_state


def test_no_warning_on_a_plain_run(sources):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream(MixedDataset(spec(sources), rows_per_batch=2), workers=1)


# --- a streaming (online-packed) source -----------------------------------------------------


@pytest.fixture(scope="module")
def online(tmp_path_factory):
    """Tokenized Parquet of 90 documents (byte tokenizer) and a packed source sharing its
    tokenizer identity."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.dataset.tokenized import tokenized_schema
    from packtool.tokenizer.tokenizers import load_tokenizer

    root = tmp_path_factory.mktemp("online")
    identity = load_tokenizer("byte").identity
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 40, 90)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(1000, 1090), pa.int64()),
            pa.array(["t"] * 90),
            pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(np.arange(offsets[-1]) % 250, pa.uint16())
            ),
            pa.array(lengths.astype(np.int32)),
        ],
        schema=tokenized_schema(identity),
    )
    pq.write_table(table, root / "part.parquet", row_group_size=30)
    packed = root / "packed"  # token ids below the byte tokenizer's vocabulary
    write_random_dataset(
        packed, n_rows=23, max_len=64, mean_doc=9, rows_per_shard=7, row_group_rows=3, vocab=250
    )
    index = json.loads((packed / INDEX_FILE).read_text())
    index["tokenizer"] = identity.to_dict()
    (packed / INDEX_FILE).write_text(json.dumps(index))
    return root / "part.parquet", packed


def online_spec(online, **kw):
    from loader import StreamingPackedDataset

    parquet, packed = online
    live = StreamingPackedDataset(parquet, max_len=64, buffer_docs=20, rows_per_batch=1)
    return MixtureSpec(
        sources=(
            SourceSpec(name="packed", path=str(packed), weight=0.6),
            SourceSpec(name="live", path=live, weight=0.4),
        ),
        total_tokens=kw.pop("total_tokens", 5000),
        **kw,
    )


def test_two_streaming_sources_on_the_same_files_are_refused(online):
    mix = online_spec(online)
    twice = replace(mix, sources=(*mix.sources, replace(mix.sources[1], name="live2")))
    with pytest.raises(ConfigError, match=r"^sources 'live' and 'live2' are the same data"):
        MixedDataset(twice, rows_per_batch=2)


def test_a_streaming_source_is_read_whole_once_per_epoch_whatever_the_workers(online):
    ref, _ = stream(MixedDataset(online_spec(online), rows_per_batch=2))
    live = source_rows(ref)[1]
    assert len(live) > 90  # more than one epoch
    assert sorted(live[:90]) == list(
        range(1000, 1090)
    )  # each document once in epoch 0 (none is split)
    got, _ = stream(MixedDataset(online_spec(online), rows_per_batch=2), workers=2)
    assert same(got, ref)


@pytest.mark.parametrize(("cut", "before", "after"), [(3, 0, 2), (17, 2, 0)])
def test_a_streaming_source_resumes_exactly(online, cut, before, after):
    ref, _ = stream(MixedDataset(online_spec(online), rows_per_batch=2))
    first, state = stream(
        MixedDataset(online_spec(online), rows_per_batch=2), workers=before, take=cut
    )
    rest, _ = stream(
        MixedDataset(online_spec(online), rows_per_batch=2), workers=after, state=state
    )
    assert same(first + rest, ref)


def capped_live_spec(online, epochs=3):
    """`online_spec` with the streaming source capped at `epochs` passes (the mixture stops
    there): long enough to cross several of its epoch boundaries."""
    mix = online_spec(online, total_tokens=10**6)
    packed, live = mix.sources
    return MixtureSpec(
        sources=(packed, SourceSpec(name="live", path=live.path, weight=0.4, max_epochs=epochs)),
        total_tokens=10**6,
    )


@pytest.fixture
def epochs_packed(monkeypatch):
    """The epoch of every pass the streaming source starts (an iterator over its stream)."""
    from loader.mixture.sources import _OneStream

    started: list[int] = []
    real = _OneStream.__iter__

    def counting(self):
        started.append(int(self.epoch))
        return real(self)

    monkeypatch.setattr(_OneStream, "__iter__", counting)
    return started


def test_a_streaming_source_packs_each_epoch_once(online, epochs_packed):
    # The schedule reads epoch e+1's lengths before the rows of epoch e in the same chunk are
    # described: epoch e's rows must survive that (not be packed again from row 0).
    batches, state = stream(MixedDataset(capped_live_spec(online), rows_per_batch=2))
    assert state["mixed_dataset"]["schedule"]["done"] == "source 'live' reached max_epochs 3"
    live = source_rows(batches)[1]
    assert len(live) == 3 * 90
    for e in range(3):
        assert sorted(live[90 * e : 90 * (e + 1)]) == list(range(1000, 1090))
    assert epochs_packed == [0, 1, 2]


@pytest.mark.parametrize(("cut", "epoch"), [(5, 0), (50, 1), (100, 2)])
def test_a_resumed_streaming_source_replays_its_epoch_once(online, epochs_packed, cut, epoch):
    ref, _ = stream(MixedDataset(capped_live_spec(online), rows_per_batch=2))
    first, state = stream(MixedDataset(capped_live_spec(online), rows_per_batch=2), take=cut)
    assert state["mixed_dataset"]["schedule"]["sources"]["live"]["epoch"] == epoch
    epochs_packed.clear()
    rest, _ = stream(MixedDataset(capped_live_spec(online), rows_per_batch=2), state=state)
    assert same(first + rest, ref)
    # the resume re-packs its epoch up to the cursor once, then every later epoch once
    assert epochs_packed == list(range(epoch, 3))


def test_packtool_mix_plans_what_the_loader_delivers(sources):
    from packtool.mixture.plan import plan_mixture

    mix = spec(sources, total_tokens=9000)
    plan = plan_mixture(mix)
    _, state = stream(MixedDataset(mix, rows_per_batch=2))
    real = state["mixed_dataset"]["schedule"]["sources"]
    for s in plan.sources:
        assert abs(s.tokens - real[s.name]["tokens"]) <= 2 * 64  # both within a row of target
        assert abs(s.rows - real[s.name]["rows"]) <= 3


def test_a_cap_no_row_fits_under_is_refused_up_front(sources):
    # it made a mixture of no batch, with no error and no warning (only an event in describe())
    rows = PackedDataset(sources[0], rows_per_batch=2).store.num_rows
    tiny = MixtureSpec(
        sources=(SourceSpec(name="web", path=str(sources[0]), max_epochs=1e-9, weight=1),)
    )
    with pytest.raises(ConfigError, match=f"max_epochs 1e-09 of its {rows:,} rows allows no row"):
        MixedDataset(tiny, rows_per_batch=2)
    fits = MixtureSpec(
        sources=(SourceSpec(name="web", path=str(sources[0]), max_epochs=1 / rows, weight=1),)
    )
    assert len(list(MixedDataset(fits, rows_per_batch=1))) == 1  # one row: the least cap


def test_a_fractional_cap_delivers_that_part_of_the_last_epoch(tmp_path):
    # (2.3 - 2) * 10 is 2.9999999999999982 in floats: 22 rows came, not 23
    write_random_dataset(tmp_path / "ten", n_rows=10, max_len=64, mean_doc=9, seed=4)
    for cap, want in ((2.3, 23), (1.2, 12), (0.5, 5)):
        mix = MixtureSpec(
            sources=(SourceSpec(name="ten", path=str(tmp_path / "ten"), max_epochs=cap, weight=1),)
        )
        with pytest.warns(UserWarning, match=f"reached max_epochs {cap}"):
            assert len(list(MixedDataset(mix, rows_per_batch=1))) == want


@pytest.mark.parametrize("cap", [0.5, 1.5])
def test_a_fractional_cap_on_a_streaming_source_is_refused_up_front(online, cap):
    # its epoch length is not known ahead: refused only once the stream reached the cap
    from loader import StreamingPackedDataset

    parquet, packed = online
    live = StreamingPackedDataset(parquet, max_len=64, buffer_docs=20, rows_per_batch=1)
    spec = MixtureSpec(
        sources=(
            SourceSpec(name="packed", path=str(packed), weight=0.6),
            SourceSpec(name="live", path=live, weight=0.4, max_epochs=cap),
        ),
    )
    with pytest.raises(ConfigError, match=f"source 'live': max_epochs {cap} is fractional"):
        MixedDataset(spec, rows_per_batch=1)


def equal_size_parquet(path, shift, first_id=1000):
    """Tokenized Parquet of 90 documents (byte tokenizer) at `path`, its tokens shifted by
    `shift`, its doc ids from `first_id`: uncompressed, so every shift and first id gives a
    file of one size and document count (other doc ids: another Parquet footer, whose
    statistics hold the ids; shifted tokens of the same range: the same footer)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.dataset.tokenized import tokenized_schema
    from packtool.tokenizer.tokenizers import load_tokenizer

    identity = load_tokenizer("byte").identity
    lengths = np.random.default_rng(4).integers(1, 40, 90)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    tokens = (np.arange(offsets[-1]) + shift) % 250
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(first_id, first_id + 90), pa.int64()),
            pa.array(["t"] * 90),
            pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens, pa.uint16())),
            pa.array(lengths.astype(np.int32)),
        ],
        schema=tokenized_schema(identity),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="NONE", use_dictionary=False)
    return path


def live_source(path):
    from loader import StreamingPackedDataset

    return StreamingPackedDataset(path, max_len=64, buffer_docs=20, rows_per_batch=1)


def test_two_streaming_sources_on_other_files_of_equal_size_are_not_the_same_data(tmp_path):
    """Two `part.parquet` of one size and document count in two folders were refused as "the
    same data": a streaming source's fingerprint is its files' names and sizes, not their
    content. Other files are other data; the same files stay refused."""
    files = [
        equal_size_parquet(tmp_path / name / "part.parquet", s) for name, s in (("a", 0), ("b", 7))
    ]
    assert files[0].stat().st_size == files[1].stat().st_size
    assert files[0].read_bytes() != files[1].read_bytes()
    mix = MixtureSpec(
        sources=(
            SourceSpec(name="one", path=live_source(files[0]), weight=0.5),
            SourceSpec(name="two", path=live_source(files[1]), weight=0.5),
        ),
        total_tokens=2000,
    )
    ds = MixedDataset(mix, rows_per_batch=2)
    assert list(ds.names) == ["one", "two"]
    assert len(stream(ds, take=2)[0]) == 2
    again = replace(mix, sources=(mix.sources[0], replace(mix.sources[0], name="again")))
    with pytest.raises(ConfigError, match=r"^sources 'one' and 'again' are the same data"):
        MixedDataset(again, rows_per_batch=2)


def live_mix(online, path):
    _, packed = online
    return MixtureSpec(
        sources=(
            SourceSpec(name="packed", path=str(packed), weight=0.6),
            SourceSpec(name="live", path=live_source(path), weight=0.4),
        ),
        total_tokens=3000,
    )


@pytest.mark.parametrize("change", ["other folder", "rewritten in place"])
def test_a_streaming_source_changed_at_a_resume_is_refused(online, tmp_path, change):
    """A resume identified a streaming source by its files' names and sizes (and document
    count): other files of one name and size, or a file rewritten with other documents of the
    same size, resumed without a word on other data. It is identified by each file's size and
    Parquet footer (row groups, byte sizes, statistics): here the same name, size and document
    count, other documents (their ids in the footer's statistics)."""
    first = equal_size_parquet(tmp_path / "a" / "part.parquet", 0)
    _, state = stream(MixedDataset(live_mix(online, first), rows_per_batch=2), take=3)
    before = first.stat()
    if change == "other folder":
        now = equal_size_parquet(tmp_path / "b" / "part.parquet", 0, first_id=5000)
    else:
        now = equal_size_parquet(first, 0, first_id=5000)
        os.utime(now, ns=(before.st_atime_ns, before.st_mtime_ns))  # even at the old time
    assert now.stat().st_size == before.st_size
    ds = MixedDataset(live_mix(online, now), rows_per_batch=2)
    with pytest.raises(DataError) as info:
        ds.load_state_dict(state)
    message = str(info.value)
    assert "\n" not in message
    assert re.match(
        r"^source 'live': the state was saved on data \w+ but 'live' is now \w+", message
    )


@pytest.mark.parametrize("staged", ["copied to another folder", "new modification time"])
def test_a_streaming_source_resumes_on_its_files_staged_again(online, tmp_path, staged):
    """A job that stages byte-identical files to node-local disk each time (another folder, a
    new modification time: `cp` without `-p`) could not resume a mixture: the source was
    identified by its resolved paths with their sizes and modification times ("the state was
    saved on data ... but 'live' is now ..."). It is identified by content (each file's size and
    Parquet footer), and the rest is the uninterrupted run's."""
    import shutil

    path = equal_size_parquet(tmp_path / "a" / "part.parquet", 0)
    ref, _ = stream(MixedDataset(live_mix(online, path), rows_per_batch=2))
    first, state = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), take=3)
    st = path.stat()
    if staged == "copied to another folder":
        (tmp_path / "node").mkdir()
        now = Path(shutil.copy(path, tmp_path / "node" / "part.parquet"))
        os.utime(now, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))
    else:
        now = path
        os.utime(now, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))
    assert now.stat().st_mtime_ns != st.st_mtime_ns
    ds = MixedDataset(live_mix(online, now), rows_per_batch=2)
    rest, after = stream(ds, state=state)
    assert ds.changes == []
    assert same(first + rest, ref)
    saved = state["mixed_dataset"]["schedule"]["sources"]["live"]["fingerprint"]
    assert after["mixed_dataset"]["schedule"]["sources"]["live"]["fingerprint"] == saved


def test_an_unchanged_streaming_source_resumes_by_any_path_to_its_files(online, tmp_path):
    """The same files resume, also given through a symbolic link (resolved, as the same-data
    check resolves them), and the rest is the uninterrupted run's."""
    path = equal_size_parquet(tmp_path / "a" / "part.parquet", 0)
    link = tmp_path / "link"
    link.symlink_to(path.parent, target_is_directory=True)
    ref, _ = stream(MixedDataset(live_mix(online, path), rows_per_batch=2))
    first, state = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), take=3)
    ds = MixedDataset(live_mix(online, link / "part.parquet"), rows_per_batch=2)
    rest, _ = stream(ds, state=state)
    assert ds.changes == []
    assert same(first + rest, ref)


def test_a_state_saved_before_streaming_sources_were_identified_by_their_files_resumes(
    online, tmp_path
):
    """States saved before recorded a streaming source's fingerprint as its files' names and
    sizes: such a state still resumes (as checked as it was then), and the next state records
    the fingerprint of today."""
    import hashlib

    from loader.mixture.resume import state_check
    from loader.online.state import config_state

    path = equal_size_parquet(tmp_path / "a" / "part.parquet", 0)
    ref, _ = stream(MixedDataset(live_mix(online, path), rows_per_batch=2))
    first, state = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), take=3)
    live = live_source(path)
    h = hashlib.sha256()
    h.update(f"part.parquet:{path.stat().st_size};".encode())
    h.update(repr((live.num_documents, sorted(config_state(live.config).items()))).encode())
    old = json.loads(json.dumps(state["mixed_dataset"]))
    fresh = old["schedule"]["sources"]["live"]["fingerprint"]
    old["schedule"]["sources"]["live"]["fingerprint"] = h.hexdigest()[:16]
    old["check"] = state_check(old)
    assert old["schedule"]["sources"]["live"]["fingerprint"] != fresh
    rest, after = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), state=old)
    assert same(first + rest, ref)
    assert after["mixed_dataset"]["schedule"]["sources"]["live"]["fingerprint"] == fresh


def test_a_state_saved_when_streaming_sources_were_identified_by_path_and_time_resumes(
    online, tmp_path
):
    """States saved before content identity recorded a streaming source's fingerprint over its
    resolved paths with each file's size and modification time: such a state resumes on the
    same files, unchanged (checked as it was then), and the next state records today's."""
    import hashlib

    from loader.mixture.resume import state_check
    from loader.online.state import config_state

    path = equal_size_parquet(tmp_path / "a" / "part.parquet", 0)
    ref, _ = stream(MixedDataset(live_mix(online, path), rows_per_batch=2))
    first, state = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), take=3)
    live = live_source(path)
    st = path.resolve().stat()
    states = ((str(path.resolve()), st.st_size, st.st_mtime_ns),)
    settings = (live.num_documents, sorted(config_state(live.config).items()))
    was = hashlib.sha256(repr((states, settings)).encode()).hexdigest()[:16]
    old = json.loads(json.dumps(state["mixed_dataset"]))
    fresh = old["schedule"]["sources"]["live"]["fingerprint"]
    old["schedule"]["sources"]["live"]["fingerprint"] = was
    old["check"] = state_check(old)
    rest, after = stream(MixedDataset(live_mix(online, path), rows_per_batch=2), state=old)
    assert same(first + rest, ref)
    assert after["mixed_dataset"]["schedule"]["sources"]["live"]["fingerprint"] == fresh
    # checked as it was then: the same state on the file with another time is other data
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(DataError, match=r"^source 'live': the state was saved on data "):
        MixedDataset(live_mix(online, path), rows_per_batch=2).load_state_dict(old)
