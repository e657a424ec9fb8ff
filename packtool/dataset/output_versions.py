"""The versions of an output in an object store, and what packtool may do with a folder it finds.

An output in a bucket (packtool/dataset/output.py, docs/remote.md "Writing") is a link
`index.json` naming a version folder `v-<UTC time>-<8 hex>/`, and, while a run writes,
`.packtool-staging` naming the version it builds. Here:

- `new_version` / `is_version`: the names (a name of another shape is never a version);
- `staging_version` / `current_version`: what `.packtool-staging` and the link name;
- `ours`: whether a folder holds only names packtool's commands write (a local staging, ready
  or old folder; a version in a bucket): only such a folder is ever deleted or switched in;
- `switch_problem`: why a staging whose `index.json` is written must not be switched in.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from packtool.dataset.manifest import INDEX_FILE, linked_version, read_manifest
from packtool.dataset.names import written_entry
from packtool.errors import ConfigError, PacktoolError
from packtool.storage import local as storage

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


def staging_record(target: Path) -> dict | None:
    """What `.packtool-staging` of the remote output `target` says (None: no run in progress):
    `version`, the version the run builds, and `replaces`, the version the link named when the
    run began (absent where an older packtool wrote it)."""
    pointer = target / REMOTE_STAGING
    if not storage.is_file(pointer):
        return None
    try:
        record = json.loads(storage.read_text(pointer))
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
    shards or parts, the manifest and its sources list, a run's state or temporaries, each of the
    kind packtool writes it (`names.written_entry`; in a bucket: a version holding only such
    names)."""
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
