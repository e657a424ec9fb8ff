"""Per-group totals of a `--group-by` dataset: in `index.json`, or past `INLINE_GROUPS` groups in
`groups.json` beside it.

Each group records its rows, tokens and efficiency (~100 bytes of `index.json` a group), and
every loader rank, `verify` and `inspect` parse `index.json` at open: with `--group-by source`
over 10^6 files that was ~100 MB read and checked before the first batch. As `sources.json`
holds a long list of input files (packtool/read/docids.py), `GROUPS_FILE` holds a long list of
groups: `index.json` then records only its name, the number of groups and its sha256
(`extra.groups_file`), nothing reads it at open, and `verify` reads it and checks it as it
checks groups kept inline (`read_groups`: the digest, each group's counts, their sums).

The file is one JSON object, a group a line, written as the driver streams its running sums (no
second copy of them): `{"groups": {"NAME": {"rows": R, "tokens": T, "efficiency": E}, ...}}`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

from packtool.dataset.manifest import GROUPS_FILE, Manifest
from packtool.dataset.manifest_check import groups_problem
from packtool.errors import DataError, json_value
from packtool.storage import local as storage
from packtool.storage import writing

INLINE_GROUPS = 1000
"""Up to this many groups are listed inside `index.json`; more go to `GROUPS_FILE`."""


def entry(rows: int, tokens: int, max_len: int) -> dict[str, Any]:
    """What a group records: its rows and tokens, and its efficiency to 6 decimals."""
    return {"rows": rows, "tokens": tokens, "efficiency": round(tokens / max(rows * max_len, 1), 6)}


def record(work: Any, groups: Mapping[str, tuple[int, int]], max_len: int) -> dict[str, Any]:
    """What `index.json` records of `groups` (name -> (rows, tokens), in the order to list them)
    in its `extra`: `{"groups": {...}}`, or past `INLINE_GROUPS` the record of `GROUPS_FILE`,
    written into the folder `work` (`{"groups_file": {"file", "num_groups", "sha256"}}`)."""
    if len(groups) <= INLINE_GROUPS:
        return {"groups": {k: entry(r, t, max_len) for k, (r, t) in groups.items()}}
    digest = hashlib.sha256()
    with writing.atomic_output(work / GROUPS_FILE, make_parent=True) as f:
        batch: list[str] = []
        for piece in _pieces(groups, max_len):
            batch.append(piece)
            if len(batch) == 10_000:  # a write per batch, never the whole text at once
                data = "".join(batch).encode()
                f.write(data)
                digest.update(data)
                batch = []
        data = "".join(batch).encode()
        f.write(data)
        digest.update(data)
    info = {"file": GROUPS_FILE, "num_groups": len(groups), "sha256": digest.hexdigest()}
    return {"groups_file": info}


def _pieces(groups: Mapping[str, tuple[int, int]], max_len: int) -> Iterator[str]:
    """`GROUPS_FILE`'s text, a group a line."""
    yield '{"groups": {'
    sep = "\n"
    dumps = encode_basestring_ascii  # what json.dumps does to a name
    for k, (r, t) in groups.items():
        efficiency = round(t / max(r * max_len, 1), 6)  # `entry`, written out: 3x faster
        yield f'{sep}{dumps(k)}: {{"rows": {r}, "tokens": {t}, "efficiency": {efficiency!r}}}'
        sep = ",\n"
    yield "\n}}\n"


def read_groups(manifest: Manifest, directory: Any) -> dict[str, dict[str, Any]]:
    """Every group's record (`entry`), from `index.json` or from `GROUPS_FILE` in `directory`
    (the dataset folder); {} for a dataset packed without `--group-by`.

    A file's groups are checked as `read_manifest` checks groups kept inline (each one's counts
    and efficiency, and that they add up to the dataset's rows and tokens), after its sha256
    against the one `index.json` records.

    Raises:
        DataError: the file is missing, changed, or not what `index.json` says, in one line
            naming it.
    """
    extra = manifest.extra
    info = extra.get("groups_file")
    if info is None:
        return dict(extra.get("groups") or {})
    path = storage.as_path(directory) / info["file"]
    try:
        raw = storage.read_bytes(path)  # a regular file only (a FIFO would hang the read)
    except OSError as exc:
        raise DataError(f"{path}: unreadable list of groups ({exc})") from None
    if hashlib.sha256(raw).hexdigest() != info["sha256"]:
        raise DataError(
            f"{path}: its sha256 is not the one index.json records (groups_file.sha256): the "
            "list of groups was changed or damaged"
        )
    try:
        groups = json_value(raw)["groups"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: unreadable list of groups ({exc})") from None
    if not isinstance(groups, dict):
        raise DataError(f"{path}: groups is {groups!r}; expected an object of groups")
    problem = groups_problem(groups, manifest.counts, manifest.max_len, "groups")
    if problem is None and len(groups) != info["num_groups"]:
        problem = f"{len(groups):,} groups; index.json records {info['num_groups']:,}"
    if problem is not None:
        raise DataError(f"{path}: {problem}")
    return groups
