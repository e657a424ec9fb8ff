"""The pure per-chunk packing step: exact small cases and invariants on random input."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError, DataError
from packtool.pack import chunk
from packtool.pack.chunk import ChunkTooLarge, PackConfig, make_segments, pack_table
from packtool.pack.tail import TailPolicy
from packtool.pack.token_cut import pack_cut
from packtool.stats import lengths as stats


def tokenized(lengths, groups=None, start_id=0) -> pa.Table:
    """Documents whose tokens encode (doc, position) so any misplaced token is detectable."""
    ids = [[(d * 7 + t) % 250 for t in range(n)] for d, n in enumerate(lengths)]
    cols = {
        "doc_id": pa.array(np.arange(start_id, start_id + len(lengths)), pa.int64()),
        "input_ids": pa.array(ids, pa.list_(pa.uint16())),
        "length": pa.array(lengths, pa.int32()),
    }
    if groups is not None:
        cols["lang"] = pa.array(groups, pa.string())
    return pa.table(cols)


def rows_of(table: pa.Table) -> list[list[tuple[int, int, list[int]]]]:
    """Each row as [(doc_id, chunk, tokens), ...] in row order."""
    out = []
    for r in table.to_pylist():
        offs = r["doc_offsets"]
        out.append(
            [
                (d, c, r["input_ids"][offs[i] : offs[i + 1]])
                for i, (d, c) in enumerate(zip(r["doc_ids"], r["doc_chunks"], strict=True))
            ]
        )
    return out


def test_segments_split_truncate_drop_exact():
    lengths = np.array([0, 3, 10, 4])
    segs, counts = make_segments(lengths, 4, "split")
    assert segs.doc.tolist() == [1, 2, 2, 2, 3]
    assert segs.start.tolist() == [0, 0, 4, 8, 0]
    assert segs.length.tolist() == [3, 4, 4, 2, 4]
    assert segs.chunk.tolist() == [0, 0, 1, 2, 0]
    assert (counts.documents_empty, counts.documents_split, counts.tokens_out) == (1, 1, 17)

    segs, counts = make_segments(lengths, 4, "truncate")
    assert segs.length.tolist() == [3, 4, 4]
    assert (counts.documents_truncated, counts.tokens_truncated, counts.tokens_out) == (1, 6, 11)

    segs, counts = make_segments(lengths, 4, "drop")
    assert segs.doc.tolist() == [1, 3]
    assert (counts.documents_dropped, counts.tokens_dropped, counts.tokens_out) == (1, 10, 7)


def test_pack_exact_rows_ffd():
    # FFD on [3, 2, 2, 1] into rows of 4: {3, 1} and {2, 2}.
    packed = pack_table(tokenized([3, 2, 2, 1]), PackConfig(max_len=4))
    rows = sorted(rows_of(packed.table))
    assert rows == [
        [(0, 0, [0, 1, 2]), (3, 0, [21])],
        [(1, 0, [7, 8]), (2, 0, [14, 15])],
    ]
    assert packed.table.column("doc_offsets").to_pylist() in (
        [[0, 3, 4], [0, 2, 4]],
        [[0, 2, 4], [0, 3, 4]],
    )
    assert packed.counts.rows == 2 and packed.rows_per_round == [2]


def test_pack_split_document_keeps_every_token_in_order():
    packed = pack_table(tokenized([9, 1]), PackConfig(max_len=4))
    pieces = sorted((d, c, t) for row in rows_of(packed.table) for d, c, t in row)
    assert pieces == [(0, 0, [0, 1, 2, 3]), (0, 1, [4, 5, 6, 7]), (0, 2, [8]), (1, 0, [7])]


def test_same_seed_same_output_and_seed_changes_row_order():
    table = tokenized(list(np.random.default_rng(0).integers(1, 60, size=300)))
    a = pack_table(table, PackConfig(max_len=64, seed=1)).table
    b = pack_table(table, PackConfig(max_len=64, seed=1)).table
    c = pack_table(table, PackConfig(max_len=64, seed=2)).table
    assert a.equals(b)
    assert not a.equals(c)
    assert sorted(map(str, rows_of(a))) == sorted(map(str, rows_of(c)))


def test_group_by_never_mixes_groups_and_reports_each():
    lengths = [3, 3, 3, 3, 1, 1]
    groups = ["en", "de", "en", "de", "en", "de"]
    packed = pack_table(tokenized(lengths, groups), PackConfig(max_len=4, group_by="lang"))
    for row in rows_of(packed.table):
        assert len({groups[d] for d, _, _ in row}) == 1
    assert packed.groups == {"de": (2, 7), "en": (2, 7)}


def test_group_by_unknown_field_names_the_available_ones():
    with pytest.raises(ConfigError, match=r"available: \['lang'\]"):
        pack_table(tokenized([1, 2], ["a", "b"]), PackConfig(max_len=4, group_by="domain"))


def test_length_column_must_match_tokens():
    table = tokenized([2, 3]).set_column(2, "length", pa.array([2, 4], pa.int32()))
    with pytest.raises(DataError, match="length"):
        pack_table(table, PackConfig(max_len=4))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"max_len": 1}, "max_len"),
        ({"max_len": 8, "algorithm": "nfd"}, "algorithm 'nfd'"),
        ({"max_len": 8, "long_docs": "keep"}, "long_docs 'keep'"),
        ({"max_len": 8, "rounds": 0}, "rounds"),
        ({"max_len": 8, "seed": -1}, "seed"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        PackConfig(**kwargs)


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=0, max_size=80),
    max_len=st.integers(2, 16),
    policy=st.sampled_from(["split", "truncate", "drop"]),
    algorithm=st.sampled_from(["ffd", "bfd"]),
    rounds=st.integers(1, 3),
    grouped=st.booleans(),
    seed=st.integers(0, 5),
)
def test_pack_invariants(lengths, max_len, policy, algorithm, rounds, grouped, seed):
    groups = [("a", "b", "c")[i % 3] for i in range(len(lengths))] if grouped else None
    table = tokenized(lengths, groups)
    config = PackConfig(
        max_len=max_len,
        algorithm=algorithm,
        long_docs=policy,
        rounds=rounds,
        seed=seed,
        group_by="lang" if grouped else None,
    )
    packed = pack_table(table, config)
    out, counts = packed.table, packed.counts
    rows = rows_of(out)

    # Accounting: nothing lost silently.
    assert counts.tokens_in == sum(lengths)
    assert counts.tokens_in == counts.tokens_out + counts.tokens_truncated + counts.tokens_dropped
    assert sum(len(r["input_ids"]) for r in out.to_pylist()) == counts.tokens_out
    assert counts.rows == out.num_rows == packed.rows_per_round[-1]
    assert all(
        b <= a for a, b in zip(packed.rows_per_round, packed.rows_per_round[1:], strict=False)
    )

    # Row contract: offsets start at 0, increase strictly, end at the row length <= max_len.
    for r in out.to_pylist():
        offs = r["doc_offsets"]
        assert offs[0] == 0 and offs[-1] == len(r["input_ids"]) <= max_len
        assert all(a < b for a, b in zip(offs, offs[1:], strict=False))
        assert len(r["doc_ids"]) == len(r["doc_chunks"]) == len(offs) - 1

    # Each document placed exactly once, its tokens intact and in order (chunks concatenated).
    pieces: dict[int, list[tuple[int, list[int]]]] = {}
    for row in rows:
        for d, c, toks in row:
            pieces.setdefault(d, []).append((c, toks))
    for d, n in enumerate(lengths):
        original = [(d * 7 + t) % 250 for t in range(n)]
        if n == 0 or (policy == "drop" and n > max_len):
            assert d not in pieces
            continue
        chunks = sorted(pieces[d])
        assert [c for c, _ in chunks] == list(range(len(chunks)))
        joined = [t for _, toks in chunks for t in toks]
        expected = original[:max_len] if policy == "truncate" else original
        assert joined == expected

    # Never fewer rows than the lower bound; groups never mixed.
    seg = packed.segment_lengths
    if len(seg):
        lower = max(stats.lower_bound_l1(seg, max_len), stats.lower_bound_l2(seg, max_len))
        assert out.num_rows >= lower
    if grouped:
        for row in rows:
            assert len({groups[d] for d, _, _ in row}) == 1


def test_extra_rounds_never_add_rows_on_real_shaped_lengths():
    rng = np.random.default_rng(3)
    lengths = np.clip(rng.lognormal(np.log(300), 1.0, size=3000), 1, 5000).astype(int)
    one = pack_table(tokenized(list(lengths)), PackConfig(max_len=1024, rounds=1))
    four = pack_table(tokenized(list(lengths)), PackConfig(max_len=1024, rounds=4))
    assert four.rows_per_round[0] == one.counts.rows
    assert four.counts.rows <= one.counts.rows
    assert four.counts.tokens_out == one.counts.tokens_out


@pytest.mark.parametrize("grouped", [False, True])
def test_a_doc_chunk_column_is_refused_as_the_tails_own(grouped):
    # A tail adds `doc_chunk` to the table's columns; with the table's own one already there,
    # packing the tail (`carry=`) failed with pyarrow's "Column 'doc_chunk' not found".
    table = tokenized([5, 3, 2]).append_column("doc_chunk", pa.array(["a", "b", "a"]))
    config = PackConfig(max_len=8, group_by="doc_chunk" if grouped else None)
    with pytest.raises(ConfigError, match="^tokenized table: column 'doc_chunk' is reserved"):
        pack_table(table, config, tail=TailPolicy())


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 64), max_size=120),
    max_len=st.sampled_from([64, 100, 5000]),
    n_groups=st.sampled_from([2, 30, 400]),
    algorithm=st.sampled_from(["ffd", "bfd"]),
    seed=st.integers(0, 3),
    data=st.data(),
)
def test_group_by_rows_are_each_groups_reference_packing(
    lengths, max_len, n_groups, algorithm, seed, data
):
    """The rows with --group-by, exactly: each group (in name order, "" for documents without
    the field) packed apart as the plain reference packs it, its rows after the rows of the
    groups before it, then all rows in the chunk's seeded order (rounds=1: the one draw)."""
    from packtool.pack.reference import bfd_reference, ffd_reference

    codes = data.draw(
        st.lists(st.integers(-1, n_groups - 1), min_size=len(lengths), max_size=len(lengths))
    )
    values = [None if c < 0 else f"g{c}" for c in codes]
    config = PackConfig(max_len=max_len, algorithm=algorithm, seed=seed, group_by="lang")
    packed = pack_table(tokenized(lengths, values), config, chunk_index=(1, seed))
    reference = {"ffd": ffd_reference, "bfd": bfd_reference}[algorithm]
    placed: list[list[int]] = []  # each row's documents, in placement order
    groups = {}
    for name in sorted({v or "" for v in values}):
        mine = [d for d, v in enumerate(values) if (v or "") == name]
        row, offset, n_rows = reference([lengths[d] for d in mine], max_len)
        by_row = [
            sorted((o, d) for d, r, o in zip(mine, row, offset, strict=True) if r == k)
            for k in range(n_rows)
        ]
        placed += [[d for _, d in docs] for docs in by_row]
        groups[name] = (n_rows, sum(lengths[d] for d in mine))
    order = np.random.default_rng([seed, 1, seed]).permutation(len(placed))
    expected: list[list[int]] = [[] for _ in placed]
    for k, docs in enumerate(placed):
        expected[order[k]] = docs
    assert packed.table.column("doc_ids").to_pylist() == expected
    assert packed.groups == groups


