"""The extra rounds (`--rounds`) in one numba call over every group, against the Python path
that ran a call per group and round (kept as `reference.repack_reference`)."""

from __future__ import annotations

import collections
import sys
from unittest import mock

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.pack import kernels, repack
from packtool.pack.chunk import PackConfig, pack_table
from packtool.pack.reference import repack_reference
from tests.packtool.pack.compiles import cold_compiles


def _first_round(lengths, groups, n_groups, max_len, algorithm):
    lens = np.asarray(lengths, np.int64)
    codes = np.asarray(groups, np.int64)
    row, offset, rows = kernels.grouped_assign(lens, codes, max_len, algorithm, n_groups)
    return lens, codes, row, offset, rows


@settings(max_examples=150, deadline=None)
@given(
    data=st.data(),
    max_len=st.integers(2, 40),
    n_groups=st.integers(1, 6),
    rounds=st.integers(1, 6),
    algorithm=st.sampled_from(["ffd", "bfd"]),
    seed=st.integers(0, 2**32),
)
def test_repack_kernel_gives_the_python_rounds_exactly(
    data, max_len, n_groups, rounds, algorithm, seed
):
    n = data.draw(st.integers(0, 120))
    lengths = data.draw(st.lists(st.integers(1, max_len), min_size=n, max_size=n))
    groups = data.draw(st.lists(st.integers(0, n_groups - 1), min_size=n, max_size=n))
    lens, codes, row, offset, rows = _first_round(lengths, groups, n_groups, max_len, algorithm)
    want_row, want_offset, want_rows = row.copy(), offset.copy(), rows.copy()
    want_rng = np.random.default_rng(seed)
    want = repack_reference(
        lens, codes, want_row, want_offset, want_rows, max_len, rounds, want_rng
    )
    rng = np.random.default_rng(seed)
    got = repack.repack_groups(lens, codes, row, offset, rows, max_len, rounds, rng)

    assert got.tolist() == want.tolist()
    assert row.tolist() == want_row.tolist()
    assert offset.tolist() == want_offset.tolist()
    assert rows.tolist() == want_rows.tolist()
    # Both drew the same numbers: the generators are left in the same state.
    assert rng.integers(0, 2**62) == want_rng.integers(0, 2**62)

    # Invariants: every segment in one row of its group, laid end to end, no row over max_len.
    assert got[-1] == rows.sum() and all(b <= a for a, b in zip(got, got[1:], strict=False))
    for g in range(n_groups):
        mine = np.flatnonzero(codes == g)
        if len(mine) == 0:
            assert rows[g] == 0
            continue
        assert sorted(set(row[mine].tolist())) == list(range(rows[g]))
        for r in range(rows[g]):
            docs = mine[row[mine] == r]
            spans = sorted(zip(offset[docs].tolist(), lens[docs].tolist(), strict=True))
            end = 0
            for start, length in spans:
                assert start == end
                end += length
            assert end <= max_len


def _tokenized(lengths, groups) -> pa.Table:
    ids = [[(d * 7 + t) % 250 for t in range(n)] for d, n in enumerate(lengths)]
    return pa.table(
        {
            "doc_id": pa.array(np.arange(len(lengths)), pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "lang": pa.array(groups, pa.string()),
        }
    )


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 30), max_size=80),
    max_len=st.integers(2, 16),
    rounds=st.integers(2, 5),
    grouped=st.booleans(),
    seed=st.integers(0, 5),
)
def test_pack_table_rows_are_those_of_the_python_rounds(lengths, max_len, rounds, grouped, seed):
    table = _tokenized(lengths, [f"g{i % 4}" for i in range(len(lengths))])
    config = PackConfig(
        max_len=max_len, rounds=rounds, seed=seed, group_by="lang" if grouped else None
    )
    got = pack_table(table, config, chunk_index=(2, seed))
    with mock.patch.object(repack, "repack_groups", repack_reference):
        want = pack_table(table, config, chunk_index=(2, seed))
    assert got.table.equals(want.table)
    assert got.rows_per_round == want.rows_per_round
    assert got.groups == want.groups


def test_rounds_make_no_python_call_per_group():
    """3,000 groups, 16 rounds: the extra rounds add no Python call per group or round (one
    kernel call for all of them). Counted with a profiler, not timed: the old path made one
    Python call per group and round (~0.2 ms each, 10x the first pass)."""
    rng = np.random.default_rng(0)
    n_groups, per_group = 3000, 8
    lengths = rng.integers(1, 40, n_groups * per_group).tolist()
    table = _tokenized(lengths, [f"g{d // per_group:04d}" for d in range(len(lengths))])
    pack_table(table.slice(0, 50), PackConfig(max_len=64, rounds=2, group_by="lang"))  # warm

    def python_calls(rounds: int) -> int:
        config = PackConfig(max_len=64, rounds=rounds, group_by="lang")
        calls = 0

        def count(frame, event, arg):
            nonlocal calls
            calls += event == "call"

        sys.setprofile(count)
        try:
            packed = pack_table(table, config)
        finally:
            sys.setprofile(None)
        assert len(packed.groups) == n_groups
        return calls

    one, sixteen = python_calls(1), python_calls(16)
    # A call per group and round would add >= 3,000 x 15 calls.
    assert sixteen - one < n_groups, f"16 rounds: {sixteen:,} Python calls, 1 round: {one:,}"


def test_the_rounds_kernel_compiles_no_sort_shuffle_or_message_code(tmp_path):
    """On a cold numba cache the rounds' kernel compiled numba's quicksort (`key.sort()`),
    its `Generator.shuffle` (N-d indexing with `...`) and, for fancy indexing, the string
    formatting of a shape-mismatch message: 82 functions, ~18.5 s of CPU on this 2-core box, the
    first time `packtool pack --rounds 4` ran on a machine. Now packtool's own loops: each of its
    kernels compiled once (one type specialization), and a few of numba's array allocators."""
    # NUMBA_OPT=0: LLVM's optimisation level, which comes after numba's typing decides what it
    # compiles (the same events, less CPU; as test_warmup.py's cold compile check).
    compiled = cold_compiles(
        "from packtool.pack import repack", "repack.warm_up()", tmp_path,
        PACKTOOL_NUMBA_EXTENSIONS="0", NUMBA_OPT="0",
    )  # fmt: skip
    seen = [c[:2] for c in compiled]
    ours = collections.Counter(q for m, q in seen if m.startswith("packtool."))
    assert {"_repack", "_round", "first_fit"} <= set(ours)
    assert set(ours.values()) == {1}, ours
    heavy = ("numba.misc.quicksort", "numba.np.random", "numba.cpython.unicode")
    assert [x for x in seen if x[0].startswith(heavy)] == []
    assert len(seen) <= 20, seen
