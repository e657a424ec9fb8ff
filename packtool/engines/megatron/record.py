"""What a finished `tokenize --to megatron` pair keeps of the run that wrote it, for `--resume`.

`pack` keeps its run's fingerprint in `index.json` (`extra.fingerprint`), so `--resume` of a
finished dataset can refuse other options or inputs. A Megatron pair has no such file: the
`.bin` and `.idx` are formats megatron-core fixes (and the pair is byte for byte its builder's),
with no room for anything else. So the run writes a small JSON record beside the pair,
`.PREFIX.idx.packtool.json`: a hidden name, as the run's lock and staging folder have, which
Megatron never opens (it reads `PREFIX.bin` and `PREFIX.idx` only) and which packtool's walk of
an input folder leaves out. It holds:

- `fingerprint`: the digest `index.json` would keep (`resume_checks.fingerprint_digest`: options,
  tokenizer, input files with their sizes);
- `settings`: the options and tokenizer themselves (a few hundred bytes), so a refusal names
  what differs; `inputs`: the number of input files and the digest of their names and sizes;
- `bin_bytes`, `idx_bytes`: the sizes of the pair it describes.

It moves into place with the pair (the swap: after the `.bin`, before the `.idx`, so while the
`.idx` exists the record beside it is its run's), and a pair whose sizes are not the record's
was written by something else over packtool's (a record left behind): it decides nothing. A
pair written before the record (or without it: a copy of the two files) is taken as complete,
as `pack` takes a dataset from before its digest, and `--resume` says it could not check it.
Options that never change the bytes do not count: the partition size is compared as recorded
(`SAME_BYTES`); the workers and the engine are in no fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from packtool.engines.differences import listed, setting_differences
from packtool.engines.resume_checks import fingerprint_digest
from packtool.errors import OVERWRITE, AlreadyComplete, ConfigError, json_value
from packtool.storage import local as storage
from packtool.storage import writing

RECORD_SUFFIX = ".packtool.json"
"""After the `.idx`'s name, behind a dot: `.corpus.idx.packtool.json`."""
READY_RECORD = "ready.json"
"""In the staging folder: the finished pair's record, waiting for the swap with `ready.idx`."""
FORMAT_KEY = "packtool_megatron_record"
SAME_BYTES = ("partition_size",)
"""Settings of the fingerprint that never change the pair's bytes (run.py: the pair is the same
whatever the partition size; workers and engine are not in the fingerprint at all). An
interrupted run's plan depends on them, so its saved state keeps them and a resume of it must
match (`check_fingerprint`); a finished pair is compared with them taken as recorded."""


def record_path(idx_path: Any) -> Any:
    """Where the record of the pair whose index is `idx_path` is (beside it, hidden)."""
    return idx_path.parent / f".{idx_path.name}{RECORD_SUFFIX}"


def record_of(fingerprint: dict[str, Any], bin_bytes: int, idx_bytes: int) -> dict[str, Any]:
    """The record of a finished pair of `bin_bytes` and `idx_bytes` made by `fingerprint`."""
    inputs = [f[:2] for f in fingerprint["inputs"]]  # names and sizes, as the digest takes them
    return {
        FORMAT_KEY: 1,
        "fingerprint": fingerprint_digest(fingerprint),
        "settings": {k: v for k, v in fingerprint.items() if k != "inputs"},
        "inputs": {"files": len(inputs), "sha256": _digest(inputs)},
        "bin_bytes": bin_bytes,
        "idx_bytes": idx_bytes,
    }


def write_record(
    path: str | os.PathLike, fingerprint: dict[str, Any], bin_bytes: int, idx_bytes: int
) -> None:
    """Write the record (complete or absent) into the staging folder, before `ready.idx`."""
    record = record_of(fingerprint, bin_bytes, idx_bytes)
    writing.write_atomic(path, (json.dumps(record, indent=1) + "\n").encode())


def check_finished(fingerprint: dict[str, Any], bin_path: Path, idx_path: Path, shown: str) -> None:
    """`--resume` of a finished pair: `AlreadyComplete` when its record says this run's options
    and inputs made it, or when no record of it can tell (a pair from before the record, one
    another tool wrote); a `ConfigError` when the record says other ones did, or when the `.bin`
    is missing (no dataset: until 2026-12-06 its missing size read as "no record", so a
    requeued job was told "already complete" and trained on an `.idx` alone)."""
    if not storage.is_file(bin_path):
        raise ConfigError(
            f"cannot resume {shown}: {idx_path} exists but {bin_path} does not, so there is no "
            f"dataset to keep; rerun with {OVERWRITE} to write the pair again"
        )
    record = recorded(bin_path, idx_path)
    if record is not None:
        fingerprint = _as_recorded(fingerprint, record)
    if record is not None and record["fingerprint"] != fingerprint_digest(fingerprint):
        raise ConfigError(
            f"cannot resume {shown}: it is a finished pair of other options or inputs"
            f"{_differences(record, fingerprint)}; use {OVERWRITE} to replace it"
        )
    note = "" if record is not None else f" (not checked against this run: {_no_record(idx_path)})"
    raise AlreadyComplete(
        f"{shown} is already complete ({idx_path} exists): nothing to resume, nothing done{note}",
        shown,
    )


def _as_recorded(fingerprint: dict[str, Any], record: dict[str, Any]) -> dict[str, Any]:
    """`fingerprint` with the `SAME_BYTES` settings the record keeps: until 2026-12-06 `--resume`
    of a finished pair with another `--partition-size` was refused as "other options", though
    the bytes are the same. (The record's digest still covers them: records written before
    keep theirs, and compare the same way.)"""
    settings = record.get("settings")
    if not isinstance(settings, dict):
        return fingerprint
    kept = {k: settings[k] for k in SAME_BYTES if k in settings and k in fingerprint}
    return {**fingerprint, **kept}


def recorded(bin_path: Path, idx_path: Path) -> dict[str, Any] | None:
    """The record of the pair, or None when there is none that describes these two files."""
    path = record_path(idx_path)
    try:
        if not storage.is_file(path):
            return None
        record = json_value(storage.read_text(path))
        sizes = (storage.size(bin_path), storage.size(idx_path))
        if (record["bin_bytes"], record["idx_bytes"]) != sizes:
            return None  # a record left beside a pair something else wrote
        if not isinstance(record["fingerprint"], str):
            return None
        return record
    except (OSError, ValueError, KeyError, TypeError):  # damaged: it tells nothing
        return None


def _differences(record: dict[str, Any], fingerprint: dict[str, Any]) -> str:
    """` (what differs)`, as far as the record tells: the settings by name, with their values;
    the inputs by their number, else as other names or sizes (the record keeps their digest)."""
    now = record_of(fingerprint, 0, 0)
    differ = []
    was, files = record.get("inputs"), now["inputs"]["files"]
    if isinstance(was, dict) and was != now["inputs"]:
        count = was.get("files")
        differ.append(
            f"inputs: {files} file{'s' * (files != 1)}, not {count}"
            if count != files
            else "inputs: other files or sizes"
        )
    differ += setting_differences(record.get("settings"), now["settings"])
    return f" ({listed(differ)})" if differ else ""


def _no_record(idx_path: Path) -> str:
    path = record_path(idx_path)
    if storage.is_file(path):
        return f"{path.name} beside it is not a record of this pair"
    return f"no {path.name} beside it records the run that wrote it"


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()
