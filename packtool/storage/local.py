"""The local (POSIX) file system: finding inputs, and every read packtool and the loader make.

- **Finding inputs**: `expand` turns files, folders and globs into a file list (reading a corpus,
  `packtool.read.corpus.expand_inputs`; the loader's online packing). Nothing that looks like an
  input is passed over in silence: a dangling symlink, a pipe or a folder that cannot be listed
  is a one-line `DataError`.
- **Reading**: `open_input` (a byte stream), `read_bytes` / `read_text` (small files: manifests,
  records, tokenizer files), `memory_map` (random access shared through the page cache: shards),
  `parquet_file` / `parquet_schema` / `parquet_metadata` (Parquet, by path or opened source).
  Each is the call packtool made before, unchanged; no other module opens a file to read it
  (tests/test_architecture.py checks), so another backend (object storage) plugs in here.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import Any, BinaryIO

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


# --- reading -----------------------------------------------------------------------------------


def open_input(path: str | os.PathLike, buffering: int = -1) -> BinaryIO:
    """`path` opened for reading bytes (the caller closes it)."""
    return open(path, "rb", buffering=buffering)  # noqa: SIM115 - the caller closes it


def read_bytes(path: str | os.PathLike) -> bytes:
    """The whole of a small file."""
    return Path(path).read_bytes()


def read_text(path: str | os.PathLike) -> str:
    """The whole of a small UTF-8 text file (`UnicodeDecodeError` for other bytes)."""
    return Path(path).read_text(encoding="utf-8")


def memory_map(path: str | os.PathLike) -> Any:
    """`path` memory-mapped read-only as a `pyarrow.NativeFile`: random reads share the page
    cache across processes (the loader's workers)."""
    import pyarrow as pa

    return pa.memory_map(os.fspath(path), "r")


def parquet_file(source: Any, **options: Any) -> Any:
    """`pyarrow.parquet.ParquetFile(source, **options)`; `source` a path or an opened file."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(source, **options)


def parquet_schema(path: str | os.PathLike) -> Any:
    """The Arrow schema of a Parquet file, from its footer."""
    import pyarrow.parquet as pq

    return pq.read_schema(path)


def parquet_metadata(path: str | os.PathLike) -> Any:
    """The footer metadata of a Parquet file."""
    import pyarrow.parquet as pq

    return pq.read_metadata(path)
