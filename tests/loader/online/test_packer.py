"""OnlinePacker: exact rows on tiny streams, property tests (exactly once, bounds, determinism)."""

from __future__ import annotations

import copy
import re
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loader.online.packer import (
    OnlineConfig,
    OnlinePacker,
    PackedRows,
    PackerClosedError,
    RowBatcher,
    bucketed_assign,
)
from loader.online.state import LATER_KEYS, loaded
from loader.online.streaming import StreamingPackedDataset
from packtool.errors import ConfigError, DataError
from tests.loader.conftest import damaged_states, negative_states


def docs_of(lengths: list[int], start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids = global token positions, so every token is unique and traceable."""
    lengths = np.asarray(lengths, np.int64)
    return np.arange(start, start + int(lengths.sum()), dtype=np.int64), lengths


def rows_as_lists(rows: PackedRows) -> list[list[list[int]]]:
    out = []
    for r in range(rows.n_rows):
        row = rows.row(r)
        toks, lens = row.tokens, row.doc_lens
        cut = np.cumsum(lens)[:-1]
        out.append([d.tolist() for d in np.split(toks, cut)])
    return out


def test_tiny_stream_exact_rows() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.0, shuffle_rows=False)
    p.push(*docs_of([5, 3, 4, 2]))
    rows = p.pop()
    # FFD: 5 -> row 0, 4 -> row 1, 3 -> row 0, 2 -> row 1
    assert rows_as_lists(rows) == [
        [[0, 1, 2, 3, 4], [5, 6, 7]],
        [[8, 9, 10, 11], [12, 13]],
    ]
    assert rows.doc_ids.tolist() == [0, 1, 2, 3]
    p.flush()
    assert p.pop().n_rows == 0
    assert p.stats["rows"] == 2 and p.stats["tokens_out"] == 14


def test_underfilled_rows_stay_open_until_flush() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=1.0, shuffle_rows=False)
    p.push(*docs_of([5, 3, 4, 2]))
    # row [4, 2] holds 6 < 8 tokens: back into the buffer
    assert rows_as_lists(p.pop()) == [[[0, 1, 2, 3, 4], [5, 6, 7]]]
    assert p.buffered == (2, 6)
    p.push(*docs_of([2], start=14))
    assert p.pop().n_rows == 0
    p.push(*docs_of([1], start=16))
    # buffer [4, 2, 2, 1]: 4 + 2 + 2 fill a row, the 1 waits
    assert rows_as_lists(p.pop()) == [[[8, 9, 10, 11], [12, 13], [14, 15]]]
    assert p.buffered == (1, 1)
    p.flush()
    last = p.pop()
    assert rows_as_lists(last) == [[[16]]] and last.doc_ids.tolist() == [5]
    s = p.stats
    assert s["rows_held_back"] == 2 and s["flushes"] == 1 and s["stream_closed"]
    assert s["tokens_in"] == s["tokens_out"] == 17
    with pytest.raises(PackerClosedError, match="closed"):
        p.push(*docs_of([1]))


def test_online_md_lists_every_stats_key() -> None:
    # docs/online.md's list left out documents_unsupervised and tokens_supervised.
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "online.md").read_text("utf-8")
    listed = re.search(r"`stats` keys[^:]*: (.*?)\n\n", doc, re.S)
    assert listed, "docs/online.md: no `stats` keys list"
    p = OnlinePacker(max_len=8, buffer_docs=4)
    assert re.findall(r"`(\w+)`", listed.group(1)) == list(p.stats)


def test_held_rows_are_forced_out_after_max_holds() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=1.0, max_holds=1, shuffle_rows=False)
    p.push_lengths(np.array([6, 1, 7, 1]))  # rows [7, 1] (full) and [6, 1] (held once)
    assert p.pop().seg_len.tolist() == [7, 1]
    p.push_lengths(np.array([8, 8]))
    rows = p.pop()
    # [6, 1] was held once already: out with its 7-token row
    assert rows.seg_len.tolist() == [8, 8, 6, 1] and rows.n_rows == 3
    assert p.stats["rows_forced"] == 1 and p.buffered == (0, 0)


def test_long_documents_follow_the_policy() -> None:
    toks, lens = docs_of([10, 0, 3])
    for policy, expect_out, trunc, dropped in [
        ("split", 13, 0, 0),
        ("truncate", 7, 6, 0),
        ("drop", 3, 0, 10),
    ]:
        p = OnlinePacker(max_len=4, buffer_docs=100, long_docs=policy, shuffle_rows=False)
        p.push(toks, lens)
        p.flush()
        rows = p.pop()
        s = p.stats
        assert s["documents_empty"] == 1
        assert s["tokens_out"] == expect_out == int(rows.seg_len.sum())
        assert s["tokens_truncated"] == trunc and s["tokens_dropped"] == dropped
        assert s["tokens_in"] == s["tokens_out"] + trunc + dropped
    p = OnlinePacker(max_len=4, buffer_docs=100, long_docs="split", shuffle_rows=False)
    p.push(toks, lens)
    p.flush()
    rows = p.pop()
    split = sorted(zip(rows.doc_ids.tolist(), rows.doc_chunks.tolist(), strict=True))
    assert split == [(0, 0), (0, 1), (0, 2), (2, 0)]


def test_bucketed_assignment_two_levels() -> None:
    # bucket 4, max_len 8: lengths 3,3 round to 4 -> one level-one row of two; 7 rounds to 8 ->
    # a row of its own; the 1 fills a gap across buckets.
    row, offset, n_rows = bucketed_assign(np.array([3, 7, 3, 1]), 8, 4)
    assert n_rows == 2
    assert row.tolist() == [1, 0, 1, 0]
    assert offset.tolist() == [0, 0, 3, 7]


def test_batches_use_the_loader_format() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.0, shuffle_rows=False)
    source = [np.arange(n) + 100 for n in (5, 3, 4, 2, 6)]
    batches = list(p.batches(iter(source), rows_per_batch=2))
    assert len(batches) == 2
    b = batches[0]
    assert b["cu_seqlens"].dtype == torch.int32 and b["cu_seqlens"].tolist() == [0, 5, 8, 12, 14]
    assert b["input_ids"].dtype == torch.int64
    assert b["position_ids"].tolist()[:8] == [0, 1, 2, 3, 4, 0, 1, 2]
    assert b["labels"][4].item() == -100 and b["labels"][0].item() == 101
    assert b["max_seqlen"] == 5 and b["doc_ids"].tolist() == [0, 1, 2, 3]
    assert batches[1]["doc_ids"].tolist() == [4]


def test_row_batcher_token_budget() -> None:
    rows = PackedRows(
        np.array([0, 1, 2, 3, 4]), np.array([5, 4, 3, 8]), np.arange(4), np.zeros(4, np.int32), None
    )
    rb = RowBatcher(max_len=8, tokens_per_batch=9)
    rb.add(rows)
    got = [b.seg_len.tolist() for b in rb.ready(final=True)]
    assert got == [[5, 4], [3], [8]]
    with pytest.raises(ConfigError, match="exactly one"):
        RowBatcher(max_len=8)


def test_unknown_collate_kwargs_are_refused_when_the_dataset_is_made(tmp_path) -> None:
    # a TypeError at the first batch, before
    from tests.cli import run

    (tmp_path / "c.jsonl").write_text('{"text": "a document"}\n')
    assert run("tokenize", tmp_path / "c.jsonl", "-o", tmp_path / "t.parquet")[0] == 0
    with pytest.raises(ConfigError, match=r"collate_kwargs \['bogus'\] unknown; loader.collate"):
        StreamingPackedDataset(
            [tmp_path / "t.parquet"], max_len=64, rows_per_batch=2, collate_kwargs={"bogus": 1}
        )


def test_collate_values_past_int64_are_refused_before_the_first_batch() -> None:
    # pad_id=2**63 passed the check (a lower bound only) and the first batch raised
    # "OverflowError: Python int too large to convert to C long" from collate's fill.
    packer = OnlinePacker(OnlineConfig(max_len=8))
    for name, extra in (("pad_id", {"pad_tokens": 8}), ("position_limit", {})):
        with pytest.raises(ConfigError, match=f"^collate_kwargs {name} must be an integer from"):
            packer.batches(iter([np.array([1, 2, 3])]), rows_per_batch=1, **extra, **{name: 2**63})


def test_a_token_budget_below_max_len_is_refused() -> None:
    # rows longer than the budget went alone: every batch of a 512-token stream ran over 100
    with pytest.raises(ConfigError, match="tokens_per_batch 10 is smaller than max_len 64"):
        list(OnlinePacker(max_len=64).batches([[1] * 60] * 3, tokens_per_batch=10))
    with pytest.raises(ConfigError, match="tokens_per_batch 100 is smaller than max_len 512"):
        StreamingPackedDataset(["unused.parquet"], max_len=512, tokens_per_batch=100)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_len": 1}, "max_len must be an integer >= 2, got 1"),
        ({"max_len": 2**24 + 1}, "max_len 16777217 is too large"),
        ({"max_len": 8, "buffer_docs": 0}, "buffer_docs"),
        ({"max_len": 8, "strategy": "lpt"}, "strategy"),
        ({"max_len": 8, "min_fill": 1.5}, "min_fill"),
        ({"max_len": 8, "long_docs": "cut"}, "long_docs"),
        ({"max_len": 8, "buffer_seconds": 0}, "buffer_seconds"),
        ({"max_len": 8, "buffer_tokens": 0}, "buffer_tokens"),
        ({"max_len": 8, "seed": -1}, "seed"),
        # each was accepted as true, or a message of Python's own naming no setting
        ({"max_len": 8, "shuffle_rows": "no"}, "shuffle_rows must be True or False, got 'no'"),
        ({"max_len": 8, "min_fill": "x"}, "min_fill must be a number, got 'x'"),
        ({"max_len": 8, "buffer_seconds": "x"}, "buffer_seconds must be a number, got 'x'"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OnlineConfig(**kwargs)


def test_values_a_cast_would_change_are_refused() -> None:
    with pytest.raises(ConfigError, match="seed_key entries must be an integer >= 0, got 'a'"):
        OnlinePacker(max_len=8, seed_key=("a",))
    p = OnlinePacker(max_len=8)
    with pytest.raises(DataError, match="doc_ids must be integers, got dtype float64"):
        p.push(np.arange(4), np.array([2, 2]), doc_ids=[1.5, 1.7])  # both were document 1
    p = OnlinePacker(max_len=8, long_docs="truncate")
    for bad in (0.5, np.nan):  # each was 0: the document dropped as unsupervised
        with pytest.raises(DataError, match="loss_mask values must be whole numbers"):
            p.push(np.arange(2), np.array([2]), loss_mask=np.array([1.0, bad]))
    p.push(np.arange(2), np.array([2]), loss_mask=np.array([1.0, 0.0]))  # whole floats: fine


def test_bad_input_is_reported() -> None:
    p = OnlinePacker(max_len=8)
    with pytest.raises(DataError, match="sum to"):
        p.push(np.arange(3), np.array([2, 2]))
    with pytest.raises(DataError, match="negative"):
        p.push(np.arange(0), np.array([-1, 1]))
    with pytest.raises(DataError, match="input_ids"):
        p.push_table(pa.table({"x": [1]}))
    # Before: AttributeError: 'dict' object has no attribute 'schema'
    with pytest.raises(
        DataError, match="push_table takes a pyarrow Table or RecordBatch, got dict"
    ):
        p.push_table({"input_ids": [[1, 2]]})
    p.push_table(pa.record_batch({"input_ids": [[1, 2]]}))


def test_negative_ids_null_rows_and_tables_of_empty_documents() -> None:
    """From the online audit: negative doc_ids were taken (verify refuses them in a dataset), a
    null input_ids row was read as an empty document without a word, and a table of only empty
    documents (list<null>) made the buffer's dtype object, so a state taken after it was
    refused as damaged when loaded."""
    p = OnlinePacker(max_len=8)
    with pytest.raises(DataError, match="doc_ids must be >= 0, got -3"):
        p.push(np.arange(4), np.array([2, 2]), doc_ids=np.array([5, -3]))
    # Before: "doc_ids must be >= 0, got -9223372036854775803" (wrapped by the cast to int64)
    with pytest.raises(DataError, match=r"doc_ids must be <= 2\^63-1 \(int64\), got 922337203"):
        p.push(np.arange(3), [3], doc_ids=np.array([2**63 + 5], np.uint64))
    with pytest.raises(DataError, match="1 doc_ids for 2 documents"):  # was a TypeError
        p.push(np.arange(4), np.array([2, 2]), doc_ids=7)
    fits = OnlinePacker(max_len=8)
    fits.push(np.arange(3), [3], doc_ids=np.array([2**63 - 1], np.uint64))  # the largest id
    fits.flush()
    assert fits.pop().doc_ids.tolist() == [2**63 - 1]
    with pytest.raises(DataError, match="input_ids of row 1 is null"):
        p.push_table(pa.table({"input_ids": pa.array([[1, 2], None], pa.list_(pa.int64()))}))
    # Before: "token ids must be integers, got dtype float64" (the null read as NaN)
    with pytest.raises(DataError, match="input_ids of row 2 holds a null token id"):
        p.push_table(pa.table({"input_ids": [[1], [2, 3], [4, None, 5]]}).slice(0, 3))
    with pytest.raises(DataError, match="input_ids of row 0 holds a null token id"):
        p.push_table(pa.table({"input_ids": [[7], [4, None]]}).slice(1))
    p.push_table(pa.table({"input_ids": [[], []]}))  # list<null>
    p.push_table(pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int64()))}))
    again = OnlinePacker(max_len=8)
    again.load_state_dict(copy.deepcopy(p.state_dict()))
    p.flush()
    again.flush()
    assert p.stats == again.stats and p.stats["documents_empty"] == 2
    assert p.pop().tokens.tolist() == again.pop().tokens.tolist() == [1, 2, 3]


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    skip=st.integers(0, 3),
    masked=st.booleans(),
)
@example(lengths=[0, 2, 0], skip=0, masked=False)
def test_zero_length_rows_of_a_table_are_counted_empty_documents(lengths, skip, masked) -> None:
    """`push_table` rows whose `input_ids` is an empty list (not null) are skipped and counted
    as `documents_empty`, as `pack` counts an empty document: every other row comes out whole
    under its own `doc_id` (a sliced table too), and documents_in = packed + empty."""
    if masked:  # a one-token document holds no target (its token predicts nothing): dropped
        lengths = [2 if n == 1 else n for n in lengths]
    rng = np.random.default_rng(len(lengths) * 7 + skip)
    docs = [rng.integers(1, 200, n).tolist() for n in lengths]
    ids = list(range(100, 100 + len(docs)))
    columns = {
        "input_ids": pa.array(docs, pa.list_(pa.int32())),
        "doc_id": pa.array(ids, pa.int64()),
    }
    if masked:
        columns["loss_mask"] = pa.array([[1] * n for n in lengths], pa.list_(pa.uint8()))
    table = pa.table(columns).slice(min(skip, len(docs) - 1))
    lengths, docs, ids = (x[min(skip, len(x) - 1) :] for x in (lengths, docs, ids))
    p = OnlinePacker(max_len=8, buffer_docs=100, shuffle_rows=False, long_docs="truncate")
    p.push_table(table)
    p.flush()
    rows = p.pop()
    kept = {i: d for i, d, n in zip(ids, docs, lengths, strict=True) if n}
    s = p.stats
    assert s["documents_empty"] == lengths.count(0)
    assert s["documents_in"] == len(lengths) == s["documents_packed"] + s["documents_empty"]
    assert s["tokens_in"] == s["tokens_out"] == sum(lengths)
    got = dict(zip(rows.doc_ids.tolist(), rows_docs(rows), strict=True)) if kept else {}
    assert got == kept


def rows_docs(rows: PackedRows) -> list[list[int]]:
    """Each document's tokens, in the rows' document order."""
    cut = np.cumsum(rows.seg_len)[:-1]
    return [part.tolist() for part in np.split(np.asarray(rows.tokens), cut)]


def test_a_table_whose_length_column_disagrees_with_input_ids_is_refused() -> None:
    """Before: input_ids [[1, 2], [3]] with length [5, 1] was packed without a word (push()
    refuses lengths that do not match the tokens; a damaged length column passed here)."""
    p = OnlinePacker(max_len=8)
    ids = pa.array([[1, 2], [3], [4, 5, 6]], pa.list_(pa.int64()))
    with pytest.raises(
        DataError, match=r"^input_ids of row 0 holds 2 tokens but its length column says 5$"
    ):
        p.push_table(pa.table({"input_ids": ids, "length": pa.array([5, 1, 3], pa.int32())}))
    with pytest.raises(DataError, match="input_ids of row 1 holds 3 tokens but its length"):
        p.push_table(
            pa.table({"input_ids": ids, "length": pa.array([2, 1, 2], pa.int32())}).slice(1)
        )
    with pytest.raises(
        DataError, match="input_ids of row 1 holds 1 token but its length column is null"
    ):
        p.push_table(pa.table({"input_ids": ids, "length": pa.array([2, None, 3], pa.int32())}))
    assert p.stats["documents_in"] == 0  # a refused table adds nothing
    p.push_table(pa.table({"input_ids": ids, "length": pa.array([2, 1, 3], pa.int32())}).slice(1))
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == [3, 4, 5, 6]


def test_time_window_packs_without_a_full_buffer() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=1000, buffer_seconds=0.01, min_fill=0.0)
    p.push_lengths(np.array([3]))
    import time

    time.sleep(0.03)
    p.poll()
    assert p.pop().n_rows == 1


# ---- properties ---------------------------------------------------------------------------


def run_packer(lengths, chunks, **cfg) -> tuple[PackedRows, dict]:
    toks, lens = docs_of(lengths)
    p = OnlinePacker(**cfg)
    starts = np.r_[0, np.cumsum(lens)]
    cuts = sorted({0, len(lens), *[c % (len(lens) + 1) for c in chunks]})
    for a, b in zip(cuts[:-1], cuts[1:], strict=True):
        p.push(toks[starts[a] : starts[b]], lens[a:b], np.arange(a, b))
    p.flush()
    return p.pop(), p.stats


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), max_size=60),
    chunks=st.lists(st.integers(0, 60), max_size=4),
    max_len=st.integers(2, 16),
    buffer_docs=st.integers(1, 12),
    buffer_tokens=st.one_of(st.none(), st.integers(1, 60)),
    min_fill=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    policy=st.sampled_from(["split", "truncate", "drop"]),
    strategy=st.sampled_from(["ffd", "bucketed"]),
    seed=st.integers(0, 3),
)
def test_every_token_once_rows_bounded_deterministic(
    lengths, chunks, max_len, buffer_docs, buffer_tokens, min_fill, policy, strategy, seed
) -> None:
    cfg = dict(
        max_len=max_len,
        buffer_docs=buffer_docs,
        buffer_tokens=buffer_tokens,
        min_fill=min_fill,
        long_docs=policy,
        strategy=strategy,
        seed=seed,
        bucket=4,
    )
    rows, stats = run_packer(lengths, chunks, **cfg)
    # rows bounded, non-empty, well formed
    assert rows.n_rows == stats["rows"]
    if rows.n_rows:
        assert rows.row_lengths.max() <= max_len and rows.row_lengths.min() >= 1
    assert (rows.seg_len >= 1).all()
    # every expected token exactly once, each segment a contiguous piece of its document
    starts = np.r_[0, np.cumsum(lengths)]
    expect = []
    for d, n in enumerate(lengths):
        if n > max_len and policy == "drop":
            continue
        keep = min(n, max_len) if policy == "truncate" else n
        expect.extend(range(starts[d], starts[d] + keep))
    toks = rows.tokens if rows.tokens is not None else np.zeros(0)
    assert sorted(toks.tolist()) == expect
    pos = 0
    for n, d, c in zip(rows.seg_len, rows.doc_ids, rows.doc_chunks, strict=True):
        seg = toks[pos : pos + n]
        assert seg.tolist() == list(range(starts[d] + c * max_len, starts[d] + c * max_len + n))
        pos += n
    assert (
        stats["tokens_in"]
        == stats["tokens_out"] + stats["tokens_truncated"] + stats["tokens_dropped"]
    )
    assert stats["documents_empty"] == sum(1 for n in lengths if n == 0)
    assert stats["segments_buffered"] == 0
    # deterministic, and independent of how the input was chunked
    again, _ = run_packer(lengths, [], **cfg)
    assert np.array_equal(again.tokens, rows.tokens)
    assert np.array_equal(again.row_docs, rows.row_docs)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=200), buf=st.integers(1, 50))
def test_plain_ffd_buffer_never_worse_than_row_bound(lengths, buf) -> None:
    # with min_fill 0 every pack is plain FFD over the buffer: at most 2*ceil(total/max_len)+1
    # rows per pack (any two first-fit rows hold more than max_len together)
    p = OnlinePacker(max_len=64, buffer_docs=buf, min_fill=0.0)
    p.push_lengths(np.array(lengths))
    p.flush()
    rows = p.pop()
    assert rows.tokens is None
    assert rows.seg_len.sum() == sum(lengths)
    assert rows.n_rows <= sum(
        2 * -(-sum(lengths[i : i + buf]) // 64) + 1 for i in range(0, len(lengths), buf)
    )


def test_float_or_negative_tokens_and_batches_of_sequences_are_refused() -> None:
    p = OnlinePacker(max_len=8)
    # Before: float ids were accepted by push() and truncated to integers when collated.
    with pytest.raises(DataError, match="token ids must be integers, got dtype float64"):
        p.push(np.array([1.5, 2.0]), np.array([2]))
    # Before: a (2, 3) array became one document of 6 tokens.
    with pytest.raises(DataError, match=r"document 1 has shape \(2, 3\)"):
        p.push_docs([[1, 2], np.ones((2, 3), np.int64)])
    # Before: negative ids went through and failed later, in the model's embedding.
    with pytest.raises(DataError, match="token ids must be >= 0, got -3"):
        p.push(np.array([1, -3, 2]), np.array([3]))
    with pytest.raises(DataError, match="document 1: token id -1 is not in 0..2"):
        p.push_docs([[1, 2], [-1]])
    p.push_docs([np.array([[4, 5, 6]])])  # (1, T), a tokenizer's batch of one, is fine
    p.flush()
    assert p.pop().tokens.tolist() == [4, 5, 6]
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) 'maxlen'; OnlineConfig takes"):
        OnlinePacker(maxlen=8)


def test_source_error_keeps_every_document_handed_over() -> None:
    def source():
        yield from ([1, 2, 3], [4, 5], [6] * 8, [7, 7])
        raise RuntimeError("source broke")

    # Before: the documents collected for the next push were dropped with the exception.
    p = OnlinePacker(max_len=8, buffer_docs=100)
    with pytest.raises(RuntimeError, match="source broke"):
        list(p.pack_stream(source()))
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == sorted([1, 2, 3, 4, 5] + [6] * 8 + [7, 7])
    # Rows packed but not yet batched go back to the packer too.
    p = OnlinePacker(max_len=8, buffer_docs=2, min_fill=0.0)
    got = []
    with pytest.raises(RuntimeError, match="source broke"):
        for b in p.batches(source(), rows_per_batch=3):
            got += b["input_ids"].tolist()
    p.flush()
    rest = p.pop().tokens.tolist()
    assert sorted(got + rest) == sorted([1, 2, 3, 4, 5] + [6] * 8 + [7, 7])
    # A bad document fails alone: the good ones before it stay in the packer.
    p = OnlinePacker(max_len=8, buffer_docs=100)
    with pytest.raises(DataError, match="document 2: token ids must be integers"):
        list(p.pack_stream([[1, 2], [3], [0.5]]))
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == [1, 2, 3]


def test_tensors_numpy_cannot_read_are_refused_as_ids() -> None:
    """Before: bfloat16 ids were a bare TypeError ("Got unsupported ScalarType BFloat16") and
    grad-tracking float ids a bare RuntimeError, from push_docs and push alike."""
    bf16 = torch.tensor([1.0, 2.0], dtype=torch.bfloat16)
    tracked = torch.ones(2, requires_grad=True)
    p = OnlinePacker(max_len=8, buffer_docs=4)
    for doc in (bf16, tracked):
        with pytest.raises(DataError, match="document 1: token ids must be integers, got"):
            p.push_docs([[1, 2], doc])
        with pytest.raises(DataError, match="^token ids must be integers, got"):
            p.push(doc, [2])
    # Integer tensors are taken as they are, copied from the caller's memory.
    ids = torch.tensor([4, 5, 6])
    p.push_docs([ids])
    p.push(ids[:2], [2])
    ids[:] = 0
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == [4, 4, 5, 5, 6]


@pytest.mark.parametrize("state", [None, {}, {"config": {}}, "x"])
def test_load_state_dict_rejects_what_is_not_a_packer_state(state) -> None:
    with pytest.raises(DataError, match="not an OnlinePacker state"):
        OnlinePacker(max_len=8).load_state_dict(state)


def test_load_state_dict_with_a_key_missing() -> None:
    p = OnlinePacker(max_len=8)
    p.push_docs([[1, 2, 3]])
    state = p.state_dict()
    del state["buffer"]
    with pytest.raises(DataError, match="missing buffer"):
        OnlinePacker(max_len=8).load_state_dict(state)


@pytest.mark.parametrize("with_tokens", [True, False])
def test_every_damaged_part_of_a_packer_state_is_a_clear_error(with_tokens) -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9)
    lengths = np.array([3, 5, 2, 7, 1, 4, 6])
    p.push(np.arange(lengths.sum()) if with_tokens else None, lengths)
    # Its arrays as numpy's (the form the checks see, and states saved before 2026-12-07 hold;
    # `state_dict()` gives torch tensors): the edits below slice and cast them as numpy does.
    state = loaded(p.state_dict())
    assert state["buffer"] is not None and state["out"] is not None  # both parts to damage
    target = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9)
    # "config" is compared, not parsed: another value is "saved with other settings".
    for name, damaged in damaged_states(state, skip=("config",), optional=LATER_KEYS):
        with pytest.raises(DataError, match=re.escape(name)):
            target.load_state_dict(damaged)
    # A state saved before optional columns existed lacks their keys, and loads.
    old = copy.deepcopy(state)
    for part in (old, old["counts"], old["buffer"], old["out"]):
        for key in LATER_KEYS & set(part):
            del part[key]
    OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9).load_state_dict(old)
    # Parts of the right type that do not fit together.
    edits = [
        ("out.row_docs", lambda s: s["out"].update(row_docs=s["out"]["row_docs"][::-1].copy())),
        ("counts.extra", lambda s: s["counts"].update(extra=1)),
        ("dtype", lambda s: s.update(dtype="<f8")),
        # Before: accepted, then "split long documents first" at the flush.
        ("buffer.length", lambda s: s["buffer"].update(length=s["buffer"]["length"] * 0 + 100)),
        # Before (these four): a negative seed_key loaded, then a bare ValueError at the next
        # pack; a 0-token segment, then "document 0 has length 0" (a ConfigError); one row of
        # every out segment (over max_len) was emitted as it was; uint64 ids past 2^63 came
        # out as negative ids.
        ("seed_key[0]", lambda s: s.update(seed_key=[-1])),
        ("buffer.length", lambda s: s["buffer"]["length"].__setitem__(0, 0)),
        ("out.seg_len", lambda s: s["out"].update(row_docs=s["out"]["row_docs"][[0, -1]])),
    ]
    if with_tokens:
        edits += [
            ("buffer.start", lambda s: s["buffer"].update(start=s["buffer"]["start"] + 100)),
            ("out.tokens", lambda s: s["out"].update(tokens=s["out"]["tokens"][:-1])),
            ("buffer.tokens", lambda s: s["buffer"].update(tokens=_past_int64(s["buffer"]))),
        ]
    else:
        edits.append(("buffer.tokens", lambda s: s["buffer"].update(tokens=np.arange(5))))
    for name, edit in edits:
        damaged = copy.deepcopy(state)
        edit(damaged)
        with pytest.raises(DataError, match=re.escape(name) + ".* the checkpoint is damaged"):
            target.load_state_dict(damaged)
    # The intact state still loads, and continues exactly.
    target.load_state_dict(state)
    for packer in (p, target):
        packer.flush()
    a, b = p.pop(), target.pop()
    assert a.seg_len.tolist() == b.seg_len.tolist() and a.doc_ids.tolist() == b.doc_ids.tolist()


@pytest.mark.parametrize("with_tokens", [True, False])
def test_a_packer_state_loads_with_torch_loads_default(with_tokens, tmp_path) -> None:
    """`torch.load` refuses numpy's arrays unless told `weights_only=False` (its default since
    torch 2.6): a checkpoint holding a packer's state failed to load as torch's documentation
    shows (until 2026-12-07). Its arrays are tensors now; it loads with the default and
    continues exactly; a state holding numpy arrays (saved before) still loads."""
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9)
    lengths = np.array([3, 5, 2, 7, 1, 4, 6])
    p.push(np.arange(lengths.sum()) if with_tokens else None, lengths)
    torch.save({"packer": p.state_dict()}, tmp_path / "ckpt.pt")
    state = torch.load(tmp_path / "ckpt.pt")["packer"]  # weights_only=True
    old = loaded(p.state_dict())
    assert isinstance(old["buffer"]["length"], np.ndarray)
    runs = []
    for s in (state, old):
        q = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9)
        q.load_state_dict(s)
        q.flush()
        rows = q.pop()
        runs.append(_rows_seen(rows))
    p.flush()
    rows = p.pop()
    assert runs[0] == runs[1] == _rows_seen(rows)
    assert len(runs[0][0]) == len(lengths)
    # A tensor of a type numpy lacks is damage named as such, not a TypeError from `.numpy()`.
    state["buffer"]["length"] = state["buffer"]["length"].to(torch.bfloat16)
    with pytest.raises(DataError, match=r"buffer\.length is an array of torch\.bfloat16 \("):
        OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9).load_state_dict(state)


def _rows_seen(rows) -> tuple:
    """Rows as lists: segment lengths, document ids, tokens (None without tokens)."""
    tokens = None if rows.tokens is None else rows.tokens.tolist()
    return rows.seg_len.tolist(), rows.doc_ids.tolist(), tokens


def _past_int64(buffer: dict) -> np.ndarray:
    return buffer["tokens"].astype(np.uint64) + np.uint64(2**63)


@pytest.mark.parametrize("with_tokens", [True, False])
def test_a_negative_value_anywhere_in_a_packer_state_is_damage(with_tokens) -> None:
    # Before: negative document or token ids loaded and came out of pop() as they were.
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9)
    lengths = np.array([3, 5, 2, 7, 1, 4, 6])
    p.push(np.arange(lengths.sum()) if with_tokens else None, lengths)
    cases = list(negative_states(p.state_dict(), skip=("config",)))
    assert {"buffer.doc", "out.doc_ids"} <= {name for name, _ in cases}
    for name, damaged in cases:
        with pytest.raises(DataError, match=re.escape(name) + ".* the checkpoint is damaged"):
            OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.9).load_state_dict(damaged)


@pytest.mark.parametrize("big", [2**63, 2**70])
def test_a_count_past_int64_in_a_packer_state_is_damage(big) -> None:
    # Before: next_doc_id 2**63 loaded, then numpy's OverflowError at the next push.
    p = OnlinePacker(max_len=8, buffer_docs=4)
    p.push_docs([[1, 2, 3]] * 5)
    for key in ("next_doc_id", "packs"):
        state = p.state_dict()
        state[key] = big
        with pytest.raises(DataError, match=f"{key} is {big}, past int64; the checkpoint is dam"):
            OnlinePacker(max_len=8, buffer_docs=4).load_state_dict(state)


def test_a_seed_key_past_int64_still_resumes() -> None:
    # The constructor takes any integer >= 0 as a seed_key entry: its state must load.
    p = OnlinePacker(max_len=8, buffer_docs=4, seed_key=(2**70,))
    p.push_docs([[1, 2, 3]] * 5)
    q = OnlinePacker(max_len=8, buffer_docs=4, seed_key=(2**70,))
    q.load_state_dict(p.state_dict())
    assert q.seed_key == (2**70,)


def test_a_config_and_keyword_settings_together_are_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"give either a config or keyword settings, not both \(\['seed'\]\)"
    ):
        OnlinePacker(OnlineConfig(max_len=8), seed=1)


@pytest.mark.parametrize("budget", [{"rows_per_batch": 1}, {"tokens_per_batch": 8}])
@pytest.mark.parametrize("taken", [1, 4])
def test_a_consumer_that_stops_early_gets_each_row_once(budget, taken) -> None:
    """The rows left after a stop go back to the packer: before, the batches already handed
    out went back too (RowBatcher trimmed its pending rows only when `ready()` finished), so
    flush() + pop() delivered them a second time."""
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.0, shuffle_rows=False)
    source = [np.arange(8) + 10 * i for i in range(10)]  # one full row each
    stream = p.batches(iter(source), **budget)
    seen = [next(stream)["doc_ids"].tolist() for _ in range(taken)]
    stream.close()
    p.flush()
    rest = p.pop()
    delivered = [d for batch in seen for d in batch] + rest.doc_ids.tolist()
    assert sorted(delivered) == list(range(10))  # each document exactly once


def test_uint64_ids_stay_exact_and_ids_past_int64_are_refused() -> None:
    """uint64 beside int64 met in float64 (2^53 + 1 came back as 2^53); an id past int64 was
    wrapped to a negative index by collate."""
    p = OnlinePacker(max_len=8, buffer_docs=100, min_fill=0.0, shuffle_rows=False)
    p.push_docs([np.array([2**53 + 1, 7], np.uint64)])
    p.push_docs([np.array([3, 4], np.int64)])
    p.push(np.array([5, 2**53 + 3], np.uint64), np.array([2]))
    p.flush()
    rows = p.pop()
    assert rows.tokens.dtype.kind in "iu"
    assert sorted(rows.tokens.tolist()) == sorted([2**53 + 1, 7, 3, 4, 5, 2**53 + 3])
    assert 2**53 + 1 in rows.collate()["input_ids"].tolist()
    with pytest.raises(DataError, match=r"document 0: token id 9223372036854775813 is not in"):
        p2 = OnlinePacker(max_len=8, buffer_docs=100)
        p2.push_docs([np.array([2**63 + 5, 1], np.uint64)])
    with pytest.raises(DataError, match="does not fit int64"):
        OnlinePacker(max_len=8).push(np.array([2**63 + 5], np.uint64), np.array([1]))


def test_a_bad_document_in_a_stream_fails_alone_and_the_others_stay() -> None:
    """A negative id was checked for the whole group of documents collected for one push, so
    the good ones collected with it were lost; and ragged or (2, 1) documents are refused."""
    p = OnlinePacker(max_len=8, buffer_docs=100, min_fill=0.0, shuffle_rows=False)
    source = [np.array([1, 2]), np.array([3]), np.array([4, 5]), np.array([-1, 6])]
    with pytest.raises(DataError, match=r"document 3: token id -1 is not in"):
        list(p.batches(iter(source), rows_per_batch=10))
    assert p.stats["documents_in"] == 3
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == [1, 2, 3, 4, 5]
    with pytest.raises(DataError, match="document 0 is not one sequence of token ids"):
        OnlinePacker(max_len=8).push_docs([[[1, 2], [3]]])
    with pytest.raises(DataError, match=r"document 0 has shape \(2, 1\)"):
        OnlinePacker(max_len=8).push_docs([np.array([[1], [2]])])


def _resumed(stream, cfg: dict, items: list, cut: int, inside: bool) -> tuple[list, list]:
    """`stream(packer, source)` run whole, and with a state taken after `cut` outputs (or, with
    `inside`, by the source as it reads item `cut`), loaded into a new packer that runs over the
    items from the first one not yet read: what came out before the state, then the new run."""
    whole = list(stream(OnlinePacker(**cfg), iter(items)))
    p = OnlinePacker(**cfg)
    got: list = []
    saved: dict = {}
    read = [0]

    def save() -> None:
        saved.update(state=copy.deepcopy(p.state_dict()), at=read[0], n=len(got))

    def source():
        for i, item in enumerate(items):
            if inside and i == cut:
                save()  # documents read before this one may be waiting to be pushed
            read[0] = i + 1
            yield item

    running = stream(p, source())
    if not inside and cut == 0:
        save()
    for out in running if not saved else ():
        got.append(out)
        if not inside and len(got) == cut:
            save()  # between two outputs
            break
    if not saved:
        save()
    q = OnlinePacker(**cfg)
    q.load_state_dict(saved["state"])
    after = list(stream(q, iter(items[saved["at"] :])))
    running.close()
    return whole, got[: saved["n"]] + after


def _items(draw_lengths: list[int], tables: list[bool]) -> list:
    """Documents (unique token ids) as arrays, some grouped into tokenized tables."""
    toks, lens = docs_of(draw_lengths)
    docs = np.split(toks, np.cumsum(lens)[:-1])
    items, group = [], []
    for doc, as_table in zip(docs, tables + [False] * len(docs), strict=False):
        if as_table:
            group.append(doc.tolist())
            continue
        if group:
            items.append(pa.table({"input_ids": pa.array(group, pa.list_(pa.int64()))}))
            group = []
        items.append(doc)
    if group:
        items.append(pa.table({"input_ids": pa.array(group, pa.list_(pa.int64()))}))
    return items


@settings(max_examples=40, deadline=None)
@example([0, 1], [], 1, True, 1, 2, {"rows_per_batch": 1})  # lost a pending document
@example([9] * 12, [], 1, False, 4, 4, {"rows_per_batch": 1})  # lost the batcher's rows
@given(
    lengths=st.lists(st.integers(0, 20), min_size=1, max_size=80),
    tables=st.lists(st.booleans(), max_size=80),
    cut=st.integers(0, 40),
    inside=st.booleans(),
    buffer_docs=st.integers(1, 12),
    docs_per_push=st.integers(1, 9),
    budget=st.sampled_from(
        [{"rows_per_batch": 1}, {"rows_per_batch": 3}, {"tokens_per_batch": 20}]
    ),
)
def test_a_state_taken_mid_stream_resumes_every_document_exactly_once(
    lengths, tables, cut, inside, buffer_docs, docs_per_push, budget
) -> None:
    """Before: documents read but not yet pushed (`pack_stream`'s pending ones) and rows packed
    but not yet batched (`batches()`'s) were in no state: 16,372 of 20,000 documents came back."""
    cfg = {"max_len": 16, "buffer_docs": buffer_docs, "long_docs": "truncate"}
    items = _items(lengths, tables)

    def rows(p, source):
        for out in p.pack_stream(source, docs_per_push=docs_per_push):
            yield [
                (out.row(r).tokens.tolist(), out.row(r).doc_ids.tolist()) for r in range(out.n_rows)
            ]

    whole, resumed = _resumed(rows, cfg, items, cut, inside)
    # the same rows in the same order (how they are grouped into outputs may differ: the
    # documents pending at the state were pushed at the load)
    assert [r for out in resumed for r in out] == [r for out in whole for r in out]

    def batches(p, source):
        for b in p.batches(source, **budget):
            yield b["input_ids"].tolist(), b["doc_ids"].tolist()

    whole, resumed = _resumed(batches, cfg, items, cut, inside)
    assert resumed == whole


def test_a_state_between_batches_holds_the_documents_read_but_not_pushed() -> None:
    # The audit's case: batches() collects 4,096 documents per push; 420 of 3,000 came back.
    docs = [np.arange(n) for n in np.random.default_rng(0).integers(1, 40, 5000)]
    cfg = {"max_len": 64, "buffer_docs": 50}

    def batches(p, source):
        for b in p.batches(source, rows_per_batch=4):
            yield b["doc_ids"].tolist()

    whole, resumed = _resumed(batches, cfg, docs, 30, False)
    assert resumed == whole
    assert sorted(d for b in resumed for d in b) == list(range(5000))


def test_a_damaged_pending_part_is_a_clear_error() -> None:
    p = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.0)
    states = []

    def source():
        yield from ([1, 2], [3])
        states.append(p.state_dict())  # by the source: two documents read, not yet pushed
        yield [4]

    list(p.pack_stream(source(), docs_per_push=4))
    state = states[0]
    assert state["pending"]["lengths"].tolist() == [2, 1]
    target = OnlinePacker(max_len=8, buffer_docs=4, min_fill=0.0)
    for name, damaged in damaged_states(state, skip=("config",), optional=LATER_KEYS):
        if name.startswith("pending"):
            with pytest.raises(DataError, match=re.escape(name)):
                target.load_state_dict(damaged)
    damaged = copy.deepcopy(state)
    damaged["pending"]["tokens"] = damaged["pending"]["tokens"][:-1]
    with pytest.raises(DataError, match=r"pending.tokens has 2 ids where the lengths need 3"):
        target.load_state_dict(damaged)
    target.load_state_dict(state)
    target.flush()
    assert target.pop().tokens.tolist() == [1, 2, 3]


def test_each_documents_loss_mask_must_match_it() -> None:
    # Before: only the total was checked: masks of 4 and 1 values for documents of 2 and 3 tokens
    # were accepted, and document 1's labels came from document 0's mask.
    p = OnlinePacker(max_len=8, long_docs="truncate")
    with pytest.raises(DataError, match="document 0: its loss mask has 4 values for 2 tokens"):
        p.push_docs([[1, 2], [3, 4, 5]], [[1, 1, 1, 1], [1]])
    p.push_docs([[1, 2], [3, 4, 5]], [[0, 1], [1, 1, 0]])
    p.flush()
    rows = p.pop()
    got = dict(zip(rows.tokens.tolist(), rows.columns["loss_mask"].tolist(), strict=True))
    assert got == {1: 0, 2: 1, 3: 1, 4: 1, 5: 0}


def test_a_caller_reusing_its_buffers_does_not_change_the_rows() -> None:
    # Before: push() kept the caller's token array (np.asarray, no copy) until the next pack, so
    # a caller refilling its buffer turned the tokens pushed as 1..5 into 99s.
    p = OnlinePacker(max_len=8, buffer_docs=100, long_docs="truncate")
    tokens, mask = np.arange(1, 6), np.ones(5, np.uint8)
    p.push(tokens, np.array([2, 3]), loss_mask=mask)
    tokens[:] = 99
    mask[:] = 0
    view = torch.arange(10, 13)  # a tensor pushed as numpy shares its memory too
    p.push(view.numpy(), np.array([3]), loss_mask=np.ones(3, np.uint8))
    view[:] = 7
    p.flush()
    rows = p.pop()
    assert sorted(rows.tokens.tolist()) == [1, 2, 3, 4, 5, 10, 11, 12]
    assert rows.columns["loss_mask"].tolist() == [1] * 8


def test_a_caller_reusing_its_token_buffer_with_doc_ids_does_not_change_the_rows() -> None:
    # Before: with doc_ids given, push() compared the tokens against the doc_ids array for
    # sharing memory, so it kept the caller's token buffer: refilled, the rows were all 999.
    p = OnlinePacker(max_len=16, buffer_docs=100, shuffle_rows=False)
    tokens = np.arange(1, 9, dtype=np.int64)
    p.push(tokens, np.array([4, 4]), doc_ids=np.array([10, 11]))
    tokens[:] = 999
    p.flush()
    rows = p.pop()
    assert rows.tokens.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert rows.doc_ids.tolist() == [10, 11]


@pytest.mark.parametrize("kind", ["numpy", "tensor", "batch of one"])
def test_a_source_reusing_its_buffer_does_not_change_the_rows(kind) -> None:
    # Before: pack_stream() and batches() kept each document's array until the next push (every
    # docs_per_push documents): a source refilling one buffer for 3 documents of 4 tokens gave
    # [3] * 12 instead of [1] * 4 + [2] * 4 + [3] * 4.
    def source():
        buf = torch.zeros(4, dtype=torch.int64) if kind == "tensor" else np.zeros(4, np.int64)
        for i in range(3):
            buf[:] = i + 1
            yield buf.reshape(1, 4) if kind == "batch of one" else buf

    expected = [1] * 4 + [2] * 4 + [3] * 4
    p = OnlinePacker(max_len=16, buffer_docs=100, shuffle_rows=False)
    assert sorted(t for r in p.pack_stream(source()) for t in r.tokens.tolist()) == expected
    p = OnlinePacker(max_len=16, buffer_docs=100, shuffle_rows=False)
    got = [t for b in p.batches(source(), rows_per_batch=1) for t in b["input_ids"].tolist()]
    assert sorted(got) == expected
    # Before: push_docs() kept every document's array (and mask) until it joined them, so a
    # refilled buffer gave [3] * 12, and the masks of the last document for all.
    p = OnlinePacker(max_len=16, buffer_docs=100, shuffle_rows=False, long_docs="truncate")
    masks = ([0] * (i + 1) + [1] * (3 - i) for i in range(3))
    p.push_docs(source(), masks=_refilled(masks))
    p.flush()
    rows = p.pop()
    assert rows.tokens.tolist() == expected
    assert rows.columns["loss_mask"].tolist() == [0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1]


def _refilled(values):
    """Each of `values` in turn, in one array refilled for each."""
    buf = None
    for v in values:
        buf = np.array(v) if buf is None else buf
        buf[:] = v
        yield buf


@pytest.mark.parametrize("pad_tokens", [None, 32, 33])
def test_pad_docs_below_a_full_batch_of_one_token_documents_is_refused_up_front(pad_tokens):
    """Before: any pad_docs was accepted, then a batch of many short documents failed mid-stream
    ("batch holds 32 documents (padding included), more than pad_docs=8"). The bound is tight:
    one-token documents fill a batch with that many."""
    most = 32 if pad_tokens in (None, 32) else 33  # + the padding entry, when there is padding
    kw = {"rows_per_batch": 2, "pad_tokens": pad_tokens}
    with pytest.raises(ConfigError, match=f"raise pad_docs to at least {most}$"):
        OnlinePacker(max_len=16).batches(iter([]), **kw, pad_docs=most - 1)
    p = OnlinePacker(max_len=16, buffer_docs=50)
    batches = list(p.batches([[1]] * 100, **kw, pad_docs=most))
    assert sum(len(b["doc_ids"][b["doc_ids"] >= 0]) for b in batches) == 100
    assert all(len(b["cu_seqlens"]) == most + 1 for b in batches)


@pytest.mark.parametrize(
    ("kw", "what"),
    [
        ({"rows_per_batch": 2**40}, "rows_per_batch=1099511627776 × max_len=16"),
        ({"tokens_per_batch": 2**31}, "tokens_per_batch=2147483648"),
        ({"rows_per_batch": 2, "pad_tokens": 2**40}, "pad_tokens=1,099,511,627,776"),
    ],
)
def test_a_batch_past_int32_cu_seqlens_is_refused_up_front(kw, what) -> None:
    """Before: accepted (`PackedDataset` refuses them); a pad_tokens of 2**40 then failed at the
    first batch with torch's "can't allocate memory" RuntimeError."""
    p = OnlinePacker(max_len=16)
    with pytest.raises(ConfigError, match=re.escape(what) + ".* cu_seqlens is int32"):
        p.batches([[1, 2]], **kw)
    (batch,) = p.batches([[1, 2]], rows_per_batch=(2**31 - 1) // 16)  # the largest is fine
    assert batch["input_ids"].tolist() == [1, 2]


@pytest.mark.parametrize(
    ("columns", "match"),
    [
        ({"foo": [1, 1, 1]}, r"^unknown column 'foo'; the packer carries .*\['loss_mask'\]$"),
        ({"doc_id": [1]}, r"^unknown column 'doc_id'; the packer carries"),
        ([1], r"^columns must be a dict of per-token arrays by name, got \[1\]$"),
    ],
)
def test_push_columns_of_an_unknown_name_or_not_a_dict_are_a_config_error(columns, match):
    # Before: a bare KeyError from the column registry, or dict()'s TypeError.
    p = OnlinePacker(max_len=8, long_docs="truncate")
    with pytest.raises(ConfigError, match=match):
        p.push(np.arange(3), [3], columns=columns)
    p.push(np.arange(3), [3], columns={"loss_mask": [0, 1, 1]})  # a known one still goes
    assert p.stats["documents_in"] == 1


@pytest.mark.parametrize("dtype", [">i8", ">u2", ">i4"])
@pytest.mark.parametrize("long_docs", ["split", "truncate"])
def test_push_takes_big_endian_token_ids(dtype, long_docs) -> None:
    # Before: numba's TypingError ("non-precise type pyobject") from the pack kernels.
    p = OnlinePacker(max_len=8, buffer_docs=2, long_docs=long_docs, shuffle_rows=False)
    tokens = np.arange(1, 21).astype(dtype)
    p.push(tokens, [3, 12, 5])
    p.flush()
    rows = p.pop()
    assert rows.tokens.dtype.isnative and rows.tokens.dtype.kind == np.dtype(dtype).kind
    kept = np.r_[1:4, 4:16, 16:21] if long_docs == "split" else np.r_[1:4, 4:12, 16:21]
    assert sorted(rows.tokens.tolist()) == kept.tolist()


@pytest.mark.parametrize("final", ["no", None, 0])
def test_flush_final_must_be_a_bool(final) -> None:
    # Before: "no" (true) closed the packer; None and 0 packed as a non-final flush.
    p = OnlinePacker(max_len=8, buffer_docs=100)
    p.push_docs([[1, 2, 3]])
    with pytest.raises(ConfigError, match=f"^final must be True or False, got {final!r}$"):
        p.flush(final=final)
    assert p.buffered == (1, 3) and not p.stats["stream_closed"]


@pytest.mark.parametrize(
    ("doc", "what"),
    [({"input_ids": [1, 2]}, "a dict"), ((i for i in range(3)), "a generator"), ({1, 2}, "a set")],
)
def test_a_document_that_is_no_sequence_is_named_for_what_it_is(doc, what) -> None:
    # Before: "document 0 is a single value ({'input_ids': [1, 2]})", as RequestBatcher said
    # until 2026-12-07: a dataset's row (a dict) is the likely mistake.
    want = f"^document 0 must be a sequence of token ids \\(list/array\\), got {what}$"
    with pytest.raises(DataError, match=want):
        OnlinePacker(max_len=8).push_docs([doc])
    with pytest.raises(DataError, match=want):
        list(OnlinePacker(max_len=8).batches([doc], rows_per_batch=1))


def test_documents_or_a_source_that_is_not_iterable_is_a_data_error() -> None:
    # Before: a bare TypeError ("'int' object is not iterable"), from pack_stream and batches
    # at the first item read.
    p = OnlinePacker(max_len=8)
    with pytest.raises(DataError, match=r"^push_docs takes an iterable of documents .*, got int$"):
        p.push_docs(5)
    with pytest.raises(DataError, match=r"^push_docs masks must be an iterable .*, got float$"):
        p.push_docs([[1, 2]], masks=1.5)
    with pytest.raises(DataError, match=r"^pack_stream takes an iterable of documents .*got int$"):
        p.pack_stream(5)
    with pytest.raises(DataError, match=r"^batches takes an iterable of documents .*, got int$"):
        p.batches(5, rows_per_batch=1)
    p = OnlinePacker(max_len=8, long_docs="truncate")
    p.push_docs(iter([[1, 2]]), masks=iter([[1, 1]]))  # any iterable
    assert p.stats["documents_in"] == 1


def test_a_single_value_is_not_taken_as_a_one_token_document() -> None:
    # Before: pack_stream(np.arange(1, 11)), a flat token array given as the source, packed 10
    # one-token documents without a word; push_docs([5, 6]) two of them.
    expected = r"document 0 is a single value \(1\); give a 1-d array of token ids per document"
    with pytest.raises(DataError, match=expected):
        list(OnlinePacker(max_len=8).pack_stream(np.arange(1, 11)))
    with pytest.raises(DataError, match=expected):
        list(OnlinePacker(max_len=8).batches(iter([1, 2]), rows_per_batch=1))
    with pytest.raises(DataError, match=expected):
        OnlinePacker(max_len=8).push_docs([1, 2])
    p = OnlinePacker(max_len=8)
    p.push_docs([[5], np.array([6])])  # one-token documents, given as sequences: fine
    p.flush()
    assert sorted(p.pop().tokens.tolist()) == [5, 6]


def test_a_held_row_goes_out_within_max_holds_plus_one_windows(monkeypatch) -> None:
    # Before: the timed pack that held a row back stopped the clock, so later poll() calls never
    # packed it again: a lone document waited until more documents arrived or a flush.
    import loader.online.packer as packer_module

    now = [0.0]
    monkeypatch.setattr(packer_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    p = OnlinePacker(max_len=64, buffer_seconds=1.0, max_holds=2)
    p.push_docs([np.arange(10)])
    out = []
    for t in (0.5, 1.0, 1.5, 2.0, 2.5, 2.99, 3.0):
        now[0] = t
        p.poll()
        out.append((t, p.stats["packs"], p.pop().n_rows))
    # held at 1.0 and 2.0 (each pack re-arms the window), forced out by the third at 3.0
    assert out == [
        (0.5, 0, 0),
        (1.0, 1, 0),
        (1.5, 1, 0),
        (2.0, 2, 0),
        (2.5, 2, 0),
        (2.99, 2, 0),
        (3.0, 3, 1),
    ]
    # A state loaded with held segments starts their window at the load.
    p = OnlinePacker(max_len=64, buffer_seconds=1.0)
    p.push_docs([np.arange(10)])
    now[0] = 4.0
    p.poll()
    q = OnlinePacker(max_len=64, buffer_seconds=1.0)
    q.load_state_dict(p.state_dict())
    now[0] = 5.0
    q.poll()
    assert q.stats["packs"] == 2


def test_misuse_of_the_stream_api_is_a_one_line_error_at_the_call() -> None:
    # Before: docs_per_push 0, -3 and 2.5 were taken; seed_key=5 was a bare TypeError; an
    # unknown collate keyword was a TypeError from collate at the first batch, after the source
    # was read; ids past uint64 (numpy's dtype object) were "must be integers, got dtype object".
    p = OnlinePacker(max_len=8)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ConfigError, match=f"docs_per_push must be an integer >= 1, got {bad}"):
            p.pack_stream([[1, 2]], docs_per_push=bad)
    assert next(p.pack_stream([[1, 2]], docs_per_push=np.int64(1))).n_rows == 1
    with pytest.raises(ConfigError, match="seed_key must be a tuple of integers >= 0, got 5"):
        OnlinePacker(max_len=8, seed_key=5)
    read = []
    source = (read.append(i) or [i + 1] for i in range(3))
    with pytest.raises(ConfigError, match=r"collate_kwargs \['foo'\] unknown"):
        OnlinePacker(max_len=8).batches(source, rows_per_batch=1, foo=1)
    with pytest.raises(ConfigError, match="drop_last must be True or False, got 'no'"):
        OnlinePacker(max_len=8).batches(source, rows_per_batch=1, drop_last="no")
    assert read == []  # refused before the source was touched
    for big in (2**64, -(2**64)):
        with pytest.raises(DataError, match=f"document 1: token id {big} is not in 0..2"):
            OnlinePacker(max_len=8).push_docs([[1], [2, big]])
        with pytest.raises(DataError, match=f"token id {big} is not in 0..2"):
            OnlinePacker(max_len=8).push([2, big], [2])


class _Buffer:
    """A reader handing out the buffer it refills through __array__ (a memory map, a reader's
    batch object): numpy's array of it owns no copy of its own."""

    def __init__(self) -> None:
        self.data = np.zeros(4, np.int64)

    def __array__(self, dtype=None, copy=None):
        return self.data


def test_an_object_handing_out_its_buffer_does_not_change_the_rows() -> None:
    # The copy test (`arr is doc or not arr.flags.owndata`) missed an object whose __array__
    # returns an array it keeps: [3] * 12 again. np.may_share_memory catches it.
    def source():
        obj = _Buffer()
        for i in range(3):
            obj.data[:] = i + 1
            yield obj

    p = OnlinePacker(max_len=16, buffer_docs=100, shuffle_rows=False)
    rows = sorted(t for r in p.pack_stream(source()) for t in r.tokens.tolist())
    assert rows == [1] * 4 + [2] * 4 + [3] * 4


def test_rows_popped_before_anything_was_packed_collate_to_an_empty_batch() -> None:
    # Before: "these rows carry no tokens (the packer was fed lengths only)" for a packer fed
    # tokens whose pop() came before its first pack.
    p = OnlinePacker(max_len=8, buffer_docs=4)
    p.push_docs([[1, 2, 3]])
    batch = p.pop().collate()
    assert batch["input_ids"].numel() == 0 and batch["cu_seqlens"].tolist() == [0]
    # Rows of a packer fed lengths only still have no batch.
    q = OnlinePacker(max_len=8, buffer_docs=1, min_fill=0.0)
    q.push(None, [3])
    q.flush()
    with pytest.raises(ConfigError, match="the packer was fed lengths only"):
        q.pop().collate()


def test_a_state_with_an_empty_list_document_pending_loads() -> None:
    """Before: `[]` became a float64 array, the pending documents joined as float64 and the
    state was refused at load as damaged (`pending.tokens ... not a 1-D integer array`)."""
    p = OnlinePacker(max_len=8)
    states = []

    def source():
        yield [1, 2, 3]
        yield []
        states.append(p.state_dict())  # by the source: both documents read, not yet pushed
        yield [4, 5]

    whole = [r.tokens.tolist() for r in p.pack_stream(source())]
    assert states[0]["pending"]["tokens"].numpy().dtype.kind in "iu"
    q = OnlinePacker(max_len=8)
    q.load_state_dict(states[0])
    resumed = [r.tokens.tolist() for r in q.pack_stream(iter([[4, 5]]))]
    assert resumed == whole == [[1, 2, 3, 4, 5]]
    assert q.stats["documents_empty"] == 1


@pytest.mark.parametrize("long_docs", ["truncate", "drop"])
def test_the_buffer_and_its_state_hold_only_the_tokens_kept(long_docs) -> None:
    """Before: a push's whole token array stayed in the buffer and in `state_dict()` (100
    documents of 100k tokens truncated to 32: 10M ids, 40 MB, for 3,200 buffered tokens)."""
    lengths = np.r_[np.full(50, 1000), 5, 3]
    tokens = np.arange(int(lengths.sum()), dtype=np.int64)
    mask = np.ones(len(tokens), np.uint8)
    mask[-3:] = 0  # the last document has no supervised token: left out, its tokens too
    p = OnlinePacker(max_len=32, long_docs=long_docs, buffer_docs=1000)
    p.push(tokens, lengths, loss_mask=mask)
    n_segs, n_tokens = p.buffered
    buf = p.state_dict()["buffer"]
    assert n_tokens == (50 * 32 + 5 if long_docs == "truncate" else 5)
    assert len(buf["tokens"]) == n_tokens  # no more ids than the buffer's tokens
    assert len(buf["columns"]["loss_mask"]) == n_tokens
    q = OnlinePacker(max_len=32, long_docs=long_docs, buffer_docs=1000)
    q.load_state_dict(p.state_dict())
    for packer in (p, q):
        packer.flush()
        rows = packer.pop()
        kept = [
            t
            for d in range(50 if long_docs == "truncate" else 0)
            for t in range(1000 * d, 1000 * d + 32)
        ] + list(range(50_000, 50_005))
        assert sorted(rows.tokens.tolist()) == kept
        assert rows.columns["loss_mask"].tolist() == [1] * len(kept)


def test_a_batch_exactly_at_its_token_budget_is_complete() -> None:
    """Before: the last batch was complete only when a row after it did not fit, so with
    `drop_last=True` a final batch of exactly `tokens_per_batch` tokens was dropped."""
    rows = PackedRows(
        np.array([0, 1, 2, 3]), np.array([5, 4, 9]), np.arange(3), np.zeros(3, np.int32), None
    )
    rb = RowBatcher(max_len=9, tokens_per_batch=9)
    rb.add(rows)
    assert [b.seg_len.tolist() for b in rb.ready()] == [[5, 4], [9]]
    assert rb.rest().n_rows == 0
    docs = [np.arange(16) + 100 * i for i in range(4)]  # each exactly one full row
    for drop_last in (False, True):
        p = OnlinePacker(max_len=16, buffer_docs=2)
        got = list(p.batches(iter(docs), tokens_per_batch=32, drop_last=drop_last))
        assert [int(b["cu_seqlens"][-1]) for b in got] == [32, 32]


@pytest.mark.parametrize("api", ["push", "push_docs"])
def test_a_loss_mask_given_as_a_tensor_goes_the_way_of_the_ids(api) -> None:
    """Before: torch's own errors (`Got unsupported ScalarType BFloat16`, `Can't call numpy()
    on Tensor that requires grad`); token ids given so were taken."""
    toks = torch.tensor([1, 2, 3, 4])
    masks = [
        torch.tensor([0, 1, 1, 1], dtype=torch.bfloat16),
        torch.tensor([0.0, 1.0, 1.0, 1.0], requires_grad=True),
        torch.tensor([0, 1, 1, 1], dtype=torch.uint8),
    ]
    for m in masks:
        p = OnlinePacker(max_len=8, long_docs="truncate")
        if api == "push":
            p.push(toks, [4], loss_mask=m)
        else:
            p.push_docs([toks], [m])
        m.data.zero_()  # the caller reuses its tensor: the buffered mask stays as pushed
        p.flush()
        assert p.pop().columns["loss_mask"].tolist() == [0, 1, 1, 1]
    p = OnlinePacker(max_len=8, long_docs="truncate")
    with pytest.raises(DataError, match="loss_mask values must be whole numbers"):
        p.push(toks, [4], loss_mask=torch.tensor([0, 0.5, 1, 1], dtype=torch.bfloat16))


def test_a_state_buffering_more_than_buffer_docs_segments_is_damage() -> None:
    """Before: it loaded, and the next push failed with an IndexError inside the buffer."""
    p = OnlinePacker(max_len=32, buffer_docs=16)
    p.push(np.arange(100), np.full(10, 10))
    state = p.state_dict()
    buf = state["buffer"]
    for k in ("start", "length", "doc", "chunk", "holds"):
        buf[k] = np.concatenate([buf[k]] * 4)
    with pytest.raises(DataError, match="buffer.length holds 40 segments > buffer_docs 16"):
        OnlinePacker(max_len=32, buffer_docs=16).load_state_dict(state)
    OnlinePacker(max_len=32, buffer_docs=40).load_state_dict(
        {**state, "config": {**state["config"], "buffer_docs": 40}}
    )


def test_a_length_past_int64_is_too_large_not_negative() -> None:
    """Before: cast to int64 it wrapped: "document 0 has a negative length"."""
    with pytest.raises(
        DataError, match="document 1 has a length of 9223372036854775808, too large"
    ):
        OnlinePacker(max_len=8).push(np.array([1, 2]), np.array([2, 2**63], np.uint64))
    with pytest.raises(
        DataError, match="document 0 has a length of 18446744073709551615, too large"
    ):
        OnlinePacker(max_len=8).push_lengths(np.array([2**64 - 1], np.uint64))


def test_push_lengths_refuses_a_length_split_into_too_many_pieces_in_one_line() -> None:
    # push_lengths([2**40]) at max_len 8 was numpy's "Unable to allocate 1.00 TiB" traceback
    # (make_segments' np.repeat of 2**37 pieces; the same hole as audit repro_huge_length.py).
    p = OnlinePacker(max_len=8, buffer_docs=4)
    with pytest.raises(ConfigError, match=r"^document 0 has length 1,099,511,627,776: cut at"):
        p.push_lengths(np.array([2**40]))
    p.push_lengths(np.array([8, 8, 8, 8]))  # the packer still works afterwards
    assert p.pop().seg_len.tolist() == [8, 8, 8, 8]


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64])
def test_pop_after_only_empty_documents_gives_empty_arrays_of_the_packers_dtypes(
    masked, dtype
) -> None:
    """Before: `pop()` of a packer fed tokens but nothing packed (only empty documents pushed,
    or no pack yet) returned rows whose `tokens` was None, the lengths-only marker, and no
    `loss_mask` column: a consumer reading `rows.tokens.dtype` or `rows.columns["loss_mask"]`
    failed. Now: empty arrays of the types the packer's rows have."""
    p = OnlinePacker(max_len=8, long_docs="truncate")
    mask = {"loss_mask": np.zeros(0, np.uint8)} if masked else {}
    p.push(np.zeros(0, dtype), [0, 0], **mask)
    before = p.pop()  # nothing packed yet
    p.flush()
    after = p.pop()  # the final flush packed nothing
    for rows in (before, after):
        assert rows.n_rows == 0 and len(rows.seg_len) == len(rows.doc_ids) == 0
        assert isinstance(rows.tokens, np.ndarray) and rows.tokens.shape == (0,)
        assert rows.tokens.dtype == dtype
        assert rows.seg_len.dtype == rows.doc_ids.dtype == np.int64
        assert rows.doc_chunks.dtype == np.int32
        assert sorted(rows.columns) == (["loss_mask"] if masked else [])
        for v in rows.columns.values():
            assert v.shape == (0,) and v.dtype == np.uint8
        assert rows.documents.tokens.dtype == dtype
        batch = rows.collate()
        assert batch["input_ids"].numel() == 0 and batch["cu_seqlens"].tolist() == [0]
    # The empty rows join real ones without changing their types.
    q = OnlinePacker(max_len=8, long_docs="truncate", buffer_docs=1)
    q.push(
        np.arange(3, dtype=dtype), [3], **({"loss_mask": np.ones(3, np.uint8)} if masked else {})
    )
    full = q.pop()
    assert full.n_rows == 1
    for parts in ([after, full], [full, after], [after, full, before]):
        joined = PackedRows.concat(parts)
        assert joined.tokens.dtype == dtype and joined.tokens.tolist() == [0, 1, 2]
        assert {k: v.dtype for k, v in joined.columns.items()} == {
            k: v.dtype for k, v in full.columns.items()
        }
    # Parts all without rows: the one with tokens is the result (a lengths-only part, tokens
    # None, first in the list no longer hides it).
    for parts in ([PackedRows.concat([]), after], [after, PackedRows.concat([])]):
        joined = PackedRows.concat(parts)
        assert joined.n_rows == 0 and joined.tokens.dtype == dtype
        assert sorted(joined.columns) == sorted(after.columns)
    batcher = RowBatcher(max_len=8, rows_per_batch=1)
    batcher.add(after)
    batcher.add(full)
    assert [b.tokens.tolist() for b in batcher.ready(final=True)] == [[0, 1, 2]]
    # A state saved while such rows wait loads and goes on.
    p2 = OnlinePacker(max_len=8, long_docs="truncate")
    p2.push(np.zeros(0, dtype), [0], **mask)
    p2.flush()
    p3 = OnlinePacker(max_len=8, long_docs="truncate")
    p3.load_state_dict(p2.state_dict())
    assert p3.pop().tokens.dtype == dtype


def test_pop_of_a_packer_fed_lengths_only_still_has_no_tokens() -> None:
    p = OnlinePacker(max_len=8)
    p.push_lengths([0, 0])
    p.flush()
    rows = p.pop()
    assert rows.n_rows == 0 and rows.tokens is None and rows.columns == {}
