"""The `PackedDataset` resume state: its format, its checks, and where a state resumes.

A state names a global step of an epoch plan (`next_step`) and the row position that step
starts at (`cursor`), together with the settings that cut the plan (`layout`). With the same
layout the stream resumes at the step, cutting the plan onward from the cursor (never from the
epoch's start); with other ranks or batch settings, at the first row no step has consumed.
Everything is checked before any of it is used: a damaged or hand-edited state would otherwise
repeat or skip rows without a word. Where the plan cannot check a cursor cheaply (a token budget:
only the cut from the epoch's start would say where a step starts), the state's `check` value, a
hash of its position and layout, does.

Version 2 (this one) goes with the lazy epoch order (loader/order/permutation.py); a version 1 state
(the earlier order) is accepted only at the start of an epoch, where both orders agree on what
is left (all of it).

`PendingStart` holds where the next iteration starts (shared with DataLoader workers) and uses a
loaded resume point up once an iteration has started from it; `IterationStart` is such a start
with its plan.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from loader.order.steps import EpochPlan
from packtool.errors import ConfigError, DataError

STATE_VERSION = 2
OLD_VERSIONS = (1,)
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
OPTIONAL_FIELDS = {"ended": bool}
"""What a state may hold (states saved before these existed lack them)."""


def make_state(
    *,
    fingerprint: str,
    seed: int,
    epoch: int,
    origin: int,
    next_step: int,
    cursor: int,
    layout: dict[str, Any],
    ended: bool,
) -> dict[str, Any]:
    """A `PackedDataset` state (what `state_dict()` returns). `ended`: no step of the epoch is
    left (with `drop_last` the cursor then lies before the dropped rows, not at the end)."""
    state = {
        "version": STATE_VERSION,
        "fingerprint": fingerprint,
        "seed": seed,
        "epoch": epoch,
        "origin": origin,
        "next_step": next_step,
        "cursor": cursor,
        "layout": layout,
        "ended": bool(ended),
    }
    state["check"] = state_check(state)
    return state


def state_check(state: dict[str, Any]) -> str:
    """A hash of a state's position and layout (16 hex digits)."""
    keys = ("fingerprint", "seed", "epoch", "origin", "next_step", "cursor", "layout")
    keys += tuple(k for k in OPTIONAL_FIELDS if k in state)
    return digest([state[k] for k in keys])


