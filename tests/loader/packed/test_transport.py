"""loader/packed/transport.py: batches through the shared-memory ring equal the in-process batches exactly."""

from __future__ import annotations

import itertools
from dataclasses import astuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataLoader, PackedDataset, ShardStore, collate
from loader.packed.transport import CompactBatch, Ring, pack_compact
from loader.record import Documents
from tests.loader.conftest import block_row_groups


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], torch.Tensor):
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            assert torch.equal(a[k], b[k]), k
        else:
            assert type(a[k]) is type(b[k]) and a[k] == b[k], k


def _in_process(path, epoch=0, **kw) -> list[dict]:
    ds = PackedDataset(path, **kw)
    ds.set_epoch(epoch)
    return list(ds)


CASES = [
    ({"tokens_per_batch": 150, "seed": 7, "shuffle_window": 1}, 2),
    ({"tokens_per_batch": 150, "seed": 7, "shuffle_window": 0}, 3),
    ({"rows_per_batch": 2, "shuffle": False, "layout": "hf"}, 2),
    ({"rows_per_batch": 3, "static_shape": True, "seed": 1, "shuffle_window": 2}, 1),
    # Rank 1 of 2 with 3-row batches: the last step is a filler batch for one rank.
    ({"rows_per_batch": 3, "rank": 1, "world_size": 2, "seed": 2, "shuffle_window": 1}, 2),
]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("settings_", "workers"), CASES)
def test_ring_stream_equals_in_process(random_dataset, settings_, workers):
    expected = _in_process(random_dataset, **settings_)
    ds = PackedDataset(random_dataset, **settings_)
    got = list(PackedDataLoader(ds, num_workers=workers))
    assert len(got) == len(expected)
    for a, b in zip(got, expected, strict=True):
        _same(a, b)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_blocks_of_steps_are_put_back_in_order(random_dataset):
    ds = PackedDataset(random_dataset, rows_per_batch=1, shuffle_window=1, seed=5)
    plan = ds.plan(0)
    assert 1 < ds.block_steps(plan) < plan.num_steps  # several blocks, so workers interleave
    expected = _in_process(random_dataset, rows_per_batch=1, shuffle_window=1, seed=5)
    got = list(PackedDataLoader(ds, num_workers=3))
    assert [b["doc_ids"].tolist() for b in got] == [b["doc_ids"].tolist() for b in expected]


class _TinyRing(PackedDataLoader):
    """One slot per worker and room for 2 documents: most batches take the fallback path."""

    def _new_ring(self, plan):
        ds = self._packed
        return Ring(
            num_workers=self.num_workers,
            slots=1,
            max_tokens=ds.max_batch_tokens,
            max_docs=2,
            token_dtype=ds.store.token_dtype,
        )


def test_fallback_outside_the_ring_gives_the_same_batches(random_dataset):
    kw = {"tokens_per_batch": 150, "seed": 7, "shuffle_window": 1}
    expected = _in_process(random_dataset, **kw)
    got = list(_TinyRing(PackedDataset(random_dataset, **kw), num_workers=2))
    for a, b in zip(got, expected, strict=True):
        _same(a, b)


def test_persistent_workers_restart_after_a_break(random_dataset):
    kw = {"tokens_per_batch": 150, "seed": 7, "shuffle_window": 1}
    ds = PackedDataset(random_dataset, **kw)
    dl = PackedDataLoader(ds, num_workers=2, persistent_workers=True, prefetch_factor=2)
    list(itertools.islice(dl, 3))  # abandon the epoch with batches still in flight
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        got = list(dl)
        expected = _in_process(random_dataset, epoch=epoch, **kw)
        assert len(got) == len(expected)
        for a, b in zip(got, expected, strict=True):
            _same(a, b)