def test_group_by_cost_does_not_grow_with_max_len_per_group():
    """300 groups of one document at max_len 2**22: one kernel call for every group. A call per
    group cost O(max_len) each (four arrays of max_len + 1 made and filled: 89 s here), and
    each group scanned every segment; 10^5 one-document groups took 18 s at max_len 64."""
    import time

    lengths = [5 + d % 50 for d in range(300)]
    table = tokenized(lengths, [f"g{d:03d}" for d in range(300)])
    for algorithm in ("ffd", "bfd"):
        config = PackConfig(max_len=2**22, group_by="lang", algorithm=algorithm)
        pack_table(tokenized([3], ["a"]), config)  # the kernels loaded
        start = time.perf_counter()
        packed = pack_table(table, config)
        seconds = time.perf_counter() - start
        assert packed.counts.rows == 300 and len(packed.groups) == 300
        # 0.002-0.12 s here; a cost per group took 89 s. The bound leaves a loaded CI box room.
        assert seconds < 20.0, f"{algorithm}: {seconds:.1f} s for 300 one-document groups"


def _pieces_of(packed) -> list[tuple[int, int, list[int]]]:
    """Every piece a pack wrote or set aside: (doc_id, chunk, tokens), sorted."""
    out = [p for row in rows_of(packed.table) for p in row]
    if packed.tail is not None:
        for r in packed.tail.to_pylist():
            out.append((r["doc_id"], r["doc_chunk"], r["input_ids"]))
    return sorted(out)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), min_size=1, max_size=40),
    earlier=st.lists(st.integers(1, 30), min_size=0, max_size=20),
    max_len=st.integers(4, 12),
    policy=st.sampled_from(["split", "truncate", "drop"]),
    limit=st.integers(40, 200),
    grouped=st.booleans(),
    last_tail=st.booleans(),
)
def test_a_chunk_over_one_arrow_table_is_packed_in_parts(
    lengths, earlier, max_len, policy, limit, grouped, last_tail
):
    """A chunk whose rows outgrow one Arrow table (`MAX_CHUNK_TOKENS`, 2^31 - 1, lowered here)
    was a `ConfigError` ("lower --chunk-docs"), also in the tail tree's root after every
    partition had finished. `pack_cut` packs it in parts, each within the limit, with the
    same pieces and counts; a chunk that fits is the one `pack_table` call it always was."""
    groups = [("a", "b")[i % 2] for i in range(len(lengths))] if grouped else None
    config = PackConfig(max_len=max_len, long_docs=policy, group_by="lang" if grouped else None)
    before = [("a", "b")[i % 2] for i in range(len(earlier))] if grouped else None
    carry = pack_table(tokenized(earlier, before, 1000), config, tail=TailPolicy()).tail
    table = tokenized(lengths, groups)
    tail = TailPolicy() if last_tail else None
    kw = {"chunk_index": (3, 1), "carry": carry, "tail": tail, "between": TailPolicy()}
    whole = pack_table(table, config, chunk_index=(3, 1), carry=carry, tail=tail)
    (same,) = pack_cut(table, config, **kw)  # it fits: the very same call
    assert same.table.equals(whole.table) and _pieces_of(same) == _pieces_of(whole)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunk, "MAX_CHUNK_TOKENS", limit)
        try:
            pack_table(table, config, chunk_index=(3, 1), carry=carry, tail=tail)
            fits = True
        except ChunkTooLarge:
            fits = False
        parts = list(pack_cut(table, config, **kw))
    assert len(parts) == 1 if fits else len(parts) > 1
    for part in parts:
        assert sum(len(r["input_ids"]) for r in part.table.to_pylist()) <= limit
        assert all(len(r["input_ids"]) <= max_len for r in part.table.to_pylist())
    written = sorted(p for part in parts for row in rows_of(part.table) for p in row)
    last = parts[-1].tail
    kept = (
        []
        if last is None
        else [(r["doc_id"], r["doc_chunk"], r["input_ids"]) for r in last.to_pylist()]
    )
    assert sorted(written + kept) == _pieces_of(whole)  # each piece once, its tokens intact
    for name in ("documents_in", "documents_packed", "tokens_in", "tokens_out", "segments"):
        assert sum(getattr(p.counts, name) for p in parts) == getattr(whole.counts, name)
    if grouped:
        for part in parts:
            for row in rows_of(part.table):
                assert len({d % 2 if d < 1000 else (d - 1000) % 2 for d, _, _ in row}) == 1


