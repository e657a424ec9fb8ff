"""The tail tree's layout (packtool/engines/merge.py), checked with hypothesis.

Every unit but the root is packed by exactly one merge node of the level above it; no node
has more than F children; ids continue the partitions', level by level, the root last; with at
most F partitions the tree is the root alone, "partition N", as the single final stage was. The
nodes' records are not counted as finished partitions.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtool.audit.verify import verify_dataset
from packtool.dataset import shards
from packtool.engines import merge, records, worker
from packtool.engines.base import workers_lost
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.merge import MERGE, TAIL_FAN_IN, TailTree
from packtool.engines.output_folder import staging_folder
from packtool.errors import ConfigError, PacktoolError, TailTreeFailed
from packtool.pack import chunk
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


# --- a tail tree larger than one Arrow table ----------------------------------------------------


def _long_documents(folder: Path) -> Path:
    """40 documents of 719-793 bytes (byte tokenizer: as many tokens, + EOS), so at max_len 200
    every partition of 1 KB leaves a part-filled row in its tail: the root packs ~6,000 tokens,
    as a root at --max-len 2^24 packs up to 64 x 32 rows of 2^24 tokens."""
    words = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"]
    path = folder / "long.jsonl"
    lines = (
        json.dumps({"text": " ".join(words[(i * 7 + j * j) % 8] for j in range(150))})
        for i in range(40)
    )
    path.write_text("\n".join(lines) + "\n")
    return path


def _tree_config(corpus: Path, out: Path, **kw) -> RunConfig:
    kw = {"partition_size": 1024, **kw}
    return RunConfig(
        inputs=(str(corpus),),
        out_dir=str(out),
        pack=PackConfig(max_len=200),
        workers=1,  # in this process: the lowered limit holds for every unit
        progress=False,
        **kw,
    )


def _pieces(out: Path) -> dict[tuple[int, int], list[int]]:
    """Every packed piece's ids by (document, chunk), from the shards; no row over max_len."""
    pieces: dict[tuple[int, int], list[int]] = {}
    for shard in sorted(out.glob("shard-*.parquet")):
        for row in pq.read_table(shard).to_pylist():
            assert len(row["input_ids"]) <= 200
            offsets = row["doc_offsets"]
            for i, key in enumerate(zip(row["doc_ids"], row["doc_chunks"], strict=True)):
                assert key not in pieces  # each piece once
                pieces[key] = row["input_ids"][offsets[i] : offsets[i + 1]]
    return pieces


@pytest.mark.parametrize(
    ("partition_size", "limit"),
    [(1024, 3_000), (4096, 1_000)],
    ids=["the root only", "partitions' chunks too"],
)
def test_chunks_over_one_arrow_table_are_packed_in_parts(
    tmp_path, monkeypatch, partition_size, limit
):
    """A chunk's rows are one Arrow table (int32 offsets: 2^31 - 1 tokens), and chunks were cut
    by --chunk-docs alone: at --max-len 2^24 with documents of millions of tokens the root
    packed more than that and failed after every partition had finished ("a chunk of 6040
    tokens is too large for one Arrow table; lower --chunk-docs", here with the limit lowered
    to 3,000), deleting them all. Now a chunk that does not fit is packed in parts: the same
    pieces, each once; rows that fitted before are the same bytes."""
    corpus = _long_documents(tmp_path)
    reference = run_pack(_tree_config(corpus, tmp_path / "ref", partition_size=partition_size))
    monkeypatch.setattr(chunk, "MAX_CHUNK_TOKENS", limit)
    monkeypatch.setattr(shards, "MAX_GROUP_TOKENS", limit)  # a row group is one list array too
    summary = run_pack(_tree_config(corpus, tmp_path / "cut", partition_size=partition_size))
    n = summary.partitions
    root = TailTree(n).root
    assert n == reference.partitions and n > 1 and root == n  # the root alone, "partition n"
    verify_dataset(tmp_path / "cut")
    got, want = _pieces(tmp_path / "cut"), _pieces(tmp_path / "ref")
    assert got == want and len(got) == summary.counts.segments
    assert summary.counts.tokens_out == reference.counts.tokens_out
    assert summary.counts.documents_packed == 40
    # The unit over the limit wrote more tokens than one chunk may hold: it was packed in parts.
    big = root if partition_size == 1024 else 0
    rows = [
        ids
        for s in (tmp_path / "cut").glob(f"shard-{big:06d}-*.parquet")
        for ids in pq.read_table(s).column("input_ids").to_pylist()
    ]
    assert sum(map(len, rows)) > limit
    for s in (tmp_path / "cut").glob("shard-*.parquet"):  # parts' rows joined in a row group
        shard = pq.ParquetFile(s)
        for g in range(shard.num_row_groups):
            group = shard.read_row_group(g, columns=["input_ids"]).column(0).to_pylist()
            assert sum(map(len, group)) <= limit or len(group) == 1
    if partition_size == 1024:  # partitions under the limit: their shards are the same bytes
        for p in range(n):
            for s in (tmp_path / "ref").glob(f"shard-{p:06d}-*.parquet"):
                assert s.read_bytes() == (tmp_path / "cut" / s.name).read_bytes()


def test_a_failure_in_the_tail_tree_keeps_the_finished_partitions_for_resume(tmp_path, monkeypatch):
    """Every partition has finished when the tree runs; a fresh run's staging folder was removed
    on any `PacktoolError` (the rule for "a mistake the corrected command reruns"), so a failure
    in the root threw hours of partitions away with nothing to --resume. Now it is kept, the
    error says so, and --resume runs only the tree, to the same bytes."""
    corpus = _long_documents(tmp_path)
    run_pack(_tree_config(corpus, tmp_path / "whole"))
    out = tmp_path / "cut"

    def refused(*args, **kwargs):  # what the root raised at --max-len 2^24
        raise ConfigError("a chunk of 6040 tokens is too large for one Arrow table")

    with monkeypatch.context() as m:
        m.setattr(merge, "rechunk", refused)
        with pytest.raises(PacktoolError, match="too large for one Arrow table") as failed:
            run_pack(_tree_config(corpus, out))
    staging = staging_folder(out)
    message = str(failed.value)
    assert isinstance(failed.value, TailTreeFailed)
    assert (
        f"kept in {staging}" in message
        and "the same command with --resume / resume=True" in message
    )
    n = len(records.read_plan(staging)["plan"]["partitions"])
    assert records.finished_partitions(staging, n) == list(range(n))
    summary = run_pack(_tree_config(corpus, out, resume=True))
    assert summary.resumed_partitions == n
    for s in sorted((tmp_path / "whole").iterdir()):
        if s.suffix == ".parquet":
            assert s.read_bytes() == (out / s.name).read_bytes()
