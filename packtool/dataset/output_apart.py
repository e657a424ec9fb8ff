"""Outputs and inputs kept apart: an output may not be an input, lie inside an input folder,
hold an input, or be (or hold) the current folder (`check_apart`), for local paths and URLs
alike. Every command that writes a dataset asks before it reads anything.

Records in: the output and the inputs as given (and what they expand to, when known). Out:
nothing, or a `ConfigError` naming both paths.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from pathlib import Path

from packtool.errors import ConfigError
from packtool.prefetch import map_ordered
from packtool.storage import local as storage
from packtool.storage.remote import location

OUTPUT_NAMES = ("shard-00000.parquet", "part-00000.parquet", "index.json")
"""Names `pack` and `tokenize` write inside an output folder (for the glob check)."""


def check_apart(
    out: str | os.PathLike, inputs: list[str] | tuple[str, ...], files: list[Path] = ()
) -> None:
    """Refuse an output that is an input, lies inside an input folder, holds an input, or is
    (or holds) the current folder.

    Args:
        out: the output as given.
        inputs: the inputs as given (files, folders, globs).
        files: what the inputs expand to, when known (catches a glob reaching into the output).

    Raises:
        ConfigError: naming both paths.
    """
    if not str(out).strip():
        raise ConfigError("the output path is empty; name the folder or file to write")
    if storage.is_remote(out):
        key = str(out).split("://", 1)[1].partition("/")[2]
        if key.startswith("/") or "//" in key:
            # stores normalise such keys differently (obstore drops the empty segment, s3fs
            # keeps it): a dataset written by one would not be found by the other
            raise ConfigError(f"output {out}: the key has an empty segment ('//'); remove it")
        _check_apart_remote(out, inputs, files)
        return
    target = storage.resolve(out)
    cwd = storage.cwd()
    if target == cwd or target in cwd.parents:
        # The swap would leave this shell in a deleted folder (the old output).
        raise ConfigError(
            f"output {out} is the current folder or holds it; packtool replaces the output "
            "folder whole, so run it from outside (e.g. `cd ..`)"
        )
    for raw in inputs:
        text = raw if isinstance(raw, str) else os.fspath(raw)
        if storage.is_remote(text):
            continue  # an object in a store is never inside a local output (nor the reverse)
        if glob.has_magic(text):
            # A recursive glob reaches every folder under its fixed part; it would read the
            # output back if its last part matches a name packtool writes there.
            parts = Path(text).parts
            fixed = storage.resolve(Path(*[p for p in parts[: _first_magic(parts)]] or ["."]))
            names = (*OUTPUT_NAMES, target.name)
            reaches = fixed == target or fixed in target.parents
            if "**" in parts and reaches and any(fnmatch.fnmatch(n, parts[-1]) for n in names):
                raise ConfigError(
                    f"output {out} is inside the folder the input glob {text!r} searches: a later "
                    "run would read its own output; choose an output outside it"
                )
            continue
        path = storage.resolve(text)
        if path == target:
            raise ConfigError(f"output {out} is also an input ({text}); choose another output")
        if path in target.parents and storage.is_file(path):
            raise ConfigError(
                f"output {out}: {text} is a file, so no output can be made under it; choose "
                "another output"
            )
        if path in target.parents:
            raise ConfigError(
                f"output {out} is inside the input folder {text}: a later run would read its "
                f"own output; choose an output outside {text}"
            )
        if target in path.parents:
            raise ConfigError(
                f"input {text} is inside the output {out}, which this run replaces; "
                "choose another output"
            )
    files = [f for f in files if not storage.is_remote(f)]
    for f, resolved in zip(files, map_ordered(storage.resolve, files), strict=True):
        if resolved == target:  # a glob's file (the output given as itself is refused above)
            raise ConfigError(f"output {out} is also an input ({f}); choose another output")
        if target in resolved.parents:
            raise ConfigError(
                f"input {f} is inside the output {out}, which this run replaces; "
                "choose another output"
            )


def _check_apart_remote(
    out: str | os.PathLike, inputs: list[str] | tuple[str, ...], files: list[Path]
) -> None:
    """`check_apart` for a remote output: the same refusals on the places the URLs name
    (`remote.location`: `abfs://c/x` is `az://c/x`, as `s3a://` is `s3://`; until 2026-12-06
    their text was compared, and an output under an input's other spelling was written)."""
    target = location(out).rstrip("/") + "/"
    for raw in [*map(str, inputs), *map(str, files)]:
        if not storage.is_remote(raw):
            continue
        text = location(raw).rstrip("/") + "/"
        fixed = text[: min((text.find(c) for c in "*?[" if c in text), default=len(text))]
        fixed = fixed[: fixed.rfind("/") + 1]
        if text == target:
            raise ConfigError(f"output {out} is also an input ({raw}); choose another output")
        if target.startswith(fixed):
            raise ConfigError(
                f"output {out} is inside the input {raw}: a later run would read its own "
                "output; choose an output outside it"
            )
        if text.startswith(target):
            raise ConfigError(
                f"input {raw} is inside the output {out}, which this run replaces; "
                "choose another output"
            )


def _first_magic(parts: tuple[str, ...]) -> int:
    return next(i for i, p in enumerate(parts) if glob.has_magic(p))
