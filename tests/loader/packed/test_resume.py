"""Resume: the stream before a restart plus the stream after equals an uninterrupted run."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchdata.stateful_dataloader import StatefulDataLoader

from loader import PackedDataLoader, PackedDataset
from loader.testing import write_random_dataset
from packtool.errors import DataError
from tests.loader.conftest import all_doc_ids

SETTINGS = {"tokens_per_batch": 150, "seed": 7}


def _key(batch) -> tuple:
    return tuple(batch["input_ids"].tolist()), tuple(batch["doc_ids"].tolist())


def _run(path, *, workers, epochs=(0, 1), state=None, take=None, **kw):
    """Batches of the given epochs (stopping after `take` batches); returns (keys, state)."""
    ds = PackedDataset(path, **{**SETTINGS, **kw})
    dl = PackedDataLoader(ds, num_workers=workers, persistent_workers=workers > 0)
    if state is not None:
        dl.load_state_dict(state)
    out = []
    start = state["packed_dataset"]["epoch"] if state else epochs[0]
    for epoch in range(start, epochs[-1] + 1):
        ds.set_epoch(epoch)
        for b in dl:
            out.append(_key(b))
            if take is not None and len(out) == take:
                return out, dl.state_dict()
    return out, dl.state_dict()


@pytest.fixture(scope="module")
def reference(random_dataset):
    keys, _ = _run(random_dataset, workers=0)
    return keys


@pytest.mark.parametrize(
    ("cut", "before", "after"),
    [(0, 2, 1), (1, 0, 2), (5, 2, 0), (9, 1, 2), (14, 2, 2), (19, 1, 0), (25, 2, 1)],
)
def test_resume_equivalence_with_any_worker_count(random_dataset, reference, cut, before, after):
    first, state = _run(random_dataset, workers=before, take=cut) if cut else ([], None)
    if state is None:
        ds = PackedDataset(random_dataset, **SETTINGS)
        state = PackedDataLoader(ds).state_dict()
    rest, _ = _run(random_dataset, workers=after, state=state)
    assert first + rest == reference


def test_resume_with_other_ranks_delivers_every_row_once(random_dataset):
    expected = all_doc_ids(random_dataset).tolist()
    # Same global batch (4 rows): 1 rank x 4 rows before, 2 ranks x 2 rows after.
    ds = PackedDataset(random_dataset, rows_per_batch=4, seed=3)
    dl = PackedDataLoader(ds, num_workers=1)
    seen = []
    for b in itertools.islice(dl, 3):
        seen += b["doc_ids"][b["doc_ids"] >= 0].tolist()
    state = dl.state_dict()
    for rank in range(2):
        ds2 = PackedDataset(random_dataset, rows_per_batch=2, seed=3, rank=rank, world_size=2)
        dl2 = PackedDataLoader(ds2, num_workers=2)
        dl2.load_state_dict(state)
        for b in dl2:
            seen += b["doc_ids"][b["doc_ids"] >= 0].tolist()
    assert sorted(seen) == expected


@pytest.mark.parametrize(
    "changed", [{"shuffle": False}, {"shuffle_window": 1}, {"shuffle_window": 0}]
)
def test_resume_under_another_row_order_is_refused(random_dataset, changed):
    # The consumed rows are the first `cursor` of the saved order: the rest of another order
    # repeated ~1,000 rows and skipped as many, without a word.
    state = _dl_state(random_dataset, 3, rows_per_batch=4, tokens_per_batch=None)
    ds = PackedDataset(
        random_dataset, **{**SETTINGS, "rows_per_batch": 4, "tokens_per_batch": None, **changed}
    )
    with pytest.raises(DataError, match=r"saved with shuffle=True, shuffle_window=16 but this"):
        PackedDataLoader(ds).load_state_dict(state)


def test_row_order_may_change_where_the_epoch_starts_or_ends(random_dataset):
    expected = all_doc_ids(random_dataset).tolist()
    kw = {**SETTINGS, "rows_per_batch": 4, "tokens_per_batch": None}
    for take in (0, None):  # nothing consumed yet; all of the epoch consumed
        dl = PackedDataLoader(PackedDataset(random_dataset, **kw))
        consumed = [b["doc_ids"] for b in itertools.islice(dl, take if take is not None else 10**9)]
        ds2 = PackedDataset(random_dataset, **{**kw, "shuffle": False})
        dl2 = PackedDataLoader(ds2)
        dl2.load_state_dict(dl.state_dict())
        seen = [d for b in consumed + [b["doc_ids"] for b in dl2] for d in b[b >= 0].tolist()]
        assert sorted(seen) == expected


@pytest.mark.parametrize(
    "kw", [{"rows_per_batch": 5, "tokens_per_batch": None}, {"tokens_per_batch": 70}]
)
def test_a_state_where_drop_last_ended_the_epoch_resumes_with_nothing_left(random_dataset, kw):
    """With drop_last the cursor of an ended epoch lies before the dropped tail, and the state
    was taken for a mid-epoch one: with other ranks or batch settings the dropped rows came as
    extra batches (3 ranks x 5 rows over 36 rows, then 1 rank: one more batch of 12 documents),
    and another row order was refused although the epoch had ended."""
    kw = {**SETTINGS, **kw, "drop_last": True}
    ds = PackedDataset(random_dataset, rank=0, world_size=3, **kw)
    dl = PackedDataLoader(ds)
    list(dl)
    state = dl.state_dict()
    assert state["packed_dataset"]["cursor"] < ds.store.num_rows  # a tail was dropped
    others = [
        {"world_size": 3},
        {"world_size": 1},
        {"world_size": 2, "rows_per_batch": 3, "tokens_per_batch": None},
        {"world_size": 1, "drop_last": False},
        {"world_size": 3, "shuffle_window": 1},
        {"world_size": 2, "shuffle": False},
    ]
    for other in others:
        settings = {**kw, **other}
        ds2 = PackedDataset(random_dataset, rank=0, **settings)
        dl2 = PackedDataLoader(ds2)
        dl2.load_state_dict(state)
        assert len(ds2) == 0 and list(dl2) == [], other
        ds2.set_epoch(1)  # the next epoch runs whole
        assert len(list(dl2)) == len(PackedDataset(random_dataset, rank=0, **settings)), other
    state["packed_dataset"]["ended"] = False  # edited: refused, not taken for mid-epoch
    with pytest.raises(DataError, match="does not match its check value"):
        PackedDataLoader(PackedDataset(random_dataset, **kw)).load_state_dict(state)


def test_unshuffled_resume_ignores_the_window(random_dataset):
    kw = {**SETTINGS, "shuffle": False}
    first, state = _run(random_dataset, workers=0, epochs=(0,), take=3, **kw)
    rest, _ = _run(random_dataset, workers=0, epochs=(0,), state=state, shuffle_window=2, **kw)
    assert first + rest == _run(random_dataset, workers=0, epochs=(0,), **kw)[0]


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_protocol(random_dataset, reference, workers):
    epoch0 = [k for k in reference[: len(PackedDataset(random_dataset, **SETTINGS))]]
    ds = PackedDataset(random_dataset, **SETTINGS)
    sdl = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
    first = [_key(b) for b in itertools.islice(sdl, 4)]
    state = sdl.state_dict()
    # Same worker count: torchdata restores each worker itself.
    ds2 = PackedDataset(random_dataset, **SETTINGS)
    sdl2 = StatefulDataLoader(ds2, batch_size=None, num_workers=workers)
    sdl2.load_state_dict(state)
    rest = [_key(b) for b in sdl2]
    assert first + rest == epoch0
    # Other worker count: give the whole state to the dataset, then iterate any loader.
    ds3 = PackedDataset(random_dataset, **SETTINGS)
    ds3.load_state_dict(state)
    rest3 = [_key(b) for b in PackedDataLoader(ds3, num_workers=1 if workers == 0 else 0)]
    assert first + rest3 == epoch0


def test_other_seed_or_dataset_is_a_clear_error(random_dataset, tmp_path):
    ds = PackedDataset(random_dataset, **SETTINGS)
    state = PackedDataLoader(ds).state_dict()
    with pytest.raises(DataError, match="seed 7 but this loader uses seed 8"):
        PackedDataset(random_dataset, **{**SETTINGS, "seed": 8}).load_state_dict(state)
    other = tmp_path / "other"
    write_random_dataset(other, n_rows=5, max_len=64, seed=99)
    with pytest.raises(DataError, match="resume on the same packed data"):
        PackedDataset(other, **SETTINGS).load_state_dict(state)
    with pytest.raises(DataError, match="not a PackedDataset state"):
        ds.load_state_dict({"something": 1})


def _dl_state(path, take: int, **kw) -> dict:
    dl = PackedDataLoader(PackedDataset(path, **{**SETTINGS, **kw}))
    list(itertools.islice(dl, take))
    return dl.state_dict()


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        # A negative step used to index the plan from its end: 5 batches replayed, one a filler.
        ("next_step", -5, "does not fit this dataset"),
        ("next_step", 10_000, "resumes at step 10000 of epoch 0"),
        ("origin", 10**9, "does not fit this dataset"),
        ("origin", -3, "does not fit this dataset"),
        ("cursor", 10**9, "does not fit this dataset"),
        ("next_step", "3", "'next_step' is '3'"),
        ("layout", None, "'layout' is None"),
        ("seed", "7", "'seed' is '7'"),
        ("ended", 1, "'ended' is 1"),
    ],
)
def test_damaged_state_is_a_clear_error(random_dataset, key, value, match):
    state = _dl_state(random_dataset, 3)
    state["packed_dataset"][key] = value
    with pytest.raises(DataError, match=match):
        PackedDataLoader(PackedDataset(random_dataset, **SETTINGS)).load_state_dict(state)


@pytest.mark.parametrize("key", ["next_step", "epoch", "origin", "layout", "fingerprint", "seed"])
def test_state_missing_a_key_is_a_clear_error(random_dataset, key):
    state = _dl_state(random_dataset, 3)
    del state["packed_dataset"][key]
    with pytest.raises(DataError, match=f"malformed PackedDataset state: '{key}' is None"):
        PackedDataset(random_dataset, **SETTINGS).load_state_dict(state)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("next_step", "x"),
        # Not the smallest position, so it used to be passed over: a damaged state resumed.
        ("epoch", True),
    ],
)
def test_stateful_dataloader_state_with_damaged_worker_state(random_dataset, key, value):
    sdl = StatefulDataLoader(
        PackedDataset(random_dataset, **SETTINGS), batch_size=None, num_workers=2
    )
    list(itertools.islice(sdl, 2))
    state = sdl.state_dict()
    state["_snapshot"]["_worker_snapshots"]["worker_1"]["dataset_state"][key] = value
    with pytest.raises(DataError, match="malformed PackedDataset state"):
        PackedDataset(random_dataset, **SETTINGS).load_state_dict(state)


def test_stateful_dataloader_state_taken_after_its_snapshot_is_refused(random_dataset):
    """With snapshot_every_n_steps=4 a state taken 2 batches after a snapshot holds the workers'
    positions of that snapshot: given to the dataset, those 2 batches came again (5 documents
    twice, an auditor's repro). Refused in one line; a damaged wrapper is one line too."""
    sdl = StatefulDataLoader(
        PackedDataset(random_dataset, **SETTINGS),
        batch_size=None, num_workers=2, snapshot_every_n_steps=4,
    )  # fmt: skip
    list(itertools.islice(sdl, 6))
    state = sdl.state_dict()
    assert state["_steps_since_snapshot"] == 2
    with pytest.raises(DataError, match=r"taken 2 step\(s\) after its last snapshot"):
        PackedDataset(random_dataset, **SETTINGS).load_state_dict(state)
    for damaged in (
        {"_snapshot": 5},
        {"_snapshot": {"_worker_snapshots": {"worker_0": 5}}},
        {"_snapshot": {"_worker_snapshots": [{}]}},
        {"_snapshot": {"_main_snapshot": "x"}},
        {"_snapshot": {}, "_steps_since_snapshot": "2"},
    ):
        with pytest.raises(DataError, match="malformed StatefulDataLoader state"):
            PackedDataset(random_dataset, **SETTINGS).load_state_dict(damaged)


def test_checkpoint_between_epochs_resumes_at_the_new_epoch(random_dataset, reference):
    # Before: state_dict() after set_epoch(1) still described epoch 0's end (or, for a fresh
    # loader, epoch 0's start), so a resume replayed finished epochs.
    n0 = len(PackedDataset(random_dataset, **SETTINGS))
    ds = PackedDataset(random_dataset, **SETTINGS)
    dl = PackedDataLoader(ds)
    ds.set_epoch(1)
    assert dl.state_dict()["packed_dataset"]["epoch"] == 1
    ds.set_epoch(0)
    list(dl)
    ds.set_epoch(1)
    state = dl.state_dict()
    assert (state["packed_dataset"]["epoch"], state["packed_dataset"]["next_step"]) == (1, 0)
    rest, _ = _run(random_dataset, workers=0, state=state)
    assert rest == reference[n0:]


def test_state_of_a_resumed_loader_before_iterating_is_the_resume_point(random_dataset):
    state = _dl_state(random_dataset, 4)
    ds = PackedDataset(random_dataset, **SETTINGS)
    ds.load_state_dict(state)  # the dataset, not the loader: the loader must still report it
    assert PackedDataLoader(ds).state_dict() == state
    dl = PackedDataLoader(PackedDataset(random_dataset, **SETTINGS))
    list(itertools.islice(dl, 2))
    dl.load_state_dict(state)  # the loader itself, after it has run: the loaded point wins
    assert dl.state_dict() == state


def test_resume_at_the_end_of_an_epoch_and_after_the_last(random_dataset, reference):
    n0 = len(PackedDataset(random_dataset, **SETTINGS))
    end0 = _dl_state(random_dataset, n0)
    rest, _ = _run(random_dataset, workers=0, state=end0)  # epoch 0 delivers nothing more
    assert rest == reference[n0:]
    _, end1 = _run(random_dataset, workers=2)
    assert end1["packed_dataset"]["epoch"] == 1
    rest, _ = _run(random_dataset, workers=2, state=end1)
    assert rest == []


def _loaders():
    """Every way to iterate a dataset: (name, make an iterable of it)."""
    from torch.utils.data import DataLoader

    yield "in process", lambda ds: ds
    for n in (0, 2):
        yield f"DataLoader({n})", lambda ds, n=n: DataLoader(ds, batch_size=None, num_workers=n)
        yield (
            f"StatefulDataLoader({n})",
            lambda ds, n=n: StatefulDataLoader(ds, batch_size=None, num_workers=n),
        )
        yield f"PackedDataLoader({n})", lambda ds, n=n: PackedDataLoader(ds, num_workers=n)
    yield (
        "DataLoader(2, persistent)",
        lambda ds: DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True),
    )
    yield (
        "PackedDataLoader(2, persistent)",
        lambda ds: PackedDataLoader(ds, num_workers=2, persistent_workers=True),
    )


