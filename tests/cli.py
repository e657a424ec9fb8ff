"""Run `packtool` exactly as the console script does, for tests of the CLI."""

from __future__ import annotations

import os

from click.testing import CliRunner

from packtool.cli.commands import main
from packtool.storage.remote import OPTIONS_ENV

NUMBA_EXTENSIONS_ENV = "PACKTOOL_NUMBA_EXTENSIONS"


def run(*args: object) -> tuple[int, str, str]:
    """Run `packtool ARGS` through `main()`; returns (exit code, stdout, stderr). The variable
    `--storage-options` sets for the run's worker processes, and `PACKTOOL_NUMBA_EXTENSIONS`
    (which `main()` sets for its own process where unset), are put back afterwards, as they are
    when a `packtool` process ends (else one test's run would change the next ones)."""
    runner = CliRunner()
    kept = {name: os.environ.get(name) for name in (OPTIONS_ENV, NUMBA_EXTENSIONS_ENV)}
    with runner.isolation(env=kept) as streams:
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    out, err = streams[0].getvalue().decode(), streams[1].getvalue().decode()
    return code, out, err


def one_error_line(err: str) -> str:
    """The single `error: ...` line a user mistake must produce (no traceback)."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


ENGINE_IGNORED = (
    "warning: the inputs are tokenized Parquet; nothing is encoded, so --tokenizer-engine / "
    "engine= is ignored"
)
"""The line `tokenize`, `stats` and `pack` warn with of a `--tokenizer-engine` over tokenized
Parquet, which nothing encodes (alone or beside `--tokenizer`): spelled out here, not imported,
so a change of wording fails a test."""


def error_line(err: str, args: list[object]) -> str:
    """`one_error_line`, after `ENGINE_IGNORED` where `args` name `--tokenizer-engine` (a run
    over tokenized Parquet warns of it before its error)."""
    if "--tokenizer-engine" in args:
        warning, _, err = err.partition("\n")
        assert warning == ENGINE_IGNORED, err
    return one_error_line(err)
