"""`PackedDataset`: a torch IterableDataset of collated varlen batches over packtool shards.

It yields whole batches (use `DataLoader(ds, batch_size=None)` or `loader.make_dataloader`).
Rank r of W takes its rank batch of every global step (loader/order.py); DataLoader worker w of
N takes global steps first + w, first + w + N, ..., which the DataLoader's round-robin delivers in
step order, so the stream does not depend on N.

Resume follows the torchdata `StatefulDataLoader` protocol (`state_dict` / `load_state_dict`, called
in each worker) and also takes a whole StatefulDataLoader state or a `PackedDataLoader` state in
the main process, from which it restarts at the first unconsumed global step with any number of
workers, and at the first unconsumed row with other ranks or batch settings.
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loader.balance import imbalance, row_cost
from loader.collate import collate
from loader.order import EpochPlan, plan_epoch, rank_rows
from loader.rows import make_config
from loader.shards import ShardStore
from loader.transport import CompactBatch, Ring
from packtool.errors import ConfigError, DataError

STATE_VERSION = 1
_STATE_FIELDS = {
    "fingerprint": str,
    "seed": (int, np.integer),
    "epoch": (int, np.integer),
    "origin": (int, np.integer),
    "next_step": (int, np.integer),
    "cursor": (int, np.integer),
    "layout": dict,
}
"""What a state must hold (and of which type) before any of it is used."""
CHUNK = 4
"""Compact batches a PackedDataLoader worker sends per DataLoader queue item (after the first)."""
AHEAD_STEPS = 1024
"""Most upcoming steps whose rows are planned ahead of the one being produced."""
AHEAD_GROUPS = 16
"""Most row groups decoded ahead and not yet used (one default shuffle window; 0: none)."""


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How rows become batches. Exactly one of `rows_per_batch` / `tokens_per_batch`."""

    rows_per_batch: int | None = None
    """Packed rows per rank batch."""
    tokens_per_batch: int | None = None
    """Token budget per rank batch: rows are added in order while the budget holds."""
    seed: int = 0
    """Seed of the per-epoch permutation (with the dataset fingerprint and epoch)."""
    shuffle: bool = True
    """False: rows in stored order (still split over ranks and workers the same way)."""
    shuffle_window: int = 16
    """Row groups whose rows are shuffled together (row groups themselves are shuffled too); 0
    shuffles all rows freely, which decodes a whole row group per row unless the cache holds the
    dataset. Keep `cache_bytes` above this many decoded row groups."""
    drop_last: bool = False
    """Drop an incomplete last global step; otherwise ranks short of rows get a filler batch."""
    static_shape: bool = False
    """Pad every batch to the same shapes (CUDA graphs / torch.compile); see loader/collate.py."""
    max_docs_per_batch: int | None = None
    """Static shape: cu_seqlens length - 1 (padding pseudo-document included). Required with a
    token budget; with rows_per_batch it defaults to rows × the most documents in any row + 1."""
    balance: bool = False
    """Reassign each global step's rows to ranks so attention cost (Σ len² + linear) is balanced."""
    balance_linear: float = 1024.0
    """Weight of the per-token term in the balance cost (about 6 × d_model models the MLPs)."""
    layout: str = "packtool"
    """"packtool" (docs/CONTRACTS.md batch) or "hf" (transformers padding-free keys)."""
    pad_id: int = 0
    """Token id used for static-shape padding."""
    cache_bytes: int = 96 << 20
    """Bound on decoded row groups cached per process (default: a 16-row-group shuffle window of
    256 rows x 4096 uint16 tokens, with room to spare)."""
    verify: bool = False
    """Check every shard's sha256 at open (reads the whole dataset)."""

    def __post_init__(self) -> None:
        if (self.rows_per_batch is None) == (self.tokens_per_batch is None):
            raise ConfigError(
                "give exactly one of rows_per_batch or tokens_per_batch, got "
                f"rows_per_batch={self.rows_per_batch}, tokens_per_batch={self.tokens_per_batch}"
            )
        # Types first: a float row count would cut batches of alternating sizes, a string
        # "False" would switch an option on; both silently.
        for name in ("rows_per_batch", "tokens_per_batch", "max_docs_per_batch"):
            if getattr(self, name) is not None:
                _need_int(name, getattr(self, name))
        for name in ("seed", "shuffle_window", "pad_id", "cache_bytes"):
            _need_int(name, getattr(self, name))
        for name in ("shuffle", "drop_last", "static_shape", "balance", "verify"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.rows_per_batch is not None and self.rows_per_batch < 1:
            raise ConfigError(f"rows_per_batch must be >= 1, got {self.rows_per_batch}")
        if self.tokens_per_batch is not None and self.tokens_per_batch < 1:
            raise ConfigError(f"tokens_per_batch must be >= 1, got {self.tokens_per_batch}")
        if self.max_docs_per_batch is not None and self.max_docs_per_batch < 2:
            raise ConfigError(f"max_docs_per_batch must be >= 2, got {self.max_docs_per_batch}")
        if self.max_docs_per_batch is not None and not self.static_shape:
            raise ConfigError(
                "max_docs_per_batch only applies with static_shape=True (it sizes cu_seqlens)"
            )
        if not 0 <= self.pad_id < 2**63:
            raise ConfigError(f"pad_id must be a token id >= 0, got {self.pad_id}")
        if (
            isinstance(self.balance_linear, bool)
            or not isinstance(self.balance_linear, (int, float, np.integer, np.floating))
            or not 0 <= self.balance_linear < float("inf")
        ):
            raise ConfigError(
                f"balance_linear must be a finite number >= 0, got {self.balance_linear!r}"
            )
        if (
            self.static_shape
            and self.tokens_per_batch is not None
            and self.max_docs_per_batch is None
        ):
            raise ConfigError("static_shape with tokens_per_batch needs max_docs_per_batch")
        if self.layout not in ("packtool", "hf"):
            raise ConfigError(f"layout {self.layout!r} is unknown; choose 'packtool' or 'hf'")
        if self.shuffle_window < 0:
            raise ConfigError(f"shuffle_window must be >= 0, got {self.shuffle_window}")
        if self.cache_bytes < 0:
            raise ConfigError(f"cache_bytes must be >= 0, got {self.cache_bytes}")

    def layout_key(self, world_size: int) -> dict[str, Any]:
        """The settings that decide which rows form a global step (resume compares them)."""
        return {
            "world_size": world_size,
            "rows_per_batch": self.rows_per_batch,
            "tokens_per_batch": self.tokens_per_batch,
            "max_docs_per_batch": self.max_docs_per_batch if self.static_shape else None,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
        }


def _need_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ConfigError(f"{name} must be an integer, got {value!r}")


def dist_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's (rank, world size): the explicit values, else torch.distributed's, else (0, 1)."""
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return (
            dist.get_rank() if rank is None else rank,
            dist.get_world_size() if world_size is None else world_size,
        )
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


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
        if config is None:
            config = make_config(LoaderConfig, settings)
        elif settings:
            raise ConfigError(
                f"give either a config or keyword settings, not both ({sorted(settings)})"
            )
        self.config = config
        self.rank, self.world_size = dist_rank_world(rank, world_size)
        _need_int("rank", self.rank)
        _need_int("world_size", self.world_size)
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank must be in [0, world_size), got rank={self.rank}, world_size={self.world_size}"
            )
        self.store = ShardStore(path, verify=config.verify, cache_bytes=config.cache_bytes)
        self.fingerprint = self.store.manifest.fingerprint
        max_len = self.store.max_len
        if config.tokens_per_batch is not None and config.tokens_per_batch < max_len:
            raise ConfigError(
                f"tokens_per_batch {config.tokens_per_batch} is smaller than the dataset's max_len "
                f"{max_len}; a row would not fit"
            )
        self.lengths = self.n_docs = self.cost = None
        need_index = config.tokens_per_batch is not None or config.balance or config.static_shape
        if need_index:
            self.lengths, self.n_docs, sq = self.store.row_index()
            if config.balance:
                self.cost = row_cost(sq, self.lengths, config.balance_linear)
        self.max_docs = config.max_docs_per_batch
        if config.static_shape:
            if self.max_docs is None:
                most = int(self.n_docs.max()) if len(self.n_docs) else 1
                self.max_docs = config.rows_per_batch * most + 1
            else:
                self._check_max_docs()
            self.pad_tokens = config.tokens_per_batch or config.rows_per_batch * max_len
        else:
            self.pad_tokens = None
        # (epoch, origin, next_step, resume_pending) shared with worker processes so that
        # set_epoch / load_state_dict reach persistent workers too.
        self._shared = multiprocessing.RawArray("q", 4)
        self._local_resume: tuple[int, int, int] | None = None
        # Bumped by set_epoch / load_state_dict (main process): a PackedDataLoader that has not
        # iterated since then reports the dataset's new starting point, not its old position.
        self._generation = 0
        self._next_step = 0
        self._iter_epoch = 0
        self._iter_origin = 0
        self._plan_cache: tuple[tuple[int, int], EpochPlan] | None = None
        self._blocks_cache: tuple[EpochPlan, np.ndarray] | None = None
        # Set only inside the worker processes of a PackedDataLoader (loader/transport.py).
        self._worker_ring: Ring | None = None

    def _check_max_docs(self) -> None:
        """Refuse a `max_docs_per_batch` some batch would exceed (else a `DataError` mid-epoch).

        With a token budget batches close before `max_docs_per_batch - 1` documents, so only a
        single row with more documents breaks it; with `rows_per_batch` batches are not cut by
        documents, so the bound is the `rows_per_batch` rows with the most documents together.
        One entry is always left for the padding pseudo-document.
        """
        c = self.config
        n_docs = np.sort(self.n_docs)
        if c.tokens_per_batch is not None:
            need, what = int(n_docs[-1]) if len(n_docs) else 0, "one row holds"
        else:
            need = int(n_docs[-c.rows_per_batch :].sum())
            what = (
                f"a batch of {c.rows_per_batch} row{'s' if c.rows_per_batch > 1 else ''} can hold"
            )
        if need + 1 > self.max_docs:
            raise ConfigError(
                f"max_docs_per_batch {self.max_docs} is too small for this dataset: {what} "
                f"{need} documents, plus one entry for padding; use at least {need + 1}"
            )

    # ---- planning ---------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        return int(self._shared[0])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers (keeps a pending resume of that epoch)."""
        if self._shared[3] and int(self._shared[0]) == epoch:
            return
        self._shared[0], self._shared[1], self._shared[2], self._shared[3] = epoch, 0, 0, 0
        self._iter_epoch, self._iter_origin, self._next_step = epoch, 0, 0
        self._generation += 1

    def plan(self, epoch: int, origin: int = 0) -> EpochPlan:
        """The global steps of `epoch` starting at row position `origin` (cached)."""
        key = (epoch, origin)
        if self._plan_cache is None or self._plan_cache[0] != key:
            c = self.config
            plan = plan_epoch(
                num_rows=self.store.num_rows,
                fingerprint=self.fingerprint,
                seed=c.seed,
                epoch=epoch,
                world_size=self.world_size,
                origin=origin,
                shuffle=c.shuffle,
                drop_last=c.drop_last,
                rows_per_batch=c.rows_per_batch,
                tokens_per_batch=c.tokens_per_batch,
                max_docs=(self.max_docs - 1) if c.static_shape else None,
                lengths=self.lengths,
                n_docs=self.n_docs,
                group_starts=self.store._rg_start,
                window=c.shuffle_window,
            )
            self._plan_cache = (key, plan)
        return self._plan_cache[1]

    def __len__(self) -> int:
        """Steps this rank runs in the current epoch (from the resume point, if any)."""
        plan = self.plan(self.epoch, int(self._shared[1]) if self._shared[3] else 0)
        start = int(self._shared[2]) if self._shared[3] else 0
        return max(plan.num_steps - start, 0)

    def rows_for(self, plan: EpochPlan, step: int, rank: int | None = None) -> np.ndarray:
        """Row ids a rank trains on at a global step (empty: filler)."""
        c = self.config
        return rank_rows(
            plan,
            step,
            self.rank if rank is None else rank,
            balance=c.balance,
            cost=self.cost,
            lengths=self.lengths,
            n_docs=self.n_docs,
            rows_cap=c.rows_per_batch,
            tokens_cap=self.pad_tokens
            if c.tokens_per_batch is None and c.static_shape
            else c.tokens_per_batch,
            docs_cap=(self.max_docs - 1) if c.static_shape else None,
        )

    # ---- iteration --------------------------------------------------------------------------

    def batch(self, rows: np.ndarray, *, filler_row: int = 0) -> dict[str, torch.Tensor | int]:
        """Collate the given rows (empty: a filler batch that trains on nothing)."""
        filler = len(rows) == 0
        if filler:
            rows = np.asarray([filler_row], dtype=np.int64)
        tokens, doc_lens, doc_ids = self.store.gather(rows)
        return self.expand(tokens, doc_lens, doc_ids, filler=filler)

    def expand(
        self,
        tokens: np.ndarray,
        doc_lens: np.ndarray,
        doc_ids: np.ndarray,
        *,
        filler: bool = False,
        pin_memory: bool = False,
    ) -> dict[str, torch.Tensor | int]:
        """The batch dict of gathered rows (what `PackedDataLoader` runs on compact batches).

        Args:
            tokens: The rows' tokens back to back `(total,)`.
            doc_lens: Document lengths int32 `(n_docs,)`.
            doc_ids: Document ids int64 `(n_docs,)`.
            filler: Make it a filler batch (labels -100, doc ids -1).
            pin_memory: Allocate the batch in pinned memory.
        """
        c = self.config
        out = collate(
            tokens,
            doc_lens,
            doc_ids,
            pad_tokens=self.pad_tokens,
            pad_docs=self.max_docs if c.static_shape else None,
            pad_id=c.pad_id,
            position_limit=self.store.max_len,
            layout=c.layout,
            pin_memory=pin_memory,
        )
        if filler:
            out["labels"].fill_(-100)
            if "doc_ids" in out:
                out["doc_ids"].fill_(-1)
        return out

    @property
    def max_batch_tokens(self) -> int:
        """Most real tokens in one batch (token budget, or rows x max_len)."""
        c = self.config
        if c.tokens_per_batch is not None:
            return c.tokens_per_batch
        return c.rows_per_batch * self.store.max_len

    def max_batch_docs(self) -> int:
        """An upper bound on the documents in one batch (sizes the transport ring's slots)."""
        n_docs = self.n_docs
        lengths = self.lengths
        if n_docs is None:
            lengths, n_docs, _ = self.store.row_index()
        if len(n_docs) == 0:
            return 1
        c = self.config
        rows = c.rows_per_batch
        if rows is None:  # rows of a budget batch: at most budget // shortest row
            rows = max(c.tokens_per_batch // max(int(lengths.min()), 1), 1)
        return int(min(rows * int(n_docs.max()), self.max_batch_tokens))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor | int]]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if self._local_resume is not None:
            epoch, origin, first = self._local_resume
            self._local_resume = None
            stride_first = first  # a worker's own next step, restored by StatefulDataLoader
        else:
            epoch = int(self._shared[0])
            origin, first = (
                (int(self._shared[1]), int(self._shared[2])) if self._shared[3] else (0, 0)
            )
            stride_first = first + worker
        plan = self.plan(epoch, origin)
        self._iter_epoch, self._iter_origin = epoch, origin
        self._next_step = stride_first
        ring = self._worker_ring if info is not None else None
        if ring is not None:
            ring.start_worker()
            return self._generate_blocks(plan, first, worker, n_workers, ring)
        return self._generate(plan, stride_first, n_workers)

    def _generate(self, plan: EpochPlan, first: int, stride: int) -> Iterator[dict]:
        steps = range(first, plan.num_steps, stride)
        for step, rows, filler in self._ahead(plan, steps):
            out = self.expand(*self.store.gather(rows), filler=filler)
            self._next_step = step + stride
            yield out

    def _ahead(
        self, plan: EpochPlan, steps: Iterable[int]
    ) -> Iterator[tuple[int, np.ndarray, bool]]:
        """`(step, rows, filler)` for each step, decoding upcoming row groups in the background.

        Looks ahead along `steps` (up to `AHEAD_STEPS`) and hands the row groups those steps will
        need, in first-use order, to the store's decode thread while at most `AHEAD_GROUPS` are
        waiting to be used: a windowed shuffle needs a whole window of new row groups every
        window, and they decode while the current one is gathered.
        """
        filler_row = int(plan.order[0]) if len(plan.order) else 0
        store = self.store
        queue: deque[tuple[int, np.ndarray, bool]] = deque()
        upcoming = iter(steps)
        more = True
        try:
            while True:
                while (
                    more
                    and len(queue) < AHEAD_STEPS
                    and (not queue or store.pending_row_groups < AHEAD_GROUPS)
                ):
                    step = next(upcoming, None)
                    if step is None:
                        more = False
                        break
                    rows = self.rows_for(plan, step)
                    filler = len(rows) == 0
                    if filler:
                        rows = np.asarray([filler_row], dtype=np.int64)
                    if AHEAD_GROUPS:
                        store.prefetch(store.row_group_of(rows))
                    queue.append((step, rows, filler))
                if not queue:
                    return
                yield queue.popleft()
        finally:
            store.cancel_prefetch()

    def block_starts(self, plan: EpochPlan) -> np.ndarray:
        """First global step of every `PackedDataLoader` worker block, then `plan.num_steps`.

        A block is the run of steps whose rows lie (mostly: a step crossing a window's edge goes
        with the window holding most of its rows) in one shuffle window, or unshuffled in one run
        of about 8 row groups. A worker then decodes its windows' row groups plus a few of a
        neighbour's, instead of two windows per block when blocks were a fixed number of steps.
        One step per block for a free shuffle. Cached with the plan.
        """
        if self._blocks_cache is not None and self._blocks_cache[0] is plan:
            return self._blocks_cache[1]
        c = self.config
        store = self.store
        n = plan.num_steps
        groups = store.num_row_groups
        if (c.shuffle and c.shuffle_window == 0) or n == 0 or groups == 0:
            starts = np.arange(n + 1, dtype=np.int64)
        else:
            window = c.shuffle_window if c.shuffle else 16
            order = plan.order
            rg = store.row_group_of(order)
            last = np.full(groups, -1, dtype=np.int64)
            np.maximum.at(last, rg, np.arange(len(order), dtype=np.int64))
            # Positions after which no row group continues: the windows' edges (and, unshuffled,
            # every row group's), as positions in `order`.
            reach = np.maximum.accumulate(last[rg])
            cuts = np.flatnonzero(reach == np.arange(len(order))) + 1
            # Keep the first edge in every half-window of rows: each window stays one block.
            half = max(int(store.num_rows / groups * window) // 2, 1)
            cuts = cuts[np.diff(cuts // half, prepend=-1) != 0]
            # A step that crosses a window's edge goes with the window holding most of its rows
            # (its middle row): the fewest row groups of the other window to decode.
            last_b = len(plan.bounds) - 1
            steps = np.arange(n) * plan.world_size
            lo = plan.bounds[np.minimum(steps, last_b)]
            hi = plan.bounds[np.minimum(steps + plan.world_size, last_b)]
            seg = np.searchsorted(cuts, (lo + hi) // 2, side="right")
            starts = np.append(np.flatnonzero(np.diff(seg, prepend=-1)), n).astype(np.int64)
        self._blocks_cache = (plan, starts)
        return starts

    def block_steps(self, plan: EpochPlan) -> int:
        """The most steps in one `PackedDataLoader` worker block (sizes the transport ring)."""
        starts = self.block_starts(plan)
        return int(min(np.diff(starts).max(), 1024)) if len(starts) > 1 else 1

    def _generate_blocks(
        self, plan: EpochPlan, first: int, worker: int, n_workers: int, ring: Ring
    ) -> Iterator[list[CompactBatch]]:
        """Compact batches for the ring: blocks `worker`, `worker + n_workers`, ... of
        `block_starts` from step `first` (the first block starts there; PackedDataLoader puts
        them back in step order), sent `CHUNK` at a time (one DataLoader queue item each: a
        quarter of the per-item cost)."""
        starts = self.block_starts(plan)
        starts = np.unique(np.append(starts[starts > first], min(first, plan.num_steps)))

        def my_steps() -> Iterator[int]:
            for b in range(worker, len(starts) - 1, n_workers):
                yield from range(int(starts[b]), int(starts[b + 1]))

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
        """Where this copy of the dataset stands (this worker's next global step)."""
        plan = self.plan(self._iter_epoch, self._iter_origin)
        return self._state(self._iter_epoch, self._iter_origin, self._next_step, plan)

    def _state(self, epoch: int, origin: int, next_step: int, plan: EpochPlan) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "fingerprint": self.fingerprint,
            "seed": self.config.seed,
            "epoch": epoch,
            "origin": origin,
            "next_step": next_step,
            "cursor": plan.cursor_after(next_step),
            "layout": self.config.layout_key(self.world_size),
        }

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
        merged = _merge_loader_state(state)
        if merged is None:
            self._check(state)
            if get_worker_info() is not None:
                self._local_resume = self._resume_point(state, own_step=True)
                return
            merged = state
        self._check(merged)
        epoch, origin, first = self._resume_point(merged, own_step=False)
        self._shared[0], self._shared[1], self._shared[2], self._shared[3] = epoch, origin, first, 1
        self._iter_epoch, self._iter_origin, self._next_step = epoch, origin, first
        self._generation += 1

    def pending_start(self) -> tuple[int, int, int]:
        """`(epoch, origin, first step)` where the next iteration starts (main process)."""
        shared = self._shared
        origin, first = (int(shared[1]), int(shared[2])) if shared[3] else (0, 0)
        return int(shared[0]), origin, first

    def _check(self, state: dict[str, Any]) -> None:
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise DataError(
                f"not a PackedDataset state (version {state.get('version') if isinstance(state, dict) else None!r})"
            )
        for key, kind in _STATE_FIELDS.items():
            value = state.get(key)
            if value is None or isinstance(value, bool) or not isinstance(value, kind):
                raise DataError(
                    f"malformed PackedDataset state: {key!r} is {value!r}; the checkpoint is damaged"
                )
        if state["fingerprint"] != self.fingerprint:
            raise DataError(
                f"the state was saved on dataset {state['fingerprint']} but this is {self.fingerprint} "
                f"({self.store.path}); resume on the same packed data"
            )
        if state["seed"] != self.config.seed:
            raise DataError(
                f"the state was saved with seed {state['seed']!r} but this loader uses seed "
                f"{self.config.seed!r}"
            )

    def _resume_point(self, state: dict[str, Any], *, own_step: bool) -> tuple[int, int, int]:
        epoch, origin, step = int(state["epoch"]), int(state["origin"]), int(state["next_step"])
        cursor, rows = int(state["cursor"]), self.store.num_rows
        # A hand-edited or damaged position would otherwise be clamped or wrap around (a negative
        # step indexes the plan from its end): rows repeated or skipped without a word.
        if not (0 <= origin <= cursor <= rows and step >= 0):
            raise DataError(
                f"the state's position (epoch {epoch}, origin {origin}, step {step}, row "
                f"{cursor}) does not fit this dataset of {rows} rows; the checkpoint is damaged"
            )
        if state["layout"] == self.config.layout_key(self.world_size):
            steps = self.plan(epoch, origin).num_steps
            # A StatefulDataLoader worker's own next step runs past the end by up to its stride.
            if not own_step and step > steps:
                raise DataError(
                    f"the state resumes at step {step} of epoch {epoch}, which has {steps} steps; "
                    "the checkpoint is damaged"
                )
            return epoch, origin, step
        if own_step:
            raise DataError(
                "a StatefulDataLoader worker state cannot change world size or batch settings; load "
                "the whole StatefulDataLoader state into the dataset instead"
            )
        # Other ranks or batch settings: continue at the first row no step has consumed.
        return epoch, cursor, 0

    # ---- reporting --------------------------------------------------------------------------

    def balance_report(self, epoch: int | None = None) -> dict[str, float]:
        """Mean over the epoch's steps of max/mean rank cost, plain split vs balanced."""
        lengths, _, sq = (
            (self.lengths, None, None) if self.cost is not None else self.store.row_index()
        )
        cost = (
            self.cost
            if self.cost is not None
            else row_cost(sq, lengths, self.config.balance_linear)
        )
        plan = self.plan(self.epoch if epoch is None else epoch)
        before, after = [], []
        saved = self.cost
        self.cost = cost
        try:
            for step in range(plan.num_steps):
                plain = plan.step_rows(step)
                before.append(imbalance([cost[r].sum() for r in plain]))
                loads = np.zeros(self.world_size)
                for r in range(self.world_size):
                    mine = rank_rows(
                        plan,
                        step,
                        r,
                        balance=True,
                        cost=cost,
                        lengths=self.lengths,
                        n_docs=self.n_docs,
                        rows_cap=self.config.rows_per_batch,
                        tokens_cap=self.config.tokens_per_batch,
                    )
                    loads[r] = cost[mine].sum()
                after.append(imbalance(loads))
        finally:
            self.cost = saved
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


def _merge_loader_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """The dataset state at the first unconsumed step of a whole loader state, else None."""
    if not isinstance(state, dict):
        return None
    if "packed_dataset" in state:  # PackedDataLoader.state_dict()
        return state["packed_dataset"]
    if "dataset_state" in state and "_num_yielded" in state:  # StatefulDataLoader, no workers
        return state["dataset_state"]
    snap = state.get("_snapshot")
    if snap is None:
        return None
    # StatefulDataLoader: one dataset state per worker (or the main one with num_workers=0).
    states = []
    for w in (snap.get("_worker_snapshots") or {}).values():
        ds = (w or {}).get("dataset_state")
        if ds is not None:
            states.append(ds)
    main = (snap.get("_main_snapshot") or {}).get("dataset_state")
    if main is not None:
        states.append(main)
    if not states:
        raise DataError("the StatefulDataLoader state holds no PackedDataset state")
    for s in states:
        if not isinstance(s, dict) or not all(
            isinstance(s.get(k), (int, np.integer)) for k in ("epoch", "next_step")
        ):
            raise DataError(
                "malformed PackedDataset state inside the StatefulDataLoader state; the "
                "checkpoint is damaged"
            )
    # Each worker's next step; the first unconsumed global step is the smallest of them.
    return min(states, key=lambda s: (s["epoch"], s["next_step"]))
