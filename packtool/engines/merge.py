"""The tail tree: the partitions' tails packed together by merge nodes of bounded fan-in.

Every partition sets aside the pieces of its least-filled rows (at most 32 rows, its *tail*,
packtool/pack/tail.py) so that partition ends cost no rows. Those tails are packed together by
a tree of **merge nodes**, each reading the tails of at most `TAIL_FAN_IN` (F) children:

    level 0   partitions 0 .. N-1                          (tails/PPPPPP.arrow)
    level 1   node N + j packs the tails of partitions [jF, (j+1)F), sets aside its own
              least-filled rows as its tail                  -> shards + tail + record
    level k   node j packs the tails of level k-1's nodes [jF, (j+1)F)
    root      the one node whose children are the whole last level (at most F units): packs
              their tails with no tail of its own (`tail=None`): the last shards of the run

Node ids continue the partition numbering, level by level, the root last (`TailTree`); they
name the nodes' shards (`shard-IIIIII-KKKKK.parquet`) and records (`parts/IIIIII.json`), so
`index.json`, streamed over the records in id order, lists them after the partitions'. With at
most F partitions the tree is the root alone: unit N, exactly the single final stage packtool
had before the tree (the same shards, names and record). The layout depends only on N and F,
never on the workers or the engine; F is saved in the run state (`plan.json`), so a resume
builds the same tree (a run state without it, from an earlier packtool, has the root alone).

A merge node packs like a partition's chunks: its children's tails in id order, regrouped
into chunks of `chunk_docs` pieces and of at most `token_cut.read_limit` tokens, each chunk
packed with the part-empty rows the previous one handed on (`carry`), seeded by (node id,
chunk), in parts where its rows would outgrow one Arrow table (`token_cut.pack_cut`); it
writes its shards, then its tail, then its completion record, each atomically, as a partition
does. Its input is bounded: at most F x 32 rows of at most `max_len` tokens (F = 64, max_len
2048: ~4 M tokens, ~0.2 s here), whatever the corpus size, and it reads nothing but its
children's tails; it holds one chunk of them at a time (at max_len 2^24 the input is up to
2^35 tokens, a chunk at most 2^31 - 1 + 32 x 2^24: docs/pack.md, "Chunks and memory").
A `PacktoolError` in a node is a `TailTreeFailed`, which keeps the staging folder: every
partition had finished (`merge_node`).

The nodes of one level are independent: the local and Ray engines run them on their workers
in parallel, one wave per level after the partitions (`base.Run.waves`); the Slurm engine runs
them in its driver, one after another (`slurm.driver.drive_slurm`: a dependent job would wait
in the queue longer than a node takes); the root runs in the driver (`base.Run.finish`). At
10^5 partitions and F = 64: 1,563 level-1 nodes, 25 level-2 nodes, then the root: three short
waves, each as parallel as the cluster (on Slurm, ~5 minutes in the driver), instead of one
process packing 10^5 x 32 rows.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from packtool import arrow_numpy
from packtool.dataset.shards import ShardWriter
from packtool.engines import records
from packtool.errors import (
    OVERWRITE,
    RESUME,
    ConfigError,
    DataError,
    PacktoolError,
    StagingKept,
    TailTreeFailed,
    joined_lines,
)
from packtool.pack import token_cut
from packtool.pack.chunk import PackCounts
from packtool.pack.flat_ids import rechunk
from packtool.pack.tail import DOC_CHUNK
from packtool.storage import local as storage

if TYPE_CHECKING:
    from packtool.engines.context import WorkerContext

MERGE = "merge"
"""A descriptor's `kind` for a tail-tree node (a partition's descriptor has no `kind`)."""
TAIL_FAN_IN = 64
"""Children per merge node at most. 64 keeps a node's input at <= 64 x 32 rows (~4 M tokens at
max_len 2048: one process, ~0.2 s, a few tens of MB of memory) and the tree shallow (10^5
partitions: 3 levels), while each node packs as many tails together as the flat final stage
of a 64-partition run did, so the rows it writes are as full (a small fan-in costs rows: on
the 1,000-file test corpus, fan-in 8 keeps within 0.05 points of one chunk, fan-in 4 loses
one row more, tests/packtool/engines/test_partitions.py). Saved in the run state: changing it
changes the dataset of a run of more than 64 partitions, not a resumed run."""


@dataclass(frozen=True)
class TailTree:
    """The tail tree's layout over `partitions` partitions (see the module docstring).

    `fan_in` None: the root alone, whose children are every partition.
    """

    partitions: int
    fan_in: int | None = TAIL_FAN_IN

    def __post_init__(self) -> None:
        if self.fan_in is not None and (not isinstance(self.fan_in, int) or self.fan_in < 2):
            raise ConfigError(f"tail fan-in must be an integer >= 2, got {self.fan_in!r}")

    @cached_property
    def sizes(self) -> tuple[int, ...]:
        """Units per level: the partitions, then each level of merge nodes below the root."""
        sizes = [self.partitions]
        while self.fan_in is not None and sizes[-1] > self.fan_in:
            sizes.append(-(-sizes[-1] // self.fan_in))
        return tuple(sizes)

    @cached_property
    def starts(self) -> tuple[int, ...]:
        """The first id of each level in `sizes`."""
        return tuple(int(s) for s in np.cumsum((0, *self.sizes[:-1])))

    @property
    def root(self) -> int:
        """The root's id: the last unit (N when there are at most `fan_in` partitions)."""
        return self.starts[-1] + self.sizes[-1]

    @property
    def levels(self) -> int:
        """Levels of merge nodes below the root (0: the root alone)."""
        return len(self.sizes) - 1

    def level_ids(self, level: int) -> range:
        """The ids of level `level` (0: the partitions)."""
        return range(self.starts[level], self.starts[level] + self.sizes[level])

    def level_of(self, unit: int) -> int:
        """The level of `unit`; the root's is `levels + 1`."""
        if unit == self.root:
            return self.levels + 1
        for level in range(len(self.sizes)):
            if unit in self.level_ids(level):
                return level
        raise ValueError(f"unit {unit} is not in a tree of {self.root + 1} units")

    def children(self, unit: int) -> range:
        """The ids whose tails merge node `unit` packs."""
        level = self.level_of(unit)
        if level == 0:
            raise ValueError(f"unit {unit} is a partition, not a merge node")
        below = self.level_ids(level - 1)
        if unit == self.root:
            return below
        assert self.fan_in is not None
        j = unit - self.starts[level]
        return range(
            below.start + j * self.fan_in, min(below.start + (j + 1) * self.fan_in, below.stop)
        )

    def descriptor(self, unit: int) -> dict[str, Any]:
        """What a worker needs for merge node `unit` (a few tens of bytes)."""
        kids = self.children(unit)
        return {
            "kind": MERGE,
            "index": unit,
            "level": self.level_of(unit),
            "children": [kids.start, kids.stop],
            "root": unit == self.root,
        }


