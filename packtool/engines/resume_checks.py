"""What `--resume` checks: that the run it goes on with (or the dataset it finds) was made by
this run's options and inputs, the fingerprint `preflight.fingerprint_of` builds.

- `check_fingerprint`: an interrupted run's saved state, naming what differs
  (packtool/engines/differences.py);
- `check_built`: a dataset a run built whole but did not switch in (killed between its
  `index.json` and the switch): refused as an unfinished run is, before anything is switched;
- `check_complete`: a finished dataset, by the digest its `index.json` keeps
  (`fingerprint_digest`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from packtool.dataset.manifest import INDEX_FILE, read_manifest
from packtool.engines import records
from packtool.engines.differences import input_difference, listed, setting_differences
from packtool.errors import OVERWRITE, AlreadyComplete, ConfigError, DataError
from packtool.storage import local as storage

CHAT_TEMPLATE_KEY = "chat_template"
"""The fingerprint's record of the chat template (`sft.encode.template_record`); states and
datasets written before it lack it, and are compared without it."""


def _without(fingerprint: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in fingerprint.items() if k != key}


def fingerprint_digest(fingerprint: dict[str, Any]) -> str:
    """What `index.json` keeps of the run's fingerprint (`extra.fingerprint`): the sha256 of its
    options, tokenizer and input files with their sizes, not their modification times, so the
    same request on a copy of the same corpus writes the same `index.json`."""
    request = {**fingerprint, "inputs": [f[:2] for f in fingerprint["inputs"]]}
    return hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()


def check_complete(fingerprint: dict[str, Any], out: Path, shown: str | None = None) -> None:
    """`--resume` of a finished dataset: `AlreadyComplete` when it was made by this run's
    options and inputs (nothing to do, not a failure), else a `ConfigError`. `shown`: the
    output as the user wrote it (a Hub URL's path prints as `hf:///...`).

    A dataset packed before `index.json` kept the digest (`extra.fingerprint`) is taken as
    complete: nothing recorded says otherwise.
    """
    shown = shown or str(out)
    if _other_digest(fingerprint, out / INDEX_FILE):
        raise ConfigError(
            f"cannot resume {shown}: it is a finished dataset of other options or inputs (its "
            f"{INDEX_FILE} keeps their digest, extra.fingerprint, not them, so which ones differ "
            f"cannot be told); use {OVERWRITE} to replace it"
        )
    raise AlreadyComplete(
        f"{shown} is already complete ({INDEX_FILE} exists): nothing to resume, nothing done",
        shown,
    )


MASK_RULE_KEY = "loss_mask_rule"
"""The fingerprint's record, for runs with a loss mask, of which documents hold a target:
`MASK_RULE` (a document supervised only at its first token holds none, since labels shift,
and is dropped). A run state saved before it (which kept such documents) is not resumed, so one
dataset never mixes the two; a finished dataset of the earlier rule is still complete."""
MASK_RULE = "targets after each document's first token"


def check_fingerprint(state: dict[str, Any], fingerprint: dict[str, Any], out: Path) -> None:
    """Refuse to resume when the options or inputs differ from the interrupted run's, naming
    the first file and the settings that differ (packtool/engines/differences.py)."""
    old = state.get("fingerprint", {})
    old = old if isinstance(old, dict) else {}  # a damaged state: everything differs
    if CHAT_TEMPLATE_KEY not in old:  # saved before it was kept
        fingerprint = _without(fingerprint, CHAT_TEMPLATE_KEY)
    if old != fingerprint:
        differ = []
        if old.get("inputs") != fingerprint["inputs"]:
            if _renamed(old.get("inputs"), fingerprint["inputs"]):
                first = old["inputs"][0][0]
                raise ConfigError(
                    f"cannot resume {out}: the inputs name the interrupted run's files "
                    f"differently (it read {first!r}); give them as it was given them"
                )
            differ.append(input_difference(old.get("inputs"), fingerprint["inputs"]))
        differ += setting_differences(_without(old, "inputs"), _without(fingerprint, "inputs"))
        raise ConfigError(f"cannot resume {out}: options or inputs differ ({listed(differ)})")


def _renamed(was: Any, now: list[list[Any]]) -> bool:
    """Whether two fingerprints' inputs are the same local files, with the same sizes and times,
    named differently (`corpus/a.jsonl` and `/data/corpus/a.jsonl`): the ids and the plan name
    the files as the first run did, so the resume must too."""
    if not isinstance(was, list) or len(was) != len(now) or was == now:
        return False

    def key(entry: list[Any]) -> list[Any]:
        name = str(entry[0])
        return [name if storage.is_remote(name) else os.path.abspath(name), *entry[1:]]

    try:
        return [key(e) for e in was] == [key(e) for e in now]
    except (TypeError, IndexError):  # a damaged state: the caller names what differs
        return False


def check_built(fingerprint: dict[str, Any], staging: Path, shown: str) -> None:
    """`--resume` of the dataset in `staging`, which a run built whole (its `index.json`
    written) but did not switch in: refused when it was made by other options or inputs, as the
    resume of an unfinished run is. The run's state stays in the staging until the switch, so
    what differs is named; a staging without it (an older packtool's) is checked by the digest
    its `index.json` keeps."""
    try:  # (a state cut short while `commit` deleted it: the digest decides)
        state = records.read_plan(staging) if storage.is_dir(records.run_dir(staging)) else None
    except DataError:
        state = None
    if state is not None:
        check_fingerprint(state, fingerprint, shown)
    elif _other_digest(fingerprint, staging / INDEX_FILE):
        raise ConfigError(
            f"cannot resume {shown}: options or inputs differ (the dataset the interrupted run "
            f"built keeps their digest, extra.fingerprint, not them, so which ones differ "
            f"cannot be told); use {OVERWRITE} to replace it"
        )


def _other_digest(fingerprint: dict[str, Any], index: Path) -> bool:
    """Whether the manifest `index` keeps the digest of other options or inputs (a dataset
    packed before it kept one: not)."""
    saved = read_manifest(index).extra.get("fingerprint")  # a damaged index.json: one line
    digests = {fingerprint_digest(fingerprint)}
    for keys in ((CHAT_TEMPLATE_KEY,), (MASK_RULE_KEY,), (CHAT_TEMPLATE_KEY, MASK_RULE_KEY)):
        if all(k in fingerprint for k in keys):  # a dataset packed before the key was kept
            older = fingerprint
            for k in keys:
                older = _without(older, k)
            digests.add(fingerprint_digest(older))
    return saved is not None and saved not in digests
