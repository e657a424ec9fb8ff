"""Object storage and the web, read side: `s3://`, `gs://`, `az://` / `abfs://`, `hf://`,
`http(s)://` inputs, through fsspec.

`local.py` hands every call on a URL to the function of the same name here (listings: to
`listing.py`, reads of bytes: to `remote_read.py`), so the readers, the plan and the workers
read a bucket exactly as they read a disk: by byte range (a JSONL partition's range, a Parquet
file's footer and row groups: `remote_read.open_input` gives a seekable file whose reads are
ranged GETs, so no worker downloads an object it does not need), with the
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
`HF_TOKEN`), plus `PACKTOOL_STORAGE_OPTIONS` (JSON: options for every store, and/or
`{"s3": {...}, "gs": {...}}` per scheme, which override them; the CLI's `--storage-options`
sets it, so worker processes inherit it). S3 defaults to a bounded, throttling-aware client:
10 s to connect, 8 attempts in botocore's `adaptive` retry mode (exponential backoff with jitter
on `SlowDown`, 5xx, timeouts and dropped connections), each waiting 60 s for a whole request
through obstore (3 minutes of retries at most) or 20 s between bytes through s3fs
(`s3_requests.s3fs_options`). http(s):// reads get aiohttp timeouts and 5 attempts of each
request with backoff (`web.py`). An unreachable endpoint, a missing bucket or key, denied
access or bad credentials become one line naming the URL (`DataError`), never a hang or a
traceback."""

from __future__ import annotations

import email.utils
import functools
import json
import os
import sys
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from packtool.errors import (
    RESUME,
    STORAGE_OPTIONS,
    ConfigError,
    DataError,
    MissingDependencyError,
    first_line,
    json_value,
)

T = TypeVar("T")

SCHEMES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "hf", "http", "https"}
"""The URL schemes packtool reads (anything else with `://` is a local path)."""
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "abfs": "azure",
          "abfss": "azure", "hf": "hub", "http": "http", "https": "http"}  # fmt: skip
"""The `packtool[...]` extra that installs each scheme's fsspec implementation."""
OPTIONS_ENV = "PACKTOOL_STORAGE_OPTIONS"
S3_DEFAULTS: dict[str, Any] = {
    "config_kwargs": {"connect_timeout": 10, "retries": {"max_attempts": 8, "mode": "adaptive"}}
}
"""The S3 client packtool asks for unless the options say otherwise (see the module docstring;
the read timeout is each client's: `s3_requests`)."""
GCS_DEFAULTS: dict[str, Any] = {"requests_timeout": 60}
"""gcsfs waits for an answer without end unless told: an endpoint that accepts a connection and
never answers hung a run (gcsfs retries a request 6 times: about 6 minutes at most)."""
QUIETED = {"gcs": ("gcsfs",), "azure": ("azure.identity", "azure.core")}
"""The loggers of each store's libraries that `_filesystem` silences (below CRITICAL)."""


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


ALIASES = {"s3a": "s3", "gcs": "gs", "abfs": "az", "abfss": "az"}
"""Schemes that name the same store as another (fsspec reads both spellings alike)."""


def location(url: Any) -> str:
    """The place a URL names, one text for every spelling of it: the scheme's canonical name
    (`s3a://` is `s3://`, `gcs://` `gs://`, `abfs(s)://` `az://`) and Azure's
    `CONTAINER@ACCOUNT.blob.core.windows.net` as the container (adlfs reads it so). Anything
    else is kept as given."""
    text = str(url)
    protocol = scheme(text)
    if protocol is None:
        return text
    rest = text[len(protocol) + 3 :]
    protocol = ALIASES.get(protocol, protocol)
    if protocol == "az":
        container, slash, key = rest.partition("/")
        rest = container.partition("@")[0] + slash + key
    return f"{protocol}://{rest}"


def parse_options(text: str) -> dict[str, Any]:
    """`--storage-options` / `PACKTOOL_STORAGE_OPTIONS`: a JSON object, or a one-line
    `ConfigError`."""
    try:
        value = json_value(text)
    except ValueError as exc:
        raise ConfigError(f"{STORAGE_OPTIONS}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{STORAGE_OPTIONS}: a JSON object ({{...}}), got {text[:60]}")
    return value


