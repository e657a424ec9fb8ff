"""`transformers.Trainer` on a `PackedDataset`: epochs reshuffled, mid-epoch resume exact.

Imported on first use (`from loader.hf import PackedTrainer`); imports transformers.

How Trainer drives a train loader (transformers 5.x, `Trainer._run_epoch`): each epoch it calls
`loader.set_epoch(epoch)` and iterates it. Resuming from a checkpoint at global step g, it takes
`epoch = g // U` and `k = (g % U) * gradient_accumulation_steps` (U = optimizer steps per epoch,
from `len(loader)`), and for that epoch iterates `accelerate.skip_first_batches(loader, k)`
instead: a new loader over `loader.dataset` that reads k batches and drops them, and that has no
`set_epoch` (so a plain loader would replay epoch 0's order, and pay for decoding k batches).

`TrainerLoader` makes that path exact and cheap: its `dataset` is a view that first yields k
empty `SkippedBatch` placeholders (what the skip drops) and then the `PackedDataLoader`'s
batches, already placed where the data stands (`_PackedEpochs.on_train_begin`).
`PackedTrainerMixin.training_step` refuses a placeholder and checks that the first batch trained
after the resume is the view's first real one, so a skip count that ever disagreed would fail
loudly instead of silently dropping or repeating data.

Where the data stands is the loader's position saved with the checkpoint (`PackedPosition`,
loader/hf/resume.py), not Trainer's (epoch, k): those agree only when the run cuts batches and
steps as the saved one did. Where they agree, the loader is placed at step k of that epoch and
Trainer's epochs stay the data's. Where they do not (another world size, `rows_per_batch` or
gradient accumulation), the loader's stream continues from the saved position (the first row no
step trained) and each Trainer epoch takes the next `len(loader)` batches of it, the stream
moving on to the next epoch's permutation as one ends, up to Trainer's epoch count: every row
once per epoch; a warning counts what Trainer's remaining steps cannot hold. A checkpoint
written before the position was saved is resumed by Trainer's (epoch, k) only where what it
records agrees with the run (`check_unrecorded`), else refused.

A `MixedDataset` (layout="hf") trains the same way through a `MixedDataLoader`
(`MixtureTrainerLoader`): the mixture is read once (Trainer's epochs continue it; `len` is its
steps, none without `total_steps`, and Trainer is held to them), and its position is saved with
every checkpoint (`MixturePosition`, in trainer_state.json, resume.py) and loaded on a resume, where the
skip's placeholders are dropped as above: the position, not the step count, places the stream,
so a mixture changed between the runs resumes as `MixedDataset.load_state_dict` says.
"""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import IterableDataset
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import get_last_checkpoint

from loader.hf.datasets import check_packed_model
from loader.hf.resume import (
    MixturePosition,
    PackedPosition,
    check_unrecorded,
    saved_accumulation,
    saved_position,
    stream_warning,
)
from loader.packed.dataloader import PackedDataLoader
from loader.packed.dataset import PackedDataset
from packtool.errors import ConfigError


class SkippedBatch(dict):
    """A placeholder the resume skip drops; training on one is a bug (refused)."""


def _identity(item: Any) -> Any:
    return item


class _SkipView(IterableDataset):
    """What `accelerate.skip_first_batches` wraps: placeholders, then the real batches."""

    def __init__(self, owner: TrainerLoader) -> None:
        self.owner = owner
        self.placeholders = 0
        self.first_real: dict | None = None

    def __iter__(self) -> Iterator[dict]:
        for _ in range(self.placeholders):
            yield SkippedBatch()
        self.placeholders = 0
        for i, batch in enumerate(self.owner.batches()):
            if i == 0:
                self.first_real = batch
            yield batch

    def __len__(self) -> int:
        return len(self.owner)


