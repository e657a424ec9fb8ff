"""The local engine: read -> tokenize -> pack per chunk -> write shards -> manifest, on this machine.

Chunks have exactly `chunk_docs` documents (the last one fewer), whatever batch sizes the reader
and tokenizer produce, so the output depends only on the inputs and the options. After each
chunk its shards and its accounting go into a hidden state file; `resume=True` checks that file,
keeps the finished shards and writes only what is missing, so the bytes equal an uninterrupted
run. The manifest is written last.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool import kernels, stats
from packtool.columns import LOSS_MASK, names, required, written
from packtool.corpus import ReadConfig, SkipCounter
from packtool.engines.preflight import (
    STATE_FILE,
    Checked,
    Output,
    check_fingerprint,
    check_inputs,
    doc_id_record,
    fingerprint_of,
    output_folder,
)
from packtool.errors import ConfigError, DataError
from packtool.manifest import (
    Manifest,
    ShardInfo,
    atomic_write_bytes,
    sha256_file,
    write_manifest,
)
from packtool.pack import PackConfig, PackCounts, PackedChunk, pack_table
from packtool.progress import Progress
from packtool.shards import ShardConfig, write_shards
from packtool.tokenize import tokenized_batches
from packtool.tokenizers import Tokenizer, describe_tokenizer


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One `packtool pack` run."""

    inputs: tuple[str, ...]
    out_dir: str
    pack: PackConfig
    shards: ShardConfig = ShardConfig()
    read: ReadConfig = ReadConfig()
    chunk_docs: int = 100_000
    """Documents per packing chunk: bounds memory; efficiency stays within 0.05 % of one chunk."""
    overwrite: bool = False
    resume: bool = False
    command: str = ""
    """The command line, recorded in the manifest."""
    progress: bool | None = None
    """Draw a progress bar (default: when stderr is a terminal)."""

    def __post_init__(self) -> None:
        if not isinstance(self.chunk_docs, int) or self.chunk_docs < 1:
            raise ConfigError(f"chunk_docs must be a positive integer, got {self.chunk_docs!r}")
        if self.overwrite and self.resume:
            raise ConfigError("--overwrite and --resume exclude each other; choose one")


