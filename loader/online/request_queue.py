"""The queue of `RequestBatcher`: requests in arrival order, indexed by size for first fit.

A batch takes the requests in arrival order while they fit its token budget, then later ones that
fill the gap: each time, the earliest request that fits the room left. Scanning a list for it
costs the whole backlog per batch; here each size has its requests in arrival order, and a
segment tree over the sizes holds each size's earliest one, so the earliest request of at most
`room` tokens is found in O(log largest size) steps, whatever the backlog. A batch of k requests
visits O(k log largest size) tree nodes (`examined` counts them).
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

T = TypeVar("T")

_NONE = float("inf")  # a tree slot with no request


class RequestQueue(Generic[T]):
    """Items with a size >= 1, taken by first fit in arrival order."""

    def __init__(self) -> None:
        self._by_size: dict[int, deque[tuple[int, T]]] = {}  # (arrival number, item)
        self._n = 1  # leaves: sizes 1.._n (doubled when a larger request arrives)
        self._tree: list[float] = [_NONE, _NONE]
        self._arrivals = 0
        self._len = 0
        self._visits = 0  # tree nodes visited by _first and _update
        self.examined = 0
        """Tree nodes `take` visited, in all (a bound the tests check: a few per level of the
        tree for each item taken, whatever the backlog)."""

    def __len__(self) -> int:
        return self._len

    def append(self, item: T, size: int) -> None:
        """Queue `item` of `size` tokens (>= 1) after every item queued so far."""
        if size > self._n:
            self._grow(size)
        q = self._by_size.get(size)
        if q is None:
            q = self._by_size[size] = deque()
        q.append((self._arrivals, item))
        self._arrivals += 1
        self._len += 1
        if len(q) == 1:  # a new earliest item of this size
            self._update(size)

    def oldest(self) -> T:
        """The earliest item queued (the queue is not empty)."""
        return self._by_size[self._size_at(self._tree[1])][0][1]

    def take(self, room: int, cap: int | None) -> list[T]:
        """Items for one batch, in arrival order: the earliest one of at most `room` tokens, then
        the earliest of at most what is left, and so on, `cap` items at most (None: no cap).

        The same items as scanning the queue in arrival order and taking each that fits: an item
        passed over did not fit a larger room, so it cannot fit a later, smaller one."""
        out: list[T] = []
        visits = self._visits
        while room > 0 and self._len and (cap is None or len(out) < cap):
            first = self._first(min(room, self._n))
            if first == _NONE:
                break
            size = self._size_at(first)
            q = self._by_size[size]
            out.append(q.popleft()[1])
            if not q:
                del self._by_size[size]
            self._update(size)
            self._len -= 1
            room -= size
        self.examined += self._visits - visits
        return out

    def drain(self) -> list[T]:
        """Every item, in arrival order, leaving the queue empty."""
        items = sorted(e for q in self._by_size.values() for e in q)  # arrival numbers unique
        self._by_size.clear()
        self._tree = [_NONE] * (2 * self._n)
        self._len = 0
        return [item for _, item in items]

    # ---- the tree: leaf n + size - 1 holds arrival * n + size - 1 of that size's earliest ----

    def _size_at(self, key: float) -> int:
        return int(key) % self._n + 1

    def _leaf(self, size: int) -> float:
        q = self._by_size.get(size)
        return _NONE if q is None else q[0][0] * self._n + size - 1

    def _update(self, size: int) -> None:
        tree = self._tree
        i = self._n + size - 1
        tree[i] = self._leaf(size)
        i //= 2
        while i:
            tree[i] = min(tree[2 * i], tree[2 * i + 1])
            i //= 2
            self._visits += 1

    def _first(self, room: int) -> float:
        """The smallest key among sizes 1..room."""
        tree, best = self._tree, _NONE
        lo, hi = self._n, self._n + room
        while lo < hi:
            self._visits += 1
            if lo & 1:
                best = min(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = min(best, tree[hi])
            lo //= 2
            hi //= 2
        return best

    def _grow(self, size: int) -> None:
        """Cover sizes up to `size`: the keys encode the size modulo the leaf count, so all are
        rebuilt (doubling: a few times per queue, at most log of the largest size). Only the
        paths above the sizes queued are computed, the rest being empty: rebuilding every node
        in Python took 1.3 s, under the queue's lock, for one request of 8M tokens."""
        n = self._n
        while n < size:
            n *= 2
        self._n = n
        tree = self._tree = [_NONE] * (2 * n)
        for s in self._by_size:
            i = n + s - 1
            tree[i] = self._leaf(s)
            i //= 2
            while i:
                tree[i] = min(tree[2 * i], tree[2 * i + 1])
                i //= 2