class TrainerLoader:
    """The train loader `PackedTrainerMixin` hands to Trainer (wraps a `PackedDataLoader`).

    Has what Trainer and `accelerate.skip_first_batches` read: `len`, `set_epoch`, `dataset`
    (the skip view), `batch_size=None`, `drop_last`, `collate_fn`; `state_dict` /
    `load_state_dict` are the `PackedDataLoader`'s.
    """

    batch_size = None
    drop_last = False
    num_workers = 0  # the skip view runs in the trainer; the PackedDataLoader has the workers
    collate_fn = staticmethod(_identity)
    pin_memory = False
    prefetch_factor = None
    persistent_workers = False

    def __init__(self, loader: PackedDataLoader) -> None:
        self.loader = loader
        self.packed: PackedDataset = loader.dataset
        self.dataset = _SkipView(self)
        self.steps = self.packed.plan(0).num_steps
        self.last_epoch: int | None = None
        """Set by a resume off Trainer's own position (`continue_from`): the loader's stream
        goes on from the saved position, epoch after epoch up to this one (not included),
        whatever epoch Trainer counts; None: Trainer's epochs are the data's."""
        self._streamed = False

    def __iter__(self) -> Iterator[dict]:
        return self.batches()

    def batches(self) -> Iterator[dict]:
        """The loader's batches (what the skip view yields after its placeholders)."""
        if self.last_epoch is None:
            return iter(self.loader)
        return self._stream()

    def _stream(self) -> Iterator[dict]:
        """The stream from where Trainer's last epoch stopped taking batches, into the next
        epoch's permutation whenever one ends."""
        loader, packed = self.loader, self.packed
        if self._streamed:
            loader.load_state_dict(loader.state_dict())
        self._streamed = True
        while True:
            yield from loader
            if packed.epoch + 1 >= self.last_epoch:
                return
            loader.set_epoch(packed.epoch + 1)

    def __len__(self) -> int:
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        if self.last_epoch is None:  # else the stream moves on by itself
            self.loader.set_epoch(epoch)

    def resume(self, epoch: int, skip: int, position: dict[str, Any] | None = None) -> None:
        """Place the stream at step `skip` of `epoch`, and let the skip drop placeholders."""
        self.packed.seek(epoch, skip)
        self.dataset.placeholders = skip
        self.dataset.first_real = None

    def continue_from(
        self, position: dict[str, Any], epoch: int, skip: int, last_epoch: int
    ) -> bool:
        """Place the stream at a saved `position` (`PackedDataLoader.state_dict()`), Trainer
        being at batch `skip` of its epoch `epoch`, and let the skip drop placeholders. True
        where that is not Trainer's own position: the stream then goes on from the saved one
        up to epoch `last_epoch` (`batches`).

        Raises:
            DataError: A position of another dataset or seed, or another row order in the
                middle of an epoch (`PackedDataset.load_state_dict`).
        """
        self.loader.load_state_dict(position)
        at, origin, first = self.packed.pending_start()
        ended = not self.packed.next_start().plan.has_step(first)
        own = (at, origin, first) == (epoch, 0, skip) or (ended and (at + 1, 0) == (epoch, skip))
        self.last_epoch = None if own else last_epoch
        self.dataset.placeholders = skip
        self.dataset.first_real = None
        return not own

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state)


class MixtureTrainerLoader(TrainerLoader):
    """`TrainerLoader` for a `MixedDataset` (wraps a `MixedDataLoader`).

    The mixture is read once: `set_epoch` does nothing and an iteration after the first
    continues where the last one stopped (Trainer's next epoch gets no batch once the mixture
    has ended, and stops), and `len` is the mixture's steps (`MixedDataset.__len__`; a
    `TypeError` without `total_steps`: Trainer then needs `max_steps`).
    """

    def __init__(self, loader: Any) -> None:
        self.loader = loader
        self.dataset = _SkipView(self)
        try:
            self.steps: int | None = len(loader)
        except TypeError:
            self.steps = None
        self._started = False

    def batches(self) -> Iterator[dict]:
        if self._started:  # continue the mixture, never start it over
            self.loader.load_state_dict(self.loader.state_dict())
        self._started = True
        return iter(self.loader)

    def __len__(self) -> int:
        if self.steps is None:
            raise TypeError("a mixture without total_steps has no length in steps")
        return self.steps

    def set_epoch(self, epoch: int) -> None:
        pass

    def resume(self, epoch: int, skip: int, position: dict[str, Any] | None = None) -> None:
        """Continue from `position` (a `MixedDataLoader` state), and let the skip drop `skip`
        placeholders."""
        if position is not None:
            self.loader.load_state_dict(position)
        self.dataset.placeholders = skip
        self.dataset.first_real = None


def _mixed(ds: Any) -> bool:
    """Whether `ds` is a `MixedDataset` (its module is loaded where there is one: importing it
    would load numba's kernels)."""
    found = sys.modules.get("loader.mixture.dataset")
    return found is not None and isinstance(ds, found.MixedDataset)