def options_for(protocol: str) -> dict[str, Any]:
    """The fsspec options for `protocol`: packtool's defaults, then `PACKTOOL_STORAGE_OPTIONS`:
    its top-level options (every store's), then those keyed by scheme (every spelling of the
    store, `az` and `abfs` alike, the spelling the URL uses last), which override them. (Until
    2026-12-06 a key of a scheme dropped every top-level option in silence.)"""
    raw = os.environ.get(OPTIONS_ENV, "").strip()
    given = parse_options(raw) if raw else {}
    if any(k in SCHEMES for k in given):  # per scheme
        family = sorted(
            (k for k in given if EXTRAS.get(k) == EXTRAS[protocol]), key=protocol.__eq__
        )
        merged: dict[str, Any] = {k: v for k, v in given.items() if k not in SCHEMES}
        for key in family:
            if not isinstance(given[key], dict):  # `{"gs": 5}` was a TypeError traceback
                raise ConfigError(
                    f"{STORAGE_OPTIONS}: the options for {key!r} must be a JSON object "
                    f"({{...}}), got {json.dumps(given[key])[:60]}"
                )
            merged.update(given[key])
        given = merged
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
        raise MissingDependencyError(install_hint(protocol)) from None
    from packtool.storage import s3_requests

    given = json.loads(options)
    if protocol in ("s3", "s3a"):
        from packtool.storage import s3_native

        if s3_native.usable(given):
            return s3_native.NativeS3(**given)
    if protocol in ("http", "https"):
        from packtool.storage import web  # (web reads only: `import loader` stays small)

        given = web.bounded_options(given)
    if EXTRAS[protocol] in QUIETED:
        import logging

        # gcsfs logs each retried failure with its traceback (~100 lines before the one-line
        # error), azure.identity each failed try of its credentials (49 lines with an account
        # name and no credentials, until 2026-12-06); the error packtool prints names the cause.
        for logger in QUIETED[EXTRAS[protocol]]:
            logging.getLogger(logger).setLevel(logging.CRITICAL)
    try:
        if protocol in ("s3", "s3a"):
            return s3_requests.bounded_s3fs(given)  # its timeouts and tries bounded
        return fsspec.filesystem(protocol, skip_instance_cache=True, **given)
    except ImportError:
        raise MissingDependencyError(install_hint(protocol)) from None
    except (ValueError, TypeError) as exc:
        if isinstance(exc, ConfigError):  # an option packtool refuses itself (s3_requests)
            raise
        if "Protocol not known" in str(exc):
            raise MissingDependencyError(install_hint(protocol)) from None
        # adlfs with no account or connection string, a bad option value or name: the client
        # cannot be made (it was a traceback); `filesystem` names the URL
        raise ConfigError(f"cannot open the {protocol}:// client ({first_line(exc)})") from None


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


def install_hint(protocol: str) -> str:
    """The one line that says which extra installs `protocol`'s client."""
    return f"{protocol}:// inputs need fsspec's {protocol} support: pip install 'packtool[{EXTRAS[protocol]}]'"


