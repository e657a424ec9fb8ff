"""Ranged reads of objects: what `remote.py`'s stores serve to the readers.

`open_input` gives a seekable, buffered file whose reads are ranged GETs (`ReadAhead`: a small
first block, a 1 MB one, then `READ_BYTES` blocks fetched ahead on threads), so a worker parses
one block while the next downloads and no worker downloads an object it does not need;
`prefetch` starts the first block of the piece a process reads next (`forget_prefetch` drops it
if the piece is never opened); `read_range` and
`read_bytes` are one GET; `open_random` reads at offsets (Parquet). A web server that ignores
ranges is handled in `_fetch_range` and `RandomRead`.

Records in: an object's URL and a byte range. Out: its bytes.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import DataError
from packtool.errors import naming as naming_file
from packtool.storage.remote import filesystem, info_of, is_web, naming, sized, web_retried
from packtool.storage.web import ShortAnswer

READ_BYTES = 16 << 20
"""The most bytes a sequential read of an object asks for at once (one ranged GET): each
request costs a round trip, and a store's throughput comes from large ones."""
FIRST_READ_BYTES = 256 << 10
"""The first GET of an object opened for reading (and after a seek elsewhere): a reader that
wants a few bytes (the probe of a file's kind, a first record, a footer) is served by it."""
GROWTH = 4
"""The block after the first is this many times the first (1 MB); the ones after it are
`READ_BYTES`. A small second block is for a probe of a first record: a buffered reader takes
the whole first block at once, which asked for the second before the probe read a line (with
16 MB right after the first, a probe of every object of a corpus was a second download of it;
with 1 MB, a second GET of each). A first block taken whole in one call now asks for nothing
until the next call; the second block stays small for a reader that stops soon after it.
Growing every block 4x (256 KB, 1 MB, 4 MB, 16 MB) measured no better: packing the 180 MB
bench corpus from moto, 5 alternations, 4.70 s mean against 4.44 s for this."""
TAIL_BYTES = 64 << 10
"""How far past its range's end a ranged reader's block reaches (a JSONL range is read to the
end of the line that crosses it): a block is cut there. Reaching a whole block beyond, the 11
partitions of a 3 MB object fetched it 4.3 times (each fetched a 1 MB second block from just
before its end); a longer last line costs one more small GET."""
READ_AHEAD_THREADS = 8
"""Threads per process that fetch the next blocks of the objects being read sequentially."""
READ_AHEAD_BLOCKS = 2
"""Blocks of an object read sequentially that are in flight at once, ahead of the reader."""


PREFETCHED_PIECES = 2
"""Pieces of objects whose first block `prefetch` holds for a reader that has not opened them
yet (the oldest is dropped past this)."""
_PREFETCHED: collections.OrderedDict[tuple[str, int], list[tuple[int, int, Any]]] = (
    collections.OrderedDict()
)
_PREFETCH_LOCK = threading.Lock()


def prefetch(path: Any, start: int, end: int | None, size: int) -> None:
    """Start fetching, on the read-ahead threads, the first block of the bytes `start` to `end`
    (None: the object's end) of the object `path` of `size` bytes, which this process will read
    next, sequentially: one GET of up to `READ_BYTES`, cut `TAIL_BYTES` past `end` as a reader
    cuts its blocks. `ReadAhead` takes it when it is opened there and goes on in `READ_BYTES`
    blocks, so reading a corpus of many objects does not wait, at each object, for a first GET
    and the growing blocks after it (round trips a real store makes long). The block is not cut
    small as a reader's first is (for a probe that wants a few bytes): this reader reads the
    whole piece from `start` (the caller says where its reader starts:
    `read.formats.sequential_start`), and an object up to 16 MB is one request, not three (the
    180 MB bench corpus from moto, 6 alternations: 3.91 s against 4.05 s s3 -> local, 4.62
    against 4.92 s s3 -> s3). Nothing is asked for twice; a failed fetch raises where its bytes
    are read, as any read-ahead."""
    fs, p = filesystem(path)
    stop = size if end is None else min(end, size)
    key = (p, start)
    with _PREFETCH_LOCK:
        if key in _PREFETCHED or start >= stop:
            return
        n = READ_BYTES if end is None else min(READ_BYTES, stop - start + TAIL_BYTES)
        job = _fetchers(os.getpid()).submit(_fetch_range, fs, p, start, min(size, start + n), path)
        _PREFETCHED[key] = [(start, n, job)]
        while len(_PREFETCHED) > PREFETCHED_PIECES:
            _PREFETCHED.popitem(last=False)


