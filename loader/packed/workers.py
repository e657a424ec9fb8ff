"""The hand-off between a dataset and the DataLoader workers of its loader.

`PackedDataLoader` and `MixedDataLoader` both run their dataset in DataLoader worker processes
that send compact batches through a shared-memory ring (transport.py). Two things pass between
the loader and the dataset for that, the same for both:

- In each worker, the loader's `WorkerInit` hands the ring to that worker's copy of the
  dataset (`WorkerHandoff.use_ring`); with it, the copy produces compact batches for the ring
  instead of collated ones.
- In the main process, the loader tells the dataset that its workers iterate it
  (`WorkerHandoff.workers_iterate`): their copies advance and the main one does not, so the
  dataset's own `state_dict()` would repeat data and is refused (`check_own_state`) until the
  dataset iterates in process or loads a state (`in_process`).

Each dataset holds one `WorkerHandoff` as its `handoff` attribute.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import get_worker_info

from loader.packed.transport import Ring
from packtool.errors import ConfigError


class WorkerHandoff:
    """A dataset's side of being iterated by the workers of its loader.

    Args:
        dataset: The dataset's class name, for the refusal message.
        loader: The loader's class name, likewise.
    """

    def __init__(self, dataset: str, loader: str) -> None:
        self.dataset, self.loader = dataset, loader
        self.ring: Ring | None = None
        """The loader's ring, in a worker process of that loader (None elsewhere): the dataset's
        `__iter__` produces compact batches for it when set."""
        self.workers = 0
        """Workers of the loader that iterated the dataset last (main process; 0: it iterated
        here or loaded a state since)."""

    def use_ring(self, ring: Ring) -> None:
        """Make this worker's copy produce compact batches for `ring` (`WorkerInit` calls it
        in each worker, before the worker iterates)."""
        self.ring = ring

    def workers_iterate(self, num_workers: int) -> None:
        """The loader, in the main process, starts `num_workers` workers on the dataset: from
        now on this copy's position is not the stream's, and `check_own_state` refuses."""
        self.workers = num_workers

    def in_process(self) -> None:
        """The dataset's own position is the stream's again (the dataset calls it when it
        iterates in the main process or loads a state)."""
        self.workers = 0

    def check_own_state(self) -> None:
        """Refuse the dataset's own `state_dict()` in the main process after the loader's
        workers iterated it (the dataset's `state_dict` calls it first).

        Raises:
            ConfigError: This copy did not advance; a state of it would repeat data.
        """
        if self.workers and get_worker_info() is None:
            raise ConfigError(
                f"{self.dataset}.state_dict(): a {self.loader} with {self.workers} worker(s) "
                "iterated this dataset in its worker processes, so this process's copy did not "
                "advance and its state would repeat data; save the loader's state instead "
                f"({self.loader}.state_dict(), resumed with its load_state_dict)"
            )


class WorkerInit:
    """The `worker_init_fn` a loader starts its workers with: hands the ring to this worker's
    copy of the dataset (its `handoff`), then runs the user's own `worker_init_fn`, if any.

    `PackedDataLoader` and `MixedDataLoader` install one for each ring they make.
    """

    def __init__(self, ring: Ring, user_fn: Callable[[int], None] | None) -> None:
        self.ring = ring
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        get_worker_info().dataset.handoff.use_ring(self.ring)
        if self.user_fn is not None:
            self.user_fn(worker_id)
