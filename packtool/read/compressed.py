"""Opening corpus files that may be gzip- or zstd-compressed, as one buffered byte stream.

The suffix decides: `*.gz` is gzip, `*.zst` is zstd, anything else is read as it is. A stream that
ends in the middle (a truncated download, a full disk) raises `EOFError` instead of quietly
yielding what was there: `gzip` does that on its own; zstd's `stream_reader` does not (it returns
the frames it could decode and then ends), so zstd goes through `_ZstdReader`, which also reads
every frame of a multi-frame file (`zstd` of concatenated parts, `pzstd`).
"""

from __future__ import annotations

import gzip
import io
from pathlib import Path
from typing import Any

BUFFER_BYTES = 1 << 20


def compression_of(path: Path) -> str | None:
    """`gzip`, `zstd` or None, from the file name."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return "gzip"
    if name.endswith(".zst"):
        return "zstd"
    return None


def open_stream(path: Path) -> io.BufferedIOBase:
    """Open `path` for reading bytes, decompressing `.gz` / `.zst` on the fly.

    Raises (while reading): `OSError` (`gzip.BadGzipFile`) for data that is not gzip,
    `zstandard.ZstdError` for data that is not zstd, `EOFError` for a truncated stream.
    """
    kind = compression_of(path)
    if kind == "gzip":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if kind == "zstd":
        return io.BufferedReader(_ZstdReader(path), buffer_size=BUFFER_BYTES)
    return open(path, "rb", buffering=BUFFER_BYTES)  # noqa: SIM115 - the caller closes it


def zstd_error() -> type[BaseException]:
    """The exception zstandard raises for corrupt data."""
    import zstandard

    return zstandard.ZstdError


class _ZstdReader(io.RawIOBase):
    """Decompresses every frame of a zstd file; `EOFError` when the file ends inside a frame."""

    def __init__(self, path: Path) -> None:
        import zstandard

        self._file = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._dctx = zstandard.ZstdDecompressor()
        self._obj: Any = self._dctx.decompressobj()
        self._in_frame = False
        self._out = b""
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._pos == len(self._out):
            data = self._file.read(BUFFER_BYTES)
            if not data:
                if self._in_frame:
                    raise EOFError("zstd stream ends in the middle of a frame")
                return 0
            self._out, self._pos = self._decompress(data), 0
        n = min(len(buffer), len(self._out) - self._pos)
        buffer[:n] = self._out[self._pos : self._pos + n]
        self._pos += n
        return n

    def _decompress(self, data: bytes) -> bytes:
        parts = []
        while data:
            self._in_frame = True
            parts.append(self._obj.decompress(data))
            if not self._obj.eof:
                break
            # A frame ended; whatever follows it is the next frame.
            data = self._obj.unused_data
            self._obj = self._dctx.decompressobj()
            self._in_frame = False
        return b"".join(parts)

    def close(self) -> None:
        if not self.closed:
            self._file.close()
        super().close()
