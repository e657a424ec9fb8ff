"""Where a `PackedTrainer` run's data stands in a checkpoint, and what a resume makes of it.

Trainer records its global step g and nothing of the data; resuming, it continues at epoch
g // U, batch k = (g % U) x gradient_accumulation_steps, with U the optimizer steps per epoch
of *this* run. That is where the data stands only when this run cuts rows into batches and steps
as the saved one did: on another world size, `rows_per_batch` or gradient accumulation it
trained rows twice or never (2 ranks x 5 steps resumed on 1 rank: rows 10-19 twice), without a
word. So every checkpoint also holds the train loader's own position, its `state_dict()` as JSON
text in trainer_state.json (`stateful_callbacks`: `PackedPosition` for a `PackedDataset`,
`MixturePosition` for a `MixedDataset`; the state of a step is the same on every rank, and rank
0 writes the file). loader/hf/trainer.py resumes from it; here are the callbacks, the reading
of a saved position, the checks of a checkpoint written before there was one
(`check_unrecorded`), and the arithmetic of what Trainer's remaining steps hold
(`stream_warning`).
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from packtool.errors import ConfigError, json_value
from packtool.storage import local as storage

SINCE = "2026-12-07"
"""The first packtool whose PackedTrainer checkpoints hold the `PackedDataset` position."""


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):  # a numpy scalar
        return value.item()
    raise TypeError(f"not JSON: {value!r}")


class LoaderPosition(TrainerCallback, ExportableState):
    """Saves the train loader's position (its `state_dict()`) with every checkpoint, in
    trainer_state.json (`TrainerState.stateful_callbacks`), for a resume to start from. As
    JSON text, kept as the loader wrote it: Trainer writes the file with sorted keys (a mixture
    state keeps its sources' order in a list, `order`, since a reordered dict read as a changed
    mixture; text keeps any state as it was)."""

    def __init__(self) -> None:
        self.loader: Any = None
        self.accumulation: int | None = None

    def state(self) -> dict[str, Any]:
        loader = self.loader
        position = json.dumps(loader.state_dict(), default=_plain) if loader is not None else None
        attributes = {"position": position, "gradient_accumulation_steps": self.accumulation}
        return {"args": {}, "attributes": attributes}

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        # The Trainer loader (trainer.py) wraps the packtool loader whose state is saved.
        self.loader = getattr(train_dataloader, "loader", None)
        self.accumulation = args.gradient_accumulation_steps  # for messages only
        # a checkpoint saved without it (Trainer's save expects every exported state's key)
        state.stateful_callbacks.setdefault(type(self).__name__, self.state())


class MixturePosition(LoaderPosition):
    """The train `MixedDataLoader`'s position (a `MixedDataset` is read once: the position, not
    the step count, places a resume)."""


class PackedPosition(LoaderPosition):
    """The train `PackedDataLoader`'s position (epoch, step, rows consumed and the layout that
    cut them: a resume on other ranks or batch settings continues at the first row no step
    trained)."""


def saved_position(state: Any, callback: type) -> dict[str, Any] | None:
    """The loader position `callback` saved in a checkpoint's trainer state (None: none saved).

    Raises:
        ConfigError: It is not JSON (a damaged checkpoint).
    """
    saved = (state.stateful_callbacks or {}).get(callback.__name__)
    position = saved.get("attributes", {}).get("position") if isinstance(saved, dict) else None
    if not isinstance(position, str):
        return None
    try:
        return json_value(position)
    except ValueError:
        raise ConfigError(
            f"the checkpoint's loader position ({callback.__name__} in its trainer_state.json) "
            "is not JSON; the checkpoint is damaged"
        ) from None


def saved_accumulation(state: Any, callback: type) -> int | None:
    """The gradient accumulation the checkpoint's run used, as `callback` saved it (messages)."""
    saved = (state.stateful_callbacks or {}).get(callback.__name__)
    ga = (
        saved.get("attributes", {}).get("gradient_accumulation_steps")
        if isinstance(saved, dict)
        else None
    )
    return ga if isinstance(ga, int) and not isinstance(ga, bool) else None


