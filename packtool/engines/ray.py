"""The Ray Data engine: the local engine's steps as Ray Data stages, on one machine or a cluster.

    read (1 task, streaming)        tokenize + pack + write (actor pool)      driver
    read_corpus in reading order -> one row per chunk:                     -> state file per chunk,
    -> chunks of exactly chunk_docs   tokenizer loaded once per actor,        then shards renamed
       documents, one row each        numba kernels compiled in __init__,     shard-NNNNN in chunk
       (Arrow IPC bytes)              shards into .ray-chunks/chunk-K/        order, index.json last

A chunk travels as ONE row, so Ray's block sizes never move a chunk boundary: chunk k holds
documents [k * chunk_docs, (k + 1) * chunk_docs) of the global reading order, doc ids are the
reader's sequential ids, and `pack_table(table, config, chunk_index=k)` sees exactly the table the
local engine gives it. Chunks finish in any order; the driver keys them by index, so the shards,
their names and `index.json` are byte-identical to the local engine's for the same inputs and
options (tested). Nothing is shuffled: each chunk is read once, moved once to one actor, and
written by that actor.

Failures: a reader task or actor task whose worker dies is retried (`RayConfig.max_retries`); a
retried chunk rewrites the same shard files atomically, so a retry cannot change the output.
A killed run leaves the finished chunks' shards and `.pack-state.json` (the local engine's
format, plus `"engine": "ray"`); `resume=True` keeps them and packs only the missing chunks.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.corpus import ReadConfig, SkipCounter, read_corpus
from packtool.engines import preflight
from packtool.engines.local import (
    PackSummary,
    RunConfig,
    chunk_record,
    finish_run,
    rechunk,
)
from packtool.engines.preflight import STATE_FILE
from packtool.errors import ConfigError, DataError, MissingDependencyError, PacktoolError
from packtool.manifest import ShardInfo, atomic_write_bytes, sha256_file
from packtool.pack import PackConfig, pack_table
from packtool.progress import Progress
from packtool.shards import SHARD_PATTERN, ShardConfig, write_shards
from packtool.tokenize import tokenized_batches, tokenized_schema
from packtool.tokenizers import Tokenizer, TokenizerIdentity

STAGING_DIR = preflight.RAY_STAGING_DIR
_SKIPS_ROW = -1  # the reader's last row: skip counts and the number of chunks, not a chunk
_move = os.replace  # renames a finished shard to its final name (tests interrupt it)


def import_ray() -> Any:
    """Import ray, or raise `MissingDependencyError` naming the extra to install."""
    try:
        import ray
        import ray.data  # noqa: F401 - the Data library is a separate extra of ray
    except ImportError:
        raise MissingDependencyError(
            "--engine ray needs Ray Data: pip install 'packtool[ray]'"
        ) from None
    return ray


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Where and how wide the Ray engine runs."""

    address: str | None = None
    """Ray cluster to join (`auto`, `HOST:6379`, `ray://HOST:10001`); None starts a local Ray on
    this machine unless one is already initialised in this process (or RAY_ADDRESS is set)."""
    actors: int | None = None
    """Tokenize+pack actors (default: the cluster's CPU count; one CPU each, less a share for
    the reader)."""
    max_retries: int = 3
    """Times a chunk is retried when its worker dies (task retries; actor restarts too)."""

    def __post_init__(self) -> None:
        if self.actors is not None and (not isinstance(self.actors, int) or self.actors < 1):
            raise ConfigError(f"actors must be a positive integer, got {self.actors!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")


# --- Arrow tables travel as one IPC blob per chunk (one row, never split by Ray) ---


