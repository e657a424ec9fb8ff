"""Parquet parts written apart and stitched are byte for byte what one writer writes; the shard
writer on two threads (`ShardWriter(threads=2).add_rows`) writes the bytes of one thread."""

import hashlib
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.dataset.shards import ShardConfig, ShardWriter, _writer_options
from packtool.dataset.stitch import StitchError, parse_footer, stitch, write_footer


def packed(n_rows: int, seed: int = 0) -> pa.Table:
    """About `n_rows` packed rows in the shard schema (`pack_table` on random documents)."""
    from packtool.pack.chunk import PackConfig, pack_table

    rng = np.random.default_rng(seed)
    lengths = rng.integers(20, 40, 2 * n_rows)  # two per 48-token row at most
    ids = [rng.integers(0, 50_000, n).tolist() for n in lengths]
    docs = pa.table(
        {
            "doc_id": pa.array(np.arange(len(lengths)), pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "length": pa.array(lengths, pa.int32()),
        }
    )
    rows = pack_table(docs, PackConfig(max_len=48)).table
    assert rows.num_rows >= n_rows
    return rows.slice(0, n_rows)


def written(table: pa.Table, row_group: int, **options) -> bytes:
    sink = pa.BufferOutputStream()
    opts = {**_writer_options(ShardConfig()), **options}
    with pq.ParquetWriter(sink, table.schema, **opts) as w:
        for start in range(0, table.num_rows, row_group):
            w.write_table(table.slice(start, row_group), row_group_size=row_group)
    return sink.getvalue().to_pybytes()


def footer(data: bytes) -> bytes:
    n = int.from_bytes(data[-8:-4], "little")
    return data[-8 - n : -8]


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 300),
    st.integers(1, 40),
    st.lists(st.integers(1, 12), max_size=4),
    st.sampled_from(["lz4", "zstd", "none"]),
)
def test_stitched_parts_equal_one_writer(n_rows, row_group, cuts, codec):
    table = packed(n_rows, seed=n_rows)
    opts = {"compression": None if codec == "none" else codec}
    one = written(table, row_group, **opts)
    bounds = [0]
    for c in cuts:  # part boundaries on row group boundaries, as ShardWriter cuts them
        nxt = bounds[-1] + c * row_group
        if nxt >= n_rows:
            break
        bounds.append(nxt)
    bounds.append(n_rows)
    parts = [
        written(table.slice(a, b - a), row_group, **opts)
        for a, b in zip(bounds, bounds[1:], strict=False)
    ]
    assert stitch(parts) == one
    assert pq.read_table(pa.BufferReader(stitch(parts))).equals(table)


def test_footer_reads_back_to_its_bytes():
    raw = footer(written(packed(50), 8))
    assert write_footer(parse_footer(raw)) == raw


def test_page_indexes_are_refused():
    # offsets this module does not move: the caller writes the rows again with one writer
    table = packed(40)
    parts = [written(table.slice(0, 20), 10, write_page_index=True)] * 2
    with pytest.raises(StitchError, match="page indexes"):
        stitch(parts)


def test_different_schemas_are_refused():
    a = written(packed(20), 10)
    table = packed(20)
    b = written(table.rename_columns([*table.column_names[:-1], "other"]), 10)
    with pytest.raises(StitchError, match="differ"):
        stitch([a, b])


