"""`tests.cli.run` runs the CLI inside the test process: what `main()` sets in `os.environ`
and the SIGINT handler it installs for its own process must not outlive the run (else one
test's run changes the next ones)."""

from __future__ import annotations

import os
import signal

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


class _NoText:
    def __str__(self) -> str:
        raise RuntimeError("no text")


def test_main_that_fails_before_it_runs_leaves_the_sigint_handler_as_found():
    # `main()` installed the CLI's handler first, then read its arguments outside the `try`
    # that restores it: an argument that is no text left `on_sigint` behind.
    from packtool.cli.commands import main

    def mine(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with pytest.raises(RuntimeError, match="no text"):
            main([_NoText()])
        assert signal.getsignal(signal.SIGINT) is mine
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_run_leaves_the_sigint_handler_as_found():
    before = signal.getsignal(signal.SIGINT)
    code, _, _ = run("--help")
    assert code == 0
    assert signal.getsignal(signal.SIGINT) is before
