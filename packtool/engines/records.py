"""A run's state on disk, and the running sums the driver keeps: constant cost per partition.

Everything a run needs to be resumed lives in its staging folder (so a killed driver is resumed
from any machine that sees the folder):

    .OUT.packtool-staging/
        shard-PPPPPP-KKKKK.parquet   final names, written by the partition workers
        .packtool-run/
            plan.json                the fingerprint (options, tokenizer, inputs) and the plan
            parts/PPPPPP.json        one completion record per finished partition or merge node
            tails/PPPPPP.arrow       the pieces a partition or merge node set aside
                                     (packtool/pack/tail.py, packtool/engines/merge.py)

A partition's worker writes its shards, then its tail, then its record, each atomically (a
temporary name unique to the writer, fsync, rename), so a record exists only for a partition
whose every output is complete. Nothing is ever rewritten: a record is one small file of its
own (~1-50 KB: counts, shard list, skip examples, and the segment-length histogram), written
once. `--resume` lists `parts/` and reads only those records.

`Totals` is what the driver keeps in memory: sums of the counts, the rows per round, one length
histogram (max_len + 1 integers, for the L1/L2 bounds), per-group sums, skip counts and the
first few skip examples in partition order: O(max_len + groups), whatever the number of
partitions. Shard lists are not kept; `index.json` is streamed from the records at the end
(packtool/engines/finish.py).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.dataset import names
from packtool.errors import OVERWRITE, DataError, json_value
from packtool.pack.chunk import PackCounts
from packtool.read.documents import SkipCounter
from packtool.storage import local as storage
from packtool.storage import writing

RUN_DIR = names.RUN_STATE
PLAN_FILE = "plan.json"
PARTS_DIR = "parts"
TAILS_DIR = "tails"


def shard_name(partition: int, k: int) -> str:
    """Shard `k` of unit `partition` (`names.PACK_SHARD_PATTERN`)."""
    return names.PACK_SHARD_PATTERN.format(partition, k)


def run_dir(work: Path) -> Path:
    return work / RUN_DIR


def record_path(work: Path, partition: int) -> Path:
    return work / RUN_DIR / PARTS_DIR / f"{partition:06d}.json"


def tail_path(work: Path, partition: int) -> Path:
    return work / RUN_DIR / TAILS_DIR / f"{partition:06d}.arrow"


def write_tail(work: Path, unit: int, table: pa.Table) -> None:
    """A unit's tail (pieces, packtool/pack/tail.py) as Arrow IPC, atomically."""
    sink = pa.BufferOutputStream()
    # lz4: a tail's `source` column repeats one path per piece.
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_file(sink, table.schema, options=options) as w:
        w.write_table(table)
    writing.write_atomic(tail_path(work, unit), sink.getvalue().to_pybytes(), make_parent=True)


def read_tail(path: Path) -> pa.Table:
    """A unit's tail (`DataError` naming the file when it is missing or damaged)."""
    try:
        with storage.memory_map(path) as source:
            return pa.ipc.open_file(source).read_all()
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(
            f"{path}: unreadable tail ({exc}); the run's staging folder is damaged: start over "
            f"with {OVERWRITE}"
        ) from None


def never_planned(work: Path) -> bool:
    """Whether the staging folder `work` is what a run killed before it saved its plan leaves
    (while it checked the inputs, planned, or wrote the plan): no plan, and nothing in it but
    the state folder holding only temporaries of atomic writes (`writing.is_temporary`: the
    plan's, never renamed), or nothing at all. Such a run did no work: a plain rerun removes
    the folder and starts again, and `--resume` has nothing to resume (`pack`'s
    packtool/engines/output_folder.py and `tokenize --to megatron`'s megatron/run.py decide so
    here). A folder that is not there (a prefix with no object under it) holds nothing."""
    for entry, file in storage.scan_dir(work) if storage.is_dir(work) else ():
        if entry.name != RUN_DIR or file:
            return False  # shards, parts, an older packtool's state: work that may be wanted
    run = run_dir(work)
    if not storage.is_dir(run):
        return True
    return all(file and writing.is_temporary(e.name) for e, file in storage.scan_dir(run))


