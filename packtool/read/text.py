"""Plain text: one document per file (`.txt`, `.md`, `.text`, also `.gz` / `.zst`).

A UTF-8 byte order mark at the start is not part of the document and is dropped; bytes that
are not UTF-8 make the file an `invalid_utf8` skip, an empty file an `empty` skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from packtool.errors import DataError
from packtool.read.compressed import (
    binary_kind,
    byte_place,
    compressed_too,
    open_stream,
    read_errors,
)
from packtool.read.documents import Doc, ReadConfig, SkipCounter
from packtool.read.lines import BOM

TEXT_SUFFIXES = compressed_too((".txt", ".md", ".text"))
"""One document per file; `.gz` / `.zst` are decompressed first."""


def read_text(path: Path, config: ReadConfig, skips: SkipCounter) -> Iterator[Doc]:
    """The file as one document (`Doc`), or nothing (a counted skip)."""
    with read_errors(path), open_stream(path) as f:
        data = f.read()
    nbytes = len(data)
    bom = len(BOM) if data.startswith(BOM) else 0
    data = data[bom:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        found = binary_kind(data)
        if found is not None:  # a whole file of documents, not one bad document: never a skip
            kind, hint = found
            raise DataError(f"{path}: holds {kind}, not text; {hint}") from None
        # the file's byte, or the decompressed text's
        skips.add("invalid_utf8", str(path), byte_place(path, exc.start + bom))
        return
    if not text:
        skips.add("empty", str(path))
        return
    yield text, (None,) * len(config.extra_fields), nbytes, 0
