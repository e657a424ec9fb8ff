"""s3:// through obstore (Rust's `object_store`) for the calls packtool makes, s3fs's shape.

`remote.filesystem` hands this file system out for `s3://` in place of s3fs where `usable` says
so: by default (`PACKTOOL_S3_CLIENT` unset or `auto`) when an endpoint is named (an
S3-compatible store: MinIO, R2, Ceph, a test server), the credentials are the `AWS_*` keys or
the storage options' (or `anon`), and every storage option has an obstore equivalent. All else
stays on s3fs, the same client as before: a profile, SSO, `credential_process` or instance
credentials (botocore's chain, which obstore reads only in part), and AWS itself, where s3fs
follows a bucket to its region and obstore would need the region named
(`PACKTOOL_S3_CLIENT=obstore` opts in there; `=s3fs` opts out everywhere).

Why: importing s3fs, aiobotocore and botocore and building their client cost each process that
touches a bucket ~0.5 s of one core before its first request (0.28 s of imports, ~0.1 s for
botocore's service model, 0.1-0.2 s more for its error classes at the first 404); obstore
imports in 0.02 s and uploads faster (docs/benchmarks.md, `remote` block).

It is an fsspec `AbstractFileSystem`, so `storage/` calls it as it calls s3fs: `info`, `ls`,
`find` (one flat listing), `cat_file` (a ranged GET), `put_file` (one PUT up to two parts'
worth, else a multipart upload in the part size asked for, aborted when it fails), `pipe_file`
(`mode="create"`: `If-None-Match: *`), `rm_file` / `rm`, `open` (ranged reads), and the two
conditional requests the lock makes through s3fs's `call_s3`: `put_object` with `IfMatch`
(obstore's `UpdateVersion` put) and `delete_object` with `IfMatch`. What listings found answers `info` until `invalidate_cache`, as s3fs's
listings cache does (packtool invalidates where another writer may have written). Listing and
aborting unfinished multipart uploads, and the conditional DELETE, are requests `s3_requests`
signs with botocore's signer (no client built); a key obstore's paths cannot hold goes to s3fs
(`_or_s3fs`). obstore's errors become the `OSError`s s3fs raises (`FileNotFoundError`,
`PermissionError`, `FileExistsError`), which `remote.naming` words. Retries: obstore's, as many as the options' botocore `max_attempts` allow (8 attempts by
default), with exponential backoff and jitter on 5xx, throttling, timeouts and dropped
connections; the options' connect and read timeouts (10 s, 60 s).

obstore is not fork-safe (`_STARTED_IN`): a process forked from one whose obstore client
started reads through s3fs.
"""

from __future__ import annotations

import bisect
import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from packtool.errors import STORAGE_OPTIONS, ConfigError, MissingDependencyError
from packtool.storage import s3_requests

UPLOAD_CONCURRENCY = 4
"""Parts of one multipart upload sent at once."""
PART_BYTES = 64 << 20
"""A multipart upload's part size when the caller names none (`remote_write.PART_BYTES`)."""