def _fetch_range(fs: Any, p: str, start: int, end: int, url: Any) -> bytes:
    """One ranged GET of a sequential reader (`ReadAhead`, `prefetch`): every block goes here.
    Its errors name `url`, the object as the user named it (`p` is the client's name: an
    s3:// object's has no scheme, as its short answer's message had none until 2026-12-07).

    A web server that ignores the range answers the whole object: taken as the block, every
    partition after the first read the file from its start (documents twice, others lost). The
    block is cut out of such an answer instead (each block then downloads the whole object:
    said once on stderr); a longer answer that is not the whole object is an error, and so is
    a shorter one (`_checked_range`), after the retries of a web request (`web.retried`)."""
    if is_web(fs):  # a 5xx, a dropped connection, a body cut short or an empty 206: asked again
        return web_retried(lambda: _checked_range(fs, p, start, end, url), p)
    return _checked_range(fs, p, start, end, url)


def _checked_range(fs: Any, p: str, start: int, end: int, url: Any) -> bytes:
    """`_fetch_range`'s one GET, its answer checked: one shorter than asked for (`end` is never
    past the object's end) is a `web.ShortAnswer`; until 2026-12-06 an empty 206 was taken for
    the end of the file and the documents after it were lost without a word (exit 0).

    `HfFileSystem`'s `cat_file` is fsspec's: it opens the file with a 5 MB read-ahead, so each
    read downloaded up to 5 MB past its end (until 2026-12-06); its file opened without a
    cache asks for the bytes wanted."""
    data = _ranged_get(fs, p, start, end, url)
    if len(data) == end - start:
        return data
    if len(data) < end:
        raise DataError(
            f"{url}: the server answered {len(data):,} bytes for bytes {start:,}-{end:,}; "
            "read it again, or copy it to a local path"
        )
    _note_no_ranges(
        p,
        "each block read downloads the whole file (slow for a big one: serve it with range "
        "support, or copy it locally)",
    )
    return data[start:end]


def _ranged_get(fs: Any, p: str, start: int, end: int, url: Any) -> bytes:
    """One GET of bytes `start .. end` of `p` (`end` never past its end), at least that many
    (more: a server that ignores ranges, its callers' case); fewer is a `web.ShortAnswer`
    naming `url`, made again by `web.retried`."""
    hub = type(fs).__module__.startswith("huggingface_hub")
    data = fs.cat_file(p, start=start, end=end, **({"cache_type": "none"} if hub else {}))
    if len(data) < end - start:
        raise ShortAnswer(
            f"{url}: bytes {start:,}-{end:,} came back {len(data):,} long (the server answered "
            "with fewer bytes than asked for); read it again, or copy it to a local path"
        )
    return data


def _note_no_ranges(p: str, what: str) -> None:
    """Say once per process that the server of `p` ignores range requests, and what it costs."""
    if p not in _NO_RANGES:
        _NO_RANGES.add(p)
        print(
            f"note: {p}: the server ignores range requests, so {what}", file=sys.stderr, flush=True
        )


_NO_RANGES: set[str] = set()
"""URLs whose server answered a ranged read with the whole object (noted once per process)."""


def forget_prefetch(path: Any, start: int) -> None:
    """Drop the block `prefetch` started at `start` of the object `path` if no reader took it
    (its reader's partition failed or stopped before opening it), cancelling its GET if it has
    not begun: a failed partition's prefetch held up to `READ_BYTES` in the worker until two
    newer prefetches pushed it out (until 2026-12-07)."""
    _, p = filesystem(path)
    with _PREFETCH_LOCK:
        blocks = _PREFETCHED.pop((p, start), [])
    for _, _, job in blocks:
        job.cancel()


def _prefetched(p: str, start: int) -> list[tuple[int, int, Any]]:
    """The blocks `prefetch` started at `start` of the object `p` (taken: asked for once)."""
    with _PREFETCH_LOCK:
        return _PREFETCHED.pop((p, start), [])


def open_input(path: Any, buffering: int = -1, end: int | None = None) -> Any:
    """The object opened for reading: seekable and buffered (`buffering` bytes) over a reader
    whose reads are ranged GETs (`ReadAhead`: a small first block, a 1 MB one, then
    `READ_BYTES` blocks); once half of one block is read, the next is fetched on another
    thread, so a worker parses one block while the next downloads. `end`: where the caller means to stop (a partition's
    range), past which no block is fetched ahead; a read past it still gets its bytes, fetched
    then (a range's last line)."""
    fs, p = filesystem(path)
    with naming(path):
        size = sized(path, fs, p, info_of(fs, p))  # a web server that does not say: asked (`sized`)
    raw = ReadAhead(path, fs, p, size, end)
    return io.BufferedReader(
        raw, buffer_size=buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE
    )