@pytest.mark.parametrize(("name", "make"), list(_loaders()))
def test_a_resume_point_is_used_up_by_the_iteration_that_starts_there(
    random_dataset, reference, name, make
):
    """Before: only PackedDataLoader used the loaded point up; iterating the dataset itself,
    through torch's DataLoader or StatefulDataLoader(num_workers=0) restarted at it every time
    (134, 134, 134 steps of a 234-step epoch resumed after 100), and set_epoch(0) kept it."""
    n0 = len(PackedDataset(random_dataset, **SETTINGS))
    epoch0 = reference[:n0]
    ds = PackedDataset(random_dataset, **SETTINGS)
    ds.load_state_dict(_dl_state(random_dataset, 4))
    loader = make(ds)
    passes = [[_key(b) for b in loader] for _ in range(3)]
    assert [len(p) for p in passes] == [n0 - 4, n0, n0], name
    assert passes == [epoch0[4:], epoch0, epoch0], name
    ds.load_state_dict(_dl_state(random_dataset, 6))
    ds.set_epoch(0)  # keeps the loaded point: nothing has started from it
    assert len(ds) == n0 - 6
    if "(2" in name and "Packed" not in name:  # used up once every worker has started there
        assert [_key(b) for b in loader] == epoch0[6:], name
    else:  # used up as the iteration starts: an abandoned one uses it too
        assert _key(next(iter(loader))) == epoch0[6], name
    assert len(ds) == n0
    ds.set_epoch(0)  # the point is used: the epoch restarts
    assert [_key(b) for b in loader] == epoch0, name


