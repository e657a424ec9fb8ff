"""Object storage and the web, read side: `s3://`, `gs://`, `az://` / `abfs://`, `hf://`,
`http(s)://` inputs, through fsspec.

`local.py` hands every call on a URL to the function of the same name here (listings: to
`listing.py`), so the readers,
the plan and the workers read a bucket exactly as they read a disk: by byte range (a JSONL
partition's range, a Parquet file's footer and row groups: `open_input` gives a seekable file
whose reads are ranged GETs, so no worker downloads an object it does not need), with the
object's size and modification time as its state (`stat`: what the plan, `--resume` and the
workers' "unchanged since planned" check compare).

Why fsspec: one interface over every store the issue names (s3fs, gcsfs, adlfs, huggingface_hub's
`HfFileSystem`, HTTP), each the library those stores' own users reach for (datatrove and
NeMo-Curator read through it); `universal_pathlib`'s `UPath` gives a URL pathlib's naming
methods (`name`, `suffix`, `parent`), so code that names files needs no change. pyarrow's own
S3 file system (C++, no extra package) covers S3 and GCS only, not `hf://` or HTTP. For `s3://`
at a named endpoint, `s3_native.NativeS3` (obstore in the shape of s3fs's file system) stands in
for s3fs where it reaches the same bucket as the same caller (`s3_native.usable`): no botocore
to import and set up in each process that touches a bucket.

Credentials and endpoints come from each library's standard chain (the `AWS_*` variables,
`AWS_ENDPOINT_URL` for MinIO / R2 / any S3-compatible store, Google's and Azure's defaults,
`HF_TOKEN`), plus `PACKTOOL_STORAGE_OPTIONS` (JSON: options for every store, or
`{"s3": {...}, "gs": {...}}` per scheme; the CLI's `--storage-options` sets it, so worker
processes inherit it). S3 defaults to a bounded, throttling-aware client: 10 s to connect, 60 s
per read, 8 attempts in botocore's `adaptive` retry mode (exponential backoff with jitter on
`SlowDown`, 5xx, timeouts and dropped connections). An unreachable endpoint, a missing bucket or
key, denied access or bad credentials become one line naming the URL (`DataError`), never a
hang or a traceback.
"""

from __future__ import annotations

import collections
import functools
import io
import json
import os
import sys
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple

from packtool.errors import ConfigError, DataError, MissingDependencyError

SCHEMES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf", "http", "https"}
"""The URL schemes packtool reads (anything else with `://` is a local path)."""
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
          "abfss": "azure", "hf": "hub", "http": "http", "https": "http"}  # fmt: skip
"""The `packtool[...]` extra that installs each scheme's fsspec implementation."""
OPTIONS_ENV = "PACKTOOL_STORAGE_OPTIONS"
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {
        "connect_timeout": 10,
        "read_timeout": 60,
        "retries": {"max_attempts": 8, "mode": "adaptive"},
    }
}
"""The S3 client packtool asks for unless the options say otherwise (see the module docstring)."""
GCS_DEFAULTS: dict[str, Any] = {"requests_timeout": 60}
"""gcsfs waits for an answer without end unless told: an endpoint that accepts a connection and
never answers hung a run (gcsfs retries a request 6 times: about 6 minutes at most)."""
HTTP_TIMEOUTS = {"sock_connect": 10, "sock_read": 60}
"""Seconds an http(s):// read waits to connect and between bytes (aiohttp has no bound)."""


FORWARDED = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID",
             "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_DEFAULT_REGION", "AWS_REGION",
             "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE", "HF_TOKEN",
             "HF_ENDPOINT", "GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST",
             "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
             "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
             "AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_CLIENT_ID",
             "AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_TENANT_ID", OPTIONS_ENV,
             "PACKTOOL_S3_CLIENT")  # fmt: skip
"""The variables that say where and as whom a store is read: what a cluster's workers, which
do not inherit the driver's environment (Ray), are handed (`forwarded_env`)."""


def forwarded_env() -> dict[str, str]:
    """The `FORWARDED` variables set here (for the Ray engine's `runtime_env`)."""
    return {k: os.environ[k] for k in FORWARDED if os.environ.get(k)}