class _Positioned(io.RawIOBase):
    """A readable, seekable object of `_size` bytes at position `_pos` (its subclasses read)."""

    _pos: int
    _size: int

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class ReadAhead(_Positioned):
    """An object read in ranged GETs, sequential reads fetched ahead.

    The first block is `first` bytes, the second `GROWTH` times that, the following ones
    `block` bytes; a seek elsewhere starts over with `first` bytes there. Once half of a
    block has been read, the blocks after it are fetched on background threads
    (`READ_AHEAD_THREADS` per process), up to `READ_AHEAD_BLOCKS` of them in flight (one while
    the first block is read), none starting at or past `end`; a first block taken whole in one
    call (a buffered reader's fill: a probe of a first record) fetches nothing more until the
    next call asks for its bytes. A failed fetch raises where its bytes are read, as one line
    naming the URL (`naming`).
    """

    def __init__(
        self,
        url: Any,
        fs: Any,
        path: str,
        size: int,
        end: int | None = None,
        block: int | None = None,
        first: int | None = None,
    ):
        super().__init__()
        self._url, self._fs, self._path, self._size, self._end = url, fs, path, size, end
        self._block = block or READ_BYTES
        self._first = min(first or FIRST_READ_BYTES, self._block)
        self._pos = 0
        self._data = memoryview(b"")
        self._start = 0  # where `_data` begins in the object
        self._taken = 0  # blocks taken since the open or the last seek elsewhere
        self._ahead: collections.deque[tuple[int, int, Any]] = collections.deque()
        """(start, bytes, future) of the blocks fetched ahead, in order."""

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        at = self._pos - self._start
        if not 0 <= at < len(self._data):
            if self._data and at == len(self._data) and not self._ahead:
                self._fetch_ahead()  # after a first block taken whole: its next, asked for now
            self._take(self._pos)
            at = 0
        n = min(len(buffer), len(self._data) - at)
        buffer[:n] = self._data[at : at + n]
        self._pos += n
        # A first block taken whole in one call (a buffered reader's fill: a probe of a first
        # record) asks for nothing yet; the next call does, if it comes.
        whole_first = self._taken <= 1 and at == 0 and n == len(self._data)
        if len(self._ahead) < self._depth() and 2 * (at + n) >= len(self._data) and not whole_first:
            self._fetch_ahead()
        return n

    def close(self) -> None:
        self._ahead.clear()  # fetches in flight finish on their threads and are dropped
        self._data = memoryview(b"")
        super().close()

    def _depth(self) -> int:
        return 1 if self._taken <= 1 else READ_AHEAD_BLOCKS

    def _take(self, start: int) -> None:
        with naming(self._url):
            if self._ahead and self._ahead[0][0] == start:
                data = self._ahead.popleft()[2].result()
                self._taken += 1
            else:  # a first read, or a seek: start small again (or where `prefetch` began)
                self._ahead.clear()
                # `prefetch` fetched the first block for a reader of the default sizes
                default = (self._first, self._block) == (FIRST_READ_BYTES, READ_BYTES)
                ready = _prefetched(self._path, start) if default else []
                if ready:  # a piece read whole: full blocks after it, two in flight
                    self._ahead.extend(ready[1:])
                    data = ready[0][2].result()
                    self._taken = 2
                else:
                    data = self._fetch(start, self._first)
                    self._taken = 1
        if not data:  # taken for the end of the file, the bytes after it were lost
            raise DataError(
                f"{self._url}: no bytes came back at byte {start:,} of {self._size:,}; read it "
                "again, or copy it to a local path"
            )
        self._data, self._start = memoryview(data), start

    def _fetch_ahead(self) -> None:
        if not self._data:
            return
        last = self._ahead[-1] if self._ahead else (self._start, len(self._data), None)
        following = last[0] + last[1]
        fetchers = _fetchers(os.getpid())
        while len(self._ahead) < self._depth():
            if following >= self._size or (self._end is not None and following >= self._end):
                return
            second = self._taken <= 1 and not self._ahead  # the block after a first one
            n = min(self._block, GROWTH * self._first) if second else self._block
            if self._end is not None:  # no further than TAIL_BYTES past the range
                n = min(n, self._end - following + TAIL_BYTES)
            self._ahead.append((following, n, fetchers.submit(self._fetch, following, n)))
            following += n

    def _fetch(self, start: int, n: int) -> bytes:
        return _fetch_range(self._fs, self._path, start, min(self._size, start + n), self._url)


