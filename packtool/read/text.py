"""Plain text: one document per file (`.txt`, `.md`, `.text`, also `.gz` / `.zst`).

A UTF-8 byte order mark at the start is not part of the document and is dropped; bytes that
are not UTF-8 make the file an `invalid_utf8` skip, an empty file an `empty` skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from packtool.errors import DataError
from packtool.read.compressed import open_stream, read_errors
from packtool.read.documents import Doc, ReadConfig, SkipCounter
from packtool.read.lines import BOM

TEXT_SUFFIXES = tuple(f"{s}{c}" for s in (".txt", ".md", ".text") for c in ("", ".gz", ".zst"))
"""One document per file; `.gz` / `.zst` are decompressed first."""


def read_text(path: Path, config: ReadConfig, skips: SkipCounter) -> Iterator[Doc]:
    """The file as one document (`Doc`), or nothing (a counted skip)."""
    with read_errors(path), open_stream(path) as f:
        data = f.read()
    nbytes = len(data)
    data = data.removeprefix(BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        found = binary_kind(data)
        if found is not None:  # a whole file of documents, not one bad document: never a skip
            kind, hint = found
            raise DataError(f"{path}: holds {kind}, not text; {hint}") from None
        skips.add("invalid_utf8", str(path), f"byte {exc.start}")
        return
    if not text:
        skips.add("empty", str(path))
        return
    yield text, (None,) * len(config.extra_fields), nbytes, 0


_SIGNATURES = (
    (b"\x1f\x8b", "gzip-compressed data", "name it with .gz at the end (file.jsonl.gz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed data", "name it with .zst at the end"),
    (b"PAR1", "Parquet", "name it with .parquet at the end"),
    (b"\xfd7zXZ\x00", "xz-compressed data", "decompress it, or compress it as .gz or .zst"),
    (b"BZh", "bzip2-compressed data", "decompress it, or compress it as .gz or .zst"),
    (b"\x04\x22\x4d\x18", "LZ4-compressed data", "decompress it, or compress it as .gz or .zst"),
    (b"PK\x03\x04", "a zip archive", "unpack it"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive", "unpack it"),
)


def binary_kind(data: bytes) -> tuple[str, str] | None:
    """(what, what to do) for bytes that start as a compressed file or archive that packtool
    does not read under this name, else None."""
    for magic, kind, hint in _SIGNATURES:
        if data.startswith(magic):
            return kind, hint
    return None