_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
_FALLBACK_ENV = ("AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")  # fmt: skip
"""Variables that point botocore at a credentials source obstore does not read the same way."""
_TRANSLATED = {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs"}
_CLIENT_KWARGS = {"endpoint_url", "region_name"}
_CONFIG_KWARGS = {"connect_timeout", "read_timeout", "retries"}


_STARTED_IN: int | None = None
"""The pid of the process whose obstore client (and so its tokio runtime) was built, if any.

obstore is not fork-safe: a child forked after the runtime started inherits it without its
threads, and its first request hangs (obstore's own tracker says so: developmentseed/obstore
#441). The loader's workers are forked from the process that opened the dataset (which read
its index through this module), so a forked child of such a process reads through s3fs (what
it did before obstore came in), and a process whose obstore never started (the local engine's
forkserver, which only imports it) forks workers that use obstore. Such a process imports
s3fs before it forks (`_before_fork`), once, so that its children do not each import it (as
they did not when the parent read through s3fs)."""


def _before_fork() -> None:
    if os.getpid() == _STARTED_IN:
        with contextlib.suppress(ImportError):
            import s3fs  # noqa: F401


os.register_at_fork(before=_before_fork)


CLIENT_ENV = "PACKTOOL_S3_CLIENT"
"""`s3fs` or `obstore` forces that client for s3://; unset (`auto`), obstore where `usable`."""


def usable(options: dict[str, Any]) -> bool:
    """Whether s3:// goes through obstore in this process with `options` (s3fs's keyword
    arguments): see the module docstring. `auto`: an endpoint is named (an S3-compatible store:
    MinIO, R2, Ceph; on AWS itself s3fs follows a bucket's region where obstore would need it
    named, so AWS stays on s3fs unless `PACKTOOL_S3_CLIENT=obstore`), the credentials are the
    `AWS_*` keys or the options' (or none asked: `anon`), and every option has an obstore
    equivalent."""
    chosen = os.environ.get(CLIENT_ENV, "auto").strip().lower() or "auto"
    if chosen not in ("auto", "s3fs", "obstore"):
        raise ConfigError(f"{CLIENT_ENV}={chosen}: expected s3fs, obstore or auto")
    s3_requests.check_options(options)  # a value of the wrong shape: one line, either client
    if chosen == "s3fs":
        return False
    if _STARTED_IN is not None and os.getpid() != _STARTED_IN:
        return False  # a forked child of a process whose obstore runtime started
    untranslated = _untranslated(options)
    if untranslated:
        if chosen == "obstore":
            s3_requests.check_s3fs_names(options)  # no s3 option at all: said so, as s3fs's
            raise ConfigError(f"{STORAGE_OPTIONS}: {CLIENT_ENV}=obstore cannot take {untranslated}")
        return False
    try:
        import obstore  # noqa: F401
    except ImportError:
        if chosen == "obstore":
            raise MissingDependencyError(f"{CLIENT_ENV}=obstore: pip install obstore") from None
        return False
    if chosen == "obstore":
        return True
    url = s3_requests.endpoint(options)
    if not url or any(os.environ.get(k) for k in _FALLBACK_ENV):
        return False
    profile = s3_requests.default_profile()
    if s3_requests.CONFIG_ONLY_S3FS & set(profile) or "unreadable" in profile:
        return False  # `~/.aws/config` says how to reach the endpoint in words obstore ignores
    if str(url).startswith("https:") and os.environ.get("AWS_CA_BUNDLE"):
        return False  # botocore trusts that bundle for the endpoint; obstore reads it not
    if options.get("key") and not options.get("token") and os.environ.get("AWS_SESSION_TOKEN"):
        return False  # obstore would pair the options' keys with the variables' token
    return bool(options.get("anon") or options.get("key")
                or all(os.environ.get(k) for k in _CREDENTIALS))  # fmt: skip


def _untranslated(options: dict[str, Any]) -> list[str]:
    """The s3fs options (and `client_kwargs` / `config_kwargs` keys) `NativeS3` cannot take."""
    out = sorted(set(options) - _TRANSLATED)
    for name, taken in (("client_kwargs", _CLIENT_KWARGS), ("config_kwargs", _CONFIG_KWARGS)):
        out += [f"{name}.{k}" for k in sorted(set(options.get(name) or {}) - taken)]
    return out


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _oserror(exc: BaseException, path: str) -> OSError:
    """The `OSError` fsspec would raise for obstore's `exc`."""
    from obstore import exceptions as e

    line = _line(exc)
    if isinstance(exc, e.NotFoundError):
        return FileNotFoundError(path)
    if isinstance(exc, (e.PermissionDeniedError, e.UnauthenticatedError)):
        return PermissionError(line)
    if isinstance(exc, e.AlreadyExistsError):
        return FileExistsError(path)
    if isinstance(exc, e.PreconditionError):
        return OSError(f"PreconditionFailed: {line}")
    if "NoSuchBucket" in str(exc):
        return FileNotFoundError(path)
    if (
        "AccessDenied" in str(exc)
        or "InvalidAccessKeyId" in str(exc)
        or "SignatureDoesNotMatch" in str(exc)
    ):
        return PermissionError(line)
    return OSError(line)


class _Unrepresentable(Exception):
    """A key obstore's paths cannot hold (`//`, a leading `/`, a `.` or `..` segment, a control
    character): the call goes to s3fs (`_or_s3fs`), which reads such keys."""


@contextlib.contextmanager
def _errors(path: str) -> Iterator[None]:
    from obstore.exceptions import BaseError

    try:
        yield
    except (ValueError, TypeError) as exc:  # obstore's words for a key it could not convert
        if "parse path" in str(exc).lower() or "string path" in str(exc).lower():
            raise _Unrepresentable(path) from None
        raise
    except BaseError as exc:
        if "invalid path" in str(exc).lower():  # a listing met such a key
            raise _Unrepresentable(path) from None
        raise _oserror(exc, path) from None


def _or_s3fs(method: Any) -> Any:
    """`method`, or s3fs's method of the same name where a key is `_Unrepresentable`."""

    @functools.wraps(method)
    def call(self: NativeS3, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except _Unrepresentable:
            return getattr(self._s3fs(), method.__name__)(*args, **kwargs)

    return call


@contextlib.contextmanager
def _conditional(path: str) -> Iterator[None]:
    """A refused conditional request in the words botocore's error has (what the lock reads):
    412 `PreconditionFailed` (another version), 409 `ConditionalRequestConflict` (a conditional
    request racing another: obstore calls a 409 `AlreadyExists`)."""
    from obstore import exceptions as e

    try:
        yield
    except e.PreconditionError as exc:
        raise OSError(f"PreconditionFailed: {_line(exc)}") from None
    except e.AlreadyExistsError as exc:
        raise OSError(f"ConditionalRequestConflict: {_line(exc)}") from None
    except e.BaseError as exc:
        raise _oserror(exc, path) from None


class NativeS3(AbstractFileSystem):
    """s3:// on obstore, in the shape of s3fs's `S3FileSystem` (the calls packtool makes)."""

    protocol = ("s3", "s3a")
    root_marker = ""
    cachable = False

    def __init__(self, **options: Any) -> None:
        super().__init__()
        self._options = options
        self._stores: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._fallback: Any = None  # s3fs, for what neither obstore nor `_signed` asks
        self._requests: Any = None  # `_signed`
        self._listed: dict[str, dict[str, Any]] = {}
        self._names: list[str] = []  # the names of `_listed`, sorted
        """The objects the last listings found, by name: what `info` answers for them without
        a HEAD until `invalidate_cache` (s3fs's listings cache, whose rule packtool follows:
        it invalidates where another writer may have written since)."""

    @classmethod
    def _strip_protocol(cls, path: Any) -> str:
        text = str(path)
        for p in ("s3://", "s3a://"):
            if text.startswith(p):
                text = text[len(p) :]
        return text.rstrip("/")

    def _store(self, bucket: str) -> Any:
        store = self._stores.get(bucket)  # built once a bucket: no lock after
        if store is None:
            with self._lock:
                store = self._stores.get(bucket)
                if store is None:
                    store = self._stores[bucket] = self._build(bucket)
        return store

    def _build(self, bucket: str) -> Any:
        from obstore.store import S3Store

        global _STARTED_IN
        if _STARTED_IN is None:
            _STARTED_IN = os.getpid()
        o = self._options
        config: dict[str, Any] = {}
        url = s3_requests.endpoint(o)
        if url:
            config["endpoint"] = url
        where = s3_requests.region(o)
        if where:
            config["region"] = where
        if o.get("anon"):
            config["skip_signature"] = True
        if o.get("key"):
            config["access_key_id"] = o["key"]
            config["secret_access_key"] = o.get("secret", "")
            if o.get("token"):
                config["session_token"] = o["token"]
        timeouts = o.get("config_kwargs") or {}
        client_options = {
            "connect_timeout": f"{timeouts.get('connect_timeout', s3_requests.CONNECT_TIMEOUT_S)}s",
            "timeout": f"{timeouts.get('read_timeout', s3_requests.READ_TIMEOUT_S)}s",
            "allow_http": bool(url and url.startswith("http://")),
        }
        retries = (timeouts.get("retries") or {}).get("max_attempts", s3_requests.ATTEMPTS)
        retry = {
            "max_retries": max(0, int(retries) - 1),
            "backoff": {"init_backoff": timedelta(milliseconds=100),
                        "max_backoff": timedelta(seconds=20), "base": 2},
            "retry_timeout": timedelta(minutes=3),
        }  # fmt: skip
        return S3Store(bucket, config=config, client_options=client_options, retry_config=retry)

    def _split(self, path: Any) -> tuple[Any, str, str]:
        p = self._strip_protocol(path)
        bucket, _, key = p.partition("/")
        if key.startswith("/"):  # obstore's paths drop the leading "/": another object
            raise _Unrepresentable(p)
        return self._store(bucket), bucket, key

    # -- reading --------------------------------------------------------------------------

    @_or_s3fs
    def info(self, path: Any, **kwargs: Any) -> dict[str, Any]:
        """An object's (one HEAD), else a prefix's that holds objects (its listing's first page),
        as s3fs gives them; `FileNotFoundError` for neither. From what a listing found unless
        `refresh` (as s3fs)."""
        import obstore

        store, bucket, key = self._split(path)
        p = self._strip_protocol(path)
        listed = None if kwargs.get("refresh") else self._listed.get(p)
        if listed is not None:
            return dict(listed)
        if key:
            with contextlib.suppress(FileNotFoundError), _errors(p):
                return self._file(bucket, obstore.head(store, key))
        with _errors(p):  # one object under it says so: the first page only, not every page
            first = next(iter(obstore.list(store, f"{key}/" if key else None, chunk_size=1)), None)
        if first or not key:  # (a bucket is a folder, empty or not: its errors raise above)
            return {"name": p, "size": 0, "type": "directory"}
        raise FileNotFoundError(p)

    @staticmethod
    def _file(bucket: str, meta: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": f"{bucket}/{meta['path']}",
            "size": int(meta["size"]),
            "type": "file",
            "LastModified": meta["last_modified"],
            "ETag": meta.get("e_tag"),
        }

    def _kind(self, path: Any) -> str | None:
        """ "file", "directory", or None for neither. As s3fs, a store's failure raises (fsspec's
        own `exists` / `isdir` / `isfile` answer False to it)."""
        try:
            return self.info(path)["type"]
        except FileNotFoundError:
            return None

    def exists(self, path: Any, **kwargs: Any) -> bool:
        return self._kind(path) is not None

    def isdir(self, path: Any) -> bool:
        return self._kind(path) == "directory"

    def isfile(self, path: Any) -> bool:
        """One HEAD (or what a listing found): a prefix holding objects is no file, so no
        listing is asked after a 404, as `info` asks one (on a real store every request is
        ~10-50 ms on the run's critical path)."""
        listed = self._listed.get(self._strip_protocol(path))  # a listing's entries are objects
        return listed is not None or self.object_size(path) is not None

    def object_size(self, path: Any) -> int | None:
        """The size of the object at `path` in one HEAD (`remote.file_size`); None for none
        (a prefix, a bucket, nothing)."""
        import obstore

        try:
            store, _, key = self._split(path)
            if not key:
                return None
            with _errors(self._strip_protocol(path)):
                return int(obstore.head(store, key)["size"])
        except FileNotFoundError:
            return None
        except _Unrepresentable:
            s3fs = self._s3fs()
            return int(s3fs.info(path)["size"]) if s3fs.isfile(path) else None

    @_or_s3fs
    def ls(self, path: Any, detail: bool = True, **kwargs: Any) -> list[Any]:
        import obstore

        store, bucket, key = self._split(path)
        p = self._strip_protocol(path)
        with _errors(p):
            found = obstore.list_with_delimiter(store, f"{key}/" if key else None)
        out: list[dict[str, Any]] = [self._file(bucket, m) for m in found["objects"]]
        out += [{"name": f"{bucket}/{c.rstrip('/')}", "size": 0, "type": "directory"}
                for c in found["common_prefixes"]]  # fmt: skip
        if not out and key:
            with _errors(p):
                out = [self._file(bucket, obstore.head(store, key))]
        out.sort(key=lambda o: o["name"])  # s3fs lists in key order
        self._remember(out)
        return out if detail else [o["name"] for o in out]

    @_or_s3fs
    def find(self, path: Any, maxdepth: int | None = None, withdirs: bool = False,
             detail: bool = False, **kwargs: Any) -> Any:  # fmt: skip
        """Every object under the prefix `path` (or the object `path`) in one flat listing,
        the folders their keys imply too (`withdirs`: `path` itself among them, as s3fs
        gives), `maxdepth` levels down at most."""
        import obstore

        store, bucket, key = self._split(path)
        p = self._strip_protocol(path)
        out: dict[str, dict[str, Any]] = {}
        with _errors(p):
            for chunk in obstore.list(store, f"{key}/" if key else None, chunk_size=1000):
                for meta in chunk:
                    info = self._file(bucket, meta)
                    parts = info["name"][len(p) + 1 :].split("/")
                    if maxdepth is None or len(parts) <= maxdepth:
                        out[info["name"]] = info
                    for depth in range(len(parts)) if withdirs and key else ():
                        if maxdepth is None or depth <= maxdepth:
                            name = "/".join([p, *parts[:depth]])
                            out[name] = {"name": name, "size": 0, "type": "directory"}
            if not out and key:
                with contextlib.suppress(FileNotFoundError), _errors(p):
                    info = self._file(bucket, obstore.head(store, key))
                    out[info["name"]] = info
        names = dict(sorted(out.items()))
        self._remember(names.values())
        return names if detail else list(names)

    @_or_s3fs
    def cat_file(self, path: Any, start: int | None = None, end: int | None = None,
                 **kwargs: Any) -> bytes:  # fmt: skip
        import obstore

        store, _, key = self._split(path)
        with _errors(self._strip_protocol(path)):
            if start is None and end is None:
                return obstore.get(store, key).bytes().to_bytes()
            if start is None or start < 0 or end is None or end < 0:
                size = int(obstore.head(store, key)["size"])
                start = 0 if start is None else (start if start >= 0 else size + start)
                end = size if end is None else (end if end >= 0 else size + end)
            if end <= start:
                return b""
            return obstore.get_range(store, key, start=start, end=end).to_bytes()

    def _open(self, path: Any, mode: str = "rb", block_size: Any = None, autocommit: bool = True,
              cache_options: Any = None, **kwargs: Any) -> Any:  # fmt: skip
        if mode != "rb":
            raise NotImplementedError("NativeS3 opens objects for reading only")
        return _RangedFile(self, path, mode, block_size="default", cache_type="none")

    # -- writing --------------------------------------------------------------------------

    @_or_s3fs
    def pipe_file(self, path: Any, value: bytes, mode: str = "overwrite", **kwargs: Any) -> Any:
        import obstore

        store, _, key = self._split(path)
        self.invalidate_cache(path)
        with _errors(self._strip_protocol(path)):
            return obstore.put(store, key, value, mode=mode, use_multipart=False)

    @_or_s3fs
    def put_file(self, lpath: Any, rpath: Any, chunksize: int | None = None, **kwargs: Any) -> None:
        import obstore

        store, _, key = self._split(rpath)
        self.invalidate_cache(rpath)
        size = os.path.getsize(lpath)
        part = chunksize or PART_BYTES
        multipart = size > 2 * part
        try:
            with _errors(self._strip_protocol(rpath)):
                obstore.put(store, key, Path(lpath), use_multipart=multipart,
                            chunk_size=part, max_concurrency=UPLOAD_CONCURRENCY)  # fmt: skip
        except BaseException:
            if multipart:  # its parts, stored and billed until aborted (as s3fs does)
                self._abort(self._strip_protocol(rpath).partition("/")[0], key)
            raise

    def _abort(self, bucket: str, key: str) -> None:
        """Abort the unfinished multipart uploads of `key` (obstore's failed `put` leaves its
        own): every one of that key, as the upload id obstore started is not told."""
        with contextlib.suppress(Exception):
            found = self.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key)
            for u in found.get("Uploads") or []:
                if u["Key"] == key:
                    self.call_s3("abort_multipart_upload", Bucket=bucket, Key=key,
                                 UploadId=u["UploadId"])  # fmt: skip

    @_or_s3fs
    def rm_file(self, path: Any) -> None:
        """Delete one object (a missing one too, as S3 and s3fs do: no error)."""
        import obstore

        store, _, key = self._split(path)
        self.invalidate_cache(path)
        with _errors(self._strip_protocol(path)):
            obstore.delete(store, key)

    @_or_s3fs
    def rm(self, path: Any, recursive: bool = False, maxdepth: Any = None) -> None:
        import obstore

        paths = [path] if isinstance(path, str) else list(path)
        by_bucket: dict[str, list[str]] = {}
        for p in paths:
            bucket, _, key = self._strip_protocol(p).partition("/")
            by_bucket.setdefault(bucket, []).append(key)
            self.invalidate_cache(p)
        for bucket, keys in by_bucket.items():
            with _errors(bucket):
                for i in range(0, len(keys), 1000):
                    obstore.delete(self._store(bucket), keys[i : i + 1000])

    def _remember(self, infos: Any) -> None:
        with self._lock:
            new = {i["name"]: i for i in infos if i["type"] == "file"}
            fresh = [n for n in new if n not in self._listed]
            self._listed.update(new)
            if fresh:  # kept sorted, for an invalidation's range of names (bisect)
                self._names = sorted(self._names + fresh) if self._names else sorted(fresh)

    def invalidate_cache(self, path: Any = None) -> None:
        """Forget what listings said of `path` and the objects under it (of all: None)."""
        with self._lock:
            if path is None:
                self._listed.clear()
                self._names = []
                return
            p = self._strip_protocol(path)
            if self._listed.pop(p, None) is not None:
                at = bisect.bisect_left(self._names, p)
                if at < len(self._names) and self._names[at] == p:
                    del self._names[at]
            # `p/...` sorts between `p/` and `p0` ('0' follows '/'): one slice of the names
            lo, hi = (
                bisect.bisect_left(self._names, f"{p}/"),
                bisect.bisect_left(self._names, f"{p}0"),
            )
            for name in self._names[lo:hi]:
                self._listed.pop(name, None)
            del self._names[lo:hi]

    # -- what the lock asks s3fs's client for -------------------------------------------

    def call_s3(self, method: str, **kwargs: Any) -> dict[str, Any]:
        """The requests the lock and the uploads' cleanup make through s3fs's client: a put and
        a delete conditional on an ETag, listing and aborting unfinished multipart uploads."""
        import obstore

        bucket, key = kwargs.get("Bucket", ""), kwargs.get("Key", "")
        if key:
            self.invalidate_cache(f"{bucket}/{key}")
        if method == "put_object" and "IfMatch" in kwargs:
            mode = {"e_tag": kwargs["IfMatch"]}
            try:
                with _errors(f"{bucket}/{key}"), _conditional(f"{bucket}/{key}"):
                    out = obstore.put(
                        self._store(bucket), key, kwargs["Body"], mode=mode, use_multipart=False
                    )
            except _Unrepresentable:  # a `.` or `..` segment: s3fs, as every call on it
                return self._s3fs().call_s3(method, **kwargs)
            return {"ETag": out.get("e_tag")}
        signed = self._signed()
        if signed is None:  # credentials obstore found itself: s3fs signs these
            return self._s3fs().call_s3(method, **kwargs)
        if method == "delete_object" and "IfMatch" in kwargs:
            signed.delete_if_match(bucket, key, kwargs["IfMatch"])
            return {}
        if method == "list_multipart_uploads":
            found = signed.list_multipart_uploads(bucket, kwargs.get("Prefix", ""))
            return {"Uploads": [{"Key": k, "UploadId": u} for k, u in found], "IsTruncated": False}
        if method == "abort_multipart_upload":
            signed.abort_multipart_upload(bucket, key, kwargs["UploadId"])
            return {}
        return self._s3fs().call_s3(method, **kwargs)

    def _signed(self) -> Any:
        """The requests obstore does not make (`s3_requests`), or None where they cannot be
        signed here."""
        with self._lock:
            if self._requests is None:
                self._requests = s3_requests.S3Requests(self._options)
        return self._requests if self._requests.usable() else None

    def _s3fs(self) -> Any:
        """s3fs with the same options: for keys obstore cannot hold, and the conditional and
        multipart requests where obstore found the credentials itself."""
        with self._lock:
            if self._fallback is None:
                self._fallback = s3_requests.bounded_s3fs(self._options)
            return self._fallback


class _RangedFile(AbstractBufferedFile):
    """An object for random reads: each read one ranged GET (fsspec's `cache_type="none"`)."""

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.cat_file(self.path, start=start, end=end)
