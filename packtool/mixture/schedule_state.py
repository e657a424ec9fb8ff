"""A mixture schedule's state: its format and its checks (`check`), apart from the schedule.

`Schedule.state()` (packtool/mixture/schedule.py) writes a small JSON-friendly dict; `check`
refuses one that is not well formed, naming the damaged part, before `Schedule` restores it
(also onto a changed mixture: `Schedule._restore`). This module needs nothing of the schedule,
so the loader and `packtool mix` can check a state without running one.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from packtool.errors import DataError

STATE_VERSION = 1
"""The version of a schedule state (`Schedule.state()`); a state of another version is refused."""
_INT = (int, np.integer)
_REACHED = re.compile(r"total_tokens ([0-9,]+) reached")


def total_reached(total: int) -> str:
    """The state's `done` when the mixture ended at `total` tokens."""
    return f"total_tokens {total:,} reached"


def ended_at_total(done: str | None) -> int | None:
    """The total_tokens a state's `done` says the mixture ended at (None: it had not)."""
    found = _REACHED.fullmatch(done or "")
    return int(found.group(1).replace(",", "")) if found else None


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
    order = state.get("order")  # (states saved before it have none)
    if order is not None and (
        not isinstance(order, list)
        or not all(isinstance(name, str) for name in order)
        or sorted(order) != sorted(state["sources"])
    ):
        raise _damaged("order", order)
    for i, event in enumerate(state["events"]):
        if not isinstance(event, dict) or not event.keys() >= _EVENT:
            raise _damaged(f"events[{i}]", event)
    for key in ("rows", "tokens", "max_len"):
        if state[key] < 0:
            raise _damaged(key, state[key])
