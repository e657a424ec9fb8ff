"""Worker -> trainer transport for `PackedDataLoader`: compact batches in a shared-memory ring.

torch sends a tensor from a DataLoader worker by creating a shared-memory segment, passing its
file descriptor over a fresh socket connection and mapping it in the trainer, per batch: on a
2-core machine that alone capped a no-op dataset at 10-60 M tokens/s with 64k-token batches,
while a small tuple goes through the same queue at over 15,000 items/s.

So a `PackedDataLoader` worker writes each batch in *compact* form (the stored uint16/uint32
token ids, int32 document lengths, int64 document ids: about 2 bytes per token instead of 24)
(and the optional columns the dataset carries, e.g. one byte per token of `loss_mask`; the
layout is derived from the column declaration, `_areas`) into a slot of a ring allocated once
in shared memory, and sends only a `CompactBatch` (slot
number and sizes) through the DataLoader queue. The trainer's iterator expands it with
`loader.collate.collate` (the same function the in-process path uses: int64 `input_ids`,
`labels`, `position_ids`, ...) into fresh tensors and frees the slot at once, so a batch the
training loop holds never aliases the ring.

Each worker owns `slots` consecutive slots and uses them in turn; a slot is marked busy by the
worker when written and free by the trainer after expansion. The DataLoader keeps at most
`prefetch_factor x num_workers` batches in flight, so with more slots than that a worker never
finds its next slot busy; if it does anyway (or a batch does not fit), it sends that batch in its
own shared tensor instead, never waiting. Plain `DataLoader` / `StatefulDataLoader` workers never
see the ring and yield ordinary collated batches.

A `MixedDataLoader` ring also has *step slots*, shared by the workers: step k's rows are
written into step slot k mod `step_slots` at their final places in the step, each worker its
own rows, so the trainer takes the step as one batch with nothing to splice. The trainer
publishes how many steps it has consumed (`set_consumed`); a worker writes step k there only
once step k - `step_slots` has been consumed (`step_free`), so a step slot is never written
while the trainer reads it, and with no flag to claim there is no race between workers. A worker
that finds the slot not yet free uses its own slots as above.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch
from torch.utils.data import get_worker_info

from loader.record import Documents
from packtool.dataset.columns import TOKEN, Column, get


class CompactBatch(NamedTuple):
    """What a worker sends: a batch before expansion (in a ring slot, or in `data`)."""

    step: int
    """The global step (workers produce blocks of steps; the trainer restores step order)."""
    slot: int
    """Ring slot holding the batch, or -1 when `data` holds it."""
    n_tokens: int
    n_docs: int
    doc_cap: int
    """Documents the buffer's layout has room for (offsets of the arrays inside it)."""
    filler: bool
    """A filler batch: every label -100 and doc id -1 after expansion."""
    data: torch.Tensor | None
    """uint8 buffer when the batch is not in the ring."""
    tok_cap: int = -1
    """Tokens the buffer's layout has room for (-1: all the bytes after the documents' arrays,
    which is what a layout without per-token optional columns needs)."""


def _shared_bytes(n: int) -> torch.Tensor:
    """An uninitialised uint8 tensor of `n` bytes in shared memory."""
    try:
        storage = torch.UntypedStorage._new_shared(max(n, 1))
        return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (n,))
    except (AttributeError, RuntimeError):  # private API: fall back to a copy into shared memory
        return torch.empty(n, dtype=torch.uint8).share_memory_()