@pytest.mark.parametrize(("key", "delta"), [("cursor", 1), ("cursor", -1), ("next_step", 1)])
def test_edited_position_is_refused_by_the_check_value(random_dataset, key, delta):
    # With a token budget the cursor decides where the cut resumes; only the full cut from the
    # epoch's start could tell a plausible edit from the real one, so the state carries a hash.
    state = _dl_state(random_dataset, 3)
    state["packed_dataset"][key] += delta
    with pytest.raises(DataError, match="does not match its check value|cannot consume"):
        PackedDataLoader(PackedDataset(random_dataset, **SETTINGS)).load_state_dict(state)


def test_state_of_the_earlier_order_resumes_only_at_an_epoch_start(random_dataset, reference):
    n0 = len(PackedDataset(random_dataset, **SETTINGS))
    ds = PackedDataset(random_dataset, **SETTINGS)
    old = {k: v for k, v in ds._state(1, 0, 0, ds.plan(1)).items() if k != "check"}
    old["version"] = 1  # what the previous packtool saved between epochs
    rest, _ = _run(random_dataset, workers=0, state={"packed_dataset": old})
    assert rest == reference[n0:]
    mid = {**old, "epoch": 0, "next_step": 3, "cursor": ds.plan(0).cursor_after(3)}
    with pytest.raises(DataError, match="older packtool .* in the middle of epoch 0"):
        PackedDataset(random_dataset, **SETTINGS).load_state_dict({"packed_dataset": mid})


