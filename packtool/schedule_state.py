"""Restoring a mixture schedule from its state, including onto a changed mixture.

Same mixture (the same sources in the same order with the same weights, caps and unit): the
counters carry over and the stream continues exactly. Changed weights, caps or unit, an added
or a removed source: every kept source continues from its cursor (epoch and position in that
epoch's order, so no row of the epoch is repeated or skipped), an added source starts at its
first row, a removed one is kept aside ("dormant") so that adding it back later continues it,
and a new segment starts (targets count from here). What changed is returned in words.
Different data under a kept name (another fingerprint) is refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from packtool.errors import DataError

if TYPE_CHECKING:
    from packtool.schedule import Schedule

_INT = (int, np.integer)
_TOP = {
    "version": _INT,
    "unit": str,
    "max_len": _INT,
    "rows": _INT,
    "tokens": _INT,
    "segment": dict,
    "sources": dict,
    "dormant": dict,
    "events": list,
}
_SOURCE = {
    "epoch": _INT,
    "pos": _INT,
    "rows": _INT,
    "tokens": _INT,
    "seg": _INT,
    "capped": bool,
    "weight": (int, float),
    "at_cap": str,
}


_EVENT = {"what", "rows", "tokens", "message"}


def _damaged(where: str, value: Any) -> DataError:
    return DataError(f"malformed mixture state: {where} is {value!r}; the checkpoint is damaged")


def check(state: Any) -> None:
    """Refuse a state that is not a well-formed schedule state (one line naming the part)."""
    from packtool.schedule import STATE_VERSION

    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise DataError("not a mixture schedule state (wrong or missing version)")
    for key, kind in _TOP.items():
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, kind):
            raise _damaged(key, value)
    done = state.get("done", ...)  # present in every state; None while the mixture runs
    if done is not None and not isinstance(done, str):
        raise _damaged("done", done)
    for key in ("index", "rows", "tokens"):
        value = state["segment"].get(key)
        if isinstance(value, bool) or not isinstance(value, _INT) or value < 0:
            raise _damaged(f"segment.{key}", value)
    for group in ("sources", "dormant"):
        for name, entry in state[group].items():
            if not isinstance(entry, dict):
                raise _damaged(f"{group}.{name}", entry)
            for key, kind in _SOURCE.items():
                value = entry.get(key)
                wrong = isinstance(value, bool) != (kind is bool) or not isinstance(value, kind)
                if wrong or (kind is _INT and value < 0):
                    raise _damaged(f"{group}.{name}.{key}", value)
            fp = entry.get("fingerprint")
            if fp is not None and not isinstance(fp, str):
                raise _damaged(f"{group}.{name}.fingerprint", fp)
            cap = entry.get("max_epochs")
            if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))):
                raise _damaged(f"{group}.{name}.max_epochs", cap)
    for i, event in enumerate(state["events"]):
        if not isinstance(event, dict) or not event.keys() >= _EVENT:
            raise _damaged(f"events[{i}]", event)
    for key in ("rows", "tokens", "max_len"):
        if state[key] < 0:
            raise _damaged(key, state[key])


def _same_mixture(sch: Schedule, state: dict[str, Any]) -> bool:
    if state["unit"] != sch.unit or list(state["sources"]) != sch.names:
        return False
    for spec in sch.specs:
        s = state["sources"][spec.name]
        if (float(s["weight"]), s.get("max_epochs"), s["at_cap"]) != (
            float(spec.weight),
            spec.max_epochs,
            spec.at_cap,
        ):
            return False
    return True


def restore(sch: Schedule, state: dict[str, Any]) -> None:
    """Load `state` into a new `Schedule` (see the module docstring); sets `sch.changes`.

    Raises:
        DataError: A damaged state, another max_len, or other data under a kept name.
    """
    check(state)
    if int(state["max_len"]) != sch.max_len:
        raise DataError(
            f"the mixture state was saved with max_len {state['max_len']} but these sources "
            f"have max_len {sch.max_len}; resume on the same packed data"
        )
    old, dormant = state["sources"], dict(state["dormant"])
    same = _same_mixture(sch, state)
    changes: list[str] = []
    for i, spec in enumerate(sch.specs):
        entry = old.get(spec.name)
        if entry is None and spec.name in dormant:
            entry = dormant.pop(spec.name)
            changes.append(f"added back {spec.name!r} (continues from its cursor)")
        if entry is None:
            changes.append(f"added {spec.name!r} (starts at its first row)")
            continue
        saved, now = entry.get("fingerprint"), sch.fingerprints[i]
        if saved is not None and now is not None and saved != now:
            raise DataError(
                f"source {spec.name!r}: the state was saved on data {saved} but {spec.name!r} "
                f"is now {now} ({spec.path}); resume on the same data or give it a new name"
            )
        sch.epoch[i], sch.pos[i] = entry["epoch"], entry["pos"]
        sch.rows[i], sch.tokens[i] = entry["rows"], entry["tokens"]
        if same:
            sch.seg[i] = entry["seg"]
            sch.capped[i] = entry["capped"]
        else:
            if entry.get("max_epochs") == spec.max_epochs:
                sch.capped[i] = entry["capped"]  # else re-checked against the new cap
            if float(entry["weight"]) != float(spec.weight):
                changes.append(f"weight of {spec.name!r} {entry['weight']:g} -> {spec.weight:g}")
            if entry.get("max_epochs") != spec.max_epochs:
                changes.append(
                    f"max_epochs of {spec.name!r} {entry.get('max_epochs')} -> {spec.max_epochs}"
                )
            if entry["at_cap"] != spec.at_cap:
                changes.append(f"at_cap of {spec.name!r} {entry['at_cap']} -> {spec.at_cap}")
    for name, entry in old.items():
        if name not in sch.names:
            dormant[name] = entry
            changes.append(f"removed {name!r} (its cursor is kept in the state)")
    if state["unit"] != sch.unit:
        changes.append(f"unit {state['unit']} -> {sch.unit}")
    if not same and not changes:
        changes.append("source order changed")
    sch.delivered_rows, sch.delivered_tokens = int(state["rows"]), int(state["tokens"])
    sch.dormant = dormant
    sch.events = [dict(e) for e in state["events"]]
    sch.segment = {k: int(state["segment"][k]) for k in ("index", "rows", "tokens")}
    if same:
        sch.done = state["done"]
        if sch.done is not None and sch.done.startswith("total_tokens"):
            sch.done = None  # re-checked against this run's total (it may have been raised)
    else:
        sch._new_segment()
        sch._event("changed", "the mixture changed at this resume: " + "; ".join(changes))
    sch.changes = changes
