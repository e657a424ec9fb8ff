"""The partition worker: read -> tokenize -> pack chunks -> write final-named shards -> record.

Every engine runs exactly this function, `run_partition(context, descriptor)`, once per
partition: the local engine in a pool of processes on this machine, the Ray engine in a Ray
Data actor pool anywhere in the cluster, the Slurm engine in its array tasks
(packtool/engines/slurm/task.py; the tail tree's merge nodes on its driver). Its output depends
only on the partition's pieces and the run's options, so the dataset is the same whichever
engine, machine or worker ran it, and however often a partition was retried.

Inside a partition, documents are packed in chunks of `chunk_docs` (bounding memory), each
chunk seeded by (partition, chunk). A chunk keeps its well-filled rows and hands the pieces of
its least-filled rows to the next chunk (packtool/pack/tail.py), so chunk boundaries cost no
rows; what the last chunk sets aside is the partition's *tail*, which the tail tree's merge
nodes pack together with the other partitions' (packtool/engines/merge.py; the engines run
them through this same function, `run_partition` on a merge descriptor). Rows stream into shards of
`shard_rows` rows (`shards.ShardWriter`) named `shard-PPPPPP-KKKKK.parquet`: final names, so
no pass at the end renames or re-hashes anything. Reading the next chunk overlaps packing and
writing this one (the numba kernels and the Parquet writer release the GIL).

Then the worker writes its tail (Arrow IPC) and last its completion record, both atomically: a
record exists only for a partition whose shards are all complete. A worker killed at any point
leaves no record; running the partition again rewrites the same files with the same bytes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, replace
from typing import Any

import numpy as np
import pyarrow as pa

from packtool import arrow_numpy
from packtool.dataset.shards import ShardWriter
from packtool.engines import merge, records
from packtool.engines.context import WorkerContext
from packtool.engines.megatron import part as megatron_part
from packtool.engines.plan import TO_END, check_piece, descriptor_pieces
from packtool.engines.records import read_tail
from packtool.pack import warmup
from packtool.pack.chunk import PackCounts, PackedChunk
from packtool.pack.flat_ids import rechunk
from packtool.pack.tail import DOC_CHUNK
from packtool.pack.token_cut import pack_cut
from packtool.read.documents import SkipCounter
from packtool.storage import local as storage
from packtool.tokenize.tables import ENCODING_STARTED, partition_tables


def write_chunk(writer: ShardWriter, packed: PackedChunk) -> None:
    """Queue one chunk's packed rows for writing (a seam tests use to interrupt a run): a row
    group's worth at a time, the next one's ids gathered while this one is written."""
    writer.add_rows(packed.rows)


def _open_groups(ctx: WorkerContext, table: pa.Table) -> frozenset[str] | None:
    """With closing sources: only the source of the chunk's last document can still grow
    (files are read one after another; the last one may go on in the next chunk or partition)."""
    if not ctx.sources_close or table.num_rows == 0:
        return None
    return frozenset([table.column("source")[table.num_rows - 1].as_py()])


class _Partition:
    """The running sums of one partition's chunks."""

    def __init__(self, ctx: WorkerContext) -> None:
        self.counts = PackCounts()
        self.rounds = np.zeros(ctx.pack.rounds, dtype=np.int64)
        self.groups: dict[str, list[int]] = {}
        self.lengths: list[np.ndarray] = []
        self.histogram = np.zeros(ctx.pack.max_len + 1, dtype=np.int64)
        self.seconds = {"read+tokenize": 0.0, "load kernels": 0.0, "pack": 0.0, "write": 0.0}

    def add(self, packed: PackedChunk) -> None:
        self.counts += packed.counts
        self.rounds += np.asarray(packed.rows_per_round, dtype=np.int64)
        self.histogram += np.bincount(packed.segment_lengths, minlength=len(self.histogram))
        for name, (r, t) in packed.groups.items():
            acc = self.groups.setdefault(name, [0, 0])
            acc[0] += r
            acc[1] += t