def _set_aside(work: Path, children: range) -> list[int]:
    """The pieces each child's record says it set aside (its tail's rows)."""
    try:
        return [
            int((records.read_record(work, p).get("tail") or {}).get("pieces", 0)) for p in children
        ]
    except DataError as exc:  # damaged: "use --overwrite" (`merge_node` keeps the rest)
        raise TailTreeFailed(str(exc)) from None


def _tails(work: Path, children: range, expected: list[int]) -> Iterator[pa.Table]:
    """The children's tails in id order (a child that set nothing aside has none), each checked
    against what its record says it set aside (`expected`, `_set_aside`): a tail lost or
    damaged in the staging folder would otherwise drop its pieces from a dataset that still
    counts them. Such damage is a `TailTreeFailed` in the reader's words ("start over with
    --overwrite": --resume would meet it again), which keeps the staging folder as every
    failure of the tree does."""
    for p, pieces in zip(children, expected, strict=True):
        path = records.tail_path(work, p)
        try:
            table = records.read_tail(path) if pieces or storage.is_file(path) else None
        except DataError as exc:
            raise TailTreeFailed(str(exc)) from None
        found = 0 if table is None else table.num_rows
        if found != pieces:
            raise TailTreeFailed(
                f"{path}: holds {found:,} pieces where unit {p}'s record says {pieces:,}; "
                f"the run's staging folder is damaged: start over with {OVERWRITE}"
            )
        if table is not None:
            yield table


