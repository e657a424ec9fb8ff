"""Fixtures of the bucket loader's tests: the sample corpus packed locally and into a bucket on
moto's S3 server (the `s3_server` fixture, tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from packtool.dataset.shards import ShardConfig
from packtool.engines.local import RunConfig, run_pack
from packtool.pack.chunk import PackConfig

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


@pytest.fixture(scope="session")
def datasets(s3_server, tmp_path_factory):
    """The sample corpus packed (row groups of 32 rows: ~90 of them) into a local folder and
    into `s3://train/ds`: read only, shared by the bucket loader's test modules."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="train")
    local = tmp_path_factory.mktemp("train") / "ds"
    for out in (local, "s3://train/ds"):
        run_pack(
            RunConfig(
                inputs=(str(CORPUS),),
                out_dir=str(out),
                pack=PackConfig(max_len=1024),
                shards=ShardConfig(row_group_rows=32),
                progress=False,
            )  # fmt: skip
        )
    return local, "s3://train/ds"
