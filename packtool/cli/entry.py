"""The `packtool` console script: Ctrl-C while the command line is still loading is one line.

Importing the commands takes ~0.6 s (click, the storage layer, pyarrow's loader); a Ctrl-C
then printed a KeyboardInterrupt traceback, since `commands.main` installs its handler only
once it is imported (or the import machinery swallowed the KeyboardInterrupt, "Exception
ignored in ... _get_module_lock", and the command ran on to exit 0). This module imports
nothing heavy, and installs a handler of its own first: until `commands.main` installs the
CLI's, a Ctrl-C is `interrupted` and exit code 130 at once (nothing is written before then).

It also opens the null device on a standard descriptor the shell closed (`>&-`), so that no
file of the run takes its number (`writing.hold_standard_descriptors`); the command still sees
stdout closed and says so (`exits.echo`).

Records in: argv (through `commands.main`). Out: the exit code.
May import: `cli/commands.py` and `storage/writing.py`, once called.
"""

from __future__ import annotations

import contextlib
import os
import signal


def main() -> None:
    """Console-script entry point: `commands.main` once it is imported."""
    with contextlib.suppress(ValueError):  # not the main thread: the program's handler stays
        signal.signal(signal.SIGINT, _interrupted)
    from packtool.storage import writing

    writing.hold_standard_descriptors()  # stdout closed: no file of the run takes its number
    from packtool.cli.commands import main as run

    run()


def _interrupted(signum: int, frame: object) -> None:
    """Out now, with one line (`os._exit`: an import cut short may leave locks held)."""
    start = b"\n" if os.isatty(2) else b""  # a terminal's `^C` line ended first, as later on
    with contextlib.suppress(OSError):  # stderr closed: the exit code says it
        os.write(2, start + b"interrupted\n")
    os._exit(130)
