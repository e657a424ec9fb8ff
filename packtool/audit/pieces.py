"""Every (doc_id, chunk) exactly once over a whole dataset, in bounded memory: `verify`'s one
check that spans every shard.

A piece is (doc_id, chunk, global row). Up to `MEMORY_PIECES` of them are held in memory and
checked with one sort, as before; past that they are spilled, as the shards are read, into
`buckets` files in a temporary folder by a hash of the doc_id, and each bucket is checked alone
at the end. All the pieces of one document fall into one bucket, so a repeated piece or a
missing chunk is found there. Memory: one bucket's pieces (24 bytes each; the bucket count
comes from the manifest's piece count, so a bucket holds about `MEMORY_PIECES / 2`), and up to
`MEMORY_PIECES / 2` pieces held between spills; disk: 24 bytes a piece, in `TMPDIR`, removed
when the check ends. Holding every piece (80 bytes each with the sort) grew `verify` to 1.4 GB
at 16M documents, ~80 GB at 10^9; spilled, it stays at ~215 MB (docs/verify-inspect.md).

Open files: one. The held pieces are appended to each bucket with an open, a write and a close
(a bucket a spill adds nothing to is not opened). Every bucket once stayed open for the whole
read: 10^9 pieces need 1,000 buckets, and past ~1.02x10^9 a default limit of 1,024 open files
failed `verify` ("bucket-01018.bin: Too many open files"). The cost: about
`2 * pieces / MEMORY_PIECES` spills of one append to each bucket (10^9 pieces: ~10^6 appends
of ~24 KB).

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

from packtool.errors import naming
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
        self._held_count = 0
        self._count = 0
        self._folder: contextlib.ExitStack | None = None
        self._paths: list[Path] = []
        self._sizes: NDArray[np.int64] = np.zeros(0, dtype=np.int64)

    def add(self, ids: NDArray[np.int64], chunks: NDArray[np.int64], rows: NDArray[np.int64]):
        triples = np.column_stack((ids, chunks, rows)).astype(np.int64, copy=False)
        self._count += len(triples)
        self._held.append(triples)
        self._held_count += len(triples)
        if self._held_count > (MEMORY_PIECES if self._folder is None else _flush_pieces()):
            if self._folder is None:
                self._make_buckets()
            self._spill()

    def check(self, where: Callable[[int], str], fail: Callable[[str, str], Exception]):
        """(pieces, distinct doc_ids, doc_ids split into several pieces); raises
        `fail(place, what)` at the first problem."""
        if self._folder is None:
            if not self._held:
                return 0, 0, 0
            return _check(np.concatenate(self._held), where, fail)
        self._spill()
        pieces = distinct = split = 0
        for path, size in zip(self._paths, self._sizes, strict=True):
            if size:  # a bucket no piece fell into has no file
                triples = np.frombuffer(storage.read_bytes(path), dtype=np.int64).reshape(-1, 3)
                n, d, s = _check(triples, where, fail)
                pieces, distinct, split = pieces + n, distinct + d, split + s
        return pieces, distinct, split

    def close(self) -> None:
        self._held = []
        if self._folder is not None:
            self._folder.close()
            self._folder = None

    def _make_buckets(self) -> None:
        if self.expected is None:
            n = UNKNOWN_BUCKETS
        else:  # two buckets per MEMORY_PIECES expected: each about half of it
            n = max(2, math.ceil(2 * max(self.expected, self._count) / MEMORY_PIECES))
        self._folder = contextlib.ExitStack()
        folder = self._folder.enter_context(writing.temporary_folder("packtool-verify-"))
        self._paths = [folder / f"bucket-{i:05d}.bin" for i in range(n)]
        self._sizes = np.zeros(n, dtype=np.int64)

    def _spill(self) -> None:
        """The held pieces appended to their buckets, `_flush_pieces()` at a time (the first
        spill empties up to `MEMORY_PIECES` held, each part freed as it is written)."""
        self._held.reverse()  # popped from the end: in the order they came
        while self._held:
            part, count = [], 0
            while self._held and count < _flush_pieces():
                part.append(self._held.pop())
                count += len(part[-1])
            self._held_count -= count
            triples = np.concatenate(part)
            del part
            self._append(triples)

    def _append(self, triples: NDArray[np.int64]) -> None:
        n = len(self._paths)
        bucket = triples[:, 0].view(np.uint64) * _GOLDEN
        bucket >>= np.uint64(32)
        bucket %= np.uint64(n)
        order = np.argsort(bucket, kind="stable")
        bounds = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(bucket.astype(np.intp), minlength=n), out=bounds[1:])
        del bucket
        for i in np.flatnonzero(np.diff(bounds)):
            path, size = self._paths[i], int(self._sizes[i])
            note = "verify's spill of pieces; TMPDIR sets its folder"
            with naming(path, note), writing.open_append(path, size) as f:
                f.write(triples[order[bounds[i] : bounds[i + 1]]].tobytes())
            self._sizes[i] += (bounds[i + 1] - bounds[i]) * 3 * triples.itemsize


def _flush_pieces() -> int:
    """Once spilling, the pieces held before they are appended to their buckets: half of
    `MEMORY_PIECES` (each bucket's file is opened, appended to and closed once a flush)."""
    return max(1, MEMORY_PIECES // 2)


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
