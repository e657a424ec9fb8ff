"""Fixtures of the storage tests."""

from __future__ import annotations

import pytest

from packtool.storage import remote, s3_native
from tests.packtool.storage.common import PARTITION_SIZE, bucket_fs, packed_files


@pytest.fixture(params=["obstore", "s3fs"])
def s3_client(request, monkeypatch):
    """Each S3 client packtool reads and writes through (packtool/storage/s3_native.py says
    which it picks where): a test taking this fixture runs through each, its subprocesses too."""
    monkeypatch.setenv(s3_native.CLIENT_ENV, request.param)
    remote._filesystem.cache_clear()
    yield request.param
    remote._filesystem.cache_clear()


@pytest.fixture(scope="module")
def fs(s3_server, request):
    """The bucket (the test module's `BUCKET`) the datasets go to, and an s3fs client to look."""
    return bucket_fs(s3_server, request.module.BUCKET)


@pytest.fixture(scope="module")
def local_pack(tmp_path_factory, request) -> dict[str, bytes]:
    """What a local -> local pack of the corpus writes: every file's bytes by name (in the
    test module's `PARTITION_SIZE`, where it has one: its `pack_config`'s)."""
    size = getattr(request.module, "PARTITION_SIZE", PARTITION_SIZE)
    return packed_files(tmp_path_factory.mktemp("local") / "ds", size)