def scheme(path: Any) -> str | None:
    """The URL scheme of `path` when it is one packtool reads remotely, else None."""
    text = path if isinstance(path, str) else str(path)
    i = text.find("://")
    if i <= 0:
        return None
    s = text[:i].lower()
    return s if s in SCHEMES else None


def is_remote(path: Any) -> bool:
    """Whether `path` (a string, a `Path` or a `UPath`) names an object in a store, not a file."""
    return scheme(path) is not None


def parse_options(text: str) -> dict[str, Any]:
    """`--storage-options` / `PACKTOOL_STORAGE_OPTIONS`: a JSON object, or a one-line
    `ConfigError`."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"--storage-options: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"--storage-options: a JSON object ({{...}}), got {text[:60]}")
    return value


def options_for(protocol: str) -> dict[str, Any]:
    """The fsspec options for `protocol`: packtool's defaults, then `PACKTOOL_STORAGE_OPTIONS`."""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    given = parse_options(raw) if raw else {}
    if any(k in SCHEMES for k in given):  # per scheme
        given = given.get(protocol, {}) or {}
    base = dict(S3_DEFAULTS) if protocol in ("s3", "s3a") else {}
    if protocol in ("gs", "gcs"):
        base = dict(GCS_DEFAULTS)
    return {**base, **given}


@functools.lru_cache(maxsize=32)
def _filesystem(protocol: str, options: str, env: str, pid: int) -> Any:
    """One file system per scheme, options and environment (`env`: the `FORWARDED` variables,
    so a changed endpoint or credential gets a new client; fsspec's own instance cache, keyed
    by the options alone, would hand back the old one), and per process (`pid`: an s3fs client
    is not fork-safe, and the loader's workers are forked)."""
    try:
        import fsspec
    except ImportError:
        raise MissingDependencyError(_install(protocol)) from None
    given = json.loads(options)
    if protocol in ("s3", "s3a"):
        from packtool.storage import s3_native

        if s3_native.usable(given):
            return s3_native.NativeS3(**given)
    if protocol in ("http", "https"):
        given = _bounded_http(given)
    if protocol in ("gs", "gcs"):
        import logging

        # gcsfs logs each retried failure with its traceback (~100 lines before the one-line
        # error); the error packtool prints names the cause.
        logging.getLogger("gcsfs").setLevel(logging.CRITICAL)
    try:
        return fsspec.filesystem(protocol, skip_instance_cache=True, **given)
    except ImportError:
        raise MissingDependencyError(_install(protocol)) from None
    except ValueError as exc:
        if "Protocol not known" in str(exc):
            raise MissingDependencyError(_install(protocol)) from None
        raise


def _bounded_http(given: dict[str, Any]) -> dict[str, Any]:
    """fsspec's HTTP options with aiohttp timeouts (`HTTP_TIMEOUTS`) unless the user set one."""
    client = dict(given.get("client_kwargs") or {})
    if "timeout" not in client:
        try:
            import aiohttp
        except ImportError:  # the http extra is missing: fsspec says so
            return given
        client["timeout"] = aiohttp.ClientTimeout(total=None, **HTTP_TIMEOUTS)
    return {**given, "client_kwargs": client}


def client_modules(paths: Any) -> list[str]:
    """The modules of the fsspec implementations that `paths` (URLs or local paths) need, for a
    process that will read or write them to import ahead (the local engine's `forkserver`
    preload: importing s3fs and botocore costs a worker ~0.5 s of one core otherwise)."""
    protocols = sorted({p for p in map(scheme, paths) if p is not None})
    if not protocols:
        return []
    try:
        from fsspec.registry import known_implementations
    except ImportError:
        return []
    found = [m for p in protocols for m in _client_modules(p, known_implementations)]
    return ["fsspec", "upath", *dict.fromkeys(found)]


def _client_modules(protocol: str, known: dict[str, Any]) -> list[str]:
    if protocol in ("s3", "s3a"):
        from packtool.storage import s3_native

        if s3_native.usable(options_for(protocol)):
            return ["obstore", "obstore.store", "packtool.storage.s3_native"]
    name = known.get(protocol, {}).get("class", "")
    return [name.rsplit(".", 1)[0]] if "." in name else []


def _install(protocol: str) -> str:
    return f"{protocol}:// inputs need fsspec's {protocol} support: pip install 'packtool[{EXTRAS[protocol]}]'"