def filesystem(path: Any) -> tuple[Any, str]:
    """(fsspec file system, the path as it takes it) for a URL."""
    protocol = scheme(path)
    assert protocol is not None, f"not a URL: {path}"
    check_bucket(str(path))  # before any client is built (or imported)
    options = json.dumps(options_for(protocol), sort_keys=True)
    try:
        fs = _filesystem(
            protocol, options, json.dumps(forwarded_env(), sort_keys=True), os.getpid()
        )
    except ConfigError as exc:
        if str(exc).startswith((STORAGE_OPTIONS, "AWS_ENDPOINT_URL")):  # refused by packtool
            raise ConfigError(f"{path}: {exc}") from None
        raise ConfigError(
            f"{path}: {exc}; set the store's credentials (docs/remote.md, 'Credentials, endpoints, options') or "
            f"pass them in {STORAGE_OPTIONS}"
        ) from None
    text = protocol + str(path)[len(protocol) :]  # `HF://` as `hf://`: fsspec's spelling
    return fs, text if protocol in ("http", "https") else fs._strip_protocol(text)


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
    except (DataError, ConfigError, MissingDependencyError):
        raise
    except FileNotFoundError as exc:
        cause = exc.__cause__  # fsspec's HTTP info turns a failed connection into this
        if cause is not None and network_failure(cause):
            raise DataError(f"{url}: cannot be reached ({first_line(cause)})") from None
        if scheme(str(url)) in ("http", "https"):
            # fsspec's HTTP `info` turns any failure into this: an answer's has its status; one
            # with none is the request's own (an option the client refused: it said 404 until
            # 2026-12-06, the cause of `{"headers": "x"}` taken for a missing file); none at all
            # is `listing.expand`'s for a folder page not there
            status = getattr(cause, "status", None)
            if cause is None or status == 404:
                raise DataError(f"{url}: not found (the server answered 404)") from None
            if status:
                raise DataError(
                    f"{url}: the server answered {status} ({first_line(cause)})"
                ) from None
            raise DataError(
                f"{url}: cannot be {doing} ({type(cause).__name__}: {first_line(cause)}; "
                f"is an option of {STORAGE_OPTIONS} wrong?)"
            ) from None
        if scheme(str(url)) == "hf":
            raise DataError(
                f"{url}: not found on the Hub (no such file or folder in the repository, or "
                "no such repository or revision, or no access to it: HF_TOKEN)"
            ) from None
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


class RemoteStat(NamedTuple):
    """What packtool reads of an object's `stat` (the names of `os.stat_result`'s fields)."""

    st_size: int
    st_mtime_ns: int


def modified_at(info: dict[str, Any]) -> float | None:
    """When an object was last written (seconds since the epoch), from any store's `info`:
    S3's `LastModified`, Azure's `last_modified`, GCS's `mtime` / `updated`, the Hub's
    `last_commit` date (only where `HfFileSystem` was asked to expand its info: a Hub file's
    version is its `blob_id`, `object_etag`), a web server's `Last-Modified` header (an
    HTTP-date, whole seconds); None when it has none."""
    for key in (
        "LastModified",
        "last_modified",
        "mtime",
        "updated",
        "last_commit",
        "Last-Modified",
    ):
        value = info.get(key)
        if key == "last_commit" and isinstance(value, dict):  # huggingface_hub's LastCommitInfo
            value = value.get("date")
        if value is None:
            continue
        if hasattr(value, "timestamp"):
            return float(value.timestamp())
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
        try:  # "Tue, 15 Nov 1994 08:12:31 GMT"
            return email.utils.parsedate_to_datetime(str(value)).timestamp()
        except (TypeError, ValueError):
            continue
    return None


def object_etag(info: dict[str, Any]) -> str | None:
    """An object's ETag from any store's `info` (S3's `ETag`, Azure's and GCS's `etag`), or
    what names its version as one does: a Hub file's git blob id (`blob_id`; a large file's
    is its LFS pointer's, which holds its sha256), else its Xet hash. (Until 2026-12-06 a Hub
    input had none, nor a date `HfFileSystem.info` fills: it was compared by size alone.)"""
    return info.get("ETag") or info.get("etag") or info.get("blob_id") or info.get("xet_hash")


def _mtime_ns(info: dict[str, Any]) -> int:
    """An object's state as one integer in the place of a modification time: its whole seconds
    (a listing gives milliseconds, a HEAD only seconds), then in the nanoseconds the CRC-32 of
    its ETag, so an object rewritten within a second (same size) still reads as changed."""
    seconds = int(modified_at(info) or 0)
    tag = str(object_etag(info) or "").strip('"')
    return seconds * 1_000_000_000 + (zlib.crc32(tag.encode()) % 1_000_000_000 if tag else 0)


def stat(path: Any, fresh: bool = False) -> RemoteStat:
    """The object's size and modification time (`FileNotFoundError` when there is none).
    `fresh`: asked of the store (`stored_info`), not answered from what a listing of its prefix
    found in this process, which is the object as it was then (the plan stats from the listing;
    the check a worker makes before and after each piece asks the store)."""
    fs, p = filesystem(path)
    try:
        info = stored_info(fs, p) if fresh else info_of(fs, p)
    except FileNotFoundError:
        raise  # the callers say what a missing input means where they are
    except Exception:
        with naming(path):
            raise
    if info.get("type") == "directory":
        raise IsADirectoryError(str(path))
    web = scheme(path) in ("http", "https")
    if web and not fresh and modified_at(info) is None and not object_etag(info):
        _note_stateless(str(path))
    with naming(path):
        return RemoteStat(sized(path, fs, p, info), _mtime_ns(info))


