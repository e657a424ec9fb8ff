"""FlatIds: gathering segments chunk by chunk equals gathering from the concatenated column."""

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import DataError
from packtool.pack.flat_ids import FlatIds, rechunk


def _chunked(docs_per_chunk: list[list[list[int]]]) -> pa.ChunkedArray:
    kind = pa.list_(pa.uint16())
    return pa.chunked_array([pa.array(c, type=kind) for c in docs_per_chunk], type=kind)


def test_hand_checked_three_chunks():
    col = _chunked([[[1, 2, 3], [4]], [], [[5, 6], [7, 8, 9]]])
    ids = FlatIds(col)
    assert ids.doc_start.tolist() == [0, 3, 4, 6, 9]
    # segments: doc 3's last two tokens, doc 0's first two, doc 1, doc 2
    got = ids.gather([7, 0, 3, 4], [2, 2, 1, 2])
    assert got.dtype == np.uint16 and got.tolist() == [8, 9, 1, 2, 4, 5, 6]


def test_slices_keep_their_own_ids():
    # rechunk hands over slices: their offsets point into the middle of the child array
    whole = pa.array([[1, 2], [3, 4, 5], [6], [7, 8]], type=pa.list_(pa.uint32()))
    col = pa.chunked_array([whole.slice(1, 2), whole.slice(3)])
    ids = FlatIds(col)
    combined = col.combine_chunks()
    assert ids.doc_start.tolist() == combined.offsets.to_pylist()
    assert ids.gather([0, 3, 4], [3, 1, 2]).tolist() == [3, 4, 5, 6, 7, 8]


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.lists(st.integers(0, 60000), max_size=6), max_size=4), max_size=5),
    st.randoms(use_true_random=False),
    st.integers(0, 3),
)
def test_gather_matches_concatenation(chunks, rnd, cut):
    col = _chunked(chunks)
    if len(col) > cut:  # a slice, as rechunk makes them
        col = col.slice(cut)
    ids = FlatIds(col)
    combined = col.combine_chunks()
    offsets = combined.offsets.to_numpy().astype(np.int64)
    flat = combined.values.to_numpy()
    assert ids.doc_start.tolist() == offsets.tolist()
    # random pieces of random documents, in random order (as packed rows take them)
    src, lengths = [], []
    for d in rnd.sample(range(len(col)), len(col)) if len(col) else []:
        a, b = int(offsets[d]), int(offsets[d + 1])
        s = rnd.randint(a, b)
        src.append(s)
        lengths.append(rnd.randint(0, b - s))
    got = ids.gather(np.array(src, np.int64), np.array(lengths, np.int64))
    expected = [int(v) for s, n in zip(src, lengths, strict=True) for v in flat[s : s + n]]
    assert got.tolist() == expected


def test_a_segment_across_chunks_is_refused():
    ids = FlatIds(_chunked([[[1, 2]], [[3, 4]]]))
    with pytest.raises(ValueError, match="outside"):
        ids.gather([1], [2])


def test_null_ids_are_refused_when_read():
    col = pa.chunked_array([pa.array([[1, None]], type=pa.list_(pa.uint16()))])
    ids = FlatIds(col)  # building it reads no id
    with pytest.raises(DataError, match="null token ids"):
        ids.gather([0], [1])


def test_a_non_list_column_is_refused():
    with pytest.raises(DataError, match="list column"):
        FlatIds(pa.chunked_array([pa.array([1, 2])]))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=40),
    st.lists(st.integers(1, 8), min_size=1, max_size=6),
    st.sampled_from(["split", "truncate"]),
    st.booleans(),
)
def test_pack_table_of_batches_equals_pack_table_of_one_array(lengths, cuts, policy, carry):
    """What the worker packs (the batches as chunks, a carried tail first) is byte for byte
    what packing the concatenated table gives."""
    from packtool.pack.chunk import PackConfig, pack_table
    from packtool.pack.tail import TailPolicy

    ids = [[(d * 7 + t) % 250 for t in range(n)] for d, n in enumerate(lengths)]
    table = pa.table(
        {
            "doc_id": pa.array(np.arange(len(lengths)), pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "length": pa.array(lengths, pa.int32()),
        }
    )
    batches, start = [], 0
    for n in cuts * len(lengths):
        if start >= len(lengths):
            break
        batches.append(table.slice(start, n))
        start += n
    chunked = pa.concat_tables(batches)
    assert chunked.column("input_ids").num_chunks == len(batches)
    config = PackConfig(max_len=16, long_docs=policy)
    first = pack_table(table, config, tail=TailPolicy(max_rows=3))
    tail = first.tail if carry else None
    one = pack_table(table, config, chunk_index=(0, 1), carry=tail, tail=TailPolicy())
    many = pack_table(chunked, config, chunk_index=(0, 1), carry=tail, tail=TailPolicy())
    assert many.table.equals(one.table) and many.counts == one.counts
    assert (many.tail is None) == (one.tail is None)
    if one.tail is not None:
        assert many.tail.equals(one.tail.combine_chunks())


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 50), max_size=8), max_size=6),
    st.integers(1, 10),
    st.one_of(st.none(), st.integers(1, 120)),
)
def test_rechunk_by_documents_and_tokens(batches, chunk_docs, max_tokens):
    """The tail tree reads its children's pieces in tables of `chunk_docs` rows and, since a
    root at --max-len 2^24 could hold 64 x 32 rows of 2^24 tokens, of at most `max_tokens`
    tokens (a table holds one row at least): every row once, in order; each table as long as
    both bounds allow."""
    tables = [
        pa.table({"length": pa.array(b, pa.int32()), "i": pa.array(range(len(b)), pa.int64())})
        for b in batches
    ]
    out = list(rechunk(iter(tables), chunk_docs, max_tokens))
    flat = [n for b in batches for n in b]
    assert [n for t in out for n in t.column("length").to_pylist()] == flat
    sizes = [t.num_rows for t in out]
    lengths = [t.column("length").to_pylist() for t in out]
    for k, (rows, ls) in enumerate(zip(sizes, lengths, strict=True)):
        assert 1 <= rows <= chunk_docs
        if max_tokens is not None:
            assert sum(ls) <= max_tokens or rows == 1
        if k + 1 < len(out):  # not the last: the next row would break a bound
            nxt = lengths[k + 1][0]
            full = rows == chunk_docs
            assert full or (max_tokens is not None and sum(ls) + nxt > max_tokens)
    if max_tokens is None:
        assert sizes == [chunk_docs] * (len(flat) // chunk_docs) + (
            [len(flat) % chunk_docs] if len(flat) % chunk_docs else []
        )
