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
order, so a document's offset is the row's fill just before it was placed. `grouped_assign` packs
each group of `--group-by` apart in one call, at a cost of its own documents per group.

The kernels are single-threaded and release the GIL (`nogil`), so callers can run several at
once in threads (e.g. one per chunk, or one per candidate max length). Plain-Python references with the same tie rules live in
`packtool/pack/reference.py`; tests check the kernels give exactly the same assignment.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packtool.errors import ConfigError
from packtool.pack import jit
from packtool.pack.limits import ALGORITHMS, MAX_LEN_LIMIT, check_max_len, checked_lengths
from packtool.pack.segments import checked_segments, gather_segments, segment_sums, split_lengths

__all__ = [
    "ALGORITHMS",
    "MAX_LEN_LIMIT",
    "assign",
    "bfd_assign",
    "check_max_len",
    "checked_segments",
    "ff_assign",
    "ffd_assign",
    "first_fit",
    "gather_segments",
    "grouped_assign",
    "row_fill",
    "segment_sums",
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
def _distinct(counts, max_len):  # pragma: no cover - compiled
    """The lengths a histogram holds, longest first, and how many documents have each."""
    d = 0
    for length in range(1, max_len + 1):
        if counts[length]:
            d += 1
    lens = np.empty(d, np.int64)
    cnts = np.empty(d, np.int64)
    d = 0
    for length in range(max_len, 0, -1):
        if counts[length]:
            lens[d] = length
            cnts[d] = counts[length]
            d += 1
    return lens, cnts


@jit.njit(cache=True, nogil=True)
def _row_bound(lens, cnts, d, max_len):  # pragma: no cover - compiled
    """An upper bound on the rows any first/best-fit packing of the documents opens (`cnts[i]`
    of length `lens[i]`, i < d).

    Any two rows of a first- or best-fit packing hold more than max_len tokens together (the
    later row's first document did not fit in the earlier row), so rows <= 2 * ceil(total /
    max_len) + 1; and never more rows than documents.
    """
    total = 0
    n = 0
    for i in range(d):
        total += cnts[i] * lens[i]
        n += cnts[i]
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


@jit.njit(cache=True, nogil=True)
def _runs(n):  # pragma: no cover - compiled
    """run_row, run_off, run_k: at most one run per document."""
    return np.empty(n, np.int64), np.empty(n, np.int32), np.empty(n, np.int32)


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
def _ffd_runs(lens, cnts, d, max_len, proto, first, run_row, run_off, run_k):  # pragma: no cover
    """FFD in sorted space: `cnts[i]` documents of length `lens[i]` (i < d, longest first).

    Writes the runs (see `_unsort`) from index 0 and `first[i]`, the first run of `lens[i]`;
    returns (runs, rows). Nothing here is sized by max_len: the tree has a leaf per row the
    documents can open, so a group of a few documents costs a few steps (chunk.py packs each
    group of `--group-by` on its own).
    """
    bound = _row_bound(lens, cnts, d, max_len)
    size = 1
    while size < bound:
        size *= 2
    # tree[size + r] = remaining capacity of row r (max_len for rows not opened yet);
    # tree[node] = max of its children. dtype of `proto`: int16 when max_len allows.
    tree = np.empty(2 * size, proto.dtype)
    tree[:] = max_len
    half = max_len // 2

    # Documents longer than max_len / 2 each open a row of their own, in order.
    j = 0
    i = 0
    while i < d and lens[i] > half:
        first[i] = j
        length = lens[i]
        for _ in range(cnts[i]):
            run_row[j] = j
            run_off[j] = 0
            run_k[j] = 1
            tree[size + j] = max_len - length
            j += 1
        i += 1
    n_rows = j
    if j > 0:
        for node in range(size - 1, 0, -1):
            a = tree[2 * node]
            b = tree[2 * node + 1]
            tree[node] = a if a >= b else b

    while i < d:
        length = lens[i]
        first[i] = j
        m = cnts[i]
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
        i += 1
    return j, n_rows


@jit.njit(cache=True, nogil=True)
def first_fit(lengths, max_len):  # pragma: no cover - compiled
    """First fit in the given order (no sort), on the same max segment tree as `_ffd_runs`."""
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
def _bfd_stacks(max_len):  # pragma: no cover - compiled
    """BFD's stacks by remaining capacity, all empty: (head, flags, size) (see `_bfd_runs`)."""
    size = 1
    while size < max_len + 1:
        size *= 2
    return np.full(max_len + 1, -1, np.int64), np.zeros(2 * size, np.uint8), size


@jit.njit(cache=True, nogil=True)
def _bfd_runs(
    lens, cnts, d, max_len, head, flags, size, first, run_row, run_off, run_k
):  # pragma: no cover - compiled
    """BFD in sorted space, as `_ffd_runs`, on the stacks of `_bfd_stacks`.

    head[c]: the row on top of the stack of rows with remaining capacity c (-1: empty);
    flags[size + c] = 1 iff that stack is non-empty. They are sized by max_len, so they are
    made once and handed in (chunk.py packs thousands of groups of a chunk with one pair), and
    left as found: every stack empty again, undoing only the capacities this call's rows hold.
    """
    bound = _row_bound(lens, cnts, d, max_len)
    below = np.empty(bound, np.int64)  # below[r]: the next row down the stack holding row r
    left = np.empty(bound, np.int64)  # left[r]: row r's remaining capacity
    half = max_len // 2
    n_rows = 0
    j = 0
    for i in range(d):
        length = lens[i]
        first[i] = j
        m = cnts[i]
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
            left[r] = c
            if c > 0:
                below[r] = head[c]
                if head[c] < 0:
                    _flag_set(flags, size, c)
                head[c] = r
    for r in range(n_rows):  # every row with room is on the stack of its capacity: empty them
        c = left[r]
        if c > 0 and head[c] >= 0:
            head[c] = -1
            _flag_clear(flags, size, c)
    return j, n_rows


@jit.njit(cache=True, nogil=True)
def _decreasing(lengths, max_len, best_fit, proto):  # pragma: no cover - compiled
    """FFD (or BFD) of one set of documents: the counting sort, the runs, then each document's
    row and offset in input order (`_unsort`)."""
    lens, cnts = _distinct(_length_counts(lengths, max_len), max_len)
    first = np.empty(lens.size, np.int64)
    run_row, run_off, run_k = _runs(lengths.size)
    if best_fit:
        head, flags, size = _bfd_stacks(max_len)
        args = (head, flags, size, first, run_row, run_off, run_k)
        _, n_rows = _bfd_runs(lens, cnts, lens.size, max_len, *args)
    else:
        _, n_rows = _ffd_runs(lens, cnts, lens.size, max_len, proto, first, run_row, run_off, run_k)
    first_run = np.zeros(max_len + 1, np.int64)
    for i in range(lens.size):
        first_run[lens[i]] = first[i]
    row, offset = _unsort(lengths, max_len, first_run, run_row, run_off, run_k)
    return row, offset, n_rows


@jit.njit(cache=True, nogil=True)
def _grouped(lengths, order, starts, max_len, best_fit, proto):  # pragma: no cover - compiled
    """FFD (or BFD) of each group's documents on their own, in one call.

    `order` lists the documents group by group (group g: order[starts[g]:starts[g + 1]]), each
    group's longest first, ties in input order: its sorted space. Returns (row, offset) per
    document, rows numbered within its group, and the rows of each group. The work buffers are
    made once for all groups, and a group's pass costs its own documents (plus O(log max_len)
    per step of BFD), never max_len: 10^5 groups of one document each are 10^5 short steps.
    """
    n = lengths.size
    n_groups = starts.size - 1
    row = np.empty(n, np.int64)
    offset = np.empty(n, np.int64)
    rows = np.zeros(n_groups, np.int64)
    lens = np.empty(n, np.int64)
    cnts = np.empty(n, np.int64)
    first = np.empty(n, np.int64)
    run_row, run_off, run_k = _runs(n)
    head, flags, size = _bfd_stacks(max_len if best_fit else 0)
    for g in range(n_groups):
        a = starts[g]
        b = starts[g + 1]
        d = np.int64(0)  # not a literal 0: `_ffd_runs`, `_bfd_runs` would compile for it too
        for p in range(a, b):  # the group's distinct lengths, longest first
            length = lengths[order[p]]
            if d == 0 or lens[d - 1] != length:
                lens[d] = length
                cnts[d] = 0
                d += 1
            cnts[d - 1] += 1
        if d == 0:
            continue
        if best_fit:
            runs, n_rows = _bfd_runs(
                lens, cnts, d, max_len, head, flags, size, first, run_row, run_off, run_k
            )
        else:
            runs, n_rows = _ffd_runs(lens, cnts, d, max_len, proto, first, run_row, run_off, run_k)
        rows[g] = n_rows
        p = a
        for j in range(runs):  # runs come in sorted-space order: the group's documents in turn
            length = lengths[order[p]]
            for t in range(run_k[j]):
                i = order[p]
                row[i] = run_row[j]
                offset[i] = run_off[j] + t * length
                p += 1
    return row, offset, rows


# --- typed wrappers: validate once, then call the kernel ---


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
    arr, max_len = checked_lengths(lengths, max_len)
    if arr.size == 0:
        return _empty()
    row, offset, n_rows = _decreasing(arr, max_len, False, _tree_proto(max_len))
    return row, offset, int(n_rows)


def _tree_proto(max_len: int) -> NDArray:
    """FFD's capacity tree's dtype, as an empty array: int16 where max_len allows."""
    return np.empty(0, np.int16 if max_len <= np.iinfo(np.int16).max else np.int32)


def bfd_assign(
    lengths: ArrayLike, max_len: int
) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """Best-fit-decreasing: each document, longest first, goes to the fullest row it fits in.

    Ties between rows with the same remaining capacity go to the row that reached that capacity
    most recently. Arguments, return value and errors as in `ffd_assign`.
    """
    arr, max_len = checked_lengths(lengths, max_len)
    if arr.size == 0:
        return _empty()
    row, offset, n_rows = _decreasing(arr, max_len, True, _tree_proto(max_len))
    return row, offset, int(n_rows)


def ff_assign(lengths: ArrayLike, max_len: int) -> tuple[NDArray[np.int64], NDArray[np.int64], int]:
    """First fit in the given order: each document goes to the first row it fits in.

    Used by the multi-round repack, which shuffles a pool of documents and first-fits them
    again (sorting would undo the shuffle). Arguments, return value and errors as in
    `ffd_assign`.
    """
    arr, max_len = checked_lengths(lengths, max_len)
    if arr.size == 0:
        return _empty()
    row, offset, n_rows = first_fit(arr, max_len)
    return row, offset, int(n_rows)


def grouped_assign(
    lengths: ArrayLike, groups: ArrayLike, max_len: int, algorithm: str = "ffd", n_groups: int = 0
) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.int64]]:
    """`assign` on each group's documents apart (`--group-by`), in one call.

    The documents with `groups == g` get the rows (numbered within the group) and offsets that
    `assign(lengths[groups == g], max_len, algorithm)` gives them. One stable sort by (group,
    decreasing length), then each group in turn with buffers made once: O(N log N + groups),
    and BFD's max_len-sized stacks once, where a call per group cost O(max_len) each.

    Returns:
        `(row, offset, rows)`: per document its row and offset, and per group (`n_groups` of
        them, or more if `groups` names more) its rows.

    Raises:
        ConfigError: as `ffd_assign`; `groups` not integers >= 0 of the lengths' shape.
    """
    arr, max_len = checked_lengths(lengths, max_len)
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"unknown packing algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    codes = np.asarray(groups)
    if codes.shape != arr.shape or (codes.size and not np.issubdtype(codes.dtype, np.integer)):
        raise ConfigError(
            f"groups must be integers of shape {arr.shape}, got {codes.dtype} {codes.shape}"
        )
    if codes.size and codes.min() < 0:
        raise ConfigError(f"document {int(np.argmin(codes))} has group {int(codes.min())} < 0")
    codes = codes.astype(np.int64, copy=False)
    starts = np.zeros(max(n_groups, int(codes.max(initial=-1)) + 1) + 1, np.int64)
    np.cumsum(np.bincount(codes, minlength=len(starts) - 1), out=starts[1:])
    # Group, then longest first; a stable sort keeps input order between equal lengths.
    order = np.argsort(codes * (max_len + 1) + (max_len - arr), kind="stable")
    proto = _tree_proto(max_len)
    return _grouped(arr, order, starts, max_len, algorithm == "bfd", proto)


def warm_up() -> None:
    """Load every kernel from numba's cache (or compile it) on tiny inputs.

    The first call of each kernel in a process costs ~0.1-0.2 s of cache loading. The engines
    warm these and flat_ids' together (`packtool.pack.warmup.warm_up`).
    """
    lengths = np.array([3, 2, 1], dtype=np.int64)
    ffd_assign(lengths, 4)
    bfd_assign(lengths, 4)
    ff_assign(lengths, 4)
    for algorithm in ALGORITHMS:
        grouped_assign(lengths, [1, 0, 1], 4, algorithm)
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
    arr, max_len = checked_lengths(lengths, max_len)
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
