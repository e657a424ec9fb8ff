"""Object storage, write side: what `writing.py` hands on for a URL.

An object store has no rename, no folder, no fsync and no `flock`; it has whole-object puts
(an object appears complete or not at all), multipart uploads, and conditional puts: create
only if absent on S3 (`If-None-Match: *`), GCS (`ifGenerationMatch=0`) and Azure
(`If-None-Match: *`), through fsspec's `mode="create"`; replace only one version (`If-Match:
ETAG`) on S3 and Azure. The write side is built on those:

- `upload` (a finished local file becomes an object: `writing.replace(local, url)`; one PUT up
  to 2 parts' worth, else a multipart upload in `part_size` parts, always under S3's 10,000-part
  limit, aborted by s3fs when a part or the completion fails; `abort_uploads` removes what a
  killed process left), `write_bytes` (a small object in one PUT), `create_exclusive`
  (a conditional put), `remove` / `remove_tree`.
- `take_lock`: the one-writer lock as a lock object created with `If-None-Match: *` and held by
  a lease: the holder rewrites it every `LEASE_S / 4` seconds with `If-Match` on its own ETag. A
  lock whose holder is gone (a dead pid of this host and pid namespace, or not renewed for
  `LEASE_S`) is taken over with `If-Match` on the stale ETag, so of two writers taking over the
  same stale lock exactly one succeeds. A holder whose renewal is refused has lost the lock (`lost`): its run
  then refuses to commit. Azure creates, renews and takes over the same way (adlfs hands
  `etag` / `match_condition` to `upload_blob`), but releases with a plain delete (adlfs's takes
  no ETag); on gs:// the lock is created conditionally but renewed and taken over with plain
  puts (gcsfs passes no generation match there); on hf:// and http(s):// a check, then a put
  (docs/remote.md says what each guarantees).

Failures are one line naming the URL (`remote.naming`).
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from packtool.errors import DataError, json_value
from packtool.storage.remote import (
    filesystem,
    modified_at,
    naming,
    object_at,
    object_etag,
    scheme,
)

MAX_PARTS = 10_000
"""S3's limit on the parts of one multipart upload."""
MIN_PART = 5 << 20
"""S3's smallest part (all but the last)."""
PART_BYTES = 64 << 20
"""The part size packtool asks for: 64 MiB parts (a 256 MB shard is 4 parts sent at once)."""
LEASE_ENV = "PACKTOOL_LOCK_LEASE_S"
LEASE_S = 120.0
"""Seconds a lock object stays valid without renewal (`PACKTOOL_LOCK_LEASE_S` changes it)."""


CREATES_CONDITIONALLY = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})
"""The schemes whose fsspec implementation makes `pipe_file(mode="create")` a conditional put
(s3fs, gcsfs and adlfs: a `FileExistsError` when the object is there)."""


def _is_s3(url: Any) -> bool:
    return scheme(url) in ("s3", "s3a")


def part_size(size: int, wanted: int | None = None) -> int:
    """The part size for an upload of `size` bytes: `wanted` (default `PART_BYTES`), grown so
    that the upload needs at most `MAX_PARTS - 1` parts (S3's largest object, 5 TiB, takes parts
    of ~525 MiB)."""
    wanted = PART_BYTES if wanted is None else wanted
    return max(MIN_PART, wanted, math.ceil(size / (MAX_PARTS - 1)))


def upload(local: str | os.PathLike, url: Any) -> None:
    """The local file `local` as the object `url` (whole, or not at all)."""
    fs, p = filesystem(url)
    size = os.path.getsize(local)
    with naming(url, "written"):
        if _is_s3(url):
            part = part_size(size)
            if size == 2 * part:
                # Up to two parts is one PUT (docs/remote.md), as obstore's put_file decides
                # (multipart above 2 x part); s3fs puts in one request only *below* 2 x
                # chunksize, so exactly two parts would be a multipart upload there.
                part += 1
            fs.put_file(os.fspath(local), p, chunksize=part)
        else:
            fs.put_file(os.fspath(local), p)


