"""The numba packing kernels against the plain-Python references, plus packing invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.pack.kernels import (
    assign,
    bfd_assign,
    ffd_assign,
    grouped_assign,
    row_fill,
    sort_decreasing,
)
from packtool.pack.reference import bfd_reference, ffd_reference

KERNELS = [(ffd_assign, ffd_reference), (bfd_assign, bfd_reference)]


def check_packing(lengths, max_len, row, offset, n_rows):
    """Every document placed once, rows within max_len, documents contiguous from 0."""
    lengths = np.asarray(lengths, dtype=np.int64)
    assert row.shape == offset.shape == lengths.shape
    if lengths.size == 0:
        assert n_rows == 0
        return
    assert row.min() >= 0 and row.max() == n_rows - 1
    assert set(row.tolist()) == set(range(n_rows))  # no empty row
    for r in range(n_rows):
        docs = np.flatnonzero(row == r)
        docs = docs[np.argsort(offset[docs], kind="stable")]
        starts = offset[docs]
        ends = starts + lengths[docs]
        assert starts[0] == 0
        assert np.array_equal(starts[1:], ends[:-1])  # contiguous, no overlap
        assert ends[-1] <= max_len
    total = int(lengths.sum())
    assert n_rows >= -(-total // max_len)  # L1
    assert n_rows >= int((lengths > max_len // 2).sum())  # each such document needs its own row


# --- tiny hand-checked cases ---


def test_ffd_hand_checked():
    # sorted: 5 (doc 1), 4 (doc 3), 3 (doc 0), 2 (doc 2), 1 (doc 4); capacity 6
    # 5 -> row 0, 4 -> row 1, 3 -> row 2, 2 -> row 1 (row 0 has 1 left), 1 -> row 0
    row, offset, n_rows = ffd_assign([3, 5, 2, 4, 1], 6)
    assert row.tolist() == [2, 0, 1, 1, 0]
    assert offset.tolist() == [0, 0, 4, 0, 5]
    assert n_rows == 3


def test_ffd_and_bfd_differ_on_ties():
    # capacity 10: both 6s open rows 0 and 1 with 4 left each. FFD puts the first 4 into row 0;
    # BFD sees a tie at 4 left and takes the row that reached it most recently (row 1).
    row, offset, n_rows = ffd_assign([6, 6, 4, 4, 2], 10)
    assert (row.tolist(), offset.tolist(), n_rows) == ([0, 1, 0, 1, 2], [0, 0, 6, 6, 0], 3)
    row, offset, n_rows = bfd_assign([6, 6, 4, 4, 2], 10)
    assert (row.tolist(), offset.tolist(), n_rows) == ([0, 1, 1, 0, 2], [0, 0, 6, 6, 0], 3)


def test_bfd_takes_tightest_row():
    # capacity 10: 7 -> row 0 (3 left), 5 -> row 1 (5 left), 3 -> row 0 (tightest that fits),
    # then 2 -> row 1 (row 0 is full).
    row, offset, n_rows = bfd_assign([7, 5, 3, 2], 10)
    assert (row.tolist(), offset.tolist(), n_rows) == ([0, 1, 0, 1], [0, 0, 7, 5], 2)


def test_equal_lengths_fill_rows_in_input_order():
    row, offset, n_rows = ffd_assign([3, 3, 3, 3, 3], 9)
    assert (row.tolist(), offset.tolist(), n_rows) == ([0, 0, 0, 1, 1], [0, 3, 6, 0, 3], 2)
    assert bfd_assign([3, 3, 3, 3, 3], 9)[0].tolist() == [0, 0, 0, 1, 1]


def test_full_length_documents_each_open_a_row():
    row, offset, n_rows = ffd_assign([4, 1, 4, 3], 4)
    assert (row.tolist(), offset.tolist(), n_rows) == ([0, 2, 1, 2], [0, 3, 0, 0], 3)


def test_empty_input():
    for kernel, _ in KERNELS:
        row, offset, n_rows = kernel(np.empty(0, np.int64), 8)
        assert row.size == offset.size == 0 and n_rows == 0


def test_sort_decreasing_is_stable():
    assert sort_decreasing([2, 5, 2, 7, 5], 8).tolist() == [3, 1, 4, 0, 2]


def test_row_fill():
    row, _, n_rows = ffd_assign([3, 5, 2, 4, 1], 6)
    assert row_fill(row, [3, 5, 2, 4, 1], n_rows).tolist() == [6, 6, 3]


def test_assign_by_name():
    lengths = [6, 6, 4, 4, 2]
    assert assign(lengths, 10, "bfd")[0].tolist() == bfd_assign(lengths, 10)[0].tolist()
    assert assign(lengths, 10)[0].tolist() == ffd_assign(lengths, 10)[0].tolist()
    with pytest.raises(ConfigError, match="'nfd'.*ffd.*bfd"):
        assign(lengths, 10, "nfd")


# --- validation ---


@pytest.mark.parametrize("kernel", [ffd_assign, bfd_assign])
@pytest.mark.parametrize(
    ("lengths", "max_len", "match"),
    [
        ([1, 2], 0, "max_len must be a positive integer, got 0"),
        ([1, 2], 2.5, "max_len must be a positive integer, got 2.5"),
        ([1, 0, 2], 8, "document 1 has length 0"),
        ([1, -3], 8, "document 1 has length -3"),
        ([1, 9, 2], 8, "document 1 has length 9 > max_len 8"),
        ([[1, 2]], 8, r"1-D array, got shape \(1, 2\)"),
        ([1.5, 2.0], 8, "integers, got dtype float64"),
    ],
)
def test_validation(kernel, lengths, max_len, match):
    with pytest.raises(ConfigError, match=match):
        kernel(lengths, max_len)


# --- kernels == references on random input ---


@st.composite
def packing_inputs(draw):
    max_len = draw(st.one_of(st.integers(1, 40), st.sampled_from([64, 4096, 40000])))
    lengths = draw(st.lists(st.integers(1, max_len), max_size=80))
    return lengths, max_len


@settings(max_examples=150, deadline=None)
@given(packing_inputs())
def test_kernels_match_references(case):
    lengths, max_len = case
    for kernel, reference in KERNELS:
        row, offset, n_rows = kernel(np.array(lengths, dtype=np.int64), max_len)
        ref_row, ref_offset, ref_rows = reference(lengths, max_len)
        assert n_rows == ref_rows
        assert row.tolist() == ref_row
        assert offset.tolist() == ref_offset
        check_packing(lengths, max_len, row, offset, n_rows)


@settings(max_examples=30, deadline=None)
@given(
    st.integers(0, 2**32 - 1),
    st.integers(1, 3000),
    st.sampled_from([16, 256, 4096]),
)
def test_skewed_random_inputs(seed, n, max_len):
    """Larger skewed inputs (many equal lengths, long runs): same as the references."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(max_len / 10), 1.0, n), 1, max_len).astype(np.int32)
    for kernel, reference in KERNELS:
        row, offset, n_rows = kernel(lengths, max_len)
        ref_row, ref_offset, ref_rows = reference(lengths.tolist(), max_len)
        assert (row.tolist(), offset.tolist(), n_rows) == (ref_row, ref_offset, ref_rows)
    check_packing(lengths, max_len, row, offset, n_rows)


