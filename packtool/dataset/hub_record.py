"""The record beside a Hub output's staging folder (`replaces.json`): what the run replaces and
what it commits.

An `hf://` output is built on this machine and published in one commit (packtool/storage/hub.py,
packtool/dataset/output.py). Two facts about a run outlive it here, for the run that commits
later (`pack --resume`) or finds out what happened:

- `replaces`: the version the prefix's link named when the run began. A commit over a dataset
  another writer committed to the prefix since is refused (`check`).
- `commits`: the version a commit publishes, written just before it. A run that never heard the
  Hub's answer (a timeout after the Hub applied it, a kill just after) tells from the link
  whether it landed (`landed`).

Only `pack` writes the record (`tokenize` has no `--resume`); its presence marks a `pack` build
waiting in the staging folder (`build_waits`), which this machine's `tokenize` of the same URL
shares and must not discard unasked. Records in and out: one small JSON file, read and written
whole (a handful of bytes).
"""

from __future__ import annotations

import json
from pathlib import Path

from packtool.dataset.manifest import INDEX_FILE, linked_version
from packtool.errors import OVERWRITE, ConfigError, DataError, json_value
from packtool.storage import local as storage
from packtool.storage import writing

RECORD = "replaces.json"


def path(staging: Path) -> Path:
    """The record of the staging folder `staging` (beside it)."""
    return staging.with_name(RECORD)


def begin(staging: Path, replaces: str | None) -> None:
    """A new run: the version the link names now (None: no dataset yet)."""
    writing.write_atomic(path(staging), json.dumps({"replaces": replaces}).encode())


def remove(staging: Path) -> None:
    writing.remove_file(path(staging))


def _read(staging: Path) -> dict | None:
    """The record, or None where there is none (tokenize's staging). A damaged one is an error:
    read as absent, it would let a commit pass over another writer's dataset unchecked."""
    try:
        record = json_value(storage.read_text(path(staging)))
    except FileNotFoundError:
        return None
    except ValueError:
        record = None
    if not isinstance(record, dict):
        raise DataError(f"{path(staging)}: damaged; rerun with {OVERWRITE} to start over")
    return record


def check(staging: Path, shown: str, now: str | None) -> None:
    """Refuse to commit over a dataset committed to the prefix after the run began (by another
    writer; `--resume` of a refused commit would otherwise replace it unasked)."""
    record = _read(staging)
    if record is None:
        return  # tokenize's staging: no --resume, the parent commit is its check
    began = record.get("replaces")
    if began != now:
        raise ConfigError(
            f"{shown}: another writer committed a dataset there ({now}) after this run "
            f"began (over {began or 'nothing'}); not replaced. To replace it, run again with "
            f"{OVERWRITE} (this run's build is discarded)"
        )


def note_commit(staging: Path, version: str) -> None:
    """Record, before the commit, the version it publishes (see `landed`)."""
    record = _read(staging)
    if record is None:
        return  # tokenize's staging: nothing to resume
    writing.write_atomic(path(staging), json.dumps({**record, "commits": version}).encode())


def landed(staging: Path, target: Path) -> str | None:
    """The version an earlier run's commit published after all, or None (the link names another
    version: the commit did not happen; or no commit was tried)."""
    record = _read(staging)
    tried = record.get("commits") if record else None
    if not tried or linked_version(target / INDEX_FILE) != tried:
        return None
    return tried


def build_waits(staging: Path) -> bool:
    """The staging folder holds a `pack` build, waiting for `--resume` to commit it."""
    return storage.exists(staging) and storage.is_file(path(staging))
