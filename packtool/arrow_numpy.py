"""numpy <-> Arrow for the pack path, without pandas.

pyarrow's `pa.array(ndarray)` and `Array.to_numpy()` import pandas on their first call (pyarrow
checks for pandas types): about 0.4 s of CPU with the GIL held, in a command that never uses
pandas. These helpers go through the buffers instead, zero-copy where the dtypes match, and fall
back to pyarrow's own conversion for anything else (nulls, booleans, a narrowing cast), so the
values are always exactly those `pa.array` / `to_numpy` would give.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

_NUMPY_OF = {
    pa.int8(): np.dtype(np.int8),
    pa.int16(): np.dtype(np.int16),
    pa.int32(): np.dtype(np.int32),
    pa.int64(): np.dtype(np.int64),
    pa.uint8(): np.dtype(np.uint8),
    pa.uint16(): np.dtype(np.uint16),
    pa.uint32(): np.dtype(np.uint32),
    pa.uint64(): np.dtype(np.uint64),
    pa.float32(): np.dtype(np.float32),
    pa.float64(): np.dtype(np.float64),
}
_ARROW_OF = {v: k for k, v in _NUMPY_OF.items()}


def from_numpy(values: np.ndarray | Sequence[int], type: pa.DataType | None = None) -> pa.Array:
    """`pa.array(values, type)` for a 1-D integer or float array, without a null.

    Zero-copy when `values` already has `type`'s dtype; widened with numpy when that is exact
    (integer to a wider integer, float to a wider float); anything else (a narrowing cast pyarrow range-checks, booleans,
    Python lists of objects) goes to `pa.array` itself.
    """
    arr = np.asarray(values)
    if type is None:
        type = _ARROW_OF.get(arr.dtype)
        if type is None:
            return pa.array(values)
    want = _NUMPY_OF.get(type)
    if want is None or arr.ndim != 1 or not _exact(arr.dtype, want):
        return pa.array(values, type=type)
    arr = np.ascontiguousarray(arr, dtype=want)
    return pa.Array.from_buffers(type, len(arr), [None, pa.py_buffer(arr)])


def _exact(have: np.dtype, want: np.dtype) -> bool:
    """numpy's cast from `have` to `want` keeps every value (int -> float never counts: pyarrow
    range-checks it, numpy rounds 2**53 + 1)."""
    if have == want:
        return True
    same_kind = (have.kind in "iu" and want.kind in "iu") or have.kind == want.kind == "f"
    return same_kind and np.can_cast(have, want, "safe")


def to_numpy(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`arr.to_numpy(zero_copy_only=False)`: a zero-copy view of a null-free numeric array."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    dtype = _NUMPY_OF.get(arr.type)
    if dtype is None or arr.null_count:
        return arr.to_numpy(zero_copy_only=False)
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset :]


def strings(values: Sequence[str | None]) -> pa.Array:
    """`pa.array(values, pa.string())` for Python strings (None is null); per-string work only.
    A lone surrogate (a file name that is not UTF-8, as Python decodes it) is written as its
    escape (`\\udce9`): the column stays valid UTF-8."""
    try:
        encoded = [b"" if v is None else v.encode("utf-8") for v in values]
    except UnicodeEncodeError:
        encoded = [b"" if v is None else v.encode("utf-8", "backslashreplace") for v in values]
    n = len(encoded)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, encoded), dtype=np.int64, count=n), out=offsets[1:])
    if offsets[-1] >= 2**31 - 1:  # beyond int32 offsets: pyarrow raises its own error
        return pa.array(values, type=pa.string())
    valid = None
    if any(v is None for v in values):
        mask = np.fromiter((v is not None for v in values), dtype=bool, count=n)
        valid = pa.py_buffer(np.packbits(mask, bitorder="little"))
    buffers = [valid, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(pa.string(), n, buffers)
