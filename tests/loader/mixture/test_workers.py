"""MixedDataLoader's workers: which worker gathers each row (each row group decoded by one
worker, every worker a share), the trainer's splice of a step's parts (the batch the
rows make in one process), and small windows spread over two workers delivering the in-process
stream, resumed too."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader import MixedDataset
from loader.collate import collate
from loader.mixture.dataloader import splice
from loader.mixture.steps import RowStream
from loader.record import Documents, TokenRuns
from packtool.dataset.columns import LOSS_MASK
from tests.loader.mixture.test_dataset import same, sources, spec, stream

__all__ = ["sources"]  # the module fixture, shared with test_mixture.py


def stream_rows(ds, n):
    rs = RowStream(ds, None)
    rs.ensure(n)
    return {f: a[:n] for f, a in rs.buf.items()}


@pytest.mark.parametrize("window", [0, 2])
@pytest.mark.parametrize("n_workers", [2, 3])
def test_each_row_group_has_one_owner_and_every_worker_a_share(sources, window, n_workers):
    """Every (source, row group) goes to one worker (decoded once, in any epoch), every worker
    gathers rows, and one source's rows are spread over workers."""
    ds = MixedDataset(spec(sources, total_tokens=40_000), rows_per_batch=2, shuffle_window=window)
    rows = stream_rows(ds, 600)  # several epochs of every source
    owner = ds.owners(rows, n_workers)
    seen: dict[tuple[int, int], int] = {}
    for s, g, w in zip(rows["src"].tolist(), rows["group"].tolist(), owner.tolist(), strict=True):
        assert seen.setdefault((s, g), w) == w
    assert set(owner.tolist()) == set(range(n_workers))
    assert len(set(owner[rows["src"] == 0].tolist())) > 1  # a source's rows are spread


@pytest.mark.parametrize("window", [1, 2])
@pytest.mark.parametrize("cut", [1, 7])
def test_two_workers_with_small_windows_deliver_the_in_process_stream(sources, window, cut):
    def make():
        return MixedDataset(spec(sources), tokens_per_batch=200, shuffle_window=window)

    ref, _ = stream(make())
    got, _ = stream(make(), workers=2)
    assert same(got, ref)
    head, state = stream(make(), workers=2, take=cut)
    tail, _ = stream(make(), workers=2, state=state)
    assert same(head + tail, ref)


def _docs(rng, n_docs, mask):
    lens = rng.integers(1, 9, n_docs).astype(np.int32)
    tokens = rng.integers(0, 1000, int(lens.sum())).astype(np.uint16)
    ids = rng.integers(0, 10**6, n_docs).astype(np.int64)
    cols = {LOSS_MASK: rng.integers(0, 2, len(tokens)).astype(np.uint8)} if mask else {}
    return Documents(tokens, lens, ids, cols)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    owners=st.lists(st.integers(0, 2), min_size=1, max_size=30),
    mask=st.booleans(),
    layout=st.sampled_from(["packtool", "hf"]),
    seed=st.integers(0, 2**31),
    placed=st.sets(st.integers(0, 2)),
)
def test_splice_makes_the_batch_of_the_rows_in_order(owners, mask, layout, seed, placed):
    """Rows owned by workers in any pattern, each worker's rows in a part of its own or (the
    workers in `placed`) at their places in the step's shared slot: the parts spliced by the
    step's layout collate to the batch of the rows laid end to end (tokens written from their
    runs)."""
    rng = np.random.default_rng(seed)
    rows = [_docs(rng, int(rng.integers(1, 4)), mask) for _ in owners]
    placed = frozenset(placed & set(owners))
    # the shared slot: the placed workers' rows at their places, anything else elsewhere
    shared = _join(
        [r if o in placed else _scrambled(r, rng) for r, o in zip(rows, owners, strict=True)]
    )
    parts = {}
    for w in sorted(set(owners)):
        mine = [r for r, o in zip(rows, owners, strict=True) if o == w]
        parts[w] = shared if w in placed else _join(mine)
    layout_arr = np.array(
        [owners, [r.n_tokens for r in rows], [r.n_docs for r in rows], [0] * len(rows)],
        np.int64,
    )
    got = splice(parts, layout_arr, placed)
    want = _join(rows)
    if len(parts) > 1:
        assert isinstance(got.tokens, TokenRuns)
    assert np.asarray(got.tokens).tolist() == want.tokens.tolist()
    a = collate(got, layout=layout, pad_tokens=want.n_tokens + 3)
    b = collate(want, layout=layout, pad_tokens=want.n_tokens + 3)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k], k


