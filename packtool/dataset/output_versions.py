"""The versions of an output in an object store, and what packtool may do with a folder it finds.

An output in a bucket (packtool/dataset/output.py, docs/remote.md "Writing") is a link
`index.json` naming a version folder `v-<UTC time>-<8 hex>/`, and, while a run writes,
`.packtool-staging` naming the version it builds. Here:

- `new_version` / `is_version`: the names (a name of another shape is never a version);
- `staging_version` / `current_version`: what `.packtool-staging` and the link name;
- `ours`: whether a folder holds only names packtool's commands write (a local staging, ready
  or old folder; a version in a bucket): only such a folder is ever deleted or switched in;
- `switch_problem`: why a staging whose `index.json` is written must not be switched in;
- `staging_known` / `create_staging_record` / `remove_staging_record`: while this process
  holds the output's lock, `.packtool-staging` is read once and then known (only the lock's
  holder writes it, through these);
- `collect` / `clean_after_switch`: what a writer deletes under the prefix, the first under the
  lock before its run (a killed run's leftovers), the second after its link (its run's state
  and staging object, the old version, unfinished uploads).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

from packtool.dataset.manifest import (
    GROUPS_FILE,
    INDEX_FILE,
    SOURCES_FILE,
    linked_version,
    read_manifest,
)
from packtool.dataset.names import RUN_STATE, is_shard_name, written_entry
from packtool.errors import ConfigError, DataError, PacktoolError, json_value
from packtool.storage import local as storage
from packtool.storage import remote_write, writing

REMOTE_STAGING = ".packtool-staging"
"""The object under a remote output's prefix that names its run in progress."""
_VERSION = re.compile(r"v-\d{8}T\d{6}-[0-9a-f]{8}")


def new_version() -> str:
    """A fresh version name: `v-<UTC time>-<8 random hex>` (sorts by time; never reused)."""
    import time
    import uuid

    return f"v-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"


def is_version(name: str) -> bool:
    """A version folder's name (`new_version`: digits where the time is, hex after)."""
    return _VERSION.fullmatch(name) is not None


_UNREAD = object()
_KNOWN: dict[str, object] = {}
"""What `.packtool-staging` of each remote output whose lock this process holds says (`_UNREAD`
until read): `staging_known`."""


@contextlib.contextmanager
def staging_known(target: Path) -> Iterator[None]:
    """While this process holds the lock of the remote output `target` (`output.transaction`):
    its `.packtool-staging` is read once and then known, as only the lock's holder writes it,
    and only through `create_staging_record` / `remove_staging_record`, which keep what is
    known. A run read it five times before its plan, a request each (10-50 ms on a real store,
    on the run's critical path). A holder that lost its lock (its lease ran out) may know an
    object another writer replaced since: what it then writes naming its run is refused
    anyway (its renewal fails before its staging object and its link; the staging object is
    created only where none is)."""
    key = str(target)
    _KNOWN[key] = _UNREAD
    try:
        yield
    finally:
        _KNOWN.pop(key, None)


def _known(target: Path, record: object) -> None:
    if str(target) in _KNOWN:
        _KNOWN[str(target)] = record


def create_staging_record(target: Path, record: dict) -> bool:
    """Create `.packtool-staging` of the remote output `target` holding `record`, only where no
    object is there (a conditional put where the store has one); False when another one is."""
    data, pointer = json.dumps(record).encode(), target / REMOTE_STAGING
    _known(target, _UNREAD)  # until the answer: a failure leaves it unknown
    created = writing.create_exclusive(pointer, data)
    # (Not created but equal: this run's own put, applied but its answer lost, and refused
    # when the client retried it. The version's random name makes the record this run's.)
    if created or _read_or_none(pointer) == data:
        _known(target, json.loads(data))
        return True
    return False


