"""Local files held open: reads at offsets of a file still growing (`RandomFile`, what
`local.open_random` returns) and the size now of a file under an open memory map (`open_size`).
Apart from local.py for its size alone."""

from __future__ import annotations

import os
from typing import Any


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