def _scrambled(docs, rng):
    """Other values of the same sizes (what a shared slot holds where no worker placed rows)."""
    return Documents(
        rng.integers(1000, 2000, docs.n_tokens).astype(docs.tokens.dtype),
        docs.doc_lens,  # the lengths decide the sizes
        rng.integers(-9, -1, docs.n_docs),
        {n: 1 - v for n, v in docs.columns.items()},
    )


def _join(docs):
    return Documents(
        np.concatenate([d.tokens for d in docs]),
        np.concatenate([d.doc_lens for d in docs]),
        np.concatenate([d.doc_ids for d in docs]),
        {n: np.concatenate([d.columns[n] for d in docs]) for n in docs[0].columns},
    )


@pytest.mark.parametrize(
    ("free", "workers"), [("always", 2), ("never", 2), ("some", 2), ("some", 3), ("two slots", 3)]
)
def test_rows_placed_in_step_slots_or_sent_in_parts_give_the_in_process_stream(
    sources, monkeypatch, free, workers
):
    """Workers write a step's rows at their places in its shared slot when the slot is free,
    else in slots of their own (the trainer then splices): any mix gives the same batches, also
    with two step slots only (the workers then often find their step's slot not yet free)."""
    from loader.packed.transport import Ring

    real = Ring.step_free
    rule = {
        "always": real,
        "two slots": real,
        "never": lambda self, step: False,
        "some": lambda self, step: real(self, step) and (step * 7 + self._worker) % 3 != 0,
    }[free]
    if free == "two slots":
        real_init = Ring.__init__

        def init(self, *, step_slots=0, **kw):
            real_init(self, step_slots=min(step_slots, 2), **kw)

        monkeypatch.setattr(Ring, "__init__", init)
    placed = []
    monkeypatch.setattr(Ring, "step_free", rule)
    real_views = Ring.step_views
    monkeypatch.setattr(
        Ring, "step_views", lambda self, step: placed.append(step) or real_views(self, step)
    )

    def make():
        return MixedDataset(spec(sources, total_tokens=20_000), tokens_per_batch=200)

    ref, _ = stream(make())
    got, _ = stream(make(), workers=workers)
    assert same(got, ref)
    if free == "never":
        assert placed == []  # the trainer took no step slot
    elif free == "two slots":
        assert placed  # some steps were placed
    else:
        assert len(set(placed)) > len(ref) // 2  # most steps came whole or partly placed


@pytest.mark.parametrize("worker", [0, 1])
def test_a_worker_hands_each_row_group_to_the_decode_thread_before_gathering_it(
    sources, monkeypatch, worker
):
    """A worker's steps name only the row groups new in their block (`Step.fresh`): every row
    group it gathers was handed to the decode thread with that step or an earlier one of the
    same block, and is decoded in the background, never waited for from scratch."""
    from loader.mixture import worker as mixture_worker
    from loader.mixture.dataloader import MixedDataLoader
    from loader.mixture.sources import PackedSource
    from loader.store.shards import ShardStore

    ds = MixedDataset(spec(sources, total_tokens=60_000), tokens_per_batch=200, shuffle_window=2)
    ring = MixedDataLoader(ds, num_workers=2)._new_ring(0)
    ring.start_worker()
    handed: set[tuple[int, int]] = set()
    late = []
    real_prefetch, real_views = PackedSource.prefetch, ds.views

    def prefetch(self, groups):
        handed.update((ds.sources.index(self), g) for g in groups)
        return real_prefetch(self, groups)

    def views(rows, runs):
        for src, g in zip(rows["src"].tolist(), rows["group"].tolist(), strict=True):
            if (src, g) not in handed:
                late.append((src, g))
        return real_views(rows, runs)

    monkeypatch.setattr(PackedSource, "prefetch", prefetch)
    monkeypatch.setattr(ds, "views", views)
    waited = []
    real_row_group = ShardStore.row_group

    def row_group(self, g):
        if g not in self._cache and g not in self._pending:
            waited.append(g)
        return real_row_group(self, g)

    monkeypatch.setattr(ShardStore, "row_group", row_group)
    stream = RowStream(ds, ds.start_state()["schedule"])
    parts = 0
    for chunk in mixture_worker.ring_parts(ds, stream, 0, ring, worker, 2):
        for item, _ in chunk:
            ring.release(item)
            ring.set_consumed(item.step + 1)
            parts += 1
    assert parts > 50 and len(handed) >= 6  # of the 16 row groups, this worker's share
    assert late == []  # nothing gathered before it was handed to the decode thread
    assert waited == []  # every row group was pending or cached when gathered