def _read_or_none(path: Path) -> bytes | None:
    """The object's bytes; None when it is not there (a bucket's read says so as a
    `DataError`, "no such object": asked again, so that other failures stay what they are)."""
    try:
        return storage.read_bytes(path)
    except (FileNotFoundError, DataError):
        if storage.exists(path):
            raise
        return None


def remove_staging_record(target: Path) -> None:
    """Delete `.packtool-staging` of the remote output `target`, if it is there."""
    _known(target, _UNREAD)
    writing.remove_file(target / REMOTE_STAGING)
    _known(target, None)


def staging_record(target: Path) -> dict | None:
    """What `.packtool-staging` of the remote output `target` says (None: no run in progress):
    `version`, the version the run builds, and `replaces`, the version the link named when the
    run began (absent where an older packtool wrote it). Read once while this process holds
    the output's lock (`staging_known`)."""
    known = _KNOWN.get(str(target), _UNREAD)
    if known is not _UNREAD:
        return None if known is None else dict(known)  # type: ignore[call-overload]
    record = _read_staging_record(target)
    _known(target, record)
    return None if record is None else dict(record)


def _read_staging_record(target: Path) -> dict | None:
    pointer = target / REMOTE_STAGING
    if not storage.is_file(pointer):
        return None
    try:
        record = json_value(storage.read_text(pointer))
    except ValueError:
        record = None
    version = record.get("version") if isinstance(record, dict) else None
    if not isinstance(version, str) or not is_version(version):
        raise ConfigError(f"{pointer}: damaged (names no version); delete it and rerun")
    return record


def staging_version(target: Path) -> str | None:
    """The version the run in progress into the remote output `target` builds, if any."""
    record = staging_record(target)
    return None if record is None else record["version"]


def current_version(target: Path) -> str | None:
    """The version the link `index.json` of a remote output names (None: no dataset yet)."""
    return linked_version(target / INDEX_FILE)  # one HEAD: absent is None too


def ours(folder: Path) -> bool:
    """Whether `folder` is one packtool's commands write: a real folder whose entries are all
    shards or parts, the manifest and its lists of sources and groups, a run's state or
    temporaries, each of the kind packtool writes it (`names.written_entry`; in a bucket: a
    version holding only such names)."""
    if storage.is_remote(folder):  # its one listing (none: no version), no `is_dir` first
        entries = storage.scan_dir(folder)
        return bool(entries) and all(written_entry(e.name, f, parts=True) for e, f in entries)
    if storage.is_symlink(folder) or not storage.is_dir(folder):
        return False
    # One listing, which says which entries are files (objects): no request per entry.
    return all(written_entry(e.name, file, parts=True) for e, file in storage.scan_dir(folder))


def switch_problem(staging: Path) -> str | None:
    """Why the dataset in `staging`, whose `index.json` is written, must not be switched in
    (None: it may be): its `index.json` is not a packtool manifest (`read_manifest`: the types
    and `manifest_check`'s identities), the folder holds files packtool did not write, or a
    shard the manifest lists is missing or not of the size it records."""
    try:
        manifest = read_manifest(staging / INDEX_FILE)
    except PacktoolError as exc:
        said = str(exc).removeprefix(f"{staging / INDEX_FILE}: ")
        return f"its index.json is not a manifest of a packtool dataset ({said})"
    if not ours(staging):
        return "it holds files packtool did not write"
    for shard in manifest.shards:
        path = staging / shard.file
        if not storage.is_file(path) or storage.stat(path).st_size != shard.bytes:
            return f"{shard.file}, which its index.json lists, is missing or not whole"
    return None


def remove(path: Path) -> None:
    """Delete a file or a folder tree, if it is there."""
    writing.remove_tree(path)


