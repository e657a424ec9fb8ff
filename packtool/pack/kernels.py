"""Bin-packing kernels (numba): first-fit-decreasing and best-fit-decreasing on plain arrays.

Both kernels place N documents into rows of capacity `max_len` in O(N log N) or better, the sort
included, with no linear scan over open rows:

- The sort is a stable counting sort on length (lengths are <= max_len): O(N + max_len), ties keep
  input order, so the result is deterministic.
- In decreasing order a document longer than max_len / 2 can never join an existing row (every
  open row already holds a document at least as long), so each one opens a row in O(1).
- FFD keeps a max segment tree over the rows' remaining capacity; leaves of rows not yet opened
  hold `max_len`, so descending to the leftmost leaf that fits either finds the first open row
  with room or opens the next row (O(log rows)).
- BFD keeps one stack of rows per remaining capacity 0..max_len and a segment tree of "stack is
  non-empty" flags over capacities; the smallest capacity >= the length is found in
  O(log max_len). Ties between rows with equal remaining capacity go to the row that reached that
  capacity most recently (the top of the stack), which costs O(1).

Rows are numbered in the order they were opened; within a row documents are laid out in placement
order, so a document's offset is the row's fill just before it was placed.

The kernels are single-threaded and release the GIL (`nogil`), so callers can run several at
once in threads (e.g. one per chunk, or one per candidate max length). Plain-Python references with the same tie rules live in
`packtool/pack/reference.py`; tests check the kernels give exactly the same assignment.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packtool.errors import ConfigError
from packtool.pack import jit
from packtool.pack.limits import ALGORITHMS, MAX_LEN_LIMIT, check_max_len, int64_lengths

__all__ = [
    "ALGORITHMS",
    "MAX_LEN_LIMIT",
    "assign",
    "bfd_assign",
    "check_max_len",
    "ff_assign",
    "ffd_assign",
    "gather_segments",
    "row_fill",
    "sort_decreasing",
    "split_lengths",
    "warm_up",
]

# --- numba kernels (plain arrays in and out; validated by the wrappers below) ---
#
# Both kernels work in "sorted space": the counting sort only counts, documents are then placed
# length by length (longest first) writing runs (k documents of one length back to back in one
# row) sequentially, and one final pass in input order gathers each document's result (the j-th document of length l in input order is the
# j-th of length l in sorted space, which is what makes ties stable). This touches the big
# per-document arrays in streams instead of at random, and lets a run of equal lengths go into
# one row in a single step: after a document of length l lands in the chosen row, that row stays
# the chosen one for the next document of length l as long as it still has room for it (first
# fit: every row to its left had less than l; best fit: no row had room in [l, its capacity)).


@jit.njit(cache=True, nogil=True)
def _length_counts(lengths, max_len):  # pragma: no cover - compiled
    counts = np.zeros(max_len + 1, np.int64)
    for i in range(lengths.size):
        counts[lengths[i]] += 1
    return counts


@jit.njit(cache=True, nogil=True)
def _first_positions(counts, max_len):  # pragma: no cover - compiled
    """first[l] = number of documents longer than l: where length l starts in sorted space."""
    first = np.zeros(max_len + 1, np.int64)
    acc = 0
    for length in range(max_len, 0, -1):
        first[length] = acc
        acc += counts[length]
    return first


@jit.njit(cache=True, nogil=True)
def _sort_decreasing(lengths, max_len):  # pragma: no cover - compiled
    """Stable counting sort: indices by decreasing length, ties in input order."""
    nxt = _first_positions(_length_counts(lengths, max_len), max_len)
    order = np.empty(lengths.size, np.int64)
    for i in range(lengths.size):
        length = lengths[i]
        order[nxt[length]] = i
        nxt[length] += 1
    return order


@jit.njit(cache=True, nogil=True)
def _row_bound(counts, max_len):  # pragma: no cover - compiled
    """An upper bound on the rows any first/best-fit packing opens.

    Any two rows of a first- or best-fit packing hold more than max_len tokens together (the
    later row's first document did not fit in the earlier row), so rows <= 2 * ceil(total /
    max_len) + 1; and never more rows than documents.
    """
    total = 0
    n = 0
    for length in range(1, max_len + 1):
        total += counts[length] * length
        n += counts[length]
    return max(min(2 * ((total + max_len - 1) // max_len) + 1, n), 1)


@jit.njit(cache=True, nogil=True)
def _unsort(lengths, max_len, first_run, run_row, run_off, run_k):  # pragma: no cover - compiled
    """Gather sorted-space runs back into input order.

    A run is k documents of one length placed back to back in one row from offset run_off; the
    runs of one length are contiguous, starting at first_run[length], in sorted-space order.
    """
    cur = first_run.copy()
    used = np.zeros(max_len + 1, np.int64)
    n = lengths.size
    row = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    for i in range(n):
        length = lengths[i]
        c = cur[length]
        u = used[length]
        row[i] = run_row[c]
        offset[i] = run_off[c] + u * length
        u += 1
        if u == run_k[c]:
            cur[length] = c + 1
            u = 0
        used[length] = u
    return row, offset


@jit.njit(cache=True, nogil=True, inline="always")
def _leftmost_fit(tree, size, length):  # pragma: no cover - compiled
    """Leaf index of the leftmost row whose remaining capacity is >= length (max segment tree)."""
    node = 1
    while node < size:
        node *= 2
        if tree[node] < length:
            node += 1
    return node


@jit.njit(cache=True, nogil=True, inline="always")
def _set_leaf(tree, node, value):  # pragma: no cover - compiled
    """Set a leaf and restore the max above it; stops at the first ancestor it does not change."""
    tree[node] = value
    node //= 2
    while node >= 1:
        a = tree[2 * node]
        b = tree[2 * node + 1]
        mx = a if a >= b else b
        if tree[node] == mx:
            break
        tree[node] = mx
        node //= 2


@jit.njit(cache=True, nogil=True)
def _ffd(lengths, max_len, proto):  # pragma: no cover - compiled
    n = lengths.size
    counts = _length_counts(lengths, max_len)
    bound = _row_bound(counts, max_len)
    size = 1
    while size < bound:
        size *= 2
    # tree[size + r] = remaining capacity of row r (max_len for rows not opened yet);
    # tree[node] = max of its children. dtype of `proto`: int16 when max_len allows.
    tree = np.empty(2 * size, proto.dtype)
    tree[:] = max_len
    # runs (see _unsort); at most one per document, pages past the last run are never touched
    first_run = np.zeros(max_len + 1, np.int64)
    run_row = np.empty(n, np.int64)
    run_off = np.empty(n, np.int32)
    run_k = np.empty(n, np.int32)
    half = max_len // 2

    # Documents longer than max_len / 2 each open a row of their own, in order.
    j = 0
    for length in range(max_len, half, -1):
        first_run[length] = j
        for _ in range(counts[length]):
            run_row[j] = j
            run_off[j] = 0
            run_k[j] = 1
            tree[size + j] = max_len - length
            j += 1
    n_rows = j
    if j > 0:
        for node in range(size - 1, 0, -1):
            a = tree[2 * node]
            b = tree[2 * node + 1]
            tree[node] = a if a >= b else b

    for length in range(half, 0, -1):
        first_run[length] = j
        m = counts[length]
        while m > 0:
            node = _leftmost_fit(tree, size, length)
            r = node - size
            rem = np.int64(tree[node])
            k = min(m, rem // length)
            run_row[j] = r
            run_off[j] = max_len - rem
            run_k[j] = k
            j += 1
            m -= k
            if r >= n_rows:
                n_rows = r + 1
            _set_leaf(tree, node, rem - k * length)
    row, offset = _unsort(lengths, max_len, first_run, run_row, run_off, run_k)
    return row, offset, n_rows


@jit.njit(cache=True, nogil=True)
def _ff(lengths, max_len):  # pragma: no cover - compiled
    """First fit in the given order (no sort), on the same max segment tree as `_ffd`."""
    n = lengths.size
    row = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    total = 0
    for i in range(n):
        total += lengths[i]
    # Any two first-fit rows hold more than max_len together: rows <= 2 * ceil(total/max_len) + 1.
    bound = max(min(2 * ((total + max_len - 1) // max_len) + 1, n), 1)
    size = 1
    while size < bound:
        size *= 2
    tree = np.full(2 * size, max_len, np.int32)
    n_rows = 0
    for i in range(n):
        length = lengths[i]
        node = _leftmost_fit(tree, size, length)
        r = node - size
        rem = tree[node]
        row[i] = r
        offset[i] = max_len - rem
        if r >= n_rows:
            n_rows = r + 1
        _set_leaf(tree, node, rem - length)
    return row, offset, n_rows


@jit.njit(cache=True, nogil=True)
def _flag_set(flags, size, c):  # pragma: no cover - compiled
    node = size + c
    while node >= 1 and flags[node] == 0:
        flags[node] = 1
        node //= 2


@jit.njit(cache=True, nogil=True)
def _flag_clear(flags, size, c):  # pragma: no cover - compiled
    node = size + c
    flags[node] = 0
    node //= 2
    while node >= 1:
        f = flags[2 * node] | flags[2 * node + 1]
        if flags[node] == f:
            break
        flags[node] = f
        node //= 2


@jit.njit(cache=True, nogil=True)
def _flag_find_ge(flags, size, c):  # pragma: no cover - compiled
    """Smallest set leaf index >= c, or -1."""
    node = size + c
    if flags[node]:
        return c
    while node > 1:
        if node % 2 == 0 and flags[node + 1]:
            node += 1
            while node < size:
                node *= 2
                if flags[node] == 0:
                    node += 1
            return node - size
        node //= 2
    return -1


@jit.njit(cache=True, nogil=True)
def _bfd(lengths, max_len):  # pragma: no cover - compiled
    n = lengths.size
    counts = _length_counts(lengths, max_len)
    bound = _row_bound(counts, max_len)
    # head[c]: the row on top of the stack of rows with remaining capacity c (-1: empty);
    # below[r]: the next row down the stack holding row r.
    head = np.full(max_len + 1, -1, np.int64)
    below = np.empty(bound, np.int64)
    size = 1
    while size < max_len + 1:
        size *= 2
    flags = np.zeros(2 * size, np.uint8)  # flags[size + c] = 1 iff the stack for c is non-empty
    first_run = np.zeros(max_len + 1, np.int64)
    run_row = np.empty(n, np.int64)
    run_off = np.empty(n, np.int32)
    run_k = np.empty(n, np.int32)
    half = max_len // 2
    n_rows = 0
    j = 0
    for length in range(max_len, 0, -1):
        first_run[length] = j
        m = counts[length]
        while m > 0:
            c = -1 if length > half else _flag_find_ge(flags, size, length)
            if c < 0:
                r = n_rows
                n_rows += 1
                c = max_len
            else:
                r = head[c]
                head[c] = below[r]
                if head[c] < 0:
                    _flag_clear(flags, size, c)
            k = min(m, c // length)
            run_row[j] = r
            run_off[j] = max_len - c
            run_k[j] = k
            j += 1
            m -= k
            c -= k * length
            if c > 0:
                below[r] = head[c]
                if head[c] < 0:
                    _flag_set(flags, size, c)
                head[c] = r
    row, offset = _unsort(lengths, max_len, first_run, run_row, run_off, run_k)
    return row, offset, n_rows


@jit.njit(cache=True, nogil=True)
def _split(lengths, max_len):  # pragma: no cover - compiled
    n_chunks = 0
    for i in range(lengths.size):
        n_chunks += (lengths[i] + max_len - 1) // max_len
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


# --- typed wrappers: validate once, then call the kernel ---


def _validated(lengths: ArrayLike, max_len: int) -> tuple[NDArray[np.integer], int]:
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


def _empty() -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    return np.empty(0, np.int64), np.empty(0, np.int64), 0


def ffd_assign(
    lengths: ArrayLike, max_len: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """First-fit-decreasing: each document, longest first, goes to the first row it fits in.

    Args:
        lengths: Document lengths in tokens, integers with 1 <= length <= max_len.
        max_len: Row capacity in tokens.

    Returns:
        `(row, offset, n_rows)`: per document, in input order, its row index (rows numbered in
        the order they were opened) and its token offset inside the row (int64 arrays), and the
        number of rows.

    Raises:
        ConfigError: `max_len` is not a positive integer or a length is outside 1..max_len.
    """
    arr, max_len = _validated(lengths, max_len)
    if arr.size == 0:
        return _empty()
    proto = np.empty(0, np.int16 if max_len <= np.iinfo(np.int16).max else np.int32)
    row, offset, n_rows = _ffd(arr, max_len, proto)
    return row, offset, int(n_rows)


def bfd_assign(
    lengths: ArrayLike, max_len: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """Best-fit-decreasing: each document, longest first, goes to the fullest row it fits in.

    Ties between rows with the same remaining capacity go to the row that reached that capacity
    most recently. Arguments, return value and errors as in `ffd_assign`.
    """
    arr, max_len = _validated(lengths, max_len)
    if arr.size == 0:
        return _empty()
    row, offset, n_rows = _bfd(arr, max_len)
    return row, offset, int(n_rows)


def ff_assign(lengths: ArrayLike, max_len: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """First fit in the given order: each document goes to the first row it fits in.

    Used by the multi-round repack, which shuffles a pool of documents and first-fits them
    again (sorting would undo the shuffle). Arguments, return value and errors as in
    `ffd_assign`.
    """
    arr, max_len = _validated(lengths, max_len)
    if arr.size == 0:
        return _empty()
    row, offset, n_rows = _ff(arr, max_len)
    return row, offset, int(n_rows)


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


def warm_up() -> None:
    """Load every kernel from numba's cache (or compile it) on tiny inputs.

    The first call of each kernel in a process costs ~0.1-0.2 s of cache loading. The engines
    warm these and flat_ids' together (`packtool.pack.warmup.warm_up`).
    """
    lengths = np.array([3, 2, 1], dtype=np.int64)
    ffd_assign(lengths, 4)
    bfd_assign(lengths, 4)
    ff_assign(lengths, 4)
    split_lengths(np.array([5], dtype=np.int64), 4)
    for dtype in (np.uint8, np.uint16, np.uint32):  # uint8: loss masks
        gather_segments(np.arange(4, dtype=dtype), [0], [2])
    segment_sums(np.arange(4, dtype=np.uint8), [0], [2])


def assign(
    lengths: ArrayLike, max_len: int, algorithm: str = "ffd"
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """`ffd_assign` or `bfd_assign` by name (`algorithm` in `ALGORITHMS`)."""
    if algorithm == "ffd":
        return ffd_assign(lengths, max_len)
    if algorithm == "bfd":
        return bfd_assign(lengths, max_len)
    raise ConfigError(f"unknown packing algorithm {algorithm!r}; choose one of {list(ALGORITHMS)}")


def sort_decreasing(lengths: ArrayLike, max_len: int) -> NDArray[np.int64]:
    """Document indices by decreasing length, ties in input order (stable counting sort)."""
    arr, max_len = _validated(lengths, max_len)
    if arr.size == 0:
        return np.empty(0, np.int64)
    return _sort_decreasing(arr, max_len)


def row_fill(row: ArrayLike, lengths: ArrayLike, n_rows: int) -> NDArray[np.int64]:
    """Tokens per row: the sum of `lengths` over the documents assigned to each row."""
    row = np.asarray(row, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if row.shape != lengths.shape:
        raise ValueError(f"row and lengths differ in shape: {row.shape} vs {lengths.shape}")
    # float64 weights are exact below 2**53 tokens
    return np.bincount(row, weights=lengths, minlength=n_rows).astype(np.int64)


def split_lengths(lengths: ArrayLike, max_len: int) -> NDArray[np.int32]:
    """Chunk lengths after cutting each document into `max_len`-token pieces plus a remainder.

    Chunks come in input order (a document's pieces in order); empty documents give none.

    Raises:
        ConfigError: `max_len` is not an integer in 1..MAX_LEN_LIMIT, or a length is negative or
            not an int.
    """
    max_len = check_max_len(max_len)
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(f"lengths must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    arr = int64_lengths(arr)
    if arr.size and arr.min() < 0:
        raise ConfigError(f"document {int(np.argmin(arr))} has negative length {int(arr.min())}")
    return _split(np.ascontiguousarray(arr), int(max_len))