def _to_ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _from_ipc(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().combine_chunks()


def _raw_table(batch: Any, extra_fields: Sequence[str]) -> pa.Table:
    """A `DocumentBatch` as a table: doc_id, source, text, then the extra fields."""
    columns = {
        "doc_id": pa.array(batch.doc_ids, type=pa.int64()),
        "source": pa.array(batch.sources, type=pa.string()),
        "text": pa.array(batch.texts, type=pa.large_string()),
    }
    for name in extra_fields:
        columns[name] = pa.array(batch.extras[name], type=pa.string())
    return pa.table(columns)


# --- stage 1: the reader (one Ray task; a generator, so chunks stream out as they are read) ---


def _read_chunks(
    _: dict[str, Any],
    *,
    inputs: list[str],
    read: ReadConfig,
    chunk_docs: int,
    tokenized: bool,
    tokenizer_blob: bytes | None,
    done: frozenset[int],
) -> Iterator[dict[str, list[Any]]]:
    skips = SkipCounter(strict=read.strict)
    if read.sft.render_processes is None:  # a Ray worker (gRPC threads) forks no pool of its own
        read = replace(read, sft=replace(read.sft, render_processes=0))
    if tokenized:
        tokenizer = pickle.loads(tokenizer_blob) if tokenizer_blob else None
        tables: Iterator[pa.Table] = tokenized_batches(
            inputs, read_config=read, tokenizer=tokenizer, skips=skips
        )
    else:
        tables = (_raw_table(b, read.extra_fields) for b in read_corpus(inputs, read, skips))
    n = 0
    for index, table in enumerate(rechunk(tables, chunk_docs)):
        n = index + 1
        if index not in done:  # resumed chunks are read (to keep the ids) but not sent
            yield {"chunk": [index], "data": [_to_ipc(table)]}
    tail = {"chunks": n, "counts": skips.counts, "examples": skips.examples}
    yield {"chunk": [_SKIPS_ROW], "data": [json.dumps(tail).encode()]}


# --- stage 2: tokenize + pack + write, one chunk per call, in long-lived actors ---


class _ChunkWorker:
    """Ray Data callable class: built once per actor, then called once per chunk."""

    def __init__(
        self,
        *,
        tokenizer_blob: bytes | None,
        identity: dict[str, Any],
        pack: PackConfig,
        shards: ShardConfig,
        out_dir: str,
        extra_fields: tuple[str, ...],
    ) -> None:
        self.tokenizer: Tokenizer | None = pickle.loads(tokenizer_blob) if tokenizer_blob else None
        if self.tokenizer is not None:
            self.tokenizer.workers = 1  # one actor per core: parallelism comes from the pool
        self.schema = tokenized_schema(TokenizerIdentity.from_dict(identity), extra_fields)
        self.pack = pack
        self.shards = shards
        self.out = Path(out_dir)
        # Load (or compile) the numba kernels now, once per actor, not inside the first chunk.
        pack_table(self._tiny_table(), pack, chunk_index=0)

    def _tiny_table(self) -> pa.Table:
        ids = pa.array([[1], [1, 2]], type=self.schema.field("input_ids").type)
        columns = [
            pa.array([0, 1], pa.int64()),
            pa.array(["", ""]),
            ids,
            pa.array([1, 2], pa.int32()),
        ]
        columns += [pa.array(["", ""]) for _ in self.schema.names[4:]]
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _tokenize(self, raw: pa.Table) -> pa.Table:
        from packtool.corpus import DocumentBatch
        from packtool.tokenize import batch_table

        assert self.tokenizer is not None
        batch = DocumentBatch(
            doc_ids=raw.column("doc_id").to_numpy(),
            texts=raw.column("text").to_pylist(),
            sources=raw.column("source").to_pylist(),
            extras={name: raw.column(name).to_pylist() for name in self.schema.names[4:]},
        )
        flat, lengths = self.tokenizer.encode_batch(batch.texts)
        return batch_table(batch, flat, lengths, self.schema)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list[Any]]:
        records = []
        for index, data in zip(batch["chunk"], batch["data"], strict=True):
            index = int(index)
            if index == _SKIPS_ROW:
                records.append(bytes(data).decode())
                continue
            t0 = time.perf_counter()
            table = _from_ipc(bytes(data))
            if "text" in table.column_names:
                table = self._tokenize(table)
            t1 = time.perf_counter()
            packed = pack_table(table, self.pack, chunk_index=index)
            t2 = time.perf_counter()
            staged = f"{STAGING_DIR}/chunk-{index:06d}"
            (self.out / staged).mkdir(parents=True, exist_ok=True)
            infos = write_shards(self.out / staged, packed.table, 0, self.shards)
            infos = [replace(i, file=f"{staged}/{i.file}") for i in infos]
            record = chunk_record(index, packed, infos, self.pack.max_len)
            record["docs"] = table.num_rows
            record["seconds"] = {
                "tokenize": t1 - t0,
                "pack": t2 - t1,
                "write": time.perf_counter() - t2,
            }
            records.append(json.dumps(record))
        return {"chunk": list(batch["chunk"]), "record": records}


# --- the driver ---


def run_pack_ray(
    config: RunConfig, ray_config: RayConfig | None = None, tokenizer: Tokenizer | None = None
) -> PackSummary:
    """Pack `config.inputs` like `packtool.engines.local.run_pack`, with Ray Data doing the work.

    On a cluster, the inputs and `config.out_dir` must be paths every node sees (a shared file
    system), and packtool must be installed on every node.

    Args:
        config: inputs, output folder and every option (the same as the local engine's).
        ray_config: the cluster address, pool size and retries.
        tokenizer: as for `run_pack`.

    Raises:
        MissingDependencyError: ray[data] is not installed.
    """
    ray_config = ray_config or RayConfig()
    ray = import_ray()
    t_start = time.perf_counter()
    # A missing path, a tokenizer mismatch or a max_len BOS + EOS fill fails before Ray starts.
    checked = preflight.check_inputs(config, tokenizer)
    with preflight.output_folder(config) as output:
        return _run_ray(ray, config, ray_config, checked, output, t_start)


