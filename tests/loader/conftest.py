"""Small packtool datasets written by hand (loader.testing) for the loader tests."""

from __future__ import annotations

import numpy as np
import pytest

from loader.testing import write_dataset, write_random_dataset


@pytest.fixture
def hand_dataset(tmp_path):
    """Three rows, hand-checkable: [[1,2,3],[4,5]], [[6,7,8,9]], [[10],[11],[12]]; max_len 6."""
    path = tmp_path / "hand"
    write_dataset(
        path, [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10], [11], [12]]], max_len=6, row_group_rows=2
    )
    return path


@pytest.fixture(scope="session")
def random_dataset(tmp_path_factory):
    """37 rows of max_len 64 over 4 shards and several row groups each; doc ids unique."""
    path = tmp_path_factory.mktemp("loader") / "random"
    write_random_dataset(
        path, n_rows=37, max_len=64, mean_doc=9, rows_per_shard=10, row_group_rows=4, seed=3
    )
    return path


def all_doc_ids(path) -> np.ndarray:
    """Every document id in the dataset (reading the shards with pyarrow, not the loader)."""
    import pyarrow.parquet as pq

    from packtool.dataset.manifest import read_manifest

    m = read_manifest(path)
    ids = [
        np.asarray(
            pq.read_table(path / s.file, columns=["doc_ids"])
            .column("doc_ids")
            .combine_chunks()
            .values
        )
        for s in m.shards
    ]
    return np.sort(np.concatenate(ids))


def block_row_groups(ds) -> set[int]:
    """The row groups of `ds`'s epoch-0 `PackedDataLoader` worker blocks (with one row a rank a
    step a block is one window), asserting that none lies in two blocks: N workers then decode
    each of the rank's row groups once between them."""
    import itertools

    plan = ds.plan(0)
    starts = ds.block_starts(plan)
    assert starts[0] == 0 and starts[-1] == plan.num_steps and (np.diff(starts) > 0).all()
    seen: set[int] = set()
    for a, b in itertools.pairwise(starts.tolist()):
        rows = np.concatenate([ds.rows_for(plan, s) for s in range(a, b)])
        groups = set(ds.store.row_group_of(rows).tolist())
        assert not groups & seen, (ds.rank, a, b)
        seen |= groups
    return seen


BAD_VALUES = ("x", 1.5, {"bad": 1})
"""Values of the wrong type for every part of a state (no part takes a str, float or such dict)."""


def key_name(path: tuple) -> str:
    """The name a damaged-state message gives a part: `packer.buffer.length`, `ready[0].tokens`."""
    out = ""
    for k in path:
        out += f"[{k}]" if isinstance(k, int) else (f".{k}" if out else k)
    return out


def damaged_states(state: dict, skip: tuple[str, ...] = (), optional: frozenset = frozenset()):
    """`(name, damaged copy)` for every nested part of `state`: removed (dict entries) and
    replaced by each of `BAD_VALUES`. Top-level keys in `skip` (and what they hold) are left;
    keys named in `optional` (states saved before they existed lack them) are not removed."""
    import copy

    def parts(value, path):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            yield (*path, k), isinstance(value, dict)
            if isinstance(v, (dict, list, tuple)):
                yield from parts(v, (*path, k))

    for path, removable in parts(state, ()):
        if path[0] in skip:
            continue
        removable = removable and path[-1] not in optional
        for edit in (("del",) if removable else ()) + BAD_VALUES:
            damaged = copy.deepcopy(state)
            parent = damaged
            for k in path[:-1]:
                if isinstance(parent[k], tuple):  # seed_key may be a tuple: make it editable
                    parent[k] = list(parent[k])
                parent = parent[k]
            if edit == "del":
                del parent[path[-1]]
            else:
                parent[path[-1]] = edit
            yield key_name(path), damaged


def negative_states(state: dict, skip: tuple[str, ...] = ()):
    """`(name, damaged copy)` for every non-empty integer array in `state` (numpy's, or torch
    tensors as states are saved: ids, lengths, counts, offsets; optional per-token `columns`
    aside) with its first entry made -1: no part of a state is ever negative, so each is damage."""
    import copy

    import torch

    def integers(v) -> bool:
        if isinstance(v, torch.Tensor):
            return not v.dtype.is_floating_point and v.dtype != torch.bool and v.numel() > 0
        return isinstance(v, np.ndarray) and v.dtype.kind in "iu" and v.size > 0

    def arrays(value, path):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for k, v in items:
            if integers(v):
                yield (*path, k)
            elif isinstance(v, (dict, list, tuple)) and k != "columns":
                yield from arrays(v, (*path, k))

    for path in arrays(state, ()):
        if path[0] in skip:
            continue
        damaged = copy.deepcopy(state)
        parent = damaged
        for k in path[:-1]:
            parent = parent[k]
        part = parent[path[-1]]
        parent[path[-1]] = part.to(torch.int64) if torch.is_tensor(part) else part.astype(np.int64)
        parent[path[-1]][0] = -1
        yield key_name(path), damaged
