"""PackedRows: the rows a block at a time are the rows of the whole table, and written through
the shard writer they make the same bytes."""

from __future__ import annotations

import hashlib
import threading

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.dataset import columns
from packtool.dataset.shards import ShardConfig, ShardWriter
from packtool.pack.chunk import PackConfig, pack_table
from packtool.pack.rows import IDS


def _tokenized(lengths: list[int], batches: int, mask: bool = False) -> pa.Table:
    """Documents of these lengths (ids from their position), as `batches` chunks like the
    tokenizer's batches; a loss mask per token when `mask`."""
    ids = [[(d * 31 + t) % 50000 for t in range(n)] for d, n in enumerate(lengths)]
    cols = {
        "doc_id": pa.array(np.arange(len(lengths)), pa.int64()),
        "input_ids": pa.array(ids, pa.list_(pa.uint16())),
        "length": pa.array(lengths, pa.int32()),
    }
    if mask:
        cols["loss_mask"] = pa.array(
            [[(d + t) % 3 != 0 for t in range(n)] for d, n in enumerate(lengths)],
            pa.list_(pa.bool_()),
        )
    table = pa.table(cols)
    step = max(1, -(-len(lengths) // max(batches, 1)))
    return pa.concat_tables([table.slice(i, step) for i in range(0, len(lengths), step)] or [table])


def _write(tables: list[pa.Table], folder, config: ShardConfig) -> dict[str, str]:
    folder.mkdir()
    writer = ShardWriter(folder, lambda k: f"shard-{k}.parquet", config)
    for t in tables:
        writer.add(t)
    infos = writer.close()
    return {i.file: hashlib.sha256((folder / i.file).read_bytes()).hexdigest() for i in infos}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 90), min_size=1, max_size=60),
    st.integers(1, 4),
    st.integers(1, 12),
    st.booleans(),
)
def test_blocks_are_the_rows_of_the_table(lengths, batches, rows, mask):
    config = PackConfig(max_len=32, long_docs="truncate" if mask else "split")
    packed = pack_table(_tokenized(lengths, batches, mask), config)
    whole = packed.rows.table()
    blocks = list(packed.rows.blocks(rows))
    assert [b.num_rows for b in blocks] == [
        min(rows, whole.num_rows - s) for s in range(0, whole.num_rows, rows)
    ]
    for b in blocks:
        assert b.schema == whole.schema
    joined = pa.concat_tables(blocks) if blocks else whole.slice(0, 0)
    assert joined.equals(whole)
    assert packed.table.equals(whole)  # the cached whole table
    # one row's ids, by hand: the documents' tokens at the row's doc_offsets
    if whole.num_rows:
        src = _tokenized(lengths, 1, mask).column("input_ids").combine_chunks().to_pylist()
        row = whole.slice(0, 1).to_pylist()[0]
        got = []
        ends = row["doc_offsets"]
        for d, c, s, e in zip(row["doc_ids"], row["doc_chunks"], ends, ends[1:], strict=False):
            got += src[d][c * 32 : c * 32 + (e - s)]
        assert row["input_ids"] == got


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 120), min_size=1, max_size=80),
    st.integers(1, 9),
    st.integers(1, 40),
    st.integers(1, 5),
)
def test_shards_from_blocks_are_the_bytes_of_shards_from_the_table(
    tmp_path_factory, lengths, row_group_rows, shard_rows, block
):
    # Two chunks, as a partition's chunks reach the writer: the second starts mid row group.
    config = ShardConfig(row_group_rows=row_group_rows, shard_rows=shard_rows)
    half = len(lengths) // 2
    first = pack_table(_tokenized(lengths[:half], 2), PackConfig(max_len=48), chunk_index=0)
    second = pack_table(_tokenized(lengths[half:], 3), PackConfig(max_len=48), chunk_index=1)
    whole = _write([first.table, second.table], tmp_path_factory.mktemp("w") / "s", config)
    streamed = [*first.rows.blocks(block), *second.rows.blocks(block)]
    assert _write(streamed, tmp_path_factory.mktemp("b") / "s", config) == whole


def test_a_block_is_gathered_in_a_second_thread_while_the_caller_holds_the_one_before():
    packed = pack_table(_tokenized([20] * 40, 3), PackConfig(max_len=64))
    threads: list[str] = []
    second = threading.Event()
    gather = packed.rows._values.gather

    def spy(src, lengths):
        threads.append(threading.current_thread().name)
        if len(threads) == 2:
            second.set()
        return gather(src, lengths)

    packed.rows._values.gather = spy
    blocks = packed.rows.blocks(3)
    next(blocks)
    # the caller holds the first block; the second is gathered meanwhile, unasked
    assert second.wait(10)
    assert all(t.startswith("packtool-gather") for t in threads)
    blocks.close()  # a caller that stops early (its write failed) leaves no thread behind
    assert not any(t.name.startswith("packtool-gather") for t in threading.enumerate())


def test_an_error_gathering_a_block_reaches_the_caller():
    packed = pack_table(_tokenized([20] * 40, 2), PackConfig(max_len=64))
    calls = []

    def failing(src, lengths):
        calls.append(1)
        if len(calls) == 2:
            raise MemoryError("no room for the block")
        return np.zeros(int(np.sum(lengths)), np.uint16)

    packed.rows._values.gather = failing
    blocks = packed.rows.blocks(4)
    next(blocks)
    with pytest.raises(MemoryError, match="no room"):
        next(blocks)


def test_block_sizes_and_bounds():
    packed = pack_table(_tokenized([10] * 9, 1), PackConfig(max_len=20))  # 5 rows
    rows = packed.rows
    assert rows.num_rows == 5
    assert rows.block(3, 99).num_rows == 2 and rows.block(4, 2).num_rows == 0
    assert rows.block(0, 5).equals(rows.table())
    with pytest.raises(ValueError, match="rows must be >= 1"):
        list(rows.blocks(0))
    empty = pack_table(_tokenized([0, 0], 1), PackConfig(max_len=20))
    assert list(empty.rows.blocks(4)) == [] and empty.table.num_rows == 0


def test_no_derived_column_reads_the_ids():
    # PackedRows derives the other columns before the ids are gathered.
    for c in columns.derived():
        assert IDS not in c.derived.inputs, c.name