_SETTINGS = st.sampled_from(
    [
        {"tokens_per_batch": 150, "seed": 7},
        {"tokens_per_batch": 150, "seed": 1, "shuffle_window": 1},
        {"tokens_per_batch": 200, "seed": 2, "shuffle_window": 0},
        # (None: replaces SETTINGS' budget)
        {"rows_per_batch": 3, "tokens_per_batch": None, "seed": 3, "shuffle_window": 2},
        {"rows_per_batch": 2, "tokens_per_batch": None, "shuffle": False},
        {"tokens_per_batch": 128, "static_shape": True, "max_docs_per_batch": 40, "seed": 4},
    ]
)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@settings(max_examples=10, deadline=None)
@given(kw=_SETTINGS, data=st.data())
def test_resume_at_a_random_step_continues_the_same_stream(random_dataset, kw, data):
    ref, _ = _run(random_dataset, workers=0, epochs=(0,), **kw)
    cut = data.draw(st.integers(0, len(ref)))
    before, after = data.draw(st.sampled_from([0, 1, 2])), data.draw(st.sampled_from([0, 1, 2]))
    first, state = _run(random_dataset, workers=before, epochs=(0,), take=cut or None, **kw)
    if not cut:
        ds = PackedDataset(random_dataset, **{**SETTINGS, **kw})
        first, state = [], PackedDataLoader(ds).state_dict()
    rest, _ = _run(random_dataset, workers=after, epochs=(0,), state=state, **kw)
    assert first + rest == ref