def test_a_document_no_chunk_can_hold_is_one_line():
    config = PackConfig(max_len=8)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(chunk, "MAX_CHUNK_TOKENS", 20)
        with pytest.raises(ConfigError, match=r"^document 1 keeps 30 tokens, more than one chunk"):
            list(pack_cut(tokenized([10, 30]), config, chunk_index=(0, 0)))
        # truncated to max_len, it fits
        parts = list(
            pack_cut(
                tokenized([10, 30, 12]),
                PackConfig(max_len=8, long_docs="truncate"),
                chunk_index=(0, 0),
            )
        )
    assert sum(p.counts.tokens_out for p in parts) == 8 + 8 + 8


def test_make_segments_refuses_a_length_cut_into_too_many_pieces_naming_it():
    # The same hole as split_lengths' (audit repro_huge_length.py): OnlinePacker.push_lengths
    # ([2**40]) at max_len 8 was numpy's "Unable to allocate 1.00 TiB" traceback from
    # make_segments' np.repeat of 2**37 pieces. Truncate and drop make one piece at most.
    with pytest.raises(ConfigError, match=r"^document 1 has length 1,099,511,627,776: cut at"):
        make_segments(np.array([3, 2**40]), 8, "split")
    for policy in ("truncate", "drop"):
        segs, _ = make_segments(np.array([3, 2**40]), 8, policy)
        assert segs.length.tolist() == ([3, 8] if policy == "truncate" else [3])