def filesystem(path: Any) -> tuple[Any, str]:
    """(fsspec file system, the path as it takes it) for a URL."""
    protocol = scheme(path)
    assert protocol is not None, f"not a URL: {path}"
    check_bucket(str(path))  # before any client is built (or imported)
    options = json.dumps(options_for(protocol), sort_keys=True)
    fs = _filesystem(protocol, options, json.dumps(forwarded_env(), sort_keys=True), os.getpid())
    text = str(path)
    return fs, text if protocol in ("http", "https") else fs._strip_protocol(text)


def as_path(text: str) -> Any:
    """A `UPath` for a URL (pathlib's naming methods on it)."""
    try:
        from upath import UPath
    except ImportError:
        raise MissingDependencyError(_install(scheme(text) or "s3")) from None
    check_bucket(text)
    return UPath(text)


def check_bucket(text: str) -> None:
    """Refuse a URL without a bucket (`s3:///x`): upath took it and failed at its first join
    with a traceback; a store's client tried to reach a host (48 s of retries for `gs:///x`)."""
    protocol = scheme(text) or ""
    rest = text[len(protocol) + 3 :]
    # (hf:// is checked by packtool/storage/hub.py; its UPaths print as "hf:///datasets/...")
    if protocol not in ("http", "https", "hf") and (not rest or rest.startswith("/")):
        raise ConfigError(f"{text}: no bucket in the URL; expected {protocol}://BUCKET/KEY")


@contextmanager
def naming(url: Any, doing: str = "read") -> Iterator[None]:
    """Turn a store's failure into one line naming `url` (`DataError`); `doing` says what
    failed in it (`cannot be read`, `cannot be written`, ...)."""
    try:
        yield
    except (DataError, MissingDependencyError):
        raise
    except FileNotFoundError as exc:
        cause = exc.__cause__  # fsspec's HTTP info turns a failed connection into this
        if cause is not None and network_failure(cause):
            raise DataError(f"{url}: cannot be reached ({first_line(cause)})") from None
        raise DataError(f"{url}: no such object (or its bucket does not exist)") from None
    except PermissionError as exc:
        raise DataError(f"{url}: access denied ({first_line(exc)})") from None
    except OSError as exc:
        raise DataError(f"{url}: cannot be {doing} ({first_line(exc)})") from None
    except Exception as exc:  # botocore's, aiohttp's, google's: one line whatever they raise
        if type(exc).__module__.startswith("pyarrow"):  # the words a local file gets
            raise DataError(f"{url}: not a readable Parquet file ({first_line(exc)})") from None
        if type(exc).__name__ in ("NoCredentialsError", "PartialCredentialsError"):
            raise DataError(f"{url}: no credentials found ({first_line(exc)})") from None
        raise DataError(f"{url}: {type(exc).__name__}: {first_line(exc)}") from None