def sized(path: Any, fs: Any, p: str, info: dict[str, Any]) -> int:
    """The size `info` gives, or for a web file (`path` http(s)://) whose server sent none (no
    Content-Length) the size it has (`_web_size`). Until 2026-12-06 it was 0: such a file was
    planned as one partition whatever its size (a local copy of it, several: other shards)."""
    size = info.get("size")
    if size is not None or scheme(path) not in ("http", "https"):
        return int(size or 0)  # (only a web server's answer may lack one)
    from fsspec.asyn import sync

    return web_retried(lambda: sync(fs.loop, _web_size, fs, p), path)


async def _web_size(fs: Any, url: str) -> int:
    """The size of the web file `url`, asked in one GET of its first byte: the total of a range
    answer's `Content-Range` (`bytes 0-0/TOTAL`); an empty file's 416 (no first byte) is 0; a
    server that ignores the range sends the file whole, which is counted as it comes (once per
    stat: only such a server's every read downloads it whole anyway)."""
    import re

    session = await fs.set_session()
    kwargs = dict(fs.kwargs)
    headers = {**(kwargs.pop("headers", None) or {}), "Range": "bytes=0-0"}
    headers["Accept-Encoding"] = "identity"  # the file's bytes, not a compressed answer
    async with session.get(fs.encode_url(url), headers=headers, **kwargs) as answer:
        from packtool.storage.web import check_encoding

        check_encoding(url, answer.headers.get("Content-Encoding", ""))
        total = re.fullmatch(
            r"bytes\s+(?:\d+-\d+|\*)/(\d+)", answer.headers.get("Content-Range", "")
        )
        if answer.status == 206 and total is not None:
            return int(total[1])
        if answer.status == 416:
            return 0 if total is None else int(total[1])
        answer.raise_for_status()
        size = 0
        async for chunk in answer.content.iter_chunked(1 << 20):
            size += len(chunk)
        return size


_STATELESS: set[str] = set()
"""URLs whose server gave neither an ETag nor a Last-Modified date (noted once per process)."""


def _note_stateless(url: str) -> None:
    """Say once that a change keeping `url`'s size goes unseen: only its size is compared (the
    standard library's `http.server` sends a date and no ETag; some servers send neither). Said
    where the plan stats it (not at each worker's check, in every worker process)."""
    if url not in _STATELESS:
        _STATELESS.add(url)
        print(
            f"note: {url}: the server sends neither an ETag nor a Last-Modified date, so a "
            f"change that keeps its size goes unseen, during the run and on {RESUME}",
            file=sys.stderr,
        )


def info_of(fs: Any, p: str) -> dict[str, Any]:
    """`fs.info(p)`, asked of the store again where a listing's cache says "directory": a key
    can be an object and a prefix at once (`dual`, `dual/x.jsonl`), and a listing of the
    prefix would have the object read as an empty directory. A web server's answer is asked
    again after a transient failure (`web_retried`)."""
    if is_web(fs):
        return web_retried(lambda: fs.info(p), p)
    info = fs.info(p)
    return fs.info(p, refresh=True) if info.get("type") == "directory" else info


