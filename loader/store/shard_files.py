"""The open shard files of a local dataset: at most `limit` per process, least recently used closed.

`ShardStore` (shards.py) reads a local shard through `ShardFiles.get`: the file is
memory-mapped and its footer parsed when one of its row groups is first decoded, after checking
it is still the file the dataset opened (`footer` recorded its size and mtime), and kept open
for the next row group, whose read first checks the file is not shorter than its map (a cut in
place would be a SIGBUS). With `limit` open, opening one more first closes the least recently used
(its descriptor and memory map; reading it again opens it again), so a process holds a bounded number of
descriptors and mappings however many shards the dataset has (61 k at 10^9 rows).

Closing a shard never changes data already decoded from it: pyarrow decompresses and decodes a
row group into buffers of its own, and a buffer it does slice out of a memory map holds the
mapping until that buffer is freed (closing only releases the file's descriptor).
tests/loader/store/test_shard_files.py holds decoded rows across closes. Each `ShardFiles` is
used by one thread at a time (the store's decode thread, or the caller's before it starts one;
the row counts' files under their lock), so no file is closed while it is being read.

A process out of descriptors (EMFILE, ENFILE) is a `DataError` that names the limit
(`ulimit -n`), not one that calls the shard unreadable.
"""

from __future__ import annotations

import errno
from collections import OrderedDict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loader.store.bucket import dataset_gone
from loader.store.row_group import decode_with_jemalloc
from packtool.errors import DataError, one_line, open_file_limit
from packtool.storage import local as storage
from packtool.storage.local_files import open_size

OPEN_FILES = 64
"""Shard files one store keeps open per process (a descriptor, a memory map and a parsed footer,
~40 KB of memory, each). A shard is read only while one of its row groups is decoded: a shuffle
window's row groups (16 by default) and the 16 decoded ahead of use lie in at most 32 shards, so
64 keeps every shard a window reads open until the window is done, twice over. Later windows
draw their row groups from anywhere in the dataset, so past a few hundred shards almost every
decode opens its shard again whatever the bound; that costs ~0.6 ms (mostly parsing the footer
of a 64-row-group shard) against ~11 ms to decode its 1 M-token row group (random ids; less for
text). A mixture splits the bound over its sources (`open_files_share`)."""
STATS_FILES = 16
"""Shard files kept open for reading row counts (`ShardStore.row_stats`), besides `OPEN_FILES`."""


