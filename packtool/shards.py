"""Writing packed rows as Parquet shards, atomically (temporary file, fsync, rename), with a CRC32
checksum on every page.

A shard that has its final name is complete; anything still being written is a hidden
`.NAME.<unique>.tmp` file (unique per writer, so two attempts at the same partition, e.g. a Ray
task retried while the first attempt still runs, never rename each other's half-written file).

`write_shards` writes one table; `ShardWriter` streams a partition's chunks into shards of
exactly `shard_rows` rows in row groups of exactly `row_group_rows` rows (the last ones of the
partition fewer), so the file layout does not depend on `--chunk-docs`, and many small chunks
cost no more files than a few large ones. Shards never straddle partitions: the shards of a
partition depend only on that partition, which is what lets `--resume` reproduce an
uninterrupted run byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import ConfigError, naming
from packtool.manifest import ShardInfo, packed_schema, sha256_file

SHARD_PATTERN = "shard-{:05d}.parquet"
COMPRESSIONS = ("none", "snappy", "lz4", "zstd")


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """How packed rows are laid out on disk."""

    shard_rows: int = 16384
    """Rows per shard file at most (a chunk's last shard may hold fewer)."""
    row_group_rows: int = 256
    """Rows per Parquet row group: the unit the loader reads and caches (256 rows of 4096 tokens
    is ~1 M tokens, fetched in ~6 ms; larger groups decode no faster but cost more per fetch)."""
    compression: str = "lz4"
    """Parquet codec: none, snappy, lz4 or zstd. lz4 decodes about as fast as none at a quarter
    of the bytes (Parquet stores uint16 ids as 4-byte ints); zstd is the smallest but decodes
    ~30 % slower (README, "Shard layout")."""
    compression_level: int | None = 1
    """Codec level where the codec has one (zstd 1: cheap to write, fast to read)."""

    def __post_init__(self) -> None:
        if self.shard_rows < 1:
            raise ConfigError(f"shard_rows must be >= 1, got {self.shard_rows}")
        if self.row_group_rows < 1:
            raise ConfigError(f"row_group_rows must be >= 1, got {self.row_group_rows}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression {self.compression!r} is unknown; choose one of {list(COMPRESSIONS)}"
            )


def _writer_options(config: ShardConfig) -> dict:
    codec = None if config.compression == "none" else config.compression
    return {
        "compression": codec,
        "compression_level": config.compression_level if codec in ("zstd",) else None,
        # Token lists are high-entropy ids: dictionary encoding only costs time.
        "use_dictionary": False,
        "write_statistics": False,
        # A CRC32 per page, checked by the loader on every read: a flipped bit in a page is an
        # error instead of different tokens (README, "Loader", for the cost).
        "write_page_checksum": True,
    }


def temporary_name(path: Path) -> Path:
    """A hidden name beside `path`, unique to this writer, to write it under before the rename."""
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


def _finish(tmp: Path, path: Path) -> None:
    with naming(tmp), open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_one(path: Path, table: pa.Table, config: ShardConfig) -> None:
    tmp = temporary_name(path)
    with naming(tmp):  # a full disk names the file
        pq.write_table(table, tmp, row_group_size=config.row_group_rows, **_writer_options(config))
    _finish(tmp, path)


def write_shards(
    directory: Path, table: pa.Table, first_index: int, config: ShardConfig
) -> list[ShardInfo]:
    """Write one chunk's packed rows as shards numbered from `first_index`; return their info.

    The table's columns (the required ones plus any declared optional ones, packtool/columns.py)
    are written in declaration order with the declared types.
    """
    token_type = table.schema.field("input_ids").type.value_type
    schema = packed_schema(token_type, tuple(table.column_names))
    table = table.select(schema.names).cast(schema)
    infos = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), config.shard_rows)):
        part = table.slice(start, config.shard_rows)
        if part.num_rows == 0:
            break
        name = SHARD_PATTERN.format(first_index + i)
        path = directory / name
        _write_one(path, part, config)
        tokens = int(pc_sum_lengths(part))
        infos.append(
            ShardInfo(
                file=name,
                rows=part.num_rows,
                tokens=tokens,
                bytes=path.stat().st_size,
                sha256=sha256_file(path),
            )
        )
    return infos


def pc_sum_lengths(table: pa.Table) -> int:
    """Tokens in a packed table (sum of row lengths) from its offsets, without copying anything
    (`ChunkedArray.combine_chunks` would copy the ids, even of a single chunk)."""
    total = 0
    for chunk in table.column("input_ids").chunks:
        if len(chunk):
            offsets = chunk.offsets  # a slice's own offsets
            total += offsets[len(offsets) - 1].as_py() - offsets[0].as_py()
    return int(total)


SYNC_EVERY = 8 << 20
"""Bytes the hashing thread hashes between two `fdatasync`s of the shard being written: its
pages reach the disk while it is written, so the fsync that makes it durable at the close waits
for the last few MB only (0.021-0.022 s -> 0.005-0.007 s per 42 MB shard on this project's box)."""


