"""The mixture's row stream and its global steps (for `loader.mixture.MixedDataset`).

`RowStream` holds the rows the schedule chose, with each row's source, epoch, position, row
id, length, documents and attention cost, in a sliding buffer (rows already cut are forgotten;
the schedule state at any step boundary is kept). `cut_step` cuts the next global step into
rank batches as loader/order.py cuts an epoch (`rows_per_batch` rows, or greedily up to
`tokens_per_batch` and, with static shapes, the document cap); `plan_steps` yields this rank's
share of every step a worker owns (rebalanced with `balance=True`; a filler past the end).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from loader.balance import balance_step
from loader.mixture_sources import StreamSource
from packtool.schedule import state_after

if TYPE_CHECKING:
    from loader.mixture import MixedDataset

FIELDS = ("src", "epoch", "pos", "rid", "length", "docs", "group", "local", "sq")
"""What the stream knows of every row (`group`: its row group in its source, `local` its index
there; streaming sources: blocks of `STREAM_BLOCK` positions)."""
STEP_FIELDS = FIELDS[:-1]
"""What a step keeps of its rows (the cost `sq` only matters to balancing)."""


@dataclass
class Step:
    """One global step as this rank sees it."""

    step: int
    rows: dict[str, np.ndarray]
    """This rank's rows (`FIELDS`): grouped by source, each source's in stream order."""
    filler: bool
    begin: int
    """Stream index of the step's first row (any rank's)."""
    end: int
    """Stream index after the step."""
    state_fn: Callable[[], dict[str, Any]] | None = None
    ref: tuple[int, int, int] | None = None
    """`(next step, chunk id, rows of that chunk)`: where the state after the step is."""
    chunk: Any = None
    """That schedule chunk (`packtool.schedule.Chunk`)."""
    runs: list[tuple[int, int, int]] | None = None
    """`(source, start, stop)` of each source's rows in `rows` (`MixedDataset._runs`), once
    known."""
    share: tuple[Any, int, int] | None = None
    """With `MixedDataLoader` workers: which rows this worker gathers (a mask, or None for all
    of them, or False for none), how many workers have rows in the step, and the lowest."""

    @property
    def state(self) -> dict[str, Any]:
        """The `MixedDataset` state after the step (computed when first asked for)."""
        if not isinstance(self.state_fn, dict):
            self.state_fn = self.state_fn()
        return self.state_fn


class RowStream:
    """The mixed row stream from a schedule state, as a sliding buffer of rows with their
    source, epoch, position, row id, length, documents and cost."""

    def __init__(self, ds: MixedDataset, state: dict[str, Any] | None) -> None:
        self.sources = ds.sources
        self.schedule = ds._schedule(state)
        self.buf = {f: np.zeros(0, np.float64 if f == "sq" else np.int64) for f in FIELDS}
        self.base = 0  # stream index of buf[0]
        self.p = 0  # next stream index to cut
        self.chunks: deque[tuple[int, Any, int]] = deque()  # (first row's index, chunk, id)
        self.chunk_ids = 0
        self.end = 0  # stream index after the last row read
        self.cum_len = np.zeros(1, np.int64)  # tokens before each buffered row (and after all)
        self.cum_docs = np.zeros(1, np.int64)

    def available(self) -> int:
        return self.end - self.p

    def ensure(self, n: int) -> int:
        """Read rows until `n` are available after `p` (or the mixture ends); the count."""
        while self.available() < n and self.schedule.done is None:
            chunk = self.schedule.next(max(n - self.available(), 4096))
            self.chunks.append((self.end, chunk, self.chunk_ids))
            self.chunk_ids += 1
            if not len(chunk):
                continue
            cols = {
                "src": chunk.src.astype(np.int64),
                "epoch": chunk.epoch,
                "pos": chunk.pos,
                "length": chunk.length,
                "rid": np.empty(len(chunk), np.int64),
                "docs": np.empty(len(chunk), np.int64),
                "sq": np.empty(len(chunk), np.float64),
                "group": np.empty(len(chunk), np.int64),
                "local": np.empty(len(chunk), np.int64),
            }
            for i in np.unique(chunk.src).tolist():
                mine = np.flatnonzero(chunk.src == i)
                epochs = chunk.epoch[mine]
                for e in np.unique(epochs).tolist():
                    at = mine[epochs == e]
                    described = self.sources[i].describe_rows(e, int(chunk.pos[at[0]]), len(at))
                    fields = ("rid", "docs", "sq", "group", "local")
                    for f, values in zip(fields, described, strict=True):
                        cols[f][at] = values
            keep = self.p - self.base
            if keep > 65536:  # forget rows already cut
                self.buf = {f: a[keep:] for f, a in self.buf.items()}
                self.cum_len = self.cum_len[keep:] - self.cum_len[keep]
                self.cum_docs = self.cum_docs[keep:] - self.cum_docs[keep]
                self.base += keep
                while len(self.chunks) > 1 and self.chunks[1][0] <= self.p:
                    self.chunks.popleft()
            self.buf = {f: np.concatenate([self.buf[f], cols[f]]) for f in FIELDS}
            self.cum_len = np.concatenate(
                [self.cum_len, self.cum_len[-1] + np.cumsum(cols["length"])]
            )
            self.cum_docs = np.concatenate(
                [self.cum_docs, self.cum_docs[-1] + np.cumsum(cols["docs"])]
            )
            self.end += len(chunk)
        return self.available()

    def rows(self, a: int, b: int) -> dict[str, np.ndarray]:
        return {f: arr[a - self.base : b - self.base] for f, arr in self.buf.items()}

    def release(self, index: int) -> None:
        """Streaming sources may forget their rows before stream index `index`."""
        for i, src in enumerate(self.sources):
            if isinstance(src, StreamSource):
                sel = np.flatnonzero(self.buf["src"][max(index - self.base, 0) :] == i)
                if len(sel):
                    at = sel[0] + max(index - self.base, 0)
                    src.release(int(self.buf["epoch"][at]), int(self.buf["pos"][at]))
                else:
                    sch = self.schedule
                    src.release(int(sch.epoch[i]), int(sch.pos[i]))


def cut_step(ds: MixedDataset, stream: RowStream) -> list[tuple[int, int]]:
    """Rank batches of the next global step, as stream ranges (fewer than W at the end)."""
    c = ds.config
    out = []
    p = stream.p
    for _ in range(ds.world_size):
        if c.rows_per_batch is not None:
            n = min(
                stream.ensure(p - stream.p + c.rows_per_batch) - (p - stream.p), c.rows_per_batch
            )
        else:
            want = max(64, 2 * c.tokens_per_batch // ds.max_len)
            while True:
                got = stream.ensure(p - stream.p + want) - (p - stream.p)
                i = p - stream.base
                n = (
                    int(
                        np.searchsorted(
                            stream.cum_len, stream.cum_len[i] + c.tokens_per_batch, "right"
                        )
                    )
                    - 1
                    - i
                )
                if ds.max_docs is not None:
                    docs = np.searchsorted(
                        stream.cum_docs, stream.cum_docs[i] + ds.max_docs - 1, "right"
                    )
                    n = min(n, int(docs) - 1 - i)
                if n < got or got < want:
                    break
                want *= 2
            n = max(min(n, got), 1) if got else 0
        if n == 0:
            break
        out.append((p, p + n))
        p += n
    stream.p = p
    return out


def plan_steps(
    ds: MixedDataset, stream: RowStream, first: int, own: Callable[[int], bool]
) -> Iterator[Step]:
    """Every global step from `first` (this rank's rows), planned only where `own(step)`."""
    c = ds.config
    total = ds.spec.total_steps
    step = first
    while total is None or step < total:
        ranges = cut_step(ds, stream)
        if not ranges:
            return
        short = len(ranges) < ds.world_size or (
            c.rows_per_batch is not None and ranges[-1][1] - ranges[-1][0] < c.rows_per_batch
        )
        if short and c.drop_last:
            return
        end = ranges[-1][1]
        if own(step):
            s = rank_step(ds, stream, step, ranges, end)
            start, s.chunk, cid = next(x for x in reversed(stream.chunks) if x[0] <= end)
            s.ref = (step + 1, cid, end - start)
            s.state_fn = _state_fn(ds, s.chunk, step + 1, end - start)
            yield s
        step += 1
        if short:
            return


def _state_fn(ds: MixedDataset, chunk: Any, step: int, j: int) -> Callable[[], dict]:
    """The state after a step, made later: most steps' states are never asked for."""
    return lambda: ds._state(step, state_after(ds.names, chunk, j))


def rank_step(
    ds: MixedDataset, stream: RowStream, step: int, ranges: list[tuple[int, int]], end: int
) -> Step:
    c = ds.config
    r = ds.rank
    begin = ranges[0][0]
    if c.balance and ds.world_size > 1:
        rows = stream.rows(ranges[0][0], end)
        cost = rows["sq"] + float(c.balance_linear) * rows["length"]
        assignment = balance_step(
            np.arange(len(cost)),
            cost,
            ds.world_size,
            lengths=rows["length"],
            n_docs=rows["docs"],
            rows_cap=c.rows_per_batch,
            tokens_cap=ds.pad_tokens
            if c.tokens_per_batch is None and c.static_shape
            else c.tokens_per_batch,
            docs_cap=(ds.max_docs - 1) if c.static_shape else None,
        )
        if assignment is not None:
            mine = assignment == r
            if mine.any():
                return Step(step, _grouped(rows, np.flatnonzero(mine)), False, begin, end)
            ranges = []  # nothing for this rank: a filler batch
    if r < len(ranges):
        a, b = ranges[r]
        lo = a - stream.base  # _grouped(stream.rows(a, b)) without the slices
        order = np.argsort(stream.buf["src"][lo : b - stream.base], kind="stable") + lo
        return Step(step, {f: stream.buf[f][order] for f in STEP_FIELDS}, False, begin, end)
    return Step(step, _grouped(stream.rows(begin, begin + 1)), True, begin, end)


def _grouped(rows: dict[str, np.ndarray], take: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """A copy of `rows` (those at `take`) grouped by source in mixture order, each source's
    rows in stream order: one gather per source instead of one per run of rows."""
    src = rows["src"] if take is None else rows["src"][take]
    order = np.argsort(src, kind="stable")
    if take is not None:
        order = take[order]
    return {f: rows[f][order] for f in STEP_FIELDS}
