"""Row groups of a dataset in a bucket (`s3://...`), read through the node's cache.

`ShardStore` hands every read of a remote dataset here: a row group's byte range of its shard
(from its first column chunk's first page to its last chunk's end, `byte_range`) is fetched by
one ranged GET into the node-local cache (packtool/storage/cache.py: downloaded once per node,
shared by every worker and rank, never evicted while read, bounded by `cache_limit`), then
decoded from there with the shard's footer, which the store read at open (so no footer is
fetched again). `fetch_ahead` downloads the ranges of the row groups the epoch order asks for
next on `FETCH_THREADS` threads per process, while the decode thread works on earlier ones;
row groups it is asked for together that lie side by side in a shard come in one GET (up to
16 MB: `RangeCache.fetch_many`), each still cached on its own. A read of a row group's counts
alone (its `doc_offsets` chunk) downloads that chunk only, where the whole range is neither
cached nor being fetched ahead (`BucketRowGroups.read`).

Pages are checked as they are decoded (their CRC32, `page_checksums`), as for a local
dataset; a range that fails (a damaged download or cache file) is deleted and fetched once
more, then the shard's footer too (a cached one can be another shard's and pass its CRC32),
before it is a `DataError`.

Records in: the store's manifest and shard footers, a global row group number. Out: the row
group as a `pyarrow.Table` of the asked columns.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loader.store.row_group import decode_with_jemalloc
from packtool.dataset.manifest import INDEX_FILE, Manifest
from packtool.errors import DataError, one_line
from packtool.storage import local as storage
from packtool.storage.cache import MERGED_BYTES, MERGED_RANGES, RangeCache

CACHE_LIMIT = 64 << 30
"""Default bound on a node's cache of a bucket's row groups (`cache_limit`)."""
FETCH_THREADS = 4
"""Downloads of a bucket's row groups each process runs at once, ahead of the decode."""
FOOTER_BYTES = 64 << 10
"""The end of a shard read (and cached) at open: its footer, in one GET where it fits."""
COUNTS = "doc_offsets"
"""The column a read of a row group's counts asks for alone (`ShardStore.row_stats`)."""


def dataset_gone(shard: Any, folder: Any) -> DataError:
    """The error for a shard that is gone since the dataset was opened (local or in a bucket):
    an `--overwrite` (or a delete) replaced the dataset under a job reading it. A local job
    keeps the shards its processes opened, a bucket job the ranges in its cache; the others
    went with the old dataset."""
    return DataError(
        f"{shard}: gone: the dataset {folder} was replaced (--overwrite) or deleted since this "
        "job opened it; reopen it to read the new one (a loader's state resumes only on the "
        "data it was saved on)"
    )


def byte_range(meta: pq.FileMetaData, g: int, columns: list[str] | None = None) -> tuple[int, int]:
    """The bytes of row group `g` in its file: from its first column chunk's first page
    (dictionary or data) to its last chunk's end; with `columns` (top-level names), of those
    columns' chunks only (a column between them, unread, is inside), or all of them where the
    row group has no chunk of these."""
    rg = meta.row_group(g)
    spans = []
    for c in range(rg.num_columns):
        col = rg.column(c)
        if columns is None or col.path_in_schema.split(".", 1)[0] in columns:
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                start = min(start, col.dictionary_page_offset)
            spans.append((start, start + col.total_compressed_size))
    if not spans:
        return byte_range(meta, g)
    return min(a for a, _ in spans), max(b for _, b in spans)


