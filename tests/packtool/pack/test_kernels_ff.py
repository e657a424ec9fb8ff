"""First fit in input order (the repack kernel) and the segment gather, against plain references."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.pack.kernels import ff_assign
from packtool.pack.reference import ff_reference


def test_ff_keeps_input_order_hand_checked():
    # In order: 1 -> row 0, 3 -> row 0 (fills it), 2 -> row 1, 2 -> row 1.
    row, offset, n = ff_assign([1, 3, 2, 2], 4)
    assert (row.tolist(), offset.tolist(), n) == ([0, 0, 1, 1], [0, 1, 0, 2], 2)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 64).flatmap(
        lambda m: st.tuples(st.just(m), st.lists(st.integers(1, m), max_size=200))
    )
)
def test_ff_matches_reference(case):
    max_len, lengths = case
    row, offset, n = ff_assign(np.array(lengths, dtype=np.int64), max_len)
    ref_row, ref_offset, ref_n = ff_reference(lengths, max_len)
    assert (row.tolist(), offset.tolist(), n) == (ref_row, ref_offset, ref_n)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 10)), max_size=30))
def test_gather_segments_matches_slicing(segments):
    from packtool.pack.kernels import gather_segments

    values = np.arange(40, dtype=np.uint16) * 3
    segments = [(s, min(n, 40 - s)) for s, n in segments]
    src = np.array([s for s, _ in segments], dtype=np.int64)
    lengths = np.array([n for _, n in segments], dtype=np.int64)
    got = gather_segments(values, src, lengths)
    expected = [int(v) for s, n in segments for v in values[s : s + n]]
    assert got.dtype == values.dtype and got.tolist() == expected


def test_gather_segments_rejects_out_of_range():
    import pytest

    from packtool.pack.kernels import gather_segments

    with pytest.raises(ValueError, match="outside"):
        gather_segments(np.arange(5), [3], [4])


def test_warm_up_loads_every_kernel():
    from packtool.pack import kernels, segments

    kernels.warm_up()
    for fn in (kernels._decreasing, kernels.first_fit, kernels._grouped, segments._split):
        assert fn.signatures, fn
    # token ids come as uint16 or uint32: both gather specialisations are loaded
    dtypes = {str(sig[0].dtype) for sig in segments._gather_segments.signatures}
    assert {"uint16", "uint32"} <= dtypes
