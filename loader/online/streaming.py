"""`StreamingPackedDataset`: online-packed varlen batches from tokenized Parquet, exactly once.

No offline packing step: documents are read from tokenized Parquet (`packtool tokenize`) and
packed on the fly by `loader.online.packer.OnlinePacker`, so a change of the data mixture needs no
re-pack. A `loss_mask` column (tokenized from labels or a mask) comes along and sets the
batches' labels; the packer's `long_docs` must then be `truncate` or `drop`.

Sharding: there are `world_size × num_workers` slots; slot `rank × num_workers + worker` takes
the documents whose global index (position in the inputs: in the order given, a folder's or a
glob's files in path order) is `slot` modulo the slot count
(`shard_by="document"`), or the whole row groups whose global index is (`shard_by="row_group"`:
reads only its own row groups; even only when there are many more row groups than slots). Every
document goes to exactly one slot; each slot packs its own stream, so the rows depend on the
number of slots (not on timing). With `drop_last=False` every token comes out exactly once (or is
counted as truncated/dropped by the long-document policy).

Resume: `state_dict()` holds the next row group, the packer's buffer (tokens included), packed rows
not yet batched and the counters; `load_state_dict()` continues exactly, so the stream before and
after a restart equals an uninterrupted run. A state is keyed on the input files (each one's
name, size and documents, in order, and one digest of every file's size and Parquet footer:
`packtool.storage.footers`) and the settings: one of other inputs is refused, a byte-identical
copy elsewhere or with another modification time resumes. It follows the torchdata `StatefulDataLoader`
protocol (one state per worker, restored in the same worker); in the main process
(`num_workers=0`) load the dataset's own state before iterating.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from torch.utils.data import IterableDataset, get_worker_info

from loader.collate import check_collate_kwargs, collate_kwargs_dict
from loader.config import OnlineConfig, check_bool, check_epoch, dist_rank_world, make_config
from loader.online.inputs import TableRowError
from loader.online.packer import OnlinePacker
from loader.online.rows import PackedRows, RowBatcher
from loader.online.state import (
    StateCheck,
    check_packer_state,
    check_rows_state,
    config_state,
    loaded,
    saved,
    settings_diff,
)
from loader.packed.resume import PendingStart
from packtool.dataset.tokenized import common_identity, common_optional, tokenized_meta
from packtool.errors import ConfigError, DataError, PacktoolError, one_line
from packtool.pack.columns import check_policy
from packtool.storage import local as storage
from packtool.storage.footers import footer_digests
from packtool.storage.local import expand

STATE_VERSION = 1
_LIVE_KEYS = frozenset(("slot", "n_slots", "next_group", "done", "packer", "pending", "ready"))
"""What a mid-stream state holds besides version, key, epoch and start."""
SHARD_BY = ("document", "row_group")


class StreamingPackedDataset(IterableDataset):
    """Varlen batches (the loader batch dict) packed on the fly from tokenized Parquet.

    Args:
        inputs: Tokenized Parquet files, folders or globs (`packtool tokenize` output).
        config: Packing settings (`OnlineConfig`); or give them as keyword arguments
            (`max_len=4096`, `buffer_docs=10_000`, ...).
        rows_per_batch: Packed rows per batch (exactly one of this and `tokens_per_batch`).
        tokens_per_batch: Token budget per batch: rows are added while it holds.
        drop_last: Drop each slot's incomplete last batch.
        rank: This data-parallel rank (default: torch.distributed's, else 0).
        world_size: Data-parallel ranks (default: torch.distributed's, else 1).
        shard_by: `document` (index modulo slots) or `row_group`.
        collate_kwargs: Passed to `loader.collate` (e.g. `layout="hf"`); checked here (a
            static shape's `pad_tokens` must hold the most tokens a batch can).

    Call `set_epoch(e)` before each epoch; the epoch seeds the row order. The epoch and a
    resume point loaded by `load_state_dict` are shared with DataLoader workers, persistent
    ones included (a mid-epoch state must be loaded before the workers start).

    Raises:
        DataError: an input is not tokenized Parquet, or the inputs used different tokenizers.
        ConfigError: invalid settings.
    """

    def __init__(
        self,
        inputs: Iterable[str | os.PathLike],
        config: OnlineConfig | None = None,
        *,
        rows_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
        drop_last: bool = False,
        rank: int | None = None,
        world_size: int | None = None,
        shard_by: str = "document",
        collate_kwargs: dict[str, Any] | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        # Shared with worker processes, so that set_epoch / load_state_dict reach persistent
        # workers too, and a resume point they start from is used up here too.
        self._start = PendingStart(shared=self.share_start)
        self._resume: dict[str, Any] | None = None  # a mid-epoch state loaded in this process
        self._resume_serial = -1  # which of `_start`'s resume points `_resume` is
        self._local_resume: dict[str, Any] | None = None  # loaded inside a DataLoader worker
        config = make_config(OnlineConfig, settings, config)
        if config.buffer_seconds is not None:
            raise ConfigError("a training stream must be reproducible: leave buffer_seconds unset")
        if shard_by not in SHARD_BY:
            raise ConfigError(f"shard_by {shard_by!r} is unknown; choose one of {list(SHARD_BY)}")
        batcher = RowBatcher(
            max_len=config.max_len, rows_per_batch=rows_per_batch, tokens_per_batch=tokens_per_batch
        )  # validates
        self.config = config
        self.rows_per_batch = rows_per_batch
        self.tokens_per_batch = tokens_per_batch
        check_bool("drop_last", drop_last)
        self.drop_last = drop_last
        self.shard_by = shard_by
        self.collate_kwargs = collate_kwargs_dict(collate_kwargs)
        # now, not at the first batch (in a DataLoader worker: a worker's traceback)
        check_collate_kwargs(self.collate_kwargs, batcher.batch_tokens)
        self.rank, self.world_size = dist_rank_world(rank, world_size)
        if isinstance(inputs, (str, os.PathLike)):
            inputs = [inputs]
        self.paths = expand(inputs, (".parquet",), "tokenized Parquet (.parquet)")
        if not self.paths:
            raise DataError("no input files: give tokenized Parquet files, folders or globs")
        tokenized = []
        for p in self.paths:
            meta = tokenized_meta(p)
            if meta is None:
                raise DataError(f"{p}: not tokenized Parquet; run `packtool tokenize` first")
            tokenized.append((p, meta))
        self.identity = common_identity(tokenized)
        self.columns = common_optional(tokenized)
        """The optional columns (`loss_mask`) the documents carry; files that differ are refused."""
        self._read_columns = ["doc_id", "input_ids", *self.columns]
        # Now, not at the first batch (inside a DataLoader worker: a worker's traceback).
        check_policy(self.columns, self.config.long_docs, api=True)
        # the global row-group table: (file index, row group, first global document index)
        groups: list[tuple[int, int, int, int]] = []
        first = 0
        sizes = [st.st_size for st in storage.stat_all(self.paths)]
        inputs = []
        for f, p in enumerate(self.paths):
            meta = storage.parquet_file(p).metadata
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                groups.append((f, g, first, n))
                first += n
            inputs.append((storage.file_name(p), int(sizes[f]), int(meta.num_rows)))
        self.groups = groups
        self.num_documents = first
        self._inputs = inputs
        """What a state is keyed on: `(file name, bytes, documents)` of each file, in order
        (file names and a total were no key: the files in another order, or other files of the
        same names, resumed with documents lost and repeated). Not the path: a copy of the
        same files elsewhere (another node's mount, a scratch copy) resumes."""
        self.footers = _joined(footer_digests(self.paths, sizes))
        """The files' identity by content: one digest (16 hex digits) of each file's size and
        Parquet footer (`packtool.storage.footers`), in order; one ranged read per file, here.
        The key holds it beside `inputs` (a file rewritten with other documents of its name,
        size and count resumed on other data), and a mixture identifies the source by it."""
        self._live: dict[str, Any] | None = None  # the running iterator's objects, for state_dict

    share_start = True
    """Whether the next iteration's start (epoch, resume point) lives in shared memory, seen by
    DataLoader workers (False: each process's copy is its own, for a mixture's source, which
    starts its passes itself in whichever process reads it)."""

    @property
    def epoch(self) -> int:
        """The epoch the next iteration delivers."""
        local = self._local_resume
        return self._start.epoch if local is None else int(local["epoch"])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch the next iteration delivers (the epoch seeds the row order), here
        and in DataLoader workers, persistent ones too.

        A resume point loaded for this epoch is kept; one for another epoch is dropped (its
        buffer holds that epoch's documents in that epoch's order).
        """
        epoch = check_epoch(epoch)
        if self._start.set_epoch(epoch):  # False: a resume point of this epoch is kept
            self._resume = None
        if self._local_resume is not None and int(self._local_resume["epoch"]) != epoch:
            self._local_resume = None
        if self._live is not None and self._live["epoch"] != epoch:
            self._live = None  # state_dict() now describes the start of the new epoch

    # ---- iteration --------------------------------------------------------------------------

    def _slot(self) -> tuple[int, int]:
        info = get_worker_info()
        worker, n_workers = (0, 1) if info is None else (info.id, info.num_workers)
        return self.rank * n_workers + worker, self.world_size * n_workers

    def _pending_resume(self) -> dict[str, Any] | None:
        """The state the next iteration resumes from (None: the start of `epoch`)."""
        if self._local_resume is not None:
            return self._local_resume
        if not self._start.peek()[4] or self._resume_serial != self._start.serial:
            return None
        return self._resume

    def _take_start(self) -> tuple[int, dict[str, Any] | None]:
        """The epoch an iteration starting now delivers, and the mid-epoch state it resumes
        from (None: the epoch's start); uses the resume point up (here at once, in DataLoader
        workers once each of them has started from it)."""
        if self._local_resume is not None:  # this worker's own, restored by StatefulDataLoader
            state, self._local_resume = self._local_resume, None
            return int(state["epoch"]), None if state["start"] else state
        serial = self._start.serial
        resuming = self._start.peek()[4]
        info = get_worker_info()
        if info is None or not self.share_start:
            epoch = self._start.take()[0]
        else:
            epoch = self._start.take(info.id, info.num_workers)[0]
        if not resuming:
            return epoch, None
        if self._resume is None or self._resume_serial != serial:
            raise ConfigError(
                "a mid-epoch state was loaded after these persistent DataLoader workers started, "
                "so they do not hold it; call load_state_dict before the DataLoader's first "
                "iteration, or make a new DataLoader"
            )
        state = self._resume
        if info is None:
            self._resume = None
        return epoch, state

    def __iter__(self) -> Iterator[dict]:
        try:
            live = self._begin()
        except PacktoolError as exc:
            # Raised at the first batch instead: a persistent DataLoader worker starts its next
            # iteration outside the guard that hands a worker's errors to the trainer, and died
            # of it without a word ("worker exited unexpectedly").
            return _failed(exc)
        self._live = live
        return self._generate(live)

    def _begin(self) -> dict[str, Any]:
        """The objects of an iteration starting now (restored from a resume point, if any)."""
        slot, n_slots = self._slot()
        epoch, resume = self._take_start()
        packer = OnlinePacker(self.config, seed_key=(epoch, slot, n_slots))
        batcher = RowBatcher(
            max_len=self.config.max_len,
            rows_per_batch=self.rows_per_batch,
            tokens_per_batch=self.tokens_per_batch,
        )
        live = {
            "slot": slot,
            "n_slots": n_slots,
            "epoch": epoch,
            "next_group": 0,
            "packer": packer,
            "batcher": batcher,
            "ready": [],
            "done": False,
        }
        if resume is not None:
            self._restore(live, resume)
        return live

    def _emit(self, rows: PackedRows) -> Any:
        """What the stream yields for one batch of packed rows: the batch dict (a mixture's
        source yields the rows' `Documents` instead, loader/mixture/sources.py)."""
        return rows.collate(**self.collate_kwargs)

    def _generate(self, live: dict[str, Any]) -> Iterator[dict]:
        packer: OnlinePacker = live["packer"]
        batcher: RowBatcher = live["batcher"]
        # Groups run in file order, so only the file being read is kept open (one open file per
        # input file held till the epoch's end: "Too many open files" past ~1,000 files).
        opened: tuple[int, pq.ParquetFile] | None = None
        slot, n_slots = live["slot"], live["n_slots"]
        while True:
            while live["ready"]:
                yield self._emit(live["ready"].pop(0))
            if live["done"]:
                return
            g = live["next_group"]
            if g >= len(self.groups):
                packer.flush(final=True)
                batcher.add(packer.pop())
                live["ready"] = list(batcher.ready(final=not self.drop_last))
                batcher.pending = PackedRows.concat([])
                live["done"] = True
                continue
            live["next_group"] = g + 1
            f, rg, first, n = self.groups[g]
            if self.shard_by == "row_group":
                if g % n_slots != slot:
                    continue
                take = None
            else:
                # documents first..first+n-1; ours: index ≡ slot (mod n_slots)
                start = (slot - first) % n_slots
                if start >= n:
                    continue
                take = np.arange(start, n, n_slots)
            try:
                if opened is None or opened[0] != f:
                    if opened is not None:
                        opened[1].close(force=True)
                    opened = (f, storage.parquet_file(self.paths[f]))
                table = opened[1].read_row_group(rg, columns=self._read_columns)
            except (OSError, IndexError, pa.ArrowException) as exc:
                raise DataError(
                    f"{self.paths[f]}: row group {rg} unreadable ({one_line(exc)}); the file changed or is "
                    "damaged since the dataset was opened"
                ) from None
            if table.num_rows != n:  # rewritten with other row groups: rows would go astray
                raise DataError(
                    f"{self.paths[f]}: row group {rg} holds {table.num_rows:,} rows where the "
                    f"dataset was opened with {n:,}; the file changed since"
                )
            if take is not None:
                table = table.take(take)
            try:
                packer.push_table(table)
            except TableRowError as exc:  # its row in the slot's share: its row in the group
                row = exc.row if take is None else int(take[exc.row])
                where = f"{self.paths[f]}: row group {rg}, row {row}"
                raise DataError(f"{where}: input_ids {exc.what}") from None
            except DataError as exc:
                raise DataError(f"{self.paths[f]}: row group {rg}: {exc}") from None
            batcher.add(packer.pop())
            live["ready"] = list(batcher.ready())

    # ---- resume -----------------------------------------------------------------------------

    def _key(self, *, legacy: bool = False, footers: bool = True) -> dict[str, Any]:
        """What a state is saved under; `legacy`: as states saved before `inputs` were (file
        names and the total of documents, all one can compare such a state on); `footers`
        False: as states saved before the key held the files' footers."""
        names: dict[str, Any]
        if legacy:
            names = {"files": [Path(p).name for p in self.paths], "documents": self.num_documents}
        else:
            names = {"inputs": [list(i) for i in self._inputs]}
        if footers:
            names["footers"] = self.footers
        return {
            **names,
            "config": config_state(self.config),
            "rows_per_batch": self.rows_per_batch,
            "tokens_per_batch": self.tokens_per_batch,
            "drop_last": self.drop_last,
            "shard_by": self.shard_by,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """Where this copy of the dataset stands, buffer contents included (after the last batch
        it yielded). Before any iteration: the state loaded by `load_state_dict()` (for this
        epoch), else the start of the current epoch. Arrays as torch tensors, so `torch.load`'s
        default `weights_only=True` loads a checkpoint holding it."""
        return saved(self._state())

    def _state(self) -> dict[str, Any]:
        live = self._live
        if live is None and (pending := self._pending_resume()) is not None:
            return dict(pending)  # not yet restored: where the next iteration resumes
        if live is None:
            return {
                "version": STATE_VERSION,
                "key": self._key(),
                "epoch": self.epoch,
                "start": True,
            }
        return {
            "version": STATE_VERSION,
            "key": self._key(),
            "start": False,
            "epoch": live["epoch"],
            "slot": live["slot"],
            "n_slots": live["n_slots"],
            "next_group": live["next_group"],
            "done": live["done"],
            "packer": live["packer"].state_dict(),
            "pending": live["batcher"].pending.to_state(),
            "ready": [r.to_state() for r in live["ready"]],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` at the next iteration (same inputs and settings).

        Raises:
            DataError: the state belongs to other inputs or settings, is not a state of this
                class, or is damaged (every part is checked here, the packer's and the packed
                rows' included, before any of it is used).
        """
        state = loaded(state)  # tensors (or numpy arrays, from states saved before 2026-12-07)
        version = state.get("version") if isinstance(state, dict) else None
        integer = isinstance(version, (int, np.integer)) and not isinstance(version, bool)
        if not integer or version != STATE_VERSION:  # an array's == is no answer
            raise DataError("not a StreamingPackedDataset state")
        check = StateCheck("StreamingPackedDataset")
        check.dict_(state, "", ("key", "epoch", "start"))
        check.dict_(state["key"], "key", ())
        check.int_(state["epoch"], "epoch")  # (set_epoch takes >= 0 only)
        # other settings first: the packer's state is checked against these settings, and a
        # state of another max_len was called "malformed ... damaged"
        key = state["key"]
        legacy = "inputs" not in key and "files" in key
        if not legacy and (where := _inputs_diff(key.get("inputs"), self._inputs)):
            raise DataError(
                f"the state was saved with other inputs ({where}); resume with the same files, "
                "in the same order"
            )
        footers = "footers" in key  # a state saved before has none: checked as it was then
        if footers and not (isinstance(key["footers"], str) and key["footers"] == self.footers):
            raise DataError(
                "the state was saved with other inputs (the files' Parquet footers differ: a "
                "file of the same name, size and document count holds other data); resume with "
                "the same files, in the same order"
            )
        diff = settings_diff(key, self._key(legacy=legacy, footers=footers))
        if diff:
            raise DataError(
                f"the state was saved with other inputs or settings ({', '.join(diff)}); resume "
                "with the same files, packing and batch settings, rank and world size"
            )
        start = check.bool_(state["start"], "start")
        if not start:
            self._check_live(check, state)
        self._live = None
        epoch = int(state["epoch"])
        if get_worker_info() is not None:  # this worker's own state (StatefulDataLoader)
            self._local_resume = state
        elif start:
            self._start.drop()  # a start: no resume point pending, whatever its epoch
            self._start.set_epoch(epoch)
            self._resume = None
        else:
            self._start.set_resume(epoch, 0, 0, 0)
            self._resume, self._resume_serial = state, self._start.serial

    def _check_live(self, check: StateCheck, state: dict[str, Any]) -> None:
        """Every part of a mid-stream state, before any of it is used."""
        check.dict_(state, "", sorted(_LIVE_KEYS))
        n_slots = check.int_(state["n_slots"], "n_slots", 1)
        if check.int_(state["slot"], "slot") >= n_slots:
            raise check.fail("slot", f"is {state['slot']!r}, not below n_slots {n_slots}")
        group = check.int_(state["next_group"], "next_group", None)
        if not 0 <= group <= len(self.groups):
            # A wrong position would re-read or skip row groups without a word.
            raise DataError(
                f"the state resumes at row group {group} but the inputs have "
                f"{len(self.groups)}; the checkpoint is damaged"
            )
        check.bool_(state["done"], "done")
        max_len = self.config.max_len
        check_packer_state(state["packer"], self.config, owner=check.owner, at="packer.")
        check_rows_state(
            state["pending"], owner=check.owner, path="pending", with_tokens=True, max_len=max_len
        )
        if not isinstance(state["ready"], list):
            raise check.fail("ready", f"is {state['ready']!r}, not a list")
        for i, rows in enumerate(state["ready"]):
            check_rows_state(
                rows, owner=check.owner, path=f"ready[{i}]", with_tokens=True, max_len=max_len
            )

    def _restore(self, live: dict[str, Any], state: dict[str, Any]) -> None:
        if (state["slot"], state["n_slots"]) != (live["slot"], live["n_slots"]):
            raise DataError(
                f"the state belongs to slot {state['slot']} of {state['n_slots']} (rank × worker) "
                f"but this is slot {live['slot']} of {live['n_slots']}; resume with the same "
                "number of workers"
            )
        live["epoch"] = state["epoch"]
        live["next_group"] = state["next_group"]
        live["done"] = state["done"]
        # checked already, with the rest of the state, by load_state_dict (_check_live)
        live["packer"].load_checked_state(state["packer"])
        live["batcher"].pending = PackedRows.from_state(state["pending"])
        live["ready"] = [PackedRows.from_state(r) for r in state["ready"]]

    @property
    def stats(self) -> dict[str, Any]:
        """The running packer's counters (this process / worker)."""
        live = self._live
        return {} if live is None else live["packer"].stats


def _failed(exc: PacktoolError) -> Iterator[dict]:
    raise exc
    yield  # a generator: raises at its first item


def _joined(digests: Iterable[str]) -> str:
    """One digest (16 hex digits) of the files' digests, in order."""
    h = hashlib.sha256()
    for d in digests:
        h.update(d.encode())
    return h.hexdigest()[:16]


def _inputs_diff(theirs: Any, mine: list[tuple[str, int, int]]) -> str | None:
    """How the inputs a state was saved with (`theirs`, from its key) differ from `mine`, in a
    few words; None when they are the same."""

    def show(entry: Any) -> str:
        if isinstance(entry, (list, tuple)) and len(entry) == 3:
            name, size, docs = entry
            return f"{name} ({size} bytes, {docs} documents)"
        return repr(entry)[:80]

    if not isinstance(theirs, (list, tuple)):
        return f"the state names its inputs as {show(theirs)}"
    for i, (t, m) in enumerate(zip(theirs, mine, strict=False)):
        try:
            same = isinstance(t, (list, tuple)) and bool(tuple(t) == m)
        except (TypeError, ValueError):  # an array in a damaged state
            same = False
        if not same:
            return f"input file {i} is {show(m)}, the state's {show(t)}"
    if len(theirs) != len(mine):
        return f"input files: {len(mine)} here, {len(theirs)} in the state"
    return None