class BucketRowGroups:
    """Reads row groups of the dataset at `folder` (a URL) through the node's `RangeCache`."""

    def __init__(
        self,
        folder: Any,
        manifest: Manifest,
        cache_dir: str | os.PathLike | None,
        cache_limit: int,
        page_checksums: bool,
    ) -> None:
        self.folder = folder
        self.manifest = manifest
        base = str(folder).rstrip("/")
        self.urls = [f"{base}/{s.file}" for s in manifest.shards]
        """Each shard's URL (strings: a `UPath` join costs ~0.1 ms, per row group read)."""
        self.cache = RangeCache(cache_dir, cache_limit)
        self.page_checksums = page_checksums
        self.metas: list[pq.FileMetaData] = []
        self._footer_starts: dict[int, int] = {}
        """Where the cached range each shard's footer was read from starts."""
        self._spans: list[tuple[int, int]] = []
        self._pid = os.getpid()
        self._fetcher: ThreadPoolExecutor | None = None
        self._fetching: dict[int, Future] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": -1, "_fetcher": None, "_fetching": {}}

    def footer(self, shard: int) -> pq.FileMetaData:
        """Shard `shard`'s footer, from its last `FOOTER_BYTES` cached as a range (one GET the
        first time on the node; a footer larger than that takes one more, both kept cached, so
        a warm open downloads neither). One whose row count is not index.json's (another
        shard's, under this one's name in the cache: it passes its CRC32) is downloaded again
        once; the caller then reports what it says. A failure is `_shard_checked`."""
        with self._shard_checked(shard):
            return self._footer(shard)

    def _footer(self, shard: int) -> pq.FileMetaData:
        info = self.manifest.shards[shard]
        url, size = self.urls[shard], info.bytes
        last = max(0, size - FOOTER_BYTES)
        for attempt in (1, 2):
            start = last
            try:
                with self.cache.pinned(url, info.sha256, start, size) as view:
                    tail = bytes(view)
                if len(tail) < 12 or tail[-4:] != b"PAR1":
                    raise OSError(
                        f"does not end as a Parquet file of the {size:,} bytes index.json says; "
                        "the shard was replaced or is damaged"
                    )
                need = int.from_bytes(tail[-8:-4], "little") + 8
                if need > len(tail):  # both ranges kept: the next open downloads neither
                    start = max(0, size - need)
                    with self.cache.pinned(url, info.sha256, start, size) as view:
                        tail = bytes(view)
                meta = storage.parquet_metadata(RangeFile(memoryview(tail), start, size))
                self._footer_starts[shard] = start
                if meta.num_rows == info.rows or attempt == 2:
                    return meta
                for at in {last, start}:
                    self.cache.discard(info.sha256, at, size)
            except (pa.ArrowException, OSError) as exc:
                for at in {last, start}:  # a damaged copy: fetched again
                    self.cache.discard(info.sha256, at, size)
                if attempt == 2:
                    raise DataError(f"{url}: footer unreadable ({one_line(exc)})") from None
        raise AssertionError("unreachable")

    def footers(self) -> Iterator[pq.FileMetaData]:
        """Every shard's footer (`footer`), in manifest order, downloaded on the fetch threads
        `FETCH_THREADS` at a time: a cold open of many shards does not wait for each GET in
        turn. A footer's error is raised where it comes in order; those after it are cancelled
        as it fails (no fetch starts after it). An open that fails calls `stop_fetches`."""
        pool = self._pool()
        jobs = [pool.submit(self.footer, i) for i in range(len(self.manifest.shards))]
        for i, job in enumerate(jobs):
            job.add_done_callback(functools.partial(_cancel_after_failure, jobs, i))
        return (job.result() for job in jobs)

    def stop_fetches(self) -> None:
        """Cancel the downloads not started and wait for those running (a failed open: no GET
        or fetch thread outlives it; a later fetch starts new threads)."""
        if self._fetcher is not None and self._pid == os.getpid():
            self._fetcher.shutdown(wait=True, cancel_futures=True)
        self._fetcher, self._fetching = None, {}

    def add_shard(self, meta: pq.FileMetaData) -> None:
        """The next shard's footer (read at open, in manifest order)."""
        self.metas.append(meta)
        self._spans.extend(byte_range(meta, g) for g in range(meta.num_row_groups))

    def seal(self) -> None:
        self.spans = np.asarray(self._spans, dtype=np.int64).reshape(-1, 2)
        """`(row groups, 2)`: each row group's first byte and end in its shard."""
        del self._spans

    def _where(self, shard: int, g: int) -> tuple[Any, str, int, int]:
        start, end = (int(x) for x in self.spans[g])
        return self.urls[shard], self.manifest.shards[shard].sha256, start, end

    def read(self, g: int, shard: int, local: int, columns: list[str]) -> pa.Table:
        """Row group `g` (number `local` in shard `shard`): `columns` of it. Only the bytes of
        those columns' chunks are checked and read (`RowIndex`'s stats read one small column of
        every row group an epoch plans). A read of the counts alone (`COUNTS`) downloads only
        their chunk (~1% of the range), as a range of its own, unless the whole range is at
        hand (`_whole_at_hand`): a scan of every row group's counts at open (`static_shape`)
        downloaded the whole dataset until 2026-12-07. A range that fails (the one read) is
        downloaded again; failing again, the shard's footer is (a cached footer can be another
        shard's and pass its CRC32), and the read tried once more where it differs."""
        size = self.manifest.shards[shard].bytes
        for attempt in (1, 2, 3):
            url, key, start, end = self._where(shard, g)
            check = byte_range(self.metas[shard], local, columns)
            if columns == [COUNTS] and not self._whole_at_hand(g, key, start, end):
                start, end = check  # the counts' chunk alone, cached as a range of its own
            pin = self.cache.pinned(url, key, start, end, check)
            with self._shard_checked(shard), pin as view:
                source = RangeFile(view, check[0], size)
                try:
                    pf = storage.parquet_file(
                        source, metadata=self.metas[shard],
                        page_checksum_verification=self.page_checksums,
                    )  # fmt: skip
                    if "input_ids" in columns:  # a row group's decode, not a small column's
                        decode_with_jemalloc(pf, source, self.page_checksums)
                    return pf.read_row_group(local, columns=columns, use_threads=False)
                except (pa.ArrowException, OSError):
                    if attempt == 3 or (
                        attempt == 2 and not self._footer_refreshed(shard, g - local)
                    ):
                        raise
            self.cache.discard(key, start, end)  # downloaded again on the next try
        raise AssertionError("unreachable")

    def _whole_at_hand(self, g: int, key: str, start: int, end: int) -> bool:
        """Whether row group `g`'s whole range (`start`..`end`, content `key`) is in the node's
        cache, or being downloaded by this process's fetch threads (`fetch_ahead`: a read of it
        waits for that download): a read of its counts then uses it and adds no GET."""
        fetching = self._pid == os.getpid() and g in self._fetching
        return fetching or self.cache.cached(key, start, end)

    def _footer_refreshed(self, shard: int, first: int) -> bool:
        """Download shard `shard`'s footer again (its row groups numbered from `first`): True
        when it differs from the one in use, which it then replaces."""
        info, old = self.manifest.shards[shard], self.metas[shard]
        for start in {self._footer_starts.get(shard, 0), max(0, info.bytes - FOOTER_BYTES)}:
            self.cache.discard(info.sha256, start, info.bytes)
        new = self.footer(shard)
        if new.equals(old):
            return False  # the footer was right: the row group is damaged
        rows = [new.row_group(i).num_rows for i in range(new.num_row_groups)]
        if rows != [old.row_group(i).num_rows for i in range(old.num_row_groups)]:
            raise DataError(
                f"{self.urls[shard]}: the footer this job read from the node's cache was not "
                "the shard's (downloaded again now); open the dataset again"
            )
        self.metas[shard] = new
        self.spans[first : first + len(rows)] = [byte_range(new, i) for i in range(len(rows))]
        return True

    @contextlib.contextmanager
    def _shard_checked(self, shard: int) -> Iterator[None]:
        """A failed read of shard `shard` (a download, a decode, its footer) is told by what
        the object is now, in one HEAD made only then (none while reads succeed): gone (the
        dataset was replaced since this job read the shard's footer: `dataset_gone`; gone at
        open, before that, it is missing, as a local shard is), or of another size than
        index.json's, in the words of `packtool verify` (rewritten or truncated since packing:
        no read again helps; until 2026-12-07 a shorter one's range read "came back N long ... read it again", or
        "416 Range Not Satisfiable"); else the failure as it was."""
        try:
            yield
        except (DataError, OSError, pa.ArrowException):
            url, want = self.urls[shard], self.manifest.shards[shard].bytes
            try:
                size = storage.file_size(url)
            except Exception:  # the store cannot be asked now: the failure as it was
                size = want
            if size is None and shard >= len(self.metas):  # its footer, at open: never read
                raise DataError(f"{url}: shard listed in index.json is missing") from None
            if size is None:
                raise dataset_gone(url, self.folder) from None
            if size != want:
                raise DataError(
                    f"{url}: size is {size:,} bytes, expected {want:,} ({INDEX_FILE}); "
                    "truncated or rewritten"
                ) from None
            raise

    def fetch_ahead(self, groups: list[int], shards: np.ndarray) -> None:
        """Download the ranges of row groups `groups` (in order) on the fetch threads."""
        pool = self._pool()
        for run in self._runs(
            [g for g in dict.fromkeys(groups) if g not in self._fetching], shards
        ):
            shard = int(shards[run[0]])
            url, key, start, end = self._where(shard, run[0])
            if len(run) == 1:
                job = pool.submit(self.cache.fetch, url, key, start, end)
            else:
                ranges = [self._where(shard, g)[2:] for g in run]
                job = pool.submit(self.cache.fetch_many, url, key, ranges)
            for g in run:
                self._fetching[g] = job
        if len(self._fetching) > 4 * FETCH_THREADS:
            self._fetching = {g: f for g, f in self._fetching.items() if not f.done()}

    def _pool(self) -> ThreadPoolExecutor:
        """This process's fetch threads (a forked worker starts its own)."""
        if self._pid != os.getpid():
            self._pid, self._fetcher, self._fetching = os.getpid(), None, {}
        if self._fetcher is None:
            self._fetcher = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="packtool-fetch")
        return self._fetcher

    def _runs(self, groups: list[int], shards: np.ndarray) -> list[list[int]]:
        """`groups` cut into runs of row groups side by side in one shard (each one's bytes
        end where the next one's begin), at most `MERGED_BYTES` and `MERGED_RANGES` a run: one
        GET each. In the order of each run's first row group in `groups`."""
        order = sorted(groups, key=lambda g: (int(shards[g]), int(self.spans[g][0])))
        runs: list[list[int]] = []
        for g in order:
            if runs:
                last = runs[-1]
                joins = (
                    int(shards[g]) == int(shards[last[-1]])
                    and self.spans[g][0] == self.spans[last[-1]][1]
                    and self.spans[g][1] - self.spans[last[0]][0] <= MERGED_BYTES
                    and len(last) < MERGED_RANGES
                )
                if joins:
                    last.append(g)
                    continue
            runs.append([g])
        first = {g: i for i, g in enumerate(groups)}
        return sorted(runs, key=lambda run: min(first[g] for g in run))


