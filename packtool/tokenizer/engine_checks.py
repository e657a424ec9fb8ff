"""Engine self-checks already passed, recorded so that a tokenizer loads without redoing them.

Loading a `tokenizer.json` for a fast engine also loads the reference library (`tokenizers`) to
prove the engine on the probe text and to read the vocabulary (its size, the ids of the EOS/BOS
names): for GPT-2 about 0.3 s of CPU with the GIL held, a tenth of a whole `packtool pack` of
100 MB. All of it depends only on the tokenizer file's bytes, the libraries' versions and the
probe, so the outcome is recorded in a small JSON file per tokenizer file and reference library
version, under the user's cache folder:

- `$PACKTOOL_CACHE_DIR/engine-checks/`, else `$XDG_CACHE_HOME/packtool/...`, else
  `~/.cache/packtool/...`; `PACKTOOL_CACHE_DIR=` (empty) turns recording off.
- A record holds the vocabulary facts the reference library gave (`base_vocab`, and the id or
  absence of every EOS/BOS name looked up) and, per engine, the engine version and probe
  (`PROBE_VERSION` and a hash of the probe text) that passed, and the same for each engine that
  refused the file or failed the probe (a later load skips it instead of building it and loading
  the reference library to fail it again).
- A record that is missing, unreadable, malformed, written for another file, library version,
  engine version or probe is ignored: the reference library is loaded and the probe runs, as
  without a record. A folder that cannot be written is ignored too. The record saves time; it
  never decides an id that was not proven with the same versions on the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.errors import json_value
from packtool.storage import local as storage
from packtool.storage import writing

RECORD_VERSION = 1
"""Bumped when what a record means changes (the self-check's rules, the fields)."""


def cache_dir() -> Path | None:
    """The folder records go in, or None when `PACKTOOL_CACHE_DIR` is set empty (off)."""
    explicit = os.environ.get("PACKTOOL_CACHE_DIR")
    if explicit is not None:
        return Path(explicit).expanduser() if explicit.strip() else None
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "packtool"


def library_version(module: str) -> str | None:
    """The installed `module`: its distribution's version plus the size and mtime of its
    compiled files (a rebuild under the same version is another library). None when unknown.

    Found without importing the module (`find_spec`) or `importlib.metadata` (~30 ms).
    """
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    package = Path(spec.origin).parent
    infos = storage.glob(package.parent, f"{module}-*.dist-info")
    if len(infos) != 1:
        return None
    version = infos[0].name[len(module) + 1 : -len(".dist-info")]
    try:
        native = sorted(
            f"{p.name}:{st.st_size}:{st.st_mtime_ns}"
            for p in storage.list_dir(package)
            if p.suffix in (".so", ".pyd") and (st := storage.stat(p))
        )
    except OSError:
        return None
    return ";".join([version, *native])


def engine_stamp(module: str, probe: str) -> str | None:
    """What a recorded check of the engine in `module` must match: the installed library
    (`library_version`) and the probe text's digest (a changed probe never reuses an old
    verdict: `packtool.tokenizer.choice.probe_digest`)."""
    version = library_version(module)
    return None if version is None else f"{version}|{probe}"


@dataclass
class CheckRecord:
    """The record of one tokenizer file (by sha256) under one reference library version."""

    path: Path
    key: dict[str, Any]
    values: dict[str, Any]
    """`base_vocab` (int), `names` ({token: id or None}), `proven` and `failed` ({engine: stamp}),
    `why` ({engine: why it failed, one line})."""

    def proven(self, engine: str, stamp: str | None) -> bool:
        """Whether `engine` passed the self-check with this `stamp` (version and probe)."""
        return stamp is not None and self.values.get("proven", {}).get(engine) == stamp

    def failed(self, engine: str, stamp: str | None) -> str | None:
        """Why `engine` refused this file or failed the self-check with this `stamp` (one line,
        "" when not said); None when it did not."""
        if stamp is None or self.values.get("failed", {}).get(engine) != stamp:
            return None
        return str(self.values.get("why", {}).get(engine, ""))

    def vocab(self, names: set[str]) -> tuple[int, dict[str, int]] | None:
        """(base_vocab, {name: id} of the `names` present) if every name was looked up before."""
        known = self.values.get("names", {})
        base = self.values.get("base_vocab")
        if not isinstance(base, int) or not isinstance(known, dict) or not names <= known.keys():
            return None
        return base, {n: known[n] for n in names if known[n] is not None}

    def remember(
        self,
        base_vocab: int,
        names: dict[str, int | None],
        engine: str,
        stamp: str | None,
        failed: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        """Add the vocabulary facts, with a `stamp` `engine`'s passed probe, and the `failed`
        engines' (stamp, why); then store."""
        looked = dict(self.values.get("names", {}))
        looked.update(names)
        self.values.update(base_vocab=base_vocab, names=looked)
        if stamp is not None:
            self.values["proven"] = {**self.values.get("proven", {}), engine: stamp}
        if failed:
            self.values["failed"] = {
                **self.values.get("failed", {}),
                **{n: v[0] for n, v in failed.items()},
            }
            self.values["why"] = {
                **self.values.get("why", {}),
                **{n: v[1] for n, v in failed.items()},
            }
        self.store()

    def store(self) -> None:
        """Write the record (atomically; any failure to write is ignored)."""
        try:
            data = json.dumps({"key": self.key, **self.values}, sort_keys=True).encode()
            writing.write_atomic(self.path, data, make_parent=True)
        except OSError:
            pass


def open_record(sha256: str, reference: str) -> CheckRecord | None:
    """The record for a tokenizer file and reference library: the stored one when it is valid
    for exactly this key, else an empty one to fill. None when recording is off or the
    library's version cannot be told."""
    folder = cache_dir()
    version = library_version(reference)
    if folder is None or version is None:
        return None
    key = {"record": RECORD_VERSION, "sha256": sha256, "reference": reference, "version": version}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]
    path = folder / "engine-checks" / f"{digest}.json"
    values: dict[str, Any] = {}
    try:
        stored = json_value(storage.read_bytes(path))
        if isinstance(stored, dict) and stored.get("key") == key and _well_formed(stored):
            values = {k: v for k, v in stored.items() if k != "key"}
    except (OSError, ValueError):
        pass  # none yet, unreadable or malformed: as if there were none
    return CheckRecord(path, key, values)


def _well_formed(stored: dict[str, Any]) -> bool:
    """Every field of the expected type: a record damaged anywhere is not trusted at all."""
    names = stored.get("names")
    stamps = [stored.get("proven", {}), stored.get("failed", {}), stored.get("why", {})]
    return (
        type(stored.get("base_vocab")) is int
        and isinstance(names, dict)
        and all(isinstance(k, str) and (v is None or type(v) is int) for k, v in names.items())
        and all(isinstance(d, dict) for d in stamps)
        and all(isinstance(k, str) and isinstance(v, str) for d in stamps for k, v in d.items())
    )
