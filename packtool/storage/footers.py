"""A Parquet file's identity by content, cheaply: a hash of its size and its footer bytes.

The footer (the file metadata: schema and key-value metadata, every row group's row count,
column chunk offsets, byte sizes and statistics) is what a reader reads first anyway; hashing it
costs one ranged read of the file's last `TAIL` bytes (a footer longer than that: a second read
for the rest), for a local file and an object in a bucket alike (`local.read_range`). Unlike a
path and a modification time, it is the same for a byte-identical copy wherever it lies and
whenever it was written (data staged again to node-local disk for each job), and unlike a name
and a size it differs for a file written again with other documents (other row counts, byte
sizes or statistics). It is no checksum of the data: a rewrite that leaves every byte of the
footer as it was (tokens changed within the same min/max, in pages of the same sizes) is not
seen; what the data holds is checked where it is read (page checksums, `packtool verify`).

Records in: paths (local or URLs) and their sizes. Out: hex digests, one per file, in order.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from packtool.errors import DataError
from packtool.prefetch import map_ordered
from packtool.storage import local

TAIL = 64 << 10
"""Bytes read from a file's end at first: pyarrow's own first footer read (its
`footer_read_size`), which holds the footer of a file of a few hundred row groups."""
MAGIC = (b"PAR1", b"PARE")
"""A Parquet file's last four bytes (PARE: an encrypted footer, hashed as it is stored)."""


def footer_digest(path: str | os.PathLike, size: int) -> str:
    """The sha256 (32 hex digits) of a Parquet file's `size` and its footer's bytes (the
    footer, its length and the magic number). `DataError` naming the file for one that is
    not Parquet, cut short, or unreadable."""
    try:
        if size < 12:
            raise DataError(f"{path}: {size} bytes, too short to be a Parquet file")
        tail = local.read_range(path, max(0, size - TAIL), size)
        if len(tail) != min(size, TAIL):
            raise DataError(f"{path}: shorter than its {size:,} bytes; was it cut while read?")
        if tail[-4:] not in MAGIC:
            raise DataError(f"{path}: not a Parquet file (no footer magic at its end)")
        n = int.from_bytes(tail[-8:-4], "little") + 8
        if n > size - 4:
            raise DataError(f"{path}: damaged Parquet footer (length {n - 8:,} in {size:,} bytes)")
        if n > len(tail):
            tail = local.read_range(path, size - n, size - len(tail)) + tail
    except OSError as exc:
        raise DataError(f"{path}: cannot read its Parquet footer ({exc})") from None
    h = hashlib.sha256(f"{size}:".encode())
    h.update(tail[-n:])
    return h.hexdigest()[:32]


def footer_digests(paths: Sequence[Any], sizes: Sequence[int]) -> Iterator[str]:
    """`footer_digest` of every file, in order (`map_ordered`: reads of objects in a bucket,
    or on a mount, wait on latency, so they run `prefetch.io_threads()` at a time; a bounded
    number of results held at once, whatever the number of files)."""
    pairs = list(zip(paths, sizes, strict=True))
    with contextlib.closing(map_ordered(lambda ps: footer_digest(*ps), pairs)) as it:
        yield from it