def write_bytes(url: Any, data: bytes) -> None:
    """`data` as the whole object `url` (one PUT: readers see the old object or the new one)."""
    fs, p = filesystem(url)
    with naming(url, "written"):
        fs.pipe_file(p, data)


def create_exclusive(url: Any, data: bytes) -> bool:
    """Create the object `url` holding `data` if none is there; False when one is. A check
    first (the usual answer, in one HEAD on S3), then on S3, GCS and Azure a conditional put:
    of several writers racing, exactly one succeeds. Elsewhere a plain put (two writers racing
    may both succeed: docs/remote.md)."""
    return _create_exclusive(url, data)[0]


def _create_exclusive(url: Any, data: bytes) -> tuple[bool, str | None]:
    """`create_exclusive`, and the new object's ETag where the store's answer to the put gave
    one and a put can be conditional on it (`REPLACES_IF_MATCH`): the lock's version, known
    without a HEAD after the put (which could even see a later writer's object)."""
    fs, p = filesystem(url)
    with naming(url, "written"):
        if object_at(fs, p):
            return False, None
        if scheme(url) in CREATES_CONDITIONALLY:
            try:
                out = fs.pipe_file(p, data, mode="create")
            except FileExistsError:
                return False, None
        else:
            out = fs.pipe_file(p, data)
    if scheme(url) not in REPLACES_IF_MATCH or not isinstance(out, dict):
        return True, None
    # obstore's PutResult (`e_tag`); boto3's (s3fs) and adlfs's answers as an `info` names it
    return True, out.get("e_tag") or object_etag(out)


def remove(url: Any) -> None:
    """Delete one object, if it is there."""
    fs, p = filesystem(url)
    with naming(url, "deleted"), contextlib.suppress(FileNotFoundError):
        fs.rm_file(p)
    fs.invalidate_cache(p)


def remove_tree(url: Any) -> None:
    """Delete every object under the prefix `url` (and the object `url` itself), if any."""
    fs, p = filesystem(url)
    with naming(url, "deleted"):
        fs.invalidate_cache(p)
        # One listing (find asks one HEAD of `p` itself where it lists nothing), and a HEAD for
        # an object that is also the prefix: no `isdir` first (a HEAD and a listing), which
        # cost the commit's clean-up two round trips a folder.
        keys = list(fs.find(p, withdirs=False))
        if keys and p not in keys and object_at(fs, p):
            keys.append(p)
        if keys:
            fs.rm(keys)
    fs.invalidate_cache(p)


def _uploads(url: Any, exact: bool) -> Iterator[tuple[str, str]]:
    """(key, upload id) of the unfinished multipart uploads of the object `url` (`exact`) or
    under the prefix `url` as a folder (`s3://b/ds` is not `s3://b/ds2`), every page of them."""
    fs, p = filesystem(url)
    bucket, _, key = p.rstrip("/").partition("/")
    prefix = key if exact else f"{key}/"
    args: dict[str, Any] = {"Bucket": bucket, "Prefix": prefix}
    while True:
        found = fs.call_s3("list_multipart_uploads", **args)
        for u in found.get("Uploads") or []:
            if not exact or u["Key"] == key:
                yield u["Key"], u["UploadId"]
        if not found.get("IsTruncated"):
            return
        args["KeyMarker"] = found.get("NextKeyMarker")
        args["UploadIdMarker"] = found.get("NextUploadIdMarker")


def abort_uploads(url: Any, exact: bool = False, only: Callable[[str], bool] | None = None) -> int:
    """Abort the unfinished multipart uploads under the prefix `url` (or of the object `url`,
    `exact`): a process killed during an upload leaves its parts stored and billed, invisible
    to listings; how many. `only`: those whose key below the prefix it takes. S3 only."""
    if not _is_s3(url):
        return 0
    fs, p = filesystem(url)
    bucket, _, prefix = p.rstrip("/").partition("/")
    aborted = 0
    with naming(url):
        for key, upload in list(_uploads(url, exact)):
            if only is not None and not only(key[len(prefix) + 1 :]):
                continue
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
            aborted += 1
    return aborted