def test_ring_slots_and_fallback(random_dataset):
    store = ShardStore(random_dataset)
    ring = Ring(num_workers=1, slots=2, max_tokens=200, max_docs=40, token_dtype=store.token_dtype)
    ring.start_worker()
    rows = np.array([3, 0, 17])
    a = ring.put(store, rows, filler=False, step=0)
    b = ring.put(store, rows, filler=True, step=1)
    c = ring.put(store, rows, filler=False, step=2)  # slot 0 still busy: its own buffer
    assert (a.slot, b.slot, c.slot) == (0, 1, -1) and c.data is not None and b.filler
    want = store.gather(rows)
    for item in (a, b, c):
        got = ring.take(item)
        for x, y in zip(astuple(got)[:3], astuple(want)[:3], strict=True):
            assert np.array_equal(x, y)
    ring.release(a)
    ring.release(b)
    assert ring.put(store, rows, filler=False, step=3).slot == 1  # slots are used in turn
    too_many = ring.put(store, np.arange(37), filler=False, step=4)  # > 200 tokens
    assert too_many.slot == -1 and too_many.n_tokens > 200


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 9), min_size=1, max_size=12),
    wide=st.booleans(),
    pad=st.integers(0, 5),
    layout=st.sampled_from(["packtool", "hf"]),
    seed=st.integers(0, 2**16),
)
def test_compact_round_trip_expands_like_collate(lens, wide, pad, layout, seed):
    rng = np.random.default_rng(seed)
    dtype = np.uint32 if wide else np.uint16
    tokens = rng.integers(0, np.iinfo(dtype).max, size=sum(lens), dtype=dtype)
    doc_lens = np.asarray(lens, np.int32)
    doc_ids = rng.integers(0, 1 << 40, size=len(lens))
    docs = Documents(tokens, doc_lens, doc_ids)
    item = pack_compact(docs, filler=False, token_dtype=np.dtype(dtype), step=0)
    assert isinstance(item, CompactBatch)
    ring = Ring(num_workers=1, slots=1, max_tokens=1, max_docs=1, token_dtype=np.dtype(dtype))
    kw = {"pad_tokens": sum(lens) + pad, "pad_docs": len(lens) + 2, "layout": layout}
    _same(collate(ring.take(item), **kw), collate(docs, **kw))


@pytest.mark.parametrize("window", [1, 2, 3])
def test_worker_blocks_follow_shuffle_windows(random_dataset, window):
    # One row per step: a block is exactly one window, so no row group is in two blocks and
    # N workers decode the dataset once between them.
    ds = PackedDataset(random_dataset, rows_per_batch=1, shuffle_window=window, seed=window)
    assert len(block_row_groups(ds)) == ds.store.num_row_groups
    plan = ds.plan(0)
    starts = ds.block_starts(plan)
    # The ring is sized before the epoch is cut: a bound from the window sizes, not the count.
    assert np.diff(starts).max() <= ds.block_steps(plan) <= np.diff(starts).max() + 2


_LIFECYCLE = r"""
import gc, os, signal, sys, time
import torch
torch.multiprocessing.set_sharing_strategy("file_system")  # segments show up in /dev/shm
from loader import PackedDataLoader, PackedDataset

def workers():
    me, out = os.getpid(), []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # only the DataLoader workers, not the sharing strategy's manager process
            if int(stat[1]) == me and not open(f"/proc/{p}/comm").read().startswith("torch_"):
                out.append(int(p))
    return out

ds = PackedDataset(sys.argv[1], tokens_per_batch=150, seed=7, shuffle_window=1)
if sys.argv[2] == "sigint":
    dl = PackedDataLoader(ds, num_workers=2, persistent_workers=True)
    for epoch in range(10**6):
        ds.set_epoch(epoch)
        for i, b in enumerate(dl):
            if epoch == 0 and i == 2:
                print("pids", *workers(), flush=True)
                print("running", flush=True)
            time.sleep(0.005)
for persistent in (False, True):  # abandon an epoch half way, drop the loader
    dl = PackedDataLoader(ds, num_workers=2, persistent_workers=persistent)
    it = iter(dl)
    [next(it) for _ in range(3)]
    print("pids", *workers(), flush=True)
    del it, dl
    gc.collect()
dl = PackedDataLoader(ds, num_workers=2)  # a worker dies mid-epoch
it = iter(dl)
next(it)
pids = workers()
print("pids", *pids, flush=True)
os.kill(pids[0], signal.SIGKILL)
try:
    for _ in it:
        pass
except RuntimeError as exc:
    print("worker death:", exc, flush=True)
del it, dl
gc.collect()
print("done", flush=True)
"""


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["drop-and-kill", "sigint"])
def test_loader_processes_and_shared_memory_are_released(random_dataset, mode):
    """Abandoned iterations, a killed worker and Ctrl-C: no hang, no worker or /dev/shm left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    shm = "/dev/shm"
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-c", _LIFECYCLE, str(random_dataset), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    try:
        if mode == "sigint":
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("running"):
                    break
            proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the loader hung:\n{''.join(lines)}{out}")
    out = "".join(lines) + out
    if mode == "sigint":
        assert "KeyboardInterrupt" in out, out
    else:
        # (the return code too: a CI run once saw only the first line, the child gone silently)
        assert proc.returncode == 0 and "worker death:" in out and "done" in out, (
            proc.returncode,
            out,
        )
    pids = [
        int(p) for line in out.splitlines() if line.startswith("pids") for p in line.split()[1:]
    ]
    assert pids, out
    deadline = time.monotonic() + 15  # orphaned workers notice a dead parent within ~5 s
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids), [p for p in pids if not _gone(p)]
    if os.path.isdir(shm):
        assert not [f for f in os.listdir(shm) if f.startswith(f"torch_{proc.pid}_")]


def _pieces_and_tokens(path) -> tuple[int, int]:
    """Document pieces and tokens of a dataset, recounted from its shards with pyarrow."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from packtool.dataset.manifest import read_manifest

    pieces = tokens = 0
    for s in read_manifest(path).shards:
        table = pq.read_table(path / s.file, columns=["input_ids", "doc_offsets"])
        pieces += int(pc.sum(pc.list_value_length(table.column("doc_offsets"))).as_py())
        pieces -= table.num_rows  # a row's offsets are 0, its pieces' ends
        tokens += int(pc.sum(pc.list_value_length(table.column("input_ids"))).as_py())
    return pieces, tokens


