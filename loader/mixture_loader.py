"""`MixedDataLoader`: a torch DataLoader over a `MixedDataset` that keeps the mixture's position.

Workers take blocks of consecutive global steps in turn (block w, w + N, ... of `block_steps`
steps: consecutive steps read neighbouring rows of every source, so a worker decodes few row
groups twice) and send each batch in compact form through the shared-memory ring of
loader/transport.py, with its per-document sources and the mixture state after it; the trainer
puts the batches back in step order, expands them (loader/collate.py) and keeps the state of
the last batch it handed out, which `state_dict()` returns. Every worker computes the whole
schedule, so the batches do not depend on the number of workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from torch.utils.data import DataLoader, get_worker_info

from loader.mixture import MixedDataset
from loader.transport import Ring

BLOCK_ROWS = 8192
"""Rows (all ranks) a worker's block of steps should span: about a shuffle window of rows for
two or three sources, so blocks seldom share a row group."""


class _WorkerInit:
    def __init__(self, ring: Ring, block: int, user_fn: Callable[[int], None] | None) -> None:
        self.ring, self.block, self.user_fn = ring, block, user_fn

    def __call__(self, worker_id: int) -> None:
        ds = get_worker_info().dataset
        ds._worker_ring, ds._block = self.ring, self.block
        if self.user_fn is not None:
            self.user_fn(worker_id)


class MixedDataLoader(DataLoader):
    """A DataLoader whose `state_dict()` resumes the mixture exactly where it stopped.

    Args:
        dataset: The mixture (it yields whole batches, so `batch_size=None`).
        num_workers: Worker processes (0: load in the main process).
        block_steps: Consecutive steps per worker block (default: about `BLOCK_ROWS` rows).
        **kwargs: Passed to `torch.utils.data.DataLoader` (pin_memory, prefetch_factor, ...);
            workers are not persistent (each iteration starts them with its start state).
    """

    def __init__(
        self,
        dataset: MixedDataset,
        *,
        num_workers: int = 0,
        block_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.pop("persistent_workers", None)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self._mixed = dataset
        self._user_worker_init = self.worker_init_fn
        self._state: dict[str, Any] | None = None
        c = dataset.config
        if block_steps is None:
            per_step = dataset.world_size * (
                c.rows_per_batch or max(c.tokens_per_batch // dataset.max_len, 1)
            )
            block_steps = max(1, min(1024, BLOCK_ROWS // per_step))
        self.block_steps = int(block_steps)

    def _new_ring(self) -> Ring:
        ds = self._mixed
        in_flight = ((self.prefetch_factor or 2) * self.num_workers + 2) * 4
        block = self.block_steps if self.num_workers > 1 else 0
        return Ring(
            num_workers=self.num_workers,
            slots=in_flight + block + block // 4,
            max_tokens=ds.max_batch_tokens,
            max_docs=ds.max_batch_docs(),
            token_dtype=ds.token_dtype,
        )

    def __iter__(self) -> Iterator[dict]:
        ds = self._mixed
        start = ds.start_state()
        self._state = start
        if self.num_workers == 0:
            for batch in super().__iter__():
                self._state = ds.state_dict()
                yield batch
            return
        ring = self._new_ring()
        self.worker_init_fn = _WorkerInit(ring, self.block_steps, self._user_worker_init)
        pin = bool(self.pin_memory)
        waiting: dict[int, tuple] = {}
        consumed = int(start["step"])
        for chunk in super().__iter__():
            for item, meta in chunk:
                waiting[item.step] = (item, meta)
            while consumed in waiting:
                item, (sources, state) = waiting.pop(consumed)
                try:
                    tokens, lens, ids = ring.take(item)
                    batch = ds.expand(
                        tokens, lens, ids, sources, filler=item.filler, pin_memory=pin
                    )
                finally:
                    ring.release(item)
                consumed += 1
                self._state = state
                ds.report(state["schedule"]["events"], state["schedule"]["rows"])
                yield batch
        if waiting:
            raise RuntimeError(f"mixture workers skipped step {consumed}; this is a bug")

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out (before any: where iteration starts)."""
        state = self._state if self._state is not None else self._mixed.start_state()
        return {"mixed_dataset": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()` (or a `MixedDataset` state)."""
        self._mixed.load_state_dict(state)
        self._state = None
