"""The error hierarchy the CLI turns into one readable line and a non-zero exit code."""

from __future__ import annotations

import json
import os
import resource  # here, not when needed: importing it takes a file descriptor
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class PacktoolError(Exception):
    """Base class for every error a user can act on (no traceback is shown for these)."""


class ConfigError(PacktoolError, ValueError):
    """An option or argument has an invalid value; the message names it and the valid choices."""


class DataError(PacktoolError):
    """Input data is missing, unreadable or malformed; the message names the file (and line)."""


class StagingKept(DataError):
    """A failure that is no mistake in the command, so the run's staging folder stays with the
    work that finished, for `--resume` (`output_folder.discard_staging`); the message says so.
    Every other `PacktoolError` of a fresh run removes it: the corrected command is another
    run, which could not resume this one."""


class WorkersLost(StagingKept):
    """Partition workers (processes, Ray actors, nodes) died too often and the run stopped; not
    a mistake in the command, so the finished partitions stay for `--resume`."""


class TailTreeFailed(StagingKept):
    """The tail tree (its merge nodes or its root, packtool/engines/merge.py) failed: every
    partition had finished by then, hours of work on a large corpus, so they stay for
    `--resume`, which runs only the tree."""


class Detached(Exception):
    """A run that goes on elsewhere: its work was handed to a scheduler (`--engine slurm
    --no-wait`) and this process returns; the staging folder stays, and `--resume` finishes it.
    Not a failure: the CLI prints the message (job ids, the command that finishes) and exits 0."""

    def __init__(self, message: str, job_ids: list[str]) -> None:
        super().__init__(message)
        self.job_ids = job_ids


class AlreadyComplete(PacktoolError):
    """What was asked is already done: `--resume` of a dataset whose run finished. Not a failure:
    the CLI prints the message and exits 0 (a requeued scheduler job that always passes
    `--resume` then succeeds again); a library caller decides for itself."""

    def __init__(self, message: str, output: str) -> None:
        super().__init__(message)
        self.output = output


class MissingDependencyError(PacktoolError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""


@contextmanager
def naming(path: str | os.PathLike | object, note: str = "") -> Iterator[None]:
    """Give an `OSError` raised inside the name of the file being written (and `note`, what
    the file is for, after its reason).

    pyarrow's writers and Python's `write` / `fsync` report a full disk as "Error writing bytes
    to file ... No space left on device" or "[Errno 28] No space left on device", naming no file;
    the CLI prints `error: PATH: No space left on device` from the error this re-raises.
    """
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        why += f" ({note})" if note else ""
        # A URL's path (upath's S3Path, ...) is no os.PathLike: its str is the URL.
        name = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
        raise OSError(exc.errno, why, name) from None


def option_choice(flag: str, name: str, value: object) -> str:
    """A choice as both callers make it, for a message either may reach (the library's
    functions raise it to Python callers and to the CLI alike): the CLI's `FLAG VALUE` and the
    Python argument `NAME=VALUE`, `--tokenizer-engine auto / engine='auto'`, `--eos-id 3 /
    eos=3`; one of `PLACEHOLDERS` stands for what the user fills in, bare on both sides
    (`--tokenizer PATH / tokenizer=PATH`); True is a flag without a value (`--overwrite /
    overwrite=True`). A value the user gave is quoted for a shell on the CLI's side where it
    needs it (`--group-by 'my field' / group_by='my field'`), and kept as it is otherwise (a
    column named `URL` is no placeholder: `group_by='URL'`)."""
    if value is True:
        return f"{flag} / {name}=True"
    if isinstance(value, str) and value in PLACEHOLDERS:
        return f"{flag} {value} / {name}={value}"
    said = shlex.quote(value) if isinstance(value, str) else value
    return f"{flag} {said} / {name}={value!r}"


PLACEHOLDERS = frozenset({"N", "PATH", "FILE", "NAME", "PREFIX", "SPEC", "KIND"})
"""The words `option_choice` writes bare, as what the user fills in (`--max-len N /
max_len=N`); any other value is the user's own and written as such."""


OVERWRITE = option_choice("--overwrite", "overwrite", True)
"""`--overwrite / overwrite=True`: what a message that says to start over names (`run_pack`'s
`RunConfig`, `tokenize_corpus` and `tokenize_megatron` take `overwrite=` as the CLI does)."""

RESUME = option_choice("--resume", "resume", True)
"""`--resume / resume=True`, as `OVERWRITE`."""

STORAGE_OPTIONS = "--storage-options / PACKTOOL_STORAGE_OPTIONS"
"""What a message about a store's options names: the CLI's option and the variable it sets,
which the library reads (`storage.remote.OPTIONS_ENV`)."""


def one_line(value: object, limit: int | None = None) -> str:
    """`value`'s text (an exception's message) on one line: every run of whitespace, a library's
    newlines included (pyarrow's Thrift errors, Jinja's, orjson's), made one space, and cut to
    `limit` characters ending in "..." where one is given."""
    text = " ".join(str(value).split())
    if limit is None or len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def joined_lines(message: object) -> str:
    """`message` on one line, its lines (each stripped) joined by one space and the spaces
    inside a line kept: what the CLI prints, where a path may hold two spaces in a row
    (`one_line` would name another path)."""
    return " ".join(part.strip() for part in str(message).splitlines() if part.strip())


def first_line(exc: BaseException) -> str:
    """The first line of `exc`'s message, at most 300 characters, or its type's name where it
    has none: for a client library's errors, whose later lines are a request dump or a
    server's XML body (botocore, huggingface_hub). aiohttp's are its lines joined: it puts the
    cause on the second (`400, message:` / `Can not decode content-encoding: gzip`), which was
    dropped until 2026-12-06."""
    if type(exc).__module__.startswith("aiohttp"):
        joined = joined_lines(exc)
        return joined[:300] if joined else type(exc).__name__
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def open_file_limit() -> str:
    """This process's limit on open files (`ulimit -n`, the soft limit) as a message gives it:
    "1,024" or "unlimited". For the errors of a process out of descriptors, which read as a
    problem of the file they name without it."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft:,}"


def json_value(raw: str | bytes, **options: Any) -> Any:
    """`json.loads(raw, **options)`, where a value nested past Python's recursion limit is a
    `ValueError` ("nested too deeply") like any other unreadable JSON: json raises
    `RecursionError` for it (`[` * 1000 is 1 KB), which no reader of a damaged file catches.
    Every reader of a file a user or a crash can damage parses it through this one, and says
    what is wrong with the file in its own words (naming it) from the `ValueError`."""
    try:
        return json.loads(raw, **options)
    except RecursionError:
        raise ValueError("nested too deeply") from None