@functools.lru_cache(maxsize=1)
def _fetchers(pid: int) -> Any:
    """This process's read-ahead threads (`pid`: a forked child makes its own)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="packtool-readahead")


def open_random(path: Any) -> RandomRead:
    """The object for random reads (Parquet: its footer, then the column chunks pyarrow asks
    for), each read one ranged GET of what is asked (`RandomRead`)."""
    fs, p = filesystem(path)
    with naming(path):
        if str(path).lower().startswith(("http://", "https://")):
            size = info_of(fs, p).get("size")
            return RandomRead(path, fs, p, None if size is None else int(size))
        opened = fs.open(p, "rb", cache_type="none")
        return RandomRead(path, fs, p, int(opened.size), opened)


class RandomRead(_Positioned):
    """An object read at offsets, each read one ranged GET of the bytes asked for, inside
    `naming`: wherever pyarrow reads (a row group, a page), a failed read or a body cut short is
    one line naming the URL. Through fsspec's file of the store (`opened`), or for a web
    server through `cat_file`, whose answers are checked: a server that ignores range requests
    answers with the whole object, which is then kept and every read served from it (one
    download per open, held in memory while the file is read; said once on stderr). A server
    that gives no size is downloaded whole at the open."""

    def __init__(self, url: Any, fs: Any, p: str, size: int | None, opened: Any = None):
        super().__init__()
        self._url, self._fs, self._p, self._opened = url, fs, p, opened
        self._whole: bytes | None = None
        self._pos = 0
        if size is None:
            with naming(url):
                self._whole = web_retried(lambda: fs.cat_file(p), p)
            size = len(self._whole)
        self._size = size

    def size(self) -> int:
        return self._size

    def read(self, size: int = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._pos + size)
        if end <= self._pos:
            return b""
        data = self._get(self._pos, end)
        self._pos = end
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self._opened is not None:
            self._opened.close()
        self._whole = None
        super().close()

    def _get(self, start: int, end: int) -> bytes:
        if self._whole is not None:
            return self._whole[start:end]
        with naming(self._url):
            if self._opened is not None:
                self._opened.seek(start)
                data = self._opened.read(end - start)
            else:  # a web server (`open_random`): a transient failure is asked again
                data = web_retried(
                    lambda: _ranged_get(self._fs, self._p, start, end, self._url), self._p
                )
        if len(data) == end - start:
            return data
        if self._opened is None and len(data) == self._size:  # a server that ignores ranges
            _note_no_ranges(
                self._p,
                "a Parquet file is downloaded whole each time it is opened, and held in "
                "memory while it is read (serve it with range support, or copy it locally)",
            )
            self._whole = data
            return data[start:end]
        raise DataError(
            f"{self._url}: bytes {start:,}-{end:,} came back {len(data):,} long; read it again, "
            "or copy it to a local path"
        )


def read_bytes(path: Any) -> bytes:
    fs, p = filesystem(path)
    with naming(path):
        # s3fs sizes a whole-object read from the listings cache first: an object another
        # process wrote after this one listed its prefix (a run's records) read as missing.
        fs.invalidate_cache(p)
        return web_retried(lambda: fs.cat_file(p), p) if is_web(fs) else fs.cat_file(p)


@contextlib.contextmanager
def local_copy(path: Any, size: int) -> Iterator[Path]:
    """The object's `size` bytes downloaded once, in order (`open_input`'s blocks, each fetched
    while the one before is written), into a file of the scratch folder, removed on leaving.
    A shorter or longer object is a `DataError`."""
    from packtool.storage import writing

    local = writing.temporary_name(path)
    # A failure to write the copy (a full disk: an OSError naming no file) names it, what it
    # is for and what sets its folder; the reads' errors between the writes pass as they are.
    note = f"a local copy of {path} to read whole; {writing.SCRATCH_ENV} sets its folder"
    try:
        with open_input(path) as source:
            with naming_file(local, note):
                out = open(local, "wb")  # noqa: SIM115 - closed below, its failure named
            got = 0
            try:
                while block := source.read(COPY_BYTES):
                    got += len(block)
                    with naming_file(local, note):
                        out.write(block)
            finally:
                with naming_file(local, note):
                    out.close()
        if got != size:
            raise DataError(f"{path}: {got:,} bytes came back, expected {size:,}; read it again")
        yield local
    finally:
        local.unlink(missing_ok=True)


COPY_BYTES = READ_BYTES
"""`local_copy`'s reads: whole `open_input` blocks."""


def read_range(path: Any, start: int, end: int) -> bytes:
    """Bytes `start` to `end` of the object (one ranged GET)."""
    fs, p = filesystem(path)
    with naming(path):
        data = _fetch_range(fs, p, start, end, path)  # a server that ignores ranges: cut out of it
    if len(data) != end - start:
        raise DataError(f"{path}: bytes {start}-{end} came back {len(data)} long; read it again")
    return data