@pytest.mark.parametrize(
    ("epoch", "match"),
    [
        (1.5, "epoch must be an integer >= 0, got 1.5"),
        ("1", "epoch must be an integer >= 0, got '1'"),
        (-1, "epoch must be an integer >= 0, got -1"),  # was accepted (and saved in states)
        (2**64 + 3, "epoch must be below 2\\*\\*63"),  # wrapped around to epoch 3
    ],
)
def test_set_epoch_refuses_what_is_no_epoch(random_dataset, tmp_path, epoch, match):
    from loader.online.streaming import StreamingPackedDataset
    from packtool.errors import ConfigError
    from tests.cli import run

    with pytest.raises(ConfigError, match=match):
        PackedDataset(random_dataset, **SETTINGS).set_epoch(epoch)
    (tmp_path / "c.jsonl").write_text('{"text": "a document"}\n')
    assert run("tokenize", tmp_path / "c.jsonl", "-o", tmp_path / "t.parquet")[0] == 0
    streaming = StreamingPackedDataset([tmp_path / "t.parquet"], max_len=64, rows_per_batch=2)
    with pytest.raises(ConfigError, match=match):
        streaming.set_epoch(epoch)


def test_loader_misuse_names_what_is_wrong(random_dataset):
    from loader import MixedDataset
    from packtool.errors import ConfigError
    from packtool.mixture.spec import MixtureSpec, SourceSpec

    # each was an error of Python's or torch's naming no setting
    with pytest.raises(ConfigError, match="path must be a dataset folder or URL, got None"):
        PackedDataset(None, **SETTINGS)
    with pytest.raises(ConfigError, match="PackedDataLoader takes a PackedDataset, got list"):
        PackedDataLoader([1, 2, 3])
    with pytest.raises(ConfigError, match=r"\['batch_size'\] belong to the dataset"):
        PackedDataLoader(PackedDataset(random_dataset, **SETTINGS), batch_size=4)
    big = [SourceSpec(name=n, path=str(random_dataset), weight=1e308) for n in "ab"]
    with pytest.raises(ConfigError, match="the weights sum past the largest float"):
        MixedDataset(MixtureSpec(sources=big), rows_per_batch=2)


