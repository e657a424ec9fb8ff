"""Writing packed rows as Parquet shards, atomically (temporary file, fsync, rename), with a CRC32
checksum on every page.

A shard that has its final name is complete; anything still being written is a hidden
`.NAME.<unique>.tmp` file (unique per writer, so two attempts at the same partition, e.g. a Ray
task retried while the first attempt still runs, never rename each other's half-written file).

`write_shards` writes one table; `ShardWriter` streams a partition's chunks into shards of
exactly `shard_rows` rows in row groups of exactly `row_group_rows` rows (the last ones of the
partition fewer; a group also ends early where two chunks' rows would hold more tokens than one
list array, `MAX_GROUP_TOKENS`), so the file layout does not depend on `--chunk-docs`, and many
small chunks cost no more files than a few large ones. Shards never straddle partitions: the shards of a
partition depend only on that partition, which is what lets `--resume` reproduce an
uninterrupted run byte for byte.

A shard bound for object storage is written in the local scratch folder and uploaded whole
(packtool/storage/writing.py, `replace`); `ShardWriter` uploads it on a thread of its own while
the next shard is written, one upload at a time, and `close()` returns once the last is in the
store (an upload's error is raised there, or at the next shard's close).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.arrow_numpy import to_numpy
from packtool.dataset.manifest import ShardInfo, packed_schema, sha256_file
from packtool.dataset.names import SHARD_PATTERN
from packtool.dataset.stitch import StitchError, footer_of, stitched_footer
from packtool.errors import ConfigError, naming
from packtool.quantities import check_int
from packtool.storage import local as storage
from packtool.storage import writing


class RowSource(Protocol):
    """Packed rows the writer takes a block at a time (`packtool.pack.rows.PackedRows`: a
    chunk's rows, their ids gathered when asked for). Typed here so the format does not import
    the packer."""

    @property
    def num_rows(self) -> int: ...

    def block(self, start: int, stop: int) -> pa.Table: ...

    def blocks(self, rows: int, start: int = 0, stop: int | None = None) -> Iterator[pa.Table]: ...


COMPRESSIONS = ("none", "snappy", "lz4", "zstd")
MAX_ROWS = (1 << 31) - 1
"""The most rows a shard or row group is given (`shard_rows`, `row_group_rows`)."""
MAX_GROUP_TOKENS = (1 << 31) - 1
"""Tokens one row group may hold: it is read back as one `list` array, whose offsets are int32.
A group of one chunk's rows never holds more (a chunk is one table, packtool/pack/token_cut.py);
a group joining two chunks' rows could from max_len 2^23 on (256 rows of 2^23 tokens), and
ends before the row that would take it past (`ShardWriter._drain`): Arrow refused to combine
it ("offset overflow"), a traceback in the tail tree's root."""
ZSTD_LEVELS = (-(1 << 17), 22)
"""zstd's levels (ZSTD_minCLevel to ZSTD_maxCLevel): pyarrow clamps others without a word."""


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
        for name in ("shard_rows", "row_group_rows"):
            # (Parquet's writer takes a C long: 10^20 overflowed)
            check_int(name, getattr(self, name), 1, MAX_ROWS)
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression {self.compression!r} is unknown; choose one of {list(COMPRESSIONS)}"
            )
        check_int("compression_level", self.compression_level, *ZSTD_LEVELS, optional=True)


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


def _finish(tmp: Path, path: Path) -> None:
    writing.sync_file(tmp)
    writing.replace(tmp, path)


def _write_one(path: Path, table: pa.Table, config: ShardConfig) -> None:
    tmp = writing.temporary_name(path)
    with naming(tmp):  # a full disk names the file
        writing.write_parquet(
            table, tmp, row_group_size=config.row_group_rows, **_writer_options(config)
        )
    _finish(tmp, path)


