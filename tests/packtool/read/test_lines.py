"""packtool/read/lines.py: line numbers of many byte offsets, counted in one scan."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.read.lines import line_numbers


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=300).map(lambda b: b.replace(b"\r", b"\n")),
    offsets=st.lists(st.integers(0, 320), max_size=20),
)
def test_line_numbers_agree_with_counting_each_offset_alone(data, offsets):
    """Each offset's answer is what one look at the file says: the line starting there, or
    None inside a line, at the end or past it."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "a.jsonl"
        path.write_bytes(data)
        found = line_numbers(path, offsets)
    assert set(found) == set(offsets)
    for o in offsets:
        starts = o < len(data) and (o == 0 or data[o - 1 : o] == b"\n")
        assert found[o] == (data[:o].count(b"\n") + 1 if starts else None)