@dataclass
class PackSummary:
    """What the run did, for the closing summary and the manifest."""

    counts: PackCounts
    rows_per_round: list[int]
    lower_bound_l1: int
    lower_bound_l2: int
    efficiency: float
    shards: list[ShardInfo]
    groups: dict[str, tuple[int, int]]
    seconds: dict[str, float] = field(default_factory=dict)
    skips: dict[str, int] = field(default_factory=dict)
    resumed_chunks: int = 0
    out_dir: str = ""
    tokenizer_threads: int = 0
    """Threads the tokenizer encoded with (0: the inputs were already tokenized)."""
    cores_used: str = ""
    """What ran the work, when another engine than this one did (the summary's last words)."""
    columns: tuple[str, ...] = ()
    """The optional shard columns the dataset has (`loss_mask`, `seq_lengths`)."""
    max_len: int = 0

    tokenizer: dict[str, Any] = field(default_factory=dict)
    """The tokenizer identity `index.json` records (its `engine` says what encoded)."""
    special_names: dict[str, str] = field(default_factory=dict)
    """`eos` / `bos` -> the token text a default id came from (`Tokenizer.special_names`)."""

    @property
    def masked(self) -> bool:
        return LOSS_MASK in self.columns

    @property
    def supervised_efficiency(self) -> float:
        """Supervised tokens / (rows * max_len): the share of slots that train on something."""
        return self.counts.tokens_supervised / max(self.counts.rows * self.max_len, 1)

    @property
    def skipped_unreadable(self) -> int:
        """Skips that are not empty documents (malformed lines, missing fields, bad UTF-8)."""
        return sum(v for k, v in self.skips.items() if k != "empty")

    @property
    def lower_bound(self) -> int:
        return max(self.lower_bound_l1, self.lower_bound_l2)

    def _cores(self) -> str:
        if self.cores_used:
            return self.cores_used
        cpus = os.cpu_count() or 1
        if self.tokenizer_threads:
            return (
                f"{self.tokenizer_threads} tokenizer thread(s) + 1 reader + 1 packer "
                f"(of {cpus} cores)"
            )
        return f"1 reader + 1 packer (inputs already tokenized; {cpus} cores)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tokenizer_threads": self.tokenizer_threads,
            "out_dir": self.out_dir,
            "counts": self.counts.to_dict(),
            "efficiency": self.efficiency,
            "lower_bound_rows": self.lower_bound,
            "lower_bound_l1": self.lower_bound_l1,
            "lower_bound_l2": self.lower_bound_l2,
            "rows_per_round": self.rows_per_round,
            "shards": [asdict(s) for s in self.shards],
            "groups": {k: {"rows": r, "tokens": t} for k, (r, t) in self.groups.items()},
            "skips": self.skips,
            "seconds": self.seconds,
            "resumed_chunks": self.resumed_chunks,
            "columns": list(self.columns),
            **({"supervised_efficiency": self.supervised_efficiency} if self.masked else {}),
            "tokenizer": self.tokenizer,
        }

    def format(self, max_len: int) -> str:
        """The closing summary a person reads after `packtool pack`."""
        c = self.counts
        gap = c.rows - self.lower_bound
        total = self.seconds.get("total", 0.0)
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items() if k != "total")
        lines = [
            f"packed {c.documents_packed:,} of {c.documents_in:,} documents "
            f"({c.tokens_out:,} tokens) into {c.rows:,} rows of <= {max_len} tokens "
            f"in {len(self.shards)} shard(s) -> {self.out_dir}",
            f"efficiency {self.efficiency:.4%} (padding {1 - self.efficiency:.4%}); "
            f"lower bound {self.lower_bound:,} rows (L1 {self.lower_bound_l1:,}, "
            f"L2 {self.lower_bound_l2:,}); gap {gap:,} rows ({gap / max(self.lower_bound, 1):.3%})",
            "rows per round: " + " -> ".join(f"{r:,}" for r in self.rows_per_round),
            f"documents: split {c.documents_split:,}, truncated {c.documents_truncated:,}, "
            f"dropped {c.documents_dropped:,}, empty {c.documents_empty:,}, "
            f"skipped while reading {self.skipped_unreadable:,}",
            f"tokens: in {c.tokens_in:,} = out {c.tokens_out:,} + truncated "
            f"{c.tokens_truncated:,} + dropped {c.tokens_dropped:,}",
            f"time {total:.2f}s ({stages}); {c.tokens_in / max(total, 1e-9):,.0f} tokens/s; "
            f"cores used: {self._cores()}",
        ]
        if self.masked:
            share = c.tokens_supervised / max(c.tokens_out, 1)
            lines.append(
                f"supervised: {c.tokens_supervised:,} tokens ({share:.2%} of tokens out); "
                f"supervised efficiency {self.supervised_efficiency:.4%}; documents dropped for "
                f"holding no supervised token (after truncation) {c.documents_unsupervised:,}"
            )
        if self.tokenizer:
            lines.append("tokenizer " + describe_tokenizer(self.tokenizer, self.special_names))
        if self.skips:
            lines.append("skips: " + ", ".join(f"{k} {v:,}" for k, v in self.skips.items()))
        if self.resumed_chunks:
            lines.append(f"resumed: kept {self.resumed_chunks} finished chunk(s)")
        for name, (rows, tokens) in self.groups.items():
            lines.append(
                f"group {name!r}: {rows:,} rows, efficiency {tokens / (rows * max_len):.4%}"
            )
        return "\n".join(lines)


def rechunk(batches: Iterable[pa.Table], chunk_docs: int) -> Iterator[pa.Table]:
    """Regroup a stream of tables into tables of exactly `chunk_docs` rows (the last fewer)."""
    pending: list[pa.Table] = []
    held = 0
    for batch in batches:
        pending.append(batch)
        held += batch.num_rows
        while held >= chunk_docs:
            table = pa.concat_tables(pending)
            yield table.slice(0, chunk_docs).combine_chunks()
            rest = table.slice(chunk_docs)
            pending, held = ([rest], rest.num_rows) if rest.num_rows else ([], 0)
    if held:
        yield pa.concat_tables(pending).combine_chunks()


def _check_done_shards(out: Path, infos: Sequence[ShardInfo]) -> None:
    for info in infos:
        path = out / info.file
        if (
            not path.exists()
            or path.stat().st_size != info.bytes
            or sha256_file(path) != info.sha256
        ):
            raise DataError(f"{path}: finished shard is missing or changed; rerun with --overwrite")


def run_pack(config: RunConfig, tokenizer: Tokenizer | None = None) -> PackSummary:
    """Pack `config.inputs` into shards + `index.json` in `config.out_dir`.

    Args:
        config: inputs, output folder and every option.
        tokenizer: encodes raw corpora. For tokenized Parquet inputs it must match the recorded
            tokenizer; None accepts the recorded one (and means `byte` for raw corpora).
    """
    checked = check_inputs(config, tokenizer)
    with output_folder(config) as output:
        summary = _run_local(config, checked, output)
    if checked.tokenizer is not None and not checked.tokenized:
        summary.special_names = checked.tokenizer.special_names
    return summary