def _check_mixture_steps(ds: Any, args: Any) -> None:
    """Trainer's steps against the train mixture's: it is read once, so the steps Trainer plans
    (its learning-rate schedule's) must be there."""
    try:
        steps = len(ds)
    except TypeError:
        if args.max_steps <= 0:
            raise ConfigError(
                "the train MixedDataset has no length in steps (no total_steps): give "
                "TrainingArguments(max_steps=...), or the mixture a total_steps"
            ) from None
        return
    ga = args.gradient_accumulation_steps
    updates = math.ceil(steps / ga)
    if args.max_steps > updates:
        raise ConfigError(
            f"max_steps {args.max_steps} is more than the {updates} optimizer steps the train "
            f"MixedDataset holds ({steps} batches, gradient_accumulation_steps {ga}); a mixture "
            "is read once: lower max_steps, or raise the mixture's total_steps"
        )
    if args.max_steps <= 0 and args.num_train_epochs > 1:
        raise ConfigError(
            f"num_train_epochs {args.num_train_epochs:g} would read the train MixedDataset more "
            "than once, but a mixture is read once (repeat a source with its max_epochs): set "
            "num_train_epochs=1, or max_steps"
        )


def _check_dataset(ds: Any, args: Any, role: str) -> None:
    mixed = _mixed(ds)
    if not mixed and not isinstance(ds, PackedDataset):
        return
    kind = "MixedDataset" if mixed else "PackedDataset"
    c = ds.config
    if c.layout != "hf":
        raise ConfigError(
            f"the {role} {kind} gives layout={c.layout!r} batches; transformers models "
            f"take layout='hf' ({kind}(..., layout='hf'))"
        )
    if mixed and role == "train":
        _check_mixture_steps(ds, args)
    if role == "train" and not mixed and c.rows_per_batch is None:
        raise ConfigError(
            "Trainer counts every epoch as len(loader) steps, but with tokens_per_batch the "
            "number of steps changes from epoch to epoch; use rows_per_batch"
        )
    if (ds.rank, ds.world_size) != (args.process_index, args.world_size):
        raise ConfigError(
            f"the {role} {kind} was made for rank {ds.rank} of {ds.world_size} but this "
            f"Trainer process is rank {args.process_index} of {args.world_size}; make it after "
            "TrainingArguments, or pass rank=args.process_index, world_size=args.world_size"
        )
    if args.dataloader_drop_last:
        raise ConfigError(
            f"TrainingArguments(dataloader_drop_last=True) does not reach the {role} {kind}'s "
            f"batches (they are made whole by the dataset); use {kind}(..., drop_last=True) "
            "and leave dataloader_drop_last False"
        )


def _loader_kwargs(args: Any) -> dict[str, Any]:
    workers = args.dataloader_num_workers
    kwargs: dict[str, Any] = {
        "num_workers": workers,
        "pin_memory": args.dataloader_pin_memory and torch.cuda.is_available(),
        "persistent_workers": args.dataloader_persistent_workers,
    }
    if workers > 0:
        if args.dataloader_prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.dataloader_prefetch_factor
        if args.dataloader_multiprocessing_context is not None:
            kwargs["multiprocessing_context"] = args.dataloader_multiprocessing_context
    return kwargs