def _cancel_after_failure(jobs: list[Future], i: int, job: Future) -> None:
    """`jobs[i]` done: when it failed, cancel the jobs after it (called on the fetch thread it
    ran on, before that thread takes another job)."""
    if not job.cancelled() and job.exception() is not None:
        for later in jobs[i + 1 :]:
            later.cancel()


class RangeFile(io.RawIOBase):
    """A read-only file of `size` bytes of which only `start`..`start + len(data)` can be read
    (a row group's range of a shard: what a Parquet reader given the footer reads of it)."""

    def __init__(self, data: memoryview, start: int, size: int) -> None:
        super().__init__()
        self._data, self._start, self._size, self._pos = data, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self._pos, self._size)[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, n: int = -1) -> memoryview:  # type: ignore[override]
        """A view of the cached bytes, not a copy: pyarrow wraps any buffer without copying
        (~7% of a row group's decode saved). A decoded table never points into it (Parquet
        pages are decoded into buffers of their own); were one to, the mapping would outlive
        the pin until it is freed (`RangeCache.pinned`)."""
        a = self._pos - self._start
        b = len(self._data) if n is None or n < 0 else a + n
        if a < 0 or b > len(self._data):
            raise OSError(
                f"read of bytes {self._pos}..{self._start + b} outside the cached range "
                f"{self._start}..{self._start + len(self._data)}"
            )
        out = self._data[a:b]
        self._pos += len(out)
        return out

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)
