"""What differs between a run's fingerprint and the one `--resume` finds, in words.

A refused `--resume` names what to change back: each setting that differs by its path in the
fingerprint (`pack.seed`, `read.text_field`, `tokenizer.eos_id`), with the old and the new
value (`pack.seed: 0 -> 3`), and for the inputs the first file added, removed or changed. At
most `SHOWN` are named (then how many more), and each value is cut at `WIDTH` characters, so
the message stays one short line whatever the fingerprint holds (a chat template's record, a
long list of fields).
"""

from __future__ import annotations

import json
from typing import Any

SHOWN = 4
"""Differences named in one message; the rest are counted."""
WIDTH = 40
"""Characters of a value shown (a longer one ends in `...`)."""
_UNSET = object()


def setting_differences(old: Any, new: Any, path: str = "") -> list[str]:
    """`path: old -> new` for every leaf setting (a value that is not an object) that differs,
    in `new`'s order, then the ones only `old` has. A list is one value; two lists of the same
    items but some are named by those (`columns: added "seq_lengths"`)."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key in [*new, *(k for k in old if k not in new)]:
            where = f"{path}.{key}" if path else str(key)
            found += setting_differences(old.get(key, _UNSET), new.get(key, _UNSET), where)
        return found
    if old == new:
        return []
    path = path or "fingerprint"
    if isinstance(old, list) and isinstance(new, list):
        added = [_shown(v) for v in new if v not in old]
        removed = [_shown(v) for v in old if v not in new]
        if added or removed:
            words = [f"added {', '.join(added)}"] * bool(added)
            words += [f"removed {', '.join(removed)}"] * bool(removed)
            return [f"{path}: {'; '.join(words)}"]
    return [f"{path}: {_shown(old)} -> {_shown(new)}"]


def input_difference(was: Any, now: list[list[Any]]) -> str:
    """`inputs: FILE added` (or `removed`, `changed`: its size or modification time) for the
    first file that differs between two fingerprints' inputs; `inputs` when none does (the same
    files in another order)."""
    old = {tuple(f[:1]): f for f in was} if isinstance(was, list) else {}
    new = {tuple(f[:1]): f for f in now}
    diff = [k for k in [*new, *old] if old.get(k) != new.get(k)]
    if not diff:
        return "inputs"
    added = [k for k in diff if k not in old]
    removed = [k for k in diff if k not in new]
    for a in added:  # a file named another way (`big.jsonl`, then `/data/big.jsonl`)
        same = next((r for r in removed if list(old[r][1:]) == list(new[a][1:])), None)
        if same is not None and len(new[a]) > 1:
            return (
                f"inputs: {a[0]} added, {same[0]} removed (the same file named another way? "
                "give the inputs as the first run did)"
            )
    how = "added" if diff[0] not in old else "removed" if diff[0] not in new else "changed"
    return f"inputs: {diff[0][0]} {how}"


def listed(differences: list[str], shown: int = SHOWN) -> str:
    """The first `shown` differences, then how many more."""
    if len(differences) <= shown:
        return ", ".join(differences)
    return f"{', '.join(differences[:shown])} and {len(differences) - shown} more"


def _shown(value: Any) -> str:
    if value is _UNSET:
        return "unset"
    if value is None:
        return "none"
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."