class _RunningHash:
    """The sha256 of a file being written front to back, hashed as it grows, in a thread.

    A Parquet writer only appends (pages, then the footer at `close`), so the bytes before the
    file's current size are final: `advance()` after each row group hashes what is new while
    the writer encodes the next one, and `hexdigest()` after the close reads only the footer.
    The shard's close then no longer reads the whole file back on the writer's thread (~0.03 s
    per 42 MB shard, in the single-core tail of a run). The thread also flushes the file to the
    disk every `SYNC_EVERY` bytes, so the close's fsync has little left to wait for.
    """

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_RDONLY)
        self._hash = hashlib.sha256()
        self._done = 0
        self._synced = 0
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="packtool-sha256")
        self._pending: Future | None = None

    def advance(self) -> None:
        """Hash, in the thread, what the file holds now beyond what was hashed."""
        if self._pending is not None and not self._pending.done():
            return  # still hashing: the next call (or hexdigest) takes the rest
        if self._pending is not None:
            self._pending.result()  # a read error surfaces here
        self._pending = self._pool.submit(self._read_to, os.fstat(self._fd).st_size)

    def hexdigest(self) -> str:
        """The digest of the whole file (call once, after the writer closed it)."""
        try:
            if self._pending is not None:
                self._pending.result()
            self._read_to(os.fstat(self._fd).st_size)
            return self._hash.hexdigest()
        finally:
            self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        os.close(self._fd)

    def _read_to(self, end: int) -> None:
        while self._done < end:
            block = os.pread(self._fd, min(end - self._done, 1 << 20), self._done)
            if not block:  # the file is shorter than its size said: never for an append
                raise OSError(f"shard shrank while being hashed at byte {self._done}")
            self._hash.update(block)
            self._done += len(block)
        if self._synced >= 0 and self._done - self._synced >= SYNC_EVERY:
            try:
                os.fdatasync(self._fd)
                self._synced = self._done
            except OSError:  # only a head start: the close's fsync is what makes it durable
                self._synced = -1  # (a file system that refuses it on a read-only descriptor)


class ShardWriter:
    """Streams packed tables into shards of `shard_rows` rows, row groups of `row_group_rows`.

    Args:
        directory: where the shards go.
        name: the final file name of the shard with this number (0, 1, 2, ... per writer).
        config: the layout.

    Rows are buffered until a row group is full, so memory holds at most one row group beyond
    the table being added. `close()` writes what is left and returns every shard's info.
    """

    def __init__(self, directory: Path, name: Callable[[int], str], config: ShardConfig) -> None:
        self.directory = directory
        self.name = name
        self.config = config
        self.infos: list[ShardInfo] = []
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._tmp: Path | None = None
        self._hash: _RunningHash | None = None
        self._rows = 0  # in the open shard
        self._tokens = 0

    def add(self, table: pa.Table) -> None:
        """Queue packed rows (shard schema columns); full row groups are written at once."""
        if not table.num_rows:
            return
        token_type = table.schema.field("input_ids").type.value_type
        schema = packed_schema(token_type, tuple(table.column_names))
        self._pending.append(table.select(schema.names).cast(schema))
        self._pending_rows += table.num_rows
        self._drain(final=False)

    def close(self) -> list[ShardInfo]:
        self._drain(final=True)
        self._close_shard()
        return self.infos

    def abort(self) -> None:
        """Drop the shard being written (a failed partition: its retry writes it again)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._hash is not None:
            self._hash.close()
            self._hash = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None

    def _drain(self, *, final: bool) -> None:
        rg = self.config.row_group_rows
        while self._pending_rows >= rg or (final and self._pending_rows):
            room = self.config.shard_rows - self._rows
            take = min(rg, room, self._pending_rows)
            table = pa.concat_tables(self._pending)
            part, rest = table.slice(0, take), table.slice(take)
            self._pending = [rest] if rest.num_rows else []
            self._pending_rows -= take
            self._write(part.combine_chunks())
            if self._rows == self.config.shard_rows:
                self._close_shard()

    def _write(self, part: pa.Table) -> None:
        if self._writer is None:
            path = self.directory / self.name(len(self.infos))
            self._tmp = temporary_name(path)
            with naming(self._tmp):
                self._writer = pq.ParquetWriter(
                    self._tmp, part.schema, **_writer_options(self.config)
                )
                self._hash = _RunningHash(self._tmp)
        with naming(self._tmp):
            self._writer.write_table(part, row_group_size=self.config.row_group_rows)
            self._hash.advance()
        self._rows += part.num_rows
        self._tokens += pc_sum_lengths(part)

    def _close_shard(self) -> None:
        if self._writer is None:
            return
        with naming(self._tmp):
            self._writer.close()
            self._writer = None
            digest = self._hash.hexdigest()
            self._hash = None
        name = self.name(len(self.infos))
        path = self.directory / name
        _finish(self._tmp, path)
        self._tmp = None
        self.infos.append(
            ShardInfo(
                file=name,
                rows=self._rows,
                tokens=self._tokens,
                bytes=path.stat().st_size,
                sha256=digest,
            )
        )
        self._rows = self._tokens = 0