def open_files_share(sources: int, window: int) -> int:
    """The open files each of a mixture's `sources` stores keeps: its part of `OPEN_FILES`, but
    at least the `window` row groups it decodes at once (each may be in a shard of its own)."""
    return max(OPEN_FILES // max(sources, 1), window, 1)


def open_error(file: Any, exc: BaseException, what: str) -> DataError:
    """The error for `file` that failed to open with `exc`: `what` and `exc`, or, when the
    process or the system is out of file descriptors, which limit that is."""
    code = getattr(exc, "errno", None)
    if code not in (errno.EMFILE, errno.ENFILE):
        return DataError(f"{file}: {what} ({one_line(exc)})")
    if code == errno.ENFILE:
        return DataError(
            f"{file}: cannot open shard: too many open files on this machine (the system's "
            "limit, fs.file-max, is reached; ulimit -n does not help): close files or raise it"
        )
    return DataError(
        f"{file}: cannot open shard: too many open files in this process (ulimit -n is "
        f"{open_file_limit()}; the loader keeps at most {OPEN_FILES + STATS_FILES} shards of a dataset "
        "open): raise the limit (ulimit -n) or close files the process holds"
    )


class ShardFiles:
    """The local shards `names` opened for reading, at most `limit` at once (least recently used
    closed first).

    Args:
        folder: The dataset's folder (messages).
        names: Each shard's path as text, in manifest order.
        page_checksums: Check each page's CRC32 as it is decoded.
        limit: Most files kept open (at least 1).
        jemalloc: Decode into pyarrow's jemalloc pool (`decode_with_jemalloc`).
        opened: Each shard's (size, mtime_ns) when the dataset was opened, shared with another
            `ShardFiles` of the same dataset (default: a record of its own, which `footer` fills).
    """

    def __init__(
        self,
        folder: Any,
        names: list[str],
        page_checksums: bool,
        limit: int = OPEN_FILES,
        *,
        jemalloc: bool = True,
        opened: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.folder = folder
        self.names = names
        self.page_checksums = page_checksums
        self.limit = limit
        self.jemalloc = jemalloc
        self.opened: dict[str, tuple[int, int]] = {} if opened is None else opened
        """Each shard's (size, mtime_ns) when the dataset was opened (`footer`)."""
        self.open: OrderedDict[int, tuple[pq.ParquetFile, Any]] = OrderedDict()
        """The files open now, least recently used first: (reader, memory-mapped source)."""
        self.opens = 0
        """How many times this process opened a shard (tests, benchmarks)."""

    # Open files belong to one process: a worker (forked or spawned) starts with none.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "open": OrderedDict()}

    def forget(self) -> None:
        """Drop the files a fork inherited (this process's copies of their descriptors close as
        they are freed; the parent's stay open)."""
        self.open = OrderedDict()

    def footer(self, file: Any, info: Any) -> pq.FileMetaData:
        """Shard `file`'s footer, its size checked against the manifest's `info` and recorded
        with its mtime (`get` checks them again when it opens the shard)."""
        if not storage.is_file(file):
            raise DataError(f"{file}: shard listed in index.json is missing")
        st = storage.stat(file)
        if st.st_size != info.bytes:
            raise DataError(
                f"{file}: {st.st_size} bytes but index.json says {info.bytes}; "
                "the shard is truncated or was replaced"
            )
        self.opened[str(file)] = (st.st_size, st.st_mtime_ns)
        try:
            return storage.parquet_metadata(file)
        except (pa.ArrowException, OSError) as exc:
            raise open_error(file, exc, "not a readable Parquet file") from None

    def get(self, shard: int) -> pq.ParquetFile:
        """Shard `shard` opened for reading (kept open, up to `limit` files)."""
        got = self.open.get(shard)
        if got is not None:
            self._check_size(self.names[shard], got[1])
            self.open.move_to_end(shard)
            return got[0]
        while self.open and len(self.open) >= max(self.limit, 1):
            _, (reader, source) = self.open.popitem(last=False)
            source.close()  # its descriptor now; its mapping once no buffer uses it
            del reader, source  # a reader keeps a slice of the mapping after a read
        file = self.names[shard]
        source = self._mapped(file)
        try:
            pf = storage.parquet_file(source, page_checksum_verification=self.page_checksums)
            if self.jemalloc:
                decode_with_jemalloc(pf, source, self.page_checksums)
        except (pa.ArrowException, OSError) as exc:
            source.close()
            raise open_error(file, exc, "cannot open shard") from None
        self.open[shard] = (pf, source)
        self.opens += 1
        return pf

    def _check_size(self, file: str, source: Any) -> None:
        """Refuse to read on from `file`'s open map if the file is now shorter than the map (cut
        in place: a copy or rsync over it, a quota): reading a page past its new end would kill
        the process with SIGBUS. One fstat on the open descriptor per row group read (docs/loader.md,
        "Files and memory"). A cut during the read itself is not caught (that takes a SIGBUS handler)."""
        size = open_size(source)
        if size is not None and size < (was := self.opened[file][0]):
            raise DataError(
                f"{file}: the shard changed after the dataset was opened (size {was} -> {size} "
                "bytes, cut while open): replaced (--overwrite)? reopen the dataset"
            )

    def _mapped(self, file: str) -> Any:
        """`file` memory-mapped, if it is still the file the dataset opened (a process opens
        shards lazily: one replaced in between would hand another file's rows to the epoch's
        order, some delivered twice, others never)."""
        try:
            st = storage.stat(file)
        except FileNotFoundError:
            raise dataset_gone(file, self.folder) from None
        if (st.st_size, st.st_mtime_ns) != (was := self.opened[file]):
            raise DataError(
                f"{file}: the shard changed after the dataset was opened (size {was[0]} -> "
                f"{st.st_size} bytes, or its mtime): replaced (--overwrite)? reopen the dataset"
            )
        try:
            return storage.memory_map(file)
        except OSError as exc:
            raise open_error(file, exc, "cannot open shard") from None