def write_shards(
    directory: Path, table: pa.Table, first_index: int, config: ShardConfig
) -> list[ShardInfo]:
    """Write one chunk's packed rows as shards numbered from `first_index`; return their info.

    The table's columns (the required ones plus any declared optional ones, packtool/dataset/columns.py)
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
                bytes=storage.size(path),
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


def _fitting(table: pa.Table, rows: int) -> int:
    """The first `rows` rows of `table`, or fewer (one at least): as many as hold at most
    `MAX_GROUP_TOKENS` tokens."""
    lengths = pc.list_value_length(table.column("input_ids").slice(0, rows))
    ends = np.cumsum(to_numpy(lengths).astype(np.int64))  # (pyarrow's to_numpy: pandas)
    return max(1, int(np.searchsorted(ends, MAX_GROUP_TOKENS, side="right")))


SYNC_EVERY = 8 << 20
"""Bytes the hashing thread hashes between two `fdatasync`s of the shard being written: its
pages reach the disk while it is written, so the fsync that makes it durable at the close waits
for the last few MB only (0.021-0.022 s -> 0.005-0.007 s per 42 MB shard on this project's box)."""


HASH_POLL = 0.005
"""Seconds between two `advance`s of the hash while the other thread writes its part."""


class _RunningHash:
    """The sha256 of a file being written front to back, hashed as it grows, in a thread.

    A Parquet writer only appends (pages, then the footer at `close`), so the bytes before the
    file's current size are final: `advance()` after each row group hashes what is new while
    the writer encodes the next one, and `hexdigest()` after the close reads only the footer.
    The shard's close then no longer reads the whole file back on the writer's thread (~0.03 s
    per 42 MB shard, in the single-core tail of a run). The thread also flushes the file to the
    disk every `SYNC_EVERY` bytes, so the close's fsync has little left to wait for.

    A shard written in parts (`ShardWriter(threads=2)`) is hashed part after part, as they
    grow: `switch` ends one part's bytes and goes on with the next part's row groups, and
    `finish` adds the footer the parts are joined with, so the joined file is never read back.
    """

    def __init__(self, path: Path) -> None:
        self._file = storage.open_random(path)  # the file hashed now
        self._shard_file = self._file  # the one flushed as it goes (parts are copied, not kept)
        self._open = [self._file]
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
        self._pending = self._pool.submit(self._read_to, self._file.size())

    def switch(self, path: Path, start: int, end: int) -> None:
        """The file hashed now ends at byte `end` (its last row group's): hash it to there, then
        go on with the file at `path` from byte `start`."""
        self.wait()
        file = storage.open_random(path)
        self._open.append(file)  # closed by `close` whatever happens
        self._pending = self._pool.submit(self._switch, file, start, end)

    def wait(self) -> None:
        """Let the hashing under way finish (the file may then change beyond what it hashed)."""
        if self._pending is not None:
            self._pending, pending = None, self._pending
            pending.result()

    def hexdigest(self) -> str:
        """The digest of the whole file (call once, after the writer closed it)."""
        try:
            self.wait()
            self._read_to(self._file.size())
            return self._hash.hexdigest()
        finally:
            self.close()

    def finish(self, end: int, tail: bytes) -> str:
        """The digest of what was hashed, the file hashed now to byte `end`, then `tail` (call
        once)."""
        try:
            self.wait()
            self._read_to(end)
            self._hash.update(tail)
            return self._hash.hexdigest()
        finally:
            self.close()

    def close(self) -> None:
        """Stop the thread and close the files (again: nothing; an abort after a failed close)."""
        self._pool.shutdown(wait=True)
        files, self._open = (self._open, [])
        for file in files:
            file.close()

    def _switch(self, file: storage.RandomFile, start: int, end: int) -> None:
        self._read_to(end)
        if self._file is not self._shard_file:
            self._open.remove(self._file)
            self._file.close()
        self._file, self._done = file, start

    def _read_to(self, end: int) -> None:
        while self._done < end:
            block = self._file.read_at(min(end - self._done, 1 << 20), self._done)
            if not block:  # the file is shorter than its size said: never for an append
                raise OSError(f"shard shrank while being hashed at byte {self._done}")
            self._hash.update(block)
            self._done += len(block)
        if (
            self._file is self._shard_file
            and self._synced >= 0
            and self._done - self._synced >= SYNC_EVERY
        ):
            try:
                self._file.sync_data()
                self._synced = self._done
            except OSError:  # only a head start: the close's fsync is what makes it durable
                self._synced = -1  # (a file system that refuses it on a read-only descriptor)


class ShardWriter:
    """Streams packed tables into shards of `shard_rows` rows, row groups of `row_group_rows`.

    Args:
        directory: where the shards go.
        name: the final file name of the shard with this number (0, 1, 2, ... per writer).
        config: the layout.
        threads: Parquet writers run at once (1 or 2). With 2, `add_rows` writes a run of at
            least `PARALLEL_GROUPS` row groups of one shard as two *parts* on two threads (the
            writer releases the GIL): the first half into the shard's file, the second into a
            part file of its own, which then takes the shard's later row groups. Closing the
            shard appends the parts to its file and writes the footer one writer would have
            written (packtool/dataset/stitch.py): the same bytes as `threads=1`.

    Rows are buffered until a row group is full, so memory holds at most one row group beyond
    the table being added. `close()` writes what is left and returns every shard's info.
    """

    PARALLEL_GROUPS = 4
    """Fewest row groups of one shard that `add_rows` splits into two parts."""

    def __init__(
        self,
        directory: Path,
        name: Callable[[int], str],
        config: ShardConfig,
        *,
        threads: int = 1,
    ) -> None:
        self.directory = directory
        self.name = name
        self.config = config
        self.threads = threads
        self.infos: list[ShardInfo] = []
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._writer: pq.ParquetWriter | None = None  # the open shard's last part's writer
        self._parts: list[Path] = []  # the open shard's parts; the first is the shard's file
        self._hash: _RunningHash | None = None  # of the open shard's parts, as they grow
        self._pool: ThreadPoolExecutor | None = None
        self._uploader: ThreadPoolExecutor | None = None  # a remote shard's upload, one at a time
        self._upload: tuple[Path, Future] | None = None  # (scratch file, its upload)
        self._rows = 0  # in the open shard
        self._tokens = 0

    def add(self, table: pa.Table) -> None:
        """Queue packed rows (shard schema columns); full row groups are written at once."""
        if not table.num_rows:
            return
        self._pending.append(_shard_table(table))
        self._pending_rows += table.num_rows
        self._drain(final=False)

    def add_rows(self, rows: RowSource) -> None:
        """`add` every row of `rows`, their ids gathered a row group at a time (the next one in
        a second thread); with `threads=2`, long runs of one shard's row groups are written on
        two threads."""
        rg, i, n = self.config.row_group_rows, 0, rows.num_rows
        while i < n:
            if self._pending_rows:  # fewer than a row group: complete it first
                lead = min(rg - self._pending_rows, n - i)
                self.add(rows.block(i, i + lead))
                i += lead
                continue
            room = self.config.shard_rows - self._rows  # > 0: a full shard is closed at once
            take = min(room, n - i)
            span = take if take == room else take // rg * rg  # whole groups, or to its end
            groups = -(-span // rg)
            if self.threads >= 2 and groups >= self.PARALLEL_GROUPS:
                self._two_parts(rows, i, i + groups // 2 * rg, i + span)
                i += span
                if self._rows == self.config.shard_rows:
                    self._close_shard()
                continue
            for block in rows.blocks(rg, i, i + take):
                self.add(block)
            i += take

    def close(self) -> list[ShardInfo]:
        self._drain(final=True)
        self._close_shard()
        self._wait_upload()
        self._stop_pool()
        return self.infos

    def abort(self) -> None:
        """Drop the shard being written (a failed partition: its retry writes it again)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._hash is not None:
            self._hash.close()
            self._hash = None
        with contextlib.suppress(Exception):  # a failing partition's upload error adds nothing
            self._wait_upload()  # its object is written again by the retry
        self._stop_pool()
        for part in self._parts:
            writing.remove_file(part)
        self._parts = []

    def _drain(self, *, final: bool) -> None:
        rg = self.config.row_group_rows
        while self._pending_rows >= rg or (final and self._pending_rows):
            room = self.config.shard_rows - self._rows
            take = min(rg, room, self._pending_rows)
            table = pa.concat_tables(self._pending)
            if table.column("input_ids").num_chunks > 1:  # combined: may hold too many tokens
                take = _fitting(table, take)
            part, rest = table.slice(0, take), table.slice(take)
            self._pending = [rest] if rest.num_rows else []
            self._pending_rows -= take
            self._write(part.combine_chunks())
            if self._rows == self.config.shard_rows:
                self._close_shard()

    def _write(self, group: pa.Table) -> None:
        """Write one row group into the open shard's last part (opening the shard first)."""
        if self._writer is None:
            self._writer = self._open_part(group.schema)
        part = self._parts[-1]
        with naming(part):
            self._writer.write_table(group, row_group_size=self.config.row_group_rows)
            self._hash.advance()  # it hashes the last part
        self._count(group)

    def _open_part(self, schema: pa.Schema) -> pq.ParquetWriter:
        """A new part's writer; the shard's file (and its running hash) when it is the first."""
        path = writing.temporary_name(self.directory / self.name(len(self.infos)))
        with naming(path):
            writer = writing.parquet_writer(path, schema, **_writer_options(self.config))
            self._parts.append(path)
            if len(self._parts) == 1:
                self._hash = _RunningHash(path)
        return writer

    def _count(self, group: pa.Table) -> None:
        self._rows += group.num_rows
        self._tokens += pc_sum_lengths(group)

    def _two_parts(self, rows: RowSource, start: int, middle: int, stop: int) -> None:
        """Rows `start` to `stop` of `rows` (whole row groups of the open shard, or to its end;
        nothing pending) on two threads: to `middle` into the open part (this thread), the rest
        into a new part (a second thread), which stays open for what follows."""
        rg = self.config.row_group_rows
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="packtool-shard")
        path = writing.temporary_name(self.directory / self.name(len(self.infos)))

        def second() -> tuple[pq.ParquetWriter, int]:
            # Touches nothing of `self` but the config: this thread's part is added after.
            writer, tokens = None, 0
            try:
                with naming(path):
                    for a in range(middle, stop, rg):
                        group = _shard_table(rows.block(a, min(a + rg, stop)))
                        if writer is None:
                            writer = writing.parquet_writer(
                                path, group.schema, **_writer_options(self.config)
                            )
                        writer.write_table(group, row_group_size=rg)
                        tokens += pc_sum_lengths(group)
                return writer, tokens
            except BaseException:
                if writer is not None:
                    writer.close()
                writing.remove_file(path)
                raise

        with naming(path):
            writing.create_empty(
                path
            )  # the hash opens it before the second thread's writer may have
        later = self._pool.submit(second)
        try:
            for block in rows.blocks(rg, start, middle):
                self._write(_shard_table(block))
            # The open part's row groups end here; the hash goes on with the new part's.
            self._hash.switch(path, 4, storage.size(self._parts[-1]))
            while True:
                try:
                    writer, tokens = later.result(timeout=HASH_POLL)
                    break
                except FutureTimeout:  # not the built-in TimeoutError before Python 3.11
                    self._hash.advance()
        except BaseException:
            try:
                writer, _ = later.result()  # the second thread's error is the cause, if any
                writer.close()
            finally:
                writing.remove_file(path)
            raise
        self._hash.advance()
        with naming(self._parts[-1]):
            self._writer.close()  # the first half's part is complete (its footer goes at the join)
        self._writer = writer
        self._parts.append(path)
        self._rows += stop - middle
        self._tokens += tokens

    def _close_shard(self) -> None:
        if self._writer is None:
            return
        shard, last = self._parts[0], self._parts[-1]
        with naming(shard):
            end = storage.size(last)  # the last part's row groups end here
            self._writer.close()
            self._writer = None
            digest = self._join_parts(end) if len(self._parts) > 1 else self._hash.hexdigest()
            self._hash = None
        name = self.name(len(self.infos))
        path = self.directory / name
        size = storage.size(shard)  # before it moves (or is uploaded: no HEAD of the object)
        if storage.is_remote(path):
            self._start_upload(shard, path)
        else:
            _finish(shard, path)
        self._parts = []
        self.infos.append(
            ShardInfo(file=name, rows=self._rows, tokens=self._tokens, bytes=size, sha256=digest)
        )
        self._rows = self._tokens = 0

    def _join_parts(self, end: int) -> str:
        """Make the shard's file the one one writer would have written for its parts' row
        groups (in order), delete the other parts, and return the file's sha256 (`end`: where
        the last part's row groups end)."""
        shard, others = self._parts[0], self._parts[1:]
        try:
            split = [_footer_of(p) for p in self._parts]
            if end != 4 + split[-1][0]:
                raise StitchError("the last part's footer does not start where it ended")
            footer = stitched_footer(split)
        except StitchError:  # not expected from this writer's options: one writer then
            self._hash.close()
            _rewrite(self._parts, self.config)
            digest = sha256_file(shard)
        else:
            digest = self._hash.finish(end, footer)  # the joined file is never read back
            with writing.open_update(shard) as out:
                out.truncate(4 + split[0][0])  # the first part's footer goes
                out.seek(0, os.SEEK_END)
                for part, (body, _) in zip(others, split[1:], strict=True):
                    writing.append_range(part, 4, body, out)
                out.write(footer)
        for part in others:
            writing.remove_file(part)
        return digest

    def _start_upload(self, scratch: Path, path: Path) -> None:
        """Upload the closed shard's scratch file to `path` on the upload thread (after the
        one before it: at most one shard in the scratch folder waits for its upload). No
        fsync: a scratch file outlives no crash that the upload would survive."""
        self._wait_upload()
        if self._uploader is None:
            self._uploader = ThreadPoolExecutor(1, thread_name_prefix="packtool-upload")
        self._upload = (scratch, self._uploader.submit(writing.replace, scratch, path))

    def _wait_upload(self) -> None:
        if self._upload is not None:
            scratch, upload = self._upload
            self._upload = None
            try:
                upload.result()
            except BaseException:
                writing.remove_file(scratch)
                raise

    def _stop_pool(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._uploader is not None:
            self._uploader.shutdown(wait=True)
            self._uploader = None


def _shard_table(table: pa.Table) -> pa.Table:
    """`table`'s columns in the shard schema's order and types."""
    token_type = table.schema.field("input_ids").type.value_type
    schema = packed_schema(token_type, tuple(table.column_names))
    return table.select(schema.names).cast(schema)


def _footer_of(path: Path) -> tuple[int, bytes]:
    """(bytes of row groups, raw footer) of the Parquet file at `path`."""
    size = storage.size(path)
    with storage.open_input(path) as f:
        f.seek(max(0, size - 8))
        n = int.from_bytes(f.read(8)[:4], "little")  # the footer's length
        f.seek(max(0, size - 8 - n))
        return footer_of(f.read(), size)


def _rewrite(parts: list[Path], config: ShardConfig) -> None:
    """The parts' row groups through one writer, into `parts[0]` (read back in the shard
    schema: Parquet names list items `element`, not `item`)."""
    sources = [storage.parquet_file(p) for p in parts]
    names = tuple(sources[0].schema_arrow.names)
    token_type = sources[0].schema_arrow.field("input_ids").type.value_type
    schema = packed_schema(token_type, names)
    tmp = writing.temporary_name(parts[0])
    with writing.parquet_writer(tmp, schema, **_writer_options(config)) as writer:
        for source in sources:
            for i in range(source.num_row_groups):
                table = source.read_row_group(i).cast(schema)
                writer.write_table(table, row_group_size=config.row_group_rows)
    writing.replace(tmp, parts[0])