def collect(target: Path) -> None:
    """A remote output's `recover`: delete every version that neither the link `index.json` nor
    the staging object names, and abort the unfinished multipart uploads in its versions when
    a run did not finish (a staging object or a stray version says so: a run's uploads start
    after it writes the staging object, which stays until its commit or its failure's discard,
    which aborts its own), saving a request of its own every run. (A commit's own clean-up is
    `clean_after_switch`.)"""
    record = staging_record(target)
    staging = None if record is None else record["version"]
    linked = current_version(target)
    # A commit cut after its switch (it is over), or a run built to replace a version the link
    # no longer names: another writer committed since, so its writer had lost the lock (no run
    # can commit it now; its version is collected below when it holds only packtool's names).
    stale = record is not None and record.get("replaces", linked) != linked
    if staging is not None and (staging == linked or stale):
        if staging == linked:  # the run's state, which its commit deletes after the switch
            remove(target / staging / RUN_STATE)
        remove_staging_record(target)
        staging = None
    stray = _stray_versions(storage.list_dir(target), {linked, staging})
    if stray or staging is not None:
        remote_write.abort_uploads(target, only=_in_a_version)
    for entry in stray:
        remove(entry)


def _in_a_version(key: str) -> bool:
    """A key below a remote output's prefix inside one of its versions: the only objects of it
    a run uploads in parts (shards). Another output's under the prefix (`-o s3://b/d/inner`
    beside `-o s3://b/d`, with a lock of its own) is not this output's to abort."""
    return is_version(key.split("/", 1)[0])


def _stray_versions(entries: list[Path], keep: set[str | None]) -> list[Path]:
    """The versions among `entries` (a remote output's listing) not in `keep`. Only a folder
    packtool wrote: a version's name, holding only packtool's names (a user's `v-...` folder of
    other files, or another shape of name, is never deleted)."""
    return [e for e in entries if is_version(e.name) and e.name not in keep and ours(e)]


def clean_after_switch(target: Path, version: str) -> None:
    """The end of a remote commit, once the link names the new version: the run's state and its
    staging object go; every unfinished multipart upload in its versions is aborted (a worker
    that died mid-upload in a run that then succeeded, its partition retried elsewhere, left
    its parts); every other version packtool wrote is deleted (but another run's staging,
    which cannot exist under the lock and is never deleted), with the files of an unversioned
    dataset the link replaced (copied in with `aws s3 sync`, say: its shards at the top, which
    went on beside the new version for good). The requests go side by side (a commit on a
    loopback store took 0.15-0.20 s one after another), but for the staging object: read once
    before it is deleted or kept, and deleted only after the run state. The first failure is
    raised once all have ended."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4, thread_name_prefix="packtool-commit") as pool:
        state = pool.submit(remove, target / version / RUN_STATE)  # kept till now: `RUN_STATE`
        done = [state, pool.submit(remote_write.abort_uploads, target, only=_in_a_version)]
        listing = pool.submit(storage.scan_dir, target)
        record = staging_record(target)
        if record is not None and record["version"] == version:  # never another run's

            def staging_after_state() -> None:
                # Only once the run state is gone: `recover` deletes a linked version's state
                # only while a staging object names it (a kill in between left it for good).
                state.result()
                remove_staging_record(target)

            done.append(pool.submit(staging_after_state))
        other = None if record is None else record["version"]
        entries = listing.result()
        stray = _stray_versions([e for e, file in entries if not file], {version, other})
        done += [pool.submit(remove, entry) for entry in stray]
        # One object each, never what is under a prefix of its name (a user's notes in
        # `shard-x.parquet/` went with it until 2026-12-06).
        unversioned = [e for e, file in entries if file and _unversioned_file(e.name)]
        done += [pool.submit(writing.remove_file, entry) for entry in unversioned]
        for job in done:
            job.exception()  # wait for every one before raising any
        for job in done:
            job.result()


def _unversioned_file(name: str) -> bool:
    """A file of a dataset written straight into a prefix (no version folder): its shards and
    its lists of sources and groups (its `index.json` is the link now). An object of such a
    name: a prefix of that name is no file of a dataset, and is never deleted."""
    return is_shard_name(name) or name in (SOURCES_FILE, GROUPS_FILE)
