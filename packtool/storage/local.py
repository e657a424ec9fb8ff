"""Finding input files on a local (POSIX) file system: files, folders and globs -> a file list.

Every stage that takes inputs by name expands them here: reading a corpus
(`packtool.read.corpus.expand_inputs`, the corpus suffixes) and the loader's online packing
(tokenized Parquet). Nothing that looks like an input is passed over in silence: a dangling
symlink, a pipe or a folder that cannot be listed is a one-line `DataError`.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from packtool.errors import DataError
from packtool.prefetch import map_ordered


def expand(
    inputs: Iterable[str | os.PathLike], suffixes: tuple[str, ...], described: str
) -> list[Path]:
    """Expand files, folders (recursively, names ending in `suffixes` only) and globs into a
    file list. Each input's matches are sorted; the inputs keep their order; duplicates (the
    same file by resolved path) are dropped. `described` names the suffixes in errors.

    Raises:
        DataError: an input matches no file, or names something that is not a regular file.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in inputs:
        text = os.fspath(raw)
        path = Path(text)
        if path.is_dir():
            matches = walk(path, suffixes)
            if not matches:
                raise DataError(f"{text}: folder has no corpus files (looked for {described})")
        elif path.is_file():
            matches = [path]
        elif os.path.lexists(path):
            raise DataError(not_a_file(path))
        elif glob.has_magic(text):
            matches = []
            for name in sorted(glob.glob(text, recursive=True)):
                p = Path(name)
                if p.is_file():
                    matches.append(p)
                elif not p.is_dir():
                    raise DataError(not_a_file(p))
            if not matches:
                raise DataError(f"{text}: glob matches no files")
        else:
            raise DataError(f"{text}: no such file or folder")
        for p, key in zip(matches, map_ordered(Path.resolve, matches), strict=True):
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def walk(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files under `folder` whose names end in `suffixes`, sorted; hidden names and symlinked folders are skipped.

    Nothing that looks like a corpus file is passed over in silence: an entry with a corpus
    suffix that is not a readable regular file (a dangling symlink, a named pipe) and a sub-folder
    that cannot be listed are errors.
    """

    def cannot_list(exc: OSError) -> None:
        raise DataError(f"{exc.filename}: cannot list folder ({exc.strerror or exc})")

    found = []
    for top, dirs, files in os.walk(folder, onerror=cannot_list):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        named = [
            Path(top) / name
            for name in files
            if not name.startswith(".") and name.lower().endswith(suffixes)
        ]
        # A stat per file, in parallel (on a mount a stat waits on latency), taken in order.
        for p, regular in zip(named, map_ordered(Path.is_file, named), strict=True):
            if regular:
                found.append(p)
            elif not p.is_dir():
                raise DataError(not_a_file(p))
    return sorted(found)


_KINDS = (
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def not_a_file(path: Path) -> str:
    """Why `path`, which exists as a name, is not an input packtool can read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
    except OSError as exc:
        return f"{path}: cannot be followed ({exc.strerror or exc})"
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return (
        f"{path}: {kind}, not a regular file; packtool reads an input more than once (to check "
        "it, to read it, to resume), so save the stream to a file first"
    )