def test_ring_sizing_reads_no_row_group_when_the_manifest_counts_pieces(random_dataset, tmp_path):
    """The ring's slots were sized from the first 64 row groups' counts, read one at a time in
    the main process: from a bucket, behind 50 ms a request, the first batch of a loader with
    workers came after 6 s. `pack` records the pieces (`counts.segments`): nothing is read."""
    import json
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(random_dataset, path)
    pieces, tokens = _pieces_and_tokens(path)
    spec = json.loads((path / "index.json").read_text())
    spec["counts"]["segments"] = pieces
    (path / "index.json").write_text(json.dumps(spec))
    ds = PackedDataset(path, tokens_per_batch=128)
    assert ds.docs_per_token() == pieces / tokens
    assert ds.max_batch_docs() == int(min(2 * pieces / tokens * 128 + 16, 128))
    assert ds.index.groups_read == 0


def test_ring_sizing_of_an_older_dataset_fetches_its_row_groups_side_by_side(random_dataset):
    """A dataset without `counts.segments`: the first (up to) 64 row groups, all handed to the
    prefetch before the first is read."""
    ds = PackedDataset(random_dataset, tokens_per_batch=128)
    assert "segments" not in ds.store.manifest.counts
    events: list = []
    ds.index.prefetch = lambda groups: events.append(("prefetch", list(groups)))
    read = ds.index.read
    ds.index.read = lambda g: events.append(("read", g)) or read(g)
    pieces, tokens = _pieces_and_tokens(random_dataset)
    assert ds.docs_per_token() == pieces / tokens  # every group is among the first 64 here
    groups = ds.index.num_groups
    assert groups > 1
    assert events == [("prefetch", list(range(groups)))] + [("read", g) for g in range(groups)]


def _boom(worker_id: int) -> None:
    raise ZeroDivisionError("not packtool's")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_packtool_error_in_a_worker_is_its_one_line_message(random_dataset, tmp_path):
    # It reached the trainer as torch's 43 lines ("Caught DataError in DataLoader worker
    # process 0. Original Traceback ..."), one line with num_workers=0 (the auditor's r2).
    import json
    import shutil

    from packtool.dataset.manifest import read_manifest
    from packtool.errors import DataError

    path = shutil.copytree(random_dataset, tmp_path / "copy")
    spec = json.loads((path / "index.json").read_text())
    spec["counts"]["segments"] = _pieces_and_tokens(path)[0]  # as pack writes: sizing reads none
    (path / "index.json").write_text(json.dumps(spec))
    ds = PackedDataset(path, rows_per_batch=4)
    (path / read_manifest(path).shards[2].file).unlink()  # gone after the open
    messages = []
    for workers in (0, 2):
        with pytest.raises(DataError) as info:
            for _ in PackedDataLoader(ds, num_workers=workers):
                pass
        assert type(info.value) is DataError
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "\n" not in messages[1], messages
    assert "shard-00002.parquet" in messages[1]
    # Any other error is torch's, as it was.
    with pytest.raises(ZeroDivisionError, match="Caught ZeroDivisionError in DataLoader worker"):
        next(iter(PackedDataLoader(ds, num_workers=1, worker_init_fn=_boom)))


@pytest.mark.parametrize("setting", ["tokens_per_batch", "rows_per_batch"])
def test_a_batch_setting_past_the_whole_dataset_sizes_the_ring_by_the_dataset(
    random_dataset, setting
):
    # Before: the workers' ring was sized by the setting: a RuntimeError from torch's allocator
    # ("you tried to allocate 33774650063872 bytes") at the first iteration for 10^12 tokens,
    # which is now refused (past int32 cu_seqlens); the most a batch may hold is still ~40 GB
    # of ring for a dataset of a few thousand tokens.
    most = 2**31 - 1
    max_len = PackedDataset(random_dataset, rows_per_batch=1).store.max_len
    ds = PackedDataset(random_dataset, **{setting: most if setting[0] == "t" else most // max_len})
    assert ds.max_batch_tokens == sum(s.tokens for s in ds.store.manifest.shards)
    expected = [b["input_ids"].tolist() for b in ds]
    got = [b["input_ids"].tolist() for b in PackedDataLoader(ds, num_workers=1)]
    assert got == expected and len(got) == 1
