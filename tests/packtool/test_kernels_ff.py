"""First fit in input order (the multi-round repack's kernel) against its plain reference."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool._reference import ff_reference
from packtool.kernels import ff_assign


def test_ff_keeps_input_order_hand_checked():
    # In order: 1 -> row 0, 3 -> row 0 (fills it), 2 -> row 1, 2 -> row 1.
    row, offset, n = ff_assign([1, 3, 2, 2], 4)
    assert (row.tolist(), offset.tolist(), n) == ([0, 0, 1, 1], [0, 1, 0, 2], 2)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 64).flatmap(
    lambda m: st.tuples(st.just(m), st.lists(st.integers(1, m), max_size=200))
))
def test_ff_matches_reference(case):
    max_len, lengths = case
    row, offset, n = ff_assign(np.array(lengths, dtype=np.int64), max_len)
    ref_row, ref_offset, ref_n = ff_reference(lengths, max_len)
    assert (row.tolist(), offset.tolist(), n) == (ref_row, ref_offset, ref_n)
