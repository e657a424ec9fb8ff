"""`PackedDataLoader`: a plain torch DataLoader over a `PackedDataset` that keeps its own state.

The main process counts the batches it hands out; since batches arrive in global-step order, that
count is the resume point, independent of how many workers produced them. Use it, or torchdata's
`StatefulDataLoader(ds, batch_size=None, ...)` (same number of workers on resume, or load its
state into the dataset, which accepts it whatever the worker count).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch.utils.data import DataLoader

from loader.dataset import PackedDataset


class PackedDataLoader(DataLoader):
    """A DataLoader whose `state_dict()` resumes the stream exactly where it stopped.

    Args:
        dataset: The dataset (it yields whole batches, so `batch_size=None`).
        num_workers: Worker processes (0: load in the main process).
        persistent_workers: Keep workers between epochs.
        **kwargs: Passed to `torch.utils.data.DataLoader` (pin_memory, prefetch_factor, ...).
    """

    def __init__(
        self,
        dataset: PackedDataset,
        *,
        num_workers: int = 0,
        persistent_workers: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=None,
            num_workers=num_workers,
            persistent_workers=persistent_workers and num_workers > 0,
            **kwargs,
        )
        self._packed: PackedDataset = dataset
        self._state = dataset._state(dataset.epoch, 0, 0, dataset.plan(dataset.epoch))

    def __iter__(self) -> Iterator[dict]:
        ds = self._packed
        shared = ds._shared
        epoch = int(shared[0])
        origin, first = (int(shared[1]), int(shared[2])) if shared[3] else (0, 0)
        plan = ds.plan(epoch, origin)
        self._state = ds._state(epoch, origin, first, plan)
        consumed = first
        for batch in super().__iter__():
            consumed += 1
            self._state = ds._state(epoch, origin, consumed, plan)
            yield batch
        # The resume point is used up; a new iteration of this epoch starts from the beginning.
        if shared[3] and int(shared[0]) == epoch:
            shared[3] = 0

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this loader handed out."""
        return {"packed_dataset": dict(self._state)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()` (also accepts a StatefulDataLoader or dataset state)."""
        self._packed.load_state_dict(state)
        ds = self._packed
        self._state = ds._state(
            int(ds._shared[0]), int(ds._shared[1]), int(ds._shared[2]), ds.plan(int(ds._shared[0]), int(ds._shared[1]))
        )


def make_dataloader(dataset: PackedDataset, **kwargs: Any) -> PackedDataLoader:
    """`PackedDataLoader(dataset, **kwargs)`."""
    return PackedDataLoader(dataset, **kwargs)