def test_input_dtypes_agree():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 500)
    want = ffd_assign(lengths.astype(np.int64), 200)
    for dtype in (np.int32, np.int16, np.uint16, np.uint8):
        got = ffd_assign(lengths.astype(dtype), 200)
        assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_deterministic():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 4097, 20_000)
    for kernel, _ in KERNELS:
        a, b = kernel(lengths, 4096), kernel(lengths.copy(), 4096)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_split_lengths_kernel():
    from packtool.pack.kernels import split_lengths

    assert split_lengths(np.array([10, 3, 16, 0, 8]), 8).tolist() == [8, 2, 3, 8, 8, 8]
    with pytest.raises(ConfigError, match="document 1 has negative length -1"):
        split_lengths([3, -1], 8)
    with pytest.raises(ConfigError, match="max_len must be a positive integer, got 0"):
        split_lengths([3], 0)


def test_a_uint64_length_past_int64_is_named_not_wrapped():
    # Before: 2**63 + 5 became -9223372036854775803 in the cast to int64 ("negative length").
    from packtool.pack.kernels import split_lengths

    huge = np.array([3, 2**63 + 5], dtype=np.uint64)
    for kernel in (split_lengths, ffd_assign, bfd_assign):
        with pytest.raises(ConfigError, match=r"^document 1 has length 9223372036854775813, "):
            kernel(huge, 8)


@settings(max_examples=80, deadline=None)
@given(
    values=st.lists(st.integers(0, 255), min_size=0, max_size=60),
    segments=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=20),
)
def test_segment_sums_match_a_plain_sum(values, segments):
    from packtool.pack.kernels import segment_sums

    values = np.asarray(values, np.uint8)
    segments = [(s, n) for s, n in segments if s + n <= len(values)]
    src = np.array([s for s, _ in segments], np.int64)
    lengths = np.array([n for _, n in segments], np.int64)
    got = segment_sums(values, src, lengths)
    assert got.dtype == np.int64
    assert got.tolist() == [int(values[s : s + n].sum()) for s, n in segments]


