"""Parquet parts written apart and stitched are byte for byte what one writer writes."""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.parquet_stitch import StitchError, parse_footer, stitch, write_footer
from packtool.shards import ShardConfig, ShardWriter, _writer_options


def packed(n_rows: int, seed: int = 0) -> pa.Table:
    """About `n_rows` packed rows in the shard schema (`pack_table` on random documents)."""
    from packtool.pack import PackConfig, pack_table

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


@settings(max_examples=25, deadline=None)
@given(
    adds=st.lists(st.integers(1, 120), min_size=1, max_size=6),
    row_group=st.integers(1, 9),
    shard_rows=st.integers(5, 200),
)
def test_shard_writer_on_two_threads_writes_the_same_bytes(adds, row_group, shard_rows):
    table = packed(sum(adds), seed=len(adds))
    config = ShardConfig(shard_rows=shard_rows, row_group_rows=row_group)
    outputs = []
    for threads in (1, 2):
        out = Path(tempfile.mkdtemp(prefix=f"stitch-t{threads}-"))
        writer = ShardWriter(out, lambda k: f"shard-{k:05d}.parquet", config, threads=threads)
        start = 0
        for n in adds:  # chunks of several sizes, as a partition's chunks come
            writer.add(table.slice(start, n))
            start += n
        infos = writer.close()
        outputs.append((infos, {p.name: p.read_bytes() for p in sorted(out.iterdir())}))
        shutil.rmtree(out)
    assert outputs[0] == outputs[1]
    assert not [n for n in outputs[1][1] if n.startswith(".")]  # no part left behind


def test_two_threads_split_a_large_add_and_abort_leaves_nothing(tmp_path: Path):
    config = ShardConfig(shard_rows=1000, row_group_rows=10)
    writer = ShardWriter(tmp_path, lambda k: f"s{k}.parquet", config, threads=2)
    writer.add(packed(95))  # 9 full row groups: two parts on two threads
    assert len(writer._parts) == 2
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_a_one_partition_run_writes_on_two_threads_with_the_bytes_of_one(tmp_path, monkeypatch):
    """The local engine's in-process partition uses the two-thread writer; the dataset is the
    one a single writer gives (the split is forced off by a row-group minimum no drain has)."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack import PackConfig

    corpus = Path(__file__).resolve().parents[2] / "sample_data" / "corpus.jsonl"
    splits = []
    write_part = ShardWriter._write_part

    def spy(self, path, groups):
        splits.append((self.threads, len(groups)))
        return write_part(self, path, groups)

    monkeypatch.setattr(ShardWriter, "_write_part", spy)

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
    assert len(splits) > len({p for p in two if p.startswith("shard-")})  # parts were joined
    monkeypatch.setattr(ShardWriter, "PARALLEL_GROUPS", 10**9)
    assert run(tmp_path / "one") == two


def test_a_footer_the_join_refuses_is_written_again_by_one_writer(tmp_path, monkeypatch):
    import packtool.shards as shards

    def refuse(parts):
        raise StitchError("refused for the test")

    config = ShardConfig(shard_rows=1000, row_group_rows=10)
    table = packed(95)
    one = ShardWriter(tmp_path / "one", lambda k: f"s{k}.parquet", config)
    (tmp_path / "one").mkdir()
    one.add(table)
    expected = one.close()
    monkeypatch.setattr(shards, "stitched_footer", refuse)
    (tmp_path / "two").mkdir()
    two = ShardWriter(tmp_path / "two", lambda k: f"s{k}.parquet", config, threads=2)
    two.add(table)
    assert len(two._parts) == 2  # split, then refused at the join
    assert two.close() == expected
    assert [p.name for p in (tmp_path / "two").iterdir()] == ["s0.parquet"]
    assert (tmp_path / "two" / "s0.parquet").read_bytes() == (
        tmp_path / "one" / "s0.parquet"
    ).read_bytes()