def uploads_in_progress(url: Any, exact: bool = False) -> list[str]:
    """The keys of the unfinished multipart uploads under the prefix `url` (S3 only)."""
    if not _is_s3(url):
        return []
    with naming(url):
        return [key for key, _ in _uploads(url, exact)]


# --- one writer --------------------------------------------------------------------------------


def lease_s() -> float:
    try:
        return max(float(os.environ.get(LEASE_ENV, LEASE_S)), 1.0)
    except ValueError:
        return LEASE_S


class RemoteLockBusy(Exception):
    """Another writer holds the lock object; `holder` is what it wrote there."""

    def __init__(self, holder: bytes) -> None:
        super().__init__("lock held")
        self.holder = holder


class RemoteLock:
    """The lock object, held under a lease renewed by a background thread until `release`."""

    def __init__(self, url: Any, etag: str | None, data: bytes) -> None:
        self.url = url
        self._etag = etag
        self._data = data
        self.lost = False
        """The store refused a renewal: another writer took the lock over."""
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._renew, name="packtool-lock", daemon=True)
        self._thread.start()

    def write(self, data: bytes) -> None:
        """`data` as the lock object's content (the note naming the holder)."""
        with self._mutex:
            self._data = data
            self._put()

    def _put(self) -> None:
        if self.lost:
            return
        try:
            self._etag = _put_if_match(self.url, self._data, self._etag) or self._etag
        except _Changed:  # the object is no longer ours
            self.lost = True

    def confirm(self) -> bool:
        """Renew the lease now, conditionally on this holder's version of the lock object: False
        (and `lost`) when it is another writer's or gone. Where puts cannot be conditional (GCS,
        http) a plain renewal, which cannot tell."""
        with self._mutex:
            try:
                self._put()
            except FileNotFoundError:  # taken over and released since: no longer ours
                self.lost = True
        return not self.lost

    def _renew(self) -> None:
        while not self._stop.wait(lease_s() / 4):
            try:
                with self._mutex:
                    self._put()
            except Exception:  # a store hiccup: the next renewal tries again
                continue

    def release(self) -> None:
        """Stop renewing and delete the lock object (only the version this holder wrote).
        Again: nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        if self.lost:
            return
        fs, p = filesystem(self.url)
        try:
            if _is_s3(self.url):
                bucket, _, key = p.partition("/")
                fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=self._etag)
            else:
                fs.rm_file(p)
        except Exception:  # taken over meanwhile, or gone: not ours to delete
            pass
        fs.invalidate_cache(p)


def host_tag() -> str:
    """This host and process-id namespace, in 8 hex characters: whose pids a process may ask
    about. A scratch folder on a shared file system holds other hosts' temporaries, and one
    shared by containers of one host name (host networking, a hostPath scratch) other
    namespaces', and a lock object names a holder that may be either: a live writer there
    looked dead (its temporary deleted, its lock taken over at once)."""
    import hashlib

    try:
        space = str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:  # not Linux: the host name alone
        space = ""
    return hashlib.sha256(f"{socket.gethostname()}:{space}".encode()).hexdigest()[:8]


def _holder_gone(note: bytes, modified: float | None) -> bool:
    """A lock whose holder cannot be alive: a dead pid of this host and pid namespace (the
    note's `tag`, `host_tag`; a note without one, an older packtool's: its host name alone), or
    no renewal for a lease. A holder in another namespace of the same host name (a container)
    is judged by its lease only: its pid is not ours to ask about (until 2026-12-06 it was,
    and a live writer there lost its lock at once)."""
    try:
        info = json_value(note or b"{}")
    except ValueError:
        info = {}
    if (
        isinstance(info, dict)
        and info.get("host") == socket.gethostname()
        and info.get("tag", host_tag()) == host_tag()
        and "pid" in info
    ):
        try:
            os.kill(int(info["pid"]), 0)
        except ProcessLookupError:
            return True
        except (PermissionError, ValueError, OverflowError):
            pass
    if modified is None:
        return False
    return time.time() - modified > lease_s()


REPLACES_IF_MATCH = frozenset({"s3", "s3a", "az", "abfs", "abfss"})
"""The schemes where a put can be made conditional on the object's ETag through fsspec (S3's
`IfMatch`; adlfs hands `etag` / `match_condition` to Azure's `upload_blob`)."""


