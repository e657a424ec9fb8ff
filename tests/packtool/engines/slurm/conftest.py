"""The local engine's datasets the Slurm runs of test_driver.py and test_arrays.py must equal
byte for byte: each packed once for the session (every test only reads them; tests/conftest.py
runs all the Slurm tests in one process, one after another)."""

from __future__ import annotations

import pytest

from packtool.engines.local import run_pack
from tests.packtool.engines.slurm.test_driver import _config, _small


@pytest.fixture(scope="session")
def local(tmp_path_factory):
    """`_config`'s dataset, packed by the local engine."""
    out = tmp_path_factory.mktemp("local") / "packed"
    run_pack(_config(out))
    return out


@pytest.fixture(scope="session")
def local_small(tmp_path_factory):
    """`_small`'s dataset (small chunks and row groups), packed by the local engine."""
    out = tmp_path_factory.mktemp("local-small") / "packed"
    run_pack(_small(out))
    return out
