"""`PackedDataLoader`: a plain torch DataLoader over a `PackedDataset` that keeps its own state.

The main process counts the batches it hands out; since batches arrive in global-step order, that
count is the resume point, independent of how many workers produced them. Use it, or torchdata's
`StatefulDataLoader(ds, batch_size=None, ...)` (same number of workers on resume, or load its
state into the dataset, which accepts it whatever the worker count).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader

from loader.order.steps import EpochPlan
from loader.packed.dataset import CHUNK, PackedDataset
from loader.packed.resume import IterationStart
from loader.packed.transport import CompactBatch, Ring
from loader.packed.workers import WorkerInit, check_worker_args, from_workers
from packtool.errors import ConfigError


class PackedDataLoader(DataLoader):
    """A DataLoader whose `state_dict()` resumes the stream exactly where it stopped.

    Args:
        dataset: The dataset (it yields whole batches, so `batch_size=None`, which may be given;
            any other batch_size is refused).
        num_workers: Worker processes (0: load in the main process).
        persistent_workers: Keep workers between epochs.
        **kwargs: Passed to `torch.utils.data.DataLoader` (pin_memory, prefetch_factor, ...).

    With `pin_memory=True` the expanded batch is allocated pinned (when CUDA is available).
    """

    def __init__(
        self,
        dataset: PackedDataset,
        *,
        num_workers: int = 0,
        persistent_workers: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, PackedDataset):
            raise ConfigError(
                f"PackedDataLoader takes a PackedDataset, got {type(dataset).__name__} (a "
                "MixedDataset goes to MixedDataLoader; anything else to torch's DataLoader)"
            )
        check_worker_args(num_workers, kwargs)
        if "batch_size" in kwargs and kwargs["batch_size"] is None:
            del kwargs["batch_size"]  # what the loader uses itself: the batches are whole
        taken = sorted(
            set(kwargs)
            & {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last", "collate_fn"}
        )
        if taken:
            raise ConfigError(
                f"PackedDataLoader: {taken} belong to the dataset (its batches are whole: "
                "rows_per_batch or tokens_per_batch, shuffle, drop_last), not the loader"
            )
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            **kwargs,
        )
        self._packed: PackedDataset = dataset
        self._user_worker_init = self.worker_init_fn
        self._ring: Ring | None = None
        # (this iteration's start, consumed steps) after the last batch handed out: the state
        # dict is built on request only. It holds while the dataset's generation is the one seen
        # when this iteration began (no set_epoch / load_state_dict since); otherwise, and before
        # the first iteration (None), the dataset's next start is the position.
        self._position: tuple[IterationStart, int] | None = None
        self._generation: int | None = None

    def _new_ring(self, plan: EpochPlan) -> Ring:
        ds = self._packed
        # A worker can have its in-flight items (CHUNK batches each) plus one block waiting for
        # earlier blocks.
        in_flight = ((self.prefetch_factor or 2) * self.num_workers + 2) * CHUNK
        block = ds.block_steps(plan) if self.num_workers > 1 else 0
        return Ring(
            num_workers=self.num_workers,
            slots=in_flight + block + block // 4,
            max_tokens=ds.max_batch_tokens,
            max_docs=ds.max_batch_docs(),
            token_dtype=ds.store.token_dtype,
            columns=ds.store.optional,
        )

    def __iter__(self) -> Iterator[dict]:
        ds = self._packed
        start = ds.next_start()
        self._position = (start, start.first)
        self._generation = ds.generation
        consumed = start.first
        if self.num_workers == 0:  # the dataset iterates here: it uses a resume point up itself
            for batch in super().__iter__():
                consumed += 1
                self._position = (start, consumed)
                yield batch
        else:
            ds.handoff.workers_iterate(self.num_workers)  # its own state_dict() would be stale
            # Persistent workers keep the ring they started with; otherwise every iteration
            # starts new workers, with a ring of their own (two live iterators never share one).
            if self._ring is None or not self.persistent_workers or self._iterator is None:
                self._ring = self._new_ring(start.plan)
                self.worker_init_fn = WorkerInit(self._ring, self._user_worker_init)
            ring = self._ring
            # The workers start where this iteration does, and the resume point is used up.
            ring.start[:] = torch.tensor((start.epoch, start.origin, start.first, start.cursor))
            ds.use_up_start()
            pin = bool(self.pin_memory)
            # Workers produce blocks of steps; hold early arrivals until their turn.
            waiting: dict[int, CompactBatch] = {}
            for chunk in from_workers(super().__iter__()):
                for item in chunk:
                    waiting[item.step] = item
                while consumed in waiting:
                    item = waiting.pop(consumed)
                    try:
                        batch = ds.expand(ring.take(item), filler=item.filler, pin_memory=pin)
                    finally:
                        ring.release(item)
                    consumed += 1
                    self._position = (start, consumed)
                    yield batch
            if waiting:
                raise RuntimeError(f"loader workers skipped step {consumed}; this is a bug")

    def set_epoch(self, epoch: int) -> None:
        """`PackedDataset.set_epoch`: what `Trainer` and accelerate call on a loader each epoch."""
        self._packed.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this loader handed out.

        After `set_epoch` / `load_state_dict` and before the next iteration: where that
        iteration will start (a checkpoint taken between epochs resumes at the new one).
        """
        ds = self._packed
        if self._generation != ds.generation:
            start = ds.next_start()
            return {"packed_dataset": ds.state_at(start, start.first)}
        return {"packed_dataset": ds.state_at(*self._position)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()` (also accepts a StatefulDataLoader or dataset state).

        The dataset's new generation makes `state_dict()` report its resume point until the next
        iteration starts there.
        """
        self._packed.load_state_dict(state)


def make_dataloader(dataset: PackedDataset, **kwargs: Any) -> PackedDataLoader:
    """`PackedDataLoader(dataset, **kwargs)`."""
    return PackedDataLoader(dataset, **kwargs)
