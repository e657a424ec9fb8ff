"""The form of a file of the node's range cache: a range's bytes, then a CRC32 of each `BLOCK`
of them and `MAGIC` (the trailer), checked block by block before any byte is handed on.

packtool/storage/cache.py writes each downloaded range this way (`trailer`) and maps a cached
one through `checked_map`, which checks the size, the magic and the CRC32s of the blocks a
reader is about to read: a reader of one column of a row group checks that column's blocks,
not the whole range. A file of another form (cut short, extended, damaged, or written by an
older packtool) fails, and the cache downloads the range again.

The CRC32s are zlib's; python-isal's ISA-L computes them where it is installed (the remote
extras install it: 10-13 GB/s on 16 KiB blocks against zlib's 3-4 here, `python -m
benchmarks.bench_crc`), so a cache written with either reads with the other.

Records in: a range's bytes (to write), or a cached file and the part of it to check. Out: its
trailer, or its bytes mapped read-only.
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path
from typing import Any

try:
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover  (the same values, slower)
    _crc32 = zlib.crc32

MAGIC = b"PTc2"
"""The last bytes of a cached file. `PTc1` (until 2026-12-07): one CRC32 of the whole range,
which a reader of one column of a row group checked whole; such files are downloaded again."""
BLOCK = 16 << 10
"""The bytes each CRC32 of a cached file's trailer covers (the last block may be shorter). A
reader of a row group's small `doc_offsets` chunk (every process of a node reads it for every
row group an epoch plans) checks one or two blocks; the decode of a ~1 MB row group (once per
node) makes 64 `zlib.crc32` calls. Measured 2026-12-07 (180 MB bench corpus, 161 row groups,
warm cache, one process): every row group's row counts took 173 ms of CPU with one CRC32 of
the whole range, 101 ms with 64 KiB blocks, 88-92 ms with 16 KiB ones (from disk: 38-61 ms);
`python -m benchmarks.bench_bucket_loader` measures the last two (its row counts row)."""


def trailer_size(n: int) -> int:
    """Bytes after a cached range of `n` bytes: a CRC32 (little-endian) of each `BLOCK`, then
    `MAGIC`."""
    return 4 * -(-n // BLOCK) + len(MAGIC)


TRAILER = trailer_size(1)
"""The trailer of a range of at most `BLOCK` bytes (one CRC32 and `MAGIC`)."""

EMPTY: Any = object()
"""`checked_map`'s answer for a check of no bytes that passes (nothing to map)."""


def trailer(piece: memoryview) -> bytes:
    """What follows a range's bytes `piece` in its cached file."""
    return _crcs(piece) + MAGIC


def _crcs(piece: memoryview) -> bytes:
    """The CRC32 (little-endian) of each `BLOCK` of `piece`."""
    return b"".join(
        _crc32(piece[i : i + BLOCK]).to_bytes(4, "little") for i in range(0, len(piece), BLOCK)
    )


def checked_map(path: Path, st: os.stat_result, n: int, check: tuple[int, int]) -> Any:
    """The file at `path` (the one `st` is of) mapped, when it holds `n` bytes and a trailer
    (`trailer_size`) whose CRC32s the blocks of bytes `check` (`a`, `b`: offsets in the range)
    match (`EMPTY` where `check` holds no byte: nothing to map); None for a damaged or
    unfinished copy (also one of an older trailer: it is downloaded again), or one replaced
    since. Mapped through a descriptor of its own, never locked: a mapping keeps a copy of its
    descriptor, which a forked child would inherit, and with it a lock."""
    size = n + trailer_size(n)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        mine = os.fstat(fd)
        if (mine.st_ino, mine.st_dev) != (st.st_ino, st.st_dev) or mine.st_size != size:
            return None
        mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    view = memoryview(mapped)
    a, b = check
    first, last = (a // BLOCK, -(-b // BLOCK)) if a < b else (0, 0)  # the blocks it touches
    ok = view[size - len(MAGIC) :] == MAGIC and _crcs(
        view[first * BLOCK : min(last * BLOCK, n)]
    ) == bytes(view[n + 4 * first : n + 4 * last])
    view.release()
    if ok and a < b:
        return mapped
    mapped.close()
    return EMPTY if ok else None
