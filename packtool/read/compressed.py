"""Opening corpus files that may be gzip- or zstd-compressed, as one buffered byte stream.

The suffix decides (`COMPRESSIONS`): `*.gz` is gzip, `*.zst` is zstd, anything else is read as
it is. A file whose bytes are not what its name says (plain text or gzip named `.zst`) fails
while it is read; every
reader reads inside `read_errors(path)`, which turns each way that can go wrong into one
`DataError` naming the file, so no read path (the record-kind probe included) shows a traceback.
A stream that
ends in the middle (a truncated download, a full disk) raises `EOFError` instead of quietly
yielding what was there: `gzip` does that on its own; zstd's `stream_reader` does not (it returns
the frames it could decode and then ends), so zstd goes through `_ZstdReader`, which also reads
every frame of a multi-frame file (`zstd` of concatenated parts, `pzstd`).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import DataError
from packtool.storage import local as storage

BUFFER_BYTES = 1 << 20

COMPRESSIONS = {".gz": "gzip", ".zst": "zstd"}
"""The compressed suffixes `open_stream` decompresses, and what each is: the one list of them
(the formats' suffixes and the messages naming them are made from it)."""


def compressed_too(suffixes: tuple[str, ...]) -> tuple[str, ...]:
    """`suffixes`, each as it is and followed by each of `COMPRESSIONS`' suffixes."""
    return tuple(f"{s}{c}" for s in suffixes for c in ("", *COMPRESSIONS))


def compression_suffix(name: str) -> str:
    """The suffix of `COMPRESSIONS` that `name` ends in (any case), or ''."""
    name = name.lower()
    return next((s for s in COMPRESSIONS if name.endswith(s)), "")


def compression_of(path: str | Path) -> str | None:
    """`gzip`, `zstd` or None, from the file name (`storage.file_name`)."""
    return COMPRESSIONS.get(compression_suffix(storage.file_name(path)))


def byte_place(path: str | Path, offset: int) -> str:
    """`byte N`: `offset` in what `open_stream(path)` reads, said to be in the decompressed
    text where `path` is compressed (the file's own byte N is elsewhere; until 2026-12-07 a
    `.json.gz`'s bad byte was named as if it were the file's)."""
    return f"byte {offset}" + (" of the decompressed text" if compression_of(path) else "")


def open_stream(path: Path) -> io.BufferedIOBase:
    """Open `path` for reading bytes, decompressing `.gz` / `.zst` on the fly.

    Raises (while reading): `OSError` (`gzip.BadGzipFile`) for data that is not gzip,
    `zstandard.ZstdError` for data that is not zstd, `EOFError` for a truncated stream.
    """
    kind = compression_of(path)
    if kind == "gzip":
        return _GzipReader(storage.open_input(path))
    if kind == "zstd":
        return io.BufferedReader(_ZstdReader(path), buffer_size=BUFFER_BYTES)
    return storage.open_input(path, buffering=BUFFER_BYTES)  # noqa: SIM115 - the caller closes it


class _GzipReader(gzip.GzipFile):
    """`gzip.open` over a stream the storage seam opened: closing it closes that stream too
    (a `GzipFile` made from a file object leaves it open)."""

    def __init__(self, raw: Any) -> None:
        super().__init__(fileobj=raw, mode="rb")
        self._raw = raw

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._raw.close()


def zstd_error() -> type[BaseException]:
    """The exception zstandard raises for corrupt data."""
    import zstandard

    return zstandard.ZstdError


@contextlib.contextmanager
def read_errors(path: Path) -> Iterator[None]:
    """Turn what reading `path` can raise into one `DataError` naming it.

    An unreadable file or data that is not gzip (`OSError`, `gzip.BadGzipFile`), a stream that
    ends early (`EOFError`), gzip data damaged inside (`zlib.error`), data that is not zstd or
    is damaged (`zstandard.ZstdError`). Errors packtool
    already phrased (`DataError`, `ConfigError`) pass through unchanged.
    """
    try:
        yield
    except gzip.BadGzipFile as exc:  # an OSError: said first, with what the bytes are
        raise DataError(f"{path}: cannot read ({exc}){_what_it_is(path)}") from None
    except OSError as exc:
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except EOFError as exc:
        raise DataError(f"{path}: file is truncated ({exc})") from None
    except zlib.error as exc:  # gzip data damaged inside a block
        raise DataError(f"{path}: corrupt gzip stream ({exc})") from None
    except Exception as exc:
        if isinstance(exc, zstd_error()):
            raise DataError(f"{path}: corrupt zstd stream ({exc}){_what_it_is(path)}") from None
        raise


_RECOMPRESS = f"decompress it, or compress it as {' or '.join(COMPRESSIONS)}"
SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed data", "name it with .gz at the end (file.jsonl.gz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "name it with .zst at the end"),
    (b"PAR1", "Parquet", "name it with .parquet at the end"),
    (b"\xfd7zXZ\x00", "xz-compressed data", _RECOMPRESS),
    (b"BZh", "bzip2-compressed data", _RECOMPRESS),
    (b"\x04\x22\x4d\x18", "LZ4-compressed data", _RECOMPRESS),
    (b"PK\x03\x04", "a zip archive", "unpack it"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "unpack it"),
)
"""First bytes of the files packtool is handed under a wrong name: what they are, what to do."""


def binary_kind(data: bytes) -> tuple[str, str] | None:
    """(what, what to do) for bytes that start as one of `SIGNATURES`, else None."""
    for magic, kind, hint in SIGNATURES:
        if data.startswith(magic):
            return kind, hint
    return None


def _what_it_is(path: Path) -> str:
    """A hint for a file whose bytes are not what its name says: what its first bytes are."""
    try:
        with storage.open_input(path) as f:
            head = f.read(4096)
    except OSError:
        return ""
    if not head:
        return "; the file is empty"
    suffix = compression_suffix(storage.file_name(path))
    if not suffix:  # pragma: no cover - only a compressed stream's error asks
        return ""
    found = binary_kind(head)
    if found is not None:
        kind, hint = found
        return "" if kind.startswith(COMPRESSIONS[suffix]) else f"; the file holds {kind}: {hint}"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start < len(head) - 4:  # not a character cut at the end of the 4 KB
            return f"; the file is not {suffix} data, nor text"
    return f"; the file is not compressed: drop the {suffix} from its name"


class _ZstdReader(io.RawIOBase):
    """Decompresses every frame of a zstd file; `EOFError` when the file ends inside a frame."""

    def __init__(self, path: Path) -> None:
        import zstandard

        self._file = storage.open_input(path)  # noqa: SIM115 - closed in close()
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
