"""A `MixedDataLoader` worker's side (for `loader.mixture.dataset.MixedDataset`): its part of every
step, through the shared-memory ring.

Every worker plans every step (`loader.mixture.steps.plan_blocks`, a block of steps at a
time) and gathers the rows whose owner (`MixedDataset.owners`: a hash of source and row group)
it is, so each row group is decoded by one worker only. It writes them at their places in the
step's shared slot of the ring (`Ring.step_free`: once the trainer has consumed the step that
used the slot before), so the trainer takes the step whole; otherwise (the slot not yet free,
a step too big for a slot, sources gathered one by one) into a slot of its own, and the trainer
splices the parts. The lowest worker with rows in a step also sends the step's layout (owner,
tokens, documents and source of every row) and where the state after it is
(loader/mixture/dataloader.py).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from itertools import groupby
from operator import itemgetter
from typing import Any

import numpy as np

from loader.mixture.steps import Block, MixtureView, RowStream, Step, plan_blocks
from loader.packed.transport import CompactBatch, Ring
from loader.record import Documents
from loader.store.row_group import write_parts

PART_FIELDS = ("src", "rid", "epoch", "pos", "length", "docs", "group", "local")
"""What a worker's part of a step keeps of its rows (`MixedDataset.gather_into` reads these;
with packed sources of the mixture's columns only `ONE_LOOP_FIELDS`)."""
ONE_LOOP_FIELDS = ("src", "group", "local", "docs")


def ring_parts(
    ds: MixtureView, stream: RowStream, first: int, ring: Ring, worker: int, n_workers: int
) -> Iterator[list]:
    """This worker's part of every step (the rows it owns, `MixedDataset.owners`) as compact
    batches in the ring, with what the trainer needs to splice the parts back together
    (the part of the lowest worker present also carries the state after the step)."""
    chunk: list = []
    size = 1  # the first part alone (time to first batch), then 8 per queue item
    sent: set[int] = set()  # schedule chunks already sent to the trainer
    fields = ONE_LOOP_FIELDS if ds.one_loop else PART_FIELDS

    def owned(blocks: Iterator[Block]) -> Iterator[Step]:
        """Each step with `share`: what this worker gathers of it. Worked out a block of steps
        at a time (numpy's per-call cost, paid per block: a step has tens of rows)."""
        for b in blocks:
            rows = b.rows
            owner = ds.owners(rows, n_workers)
            sizes = np.diff(b.offsets)
            per_step = np.repeat(np.arange(len(b.steps)), sizes)
            counts = np.bincount(
                per_step * n_workers + owner, minlength=len(b.steps) * n_workers
            ).reshape(len(b.steps), n_workers)
            # per row: owner, tokens, documents, source (a step's layout: a slice of columns)
            layout = np.stack([owner, rows["length"], rows["docs"], rows["src"]])
            # each row's first token and document in its step, and each step's totals
            offs = np.asarray(b.offsets)
            first, last = offs[:-1], offs[1:] - 1  # a step has a row at least (a filler one)
            at, totals = {}, {}
            for f in ("length", "docs"):
                before = np.cumsum(rows[f]) - rows[f]
                at[f] = before - np.repeat(before[first], sizes)
                totals[f] = (before[last] + rows[f][last] - before[first]).tolist()
            sel = np.flatnonzero(owner == worker)
            mine = {f: rows[f][sel] for f in fields}  # this worker's rows, step after step
            mine["tok_at"], mine["doc_at"] = at["length"][sel], at["docs"][sel]
            ends = np.cumsum(counts[:, worker]).tolist()
            starts = [0, *ends[:-1]]
            # where each of its row groups is first used in the block: a step hands only those
            # to the decode thread (the rest were handed with an earlier step)
            src_m, group_m = mine["src"], mine["group"]
            firsts = np.unique(src_m * (1 << 40) + group_m, return_index=True)[1]
            firsts.sort()
            fresh_src, fresh_group = src_m[firsts].tolist(), group_m[firsts].tolist()
            firsts = firsts.tolist()
            for s, c, lo, hi, a, z, nt, nd in zip(
                b.steps, counts.tolist(), b.offsets[:-1], b.offsets[1:], starts, ends,
                totals["length"], totals["docs"], strict=True,
            ):  # fmt: skip
                present = [w for w, n in enumerate(c) if n]
                lowest = present[0] == worker
                # one bytes object, not four arrays: pickling an array costs microseconds
                s.share = (
                    None if z > a else False,
                    len(present),
                    layout[:, lo:hi].tobytes() if lowest else None,
                    nt <= ring.tok_cap and nd <= ring.doc_cap,
                )
                if z > a:
                    s.rows = {f: v[a:z] for f, v in mine.items()}
                    i, j = bisect_left(firsts, a), bisect_left(firsts, z)
                    s.fresh = [
                        (src, [g for _, g in run])
                        for src, run in groupby(
                            zip(fresh_src[i:j], fresh_group[i:j], strict=True), itemgetter(0)
                        )
                    ]
                yield s

    steps = owned(plan_blocks(ds, stream, first, lambda step: True, step_rows=False))
    step_slots = ds.one_loop and ring.step_slots > 0
    for s in ds.look_ahead(steps, stream, keep=lambda step: step.share[0]):
        mine, n_parts, layout, fits = s.share
        if mine is False:
            continue
        if step_slots and fits and ring.step_free(s.step):
            # the rows at their places in the step's shared slot: nothing to splice
            parts, n_tok, n_docs = ds.views(s.rows, s.runs)
            at = (s.rows["tok_at"].tolist(), s.rows["doc_at"].tolist())
            write_parts(parts, ring.step_views(s.step), ds.columns, at=at)
            slot = ring.step_slot(s.step)
            item = CompactBatch(
                s.step, slot, n_tok, n_docs, ring.doc_cap, s.filler, None, ring.tok_cap
            )
            placed = True
        else:
            item = ring.put(_RowsView(ds, s.rows, s.runs), None, filler=s.filler, step=s.step)
            placed = False
        where = None  # the lowest owner tells where the state after the step is
        if layout is not None:
            cid = s.ref[1]
            where = (*s.ref, None if cid in sent else s.chunk)
            sent.add(cid)
        chunk.append((item, (worker, layout, where, n_parts, placed)))
        if len(chunk) == size:
            yield chunk
            chunk, size = [], 8
    if chunk:
        yield chunk


class _RowsView:
    """What `Ring.put` gathers from: a mixed rank batch (duck-types `ShardStore.gather_into`
    and `ShardStore.gather` for it)."""

    def __init__(self, ds: MixtureView, rows: dict[str, np.ndarray], runs: list | None) -> None:
        self.ds, self.rows, self.runs = ds, rows, runs

    def gather_into(self, _rows: Any, dest: Documents) -> tuple[int, int] | None:
        return self.ds.gather_into(self.rows, dest, self.runs)

    def gather(self, _rows: Any) -> Documents:
        return self.ds.gather(self.rows, self.runs)[0]
