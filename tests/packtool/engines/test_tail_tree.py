"""The tail tree's layout (packtool/engines/merge.py), checked with hypothesis.

Every unit but the root is packed by exactly one merge node of the level above it; no node
has more than F children; ids continue the partitions', level by level, the root last; with at
most F partitions the tree is the root alone, "partition N", as the single final stage was. The
nodes' records are not counted as finished partitions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtool.engines import records, worker
from packtool.engines.base import workers_lost
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.merge import MERGE, TAIL_FAN_IN, TailTree
from packtool.engines.output_folder import staging_folder
from packtool.errors import ConfigError
from packtool.pack.chunk import PackConfig

CORPUS = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"


@given(n=st.integers(0, 5000), fan_in=st.integers(2, 80))
def test_every_unit_has_one_parent_and_no_node_more_than_f_children(n, fan_in):
    tree = TailTree(n, fan_in)
    parent: dict[int, int] = {}
    for level in range(1, tree.levels + 1):
        for unit in tree.level_ids(level):
            kids = tree.children(unit)
            assert 1 <= len(kids) <= fan_in
            assert all(tree.level_of(k) == level - 1 for k in kids)
            for k in kids:
                assert k not in parent
                parent[k] = unit
    root_kids = tree.children(tree.root)
    assert len(root_kids) <= fan_in
    for k in root_kids:
        assert k not in parent
        parent[k] = tree.root
    assert sorted(parent) == list(range(tree.root))  # every unit but the root, once
    # Ids: partitions 0..n-1, then each level in order, the root last.
    ids = [u for level in range(tree.levels + 1) for u in tree.level_ids(level)]
    assert ids == list(range(tree.root))
    assert all(parent[u] > u for u in parent)  # a node comes after its children
    # Shallow: each level shrinks by the fan-in.
    for a, b in zip(tree.sizes, tree.sizes[1:], strict=False):
        assert b == -(-a // fan_in) and a > fan_in


@given(n=st.integers(0, TAIL_FAN_IN))
def test_at_most_f_partitions_is_the_root_alone_as_before(n):
    tree = TailTree(n)
    assert tree.root == n and tree.levels == 0
    assert tree.children(n) == range(n)
    assert tree.descriptor(n) == {
        "kind": MERGE,
        "index": n,
        "level": 1,
        "children": [0, n],
        "root": True,
    }


def test_a_tree_of_10_5_partitions_is_three_short_levels():
    tree = TailTree(100_000, 64)
    assert tree.sizes == (100_000, 1563, 25)
    assert tree.root == 100_000 + 1563 + 25
    assert tree.children(100_000) == range(0, 64)
    assert tree.children(100_000 + 1562) == range(1562 * 64, 100_000)  # the last, 32 children
    assert tree.children(tree.root) == range(101_563, 101_588)
    # No fan-in (a run state from before the tree): the root packs every partition.
    assert TailTree(100_000, None).children(100_000) == range(100_000)


def test_a_partition_is_not_a_merge_node_and_the_fan_in_is_checked():
    tree = TailTree(10, 3)
    with pytest.raises(ValueError, match="partition"):
        tree.children(4)
    with pytest.raises(ValueError, match="not in a tree"):
        tree.level_of(tree.root + 1)
    with pytest.raises(ConfigError, match="fan-in"):
        TailTree(10, 1)


def test_the_trees_records_are_not_counted_as_finished_partitions(tmp_path, monkeypatch):
    """The merge nodes' and the root's records share `parts/` with the partitions' (ids from
    the plan's partition count up): 154 partitions were said to have left "157 finished
    partitions", and a run whose workers died counted them too."""
    config = RunConfig(
        inputs=(str(CORPUS),),
        out_dir=str(tmp_path / "out"),
        pack=PackConfig(max_len=1024),
        chunk_docs=500,
        progress=False,
    )

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:  # stopped at its first write, its plan saved
        m.setattr(worker, "write_chunk", boom)
        with pytest.raises(KeyboardInterrupt):
            run_pack(config)
    staging = staging_folder(tmp_path / "out")
    n = len(records.read_plan(staging)["plan"]["partitions"])
    for unit in (0, n, n + 1):  # a partition, a merge node, the root
        records.write_record(staging, {"partition": unit})
    with pytest.raises(ConfigError, match=r"left its 1 finished partition in "):
        run_pack(config)
    lost = str(workers_lost(staging, "workers died", "retry", n))
    assert "its 1 finished partition(s) are kept" in lost, lost