class _Changed(DataError):
    """A conditional put refused (412): the object is no longer the version it names (a
    `DataError`, so that `naming` passes it on as it is)."""


def _etag_of(url: Any, info: dict[str, Any] | None = None) -> str | None:
    """The ETag of the object `url` (its `info`, else one HEAD) where a put can be conditional
    on it (`REPLACES_IF_MATCH`), else None."""
    if scheme(url) not in REPLACES_IF_MATCH:
        return None
    if info is None:
        fs, p = filesystem(url)
        with naming(url):
            info = fs.info(p)
    return object_etag(info)


def _put_if_match(url: Any, data: bytes, etag: str | None) -> str | None:
    """`data` as the object `url` if it is still the version `etag`; its new ETag. Raises
    `_Changed` when it is not. Where the store has no such put through fsspec, or `etag` is
    None: a plain put (None)."""
    fs, p = filesystem(url)
    if etag is None or scheme(url) not in REPLACES_IF_MATCH:
        write_bytes(url, data)
        return None
    with naming(url):
        if _is_s3(url):
            bucket, _, key = p.partition("/")
            try:
                out = fs.call_s3("put_object", Bucket=bucket, Key=key, Body=data, IfMatch=etag)
            except OSError as exc:  # 412, or 409 ConditionalRequestConflict (a concurrent one)
                said = str(exc).lower().replace("-", "")
                if "precondition" in said or "conditionalrequestconflict" in said:
                    raise _Changed(f"{url}: changed") from None
                raise
            return out.get("ETag")
        from azure.core import MatchConditions

        try:
            out = fs.pipe_file(p, data, etag=etag, match_condition=MatchConditions.IfNotModified)
        except Exception as exc:  # azure.core's ResourceModifiedError (412), not imported here
            if getattr(exc, "status_code", None) == 412 or "ConditionNotMet" in str(exc):
                raise _Changed(f"{url}: changed") from None
            raise
        return out.get("etag") if isinstance(out, dict) else None


def take_lock(url: Any, note: bytes = b"") -> RemoteLock:
    """The lock object `url`, created or taken over from a holder that is gone.

    Raises:
        RemoteLockBusy: a live writer holds it.
    """
    fs, p = filesystem(url)
    for _ in range(5):
        fs.invalidate_cache(p)
        created, etag = _create_exclusive(url, note)
        if created:  # the put's own answer names its version, else one HEAD asks
            return RemoteLock(url, etag or _etag_of(url), note)
        try:
            with naming(url):
                info = fs.info(p)
                holder = fs.cat_file(p)
        except Exception:  # released between our put and our read: try again
            time.sleep(0.05)
            continue
        seen = _etag_of(url, info)
        if note and holder == note:  # our own put, whose answer was lost and retried (412)
            return RemoteLock(url, seen, note)
        if not _holder_gone(holder, modified_at(info)):
            raise RemoteLockBusy(holder)
        try:  # of writers taking over one stale lock, one wins where puts can be conditional
            taken = _put_if_match(url, note, seen)
        except _Changed:  # another writer took it over first
            continue
        return RemoteLock(url, taken, note)
    with naming(url):
        holder = fs.cat_file(p) if fs.exists(p) else b""
    raise RemoteLockBusy(holder)