def network_failure(exc: BaseException) -> bool:
    """A connection refused, reset or timed out (aiohttp's client errors, OS-level ones)."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    return type(exc).__module__.startswith("aiohttp") and "Response" not in type(exc).__name__


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


class RemoteStat(NamedTuple):
    """What packtool reads of an object's `stat` (the names of `os.stat_result`'s fields)."""

    st_size: int
    st_mtime_ns: int


def modified_at(info: dict[str, Any]) -> float | None:
    """When an object was last written (seconds since the epoch), from any store's `info`:
    S3's `LastModified`, Azure's `last_modified`, GCS's `mtime` / `updated`, the Hub's
    `last_commit`; None when it has none."""
    for key in ("LastModified", "last_modified", "mtime", "updated", "last_commit"):
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
    return None


def object_etag(info: dict[str, Any]) -> str | None:
    """An object's ETag from any store's `info` (S3's `ETag`, Azure's and GCS's `etag`)."""
    return info.get("ETag") or info.get("etag")


def _mtime_ns(info: dict[str, Any]) -> int:
    """An object's state as one integer in the place of a modification time: its whole seconds
    (a listing gives milliseconds, a HEAD only seconds), then in the nanoseconds the CRC-32 of
    its ETag, so an object rewritten within a second (same size) still reads as changed."""
    seconds = int(modified_at(info) or 0)
    tag = str(object_etag(info) or "").strip('"')
    return seconds * 1_000_000_000 + (zlib.crc32(tag.encode()) % 1_000_000_000 if tag else 0)


def stat(path: Any) -> RemoteStat:
    """The object's size and modification time (`FileNotFoundError` when there is none)."""
    fs, p = filesystem(path)
    try:
        info = info_of(fs, p)
    except FileNotFoundError:
        raise  # the callers say what a missing input means where they are
    except Exception:
        with naming(path):
            raise
    if info.get("type") == "directory":
        raise IsADirectoryError(str(path))
    return RemoteStat(int(info.get("size") or 0), _mtime_ns(info))


def info_of(fs: Any, p: str) -> dict[str, Any]:
    """`fs.info(p)`, asked of the store again where a listing's cache says "directory": a key
    can be an object and a prefix at once (`dual`, `dual/x.jsonl`), and a listing of the
    prefix would have the object read as an empty directory."""
    info = fs.info(p)
    return fs.info(p, refresh=True) if info.get("type") == "directory" else info


def exists(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return bool(fs.exists(p))


def is_file(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return bool(fs.isfile(p))


def is_dir(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return bool(fs.isdir(p))


READ_BYTES = 16 << 20
"""The most bytes a sequential read of an object asks for at once (one ranged GET): each
request costs a round trip, and a store's throughput comes from large ones."""
FIRST_READ_BYTES = 256 << 10
"""The first GET of an object opened for reading (and after a seek elsewhere): a reader that
wants a few bytes (the probe of a file's kind, a first record, a footer) is served by it."""
GROWTH = 4
"""The block after the first is this many times the first (1 MB); the ones after it are
`READ_BYTES`. The block after the first is asked for once half of the first is read, and a
buffered reader takes the whole first block at once, so a probe of a first record also fetches
the second block: a small second block keeps that to 1 MB rather than 16 MB an object (a probe
of every object of a corpus was a second download of it), for one more GET an object read
whole. Growing every block 4x (256 KB, 1 MB, 4 MB, 16 MB) measured no better: packing the
180 MB bench corpus from moto, 5 alternations, 4.70 s mean against 4.44 s for this."""
READ_AHEAD_THREADS = 8
"""Threads per process that fetch the next blocks of the objects being read sequentially."""
READ_AHEAD_BLOCKS = 2
"""Blocks of an object read sequentially that are in flight at once, ahead of the reader."""


PREFETCHED_PIECES = 2
"""Pieces of objects whose first blocks `prefetch` holds for a reader that has not opened them
yet (the oldest is dropped past this)."""
_PREFETCHED: collections.OrderedDict[tuple[str, int], list[tuple[int, int, Any]]] = (
    collections.OrderedDict()
)
_PREFETCH_LOCK = threading.Lock()


def prefetch(path: Any, start: int, end: int | None, size: int) -> None:
    """Start fetching, on the read-ahead threads, the first blocks (as `ReadAhead` would ask for
    them: `FIRST_READ_BYTES`, `GROWTH` times that, one of `READ_BYTES`, none past a block) of
    the bytes `start` to `end` (None: the object's end) of the object `path` of `size` bytes,
    which this process will read next, sequentially. `ReadAhead` takes them when it is opened there, so reading a
    corpus of many objects does not wait, at each object, for a first GET and the growing blocks
    after it (round trips a real store makes long). Nothing is asked for twice; a failed fetch
    raises where its bytes are read, as any read-ahead."""
    fs, p = filesystem(path)
    stop = size if end is None else min(end, size)
    key = (p, start)
    with _PREFETCH_LOCK:
        if key in _PREFETCHED or start >= stop:
            return
        fetchers = _fetchers(os.getpid())
        blocks, at = [], start
        for n in (FIRST_READ_BYTES, min(READ_BYTES, GROWTH * FIRST_READ_BYTES), READ_BYTES):
            if at >= stop:
                break
            job = fetchers.submit(_fetch_range, fs, p, at, min(size, at + n))
            blocks.append((at, n, job))
            at += n
        _PREFETCHED[key] = blocks
        while len(_PREFETCHED) > PREFETCHED_PIECES:
            _PREFETCHED.popitem(last=False)


def _fetch_range(fs: Any, p: str, start: int, end: int) -> bytes:
    """One ranged GET of a sequential reader (`ReadAhead`, `prefetch`): every block goes here.

    A web server that ignores the range answers the whole object: taken as the block, every
    partition after the first read the file from its start (documents twice, others lost). The
    block is cut out of such an answer instead (each block then downloads the whole object:
    said once on stderr); a longer answer that is not the whole object is an error."""
    data = fs.cat_file(p, start=start, end=end)
    if len(data) <= end - start:
        return data
    if len(data) < end:
        raise DataError(
            f"{p}: the server answered {len(data):,} bytes for bytes {start:,}-{end:,}; "
            "read it again, or copy it to a local path"
        )
    if p not in _NO_RANGES:
        _NO_RANGES.add(p)
        print(
            f"note: {p}: the server ignores range requests, so each block read downloads the "
            "whole file (slow for a big one: serve it with range support, or copy it locally)",
            file=sys.stderr,
        )
    return data[start:end]


_NO_RANGES: set[str] = set()
"""URLs whose server answered a ranged read with the whole object (noted once per process)."""


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
        size = info_of(fs, p).get("size")
    if size is None:  # a web server that does not say: fsspec's own file, one GET per read
        return io.BufferedReader(open_unbuffered(path), buffer_size=max(buffering, READ_BYTES))
    raw = ReadAhead(path, fs, p, int(size), end)
    return io.BufferedReader(
        raw, buffer_size=buffering if buffering > 0 else io.DEFAULT_BUFFER_SIZE
    )


class ReadAhead(io.RawIOBase):
    """An object read in ranged GETs, sequential reads fetched ahead.

    The first block is `first` bytes, the second `GROWTH` times that, the following ones
    `block` bytes; a seek elsewhere starts over with `first` bytes there. Once half of a
    block has been read, the blocks after it are fetched on background threads
    (`READ_AHEAD_THREADS` per process), up to `READ_AHEAD_BLOCKS` of them in flight (one while
    the first block is read: a probe of a first record fetches no more), none starting at or
    past `end`. A failed fetch raises where its bytes are read, as one line naming the URL
    (`naming`).
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

    def readinto(self, buffer: Any) -> int:
        if self._pos >= self._size:
            return 0
        at = self._pos - self._start
        if not 0 <= at < len(self._data):
            self._take(self._pos)
            at = 0
        n = min(len(buffer), len(self._data) - at)
        buffer[:n] = self._data[at : at + n]
        self._pos += n
        if len(self._ahead) < self._depth() and 2 * (at + n) >= len(self._data):
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
                # `prefetch` cuts blocks as a reader of the default sizes does
                default = (self._first, self._block) == (FIRST_READ_BYTES, READ_BYTES)
                ready = _prefetched(self._path, start) if default else []
                if ready:
                    self._ahead.extend(ready[1:])
                    data = ready[0][2].result()
                else:
                    data = self._fetch(start, self._first)
                self._taken = 1
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
            self._ahead.append((following, n, fetchers.submit(self._fetch, following, n)))
            following += n

    def _fetch(self, start: int, n: int) -> bytes:
        return _fetch_range(self._fs, self._path, start, min(self._size, start + n))


@functools.lru_cache(maxsize=1)
def _fetchers(pid: int) -> Any:
    """This process's read-ahead threads (`pid`: a forked child makes its own)."""
    from concurrent.futures import ThreadPoolExecutor

    return ThreadPoolExecutor(READ_AHEAD_THREADS, thread_name_prefix="packtool-readahead")


def open_unbuffered(path: Any) -> Any:
    """The object for random reads (Parquet): each read one ranged GET of what is asked."""
    fs, p = filesystem(path)
    with naming(path):
        return fs.open(p, "rb", cache_type="none")


def read_bytes(path: Any) -> bytes:
    fs, p = filesystem(path)
    with naming(path):
        # s3fs sizes a whole-object read from the listings cache first: an object another
        # process wrote after this one listed its prefix (a run's records) read as missing.
        fs.invalidate_cache(p)
        return fs.cat_file(p)


def read_range(path: Any, start: int, end: int) -> bytes:
    """Bytes `start` to `end` of the object (one ranged GET)."""
    fs, p = filesystem(path)
    with naming(path):
        data = fs.cat_file(p, start=start, end=end)
    if len(data) != end - start:
        raise DataError(f"{path}: bytes {start}-{end} came back {len(data)} long; read it again")
    return data