def _run_ray(
    ray: Any,
    config: RunConfig,
    ray_config: RayConfig,
    checked: preflight.Checked,
    output: preflight.Output,
    t_start: float,
) -> PackSummary:
    identity = checked.identity
    out, state = output.work, output.state  # the staging folder, an absolute path
    fingerprint = preflight.fingerprint_of(config, checked)
    done: dict[int, dict[str, Any]] = {}
    if state is not None:
        preflight.check_fingerprint(state, fingerprint, Path(config.out_dir))
        for record in state["chunks"]:
            _locate_shards(out, record)  # raises when a finished shard is missing or changed
            done[int(record["index"])] = record
    resumed = len(done)
    _save_state(out, fingerprint, done)

    seconds = {"ray start": 0.0, "tokenize": 0.0, "pack": 0.0, "write": 0.0}
    t0 = time.perf_counter()
    started = _connect(ray, ray_config.address)
    seconds["ray start"] = time.perf_counter() - t0
    try:
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        actors = ray_config.actors or cpus
        n_chunks, skips = _execute(
            ray,
            config,
            ray_config,
            identity,
            checked.tokenizer,
            checked.tokenized,
            out,
            done,
            actors=actors,
            cpus=cpus,
            fingerprint=fingerprint,
            seconds=seconds,
        )
    finally:
        if started:
            ray.shutdown()
    missing = sorted(set(range(n_chunks)) - set(done))
    if missing:  # cannot happen unless a worker lost a result; never write a partial manifest
        raise DataError(f"chunks {missing[:5]} did not finish; rerun with --resume")

    records = _renumber(out, fingerprint, [done[i] for i in range(n_chunks)])
    seconds["total"] = time.perf_counter() - t_start
    summary = finish_run(
        config,
        out,
        identity,
        records,
        skips=skips,
        seconds=seconds,
        resumed_chunks=resumed,
        tokenizer_threads=0 if checked.tokenized else actors,
        columns=checked.columns,
        doc_ids=preflight.doc_id_record(checked),
    )
    summary.cores_used = (
        f"Ray: 1 reader task + {actors} tokenize/pack/write actor(s) "
        f"({cpus} CPUs in the cluster; stage times are summed over actors)"
    )
    return summary


def _connect(ray: Any, address: str | None) -> bool:
    """Join or start Ray; True when this call started it (and so must shut it down)."""
    if ray.is_initialized():
        return False
    ray.init(
        address=address,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.ERROR,
        ignore_reinit_error=True,
    )
    return True


def _execute(
    ray: Any,
    config: RunConfig,
    ray_config: RayConfig,
    identity: dict[str, Any],
    tokenizer: Tokenizer | None,
    tokenized: bool,
    out: Path,
    done: dict[int, dict[str, Any]],
    *,
    actors: int,
    cpus: int,
    fingerprint: dict[str, Any],
    seconds: dict[str, float],
) -> tuple[int, SkipCounter]:
    """Run the two stages; save each finished chunk's record as it arrives."""
    from ray.data import DataContext

    blob = pickle.dumps(tokenizer) if tokenizer is not None else None
    ctx = DataContext.get_current()
    saved = (ctx.target_max_block_size, ctx.enable_progress_bars)
    # A block per yielded row: otherwise Ray coalesces many small chunk rows into one block
    # and hands them all to one actor.
    ctx.target_max_block_size = 1
    ctx.enable_progress_bars = False
    data_logger = logging.getLogger("ray.data")
    saved_level = data_logger.level
    data_logger.setLevel(logging.ERROR)
    # Logical CPUs: the reader gets a quarter, the actors share the rest (so all fit at once).
    actor_cpus = max(0.01, min(1.0, (cpus - 0.25) / actors))
    n_chunks = 0
    skips = SkipCounter(strict=config.read.strict)
    bar = Progress("pack", enabled=config.progress)
    # Ray counts the reader's one input row and warns that the pool cannot be used fully; the
    # reader's generator makes one row per chunk, so the warning is wrong here.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The minimum number of concurrent actors")
        try:
            ds = _build_dataset(
                ray,
                config,
                ray_config,
                identity,
                blob,
                tokenized,
                out,
                done,
                actors=actors,
                actor_cpus=actor_cpus,
            )
            for row in ds.iter_rows():
                index = int(row["chunk"])
                payload = json.loads(row["record"])
                if index == _SKIPS_ROW:
                    n_chunks = payload["chunks"]
                    skips.counts = payload["counts"]
                    skips.examples = payload["examples"]
                    continue
                for k, v in payload.pop("seconds").items():
                    seconds[k] += v
                docs = payload.pop("docs")
                done[index] = payload
                _save_state(out, fingerprint, done)
                bar.update(docs=docs, tokens=payload["counts"]["tokens_in"])
        except Exception as exc:
            cause = _packtool_cause(exc)
            if cause is not None:
                raise cause from None
            raise
        finally:
            bar.close()
            ctx.target_max_block_size, ctx.enable_progress_bars = saved
            data_logger.setLevel(saved_level)
    return n_chunks, skips


