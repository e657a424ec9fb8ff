"""`MixedDataLoader`: a torch DataLoader over a `MixedDataset` that keeps the mixture's position.

Every worker computes the whole schedule and every step, and gathers the rows of each step it
owns (`MixedDataset.owners`: a hash of source and row group), so each row group is decoded by
one worker only, whatever the mixture interleaves (loader/mixture/worker.py). It sends its part
of each step in compact form through the shared-memory ring of loader/packed/transport.py; the lowest
owner of a step adds the step's layout (the owner, tokens, documents and source of every row)
and where the mixture state after the step is. The trainer splices the parts back into the
step's row order (`splice`: one scan of the layout for the runs of one owner, the tokens
written straight into the batch), expands the batch (loader/collate.py) and keeps the state of
the last batch it handed out, which `state_dict()` returns. The batches do not depend on the
number of workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from loader.mixture.dataset import MixedDataset
from loader.packed.transport import CompactBatch, Ring, head
from loader.packed.workers import WorkerInit, check_worker_args, from_workers
from loader.record import Documents, TokenRuns
from packtool.dataset.columns import TOKEN, get
from packtool.errors import ConfigError
from packtool.mixture.schedule import load_kernel, state_after


def _as_is(item: Any) -> Any:
    """collate_fn: items are whole batches (or parts of one); the default would turn the numpy
    arrays beside a compact part into shared tensors, one socket round trip each."""
    return item


def splice(
    parts: dict[int, Documents], layout: np.ndarray, placed: frozenset[int] = frozenset()
) -> Documents:
    """One step's documents in row order from the workers' parts.

    The tokens come back as `TokenRuns` (views of the parts, in order), which `collate` writes
    straight into the batch; the per-document arrays and any per-token column are joined.

    Args:
        parts: Per worker, its rows' documents in row order (or, for a worker in `placed`,
            the step's shared slot, where its rows are at their places in the step).
        layout: int64 `(4, rows)`: per row of the step, its owner, tokens, documents and
            source.
        placed: The workers whose rows are in the step's shared slot.
    """
    if len(parts) == 1:
        return next(iter(parts.values()))
    # runs of rows with one owner, in plain Python: a step has tens of rows, where numpy's
    # per-call cost would dominate
    runs: list[list[int]] = []  # [owner, first token, tokens, first document, documents]
    at = {w: [0, 0] for w in parts}  # next token and document of each part
    for w in placed:
        at[w] = None  # its rows at their places in the step
    step_at = [0, 0]  # the step's next token and document
    last = -1
    for w, nt, nd in zip(*layout[:3].tolist(), strict=True):
        here = at[w] or step_at
        if w == last:
            run = runs[-1]
            run[2] += nt
            run[4] += nd
        else:
            runs.append([w, here[0], nt, here[1], nd])
            last = w
        if here is not step_at:
            here[0] += nt
            here[1] += nd
        step_at[0] += nt
        step_at[1] += nd
    first = next(iter(parts.values()))
    per_token = [n for n in first.columns if get(n).level == TOKEN]
    per_doc = [n for n in first.columns if get(n).level != TOKEN]
    tokens, lens, ids = [], [], []
    columns: dict[str, list[np.ndarray]] = {n: [] for n in first.columns}
    for w, pt, nt, pd, nd in runs:
        part = parts[w]
        tokens.append(part.tokens[pt : pt + nt])
        lens.append(part.doc_lens[pd : pd + nd])
        ids.append(part.doc_ids[pd : pd + nd])
        for n in per_token:
            columns[n].append(part.columns[n][pt : pt + nt])
        for n in per_doc:
            columns[n].append(part.columns[n][pd : pd + nd])
    return Documents(
        TokenRuns(tokens),
        np.concatenate(lens),
        np.concatenate(ids),
        {n: np.concatenate(v) for n, v in columns.items()},
    )


class MixedDataLoader(DataLoader):
    """A DataLoader whose `state_dict()` resumes the mixture exactly where it stopped.

    Args:
        dataset: The mixture (it yields whole batches, so `batch_size=None`).
        num_workers: Worker processes (0: load in the main process).
        **kwargs: Passed to `torch.utils.data.DataLoader` (pin_memory, prefetch_factor, ...);
            workers are not persistent (each iteration starts them with its start state).
    """

    def __init__(self, dataset: MixedDataset, *, num_workers: int = 0, **kwargs: Any) -> None:
        kwargs.pop("persistent_workers", None)
        check_worker_args(num_workers, kwargs)
        if "batch_size" in kwargs and kwargs["batch_size"] is None:
            del kwargs["batch_size"]  # what the loader uses itself: the batches are whole
        taken = sorted(
            set(kwargs) & {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"}
        )
        if taken:
            raise ConfigError(
                f"MixedDataLoader: {taken} belong to the dataset (its batches are whole: "
                "rows_per_batch or tokens_per_batch, drop_last), not the loader"
            )
        kwargs.setdefault("collate_fn", _as_is)
        super().__init__(dataset, batch_size=None, num_workers=num_workers, **kwargs)
        self._mixed = dataset
        self._user_worker_init = self.worker_init_fn
        self._state: dict[str, Any] | None = None
        # With workers: (next step, schedule chunk, rows of it) after the last batch handed out;
        # the state is made from it only when asked for.
        self._where: tuple[int, Any, int] | None = None

    def _new_ring(self, first: int) -> Ring:
        ds = self._mixed
        # A worker can have its in-flight items (8 parts each) plus a few parts waiting for
        # the other workers' parts of the same steps. With step slots (packed sources of the
        # mixture's columns: rows written at their places), a worker's own slots are for the
        # rare step whose shared slot is not free yet.
        in_flight = ((self.prefetch_factor or 2) * self.num_workers + 2) * 8
        ring = Ring(
            num_workers=self.num_workers,
            slots=16 if ds.one_loop else 2 * in_flight,
            max_tokens=ds.max_batch_tokens,
            max_docs=ds.max_batch_docs(),
            token_dtype=ds.token_dtype,
            columns=ds.columns,
            step_slots=2 * in_flight if ds.one_loop else 0,
        )
        ring.set_consumed(first)
        return ring

    def __iter__(self) -> Iterator[dict]:
        ds = self._mixed
        start = ds.start_state()
        self._state, self._where = start, None
        if self.num_workers == 0:
            for batch in super().__iter__():
                self._state = None  # the dataset's own position (made when asked for)
                yield batch
            return
        ds.handoff.workers_iterate(self.num_workers)  # its own state_dict() would be stale
        load_kernel()  # the workers forked below inherit it
        ring = self._new_ring(int(start["step"]))
        self.worker_init_fn = WorkerInit(ring, self._user_worker_init)
        pin = bool(self.pin_memory)
        waiting: dict[int, dict[int, tuple[CompactBatch, tuple]]] = {}
        chunks: dict[int, Any] = {}  # schedule chunks by id (the recent ones)
        consumed = int(start["step"])
        for chunk in from_workers(super().__iter__()):
            for item, meta in chunk:
                waiting.setdefault(item.step, {})[meta[0]] = (item, meta)
            while consumed in waiting:
                parts = waiting[consumed]
                if len(parts) < next(iter(parts.values()))[1][3]:
                    break  # another worker's part of this step is still on its way
                del waiting[consumed]
                # the lowest owner's part has the layout and where the state is
                _, layout, (next_step, cid, j, new), _, _ = parts[min(parts)][1]
                # per row of the step: owner, tokens, documents, source
                layout = np.frombuffer(layout, np.int64).reshape(4, -1)
                if new is not None:
                    chunks[cid] = new
                    for old in [c for c in chunks if c < cid - 8]:
                        del chunks[old]
                try:
                    placed = frozenset(w for w, (_, meta) in parts.items() if meta[4])
                    if placed:
                        whole = ring.step_views(consumed)
                        whole = head(whole, int(layout[1].sum()), int(layout[2].sum()))
                    if len(placed) == len(parts):
                        docs = whole  # every row at its place: nothing to splice
                    else:
                        views = {
                            w: whole if w in placed else ring.take(item)
                            for w, (item, _) in parts.items()
                        }
                        docs = splice(views, layout, placed)
                    filler = next(iter(parts.values()))[0].filler
                    sources = np.repeat(layout[3], layout[2])
                    batch = ds.expand(docs, sources, filler=filler, pin_memory=pin)
                finally:
                    for item, _ in parts.values():
                        ring.release(item)
                    ring.set_consumed(consumed + 1)
                consumed += 1
                self._where = (next_step, chunks[cid], j)
                end = chunks[cid].end
                ds.report(end["events"], chunks[cid].start["rows"] + j)
                yield batch
        if waiting:
            raise RuntimeError(f"mixture workers skipped step {consumed}; this is a bug")

    def __len__(self) -> int:
        """The steps the next iteration yields (`MixedDataset.__len__`: exact, a cap that ends
        the mixture first included). Workers send a part of a step each, so torch's own count
        of items fetched against this length would warn for nothing."""
        return len(self._mixed)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch handed out (before any: where iteration starts)."""
        if self._where is not None:
            step, chunk, j = self._where
            self._state = self._mixed.state_at(step, state_after(self._mixed.names, chunk, j))
            self._where = None
        state = self._state if self._state is not None else self._mixed.position()
        return {"mixed_dataset": state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from `state_dict()` (or a `MixedDataset` state)."""
        self._mixed.load_state_dict(state)
        self._state = self._where = None
