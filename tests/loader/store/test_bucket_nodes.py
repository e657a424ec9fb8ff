"""Training from a bucket on several nodes: with `nodes=N` each node's cache downloads about its
share of the dataset, not all of it (loader/order/nodes.py), against a real S3 API server on
loopback (moto's server mode, the `s3_server` fixture)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loader import PackedDataset

KW = {"rows_per_batch": 4, "seed": 2, "shuffle_window": 2}  # ~45 windows of 2 row groups


def _two_nodes(path, caches: Path | None, nodes: int, **kw) -> tuple[list[list[int]], list[int]]:
    """One epoch of 2 nodes x 2 ranks, each node with a cache folder of its own: every rank's
    batches (doc ids), and the bytes each node downloaded."""
    batches, downloaded = [], [0, 0]
    for rank in range(4):
        cache = None if caches is None else str(caches / f"node{rank // 2}")
        ds = PackedDataset(
            path, rank=rank, world_size=4, nodes=nodes, cache_dir=cache, **{**KW, **kw}
        )
        batches += [b["doc_ids"].tolist() for b in ds]
        downloaded[rank // 2] += ds.store.downloaded_bytes
    return batches, downloaded


@pytest.mark.parametrize("kw", [{}, {"static_shape": True}, {"balance": True}])
def test_each_node_downloads_about_its_share_with_nodes(datasets, tmp_path, kw):
    # static_shape reads every row group's document counts at open: their chunks alone
    # (loader/store/bucket.py), not the whole dataset on every node (1.01x a node before).
    local, url = datasets
    size = sum(s.bytes for s in PackedDataset(local, **KW).store.manifest.shards)
    got, dealt = _two_nodes(url, tmp_path / "dealt", nodes=2, **kw)
    want, _ = _two_nodes(local, None, nodes=2, **kw)
    assert got == want  # the bucket's batches are the local dataset's
    _, plain = _two_nodes(url, tmp_path / "plain", nodes=1, **kw)
    # Without nodes every node downloads (nearly) the whole dataset; with them about half
    # (footers, and the rows of the streams' tail, read by any node, on top).
    assert all(d >= 0.9 * size for d in plain), (plain, size)
    assert all(0.3 * size <= d <= 0.7 * size for d in dealt), (dealt, size)
