"""The lines of a line-oriented file (JSON Lines), whole or one byte range of it.

A byte range `[start, end)` of a file **owns the lines that start inside it**: a line starts at
offset 0 or just after a `\\n`. So the ranges of a partition plan (packtool/engines/plan.py), cut
anywhere, hand every line of the file to exactly one range, without anyone having read the file
to find line boundaries: the reader of a range that starts inside a line skips to the next
`\\n`, and the last line of a range is read to its end even when that end lies past `end`.

Every line comes with the byte offset where it starts (the offset in the decompressed stream for a
`.gz` / `.zst` file, which is always read whole), which is what the document ids encode
(`packtool.read.docids`): the same document has the same id however the file is cut. A `\\r\\n` line
ending belongs to its line (JSON parsers treat the `\\r` as white space); a last line without a
final newline is a line; a UTF-8 byte order mark at offset 0 is not part of the first line's
data (its offset stays 0).

Line numbers are known only when reading starts at offset 0 (a whole file, or the first range of
one); `packtool inspect` counts them on demand from the offset (`line_number`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from packtool.errors import DataError
from packtool.read.compressed import BUFFER_BYTES, compression_of, open_stream
from packtool.storage import local as storage

BOM = b"\xef\xbb\xbf"
TO_END = -1
"""`end` for a range that runs to the end of the file."""


def lines(path: Path, start: int = 0, end: int = TO_END) -> Iterator[tuple[int, int | None, bytes]]:
    """(byte offset, line number or None, line with its ending) of each line starting in range.

    Args:
        path: the file; a compressed one only whole (`start == 0`, `end == TO_END`).
        start: first byte of the range.
        end: one past its last byte, or `TO_END`.

    Raises:
        ValueError: a range of a compressed file.
    """
    if start == 0 and end == TO_END:
        with open_stream(path) as f:
            yield from _numbered(f, 0, TO_END)
        return
    if compression_of(path) is not None:
        raise ValueError(f"{path}: a compressed file is read whole, not by byte range")
    with storage.open_input(path, BUFFER_BYTES, None if end == TO_END else end) as f:
        if start == 0:
            yield from _numbered(f, 0, end)
            return
        f.seek(range_start(start))
        pos = start
        if f.read(1) != b"\n":  # the line at `start` began before it: its owner reads it
            pos += len(f.readline())
        for line in f:
            if end != TO_END and pos >= end:
                return
            yield pos, None, line
            pos += len(line)


def range_start(start: int) -> int:
    """The first byte `lines` reads of the range that starts at `start`: the one before it (a
    range starts with the line that begins inside it, so it looks at the byte before), 0 for
    the file's first range."""
    return start - 1 if start > 0 else 0


def _numbered(f, pos: int, end: int) -> Iterator[tuple[int, int | None, bytes]]:
    for lineno, line in enumerate(f, 1):
        if end != TO_END and pos >= end:
            return
        n = len(line)
        if lineno == 1 and line.startswith(BOM):
            line = line[len(BOM) :]
        yield pos, lineno, line
        pos += n


def line_number(path: Path, offset: int) -> int:
    """The 1-based number of the line starting at byte `offset` (one scan up to it).

    Raises:
        DataError: no line starts there (the file ends before it, or it falls inside a line):
            the file is not the one the offset was taken in (a dataset's relative input path
            resolved from another folder named an unrelated file of that name).
    """
    number = line_numbers(path, [offset])[offset]
    if number is None:
        raise DataError(f"{path}: no line starts at byte {offset}")
    return number


def line_numbers(path: Path, offsets: Iterable[int]) -> dict[int, int | None]:
    """The 1-based number of the line starting at each byte of `offsets`, None where no line
    starts (inside a line, at or past the end): one scan of the file, up to the last offset
    (not one per offset: a row's documents after 40 MB of text read 40 MB each)."""
    wanted = sorted({int(o) for o in offsets})
    found: dict[int, int | None] = dict.fromkeys(wanted)
    counted = seen = 0
    last = b"\n"
    with open_stream(path) as f:
        for offset in wanted:
            while seen < offset:
                block = f.read(min(BUFFER_BYTES, offset - seen))
                if not block:
                    return found
                counted += block.count(b"\n")
                seen += len(block)
                last = block[-1:]
            byte = f.read(1)  # a line starts here only if the file has a byte here
            if not byte:
                return found
            if last == b"\n":
                found[offset] = counted + 1
            counted += byte == b"\n"
            seen += 1
            last = byte
    return found