def stored_info(fs: Any, p: str) -> dict[str, Any]:
    """`info_of`, asked of the store (one HEAD), never of a listing's cache: an object replaced
    since its prefix was listed read as the old one (s3fs's and `NativeS3`'s caches keep what
    a listing found until invalidated)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    if is_web(fs):  # fsspec's HTTP `info` keeps nothing; its keywords go to the request
        return web_retried(lambda: fs.info(p), p)
    if {"gs", "gcs"} & set(protocols):
        fs.invalidate_cache(p)  # gcsfs's `info` reads its listings whatever `refresh` says
        return info_of(fs, p)
    if type(fs).__module__.startswith("huggingface_hub"):  # HfFileSystem
        return _hub_info(fs, p)
    return fs.info(p, refresh=True)


def _hub_info(fs: Any, p: str) -> dict[str, Any]:
    """`HfFileSystem.info(p, refresh=True)` as its listing gives it: with the file's blob id
    (`object_etag`) and Xet hash, in one `paths-info` request. The file system's own answer
    keeps only the name, size and type unless asked to expand it (the last commit, which the
    Hub computes per path and a listing does not hold), so the workers' check saw a state of 0
    where the plan, stated from a listing, saw the blob id: every hf:// pack failed "changed
    since the run was planned" until 2026-12-06."""
    from huggingface_hub import HfApi

    resolved = fs.resolve_path(p)  # a missing repository or revision: FileNotFoundError
    rel = getattr(resolved, "path_in_repo", None)
    if not rel:  # a repository's root, a bucket's path: the file system's own answer
        return fs.info(p, refresh=True)
    found = HfApi(endpoint=fs.endpoint, token=fs.token).get_paths_info(
        resolved.repo_id, [rel], revision=resolved.revision, repo_type=resolved.repo_type
    )
    if not found:
        raise FileNotFoundError(p)
    entry, name = found[0], resolved.unresolve()
    if not hasattr(entry, "blob_id"):  # a RepoFolder
        return {"name": name, "size": 0, "type": "directory", "last_commit": None}
    return {
        "name": name,
        "size": entry.size,
        "type": "file",
        "blob_id": entry.blob_id,
        "lfs": entry.lfs,
        "xet_hash": getattr(entry, "xet_hash", None),
        "last_commit": None,
    }


def is_web(fs: Any) -> bool:
    """Whether `fs` is fsspec's HTTP file system (`http(s)://`)."""
    protocol = getattr(fs, "protocol", ())
    protocols = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
    return bool({"http", "https"} & set(protocols))


def web_retried(call: Callable[[], T], url: Any) -> T:
    """`call()`, a request to the web server of `url`, made again after a transient failure
    (`web.retried`: a 5xx, a dropped connection, a body cut short), as many tries as the
    storage options allow (`web.max_attempts`)."""
    from packtool.storage import web  # (web reads only: `import loader` stays small)

    return web.retried(call, web.max_attempts(options_for(scheme(url) or "http")))


def exists(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return bool(fs.exists(p))


def is_file(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return object_at(fs, p)


def object_at(fs: Any, p: str) -> bool:
    """Whether an object (a file) is at `p` of `fs`, in one HEAD on S3: s3fs's `isfile`
    (fsspec's: `info`) lists the prefix `p/` after a 404, a second request a file check needs no
    answer from (a prefix holding objects is no file); `NativeS3.isfile` asks one HEAD. On a
    real store each request is ~10-50 ms, most of them on the run's critical path."""
    if not type(fs).__module__.startswith("s3fs"):
        return bool(fs.isfile(p))
    return _s3fs_object_size(fs, p) is not None


def _s3fs_object_size(fs: Any, p: str) -> int | None:
    """The size of the object at `p` of s3fs `fs` in one HEAD; None for none (a prefix, a
    bucket, nothing): `NativeS3.object_size`'s twin."""
    bucket, key, _ = fs.split_path(p)
    if not key:
        return None
    try:
        return int(fs.call_s3("head_object", Bucket=bucket, Key=key)["ContentLength"])
    except FileNotFoundError:
        return None


def file_size(path: Any) -> int | None:
    """The size of the object at `path`, None where there is none (nothing, or a prefix): on
    S3 one HEAD, where `stat` lists the prefix `path/` after a 404 to tell a folder from
    nothing, a request an "is there a file, how large" needs no answer from (`linked_version`
    asks it of every output and input folder, most often of nothing)."""
    fs, p = filesystem(path)
    native = hasattr(fs, "object_size")  # s3_native.NativeS3
    if not native and not type(fs).__module__.startswith("s3fs"):
        try:
            return stat(path, fresh=True).st_size
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return fs.object_size(p) if native else _s3fs_object_size(fs, p)


def is_dir(path: Any) -> bool:
    fs, p = filesystem(path)
    with naming(path):
        fs.invalidate_cache(p)  # another process may have written it since this one listed
        return bool(fs.isdir(p))