def check_unrecorded(checkpoint: Any, *, world_size: int, state: Any, epoch: int) -> None:
    """Where a checkpoint holds no `PackedPosition` (written before `SINCE`), allow Trainer's own
    placement (`g // U`, `(g % U) x gradient_accumulation_steps`) only where what the
    checkpoint does record agrees with this run: its world size (Trainer writes
    `rng_state.pth` on one process, `rng_state_<rank>.pth` on each of several) and the steps it
    planned (`max_steps` and `num_train_epochs` in trainer_state.json, which change with the
    steps per epoch); then warn that `rows_per_batch` itself is not recorded.

    Raises:
        ConfigError: What the checkpoint records differs from this run, or is not there.
    """
    folder = Path(str(checkpoint)) if checkpoint is not None else None
    differs = None
    written = _written_world_size(folder) if folder is not None else None
    if written is None:
        differs = "records no world size (no rng_state*.pth)"
    elif written != world_size:
        differs = f"was written by {written} process(es), this run has {world_size}"
    else:
        planned = _planned_steps(folder / "trainer_state.json")
        ours = (state.max_steps, state.num_train_epochs)
        if planned is None:
            differs = "records no planned steps (trainer_state.json)"
        elif planned != ours:
            differs = (
                f"planned {planned[0]} optimizer steps in {planned[1]} epoch(s), this run "
                f"{ours[0]} in {ours[1]} (other batch or gradient accumulation settings)"
            )
    if differs is not None:
        raise ConfigError(
            f"the checkpoint at global step {state.global_step} holds no data position "
            f"(PackedPosition in its trainer_state.json, saved since {SINCE}) and {differs}: "
            "Trainer's step count would place the data elsewhere (rows trained twice or "
            "never); resume with the checkpoint's world size, rows_per_batch and "
            f"gradient_accumulation_steps, or with ignore_data_skip=True to start epoch {epoch} "
            "over"
        )
    warnings.warn(
        f"the checkpoint at global step {state.global_step} holds no data position (saved "
        f"since {SINCE}): resumed where Trainer's step count says, as before, which is exact "
        "only with the checkpoint's rows_per_batch (its world size and planned steps agree; "
        "rows_per_batch is not recorded)",
        stacklevel=2,
    )


def _written_world_size(folder: Path) -> int | None:
    """The processes Trainer saved a checkpoint with, from its RNG files (None: none there)."""
    if storage.exists(folder / "rng_state.pth"):
        return 1
    n = 0
    while storage.exists(folder / f"rng_state_{n}.pth"):
        n += 1
    return n or None


def _planned_steps(path: Path) -> tuple[int, int] | None:
    try:
        saved = json_value(storage.read_text(path))
        return int(saved["max_steps"]), int(saved["num_train_epochs"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def stream_warning(
    *,
    saved: dict[str, Any],
    ours: dict[str, Any],
    data_epoch: int,
    rest: int,
    epoch_batches: int,
    trainer_epoch: int,
    skip: int,
    epochs: int,
    ga: int,
) -> str | None:
    """What a stream resumed off Trainer's own position leaves out, in words (None: nothing).

    The stream holds `rest` batches of data epoch `data_epoch`, then `epoch_batches` a data epoch
    up to epoch `epochs - 1`; Trainer takes `epoch_batches` a Trainer epoch, from batch `skip`
    of its epoch `trainer_epoch` to the end of epoch `epochs - 1` (a run of whole epochs: its
    `max_steps` is `epochs` x U). Trainer counts the steps the checkpoint took as steps of its
    own size, so with larger batches than the checkpoint's its remaining steps hold fewer
    batches than the data left (those are not trained), and with smaller ones the data ends
    first, possibly inside a gradient accumulation step (whose batches then get no optimizer
    step). `saved` and `ours`: the checkpoint's and this run's layouts, for the message.
    """
    left = rest + max(epochs - 1 - data_epoch, 0) * epoch_batches if data_epoch < epochs else 0
    room = max((epochs - trainer_epoch) * epoch_batches - skip, 0)
    was = _layout_words(saved)
    now = _layout_words(ours)
    if left > room:
        short = left - room
        more = math.ceil(short / ga)
        return (
            f"resuming a checkpoint saved with {was} on {now}: Trainer counts the steps already "
            f"taken as steps of this size, so the {short} last batch(es) of epoch {epochs - 1} "
            f"lie beyond this run's steps and will not be trained; give max_steps (about "
            f"{more} more optimizer step(s)) to train them"
        )
    if left:
        at = (skip + left - 1) % epoch_batches + 1  # where the data ends in a Trainer epoch
        if at % ga and at != epoch_batches:
            return (
                f"resuming a checkpoint saved with {was} on {now}: the data of the run's "
                f"{epochs} epoch(s) ends {at % ga} batch(es) into a gradient accumulation step, "
                "whose gradients get no optimizer step (Trainer counts the steps already taken "
                "as steps of this size, and its later steps find no data)"
            )
    return None


def _layout_words(layout: dict[str, Any]) -> str:
    ranks = layout.get("world_size")
    rows = layout.get("rows_per_batch")
    ga = layout.get("gradient_accumulation_steps")
    words = f"{ranks} rank(s) x {rows} rows"
    return words + (f", gradient accumulation {ga}" if ga is not None else "")
