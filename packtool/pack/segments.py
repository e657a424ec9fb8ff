"""Segments (numba): documents cut into pieces, and pieces gathered or summed from flat arrays.

A segment is `values[src[i] : src[i] + lengths[i]]`: the packed rows' tokens and per-token
columns are such segments of a chunk's flat arrays (packtool/pack/flat_ids.py, columns.py,
tail.py; the loader's online packer), a piece's supervised tokens a sum over one, and
`split_lengths` gives the pieces' lengths of documents cut at max_len. Apart from the
bin-packing kernels (packtool/pack/kernels.py, which re-exports these names): they place
nothing.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packtool.errors import ConfigError
from packtool.pack import jit, limits
from packtool.pack.limits import check_max_len, check_split_chunks, int64_lengths

__all__ = ["checked_segments", "gather_segments", "segment_sums", "split_lengths"]


@jit.njit(cache=True, nogil=True)
def _gather_segments(values, src, lengths):  # pragma: no cover - compiled
    total = 0
    for i in range(lengths.size):
        total += lengths[i]
    out = np.empty(total, values.dtype)
    pos = 0
    for i in range(lengths.size):
        s = src[i]
        for t in range(lengths[i]):
            out[pos + t] = values[s + t]
        pos += lengths[i]
    return out


@jit.njit(cache=True, nogil=True)
def _segment_sums(values, src, lengths):  # pragma: no cover - compiled
    out = np.zeros(lengths.size, np.int64)
    for i in range(lengths.size):
        s = src[i]
        acc = 0
        for t in range(lengths[i]):
            acc += values[s + t]
        out[i] = acc
    return out


@jit.njit(cache=True, nogil=True)
def _count_chunks(lengths, max_len, bound):  # pragma: no cover - compiled
    """Chunks the lengths make cut at max_len; stops at the first count past `bound`."""
    n_chunks = 0
    for i in range(lengths.size):
        x = lengths[i]
        n_chunks += x // max_len + (1 if x % max_len else 0)  # x + max_len could overflow
        if n_chunks > bound:
            break
    return n_chunks


@jit.njit(cache=True, nogil=True)
def _split(lengths, max_len, n_chunks):  # pragma: no cover - compiled
    out = np.empty(n_chunks, np.int32)
    j = 0
    for i in range(lengths.size):
        x = lengths[i]
        while x > max_len:
            out[j] = max_len
            j += 1
            x -= max_len
        if x > 0:
            out[j] = x
            j += 1
    return out


def checked_segments(
    src: ArrayLike, lengths: ArrayLike, size: int | None
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Segments `[src[i], src[i] + lengths[i])` as two contiguous int64 arrays, checked: of one
    1-D shape, none starting below 0 or negative, and (`size` given) none past `size` (None: the
    caller checks the bounds, as `FlatIds.gather` does per chunk).

    Raises:
        ValueError: a shape or a segment out of bounds.
    """
    src = np.ascontiguousarray(src, dtype=np.int64)
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if src.shape != lengths.shape or src.ndim != 1:
        raise ValueError(
            f"src and lengths must be 1-D of one shape, got {src.shape}, {lengths.shape}"
        )
    if src.size and (src.min() < 0 or lengths.min() < 0):
        raise ValueError("a segment starts below 0 or has a negative length")
    if size is not None and src.size and (src + lengths).max() > size:
        raise ValueError(f"a segment falls outside the {size} values")
    return src, lengths


def gather_segments(values: NDArray, src: ArrayLike, lengths: ArrayLike) -> NDArray:
    """Concatenate `values[src[i] : src[i] + lengths[i]]` for every i, in one pass.

    The packed rows' tokens: one output allocation, no index array as long as the output.

    Raises:
        ValueError: `src` and `lengths` differ in shape, or a segment falls outside `values`.
    """
    src, lengths = checked_segments(src, lengths, len(values))
    return _gather_segments(np.ascontiguousarray(values), src, lengths)


def segment_sums(values: NDArray, src: ArrayLike, lengths: ArrayLike) -> NDArray[np.int64]:
    """`values[src[i] : src[i] + lengths[i]].sum()` for every i, in one pass (int64).

    The supervised tokens of each packed piece: numpy's cumulative sum of a uint8 mask into
    int64 takes ~6-25 ns per value; this loop ~1.

    Raises:
        ValueError: as `gather_segments`.
    """
    src, lengths = checked_segments(src, lengths, len(values))
    return _segment_sums(np.ascontiguousarray(values), src, lengths)


def split_lengths(lengths: ArrayLike, max_len: int) -> NDArray[np.int32]:
    """Chunk lengths after cutting each document into `max_len`-token pieces plus a remainder.

    Chunks come in input order (a document's pieces in order); empty documents give none.

    Raises:
        ConfigError: `max_len` is not an integer in 1..MAX_LEN_LIMIT, a length is negative or
            not an int, or the chunks would be more than `limits.MAX_SPLIT_CHUNKS` (counted
            before any is allocated).
    """
    max_len = check_max_len(max_len)
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(f"lengths must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    arr = int64_lengths(arr)
    if arr.size and arr.min() < 0:
        raise ConfigError(f"document {int(np.argmin(arr))} has negative length {int(arr.min())}")
    arr = np.ascontiguousarray(arr)
    n_chunks = _count_chunks(arr, max_len, limits.MAX_SPLIT_CHUNKS)
    check_split_chunks(arr, max_len, int(n_chunks))
    return _split(arr, max_len, n_chunks)