def run_partition(
    ctx: WorkerContext | megatron_part.MegatronContext, descriptor: dict[str, Any]
) -> dict[str, Any]:
    """Pack one partition into shards + tail + completion record; return the record.

    A merge node's descriptor (`kind` "merge", packtool/engines/merge.py) runs
    `merge.merge_node` instead, so the engines run the tail tree's waves with the function and
    the workers they run the partitions with; a Megatron part's (`kind` "megatron", with a
    `megatron_part.MegatronContext`) runs `megatron_part.run_part`, so `packtool tokenize --to
    megatron` runs on every engine too.

    Args:
        ctx: the run's options, tokenizer and staging folder.
        descriptor: `plan.Plan.descriptor(index)`: the partition's index, pieces and files; or
            `merge.TailTree.descriptor(index)`.

    Raises:
        DataError: bad input (as the readers say: a corrupt file, a skip in strict mode), or an
            input that changed since the run was planned.
    """
    if descriptor.get("kind") == merge.MERGE:
        return merge.merge_node(ctx, descriptor)
    if descriptor.get("kind") == megatron_part.MEGATRON:
        assert isinstance(ctx, megatron_part.MegatronContext)
        return megatron_part.run_part(ctx, descriptor)
    assert isinstance(ctx, WorkerContext)
    p = int(descriptor["index"])
    work = storage.as_path(ctx.work)
    skips = SkipCounter(strict=ctx.source.read.strict)
    state = _Partition(ctx)
    writer = ShardWriter(
        work, lambda k: records.shard_name(p, k), ctx.shards, threads=ctx.shard_threads
    )
    documents = nbytes = 0
    reading = threading.Event()

    def tables() -> Iterator[pa.Table]:
        nonlocal documents, nbytes
        for table, n in partition_tables(
            ctx.source, ctx.tokenizer, descriptor_pieces(descriptor), skips, check_piece
        ):
            reading.set()
            documents += table.num_rows
            nbytes += n
            yield table

    def load_kernels() -> None:
        # Once the first batch reached the tokenizer (or a first table came, or the reading
        # ended): numba's import and cache loading hold the GIL, which the tokenizer's build
        # and the first read need; the first chunk is packed only after its reading anyway.
        if ctx.tokenizer is not None:
            while not (ENCODING_STARTED.wait(0.01) or reading.is_set()):
                pass
        t0 = time.perf_counter()
        # numba's import and cache loading on a process's first call (pool_kernels.py says
        # what it costs), then free; a pool worker's first is usually free too: its fork
        # server loaded them (not the --rounds kernel).
        warmup.warm_up(ctx.pack.rounds)
        state.seconds["load kernels"] += time.perf_counter() - t0

    def pack_and_write(table: pa.Table, c: int, carry: pa.Table | None) -> pa.Table | None:
        t0 = time.perf_counter()
        tail = replace(ctx.tail, open_groups=_open_groups(ctx, table))
        # One pack_table call, or parts where its rows would outgrow one Arrow table.
        for packed in pack_cut(table, ctx.pack, chunk_index=(p, c), carry=carry, tail=tail):
            t1 = time.perf_counter()
            write_chunk(writer, packed)
            state.seconds["pack"] += t1 - t0
            t0 = time.perf_counter()
            state.seconds["write"] += t0 - t1
            state.add(packed)
        return packed.tail

    carry: pa.Table | None = None
    try:
        # Chunk c is packed and written in a second thread while the readers and the
        # tokenizer produce chunk c + 1; chunk c + 1 waits for chunk c's tail.
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-pack") as pool:
            pending: Future | None = pool.submit(load_kernels)
            try:
                chunks = rechunk(tables(), ctx.chunk_docs)
                c = 0
                while True:
                    t0 = time.perf_counter()
                    table = next(chunks, None)
                    reading.set()  # a first chunk (or none): the kernels load now at the latest
                    state.seconds["read+tokenize"] += time.perf_counter() - t0
                    if pending is not None:
                        carry = pending.result()  # chunk c - 1's tail (None after load_kernels)
                        pending = None
                    if table is None:
                        break
                    pending = pool.submit(pack_and_write, table, c, carry)
                    c += 1
                if carry is not None and descriptor.get("partitions") == 1:
                    # The only partition: its tail is the whole final stage, packed here instead.
                    # (At most 32 rows: 2^29 tokens at max_len 2^24, one pack_table call.)
                    empty = carry.drop_columns([DOC_CHUNK]).slice(0, 0)
                    for packed in pack_cut(empty, ctx.pack, chunk_index=(p, c), carry=carry):
                        write_chunk(writer, packed)
                        state.add(packed)
                    carry = None
            finally:  # the end, a failure or an interrupt: the kernels' wait ends
                reading.set()
        t1 = time.perf_counter()
        shards = writer.close()
        state.seconds["write"] += time.perf_counter() - t1
    except BaseException:
        writer.abort()
        raise
    tail = None
    if carry is not None and carry.num_rows:
        records.write_tail(work, p, carry)
        tail = {
            "pieces": carry.num_rows,
            "tokens": int(arrow_numpy.to_numpy(carry.column("length")).sum()),
        }
    hist = state.histogram
    present = np.flatnonzero(hist)
    record = {
        "partition": p,
        "shards": [asdict(s) for s in shards],
        "counts": state.counts.to_dict(),
        "rows_per_round": [int(r) for r in state.rounds],
        "groups": state.groups,
        "histogram": {"lengths": present.tolist(), "counts": hist[present].tolist()},
        "skips": {"counts": skips.counts, "examples": skips.examples},
        "tail": tail,
        "documents": documents,
        "input_bytes": nbytes,
        "seconds": state.seconds,
    }
    records.write_record(work, record)
    return record


__all__ = ["TO_END", "rechunk", "read_tail", "run_partition"]