def test_the_dataset_state_after_loader_workers_iterated_it_is_refused(sources):
    """MixedDataLoader workers advance their copies of the mixture, not the main process's:
    MixedDataset.state_dict() (and describe()) said step 0 after 4 batches. Refused, naming the
    loader's state; without workers and after a load it is the position."""
    from loader import MixedDataLoader
    from packtool.errors import ConfigError

    whole, _ = stream(MixedDataset(spec(sources), rows_per_batch=2), take=7)
    ds = MixedDataset(spec(sources), rows_per_batch=2)
    first, state = stream(ds, workers=2, take=4)
    assert state["mixed_dataset"]["step"] == 4
    for call in (ds.state_dict, ds.describe):
        with pytest.raises(ConfigError, match=r"\(MixedDataLoader\.state_dict\(\)"):
            call()
    ds.load_state_dict(state)
    assert ds.state_dict()["step"] == 4 and ds.describe()["step"] == 4
    rest, _ = stream(ds, take=3)
    assert same(first + rest, whole)
    # without workers the dataset iterates here: its state is the loader's
    ds = MixedDataset(spec(sources), rows_per_batch=2)
    stream(ds, workers=2, take=2)
    _, state = stream(ds, take=3)
    assert ds.state_dict() == state["mixed_dataset"] and state["mixed_dataset"]["step"] == 3
    assert MixedDataLoader(ds).state_dict() == state  # a new loader, not iterated


def test_a_packtool_error_in_a_worker_is_its_one_line_message(sources, tmp_path):
    """A DataError raised in a MixedDataLoader worker came as torch's "Caught DataError in
    DataLoader worker process 0. Original Traceback ..." (40-odd lines); in process, one."""
    import json
    import shutil

    from packtool.dataset.manifest import read_manifest
    from packtool.errors import DataError
    from tests.loader.packed.test_transport import _pieces_and_tokens

    paths = [shutil.copytree(p, tmp_path / p.name) for p in sources]
    for path in paths:  # pieces counted, as pack writes them: the ring is sized reading none
        index = json.loads((path / "index.json").read_text())
        index["counts"]["segments"] = _pieces_and_tokens(path)[0]
        (path / "index.json").write_text(json.dumps(index))
    opened = {w: MixedDataset(spec(paths), rows_per_batch=2) for w in (0, 2)}
    (paths[0] / read_manifest(paths[0]).shards[-1].file).unlink()  # gone after the open
    messages = []
    for workers, ds in opened.items():
        with pytest.raises(DataError) as info:
            stream(ds, workers=workers)
        assert type(info.value) is DataError
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "\n" not in messages[1], messages


def test_a_worker_error_before_its_first_batch_is_its_one_line_message(sources, monkeypatch):
    """A DataError raised in a MixedDataLoader worker's setup (`start_state`, before its first
    batch) came as torch's "Caught DataError in DataLoader worker process 0. Original
    Traceback ...": only the batches were carried, not the setup."""
    from torch.utils.data import get_worker_info

    from packtool.errors import DataError

    real = MixedDataset.start_state

    def start_state(self):
        if get_worker_info() is not None:
            raise DataError("shard 2 is damaged")
        return real(self)

    monkeypatch.setattr(MixedDataset, "start_state", start_state)
    ds = MixedDataset(spec(sources), rows_per_batch=2)
    with pytest.raises(DataError) as info:
        stream(ds, workers=1, take=1)
    assert type(info.value) is DataError
    assert str(info.value) == "shard 2 is damaged"
