"""What a partition worker or merge node is handed besides its descriptor: the run's context.

Built once per run by the driver (`context_for`) and shipped once per worker process or actor;
`setup_process` and `without_render_pool` adapt a worker process to its share of the machine.
Both the worker (packtool/engines/worker.py) and the merge nodes (packtool/engines/merge.py)
take it, so it lives apart from both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from packtool.dataset.shards import ShardConfig
from packtool.pack.chunk import PackConfig
from packtool.pack.tail import TailPolicy
from packtool.read.documents import ReadConfig
from packtool.tokenize.tables import RAW, RECORDS, Source
from packtool.tokenizer.engines import limit_threads
from packtool.tokenizer.tokenizers import Tokenizer


@dataclass(frozen=True, kw_only=True)
class WorkerContext:
    """Everything a partition worker needs besides its descriptor (shipped once per worker)."""

    source: Source
    pack: PackConfig
    shards: ShardConfig
    chunk_docs: int
    work: str
    """The run's staging folder (absolute; on a cluster, a path every node sees)."""
    tokenizer: Tokenizer | None = None
    tail: TailPolicy = TailPolicy()
    sources_close: bool = False
    """`--group-by source` on raw inputs: a file read to its end is a closed group (its rows
    are not set aside: no later document can join them)."""
    shard_threads: int = 1
    """Threads encoding a shard's Parquet (`shards.ShardWriter`): 2 where the partition has the
    machine to itself (the local engine running partitions one at a time in its own process)."""


def setup_process(threads: int | None) -> None:
    """Once per worker process: tokenizer threads for this worker's share of the cores. (The
    packer's kernels are usually loaded already in a pool worker, by the fork server it was
    forked from (`pool_kernels`); where not, and in a process of its own, they load in its
    first partition, once the reading has begun.)"""
    # The Rust engines size their thread pools at their first encode (an explicit variable wins).
    limit_threads(threads)


def without_render_pool(ctx: WorkerContext) -> WorkerContext:
    """`ctx` for a worker process of a pool (local processes, Ray): chat templates render in
    the worker itself unless --render-processes asked otherwise (a pool in each worker would
    oversubscribe the cores the partition workers already share)."""
    read = ctx.source.read
    if read.sft.render_processes is not None:
        return ctx
    read = replace(read, sft=replace(read.sft, render_processes=0))
    return replace(ctx, source=replace(ctx.source, read=read))


def context_for(
    source: Source,
    *,
    pack: PackConfig,
    shards: ShardConfig,
    chunk_docs: int,
    work: Path,
    tokenizer: Tokenizer | None,
    read: ReadConfig,
) -> WorkerContext:
    """The run's `WorkerContext` (the engines build it the same way)."""
    return WorkerContext(
        source=source,
        pack=pack,
        shards=shards,
        chunk_docs=chunk_docs,
        work=str(work),
        tokenizer=tokenizer if source.mode in (RAW, RECORDS) else None,
        sources_close=pack.group_by == "source" and source.mode == RAW,
    )
