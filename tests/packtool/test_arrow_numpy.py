"""packtool/arrow_numpy.py gives exactly what pyarrow's own conversions give, without pandas."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from packtool.arrow_numpy import from_numpy, strings, to_numpy

NUMERIC = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
NUMERIC += [np.float32, np.float64]
TYPES = [pa.from_numpy_dtype(np.dtype(d)) for d in NUMERIC]


@settings(max_examples=200, deadline=None)
@given(
    hnp.arrays(st.sampled_from(NUMERIC), st.integers(0, 40)),
    st.one_of(st.none(), st.sampled_from(TYPES)),
)
def test_from_numpy_equals_pa_array(values, type_):
    try:
        want = pa.array(values, type=type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError) as exc:
        with pytest.raises(type(exc)):
            from_numpy(values, type_)
        return
    got = from_numpy(values, type_)
    assert got.type == want.type
    assert got.null_count == want.null_count == 0
    np.testing.assert_array_equal(  # NaN equals NaN here, unlike Array.equals
        np.frombuffer(got.buffers()[1], got.type.to_pandas_dtype(), len(got)),
        np.frombuffer(want.buffers()[1], want.type.to_pandas_dtype(), len(want)),
    )


def test_from_numpy_is_zero_copy_and_takes_lists_and_strided_arrays():
    values = np.arange(10, dtype=np.uint16)
    got = from_numpy(values, pa.uint16())
    assert got.buffers()[1].address == values.ctypes.data
    assert from_numpy(values[::3]).to_pylist() == [0, 3, 6, 9]
    assert from_numpy([1, 2, 3], pa.int64()).equals(pa.array([1, 2, 3], pa.int64()))
    assert from_numpy(np.array([True, False])).equals(pa.array([True, False]))
    with pytest.raises(pa.ArrowInvalid):  # narrowing is range-checked, as pa.array does
        from_numpy(np.array([70000], np.int64), pa.uint16())


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(st.sampled_from(NUMERIC), st.integers(0, 40)), st.integers(0, 5), st.data())
def test_to_numpy_equals_pyarrow(values, start, data):
    arr = pa.array(values)
    arr = arr.slice(min(start, len(arr)), data.draw(st.integers(0, 40)))
    want = arr.to_numpy(zero_copy_only=False)
    got = to_numpy(arr)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    chunked = pa.chunked_array([arr, arr], type=arr.type)
    np.testing.assert_array_equal(to_numpy(chunked), np.concatenate([want, want]))


def test_to_numpy_with_nulls_falls_back():
    arr = pa.array([1, None, 3], pa.int32())
    np.testing.assert_array_equal(to_numpy(arr), arr.to_numpy(zero_copy_only=False))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=20)), max_size=30))
def test_strings_equals_pa_array(values):
    got = strings(values)
    want = pa.array(values, type=pa.string())
    got.validate(full=True)
    assert got.equals(want)
    assert got.null_count == want.null_count


@pytest.mark.parametrize(
    "record",
    [
        lambda i: {"text": f"document {i} " + "word " * i},
        lambda i: {"prompt": f"question {i}?", "completion": " answer" * (i % 7 + 1)},
    ],
    ids=["text", "prompt-completion"],
)
@pytest.mark.parametrize(
    "extra",
    # several partitions in this process: their tails and the merge of them (a stray
    # `np.sum` of a tail's column imported pandas there, and a Ctrl-C landing in that import
    # was lost: the run went on and exited 0)
    [[], ["--partition-size", "4KB", "--workers", "1"]],
    ids=["one-partition", "partitions"],
)
def test_pack_path_does_not_import_pandas(tmp_path, record, extra):
    """A whole `packtool pack` never imports pandas (~0.4 s of CPU per process): plain text and
    fine-tuning records (their tables are built by packtool/dataset/tokenized_table.py)."""
    import json

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps(record(i)) + "\n" for i in range(300)))
    code = (
        "import sys\n"
        "from packtool.cli.commands import main\n"
        f"try:\n    main(['pack', {str(corpus)!r}, '-o', {str(tmp_path / 'out')!r}, '--max-len', '64', *{extra!r}])\n"
        "except SystemExit as e:\n    assert not e.code, e.code\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "False", out.stdout + out.stderr