def _build_dataset(
    ray: Any,
    config: RunConfig,
    ray_config: RayConfig,
    identity: dict[str, Any],
    blob: bytes | None,
    tokenized: bool,
    out: Path,
    done: dict[int, dict[str, Any]],
    *,
    actors: int,
    actor_cpus: float,
) -> Any:
    """The two stages: the reader task, then the tokenize+pack+write actor pool."""
    from ray.data import ActorPoolStrategy

    # Ray 2.5x deprecates retry options as map_batches keywords (no named replacement yet);
    # they still apply, and they also work on the oldest Ray the extra allows.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*ray_remote_args.* is deprecated")
        ds = ray.data.from_items([{"part": 0}])
        ds = ds.map_batches(
            _read_chunks,
            batch_size=1,
            fn_kwargs={
                "inputs": [str(p) for p in config.inputs],
                "read": config.read,
                "chunk_docs": config.chunk_docs,
                "tokenized": tokenized,
                "tokenizer_blob": blob,
                "done": frozenset(done),
            },
            num_cpus=0.25,
            max_retries=ray_config.max_retries,
        )
        ds = ds.map_batches(
            _ChunkWorker,
            batch_size=1,
            compute=ActorPoolStrategy(size=actors, max_tasks_in_flight_per_actor=1),
            fn_constructor_kwargs={
                "tokenizer_blob": blob if not tokenized else None,
                "identity": identity,
                "pack": config.pack,
                "shards": config.shards,
                "out_dir": str(out),
                "extra_fields": tuple(config.read.extra_fields),
            },
            num_cpus=actor_cpus,
            max_restarts=ray_config.max_retries,
            max_task_retries=ray_config.max_retries,
        )
    return ds


def _packtool_cause(exc: BaseException) -> PacktoolError | None:
    """The user-facing error inside a Ray task error, if there is one."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, PacktoolError):
            return e
        todo += [e.__cause__, e.__context__, getattr(e, "cause", None)]
    return None


def _save_state(out: Path, fingerprint: dict[str, Any], done: dict[int, dict[str, Any]]) -> None:
    state = {"engine": "ray", "fingerprint": fingerprint, "chunks": [done[k] for k in sorted(done)]}
    atomic_write_bytes(out / STATE_FILE, json.dumps(state).encode())


def _locate_shards(out: Path, record: dict[str, Any]) -> list[Path]:
    """Where each finished shard of a chunk is now: its recorded place, or (a renumbering that
    was interrupted) its staged place. Raises `DataError` when one is missing or changed."""
    staged = record.get("staged") or [None] * len(record["shards"])
    paths = []
    for s, old in zip(record["shards"], staged, strict=True):
        info = ShardInfo(**s)
        path = out / info.file
        if not path.exists() and old is not None:
            path = out / old
        if (
            not path.exists()
            or path.stat().st_size != info.bytes
            or sha256_file(path) != info.sha256
        ):
            raise DataError(
                f"{out / info.file}: finished shard is missing or changed; rerun with --overwrite"
            )
        paths.append(path)
    return paths


def _renumber(
    out: Path, fingerprint: dict[str, Any], records: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Give the shards their final names, shard-00000... in chunk order (as the local engine).

    The new names go into the state file first, with the old ones beside them, so a run killed
    while renaming can still be resumed.
    """
    moves: list[tuple[Path, Path]] = []
    final_records = []
    n = 0
    for record in records:
        current = _locate_shards(out, record)
        names = [SHARD_PATTERN.format(n + j) for j in range(len(current))]
        n += len(current)
        shards = [{**s, "file": name} for s, name in zip(record["shards"], names, strict=True)]
        staged = [str(p.relative_to(out)) for p in current]
        final_records.append({**record, "shards": shards, "staged": staged})
        moves += [(p, out / name) for p, name in zip(current, names, strict=True)]
    _save_state(out, fingerprint, {r["index"]: r for r in final_records})
    for src, dst in moves:
        if src != dst:
            _move(src, dst)
    staging = out / STAGING_DIR
    if staging.exists():
        import shutil

        shutil.rmtree(staging)
    return [{k: v for k, v in r.items() if k != "staged"} for r in final_records]
