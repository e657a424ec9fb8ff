"""The `PackedDataset` resume state: its format, its checks, and where a state resumes.

A state names a global step of an epoch plan (`next_step`) and the row position that step
starts at (`cursor`), together with the settings that cut the plan (`layout`). With the same
layout the stream resumes at the step; with other ranks or batch settings, at the first row no
step has consumed. Everything is checked before any of it is used: a damaged or hand-edited state
would otherwise repeat or skip rows without a word.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from packtool.errors import DataError

STATE_VERSION = 1
STATE_FIELDS = {
    "fingerprint": str,
    "seed": (int, np.integer),
    "epoch": (int, np.integer),
    "origin": (int, np.integer),
    "next_step": (int, np.integer),
    "cursor": (int, np.integer),
    "layout": dict,
}
"""What a state must hold (and of which type) before any of it is used."""


def make_state(
    *,
    fingerprint: str,
    seed: int,
    epoch: int,
    origin: int,
    next_step: int,
    cursor: int,
    layout: dict[str, Any],
) -> dict[str, Any]:
    """A `PackedDataset` state (what `state_dict()` returns)."""
    return {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "seed": seed,
        "epoch": epoch,
        "origin": origin,
        "next_step": next_step,
        "cursor": cursor,
        "layout": layout,
    }


def _bad_field(state: dict[str, Any], keys: Iterable[str]) -> str | None:
    """The first of `keys` that `state` lacks or holds with a type `STATE_FIELDS` refuses."""
    for key in keys:
        value = state.get(key)
        if value is None or isinstance(value, bool) or not isinstance(value, STATE_FIELDS[key]):
            return key
    return None


def check_state(state: dict[str, Any], *, fingerprint: str, seed: int, path: Any) -> None:
    """Refuse a state that is not a well-formed `PackedDataset` state of this dataset and seed.

    Raises:
        DataError: Not a state, a field missing or of the wrong type, or another dataset or seed.
    """
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise DataError(
            f"not a PackedDataset state (version {state.get('version') if isinstance(state, dict) else None!r})"
        )
    key = _bad_field(state, STATE_FIELDS)
    if key is not None:
        raise DataError(
            f"malformed PackedDataset state: {key!r} is {state.get(key)!r}; the checkpoint is "
            "damaged"
        )
    if state["fingerprint"] != fingerprint:
        raise DataError(
            f"the state was saved on dataset {state['fingerprint']} but this is {fingerprint} "
            f"({path}); resume on the same packed data"
        )
    if state["seed"] != seed:
        raise DataError(
            f"the state was saved with seed {state['seed']!r} but this loader uses seed {seed!r}"
        )


def resume_point(
    state: dict[str, Any],
    *,
    num_rows: int,
    layout: dict[str, Any],
    num_steps: Callable[[int, int], int],
    own_step: bool,
) -> tuple[int, int, int]:
    """`(epoch, origin, first step)` a checked state resumes at.

    Args:
        state: A state that passed `check_state`.
        num_rows: Rows in the dataset.
        layout: This loader's `LoaderConfig.layout_key(world_size)`.
        num_steps: Steps of the plan of `(epoch, origin)`.
        own_step: The state is a StatefulDataLoader worker's own (its next step may run past the
            end by up to its stride, and it cannot change the layout).

    Raises:
        DataError: The position does not fit this dataset or plan.
    """
    epoch, origin, step = int(state["epoch"]), int(state["origin"]), int(state["next_step"])
    cursor = int(state["cursor"])
    # A hand-edited or damaged position would otherwise be clamped or wrap around (a negative
    # step indexes the plan from its end): rows repeated or skipped without a word.
    if not (0 <= origin <= cursor <= num_rows and step >= 0):
        raise DataError(
            f"the state's position (epoch {epoch}, origin {origin}, step {step}, row "
            f"{cursor}) does not fit this dataset of {num_rows} rows; the checkpoint is damaged"
        )
    if state["layout"] == layout:
        steps = num_steps(epoch, origin)
        # A StatefulDataLoader worker's own next step runs past the end by up to its stride.
        if not own_step and step > steps:
            raise DataError(
                f"the state resumes at step {step} of epoch {epoch}, which has {steps} steps; "
                "the checkpoint is damaged"
            )
        return epoch, origin, step
    if own_step:
        raise DataError(
            "a StatefulDataLoader worker state cannot change world size or batch settings; load "
            "the whole StatefulDataLoader state into the dataset instead"
        )
    # Other ranks or batch settings: continue at the first row no step has consumed.
    return epoch, cursor, 0


def merge_loader_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """The dataset state at the first unconsumed step of a whole loader state, else None."""
    if not isinstance(state, dict):
        return None
    if "packed_dataset" in state:  # PackedDataLoader.state_dict()
        return state["packed_dataset"]
    if "dataset_state" in state and "_num_yielded" in state:  # StatefulDataLoader, no workers
        return state["dataset_state"]
    snap = state.get("_snapshot")
    if snap is None:
        return None
    # StatefulDataLoader: one dataset state per worker (or the main one with num_workers=0).
    states = []
    for w in (snap.get("_worker_snapshots") or {}).values():
        ds = (w or {}).get("dataset_state")
        if ds is not None:
            states.append(ds)
    main = (snap.get("_main_snapshot") or {}).get("dataset_state")
    if main is not None:
        states.append(main)
    if not states:
        raise DataError("the StatefulDataLoader state holds no PackedDataset state")
    for s in states:
        # Every worker's position is compared (the smallest is kept): each must be well-typed.
        if not isinstance(s, dict) or _bad_field(s, ("epoch", "next_step")) is not None:
            raise DataError(
                "malformed PackedDataset state inside the StatefulDataLoader state; the "
                "checkpoint is damaged"
            )
    # Each worker's next step; the first unconsumed global step is the smallest of them.
    return min(states, key=lambda s: (s["epoch"], s["next_step"]))