def test_batch_size_none_is_what_the_loaders_use(random_dataset):
    """`batch_size=None` is what the loaders pass to torch themselves: it was refused ("belongs
    to the dataset"; MixedDataLoader: torch's TypeError), and any other batch size is a
    ConfigError in both."""
    from loader import MixedDataLoader, MixedDataset
    from packtool.errors import ConfigError
    from packtool.mixture.spec import MixtureSpec, SourceSpec

    plain = list(PackedDataLoader(PackedDataset(random_dataset, **SETTINGS)))
    given = list(PackedDataLoader(PackedDataset(random_dataset, **SETTINGS), batch_size=None))
    assert [_key(b) for b in given] == [_key(b) for b in plain] and plain

    def mixture() -> MixedDataset:
        spec = MixtureSpec(
            sources=(SourceSpec(name="a", path=str(random_dataset), weight=1),), total_steps=3
        )
        return MixedDataset(spec, rows_per_batch=2)

    assert len(list(MixedDataLoader(mixture(), batch_size=None))) == 3
    with pytest.raises(ConfigError, match=r"MixedDataLoader: \['batch_size'\] belong to"):
        MixedDataLoader(mixture(), batch_size=4)


def test_the_dataset_state_after_loader_workers_iterated_it_is_refused(random_dataset, reference):
    """With PackedDataLoader workers the workers' copies advance and the main process's does
    not: ds.state_dict() said step 0 after 5 batches, and a checkpoint of it repeated them. It
    is refused, naming the loader's state; in process (num_workers=0), after the dataset
    iterates here again, after a load, and through StatefulDataLoader it is the position."""
    from packtool.errors import ConfigError

    ds = PackedDataset(random_dataset, **SETTINGS)
    dl = PackedDataLoader(ds, num_workers=2)
    first = [_key(b) for b in itertools.islice(dl, 5)]
    with pytest.raises(ConfigError, match=r"2 worker\(s\).*\(PackedDataLoader\.state_dict\(\)"):
        ds.state_dict()
    state = dl.state_dict()
    assert state["packed_dataset"]["next_step"] == 5
    ds.load_state_dict(state)  # the dataset's position is the loaded one: its state is right
    assert ds.state_dict()["next_step"] == 5
    rest = [_key(b) for b in PackedDataLoader(ds)]
    assert first + rest == reference[: len(first) + len(rest)]
    # num_workers=0: the dataset iterates here, and its state is the loader's
    ds = PackedDataset(random_dataset, **SETTINGS)
    dl = PackedDataLoader(ds, num_workers=2)
    list(itertools.islice(dl, 2))
    dl0 = PackedDataLoader(ds)
    list(itertools.islice(dl0, 3))
    assert ds.state_dict() == dl0.state_dict()["packed_dataset"]
    # StatefulDataLoader asks each worker's copy (and, without workers, this one)
    for workers in (2, 0):
        ds = PackedDataset(random_dataset, **SETTINGS)
        list(itertools.islice(PackedDataLoader(ds, num_workers=2), 1))  # then another loader
        sdl = StatefulDataLoader(ds, batch_size=None, num_workers=workers)
        got = [_key(b) for b in itertools.islice(sdl, 3)]
        again = StatefulDataLoader(
            PackedDataset(random_dataset, **SETTINGS), batch_size=None, num_workers=workers
        )
        again.load_state_dict(sdl.state_dict())
        assert got + [_key(b) for b in again][:2] == reference[:5]


def test_a_mixture_state_is_named_as_one_not_as_a_damaged_checkpoint(random_dataset):
    # Before: "malformed PackedDataset state: 'epoch' is None; the checkpoint is damaged" (a
    # mixture's state has a `version` too), for a checkpoint that is whole.
    from loader import MixedDataLoader, MixedDataset
    from packtool.mixture.spec import MixtureSpec, SourceSpec

    spec = MixtureSpec(
        sources=(SourceSpec(name="a", path=random_dataset, weight=1),), total_steps=4
    )
    mixed = MixedDataset(spec, rows_per_batch=2)
    next(iter(mixed))
    for state in (mixed.state_dict(), MixedDataLoader(mixed).state_dict()):
        with pytest.raises(DataError, match=r"^not a PackedDataset state but a MixedDataset one;"):
            PackedDataset(random_dataset, **SETTINGS).load_state_dict(state)