def write_plan(work: Path, state: dict[str, Any]) -> None:
    writing.write_atomic(run_dir(work) / PLAN_FILE, json.dumps(state).encode(), make_parent=True)


def _read_json(path: Path) -> Any:
    """A run-state file's JSON (`DataError` naming the file when it cannot be read)."""
    try:
        return json_value(storage.read_text(path))
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: unreadable ({exc}); use {OVERWRITE}") from None


def read_plan(work: Path) -> dict[str, Any]:
    """The saved plan and fingerprint (`DataError` naming the file when damaged)."""
    path = run_dir(work) / PLAN_FILE
    state = _read_json(path)
    if not (
        isinstance(state, dict)
        and isinstance(state.get("fingerprint"), dict)
        and isinstance(state.get("plan"), dict)
    ):
        raise DataError(f"{path}: malformed run state; use {OVERWRITE}")
    return state


def write_record(work: Path, record: dict[str, Any]) -> None:
    writing.write_atomic(
        record_path(work, record["partition"]), json.dumps(record).encode(), make_parent=True
    )


def read_record(work: Path, partition: int) -> dict[str, Any]:
    path = record_path(work, partition)
    record = _read_json(path)
    if not (
        isinstance(record, dict)
        and record.get("partition") == partition
        and isinstance(record.get("shards"), list)
        and isinstance(record.get("counts"), dict)
    ):
        raise DataError(f"{path}: malformed partition record; use {OVERWRITE}")
    return record


def finished(work: Path) -> list[int]:
    """The units with a completion record (one listing of `parts/`): partitions, and the tail
    tree's merge nodes and root after them (ids from the plan's partition count up,
    packtool/engines/merge.py). `finished_partitions` counts the partitions alone."""
    folder = run_dir(work) / PARTS_DIR
    if not storage.is_dir(folder):
        return []
    return sorted(int(e.name[:-5]) for e in storage.list_dir(folder) if _is_record(e.name))


def any_finished(work: Path) -> bool:
    """Whether a unit has a completion record: not `parts/` alone, which a Ctrl-C during the
    first record's write leaves holding only that write's temporary. Stops at the first record
    (before it, at most the temporaries of the records being written), however many there are.
    Under a prefix `parts/` is there only once a record is: an object appears whole, its
    temporary a local file (`writing.temporary_name`), and a listing would read every record."""
    folder = run_dir(work) / PARTS_DIR
    if storage.is_remote(folder):
        return storage.is_dir(folder)
    return storage.is_dir(folder) and any(map(_is_record, storage.iter_names(folder)))


def _is_record(name: str) -> bool:
    return name.endswith(".json") and not name.startswith(".") and name[:-5].isdigit()


def finished_partitions(work: Path, partitions: int | None = None) -> list[int]:
    """The partitions with a completion record: `finished` less the tail tree's merge nodes and
    root, whose records share `parts/` (ids `partitions` and up). `partitions`: the plan's
    partition count, else read from the saved plan (when that is unreadable, every record
    counts: `--resume` names the damage)."""
    done = finished(work)
    if partitions is None and done:
        try:
            partitions = len(read_plan(work)["plan"]["partitions"])
        except (DataError, KeyError, TypeError):
            return done
    return done if partitions is None else [p for p in done if p < partitions]


def records_in_order(work: Path, units: int) -> Iterator[dict[str, Any]]:
    """The records of units 0 .. units - 1 (partitions, then the tail tree's nodes; one file
    read each, `map_ordered`: several at a time, in order, a bounded number held). One after
    another, each read waited a round trip on a bucket: 10^5 records at 20 ms, half an hour
    before index.json."""
    from functools import partial

    from packtool.prefetch import map_ordered

    todo = list(range(units))  # a list: a few records spread over the threads, not on one
    with contextlib.closing(map_ordered(partial(read_record, work), todo)) as found:
        yield from found


