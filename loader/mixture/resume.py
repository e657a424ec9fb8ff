"""The `MixedDataset` resume state: its format and its checks, apart from the dataset.

A state names a global step, the mixture's fingerprint and seed, the batch layout and the
schedule's state (packtool/mixture/schedule_state.py), plus `check`, a hash of all of it.
Everything is checked before any of it is used: a damaged or edited step, cursor or `done`
would otherwise repeat or skip rows, or end the mixture, without a word. States are version 2;
a version 2 state without `check` is refused (its check was removed). A version 1 state was
saved before version 2 came in: with a `check` (saved after the check value came in) it is
checked by it; without one (saved before) its fields are still checked one by one (and each
cursor against its source's rows, when the schedule restores it).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from loader.packed.resume import ORDER_KEYS, digest, order_of
from packtool.errors import DataError
from packtool.mixture.schedule_state import check as check_schedule

STATE_FORMAT = "packtool.mixture.spec"
STATE_VERSION = 2
"""Version 2 states always carry `check`; version 1 (`LEGACY_VERSION`) ones may not."""
LEGACY_VERSION = 1
"""The version of states saved before `check` was required (same keys, `check` optional):
without the version, a state whose `check` was removed could not be told from one of them."""


def make_state(
    *, fingerprint: str, seed: int, step: int, layout: dict[str, Any], schedule: dict[str, Any]
) -> dict[str, Any]:
    """A `MixedDataset` state (what `state_dict()` returns)."""
    state = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "seed": seed,
        "step": step,
        "layout": layout,
        "schedule": schedule,
    }
    state["check"] = state_check(state)
    return state


def state_check(state: dict[str, Any]) -> str:
    """A hash of a state's content but its `check` (16 hex digits)."""
    return digest({k: v for k, v in state.items() if k != "check"})


def check_state(state: Any, *, seed: int) -> dict[str, Any]:
    """The mixture state inside `state` (also a `MixedDataLoader` state), checked.

    Raises:
        DataError: Not a mixture state, a damaged or edited one, or another seed.
    """
    if isinstance(state, dict) and "mixed_dataset" in state:
        state = state["mixed_dataset"]
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise DataError("not a MixedDataset state (a PackedDataset state? a whole checkpoint?)")
    version = state.get("version")
    if isinstance(version, bool) or version not in (STATE_VERSION, LEGACY_VERSION):
        raise DataError(f"mixture state version {version!r} is not supported")
    step = state.get("step")
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise DataError(f"malformed mixture state: step is {step!r}; the checkpoint is damaged")
    if state.get("seed") != seed:
        raise DataError(
            f"the state was saved with seed {state.get('seed')!r} but this mixture uses seed "
            f"{seed}; every source's epoch order would change"
        )
    check_schedule(state.get("schedule"))  # a damaged part is named before the hash says so
    layout = state.get("layout")
    if not isinstance(layout, dict) or not all(k in layout for k in ORDER_KEYS):
        raise DataError(f"malformed mixture state: layout is {layout!r}; the checkpoint is damaged")
    if "check" not in state and version == STATE_VERSION:
        raise DataError(
            f"the mixture state (step {step}) has no check value, which every version "
            f"{STATE_VERSION} state carries; the checkpoint is damaged or was edited"
        )
    if "check" in state and state["check"] != state_check(state):
        raise DataError(
            f"the mixture state (step {step}) does not match its check value; the checkpoint "
            "is damaged or was edited"
        )
    return state


def check_order(saved: dict[str, Any], ours: dict[str, Any], schedule: dict[str, Any]) -> None:
    """Refuse another row order (`shuffle`, `shuffle_window`) while a source of the restored
    `schedule` is inside an epoch: its consumed rows are the first `pos` of the saved order, and
    the rest of another order would repeat some and skip others (`loader.packed.resume`)."""
    if order_of(saved) == order_of(ours):
        return
    inside = [name for name, e in schedule["sources"].items() if e["pos"] > 0]
    if inside:
        was = ", ".join(f"{k}={saved[k]!r}" for k in ORDER_KEYS)
        now = ", ".join(f"{k}={ours[k]!r}" for k in ORDER_KEYS)
        raise DataError(
            f"the mixture state was saved with {was} but this mixture uses {now}: the rest of "
            f"the current epoch of {', '.join(map(repr, inside))} exists only in the saved "
            "order; resume with the saved settings"
        )
