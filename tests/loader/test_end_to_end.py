"""`packtool pack` on sample_data, then the loader: every token delivered once, per the contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from loader import PackedDataLoader, PackedDataset

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from packtool.cli.commands import cli

    out = tmp_path_factory.mktemp("e2e") / "packed"
    result = CliRunner().invoke(
        cli,
        [
            "pack",
            str(SAMPLE),
            "-o",
            str(out),
            "--max-len",
            "1024",
            "--shard-rows",
            "500",
            "--workers",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    return out


def test_packed_sample_data_streams_every_token_once(packed):
    from packtool.dataset.manifest import read_manifest

    manifest = read_manifest(packed)
    tokens, docs = 0, []
    for rank in range(2):
        ds = PackedDataset(packed, tokens_per_batch=8192, rank=rank, world_size=2, seed=1)
        for b in PackedDataLoader(ds, num_workers=2):
            real = b["doc_ids"] >= 0
            tokens += int(b["cu_seqlens"][int(real.sum())])  # real documents come first
            docs += b["doc_ids"][real].tolist()
            assert b["input_ids"].numel() <= 8192
            assert b["max_seqlen"] <= 1024
            labels, ids = b["labels"].numpy(), b["input_ids"].numpy()
            inside = labels != -100
            assert (labels[inside] == ids[1:][inside[:-1]]).all()
    assert tokens == manifest.num_tokens
    assert len(set(docs)) == manifest.counts["documents_packed"]
    assert np.all(np.asarray(docs) >= 0)