def _run_local(config: RunConfig, checked: Checked, output: Output) -> PackSummary:
    out, state = output.work, output.state
    tokenizer = checked.tokenizer
    fingerprint = fingerprint_of(config, checked)
    done: list[dict[str, Any]] = []
    if state is not None:
        if state.get("engine", "local") != "local":
            raise ConfigError(
                f"cannot resume {config.out_dir}: it was started with --engine "
                f"{state['engine']}; resume it with the same engine"
            )
        check_fingerprint(state, fingerprint, Path(config.out_dir))
        done = list(state["chunks"])
        for chunk in done:
            _check_done_shards(out, [ShardInfo(**s) for s in chunk["shards"]])
    else:
        # Written before any work, so a run stopped at any point can be resumed.
        atomic_write_bytes(
            out / STATE_FILE, json.dumps({"fingerprint": fingerprint, "chunks": []}).encode()
        )

    skips = SkipCounter(strict=config.read.strict)
    stream = tokenized_batches(
        list(config.inputs), read_config=config.read, tokenizer=tokenizer, skips=skips
    )
    shards: list[ShardInfo] = []
    seconds = {"read+tokenize": 0.0, "load kernels": 0.0, "pack": 0.0, "write": 0.0}

    bar = Progress("pack", enabled=config.progress)
    chunks = rechunk(stream, config.chunk_docs)
    t_start = time.perf_counter()

    def pack_and_write(table: pa.Table, index: int, first_shard: int) -> dict[str, Any]:
        t0 = time.perf_counter()
        packed = pack_table(table, config.pack, chunk_index=index)
        t1 = time.perf_counter()
        infos = write_shards(out, packed.table, first_shard, config.shards)
        seconds["pack"] += t1 - t0
        seconds["write"] += time.perf_counter() - t1
        return chunk_record(index, packed, infos, config.pack.max_len)

    def account(record: dict[str, Any], docs: int) -> None:
        shards.extend(ShardInfo(**s) for s in record["shards"])
        bar.update(docs=docs, tokens=record["counts"]["tokens_in"])

    def finish(job: tuple[Future[dict[str, Any]], int]) -> None:
        record = job[0].result()
        done.append(record)
        state_bytes = json.dumps({"fingerprint": fingerprint, "chunks": done}).encode()
        atomic_write_bytes(out / STATE_FILE, state_bytes)
        account(record, job[1])

    # Chunk i is packed and written in a second thread while the reader and the tokenizer's
    # threads produce chunk i + 1 (the kernels and Parquet writer release the GIL). Chunks are
    # finished in order, so shard numbers and the state file do not depend on timing.
    n_resumed = len(done)
    pending: tuple[Future[dict[str, Any]], int] | None = None
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="packtool-pack") as pool:
        # Overlaps loading the kernels (numba compiles them on a first run, ~3 s, then caches
        # them) with reading chunk 0; timed on its own so the summary shows where time went.
        def load_kernels() -> None:
            t0 = time.perf_counter()
            kernels.warm_up()
            seconds["load kernels"] += time.perf_counter() - t0

        pool.submit(load_kernels)
        index = 0
        while True:
            t0 = time.perf_counter()
            table = next(chunks, None)
            seconds["read+tokenize"] += time.perf_counter() - t0
            if pending is not None:
                finish(pending)
                pending = None
            if table is None:
                break
            if index < n_resumed:
                account(done[index], table.num_rows)
            else:
                pending = (pool.submit(pack_and_write, table, index, len(shards)), table.num_rows)
            index += 1
    bar.close()
    seconds["total"] = time.perf_counter() - t_start

    return finish_run(
        config,
        out,
        checked.identity,
        done,
        skips=skips,
        seconds=seconds,
        resumed_chunks=len(state["chunks"]) if state is not None else 0,
        tokenizer_threads=(
            tokenizer.workers if tokenizer and (not checked.tokenized or checked.records) else 0
        ),
        columns=checked.columns,
        doc_ids=doc_id_record(checked),
    )


def chunk_record(
    index: int, packed: PackedChunk, infos: Sequence[ShardInfo], max_len: int
) -> dict[str, Any]:
    """One finished chunk as the state file stores it (JSON-ready); both engines write these."""
    seg_hist = np.bincount(packed.segment_lengths, minlength=max_len + 1)
    return {
        "index": index,
        "shards": [asdict(s) for s in infos],
        "counts": packed.counts.to_dict(),
        "rows_per_round": packed.rows_per_round,
        "groups": packed.groups,
        "segment_histogram": {int(k): int(seg_hist[k]) for k in np.flatnonzero(seg_hist)},
    }


