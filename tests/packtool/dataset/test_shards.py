"""ShardWriter's bookkeeping: the sha256 hashed while the shard is written is the file's, the
token count read from the offsets is the rows' lengths, an aborted shard leaves nothing open."""

from __future__ import annotations

import hashlib
import os
import re
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.dataset import shards
from packtool.dataset.shards import ShardConfig, ShardWriter, _RunningHash, pc_sum_lengths
from packtool.errors import ConfigError


def _rows(lengths: list[int], start: int = 0) -> pa.Table:
    ids = [[(start + r * 13 + t) % 60000 for t in range(n)] for r, n in enumerate(lengths)]
    return pa.table(
        {
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "doc_offsets": pa.array([[0, n] for n in lengths], pa.list_(pa.int32())),
            "doc_ids": pa.array([[start + r] for r in range(len(lengths))], pa.list_(pa.int64())),
            "doc_chunks": pa.array([[0]] * len(lengths), pa.list_(pa.int32())),
        }
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 300), max_size=30), min_size=1, max_size=4),
    st.integers(1, 8),
    st.integers(1, 25),
)
def test_infos_are_the_files(tmp_path_factory, tables, row_group_rows, shard_rows):
    folder = tmp_path_factory.mktemp("shards")
    writer = ShardWriter(folder, lambda k: f"s{k}.parquet", ShardConfig(
        row_group_rows=row_group_rows, shard_rows=shard_rows
    ))  # fmt: skip
    start = 0
    for lengths in tables:
        writer.add(_rows(lengths, start))
        start += len(lengths)
    infos = writer.close()
    assert sum(i.rows for i in infos) == start
    assert sum(i.tokens for i in infos) == sum(map(sum, tables))
    for info in infos:
        data = (folder / info.file).read_bytes()
        assert info.sha256 == hashlib.sha256(data).hexdigest()
        assert info.bytes == len(data)
    assert not [t for t in threading.enumerate() if t.name.startswith("packtool-sha256")]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=20), st.integers(0, 19), st.integers(0, 19))
def test_token_count_from_offsets_of_slices_and_chunks(lengths, a, b):
    table = pa.concat_tables([_rows(lengths[:a]), _rows(lengths[a:])])
    lo, hi = sorted((a, b))
    part = table.slice(lo, hi - lo)
    assert pc_sum_lengths(part) == sum(lengths[lo:hi])


def test_running_hash_of_a_growing_file(tmp_path, monkeypatch):
    path = tmp_path / "grows"
    path.write_bytes(b"")
    synced: list[int] = []
    real_sync = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(fd), real_sync(fd)))
    monkeypatch.setattr(shards, "SYNC_EVERY", 1 << 20)
    running = _RunningHash(path)
    content = b""
    with open(path, "ab") as f:
        for i in range(50):
            piece = os.urandom(1 + (i * 7919) % 300_000)
            f.write(piece)
            f.flush()
            content += piece
            running.advance()  # often while the one before is still hashing
    fd = running._file.fileno()
    assert running.hexdigest() == hashlib.sha256(content).hexdigest()
    # 5.8 MB written, flushed to the disk along the way (at most once per SYNC_EVERY bytes)
    assert set(synced) == {fd} and 1 <= len(synced) <= len(content) // shards.SYNC_EVERY


def test_running_hash_refuses_a_file_that_shrank(tmp_path):
    path = tmp_path / "shrinks"
    path.write_bytes(b"x" * 1000)
    running = _RunningHash(path)
    size = running._file.size()
    os.truncate(path, 10)
    with pytest.raises(OSError, match="shrank"):
        running._read_to(size)
    running.close()


def test_abort_drops_the_shard_and_its_hash(tmp_path):
    writer = ShardWriter(tmp_path, lambda k: f"s{k}.parquet", ShardConfig(row_group_rows=2))
    writer.add(_rows([5, 6, 7]))  # one row group written, one row pending
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("packtool-sha256")]


def _hashed_while_growing(path, piece: bytes, times: int, monkeypatch) -> _RunningHash:
    """A running hash of `path` advanced after each of `times` appends of `piece`, flushing
    every 1,000 bytes."""
    monkeypatch.setattr(shards, "SYNC_EVERY", 1000)
    path.write_bytes(b"")
    running = _RunningHash(path)
    with open(path, "ab") as f:
        for _ in range(times):
            f.write(piece)
            f.flush()
            running.advance()
    return running


