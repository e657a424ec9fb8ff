"""loader/store/shard_files.py: a bounded number of shard files open per process, closed without
harm to what was decoded from them, and a clear error when the process runs out of descriptors."""

from __future__ import annotations

import contextlib
import gc
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from loader import PackedDataset, ShardStore
from loader.store.shard_files import OPEN_FILES
from loader.testing import write_dataset
from packtool.dataset.manifest import read_manifest

N_SHARDS = 3 * OPEN_FILES
"""Shards of the test dataset: well over what a process keeps open."""


def _fds(path) -> int:
    """Descriptors this process holds open on the dataset's files (others the process opens
    or closes meanwhile, such as garbage of earlier tests collected mid-epoch, do not count)."""
    held = 0
    for fd in os.listdir("/proc/self/fd"):
        # closed since it was listed (the listing's own descriptor too): not held
        with contextlib.suppress(OSError):
            held += os.readlink(f"/proc/self/fd/{fd}").startswith(f"{path}/")
    return held


def _mapped(path) -> int:
    """Memory maps of the dataset's shards in this process."""
    with open("/proc/self/maps") as f:
        return sum(str(path) in line for line in f)


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory):
    """N_SHARDS shards of two one-row row groups each (uncompressed: pages as stored)."""
    path = tmp_path_factory.mktemp("files") / "many"
    rows = [[[(i * 7 + j) % 250 + 1 for j in range(1 + i % 5)]] for i in range(2 * N_SHARDS)]
    write_dataset(path, rows, max_len=8, rows_per_shard=2, row_group_rows=1, compression=None)
    return path


def _stored_rows(path) -> list[list[int]]:
    """Every row's tokens, read with pyarrow alone (not the loader)."""
    m = read_manifest(path)
    return [
        row
        for s in m.shards
        for row in pq.read_table(path / s.file, columns=["input_ids"]).column(0).to_pylist()
    ]


def _epoch(ds: PackedDataset, path) -> tuple[list[dict], int, int]:
    """The epoch's batches (copied), and the most extra descriptors and shard maps held."""
    gc.collect()  # an earlier epoch's store, if garbage, lets go of its files first
    base_fds, base_maps = _fds(path), _mapped(path)
    batches, most_fds, most_maps = [], 0, 0
    for b in ds:
        batches.append({k: v.clone() for k, v in b.items() if isinstance(v, torch.Tensor)})
        most_fds = max(most_fds, _fds(path) - base_fds)
        most_maps = max(most_maps, _mapped(path) - base_maps)
    return batches, most_fds, most_maps


def test_an_epoch_keeps_at_most_the_cap_of_shard_files_open(many_shards):
    capped, most_fds, most_maps = _epoch(PackedDataset(many_shards, rows_per_batch=4), many_shards)
    assert most_maps <= OPEN_FILES
    assert most_fds <= OPEN_FILES
    # Uncapped, the same epoch opens every shard (the dataset is big enough to tell) and
    # delivers the same batches.
    unbounded = PackedDataset(many_shards, rows_per_batch=4)
    unbounded.store._files.limit = 10 * N_SHARDS
    uncapped, all_fds, all_maps = _epoch(unbounded, many_shards)
    assert all_maps >= N_SHARDS - OPEN_FILES // 4 and all_fds >= N_SHARDS - OPEN_FILES // 4
    assert len(capped) == len(uncapped) == N_SHARDS // 2
    for a, b in zip(capped, uncapped, strict=True):
        assert a.keys() == b.keys()
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_closing_a_shard_keeps_what_was_decoded_from_it(many_shards):
    stored = _stored_rows(many_shards)
    store = ShardStore(many_shards, cache_bytes=1 << 30)
    held = store.row_group(0)  # shard 0, row 0
    parts, _, _ = store.views([1], [0], [])  # views into shard 0's second row group
    # Every other shard read, in the background and in place: shard 0 is closed (twice over).
    store.prefetch(list(range(2, store.num_row_groups)))
    for g in range(2, store.num_row_groups):
        store.row_group(g)
    assert 0 not in store._files.open and len(store._files.open) == OPEN_FILES
    gc.collect()
    scribble = [np.full(4096, 0xAB, np.uint8) for _ in range(256)]  # reuse freed memory
    assert held.tokens[held.token_offsets[0] : held.token_offsets[1]].tolist() == stored[0]
    assert parts[0][0].tolist() == stored[1]
    assert len(scribble) == 256
    # Every row of the dataset, decoded ahead across more shards than are kept open.
    again = ShardStore(many_shards, cache_bytes=0)
    again.prefetch(list(range(again.num_row_groups)))
    got = again.gather(np.arange(again.num_rows))
    cuts = np.cumsum([0, *map(len, stored)])
    assert [got.tokens[a:b].tolist() for a, b in zip(cuts[:-1], cuts[1:], strict=True)] == stored


_OUT_OF_FILES = """
import os, resource, sys
from loader import PackedDataset
from packtool.errors import DataError
ds = PackedDataset(sys.argv[1], rows_per_batch=4)
limit = len(os.listdir("/proc/self/fd")) + 3
resource.setrlimit(resource.RLIMIT_NOFILE, (limit, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
print(limit)
try:
    for _ in ds:
        pass
except DataError as exc:
    print(exc)
"""


def test_running_out_of_file_descriptors_names_the_limit(many_shards):
    out = subprocess.run(
        [sys.executable, "-c", _OUT_OF_FILES, str(many_shards)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert len(out) == 2, out  # the limit, then one line of error
    limit, message = out
    assert "shard-" in message and "too many open files" in message
    assert f"ulimit -n is {limit}" in message
    assert "damaged" not in message and "Errno" not in message


_TRUNCATED = """
import json, os, sys
from loader import ShardStore
from packtool.errors import DataError
store = ShardStore(sys.argv[1], cache_bytes=0)
store.row_group(0)  # the shard is open and mapped now
shard = os.path.join(sys.argv[1], json.load(open(os.path.join(sys.argv[1], "index.json")))["shards"][0]["file"])
os.truncate(shard, 100)  # in place (a copy over it, a quota cut): the map outlives the bytes
try:
    store.row_group(store.num_row_groups - 1)  # pages past the new end: a fault, unchecked
    print("read on")
except DataError as exc:
    print(exc)
"""


def test_a_shard_truncated_while_open_is_a_data_error_not_a_bus_error(tmp_path):
    # It was SIGBUS (exit 135, no message): the size and mtime were checked only when the shard
    # was (re)opened, and reading a row group past the new end of the mapping faults.
    path = tmp_path / "ds"
    rows = [[[(i * 13 + j) % 250 + 1 for j in range(200)]] for i in range(64)]
    write_dataset(path, rows, max_len=200, row_group_rows=4, compression=None)
    out = subprocess.run(
        [sys.executable, "-c", _TRUNCATED, str(path)], capture_output=True, text=True
    )
    assert out.returncode == 0, (out.returncode, out.stderr[-500:])
    (message,) = out.stdout.splitlines()
    assert "shard-" in message and "the shard changed after the dataset was opened" in message