def finish_run(
    config: RunConfig,
    work: Path,
    identity: dict[str, Any],
    records: Sequence[dict[str, Any]],
    *,
    skips: SkipCounter,
    seconds: dict[str, float],
    resumed_chunks: int,
    tokenizer_threads: int,
    doc_ids: dict[str, Any],
    columns: Sequence[str] = (),
) -> PackSummary:
    """Sum the chunk records (in chunk order), write `index.json` into `work`, drop the state file.

    `columns`: the optional shard columns the inputs carry (`preflight.Checked.columns`).

    Both engines end here, so their manifests agree whenever their chunk records do. `work` is
    the run's staging folder; `preflight.output_folder` swaps it in afterwards.
    """
    counts = PackCounts()
    rounds = np.zeros(config.pack.rounds, dtype=np.int64)
    hist = np.zeros(config.pack.max_len + 1, dtype=np.int64)
    groups: dict[str, list[int]] = {}
    shards: list[ShardInfo] = []
    for record in records:
        counts += PackCounts(**record["counts"])
        rounds[:] += np.asarray(record["rows_per_round"], dtype=np.int64)
        for k, v in record["segment_histogram"].items():
            hist[int(k)] += v
        for name, (r, t) in record["groups"].items():
            acc = groups.setdefault(name, [0, 0])
            acc[0] += r
            acc[1] += t
        shards.extend(ShardInfo(**s) for s in record["shards"])
    # Empty documents are dropped by the reader (a counted skip); they are documents all the same.
    empty_read = skips.counts.get("empty", 0)
    counts.documents_in += empty_read
    counts.documents_empty += empty_read
    other_skips = skips.total - empty_read

    if counts.documents_in == 0:
        raise DataError(f"no documents in {', '.join(config.inputs)}" + skips.note())
    if counts.tokens_out == 0:
        raise DataError("every document was empty or dropped; nothing to pack" + skips.note())
    if config.pack.group_by is not None and set(groups) == {""}:
        raise ConfigError(
            f"--group-by {config.pack.group_by!r}: no document has this field "
            "(check the name; rerun with --overwrite)"
        )

    seg_lengths = np.repeat(np.arange(len(hist)), hist)
    l1 = stats.lower_bound_l1(seg_lengths, config.pack.max_len)
    l2 = stats.lower_bound_l2(seg_lengths, config.pack.max_len)
    efficiency = counts.tokens_out / (counts.rows * config.pack.max_len)
    summary = PackSummary(
        counts=counts,
        rows_per_round=[int(r) for r in rounds],
        lower_bound_l1=int(l1),
        lower_bound_l2=int(l2),
        efficiency=efficiency,
        shards=shards,
        groups={k: (v[0], v[1]) for k, v in sorted(groups.items())},
        seconds=seconds,
        skips=skips.to_dict(),
        resumed_chunks=resumed_chunks,
        out_dir=config.out_dir,
        tokenizer_threads=tokenizer_threads,
        columns=tuple(c for c in written(columns) if c not in names(required())),
        max_len=config.pack.max_len,
        tokenizer=dict(identity),
    )
    counts_out = counts.to_dict()
    if not summary.masked:  # supervised counts mean nothing without a mask
        del counts_out["documents_unsupervised"], counts_out["tokens_supervised"]
    manifest = Manifest(
        tokenizer=identity,
        max_len=config.pack.max_len,
        algorithm=config.pack.algorithm,
        seed=config.pack.seed,
        rounds=config.pack.rounds,
        long_docs=config.pack.long_docs,
        counts={**counts_out, "documents_skipped": int(other_skips)},
        efficiency=round(efficiency, 6),
        lower_bound_rows=summary.lower_bound,
        shards=tuple(shards),
        command=config.command,
        columns=written(columns),  # with the derived ones (seq_lengths) pack_table adds
        extra={
            "rows_per_round": summary.rows_per_round,
            "lower_bound_l1": summary.lower_bound_l1,
            "lower_bound_l2": summary.lower_bound_l2,
            "chunk_docs": config.chunk_docs,
            "groups": {
                k: {"rows": r, "tokens": t, "efficiency": round(t / (r * config.pack.max_len), 6)}
                for k, (r, t) in summary.groups.items()
            },
            "skips": summary.skips,
            "group_by": config.pack.group_by,
            **(
                {"supervised_efficiency": round(summary.supervised_efficiency, 6)}
                if summary.masked
                else {}
            ),
            "doc_ids": doc_ids,
        },
    )
    write_manifest(work, manifest)
    (work / STATE_FILE).unlink(missing_ok=True)
    return summary