class _PackedEpochs(TrainerCallback):
    """Checks the model, and on a resume places the loader where the data stands."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.checkpoint: Any = None
        """The checkpoint `train` resumes from (`PackedTrainerMixin.train`)."""

    def on_train_begin(self, args, state, control, **kwargs):
        trainer = self.trainer
        check_packed_model(trainer.model)
        loader = kwargs.get("train_dataloader")
        if not isinstance(loader, TrainerLoader) or state.global_step == 0:
            return
        # transformers.Trainer._init_training_state / set_initial_training_values (without a
        # length, an epoch is max_steps).
        ga = args.gradient_accumulation_steps
        if loader.steps is None:
            per_epoch = args.max_steps
        else:
            per_epoch = max(loader.steps // ga + int(loader.steps % ga > 0), 1)
        epoch = state.global_step // per_epoch
        skip = 0 if args.ignore_data_skip else (state.global_step % per_epoch) * ga
        if isinstance(loader, MixtureTrainerLoader):
            position = None
            if not args.ignore_data_skip:
                position = saved_position(state, MixturePosition)
                if position is None:
                    raise ConfigError(
                        f"the checkpoint at global step {state.global_step} holds no mixture "
                        "position (MixturePosition in its trainer_state.json, saved by "
                        "PackedTrainer training on a MixedDataset); resume with "
                        "ignore_data_skip=True to start the mixture over"
                    )
            loader.resume(epoch, skip, position)
        elif args.ignore_data_skip:
            loader.resume(epoch, 0)  # the epoch over, as Trainer's flag says
        else:
            self._place(loader, args, state, epoch, skip)
        trainer._packed_expect_first = skip > 0

    def _place(self, loader: TrainerLoader, args: Any, state: Any, epoch: int, skip: int) -> None:
        """Place a `PackedDataset`'s loader at the position its checkpoint saved (resume.py)."""
        position = saved_position(state, PackedPosition)
        if position is None:  # written before positions were saved
            check_unrecorded(self.checkpoint, world_size=args.world_size, state=state, epoch=epoch)
            loader.resume(epoch, skip)
            return
        if not loader.continue_from(position, epoch, skip, state.num_train_epochs):
            return
        epochs = float(args.num_train_epochs)
        if args.max_steps > 0 or not epochs.is_integer():
            return  # a run of so many steps: its budget is its own
        ours = loader.packed.config.layout_key(loader.packed.world_size)
        saved = dict(position.get("packed_dataset", {}).get("layout", {}))
        saved["gradient_accumulation_steps"] = saved_accumulation(state, PackedPosition)
        text = stream_warning(
            saved=saved,
            ours={**ours, "gradient_accumulation_steps": args.gradient_accumulation_steps},
            data_epoch=loader.packed.epoch,
            rest=len(loader.packed),
            epoch_batches=loader.steps,
            trainer_epoch=epoch,
            skip=skip,
            epochs=int(epochs),
            ga=args.gradient_accumulation_steps,
        )
        if text is not None:
            warnings.warn(text, stacklevel=2)


