"""`MixedDataset`: batches from several packed datasets in exact, changeable proportions.

The mixture is one stream of packed rows: `packtool.mixture.schedule.Schedule` picks the source of
every next row (each source's share of the tokens, or rows, within one row of its weight on
every prefix), each source delivering its rows in its own epoch order and starting its next
epoch (its own reshuffle) when it runs out. The stream is then cut into rank batches and global
steps exactly as `PackedDataset` cuts one epoch (loader/order/steps.py): `rows_per_batch` rows or as
many as fit `tokens_per_batch`, global step k = rank batches k*W .. k*W + W - 1, rank r takes
the r-th (rebalanced by attention cost with `balance=True`), and a filler batch for a rank past
the end. Every process computes the whole schedule (cheap: ~40 ns a row) and gathers only its
own steps, so the stream depends on neither the number of workers nor, for the rows it holds,
on the batch settings.

Batches are the usual batch dict (loader/collate.py, any layout, static shape too; optional
columns such as `loss_mask` act as in `PackedDataset`) plus `source`: int64 `(n_docs,)`, the
index of each document's source in `MixedDataset.names` (-1 for padding and filler entries), so
a training loop can log the loss per source. In `layout="hf"` it is the batch's attribute
`source` instead of a key (`HFMixedBatch`, loader/mixture/batch.py: `model(**batch)` must see
only model inputs).

Resume: `state_dict()` is the schedule's state at a step boundary (a cursor per source: epoch,
position, delivered counts) plus the step and the mixture's fingerprint. The same mixture
continues bit for bit; changed weights or caps, an added or a removed source continue every
kept source from its cursor (loader warns and `describe()["changes"]` says what changed);
another seed, or other data under a kept name, is refused.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import warnings
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from loader.collate import blank, collate
from loader.config import (
    LoaderConfig,
    check_batch_size,
    check_pad_id,
    dist_rank_world,
    make_config,
    resolve_nodes,
    static_max_docs,
)
from loader.context_parallel import cp_split
from loader.mixture.batch import HFMixedBatch
from loader.mixture.batch import batch_sources as batch_sources  # re-exported
from loader.mixture.batch import token_sources as token_sources  # re-exported
from loader.mixture.resume import check_order, check_state, make_state
from loader.mixture.sources import (
    PackedSource,
    StreamSource,
    as_mixture,
    mixture_columns,
    open_source,
)
from loader.mixture.steps import RowStream, Step, count_steps, may_end_before, plan_steps
from loader.mixture.worker import ring_parts
from loader.order.ahead import AHEAD_GROUPS, AHEAD_STEPS, look_ahead
from loader.packed.workers import WorkerHandoff
from loader.record import Documents, empty_documents
from loader.store.row_group import write_parts
from loader.store.shard_files import open_files_share
from loader.store.shards import DecodeThread
from packtool.errors import ConfigError
from packtool.mixture.schedule import Schedule, check_caps
from packtool.mixture.spec import check_compatible, check_distinct_data

AHEAD_STREAMING = 32
"""Most steps planned ahead when a source is streaming (it holds those steps' rows)."""


class MixedDataset(IterableDataset):
    """Collated varlen batches from a mixture of packed datasets (see the module docstring).

    Args:
        mixture: A `MixtureSpec`, a mixture file (`packtool.mixture.spec.read_mixture_file`), or a
            list of `SourceSpec` (each source's `path` a packed folder, a `PackedDataset` or a
            `StreamingPackedDataset`).
        config: Batching settings (`LoaderConfig`); or give them as keyword arguments
            (`tokens_per_batch=65_536`, `balance=True`, ...). The seed is the mixture's.
        rank: This data-parallel rank (default: torch.distributed's, else 0).
        world_size: Number of data-parallel ranks (default: torch.distributed's, else 1).

    Iterating starts at the beginning of the mixture or at the state last loaded; use
    `MixedDataLoader` for worker processes (it keeps the position and the shared-memory
    transport).

    Raises:
        ConfigError: Bad weights, names or settings; sources with different tokenizers or
            max_len; two sources on the same data; an empty source; a mixture that never ends.
        DataError: A missing or damaged dataset.
    """

    def __init__(
        self,
        mixture: Any,
        config: LoaderConfig | None = None,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        spec = as_mixture(mixture)
        if "seed" in settings:
            raise ConfigError(
                "the seed of a mixture is the mixture's (MixtureSpec.seed, the file's `seed`), "
                "not a loader setting"
            )
        config = make_config(LoaderConfig, settings, config)
        if resolve_nodes(config.nodes) != 1:
            raise ConfigError(
                "nodes > 1 is for a PackedDataset: a mixture does not deal its sources' rows "
                "to nodes (leave nodes at 1)"
            )
        if config.seed not in (0, spec.seed):
            raise ConfigError(
                f"config.seed {config.seed} differs from the mixture's seed {spec.seed}; set it "
                "in the mixture"
            )
        self.config = config = replace(config, seed=spec.seed)
        self.spec = spec
        self.rank, self.world_size = dist_rank_world(rank, world_size, config.context_parallel)
        # One row-group cache budget per process, as one dataset has: split over the sources
        # (each keeps at least its shuffle window): three 96 MB caches filled over the first
        # ~150 M tokens cost ~0.4-1 ms of page faults per row group decoded (bench_mixture).
        share = config.cache_bytes // len(spec.sources)
        self.sources = [open_source(s, config, share) for s in spec.sources]
        shared = DecodeThread()  # one decode thread per process, as one dataset has
        for s in self.sources:
            if isinstance(s, PackedSource):
                s.store.share_decode_thread(shared)
                # and one bound on open shard files, each keeping its shuffle window's
                s.store.open_files = open_files_share(len(self.sources), s.store.min_row_groups)
        self.names = spec.names
        check_compatible([(s.name, s.tokenizer, s.max_len) for s in self.sources])
        check_pad_id(config, self.sources[0].tokenizer.get("vocab_size"), "the mixture's data")
        for s in self.sources:
            if s.num_rows == 0:
                raise ConfigError(f"source {s.name!r} ({s.path}) has no rows; remove it")
        # after the empty check (as plan.py): the fingerprint of no shards is the max_len alone
        check_distinct_data(
            [(s, *src.data) for s, src in zip(spec.sources, self.sources, strict=True)]
        )
        if not spec.ends():
            raise ConfigError(
                "this mixture never ends: give total_tokens or total_steps, or a max_epochs with "
                "at_cap 'stop' (or a max_epochs on every source)"
            )
        self.max_len = self.sources[0].max_len
        check_batch_size(config, self.max_len, "the sources'")
        self.token_dtype = np.dtype(np.result_type(*[s.token_dtype for s in self.sources]))
        self.columns = mixture_columns(self.sources)
        """The optional columns the batches carry (`loss_mask`): those any source has."""
        self._source_ids = np.arange(len(self.sources) + 1)
        self._stores = [s.store if isinstance(s, PackedSource) else None for s in self.sources]
        self.one_loop = all(st is not None and st.optional == self.columns for st in self._stores)
        self.max_docs = self.pad_tokens = None
        if config.static_shape:
            if any(isinstance(s, StreamSource) for s in self.sources):
                raise ConfigError("static_shape needs packed sources (row sizes known ahead)")
            # one pass over every row's document count at open, as PackedDataset's static shape
            k = config.rows_per_batch or 1
            top = np.concatenate([s.top_n_docs(k) for s in self.sources])
            self.max_docs = static_max_docs(config, top)
            self.pad_tokens = config.tokens_per_batch or config.rows_per_batch * self.max_len
        check_caps(self.spec.sources, self.sources)  # now, not when the stream runs
        self.fingerprint = self._fingerprint()
        self._start: dict[str, Any] | None = None
        self._last_step: Step | None = None
        self.changes: list[str] = []
        """What the last loaded state's mixture changed (shown by `describe()`)."""
        self._reported = 0  # schedule events already warned about (main process)
        self._counted: tuple[Any, int] | None = None  # (start it was counted from, len)
        # A MixedDataLoader worker's ring; whether such workers iterated last (packed/workers.py).
        self.handoff = WorkerHandoff("MixedDataset", "MixedDataLoader")

    # ---- identity and state -----------------------------------------------------------------

    def _fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps([self.spec.unit, self.spec.seed]).encode())
        for s, src in zip(self.spec.sources, self.sources, strict=True):
            h.update(
                json.dumps([s.name, src.fingerprint, s.weight, s.max_epochs, s.at_cap]).encode()
            )
        return h.hexdigest()[:16]

    def new_schedule(self, state: dict[str, Any] | None) -> Schedule:
        return Schedule(
            self.spec.sources,
            self.sources,
            unit=self.spec.unit,
            max_len=self.max_len,
            total_tokens=self.spec.total_tokens,
            fingerprints=[s.fingerprint for s in self.sources],
            former_fingerprints=[s.former_fingerprints for s in self.sources],
            state=state,
        )

    def state_at(self, step: int, schedule_state: dict[str, Any]) -> dict[str, Any]:
        return make_state(
            fingerprint=self.fingerprint,
            seed=self.spec.seed,
            step=step,
            layout=self.config.layout_key(self.world_size),
            schedule=schedule_state,
        )

    def start_state(self) -> dict[str, Any]:
        """Where the next iteration starts (the state loaded last, else the beginning)."""
        if self._start is not None:
            return self._start
        return self.state_at(0, self.new_schedule(None).state())

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch this process yielded (before any: the start).

        Raises:
            ConfigError: After a `MixedDataLoader` with workers iterated the dataset (their
                copies advanced, not this one): save the loader's `state_dict()`.
        """
        self.handoff.check_own_state()
        return self.position()

    def position(self) -> dict[str, Any]:
        """`state_dict()` of this copy, unchecked (`MixedDataLoader` without workers)."""
        return self._last_step.state if self._last_step is not None else self.start_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Start the next iteration where `state` stands (also a `MixedDataLoader` state).

        Raises:
            DataError: Not a mixture state, a damaged one, another seed, or other data under a
                kept source name.
        """
        state = check_state(state, seed=self.spec.seed)
        schedule = self.new_schedule(state.get("schedule"))  # checks it, finds what changed
        check_order(state["layout"], self.config.layout_key(self.world_size), schedule.state())
        self.changes = list(schedule.changes)
        total, step = self.spec.total_steps, int(state["step"])
        if total is not None and step > total:  # the saved run went past this total
            self.changes.append(
                f"total_steps {total:,} is below the {step:,} steps already run: the mixture "
                "ends here, with no more batches"
            )
        if self.changes and get_worker_info() is None:
            warnings.warn("resuming a changed mixture: " + "; ".join(self.changes), stacklevel=2)
        # The saved run reported its events; a drop or a stop made here (a cap lowered below
        # what a source delivered) is reported now: with a stop, no batch will come to say it.
        self._reported = len(state["schedule"]["events"])
        if get_worker_info() is None:
            self.report(schedule.events, schedule.delivered_rows)
        self._reported = len(schedule.events)
        self._start = self.state_at(int(state["step"]), schedule.state())
        self._last_step = None
        self.handoff.in_process()  # the position is the loaded one, in this process too

    # ---- the stream of steps ----------------------------------------------------------------

    def look_ahead(self, steps: Iterator[Step], stream: RowStream, keep=None) -> Iterator[Step]:
        """The steps, with the row groups of upcoming ones decoding in the background (of those
        steps `keep(step)` is not False for: a worker's steps without rows of its own), as
        `PackedDataset` looks ahead (`loader.order.ahead.look_ahead`): up to `AHEAD_STEPS` steps
        while fewer than `AHEAD_GROUPS` row groups per source wait to be used (in all, in the
        iterating process; each source, in a worker). With a streaming source,
        `AHEAD_STREAMING` steps (it holds the rows of the steps planned); it forgets its rows
        once every step holding them has been taken."""
        packed = [s for s in self.sources if isinstance(s, PackedSource)]
        streaming = len(packed) < len(self.sources)
        # In-process, AHEAD_GROUPS per source in all: one source's next window waiting must not
        # stop the look-ahead short of the others' (their windows would then decode only when
        # needed, the iterating thread waiting: ~10% of the wall time, bench_mixture). A worker
        # (`keep`) stops at AHEAD_GROUPS for any source: its DataLoader queue hides the wait,
        # and it holds less decoded ahead.
        room = AHEAD_GROUPS * len(packed) if keep is None else AHEAD_GROUPS

        stores = [p.store for p in packed]

        def busy() -> bool:
            if keep is None:
                return sum(st.pending_row_groups for st in stores) >= room
            return any(st.pending_row_groups >= room for st in stores)

        def start(s: Step) -> Step:
            if keep is not None and keep(s) is False:
                return s
            s.runs = self._runs(s.rows["src"])  # once: the gather reads them too
            if s.fresh is None:
                self._prefetch(s.rows, s.runs)
            else:
                for i, groups in s.fresh:
                    self.sources[i].prefetch(groups)
            return s

        def after(upcoming: Step | None) -> None:
            stream.release(upcoming.begin if upcoming is not None else stream.p)

        try:
            yield from look_ahead(
                steps,
                start,
                most=AHEAD_STREAMING if streaming else AHEAD_STEPS,
                busy=busy,
                after=after if streaming else None,
            )
        finally:
            for src in self.sources:
                src.close_iteration()

    def _prefetch(self, rows: dict[str, np.ndarray], runs: list | None = None) -> None:
        src = rows["src"]  # grouped by source
        if not len(src):
            return
        groups = rows["group"].tolist()
        for i, a, b in self._runs(src) if runs is None else runs:
            self.sources[i].prefetch(groups[a:b])

    def _runs(self, src: np.ndarray) -> list[tuple[int, int, int]]:
        """`(source, start, stop)` of each source's rows in `src` (sorted: grouped by source in
        mixture order)."""
        ends = src.searchsorted(self._source_ids).tolist()
        return [(i, a, b) for i, (a, b) in enumerate(itertools.pairwise(ends)) if b > a]

    # ---- gathering and collating ------------------------------------------------------------

    def empty_record(self, n_tokens: int, n_docs: int) -> Documents:
        """Uninitialised arrays for `n_tokens` tokens and `n_docs` documents (the mixture's
        token dtype and optional columns)."""
        return empty_documents(n_tokens, n_docs, self.token_dtype, self.columns)

    def gather(
        self, rows: dict[str, np.ndarray], runs: list | None = None
    ) -> tuple[Documents, np.ndarray]:
        """The rows' documents in order and each document's source (int64 `(n_docs,)`)."""
        if self.one_loop:
            parts, n_tok, n_docs = self.views(rows, runs)
            out = self.empty_record(n_tok, n_docs)
            write_parts(parts, out, self.columns)
        else:
            out = self.empty_record(int(rows["length"].sum()), int(rows["docs"].sum()))
            self.gather_into(rows, out, runs, fits=True)
        return out, np.repeat(rows["src"], rows["docs"])

    def views(self, rows: dict[str, np.ndarray], runs: list | None) -> tuple[list, int, int]:
        """`ShardStore.views` of every row, source after source, in one list (packed sources
        with the mixture's columns: one write for the whole batch, as one dataset's)."""
        groups, local = rows["group"].tolist(), rows["local"].tolist()
        parts: list[tuple] = []
        n_tok = n_docs = 0
        for i, a, b in self._runs(rows["src"]) if runs is None else runs:
            _, nt, nd = self._stores[i].views(groups[a:b], local[a:b], parts)
            n_tok += nt
            n_docs += nd
        return parts, n_tok, n_docs

    def gather_into(
        self,
        rows: dict[str, np.ndarray],
        dest: Documents,
        runs: list | None = None,
        *,
        fits: bool = False,
    ) -> tuple[int, int] | None:
        """Write the rows' documents (optional columns included) at the front of `dest`, one
        source at a time (the rows are grouped by source: `runs`, `_runs` of their sources);
        None (nothing written) when it is too small (`fits`: sized for them)."""
        if self.one_loop:
            parts, n_tok, n_docs = self.views(rows, runs)
            if n_tok > dest.n_tokens or n_docs > min(dest.n_docs, len(dest.doc_ids)):
                return None
            write_parts(parts, dest, self.columns)
            return n_tok, n_docs
        if not fits:
            n_tok, n_docs = int(rows["length"].sum()), int(rows["docs"].sum())
            if n_tok > dest.n_tokens or n_docs > min(dest.n_docs, len(dest.doc_ids)):
                return None
        t = d = 0
        for i, a, b in self._runs(rows["src"]) if runs is None else runs:
            source = self.sources[i]
            if isinstance(source, PackedSource):
                what = rows["rid"][a:b]
            else:
                what = np.stack([rows["epoch"][a:b], rows["pos"][a:b]], axis=1)
            nt, nd = source.gather_into(what, dest, t, d)
            t += nt
            d += nd
        return t, d

    def expand(
        self,
        docs: Documents,
        doc_sources: np.ndarray,
        *,
        filler: bool = False,
        pin_memory: bool = False,
    ) -> dict[str, torch.Tensor | int]:
        """The batch dict of gathered rows, with `source` per document (see the module doc).

        The optional columns in `docs` act as in `PackedDataset` (a `loss_mask` sets -100
        labels where the target token is not supervised)."""
        c = self.config
        out = collate(
            docs,
            pad_tokens=self.pad_tokens,
            pad_docs=self.max_docs if c.static_shape else None,
            pad_id=c.pad_id,
            position_limit=self.max_len,
            layout=c.layout,
            seq_idx=c.seq_idx,
            varlen_keys=c.varlen_keys,
            pin_memory=pin_memory,
        )
        cu = out["cu_seqlens"] if "cu_seqlens" in out else out["cu_seq_lens_q"]
        source = np.full(len(cu) - 1, -1, np.int64)
        if not filler:
            source[: len(doc_sources)] = doc_sources
        if filler:
            blank(out)
        if c.layout == "hf":  # a key would reach the model's forward (see `HFMixedBatch`)
            out = HFMixedBatch(out)
            out.source = torch.from_numpy(source)
        else:
            out["source"] = torch.from_numpy(source)
        if c.context_parallel is not None:  # this context-parallel rank's share
            out = cp_split(
                out, *c.context_parallel, c.cp_style, c.cp_block, pad_id=c.pad_id,
                position_limit=self.max_len, pin_memory=pin_memory,
            )  # fmt: skip
        return out

    def batch(
        self, rows: dict[str, np.ndarray], *, filler: bool = False, runs: list | None = None
    ) -> dict[str, Any]:
        docs, sources = self.gather(rows, runs)
        return self.expand(docs, sources, filler=filler)

    # ---- iteration --------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        if info is None:
            self.handoff.in_process()  # iterated here: its position is this copy's
        ring = self.handoff.ring if info is not None else None
        if ring is not None:  # the setup too runs carried: an error in it reaches the trainer

            def parts() -> Iterator[Any]:
                start = self.start_state()
                stream = RowStream(self, start["schedule"])
                ring.start_worker()
                return ring_parts(self, stream, int(start["step"]), ring, worker, n_workers)

            return self.handoff.carry(parts)
        start = self.start_state()
        stream = RowStream(self, start["schedule"])
        first = int(start["step"])

        def own(step: int) -> bool:
            return (step - first) % n_workers == worker

        return self._batches(stream, first, own, in_process=info is None)

    def _batches(self, stream: RowStream, first: int, own, *, in_process: bool) -> Iterator[dict]:
        self._last_step = None
        for s in self.look_ahead(plan_steps(self, stream, first, own), stream):
            batch = self.batch(s.rows, filler=s.filler, runs=s.runs)
            if in_process:
                self._last_step = s  # its state is made only if state_dict() asks
                # rows delivered since the start of the mixture, as the events count them (the
                # stream's indices count from this iteration's start: a resume's)
                self.report(stream.schedule.events, s.chunk.start["rows"] + s.ref[2])
            yield batch

    def owners(self, rows: dict[str, np.ndarray], n_workers: int) -> np.ndarray:
        """The `MixedDataLoader` worker that gathers each row: the one that owns its row group
        (a function of source and row group), so every row group is decoded by one worker only,
        and every worker decodes a share of every window (owning whole windows would leave all
        but one worker per source idle while a window decodes: with more workers than sources,
        most of them)."""
        if n_workers == 1:
            return np.zeros(len(rows["src"]), np.int64)
        # Primes, so any worker count below a million spreads a source's row groups over all
        # workers (40503, the multiplier before, is 3 x 13501: with 3, 6, 9 ... workers each
        # source went whole to one worker).
        return (rows["group"] * 1_000_003 + rows["src"] * 7919) % n_workers

    def report(self, events: list[dict[str, Any]], upto: int) -> None:
        """Warn (once, in the main process) about sources dropped or the mixture stopping, as
        the stream handed out passes row `upto`."""
        while self._reported < len(events) and events[self._reported]["rows"] <= upto:
            e = events[self._reported]
            if e["what"] in ("dropped", "stopped"):
                warnings.warn(e["message"], stacklevel=3)
            self._reported += 1

    # ---- sizes and reporting ----------------------------------------------------------------

    @property
    def max_batch_tokens(self) -> int:
        c = self.config
        return (
            c.tokens_per_batch
            if c.tokens_per_batch is not None
            else c.rows_per_batch * self.max_len
        )

    def max_batch_docs(self) -> int:
        """Documents a transport ring slot has room for (as `PackedDataset.max_batch_docs`).

        Static shape: the document cap. Otherwise twice the most documents per token of any
        source (its manifest's, `PackedDataset.docs_per_token`) times the batch's tokens, at
        most one per token (a streaming source: one per token): a sizing, not a bound, that
        reads no source whole; a part with more goes outside the ring (loader/packed/transport.py), slower but the
        same batch.
        """
        if self.config.static_shape:
            return int(self.max_docs)
        tokens = self.max_batch_tokens
        if any(isinstance(s, StreamSource) for s in self.sources):
            return tokens
        per_token = max(s.docs_per_token() for s in self.sources)
        return int(max(min(2 * per_token * tokens + 16, tokens), 1))

    def __len__(self) -> int:
        """The global steps the next iteration yields (from the state loaded last, else from the
        start), only with `total_steps`: `total_steps` less the steps done, or fewer where a
        cap ends the mixture first. Where a cap may (`steps.may_end_before`: a source's
        `max_epochs` within reach of the rows the steps left hold, or with `tokens_per_batch`
        of the tokens they hold, with `at_cap` "stop" or a cap on every source drawn from) the
        steps are counted on the plan, the schedule and the cuts without reading a token: once
        per start, as long as planning the rows up to the end.

        Raises:
            TypeError: No `total_steps` (a length in tokens or caps only has no step count
                given ahead), or a streaming source's cap may end the mixture first (counting
                would pack the stream).
        """
        total = self.spec.total_steps
        if total is None:
            raise TypeError("a mixture bounded in tokens or by caps has no length in steps")
        start = self.start_state()
        first = int(start["step"])
        if first >= total or not may_end_before(self, start, total):
            return max(total - first, 0)
        if self._counted is not None and self._counted[0] is self._start:
            return self._counted[1]
        if any(isinstance(s, StreamSource) for s in self.sources):
            raise TypeError(
                "a mixture whose streaming source's cap may end it before total_steps has no "
                "length known ahead (counting its steps would pack the stream)"
            )
        n = count_steps(self, RowStream(self, start["schedule"]), first)
        self._counted = (self._start, n)
        return n

    def describe(self) -> dict[str, Any]:
        """The mixture, its sources and where it stands, for logs."""
        state = self.state_dict()
        sched = state["schedule"]
        return {
            "fingerprint": self.fingerprint,
            "unit": self.spec.unit,
            "seed": self.spec.seed,
            "total_tokens": self.spec.total_tokens,
            "total_steps": self.spec.total_steps,
            "rank": self.rank,
            "world_size": self.world_size,
            "step": state["step"],
            "tokens": sched["tokens"],
            "done": sched["done"],
            "sources": [
                {
                    "name": s.name,
                    "kind": src.kind,
                    "path": src.path,
                    "fingerprint": src.fingerprint,
                    "rows": src.num_rows,
                    "weight": s.weight,
                    "max_epochs": s.max_epochs,
                    "at_cap": s.at_cap,
                    **{k: sched["sources"][s.name][k] for k in ("epoch", "pos", "tokens", "share")},
                }
                for s, src in zip(self.spec.sources, self.sources, strict=True)
            ],
            "events": sched["events"],
            "changes": self.changes,
            **{k: v for k, v in vars(self.config).items() if k != "seed"},
        }
