"""Fixtures of the storage tests."""

from __future__ import annotations

import pytest

from packtool.storage import remote, s3_native


@pytest.fixture(params=["obstore", "s3fs"])
def s3_client(request, monkeypatch):
    """Each S3 client packtool reads and writes through (packtool/storage/s3_native.py says
    which it picks where): a test taking this fixture runs through each, its subprocesses too."""
    monkeypatch.setenv(s3_native.CLIENT_ENV, request.param)
    remote._filesystem.cache_clear()
    yield request.param
    remote._filesystem.cache_clear()
