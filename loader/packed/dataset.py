"""`PackedDataset`: a torch IterableDataset of collated varlen batches over packtool shards.

It yields whole batches (use `DataLoader(ds, batch_size=None)` or `loader.make_dataloader`).
Rank r of W takes its rank batch of every global step (loader/order/steps.py); DataLoader worker w of
N takes global steps first + w, first + w + N, ..., which the DataLoader's round-robin delivers in
step order, so the stream does not depend on N.

Resume follows the torchdata `StatefulDataLoader` protocol (`state_dict` / `load_state_dict`, called
in each worker) and also takes a whole StatefulDataLoader state or a `PackedDataLoader` state in
the main process, from which it restarts at the first unconsumed global step with any number of
workers, and at the first unconsumed row with other ranks or batch settings (the state's format
and checks: loader/packed/resume.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loader.collate import blank, collate
from loader.config import (
    LoaderConfig,
    check_batch_size,
    check_epoch,
    check_int,
    check_pad_id,
    dist_rank_world,
    make_config,
    resolve_nodes,
    static_max_docs,
)
from loader.context_parallel import cp_split
from loader.order.ahead import AHEAD_GROUPS, AHEAD_STEPS, look_ahead
from loader.order.balance import imbalance, row_cost
from loader.order.nodes import NodeOrder
from loader.order.permutation import EpochOrder
from loader.order.steps import EpochPlan, block_steps_bound, iter_blocks, rank_rows
from loader.packed.resume import (
    IterationStart,
    PendingStart,
    check_state,
    make_state,
    merge_loader_state,
    resume_point,
)
from loader.packed.transport import CompactBatch, Ring
from loader.packed.workers import WorkerHandoff
from loader.record import Documents
from loader.store.row_index import RowIndex
from loader.store.shards import ShardStore
from packtool.errors import ConfigError
from packtool.storage import local as storage

CHUNK = 4
"""Compact batches a PackedDataLoader worker sends per DataLoader queue item (after the first)."""


class PackedDataset(IterableDataset):
    """Collated varlen batches from a packtool dataset folder, exactly once per epoch.

    Args:
        path: The folder holding `index.json` and the Parquet shards.
        config: Batching settings; or give them as keyword arguments (`rows_per_batch=8`, ...).
        rank: This data-parallel rank (default: torch.distributed's, else 0).
        world_size: Number of data-parallel ranks (default: torch.distributed's, else 1).

    Call `set_epoch(e)` before each epoch (as with DistributedSampler).

    Raises:
        DataError: A missing, truncated or corrupt dataset, or an unsupported format version.
        ConfigError: Invalid settings.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        config: LoaderConfig | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        config = make_config(LoaderConfig, settings, config)
        self.config = config = replace(config, nodes=resolve_nodes(config.nodes))
        self.rank, self.world_size = dist_rank_world(rank, world_size, config.context_parallel)
        if self.world_size % config.nodes:
            raise ConfigError(
                f"nodes={config.nodes} does not divide the {self.world_size} (data-parallel) "
                "ranks; every node must run as many of them (give the number of nodes)"
            )
        if not isinstance(path, (str, os.PathLike)) and not storage.is_remote(path):
            raise ConfigError(f"path must be a dataset folder or URL, got {path!r}")
        self.store = ShardStore(
            path,
            verify=config.verify,
            cache_bytes=config.cache_bytes,
            page_checksums=config.page_checksums,
            cache_dir=config.cache_dir,
            cache_limit=config.cache_limit,
        )
        self.fingerprint = self.store.manifest.fingerprint
        check_pad_id(config, self.store.vocab_size, f"the dataset {self.store.path}")
        max_len = self.store.max_len
        check_batch_size(config, max_len, "the dataset's")
        # Row lengths, document counts and Σ len², read per row group when the order needs them
        # (token budget, balance); never an array of every row.
        # From a bucket, the row groups a window needs download side by side (one at a time,
        # the first batch waited for every range of the window in turn).
        self.index = RowIndex(
            self.store.row_group_starts, self.store.row_stats, prefetch=self.store.fetch_ahead
        )
        self.max_docs = config.max_docs_per_batch
        if config.static_shape:  # one pass over every row's document count (at open)
            self.max_docs = static_max_docs(
                config, self.index.top_n_docs(config.rows_per_batch or 1)
            )
            self.pad_tokens = config.tokens_per_batch or config.rows_per_batch * max_len
        else:
            self.pad_tokens = None
        # Shared with worker processes, so that set_epoch / load_state_dict reach persistent
        # workers too, and a resume point they start from is used up here too.
        self._start = PendingStart()
        self._local_resume: tuple[int, int, int, int] | None = None
        self._generation = 0  # see `generation`
        self._next_step = 0
        self._iter_epoch = 0
        self._iter_origin = 0
        self._order_cache: tuple[int, EpochOrder | NodeOrder] | None = None
        self._plan_cache: tuple[tuple[int, int], EpochPlan] | None = None
        # A PackedDataLoader worker's ring; whether such workers iterated last (workers.py).
        self.handoff = WorkerHandoff("PackedDataset", "PackedDataLoader")

    # ---- planning ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return self._start.epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers (keeps a resume point of that epoch
        that no iteration has started from yet)."""
        if not self._start.set_epoch(check_epoch(epoch)):
            return
        self._iter_epoch, self._iter_origin, self._next_step = epoch, 0, 0
        self._generation += 1

    def seek(self, epoch: int, step: int = 0) -> None:
        """Start the next iteration at global step `step` of `epoch` (0 <= step <= its steps).

        The same position as `load_state_dict` of a state saved there by a run with these
        settings; for trainers that count steps themselves (loader/hf/trainer.py).
        """
        epoch = check_epoch(epoch)
        check_int("step", step, 0)
        plan = self.plan(epoch)
        # has_step cuts the epoch only as far as `step`, not to its end (the plan is lazy).
        if step > 0 and not plan.has_step(step - 1):
            raise ConfigError(
                f"step {step} is past the end of epoch {epoch} ({plan.num_steps} steps)"
            )
        self.load_state_dict(self._state(epoch, 0, step, plan))

    def order(self, epoch: int) -> EpochOrder | NodeOrder:
        """The row order of `epoch` (lazy: a window at a time; cached)."""
        if self._order_cache is None or self._order_cache[0] != epoch:
            c = self.config
            order = EpochOrder(
                self.store.row_group_starts,
                fingerprint=self.fingerprint,
                seed=c.seed,
                epoch=epoch,
                shuffle=c.shuffle,
                window=c.shuffle_window,
            )
            if c.nodes > 1:  # each node's ranks read rows of its own windows
                stripe = self.world_size // c.nodes * c.rows_per_batch
                order = NodeOrder(order, nodes=c.nodes, stripe=stripe)
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def plan(self, epoch: int, origin: int = 0) -> EpochPlan:
        """The global steps of `epoch` starting at row position `origin` (cached; lazy: a step's
        rows are computed when asked for, from the nearest known position)."""
        key = (epoch, origin)
        if self._plan_cache is None or self._plan_cache[0] != key:
            c = self.config
            plan = EpochPlan(
                self.order(epoch),
                origin=origin,
                world_size=self.world_size,
                rows_per_batch=c.rows_per_batch,
                tokens_per_batch=c.tokens_per_batch,
                max_docs=(self.max_docs - 1) if c.static_shape else None,
                drop_last=c.drop_last,
                index=self.index,
            )
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def _start_plan(self, epoch: int, origin: int, first: int, cursor: int) -> EpochPlan:
        """The plan of `(epoch, origin)`, knowing that step `first` starts at row `cursor` (a
        resume point: its steps are cut from there, not from the origin)."""
        plan = self.plan(epoch, origin)
        plan.anchor(first * self.world_size, cursor)
        return plan

    def next_start(self) -> IterationStart:
        """Where the next iteration starts: a resume point no iteration has started from yet,
        else the start of the epoch set last (uses nothing up). `PackedDataLoader` starts its
        iterations there and reports it as its position until then."""
        epoch, origin, first, cursor, _ = self._start.peek()
        return IterationStart(
            epoch, origin, first, cursor, self._start_plan(epoch, origin, first, cursor)
        )

    def use_up_start(self) -> None:
        """Mark the pending resume point used: `PackedDataLoader` calls it when it hands the
        start to its workers in the ring (an iteration here or in a plain DataLoader's workers
        uses it up itself)."""
        self._start.drop()

    @property
    def generation(self) -> int:
        """Counts the moves of the next iteration's start by `set_epoch` / `load_state_dict`
        (main process): a `PackedDataLoader` that has not iterated since the last move reports
        `next_start()`, not the position it reached before."""
        return self._generation

    def __len__(self) -> int:
        """Steps this rank runs in the current epoch (from the resume point, if any).

        With a token budget this cuts the rest of the epoch (reads every remaining row's length
        once per epoch; then cached).
        """
        start = self.next_start()
        return max(start.plan.num_steps - start.first, 0)

    def rows_for(self, plan: EpochPlan, step: int, rank: int | None = None) -> np.ndarray:
        """Row ids a rank trains on at a global step (empty: filler)."""
        rank = self.rank if rank is None else rank
        return self._rank_rows(plan, step, rank, balance=self.config.balance)

    def _rank_rows(self, plan: EpochPlan, step: int, rank: int, *, balance: bool) -> np.ndarray:
        """`rank_rows` under this loader's caps: rows, token budget (static shape: the padded
        length) and static shape's document cap. `balance_report` uses it too, so its figure is
        the balancing the ranks really get."""
        c = self.config
        return rank_rows(
            plan,
            step,
            rank,
            balance=balance,
            index=self.index,
            linear=c.balance_linear,
            rows_cap=c.rows_per_batch,
            tokens_cap=self.pad_tokens
            if c.tokens_per_batch is None and c.static_shape
            else c.tokens_per_batch,
            docs_cap=(self.max_docs - 1) if c.static_shape else None,
            nodes=c.nodes,
        )

    # ---- iteration --------------------------------------------------------------------------

    def batch(self, rows: np.ndarray, *, filler_row: int = 0) -> dict[str, torch.Tensor | int]:
        """Collate the given rows (empty: a filler batch that trains on nothing)."""
        filler = len(rows) == 0
        if filler:
            rows = np.asarray([filler_row], dtype=np.int64)
        return self.expand(self.store.gather(rows), filler=filler)

    def expand(
        self, docs: Documents, *, filler: bool = False, pin_memory: bool = False
    ) -> dict[str, torch.Tensor | int]:
        """The batch dict of gathered rows (what `PackedDataLoader` runs on compact batches).

        Args:
            docs: The rows' documents (`ShardStore.gather`; a loss mask, if the dataset has one,
                inside).
            filler: Make it a filler batch (labels -100, doc ids -1).
            pin_memory: Allocate the batch in pinned memory.
        """
        c = self.config
        out = collate(
            docs,
            pad_tokens=self.pad_tokens,
            pad_docs=self.max_docs if c.static_shape else None,
            pad_id=c.pad_id,
            position_limit=self.store.max_len,
            layout=c.layout,
            seq_idx=c.seq_idx,
            varlen_keys=c.varlen_keys,
            pin_memory=pin_memory,
        )
        if filler:
            blank(out)
        if c.context_parallel is not None:  # this context-parallel rank's share
            out = cp_split(
                out, *c.context_parallel, c.cp_style, c.cp_block, pad_id=c.pad_id,
                position_limit=self.store.max_len, pin_memory=pin_memory,
            )  # fmt: skip
        return out

    @property
    def max_batch_tokens(self) -> int:
        """Most real tokens in one batch (token budget, or rows x max_len), at most the
        dataset's: a budget past it sized the workers' ring by the budget (10^12 tokens: a
        33 TB allocation failing inside torch)."""
        c = self.config
        whole = sum(s.tokens for s in self.store.manifest.shards)
        if c.tokens_per_batch is not None:
            return min(c.tokens_per_batch, whole)
        return min(c.rows_per_batch * self.store.max_len, whole)

    def max_batch_docs(self) -> int:
        """Documents a transport ring slot has room for.

        Static shape: the document cap. Otherwise twice `docs_per_token` times the batch's
        tokens, at most one per token: a sizing, not a bound (every row's count would have to be
        read); a batch with more goes outside the ring (loader/packed/transport.py), slower but
        the same batch.
        """
        if self.config.static_shape:
            return int(self.max_docs)
        per_token = self.docs_per_token()
        return int(max(min(2 * per_token * self.max_batch_tokens + 16, self.max_batch_tokens), 1))

    def docs_per_token(self) -> float:
        """Document pieces per token: the manifest's `segments / tokens_out`, which reads
        nothing; a dataset written before `segments` was counted, over its first (up to) 64
        row groups, fetched side by side. (From a bucket the 64 were read one at a time before
        the first batch of a `PackedDataLoader` with workers: 6 s behind 50 ms a request.)"""
        counts = self.store.manifest.counts
        if counts.get("segments") and counts.get("tokens_out"):
            return counts["segments"] / counts["tokens_out"]
        first = list(range(min(self.index.num_groups, 64)))
        self.index.warm(first)
        tokens = docs = 0
        for g in first:
            stats = self.index.group(g)
            tokens += int(stats.lengths.sum())
            docs += int(stats.n_docs.sum())
        return docs / max(tokens, 1)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | int]]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is None:
            self.handoff.in_process()  # iterated here: its position is this copy's
        ring = self.handoff.ring if info is not None else None
        if ring is not None:  # the setup too runs carried: an error in it reaches the trainer
            return self.handoff.carry(lambda: self._start_iter(worker, n_workers, ring))
        return self._start_iter(None if info is None else worker, n_workers, None)  # None: here

    def _start_iter(self, worker: int | None, n_workers: int, ring: Ring | None) -> Iterator:
        if self._local_resume is not None:
            (epoch, origin, first, cursor), self._local_resume = self._local_resume, None
            stride_first = first  # a worker's own next step, restored by StatefulDataLoader
        else:
            if ring is not None:  # the PackedDataLoader's start (it used the resume point up)
                epoch, origin, first, cursor = (int(x) for x in ring.start)
            else:  # uses a pending resume point up (here, or once every worker started from it)
                epoch, origin, first, cursor = self._start.take(worker, n_workers)
            stride_first = first + (worker or 0)
        plan = self._start_plan(epoch, origin, first, cursor)
        self._iter_epoch, self._iter_origin = epoch, origin
        self._next_step = stride_first
        if ring is not None:
            ring.start_worker()
            return self._generate_blocks(plan, first, worker, n_workers, ring)
        return self._generate(plan, stride_first, n_workers)

    def _generate(self, plan: EpochPlan, first: int, stride: int) -> Iterator[dict]:
        for step, rows, filler in self._ahead(plan, plan.steps(first, stride)):
            out = self.expand(self.store.gather(rows), filler=filler)
            self._next_step = step + stride
            yield out

    def _ahead(
        self, plan: EpochPlan, steps: Iterable[int]
    ) -> Iterator[tuple[int, np.ndarray, bool]]:
        """`(step, rows, filler)` for each step, decoding upcoming row groups in the background
        (`look_ahead`: up to `AHEAD_STEPS` steps while fewer than `AHEAD_GROUPS` row groups
        wait to be used)."""
        store = self.store

        def start(step: int) -> tuple[int, np.ndarray, bool]:
            rows = self.rows_for(plan, step)
            filler = len(rows) == 0
            if filler:
                rows = np.asarray([self.filler_row(plan)], dtype=np.int64)
            if AHEAD_GROUPS:
                store.prefetch(store.row_group_of(rows))
            return step, rows, filler

        try:
            yield from look_ahead(
                steps,
                start,
                most=AHEAD_STEPS,
                busy=lambda: store.pending_row_groups >= AHEAD_GROUPS,
            )
        finally:
            store.cancel_prefetch()

    def block_starts(self, plan: EpochPlan) -> np.ndarray:
        """First global step of every `PackedDataLoader` worker block, then `plan.num_steps`.

        Blocks follow the windows of the order (`loader.order.steps.iter_blocks`); one step per block
        for a free shuffle. Cuts the whole epoch: for tests and reports (workers walk the blocks
        lazily).
        """
        starts = [
            a for a, _ in iter_blocks(plan, 0, per_step=self._per_step_blocks, node=self._node)
        ]
        return np.asarray([*starts, plan.num_steps], dtype=np.int64)

    def block_steps(self, plan: EpochPlan) -> int:
        """At least the most steps in one `PackedDataLoader` worker block, at most 1024 (sizes
        the transport ring), from the window sizes alone."""
        return block_steps_bound(plan, max_len=self.store.max_len, per_step=self._per_step_blocks)

    def filler_row(self, plan: EpochPlan) -> int:
        """The row a filler batch repeats (its labels -100): the epoch's first, or with `nodes`
        the first of this rank's node, which it reads anyway (another node's would be a row
        group downloaded for nothing)."""
        n, node = len(plan.order), self._node
        if n == 0:
            return 0
        first = 0 if node is None else node * plan.order.stripe  # its stripe of block 0
        return int(plan.order[min(first, n - 1)])

    @property
    def _node(self) -> int | None:
        """This rank's node where the order is dealt to nodes (its worker blocks follow that
        node's windows, `iter_blocks`), else None."""
        c = self.config
        return self.rank // (self.world_size // c.nodes) if c.nodes > 1 else None

    @property
    def _per_step_blocks(self) -> bool:
        c = self.config
        return (c.shuffle and c.shuffle_window == 0) or self.store.num_row_groups == 0

    def _generate_blocks(
        self, plan: EpochPlan, first: int, worker: int, n_workers: int, ring: Ring
    ) -> Iterator[list[CompactBatch]]:
        """Compact batches for the ring: blocks `worker`, `worker + n_workers`, ... of the worker
        blocks from step `first` (the first block starts there; PackedDataLoader puts them back
        in step order), sent `CHUNK` at a time (one DataLoader queue item each: a quarter of the
        per-item cost). Every worker walks all the blocks' step positions (no tokens) to know
        where its own begin."""

        def my_steps() -> Iterator[int]:
            blocks = iter_blocks(plan, first, per_step=self._per_step_blocks, node=self._node)
            for b, (start, end) in enumerate(blocks):
                if b % n_workers == worker:
                    yield from range(start, end)

        chunk: list[CompactBatch] = []
        size = 1  # the first batch goes out alone (time to first batch), then CHUNK at a time
        for step, rows, filler in self._ahead(plan, my_steps()):
            chunk.append(ring.put(self.store, rows, filler=filler, step=step))
            if len(chunk) == size:
                yield chunk
                chunk, size = [], CHUNK
        if chunk:
            yield chunk

    # ---- resume -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset stands (this worker's next global step).

        Raises:
            ConfigError: In the main process, after a `PackedDataLoader` with workers iterated
                the dataset: the workers' copies advanced, not this one (save the loader's).
        """
        self.handoff.check_own_state()
        plan = self.plan(self._iter_epoch, self._iter_origin)
        return self._state(self._iter_epoch, self._iter_origin, self._next_step, plan)

    def state_at(self, start: IterationStart, next_step: int) -> dict[str, Any]:
        """The state of the iteration that began at `start` once it reached global step
        `next_step`: what `PackedDataLoader.state_dict()` returns."""
        return self._state(start.epoch, start.origin, next_step, start.plan)

    def _state(self, epoch: int, origin: int, next_step: int, plan: EpochPlan) -> dict[str, Any]:
        return make_state(
            fingerprint=self.fingerprint,
            seed=self.config.seed,
            epoch=epoch,
            origin=origin,
            next_step=next_step,
            cursor=plan.cursor_after(next_step),
            layout=self.config.layout_key(self.world_size),
            ended=not plan.has_step(next_step),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from a state.

        Accepts this class's own `state_dict()` (inside a StatefulDataLoader worker: that worker
        continues at its own next step), a whole `StatefulDataLoader.state_dict()` or a
        `PackedDataLoader.state_dict()` (in the main process, before iterating: the stream
        restarts at the first global step not consumed, whatever the number of workers, or at the
        first row not consumed when the world size or batch settings changed).

        Raises:
            DataError: The state belongs to another dataset or seed, or is not a loader state.
        """
        merged = merge_loader_state(state)
        if merged is None:
            merged = state
            if get_worker_info() is not None:
                self._check(state)
                self._local_resume = self._resume_point(state, own_step=True)
                return
        self._check(merged)
        self.handoff.in_process()  # the position is the loaded one, in this process too
        epoch, origin, first, cursor = self._resume_point(merged, own_step=False)
        self._plan_cache = None  # a fresh plan: only this state's position is known in it
        self._start.set_resume(epoch, origin, first, cursor)
        self._iter_epoch, self._iter_origin, self._next_step = epoch, origin, first
        self._start_plan(epoch, origin, first, cursor)
        self._generation += 1

    def pending_start(self) -> tuple[int, int, int]:
        """`(epoch, origin, first step)` where the next iteration starts: a resume point no
        iteration has started from yet, else the start of the epoch set last."""
        return self._start.peek()[:3]

    def _check(self, state: dict[str, Any]) -> None:
        check_state(
            state, fingerprint=self.fingerprint, seed=self.config.seed, path=self.store.path
        )

    def _resume_point(self, state: dict[str, Any], *, own_step: bool) -> tuple[int, int, int, int]:
        return resume_point(
            state,
            num_rows=self.store.num_rows,
            layout=self.config.layout_key(self.world_size),
            plan=self.plan,
            own_step=own_step,
        )

    # ---- reporting --------------------------------------------------------------------------

    def balance_report(self, epoch: int | None = None) -> dict[str, float]:
        """Mean over the epoch's steps of max/mean rank cost, plain split vs balanced.

        "After" is what `balance=True` gives with this loader's caps (static shape's document
        cap included), whether or not this loader balances.
        """
        linear = self.config.balance_linear

        def cost(rows: np.ndarray) -> float:
            lengths, _, sq = self.index.stats(rows)
            return float(row_cost(sq, lengths, linear).sum())

        plan = self.plan(self.epoch if epoch is None else epoch)
        before, after = [], []
        for step in plan.steps(0):
            before.append(imbalance([cost(r) for r in plan.step_rows(step)]))
            loads = [
                cost(self._rank_rows(plan, step, r, balance=True)) for r in range(self.world_size)
            ]
            after.append(imbalance(loads))
        return {
            "steps": plan.num_steps,
            "imbalance_before": float(np.mean(before)) if before else 1.0,
            "imbalance_after": float(np.mean(after)) if after else 1.0,
        }

    def describe(self) -> dict[str, Any]:
        """Settings and sizes, for logs."""
        return {
            "path": str(self.store.path),
            "fingerprint": self.fingerprint,
            "rows": self.store.num_rows,
            "rank": self.rank,
            "world_size": self.world_size,
            **asdict(self.config),
        }