def _areas(
    doc_cap: int, tok_cap: int, token_dtype: np.dtype, columns: tuple[Column, ...]
) -> list[tuple[str, np.dtype, int, int]]:
    """(name, dtype, byte offset, count) of each array of a compact buffer, 8-byte aligned.

    Derived from the declaration: document ids and lengths, then the optional per-document
    columns, the tokens, then the optional per-token columns.
    """
    per_doc = [("doc_ids", np.dtype(np.int64)), ("doc_lens", np.dtype(np.int32))]
    per_doc += [(c.name, c.numpy_dtype()) for c in columns if c.level != TOKEN]
    per_tok = [("tokens", np.dtype(token_dtype))]
    per_tok += [(c.name, c.numpy_dtype()) for c in columns if c.level == TOKEN]
    areas, at = [], 0
    for names, n in ((per_doc, doc_cap), (per_tok, tok_cap)):
        for name, dtype in names:
            areas.append((name, dtype, at, n))
            at += -(-dtype.itemsize * n // 8) * 8
    return areas


def compact_bytes(
    doc_cap: int, tok_cap: int, token_dtype: np.dtype, columns: tuple[Column, ...] = ()
) -> int:
    """Bytes of a compact buffer for `doc_cap` documents and `tok_cap` tokens."""
    name, dtype, at, n = _areas(doc_cap, tok_cap, token_dtype, columns)[-1]
    return at + -(-dtype.itemsize * n // 8) * 8


def _layout(
    buf: np.ndarray,
    doc_cap: int,
    tok_cap: int,
    token_dtype: np.dtype,
    columns: tuple[Column, ...] = (),
) -> Documents:
    """A `Documents` of views into a compact buffer (uint8)."""
    if tok_cap < 0:  # the tokens take the rest of the buffer (no per-token optional column)
        start = _areas(doc_cap, 0, token_dtype, columns)[-1][2]
        tok_cap = (len(buf) - start) // np.dtype(token_dtype).itemsize
    views = {
        name: buf[at : at + dtype.itemsize * n].view(dtype)
        for name, dtype, at, n in _areas(doc_cap, tok_cap, token_dtype, columns)
    }
    return Documents(
        views.pop("tokens"), views.pop("doc_lens"), views.pop("doc_ids"), columns=views
    )


def head(docs: Documents, n_tokens: int, n_docs: int) -> Documents:
    """The first `n_tokens` tokens and `n_docs` documents of a record of buffers."""
    return Documents(
        docs.tokens[:n_tokens],
        docs.doc_lens[:n_docs],
        docs.doc_ids[:n_docs],
        {
            name: v[:n_tokens] if get(name).level == TOKEN else v[:n_docs]
            for name, v in docs.columns.items()
        },
    )


class Ring:
    """Shared-memory slots for compact batches (created in the trainer before workers start).

    Args:
        num_workers: Worker processes.
        slots: Slots per worker (more than the batches a worker can have in flight).
        max_tokens: Most tokens in one batch.
        max_docs: Most documents in one batch (a batch with more goes outside the ring).
        token_dtype: The stored token dtype (uint16 / uint32).
        columns: The optional columns each batch carries.
        step_slots: Step slots shared by the workers (see the module doc; 0: none).
    """

    def __init__(
        self,
        *,
        num_workers: int,
        slots: int,
        max_tokens: int,
        max_docs: int,
        token_dtype: np.dtype,
        columns: tuple[Column, ...] = (),
        step_slots: int = 0,
    ) -> None:
        self.num_workers = num_workers
        self.slots = slots
        self.token_dtype = np.dtype(token_dtype)
        self.columns = tuple(columns)
        """The optional columns each batch carries (`ShardStore.optional`)."""
        self.doc_cap = max_docs
        self.tok_cap = max_tokens
        size = compact_bytes(self.doc_cap, self.tok_cap, self.token_dtype, self.columns)
        self.slot_bytes = -(-size // 64) * 64
        self.step_slots = step_slots
        self._first_step_slot = num_workers * slots
        self.buffer = _shared_bytes((num_workers * slots + step_slots) * self.slot_bytes)  # uint8
        self.busy = torch.zeros(num_workers * slots, dtype=torch.int32).share_memory_()
        self.consumed = torch.zeros(1, dtype=torch.int64).share_memory_()
        """Steps the trainer has consumed (the next one it takes), for the step slots."""
        self.start = torch.zeros(4, dtype=torch.int64).share_memory_()
        """(epoch, origin, first step, cursor) where the workers' next iteration starts, set by
        the trainer (`PackedDataLoader`) before it starts them."""
        self._count = 0
        self._worker = -1
        self._views: dict[int, Documents] = {}  # per slot, its arrays (made when first used)

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_views"] = {}  # views of this process's mapping: made again where unpickled
        state.pop("_flags", None)
        return state

    @property
    def flags(self) -> tuple[np.ndarray, np.ndarray]:
        """numpy views of `busy` and `consumed` (made once per process: `Tensor.numpy()` costs
        microseconds, and they are read for every batch)."""
        flags = self.__dict__.get("_flags")
        if flags is None:
            flags = self._flags = (self.busy.numpy(), self.consumed.numpy())
        return flags

    def _slot(self, slot: int) -> np.ndarray:
        return self.buffer.numpy()[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]

    def _slot_views(self, slot: int) -> Documents:
        """The arrays of a slot (views of the shared buffer, the same for every batch in it:
        made once per slot, a mixture step's parts take two to three slots)."""
        views = self._views.get(slot)
        if views is None:
            views = _layout(
                self._slot(slot), self.doc_cap, self.tok_cap, self.token_dtype, self.columns
            )
            self._views[slot] = views
        return views

    # ---- worker side --------------------------------------------------------------------------

    def start_worker(self) -> None:
        """Called at the start of each iteration in a worker: all of its slots are free.

        The trainer has expanded every batch it received and dropped the ones left in flight
        by an abandoned iteration (persistent workers), so nothing reads these slots any more.
        """
        info = get_worker_info()
        self._worker = 0 if info is None else info.id
        self._count = 0
        first = self._worker * self.slots
        self.flags[0][first : first + self.slots] = 0

    def put(self, store: Any, rows: np.ndarray, *, filler: bool, step: int) -> CompactBatch:
        """Gather `rows` from `store` (a `ShardStore`) into this worker's next slot."""
        slot = self._worker * self.slots + self._count % self.slots
        self._count += 1
        busy = self.flags[0]
        if busy[slot] == 0:
            sizes = store.gather_into(rows, self._slot_views(slot))
            if sizes is not None:
                busy[slot] = 1
                return CompactBatch(
                    step, slot, sizes[0], sizes[1], self.doc_cap, filler, None, self.tok_cap
                )
        return pack_compact(
            store.gather(rows),
            filler=filler,
            token_dtype=self.token_dtype,
            step=step,
            columns=self.columns,
        )

    def step_free(self, step: int) -> bool:
        """Whether step `step` may be written into its step slot now (the step that used the
        slot before, `step - step_slots`, has been consumed)."""
        return self.step_slots > 0 and int(self.flags[1][0]) > step - self.step_slots

    def step_slot(self, step: int) -> int:
        return self._first_step_slot + step % self.step_slots

    def step_views(self, step: int) -> Documents:
        """The arrays of step `step`'s step slot (a whole step's room: its rows are written at
        their places in the step)."""
        return self._slot_views(self.step_slot(step))

    # ---- trainer side -------------------------------------------------------------------------

    def set_consumed(self, steps: int) -> None:
        """Steps consumed so far (their step slots may be written again)."""
        self.flags[1][0] = steps

    def take(self, item: CompactBatch) -> Documents:
        """Views of a received batch's documents; `release` it after copying."""
        if item.data is None:
            docs = self._slot_views(item.slot)
        else:
            docs = _layout(
                item.data.numpy(), item.doc_cap, item.tok_cap, self.token_dtype, self.columns
            )
        return head(docs, item.n_tokens, item.n_docs)

    def release(self, item: CompactBatch) -> None:
        """Free a worker's slot (a step slot is free once its step is consumed)."""
        if item.data is None and item.slot < self._first_step_slot:
            self.flags[0][item.slot] = 0


def pack_compact(
    docs: Documents,
    *,
    filler: bool,
    token_dtype: np.dtype,
    step: int,
    columns: tuple[Column, ...] = (),
) -> CompactBatch:
    """A compact batch in its own shared buffer (when the ring has no room)."""
    n_tokens, n_docs = docs.n_tokens, docs.n_docs
    data = _shared_bytes(compact_bytes(n_docs, n_tokens, np.dtype(token_dtype), columns))
    dest = _layout(data.numpy(), n_docs, n_tokens, np.dtype(token_dtype), columns)
    dest.doc_ids[:] = docs.doc_ids
    dest.doc_lens[:] = docs.doc_lens
    dest.tokens[:] = docs.tokens
    for name, values in dest.columns.items():
        values[:] = docs.columns[name]
    return CompactBatch(step, -1, n_tokens, n_docs, n_docs, filler, data, n_tokens)