def chunk(n_docs: int, seed: int, index: int):
    """A chunk's packed rows (`PackedRows`), as a partition's chunks reach the writer."""
    from packtool.pack.chunk import PackConfig, pack_table

    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 70, n_docs)
    ids = [rng.integers(0, 50_000, n).tolist() for n in lengths]
    docs = pa.table(
        {
            "doc_id": pa.array(np.arange(len(lengths)) + 1000 * index, pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "length": pa.array(lengths, pa.int32()),
        }
    )
    return pack_table(docs, PackConfig(max_len=48), chunk_index=index).rows


def write_chunks(folder: Path, chunks, config: ShardConfig, threads: int, whole: set[int]):
    """(infos, file bytes) of `chunks` written by one writer; chunks in `whole` go through
    `add` as one table (rows left pending mid row group before the next `add_rows`)."""
    folder.mkdir()
    writer = ShardWriter(folder, lambda k: f"shard-{k:05d}.parquet", config, threads=threads)
    writer.PARALLEL_GROUPS = 2
    splits = []
    two_parts = writer._two_parts

    def spy(*args):
        splits.append(args[1:])
        return two_parts(*args)

    writer._two_parts = spy
    for i, rows in enumerate(chunks):
        if i in whole:
            writer.add(rows.table())
        else:
            writer.add_rows(rows)
    infos = writer.close()
    files = {p.name: p.read_bytes() for p in sorted(folder.iterdir())}
    return infos, files, splits


@st.composite
def writes(draw):
    """(docs per chunk, chunks added whole, row_group_rows, shard_rows). Chunks hold up to ~120
    rows, fewer where the shards or row groups are tiny: a chunk then still spans several of
    them, but an example writes tens of files and row groups, not hundreds (1-row shards of
    5 x 120 rows wrote 600 files twice: 16 s for one example, 94 s for the test in CI)."""
    row_group = draw(st.integers(1, 9))
    shard_rows = draw(st.integers(1, 120))
    most = min(150, 8 * shard_rows, 40 * row_group)
    docs = draw(st.lists(st.integers(1, most), min_size=1, max_size=5))
    return docs, draw(st.sets(st.integers(0, 4))), row_group, shard_rows


@settings(max_examples=40, deadline=None)
@given(drawn=writes())
def test_shard_writer_on_two_threads_writes_the_bytes_of_one(tmp_path_factory, drawn):
    docs, whole, row_group, shard_rows = drawn
    chunks = [chunk(n, seed=n + i, index=i) for i, n in enumerate(docs)]
    config = ShardConfig(shard_rows=shard_rows, row_group_rows=row_group)
    one = write_chunks(tmp_path_factory.mktemp("t") / "one", chunks, config, 1, whole)
    two = write_chunks(tmp_path_factory.mktemp("t") / "two", chunks, config, 2, whole)
    assert two[:2] == one[:2]  # the infos (rows, tokens, bytes, sha256) and every byte
    assert not one[2]
    for info in two[0]:
        assert hashlib.sha256(two[1][info.file]).hexdigest() == info.sha256
    # the first chunk starts a shard with nothing pending: it splits when it brings two row
    # groups of that shard (PARALLEL_GROUPS = 2), its last one whole or the shard's end
    n = chunks[0].num_rows
    if 0 not in whole and (shard_rows > row_group if n >= shard_rows else n >= 2 * row_group):
        assert two[2] and two[2][0][0] == 0
    for start, middle, stop in two[2]:
        assert start < middle < stop and (middle - start) % row_group == 0
    assert not [t for t in threading.enumerate() if t.name.startswith("packtool-shard")]


def test_a_split_part_takes_the_rows_that_follow_and_abort_leaves_nothing(tmp_path: Path):
    config = ShardConfig(shard_rows=1000, row_group_rows=4)
    writer = ShardWriter(tmp_path, lambda k: f"s{k}.parquet", config, threads=2)
    rows = chunk(200, seed=1, index=0)
    assert rows.num_rows >= 4 * 4
    writer.add_rows(rows)  # whole row groups on two threads, the last few rows pending
    assert len(writer._parts) == 2
    writer.add(chunk(30, seed=2, index=1).table())  # into the second part
    assert len(writer._parts) == 2
    writer.abort()
    assert list(tmp_path.iterdir()) == []
    assert not [t for t in threading.enumerate() if t.name.startswith("packtool-shard")]


@pytest.mark.parametrize("lane", ["first", "second"])
def test_an_error_in_either_thread_reaches_the_caller_and_leaves_no_part(tmp_path, lane):
    config = ShardConfig(shard_rows=1000, row_group_rows=4)
    rows = chunk(200, seed=3, index=0)
    block = rows.block

    def failing(start, stop):
        # the first half's rows are gathered by `blocks`' thread, the second's by the other
        second = threading.current_thread().name.startswith("packtool-shard")
        if second == (lane == "second") and start >= 8:
            raise OSError(f"disk full in the {lane} thread")
        return block(start, stop)

    rows.block = failing
    writer = ShardWriter(tmp_path, lambda k: f"s{k}.parquet", config, threads=2)
    with pytest.raises(OSError, match=f"the {lane} thread"):
        writer.add_rows(rows)
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_one_partition_run_writes_on_two_threads_with_the_bytes_of_one(tmp_path, monkeypatch):
    """The local engine's in-process partition uses the two-thread writer; the dataset is the
    one a single writer gives (the split turned off by a row-group minimum no run has)."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    corpus = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"
    splits = []
    two_parts = ShardWriter._two_parts

    def spy(self, rows, start, middle, stop):
        splits.append((self.threads, stop - start))
        return two_parts(self, rows, start, middle, stop)

    monkeypatch.setattr(ShardWriter, "_two_parts", spy)

    def run(out: Path) -> dict[str, bytes]:
        config = RunConfig(
            inputs=(str(corpus),),
            out_dir=str(out),
            pack=PackConfig(max_len=512),
            shards=ShardConfig(shard_rows=1000, row_group_rows=32),
            progress=False,
        )
        run_pack(config)
        return {p.name: p.read_bytes() for p in sorted(out.iterdir())}

    two = run(tmp_path / "two")
    assert splits and all(threads == 2 for threads, _ in splits)
    monkeypatch.setattr(ShardWriter, "PARALLEL_GROUPS", 10**9)
    splits.clear()
    one = run(tmp_path / "one")
    assert not splits
    index = "index.json"
    assert {k: v for k, v in one.items() if k != index} == {
        k: v for k, v in two.items() if k != index
    }
    assert one[index].replace(b"/one", b"/two") == two[index]


def one_writer(folder: Path, rows, config: ShardConfig):
    """The infos of `rows` written into `folder` by one thread."""
    folder.mkdir()
    writer = ShardWriter(folder, lambda k: f"s{k}.parquet", config)
    writer.add_rows(rows)
    return writer.close()


def test_a_footer_the_join_refuses_is_written_again_by_one_writer(tmp_path, monkeypatch):
    import packtool.dataset.shards as shards

    def refuse(parts):
        raise StitchError("refused for the test")

    config = ShardConfig(shard_rows=1000, row_group_rows=4)
    rows = chunk(200, seed=4, index=0)
    expected = one_writer(tmp_path / "one", rows, config)
    monkeypatch.setattr(shards, "stitched_footer", refuse)
    (tmp_path / "two").mkdir()
    two = ShardWriter(tmp_path / "two", lambda k: f"s{k}.parquet", config, threads=2)
    two.add_rows(rows)
    assert len(two._parts) == 2  # split, then refused at the join
    assert two.close() == expected
    assert [p.name for p in (tmp_path / "two").iterdir()] == ["s0.parquet"]
    assert (tmp_path / "two" / "s0.parquet").read_bytes() == (
        tmp_path / "one" / "s0.parquet"
    ).read_bytes()


def test_parts_are_appended_without_copy_file_range_too(tmp_path, monkeypatch):
    import packtool.dataset.shards as shards

    config = ShardConfig(shard_rows=1000, row_group_rows=4)
    rows = chunk(200, seed=5, index=0)
    expected = one_writer(tmp_path / "one", rows, config)

    def unsupported(*args):
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(shards.os, "copy_file_range", unsupported)
    (tmp_path / "two").mkdir()
    two = ShardWriter(tmp_path / "two", lambda k: f"s{k}.parquet", config, threads=2)
    two.add_rows(rows)
    assert two.close() == expected


@pytest.mark.parametrize("where", ["hash", "rename"])
@pytest.mark.parametrize("threads", [1, 2])
def test_abort_after_a_failed_close_leaves_nothing_and_raises_nothing(
    tmp_path, monkeypatch, threads, where
):
    import packtool.dataset.shards as shards

    def failing(*args):
        raise OSError(5, "Input/output error")

    # Threads of other tests' objects (a loader's decode pool) may still be alive: only this
    # writer's own threads must be gone.
    before = {t for t in threading.enumerate() if t.name.startswith("packtool-")}
    config = ShardConfig(shard_rows=1000, row_group_rows=4)
    writer = ShardWriter(tmp_path, lambda k: f"s{k}.parquet", config, threads=threads)
    writer.add_rows(chunk(200, seed=6, index=0))
    assert len(writer._parts) == threads
    if where == "hash":  # the close's last read of the shard (its hash then closes itself)
        monkeypatch.setattr(shards._RunningHash, "_read_to", failing)
    else:
        monkeypatch.setattr(shards, "_finish", failing)
    with pytest.raises(OSError, match="Input/output error"):
        writer.close()
    writer.abort()  # closing what the failed close already closed is nothing
    assert list(tmp_path.iterdir()) == []
    assert not {t for t in threading.enumerate() if t.name.startswith("packtool-")} - before
