"""packtool/errors.py: the errors the CLI prints in one line."""

from __future__ import annotations

import errno

import pytest

from packtool.errors import naming
from packtool.storage import local as storage


@pytest.mark.parametrize("where", ["local", "s3"])
def test_naming_names_a_local_path_or_a_url(tmp_path, where):
    # A full scratch disk under `tokenize -o s3://...` raised ENOSPC inside naming(S3Path): its
    # os.fspath() raised TypeError (an S3Path is no os.PathLike), a 60-line traceback.
    path = tmp_path / "part.parquet" if where == "local" else storage.as_path("s3://b/p/x")
    with pytest.raises(OSError) as raised, naming(path):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == str(path)
