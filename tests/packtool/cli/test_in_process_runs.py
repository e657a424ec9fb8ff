"""`tests.cli.run` runs the CLI inside the test process: what `main()` sets in `os.environ`
for its own process must not outlive the run (else one test's run changes the next ones)."""

from __future__ import annotations

import os

import pytest

from tests.cli import NUMBA_EXTENSIONS_ENV, run


def test_a_run_leaves_an_unset_numba_extensions_variable_unset(monkeypatch):
    monkeypatch.delenv(NUMBA_EXTENSIONS_ENV, raising=False)
    code, _, _ = run("--help")
    assert code == 0
    assert NUMBA_EXTENSIONS_ENV not in os.environ


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_run_leaves_a_set_numba_extensions_variable_as_it_was(monkeypatch, value):
    monkeypatch.setenv(NUMBA_EXTENSIONS_ENV, value)
    code, _, _ = run("--help")
    assert code == 0
    assert os.environ[NUMBA_EXTENSIONS_ENV] == value