def digest(value: Any) -> str:
    """16 hex digits of the sha256 of `value` as JSON (keys sorted; numpy scalars as Python
    numbers: a state may hold either, and the hash must not tell them apart). The check value
    of a loader state (this module's, and `loader.mixture.resume`'s)."""
    text = json.dumps(value, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    raise TypeError(f"not JSON: {value!r}")


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
    if isinstance(state, dict) and ("mixed_dataset" in state or "format" in state):
        # A mixture's state has a version too: without this it read as a damaged checkpoint.
        raise DataError(
            "not a PackedDataset state but a MixedDataset one; load it into the MixedDataset "
            "(or MixedDataLoader) it was saved from"
        )
    version = state.get("version") if isinstance(state, dict) else None
    if version != STATE_VERSION and version not in OLD_VERSIONS:
        raise DataError(f"not a PackedDataset state (version {version!r})")
    key = _bad_field(state, STATE_FIELDS)
    if key is not None:
        raise DataError(
            f"malformed PackedDataset state: {key!r} is {state.get(key)!r}; the checkpoint is "
            "damaged"
        )
    for key, kind in OPTIONAL_FIELDS.items():
        if key in state and not isinstance(state[key], kind):
            raise DataError(
                f"malformed PackedDataset state: {key!r} is {state[key]!r}; the checkpoint is "
                "damaged"
            )
    if version in OLD_VERSIONS and (state["next_step"], state["origin"], state["cursor"]) != (
        0,
        0,
        0,
    ):
        raise DataError(
            f"the state was saved by an older packtool (state version {version}) in the middle "
            f"of epoch {state['epoch']}, whose row order this version no longer makes; finish "
            "that epoch with the older version, or restart it here (set_epoch)"
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
    plan: Callable[[int, int], Any],
    own_step: bool,
) -> tuple[int, int, int, int]:
    """`(epoch, origin, first step, cursor)` a checked state resumes at (step `first` of the
    plan of `(epoch, origin)` starts at row position `cursor`).

    Args:
        state: A state that passed `check_state`.
        num_rows: Rows in the dataset.
        layout: This loader's `LoaderConfig.layout_key(world_size)`.
        plan: The `EpochPlan` of `(epoch, origin)` (its `check_position` vets the position).
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
    # With drop_last an ended epoch's cursor lies before the dropped rows: nothing is left.
    ended = cursor >= num_rows or state.get("ended") is True
    _check_order(state["layout"], layout, ended=ended, cursor=cursor, num_rows=num_rows)
    same_layout = state["layout"] == layout
    if same_layout:
        # A StatefulDataLoader worker's own next step runs past the end by up to its stride.
        plan(epoch, origin).check_position(epoch=epoch, step=step, cursor=cursor, own_step=own_step)
    elif own_step:
        raise DataError(
            "a StatefulDataLoader worker state cannot change world size or batch settings; load "
            "the whole StatefulDataLoader state into the dataset instead"
        )
    if state["version"] == STATE_VERSION and state.get("check") != state_check(state):
        raise DataError(
            f"the state's position (epoch {epoch}, origin {origin}, step {step}, row {cursor}) "
            "does not match its check value; the checkpoint is damaged or was edited"
        )
    if same_layout:
        return epoch, origin, step, cursor
    if ended:  # other ranks or batch settings take nothing more of the epoch
        return epoch, num_rows, 0, num_rows
    # Other ranks or batch settings: continue at the first row no step has consumed.
    return epoch, cursor, 0, cursor


ORDER_KEYS = ("shuffle", "shuffle_window")
"""The layout settings that make the epoch's row order: the rows a state consumed are the first
`cursor` of that order, so the rest can only be taken from the same order."""


def _check_order(
    saved: dict[str, Any], ours: dict[str, Any], *, ended: bool, cursor: int, num_rows: int
) -> None:
    """Refuse a resume in the middle of an epoch under another row order (`ORDER_KEYS`): the
    rest of a different permutation would repeat some consumed rows and skip others."""
    if cursor == 0 or ended or not all(k in saved for k in ORDER_KEYS):
        return  # nothing consumed yet, or the epoch is over: any order has the same rows left
    if order_of(saved) != order_of(ours):
        nodes = "nodes" in saved or "nodes" in ours
        was, now = order_words(saved, nodes), order_words(ours, nodes)
        raise DataError(
            f"the state was saved with {was} but this loader uses {now}: the rest of the epoch "
            f"({num_rows - cursor} of {num_rows} rows) exists only in the saved order; resume "
            "with the saved settings (new ones can start at the next epoch: set_epoch instead "
            "of loading this state)"
        )


def order_of(layout: dict[str, Any]) -> tuple[Any, ...]:
    """What decides the epoch's row order in a layout (the window means nothing unshuffled;
    with `nodes` > 1 the nodes and each block's rows a node, `loader.order.nodes`)."""
    order = (True, layout["shuffle_window"]) if layout["shuffle"] else (False,)
    nodes = layout.get("nodes", 1)
    if nodes == 1:
        return order
    ranks, rows = layout.get("world_size"), layout.get("rows_per_batch")
    if not (isinstance(ranks, int) and isinstance(rows, int) and isinstance(nodes, int)):
        return (*order, nodes, ranks, rows)  # damaged: equal to no sound layout's
    return (*order, nodes, ranks // nodes * rows)  # a node's rows a block (its stripe)


def order_words(layout: dict[str, Any], nodes: bool) -> str:
    """The settings `order_of` reads, as a user wrote them (messages); with `nodes`, those
    that place rows on nodes too."""
    words = [f"{k}={layout[k]!r}" for k in ORDER_KEYS]
    if nodes:
        words.append(f"nodes={layout.get('nodes', 1)!r}")
        words += [f"{k}={layout[k]!r}" for k in ("world_size", "rows_per_batch") if k in layout]
    return ", ".join(words)


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
    damaged = DataError("malformed StatefulDataLoader state; the checkpoint is damaged")
    since = state.get("_steps_since_snapshot", 0)
    if isinstance(since, bool) or not isinstance(since, int) or since < 0:
        raise damaged
    if since:
        # Its workers' positions are those of its last snapshot: the batches since then would
        # come again (the loader itself replays them from its own count; the dataset cannot).
        raise DataError(
            f"the StatefulDataLoader state was taken {since} step(s) after its last snapshot "
            "(snapshot_every_n_steps > 1): its workers' positions are behind the batches "
            "delivered, which would come again; resume it with the StatefulDataLoader itself "
            "(the same number of workers), or save states with snapshot_every_n_steps=1 to "
            "resume the dataset with another number of workers or ranks"
        )
    # StatefulDataLoader: one dataset state per worker (or the main one with num_workers=0).
    if not isinstance(snap, dict):
        raise damaged
    workers, main_snap = snap.get("_worker_snapshots"), snap.get("_main_snapshot")
    if not isinstance(workers or {}, dict) or not isinstance(main_snap or {}, dict):
        raise damaged
    states = []
    for w in (workers or {}).values():
        if not isinstance(w or {}, dict):
            raise damaged
        ds = (w or {}).get("dataset_state")
        if ds is not None:
            states.append(ds)
    main = (main_snap or {}).get("dataset_state")
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


CLAIM_SLOTS = 4096
"""Most DataLoader workers that can start from one pending resume point together."""


class IterationStart(NamedTuple):
    """Where an iteration starts: global step `first` of the plan of `(epoch, origin)`, whose
    rows begin at row position `cursor`, and that plan, anchored there
    (`PackedDataset.next_start`)."""

    epoch: int
    origin: int
    first: int
    cursor: int
    plan: EpochPlan


class PendingStart:
    """Where a dataset's next iteration starts, in shared memory (DataLoader workers see what
    `set_epoch` / `load_state_dict` did in the trainer, persistent workers too): the start of
    the epoch set last, or a resume point, which the first iteration that starts from it uses
    up, so the iterations after it run the whole epoch.

    In process, `take` uses the point up at once. In worker processes each worker marks its
    slot as it takes the point, and the point is used up once every worker of that iteration
    has (a counter would need a lock, and a lock of one multiprocessing context cannot go to
    workers of another).
    """

    # 0 epoch, 1 origin, 2 first step, 3 resume pending, 4 cursor, 5 the resume's serial number,
    # 6 workers of the iteration taking it, then one slot per worker: the serial it took.
    def __init__(self, *, shared: bool = True, values: bytes = b"") -> None:
        """`shared=False`: kept in this process's memory (a copy made by fork or pickle is its
        own, for an iterator that each process starts itself: a mixture's streaming source).
        `values`: a copy's (`__reduce_ex__`)."""
        n = 7 + CLAIM_SLOTS
        self._raw = multiprocessing.RawArray("q", n) if shared else bytearray(8 * n)
        if values:
            self._a[:] = np.frombuffer(values, dtype=np.int64)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled to start a worker process: the shared memory itself. Pickled otherwise
        (`pickle.dumps`, `copy.deepcopy`, Ray): a copy of its values in memory of its own (a
        shared array pickles only into a process being started: the dataset could not be
        pickled or copied at all)."""
        from multiprocessing.context import get_spawning_popen

        if isinstance(self._raw, bytearray) or get_spawning_popen() is not None:
            return super().__reduce_ex__(protocol)
        return _copied_start, (self._a.tobytes(),)

    @property
    def _a(self) -> np.ndarray:
        return np.frombuffer(self._raw, dtype=np.int64)

    @property
    def epoch(self) -> int:
        return int(self._a[0])

    @property
    def serial(self) -> int:
        """Counts `set_resume` calls: which resume point is pending (a worker that holds a
        point's contents checks it holds this one)."""
        return int(self._a[5])

    def set_epoch(self, epoch: int) -> bool:
        """Start the next iteration at the start of `epoch`, unless a resume point of that
        epoch is pending (False: kept)."""
        if self.peek()[4] and self.epoch == epoch:
            return False
        self._a[:5] = (epoch, 0, 0, 0, 0)
        return True

    def set_resume(self, epoch: int, origin: int, first: int, cursor: int) -> None:
        """Start the next iteration at step `first` of the plan of `(epoch, origin)`, which
        starts at row `cursor`."""
        a = self._a
        a[:7] = (epoch, origin, first, 0, cursor, a[5] + 1, 0)
        a[3] = 1

    def peek(self) -> tuple[int, int, int, int, bool]:
        """`(epoch, origin, first step, cursor, resuming)` where the next iteration starts."""
        a = self._a
        n = int(a[6])
        if a[3] and n and bool((a[7 : 7 + n] == a[5]).all()):
            a[3] = 0  # every worker of an iteration has started from it
        if not a[3]:
            return int(a[0]), 0, 0, 0, False
        return int(a[0]), int(a[1]), int(a[2]), int(a[4]), True

    def take(self, worker: int | None = None, workers: int = 1) -> tuple[int, int, int, int]:
        """`(epoch, origin, first step, cursor)` for an iteration that starts now: in process
        (`worker` None) or in DataLoader worker `worker` of `workers`."""
        epoch, origin, first, cursor, resuming = self.peek()
        if resuming:
            a = self._a
            if worker is None:
                a[3] = 0
            elif workers > CLAIM_SLOTS:
                raise ConfigError(
                    f"{workers} DataLoader workers cannot share a resume point (at most "
                    f"{CLAIM_SLOTS}); use fewer workers"
                )
            else:
                a[7 + worker] = a[5]
                a[6] = workers
        return epoch, origin, first, cursor

    def drop(self) -> None:
        """Use the pending resume point up (a loader that passes the start to its workers)."""
        self._a[3] = 0


def _copied_start(values: bytes) -> PendingStart:
    """A `PendingStart` in shared memory of its own holding `values` (`__reduce_ex__`)."""
    return PendingStart(values=values)