class SkipTotals:
    """The skips of many partition records: counts per reason, and the first `max_examples`
    examples per reason in partition order, whatever order the records arrive in (memory
    independent of their number)."""

    def __init__(self, max_examples: int = 3) -> None:
        self.counts: dict[str, int] = {}
        self.max_examples = max_examples
        self._kept: dict[str, list[tuple[int, int, str]]] = {}

    def add(self, record: dict[str, Any]) -> None:
        """Add a record's `skips` (`{"counts": ..., "examples": ...}`)."""
        skips = record.get("skips") or {}
        p = int(record.get("partition", -1))
        for reason, n in skips.get("counts", {}).items():
            self.counts[reason] = self.counts.get(reason, 0) + int(n)
        for reason, examples in skips.get("examples", {}).items():
            kept = self._kept.setdefault(reason, [])
            kept.extend((p, k, text) for k, text in enumerate(examples))
            kept.sort()
            del kept[self.max_examples :]

    @property
    def examples(self) -> dict[str, list[str]]:
        """The first `max_examples` skip examples per reason, in partition order."""
        return {reason: [t for _, _, t in kept] for reason, kept in self._kept.items()}

    def counter(self) -> SkipCounter:
        """These totals as a `SkipCounter` (its `summary`, `note`, `to_dict`)."""
        counter = SkipCounter(max_examples=self.max_examples)
        counter.counts = dict(self.counts)
        counter.examples = self.examples
        return counter


class Totals:
    """The running sums of the partition records (memory independent of their number)."""

    def __init__(self, max_len: int, rounds: int, max_examples: int = 3) -> None:
        self.max_len = max_len
        self.counts = PackCounts()
        self.rounds = np.zeros(rounds, dtype=np.int64)
        self.histogram = np.zeros(max_len + 1, dtype=np.int64)
        self.groups: dict[str, list[int]] = {}
        self.skip_totals = SkipTotals(max_examples)
        self.skips = self.skip_totals.counts
        self.shards = 0
        self.partitions = 0
        self.merges = 0
        self.documents_read = 0
        self.input_bytes = 0
        self.tail_pieces = 0
        self.tail_tokens = 0
        self.seconds: dict[str, float] = {}

    def add(self, record: dict[str, Any], timed: bool = True) -> None:
        """Add one partition's record, or a tail-tree node's (rows, no documents, packtool/
        engines/merge.py): a merge node's own tail is counted by its parent, not here.
        `timed=False`: its stage times are left out (a record an interrupted run made)."""
        self.counts += PackCounts(**record["counts"])
        self.rounds += np.asarray(record["rows_per_round"], dtype=np.int64)
        hist = record.get("histogram")
        if hist and hist["lengths"]:
            np.add.at(self.histogram, np.asarray(hist["lengths"]), np.asarray(hist["counts"]))
        for name, (rows, tokens) in record.get("groups", {}).items():
            acc = self.groups.setdefault(name, [0, 0])
            acc[0] += rows
            acc[1] += tokens
        self.skip_totals.add(record)
        for key, value in (record.get("seconds") or {}).items() if timed else ():
            self.seconds[key] = self.seconds.get(key, 0.0) + float(value)
        self.shards += len(record["shards"])
        self.documents_read += int(record.get("documents", 0))
        self.input_bytes += int(record.get("input_bytes", 0))
        if "merge" in record:  # an inner node of the tail tree
            self.merges += 1
            return
        self.partitions += 1
        tail = record.get("tail") or {}
        self.tail_pieces += int(tail.get("pieces", 0))
        self.tail_tokens += int(tail.get("tokens", 0))

    @property
    def examples(self) -> dict[str, list[str]]:
        """The first `max_examples` skip examples per reason, in partition order."""
        return self.skip_totals.examples


def histogram_of(lengths: np.ndarray, max_len: int) -> dict[str, list[int]]:
    """A segment-length histogram as a record stores it: the lengths present and their counts."""
    hist = np.bincount(np.asarray(lengths, dtype=np.int64), minlength=max_len + 1)
    present = np.flatnonzero(hist)
    return {"lengths": present.tolist(), "counts": hist[present].tolist()}
