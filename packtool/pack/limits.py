"""The packer's options and their bounds, checked without loading the kernels (numba).

The loader validates its settings (`loader.config`) against these when a config is made, and
packtool/pack/kernels.py and packtool/pack/chunk.py use them; keeping them here lets a process
that only reads packed shards skip numba's import (~0.4 s).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packtool.dataset.manifest_check import ALGORITHMS, LONG_DOC_POLICIES, MAX_LEN_LIMIT
from packtool.errors import ConfigError

__all__ = [
    "ALGORITHMS",
    "LONG_DOC_POLICIES",
    "MAX_LEN_LIMIT",
    "MAX_SPLIT_CHUNKS",
    "check_long_docs",
    "check_max_len",
    "check_split_chunks",
    "checked_lengths",
    "int64_lengths",
]

MAX_SPLIT_CHUNKS = 2**31 - 1
"""Chunks one cut of lengths at max_len may make (`split_lengths`, `chunk.make_segments`):
their arrays are allocated before anything else looks at them, so a length far past any real
document (2**40 at max_len 8: 2**37 chunks, a 0.5-1 TiB allocation) was a bare MemoryError.
2**31 - 1 is past what `stats` is sized for (docs/stats.md: 10^9 documents); read at each call
(tests lower it)."""


def check_long_docs(long_docs: object) -> None:
    """`ConfigError` unless `long_docs` is one of `LONG_DOC_POLICIES`."""
    if long_docs not in LONG_DOC_POLICIES:
        raise ConfigError(
            f"long_docs {long_docs!r} is unknown; choose one of {list(LONG_DOC_POLICIES)}"
        )


def check_max_len(max_len: object, name: str = "max_len", minimum: int = 1) -> int:
    """`max_len` as an int if it is an integer in [minimum, MAX_LEN_LIMIT], else `ConfigError`."""
    if isinstance(max_len, bool) or not isinstance(max_len, (int, np.integer)) or max_len < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ConfigError(f"{name} must be {what}, got {max_len!r}")
    if max_len > MAX_LEN_LIMIT:
        raise ConfigError(
            f"{name} {max_len} is too large: at most {MAX_LEN_LIMIT:,} (2**24) tokens per row "
            "are supported (memory grows with the row length)"
        )
    return int(max_len)


def int64_lengths(arr: np.ndarray) -> np.ndarray:
    """An integer array of lengths as int64 (int32 kept as it is), else a `ConfigError` naming
    the first unsigned value int64 cannot hold (a cast would wrap it to a negative one)."""
    if arr.dtype in (np.int32, np.int64):
        return arr
    if arr.dtype.kind == "u" and arr.size and arr.max() > np.iinfo(np.int64).max:
        i = int(np.argmax(arr))
        raise ConfigError(
            f"document {i} has length {int(arr[i])}, more than the 2**63 - 1 tokens a length "
            "can count (int64)"
        )
    return arr.astype(np.int64)


def checked_lengths(lengths: ArrayLike, max_len: int) -> tuple[NDArray[np.integer], int]:
    """Lengths for the packing kernels: a contiguous 1-D integer array (int64, or int32 kept)
    of values in 1..max_len, and max_len as an int; else a `ConfigError` naming the first bad one."""
    max_len = check_max_len(max_len)
    arr = np.asarray(lengths)
    if arr.ndim != 1:
        raise ConfigError(f"lengths must be a 1-D array, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"lengths must be integers, got dtype {arr.dtype}")
    arr = int64_lengths(arr)
    arr = np.ascontiguousarray(arr)
    if arr.size:
        lo, hi = int(arr.min()), int(arr.max())
        if lo < 1:
            i = int(np.argmin(arr))
            raise ConfigError(f"document {i} has length {lo}; lengths must be >= 1")
        if hi > max_len:
            i = int(np.argmax(arr))
            raise ConfigError(
                f"document {i} has length {hi} > max_len {max_len}; split long documents first"
            )
    return arr, int(max_len)


def check_split_chunks(lengths: NDArray[np.integer], max_len: int, total: int) -> None:
    """`ConfigError` naming the longest document when `total`, the chunks `lengths` cut at
    `max_len` make (or any count past the bound where the counting stopped early), is more
    than `MAX_SPLIT_CHUNKS`."""
    bound = MAX_SPLIT_CHUNKS
    if total <= bound:
        return
    i = int(np.argmax(lengths))
    length = int(lengths[i])
    raise ConfigError(
        f"document {i} has length {length:,}: cut at max_len {max_len:,} it alone makes "
        f"{-(-length // max_len):,} chunks, and the lengths more than the {bound:,} chunks "
        "a split may hold; check the lengths (a token count per document)"
    )