def test_a_refused_early_flush_only_stops_the_flushing(tmp_path, monkeypatch):
    def refuse(fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fdatasync", refuse)
    running = _hashed_while_growing(tmp_path / "f", b"y" * 3000, 5, monkeypatch)
    assert running.hexdigest() == hashlib.sha256(b"y" * 15000).hexdigest()
    assert running._synced == -1


def test_early_flushes_use_fsync_where_there_is_no_fdatasync(tmp_path, monkeypatch):
    synced = []
    monkeypatch.delattr(os, "fdatasync", raising=False)  # macOS
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd))
    running = _hashed_while_growing(tmp_path / "f", b"z" * 3000, 3, monkeypatch)
    assert running.hexdigest() == hashlib.sha256(b"z" * 9000).hexdigest()
    assert synced and running._synced > 0


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        # Before: shard_rows=2.5 was accepted, then packtool/pack/rows.py raised a TypeError.
        ({"shard_rows": 2.5}, "shard_rows must be an integer from 1 to 2,147,483,647, got 2.5"),
        ({"shard_rows": "8"}, "shard_rows must be an integer from 1 to 2,147,483,647, got '8'"),
        ({"row_group_rows": True}, "row_group_rows must be an integer from 1 to 2,147,483,647"),
        ({"row_group_rows": 0}, "row_group_rows must be an integer from 1 to 2,147,483,647"),
        # Before: an AttributeError from inside pyarrow's writer.
        (
            {"compression": "zstd", "compression_level": "x"},
            "compression_level must be None or an integer from -131,072 to 22, got 'x'",
        ),
        ({"compression_level": 2.5}, "compression_level must be None or an integer"),
        ({"compression_level": 23}, "compression_level must be None or an integer"),
        ({"compression": 3}, "compression 3 is unknown"),
    ],
)
def test_bad_options_are_one_line_config_errors(kwargs, says):
    with pytest.raises(ConfigError, match=f"^{re.escape(says)}"):
        ShardConfig(**kwargs)


def test_every_zstd_level_is_written(tmp_path):
    for level in (None, -5, 1, 22):
        config = ShardConfig(compression="zstd", compression_level=level)
        shards._write_one(tmp_path / "s.parquet", _rows([3, 4]), config)
        assert pa.parquet.read_table(tmp_path / "s.parquet").num_rows == 2


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 60), min_size=1, max_size=4), min_size=1, max_size=8),
    st.integers(2, 12),
    st.integers(0, 30),
)
def test_a_row_group_joining_two_tables_stays_within_one_list_array(
    tmp_path_factory, tables, row_group_rows, slack
):
    """A row group is read back as one `list` array (int32 offsets: 2^31 - 1 tokens). One that
    joined the rows of two chunks could hold more from max_len 2^23 on (256 rows of 2^23), and
    Arrow refused to combine it: "offset overflow while concatenating arrays", a traceback in
    the tail tree's root. It now ends before the row that would take it past (limit lowered
    here, to no less than one table holds, as a chunk's rows never hold more); the rows, their
    order and their tokens are unchanged."""
    limit = max(map(sum, tables)) + slack
    folder = tmp_path_factory.mktemp("shards")
    config = ShardConfig(row_group_rows=row_group_rows, shard_rows=1000)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(shards, "MAX_GROUP_TOKENS", limit)
        writer = ShardWriter(folder, lambda k: f"s{k}.parquet", config)
        start = 0
        for lengths in tables:
            writer.add(_rows(lengths, start))
            start += len(lengths)
        (info,) = writer.close()
    meta = pq.ParquetFile(folder / info.file).metadata
    sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
    written = pa.concat_tables([_rows(t, sum(map(len, tables[:k]))) for k, t in enumerate(tables)])
    assert pq.read_table(folder / info.file).column("input_ids").equals(written.column("input_ids"))
    rows = [n for t in tables for n in t]
    at = 0
    for size in sizes:
        group = rows[at : at + size]
        assert 1 <= size <= row_group_rows
        assert sum(group) <= limit or size == 1
        at += size
    assert at == len(rows)