def merge_node(ctx: WorkerContext, descriptor: dict[str, Any]) -> dict[str, Any]:
    """Pack the children's tails of one node; write its shards, tail and record; return it.

    The root (`descriptor["root"]`) keeps no tail: every piece ends in a row.

    Raises:
        TailTreeFailed: any `PacktoolError` of the node, in its words: every partition has
            finished when the tree runs, and a fresh run's staging folder is removed on other
            `PacktoolError`s (`output_folder.discard_staging`: a mistake the corrected command
            reruns), which would throw them all away with nothing left to `--resume`.
    """
    try:
        return _merge_node(ctx, descriptor)
    except StagingKept:
        raise
    except PacktoolError as exc:
        raise TailTreeFailed(
            f"{joined_lines(exc)}; the tail tree stopped after every partition had finished: "
            f"they are kept in {ctx.work}; the same command with {RESUME} (without "
            f"{OVERWRITE}) runs only the tail tree"
        ) from None


def _merge_node(ctx: WorkerContext, descriptor: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    work = storage.as_path(ctx.work)
    n = int(descriptor["index"])
    root = bool(descriptor["root"])
    first, stop = descriptor["children"]
    writer = ShardWriter(
        work, lambda k: records.shard_name(n, k), ctx.shards, threads=ctx.shard_threads
    )
    counts = PackCounts()
    rounds = np.zeros(ctx.pack.rounds, dtype=np.int64)
    groups: dict[str, list[int]] = {}
    carry: pa.Table | None = None
    # chunk_docs pieces, and no more tokens than a chunk could pack (`token_cut.read_limit`):
    # at max_len 2^24 the children's tails are up to 64 x 32 x 2^24 tokens. The last chunk is
    # known by the pieces the records count, so no second chunk is read ahead to find it.
    expected = _set_aside(work, range(first, stop))
    left = sum(expected)
    limit = token_cut.read_limit(ctx.pack, ctx.tail)
    chunks = rechunk(_tails(work, range(first, stop), expected), ctx.chunk_docs, limit)
    try:
        for c, table in enumerate(chunks):
            left -= table.num_rows
            pieces = table if carry is None else pa.concat_tables([carry, table])
            empty = pieces.drop_columns([DOC_CHUNK]).slice(0, 0)
            tail = None if root and not left else ctx.tail
            for packed in token_cut.pack_cut(
                empty, ctx.pack, chunk_index=(n, c), carry=pieces, tail=tail, between=ctx.tail
            ):
                writer.add_rows(packed.rows)
                carry = packed.tail
                counts += packed.counts
                rounds += np.asarray(packed.rows_per_round, dtype=np.int64)
                for name, (r, t) in packed.groups.items():
                    acc = groups.setdefault(name, [0, 0])
                    acc[0] += r
                    acc[1] += t
            del table, pieces, empty, packed  # one chunk in memory: gone before the next's read
        shards = writer.close()
    except BaseException:
        writer.abort()
        raise
    record: dict[str, Any] = {
        "partition": n,
        "shards": [asdict(s) for s in shards],
        "counts": counts.to_dict(),
        "rows_per_round": [int(r) for r in rounds],
        "groups": groups,
        "histogram": None,
        "skips": {},
        "tail": None,
    }
    if root:
        record["final"] = True
    else:
        if carry is not None and carry.num_rows:
            records.write_tail(work, n, carry)
            tokens = int(arrow_numpy.to_numpy(carry.column("length")).sum())
            record["tail"] = {"pieces": carry.num_rows, "tokens": tokens}
        record["merge"] = int(descriptor["level"])
        record["children"] = [first, stop]
        record["seconds"] = {"tail merge": time.perf_counter() - t0}
    records.write_record(work, record)
    return record