def test_segment_sums_refuse_a_segment_outside_the_values():
    from packtool.pack.kernels import segment_sums

    with pytest.raises(ValueError, match="outside the 3 values"):
        segment_sums(np.zeros(3, np.uint8), [2], [2])


@pytest.mark.parametrize("entry", ["gather_segments", "segment_sums", "FlatIds.gather"])
def test_every_segment_entry_refuses_bad_shapes_and_negative_bounds(entry):
    """The three entry points check their segments with one function (`checked_segments`): a
    shape mismatch, a start below 0 and a negative length are refused by each (FlatIds over two
    chunks, which checks its own per-chunk bounds after)."""
    import pyarrow as pa

    from packtool.pack import kernels
    from packtool.pack.flat_ids import FlatIds

    values = np.arange(6, dtype=np.uint16)
    if entry == "FlatIds.gather":
        column = pa.chunked_array([pa.array([[0, 1, 2]], pa.list_(pa.uint16()))] * 2)
        call = FlatIds(column).gather
    else:
        fn = getattr(kernels, entry)
        call = lambda src, lengths: fn(values, src, lengths)  # noqa: E731
    with pytest.raises(ValueError, match="1-D of one shape"):
        call([0, 1], [1])
    with pytest.raises(ValueError, match="below 0 or has a negative length"):
        call([-1], [1])
    with pytest.raises(ValueError, match="below 0 or has a negative length"):
        call([2], [-1])
    assert len(call([1, 3], [2, 2])) == (4 if entry != "segment_sums" else 2)


# --- every group packed apart in one call (`--group-by`) ---


@st.composite
def grouped_inputs(draw):
    lengths, max_len = draw(packing_inputs())
    n_groups = draw(st.sampled_from([1, 3, 40, 500]))  # up to one group per document and more
    groups = draw(
        st.lists(st.integers(0, n_groups - 1), min_size=len(lengths), max_size=len(lengths))
    )
    return lengths, groups, max_len, n_groups


@settings(max_examples=150, deadline=None)
@given(grouped_inputs(), st.sampled_from(["ffd", "bfd"]))
def test_grouped_kernel_matches_the_references_group_by_group(case, algorithm):
    lengths, groups, max_len, n_groups = case
    reference = {"ffd": ffd_reference, "bfd": bfd_reference}[algorithm]
    row, offset, rows = grouped_assign(lengths, groups, max_len, algorithm, n_groups)
    assert rows.tolist() == [
        reference([x for x, h in zip(lengths, groups, strict=True) if h == g], max_len)[2]
        for g in range(n_groups)
    ]
    groups = np.asarray(groups, dtype=np.int64)
    for g in range(n_groups):
        mine = np.flatnonzero(groups == g)
        ref_row, ref_offset, _ = reference([lengths[i] for i in mine], max_len)
        assert (row[mine].tolist(), offset[mine].tolist()) == (ref_row, ref_offset)


def test_grouped_kernel_on_many_groups_equals_one_call_per_group():
    """1,000 groups of 1-40 documents (BFD's stacks are made once and reused from group to
    group: what one group leaves in them must not reach the next)."""
    rng = np.random.default_rng(7)
    groups = np.repeat(np.arange(1000), rng.integers(1, 40, 1000))
    rng.shuffle(groups)
    lengths = rng.integers(1, 2**16, len(groups)) // rng.choice([1, 1000], len(groups)) + 1
    for algorithm in ("ffd", "bfd"):
        row, offset, rows = grouped_assign(lengths, groups, 2**16, algorithm)
        for g in range(1000):
            mine = np.flatnonzero(groups == g)
            want = assign(lengths[mine], 2**16, algorithm)
            assert np.array_equal(row[mine], want[0]) and np.array_equal(offset[mine], want[1])
            assert rows[g] == want[2]


def test_grouped_kernel_refuses_bad_groups():
    with pytest.raises(ConfigError, match=r"^groups must be integers of shape \(2,\)"):
        grouped_assign([1, 2], [0], 8)
    with pytest.raises(ConfigError, match="^document 1 has group -1 < 0"):
        grouped_assign([1, 2], [0, -1], 8)
    with pytest.raises(ConfigError, match="^unknown packing algorithm 'nfd'"):
        grouped_assign([1, 2], [0, 0], 8, "nfd")
    row, offset, rows = grouped_assign([], [], 8, n_groups=3)
    assert row.size == offset.size == 0 and rows.tolist() == [0, 0, 0]
