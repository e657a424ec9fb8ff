"""Every (doc_id, chunk) exactly once over a whole dataset, in bounded memory: `verify`'s one
check that spans every shard.

A piece is (doc_id, chunk, global row). Up to `MEMORY_PIECES` of them are held in memory and
checked with one sort, as before; past that they are spilled, as the shards are read, into
`buckets` files in a temporary folder by a hash of the doc_id, and each bucket is checked alone
at the end. All the pieces of one document fall into one bucket, so a repeated piece or a
missing chunk is found there. Memory: one bucket's pieces (24 bytes each; the bucket count
comes from the manifest's piece count, so a bucket holds about `MEMORY_PIECES / 2`); disk: 24
bytes a piece, in `TMPDIR`, removed when the check ends. Holding every piece (80 bytes each
with the sort) grew `verify` to 1.4 GB at 16M documents, ~80 GB at 10^9; spilled, it stays at
~215 MB (docs/verify-inspect.md).

Records in: one row group's pieces at a time. Out: (pieces, distinct doc_ids), or the first
problem as a `DataError` naming the file and row.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from packtool.storage import local as storage
from packtool.storage import writing

MEMORY_PIECES = 2_000_000
"""Pieces held in memory before spilling (48 MB of triples; with the sort, ~250 MB of peak)."""

UNKNOWN_BUCKETS = 256
"""Buckets when the manifest records no piece count (datasets packed before it did)."""

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


class Pieces:
    """Collects pieces with `add`, checks them with `check`, then `close` (a spill folder is
    also removed when the object is dropped, as where a problem ends the check early)."""

    def __init__(self, expected: int | None) -> None:
        self.expected = expected
        self._held: list[NDArray[np.int64]] = []
        self._count = 0
        self._folder: contextlib.ExitStack | None = None
        self._files: list = []
        self._paths: list[Path] = []

    def add(self, ids: NDArray[np.int64], chunks: NDArray[np.int64], rows: NDArray[np.int64]):
        triples = np.column_stack((ids, chunks, rows)).astype(np.int64, copy=False)
        self._count += len(triples)
        if self._folder is not None:
            self._spill(triples)
            return
        self._held.append(triples)
        if self._count > MEMORY_PIECES:
            self._open_buckets()
            for held in self._held:
                self._spill(held)
            self._held = []

    def check(self, where: Callable[[int], str], fail: Callable[[str, str], Exception]):
        """(pieces, distinct doc_ids, doc_ids split into several pieces); raises
        `fail(place, what)` at the first problem."""
        if self._folder is None:
            if not self._held:
                return 0, 0, 0
            return _check(np.concatenate(self._held), where, fail)
        pieces = distinct = split = 0
        for f in self._files:
            f.close()
        for path in self._paths:
            triples = np.frombuffer(storage.read_bytes(path), dtype=np.int64).reshape(-1, 3)
            if len(triples):
                n, d, s = _check(triples, where, fail)
                pieces, distinct, split = pieces + n, distinct + d, split + s
        return pieces, distinct, split

    def close(self) -> None:
        for f in self._files:
            f.close()
        self._files = []
        if self._folder is not None:
            self._folder.close()
            self._folder = None

    def _open_buckets(self) -> None:
        if self.expected is None:
            n = UNKNOWN_BUCKETS
        else:  # two buckets per MEMORY_PIECES expected: each about half of it
            n = max(2, math.ceil(2 * max(self.expected, self._count) / MEMORY_PIECES))
        self._folder = contextlib.ExitStack()
        folder = self._folder.enter_context(writing.temporary_folder("packtool-verify-"))
        self._paths = [folder / f"bucket-{i:05d}.bin" for i in range(n)]
        self._files = [writing.open_output(p) for p in self._paths]

    def _spill(self, triples: NDArray[np.int64]) -> None:
        n = len(self._files)
        bucket = ((triples[:, 0].view(np.uint64) * _GOLDEN) >> np.uint64(32)) % np.uint64(n)
        order = np.argsort(bucket, kind="stable")
        bounds = np.searchsorted(bucket[order], np.arange(n + 1, dtype=np.uint64))
        for i in np.flatnonzero(np.diff(bounds)):
            triples[order[bounds[i] : bounds[i + 1]]].tofile(self._files[i])


def _check(
    triples: NDArray[np.int64],
    where: Callable[[int], str],
    fail: Callable[[str, str], Exception],
) -> tuple[int, int, int]:
    ids, chunks, rows = triples[:, 0], triples[:, 1], triples[:, 2]
    order = np.lexsort((rows, chunks, ids))
    ids, chunks, rows = ids[order], chunks[order], rows[order]
    dup = np.flatnonzero((ids[1:] == ids[:-1]) & (chunks[1:] == chunks[:-1]))
    if len(dup):
        # Report the occurrence that comes latest in the dataset among the first duplicate pair.
        k = int(dup[np.argmin(rows[dup + 1])])
        raise fail(
            where(int(rows[k + 1])),
            f"document {ids[k]} chunk {chunks[k]} appears again (first in "
            f"{where(int(rows[k]))}); expected every (doc_id, chunk) exactly once",
        )
    # Sorted by (id, chunk): within each id, chunk must equal its rank 0, 1, 2, ...
    first = np.ones(len(ids), dtype=bool)
    first[1:] = ids[1:] != ids[:-1]
    group_start = np.maximum.accumulate(np.where(first, np.arange(len(ids)), 0))
    rank = np.arange(len(ids)) - group_start
    gap = np.flatnonzero(chunks != rank)
    if len(gap):
        k = int(gap[0])
        raise fail(
            where(int(rows[k])),
            f"document {ids[k]} has chunk {chunks[k]} but chunk {rank[k]} is missing "
            "(expected the chunks of a split document to be 0..k-1)",
        )
    return len(ids), int(first.sum()), int((chunks == 1).sum())  # split: those with a chunk 1
