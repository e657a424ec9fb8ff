"""Local files opened for random access: what pyarrow opens by name, and the files packtool
holds open itself. One seam: a local path turned into an open file (or a name pyarrow can open).

- **pyarrow's opens by name**: `memory_map` (the loader's shards, tails), `parquet_file`,
  `parquet_schema`, `parquet_metadata` (local paths or opened files; `local.py` names them and
  hands a URL to `remote_read.py` instead), and `arrow_path`, which pyarrow's writers go
  through as well. pyarrow takes a path as UTF-8 text; a file name that is not UTF-8 (legal on Linux: `o\\xff`, which Python holds as
  the surrogate escape `o\\udcff`) raised UnicodeEncodeError from deep inside pyarrow (until
  2026-12-07 a 60-80 line traceback of `pack -o`, `tokenize -o`, `stats` of such a Parquet
  file). Such a file is opened here and pyarrow is given the open descriptor's name
  (`/proc/self/fd/N`, ASCII); every other name goes as it is, with no extra system call.
- **pyarrow's writes by name**: `parquet_writer`, `write_parquet` (`writing.py` re-exports
  them, with the rest of the write side); a failed one leaves no file it created, and a
  writer is never started on a file that holds data (pyarrow would empty it first).
- **Files held open**: `RandomFile` (reads at offsets of a file still growing, what
  `local.open_random` returns: the shard writer's running hash) and `open_size` (the size now
  of a file under an open memory map: the loader checks a shard was not cut shorter).

Records in: local paths (or opened files). Out: pyarrow files, schemas and footers, open files, Parquet writers.
May import: `remote` (`is_remote`) only; pyarrow on first use. (Not `remote_read`: it imports
`writing`, which imports this.)
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from typing import Any

from packtool.storage.remote import is_remote

_FD_FOLDERS = ("/proc/self/fd", "/dev/fd")
"""Where the open descriptors have names (Linux; macOS and the BSDs)."""


# --- names pyarrow can open --------------------------------------------------------------------


@contextlib.contextmanager
def arrow_path(path: Any, write: bool = False) -> Iterator[Any]:
    """`path` as pyarrow can open it while the block runs: itself, or, where its name is not
    UTF-8, this file opened here and named by its descriptor (`/proc/self/fd/N`; `write`:
    created or truncated, as pyarrow's writers open it). pyarrow opens the file again by that
    name, so the block must open it (a reader's or writer's constructor), not only keep the
    name. A missing file is `FileNotFoundError`, as pyarrow's own open says."""
    if not isinstance(path, (str, os.PathLike)) or is_remote(path) or _utf8(path):
        yield path
        return
    folder = next((f for f in _FD_FOLDERS if os.path.isdir(f)), None)
    if folder is None:  # pragma: no cover - no system this runs on lacks both
        yield path
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY | os.O_NONBLOCK
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        yield f"{folder}/{fd}"
    finally:
        os.close(fd)


def _utf8(path: str | os.PathLike) -> bool:
    name = os.fspath(path)
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# --- pyarrow's reads of a local file -----------------------------------------------------------


def memory_map(path: str | os.PathLike) -> Any:
    """`path` memory-mapped read-only as a `pyarrow.NativeFile`: random reads share the page
    cache across processes (the loader's workers)."""
    import pyarrow as pa

    with arrow_path(path) as name:
        return pa.memory_map(os.fspath(name), "r")


def parquet_file(source: Any, **options: Any) -> Any:
    """`pyarrow.parquet.ParquetFile(source, **options)`; `source` a local path or an opened
    file."""
    import pyarrow.parquet as pq

    with arrow_path(source) as name:
        return pq.ParquetFile(name, **options)


def parquet_schema(path: str | os.PathLike) -> Any:
    """The Arrow schema of a local Parquet file, from its footer."""
    import pyarrow.parquet as pq

    with arrow_path(path) as name:
        return pq.read_schema(name)


def parquet_metadata(path: str | os.PathLike) -> Any:
    """The footer metadata of a local Parquet file."""
    import pyarrow.parquet as pq

    with arrow_path(path) as name:
        return pq.read_metadata(name)


# --- pyarrow's writes to a local file ----------------------------------------------------------


def parquet_writer(path: str | os.PathLike, schema: Any, **options: Any) -> Any:
    """`pyarrow.parquet.ParquetWriter(path, schema, **options)` (a name that is not UTF-8:
    `arrow_path`). A writer that fails to start (an option or a schema refused after pyarrow
    created the file) leaves no file where there was none (the empty file stayed, at either
    name, until 2026-12-07); an empty one that was there is the caller's, left empty.

    A local file that holds data is refused (`FileExistsError`) before anything opens it:
    pyarrow truncates the file before it knows it can write, so a writer that failed to start
    left the old file empty (until 2026-12-07). No caller passes one: each writes a new
    temporary name it renames in when done, or a file it has just made empty (`tokenize -o
    x.parquet`'s staging file, a shard's second part, whose running hash opened it first)."""
    import pyarrow.parquet as pq

    created = not is_remote(path) and not os.path.lexists(path)
    if not created and not is_remote(path) and _holds_data(path):
        raise FileExistsError(
            errno.EEXIST,
            "holds data; a Parquet writer starts only on a new or empty file (it would empty "
            "this one first): write a new name and rename it in",
            path,
        )
    with arrow_path(path, write=True) as name:
        try:
            return pq.ParquetWriter(name, schema, **options)
        except BaseException:
            if created:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise


def _holds_data(path: str | os.PathLike) -> bool:
    """Whether `path` is a regular file with bytes in it (a link followed)."""
    try:
        st = os.stat(path)
    except OSError:  # a dangling link, a name it cannot look up: pyarrow's open says why
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def write_parquet(table: Any, path: str | os.PathLike, **options: Any) -> None:
    """`pyarrow.parquet.write_table(table, path, **options)` (a name that is not UTF-8:
    `arrow_path`); a failure leaves no file at `path`, as pyarrow's own removal does at a
    UTF-8 name (at `/proc/self/fd/N` it could not: the partial file stayed until 2026-12-07)."""
    import pyarrow.parquet as pq

    with arrow_path(path, write=True) as name:
        try:
            pq.write_table(table, name, **options)
        except Exception:
            if name is not path:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise


# --- files held open ---------------------------------------------------------------------------


def open_size(source: Any) -> int | None:
    """The size now of the file open as `source` (a `local.memory_map`): one `fstat` of its
    descriptor, no path lookup. None for a source with no descriptor (an object read whole)."""
    try:
        return os.fstat(source.fileno()).st_size
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return None


class RandomFile:
    """A file opened read-only for reads at offsets (`os.pread`), whose size is asked each time:
    the writer beside it may still be appending. The names are `pyarrow.RandomAccessFile`'s."""

    def __init__(self, path: str | os.PathLike) -> None:
        self._fd = os.open(path, os.O_RDONLY)

    def fileno(self) -> int:
        return self._fd

    def size(self) -> int:
        """The file's size now."""
        return os.fstat(self._fd).st_size

    def read_at(self, nbytes: int, offset: int) -> bytes:
        """Up to `nbytes` bytes from `offset` (fewer, or none, at the end)."""
        return os.pread(self._fd, nbytes, offset)

    def sync_data(self) -> None:
        """Flush the file's data to the disk (`fdatasync`; `fsync` where there is none, macOS)."""
        getattr(os, "fdatasync", os.fsync)(self._fd)

    def close(self) -> None:
        os.close(self._fd)