class PackedTrainerMixin:
    """Mix into a `transformers.Trainer` subclass to train on a `PackedDataset` or a
    `MixedDataset` (layout="hf").

    The train loader is a `PackedDataLoader` (workers, pinning and prefetch from
    `TrainingArguments.dataloader_*`); each epoch is the dataset's own permutation of that
    epoch, its position is saved with every checkpoint (`PackedPosition`), and
    `resume_from_checkpoint` continues the token stream from it: exactly, or on another world
    size or batch settings from the first row no step trained (module docstring). The batch size is
    the dataset's (`rows_per_batch`); `per_device_train_batch_size` is not used. The model is
    checked (`check_packed_model`) at init and when training starts. A `PackedDataset` given as
    `eval_dataset` is read in stored order by a `PackedDataLoader` too.

    A `MixedDataset` (layout="hf") as `train_dataset` is read by a `MixedDataLoader`, once
    (`MixtureTrainerLoader`; `num_train_epochs` 1 or `max_steps` within its steps), and its
    position is saved with every checkpoint and continued by `resume_from_checkpoint`
    (`MixturePosition`); as `eval_dataset`, a `MixedDataLoader` from its start.

    Raises:
        ConfigError: The dataset is not `layout="hf"`, or was made for another rank; a
            `PackedDataset` uses `tokens_per_batch` (Trainer needs the same number of steps
            every epoch); a `MixedDataset` holds fewer steps than Trainer would take (or has no
            length and no `max_steps` is given); the arguments set `dataloader_drop_last` (the
            dataset's `drop_last` drops a short last step); the model would attend across
            documents; a resume from a checkpoint without the mixture's position, or without a
            `PackedDataset`'s where what it records differs from the run (resume.py).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        train, targs = kwargs.get("train_dataset"), kwargs.get("args")
        if _mixed(train) and targs is not None:  # before Trainer's own (multi-line) refusal
            _check_mixture_steps(train, targs)
        super().__init__(*args, **kwargs)
        _check_dataset(self.train_dataset, self.args, "train")
        evals = (
            self.eval_dataset if isinstance(self.eval_dataset, dict) else {"": self.eval_dataset}
        )
        for ds in evals.values():
            _check_dataset(ds, self.args, "eval")
        if getattr(self, "get_sp_size", lambda: 1)() > 1:
            raise ConfigError("PackedTrainer does not support sequence parallelism (sp_size > 1)")
        check_packed_model(self.model)  # after Trainer set use_cache from TrainingArguments
        self._packed_expect_first = False
        self._packed_epochs = _PackedEpochs(self)
        self.add_callback(self._packed_epochs)
        if _mixed(self.train_dataset):
            self.add_callback(MixturePosition())
        elif isinstance(self.train_dataset, PackedDataset):
            self.add_callback(PackedPosition())

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        """`Trainer.train`; the checkpoint it resumes from is noted for the resume's checks."""
        checkpoint = resume_from_checkpoint
        if isinstance(checkpoint, bool):  # as Trainer reads it
            checkpoint = get_last_checkpoint(self.args.output_dir) if checkpoint else None
        self._packed_epochs.checkpoint = checkpoint
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def get_train_dataloader(self) -> Any:
        ds = self.train_dataset
        if _mixed(ds):
            from loader.mixture.dataloader import MixedDataLoader

            return MixtureTrainerLoader(MixedDataLoader(ds, **_loader_kwargs(self.args)))
        if not isinstance(ds, PackedDataset):
            return super().get_train_dataloader()
        return TrainerLoader(PackedDataLoader(ds, **_loader_kwargs(self.args)))

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        ds = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(ds, str):
            ds = self.eval_dataset[ds]
        if _mixed(ds):
            from loader.mixture.dataloader import MixedDataLoader

            _check_dataset(ds, self.args, "eval")
            return MixedDataLoader(ds, **_loader_kwargs(self.args))
        if not isinstance(ds, PackedDataset):
            return super().get_eval_dataloader(eval_dataset)
        _check_dataset(ds, self.args, "eval")
        return PackedDataLoader(ds, **_loader_kwargs(self.args))

    def training_step(self, model: Any, inputs: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(inputs, SkippedBatch):
            raise RuntimeError(
                "Trainer trained on a placeholder that its resume skip should have dropped: it "
                "skipped fewer batches than packtool computed from the checkpoint's global step"
            )
        if self._packed_expect_first:
            self._packed_expect_first = False
            view = self.callback_handler.train_dataloader.dataset
            first = view.first_real
            ids = first["input_ids"] if first is not None else None
            if ids is None or not torch.equal(ids, inputs["input_ids"].to(ids.device)):
                raise RuntimeError(
                    "the first batch trained after the resume is not the one packtool placed "
                    "there: Trainer skipped more batches than packtool computed from the "
                    "checkpoint's global step"
                )
        return super().training_step(model, inputs, *args, **kwargs)


class PackedTrainer(PackedTrainerMixin, Trainer):
    """`transformers.Trainer` with `PackedTrainerMixin`."""


class CheckPackedModel(TrainerCallback):
    """A callback for any Trainer (e.g. `trl.SFTTrainer`): `check_packed_model` when training
    starts, after Trainer has applied `TrainingArguments.use_cache`, on the model and on a batch
    its collator makes of the first training row (so `SFTTrainer` without `padding_free=True`,
    whose batches read each packed row as one sequence, is refused), a streaming dataset's too
    (`first_batch`)."""

    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        if model is not None:
            check_packed_model(model, first_batch(train_dataloader))


_OWN_ELSEWHERE = (
    ("loader.online.streaming", "StreamingPackedDataset"),
    ("loader.mixture.dataset", "MixedDataset"),
)
"""packtool's other iterable datasets, looked up only where their module is loaded already (an
instance means it is; importing them would load numba's kernels)."""


def _packtool_dataset(dataset: Any) -> bool:
    """Whether `dataset` is one of packtool's own (its batches are made by packtool's loader
    in the hf layout, and iterating it apart would start that loader)."""
    own: list[type] = [PackedDataset, _SkipView]
    for module, name in _OWN_ELSEWHERE:
        found = sys.modules.get(module)
        if found is not None:
            own.append(getattr(found, name))
    return isinstance(dataset, tuple(own))


def first_batch(loader: Any) -> dict[str, Any] | None:
    """What `loader`'s collator makes of its dataset's first row, built apart from the loader (its
    sampler draws nothing; an iterable dataset, such as a streaming `datasets.IterableDataset`,
    gives the row from a fresh iterator of its own). None where there is no first row to take:
    packtool's own datasets (their loader makes the batches), a one-pass iterator (a row taken
    would be lost), an empty dataset."""
    dataset, collate = getattr(loader, "dataset", None), getattr(loader, "collate_fn", None)
    if collate is None or dataset is None or _packtool_dataset(dataset):
        return None
    if isinstance(dataset, IterableDataset):
        rows = iter(dataset)
        if rows is dataset:
            return None
        try:
            row = next(rows, None)
        finally:
            close = getattr(rows, "close", None)  # a generator: release what it opened
            if close is not None:
                close()
        return collate([row]) if row is not None else None
    try:
        if not len(dataset):
            return None
        row = dataset[0]
    except (TypeError, KeyError, IndexError, NotImplementedError):
        return None  # a map-style dataset without integer indexing
    return collate([row])
