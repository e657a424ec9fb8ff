"""The mixture's row stream and its global steps (for `loader.mixture.dataset.MixedDataset`).

`RowStream` holds the rows the schedule chose, with each row's source, epoch, position, row
id, length, documents and attention cost, in a sliding buffer (rows already cut are forgotten;
the schedule state at any step boundary is kept). `cut_steps` cuts the next global steps into
rank batches as loader/order/steps.py cuts an epoch (`rows_per_batch` rows, or greedily up to
`tokens_per_batch` and, with static shapes, the document cap); `plan_blocks` plans this rank's
share of a block of steps at once (rebalanced with `balance=True`; a filler past the end) and
`plan_steps` yields them one by one (`count_steps` counts them, gathering nothing). Planning a block at once costs a few microseconds a step
where planning each step alone cost ~40 (numpy's per-call cost, a dozen calls a step): every
`MixedDataLoader` worker plans every step.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from loader.mixture.sources import PackedSource, StreamSource
from loader.order.balance import balance_step
from packtool.mixture.schedule import cap_rows, state_after

if TYPE_CHECKING:
    from loader.config import LoaderConfig
    from loader.record import Documents
    from packtool.mixture.schedule import Schedule
    from packtool.mixture.spec import MixtureSpec

FIELDS = ("src", "epoch", "pos", "rid", "length", "docs", "group", "local", "sq")
"""What the stream knows of every row (`group`: its row group in its source, `local` its index
there; streaming sources: blocks of `STREAM_BLOCK` positions)."""
STEP_FIELDS = FIELDS[:-1]
"""What a step keeps of its rows (the cost `sq` only matters to balancing)."""
READ_ROWS = 4096
"""Fewest rows `RowStream` asks the schedule for at a time."""
FORGET_ROWS = 65536
"""`RowStream` forgets the rows already cut once there are more than this many."""


class MixtureView(Protocol):
    """What the step planner here and the workers (loader/mixture/worker.py) use of a
    `loader.mixture.dataset.MixedDataset`: typed as this, they import nothing of the module
    that imports them, and reach only what is named here."""

    config: LoaderConfig
    spec: MixtureSpec
    names: list[str]
    sources: Sequence[PackedSource | StreamSource]
    rank: int
    world_size: int
    max_len: int
    max_docs: int | None
    pad_tokens: int | None
    columns: tuple[str, ...]
    one_loop: bool
    """Every source a packed dataset with the mixture's columns: steps gathered in one loop."""

    def new_schedule(self, state: dict[str, Any] | None) -> Schedule: ...

    def state_at(self, step: int, schedule_state: dict[str, Any]) -> dict[str, Any]: ...

    def look_ahead(
        self, steps: Iterator[Step], stream: RowStream, keep: Callable[[Step], Any] | None = None
    ) -> Iterator[Step]: ...

    def views(self, rows: dict[str, np.ndarray], runs: list | None) -> tuple[list, int, int]: ...

    def gather(
        self, rows: dict[str, np.ndarray], runs: list | None = None
    ) -> tuple[Documents, np.ndarray]: ...

    def gather_into(
        self,
        rows: dict[str, np.ndarray],
        dest: Documents,
        runs: list | None = None,
        *,
        fits: bool = False,
    ) -> tuple[int, int] | None: ...

    def owners(self, rows: dict[str, np.ndarray], n_workers: int) -> np.ndarray: ...


@dataclass
class Step:
    """One global step as this rank sees it."""

    step: int
    rows: dict[str, np.ndarray] | None
    """This rank's rows (`FIELDS`): grouped by source, each source's in stream order (None
    until a `MixedDataLoader` worker sets its share, `plan_blocks(step_rows=False)`)."""
    filler: bool
    begin: int
    """Stream index of the step's first row (any rank's)."""
    end: int
    """Stream index after the step."""
    state_fn: Callable[[], dict[str, Any]] | None = None
    ref: tuple[int, int, int] | None = None
    """`(next step, chunk id, rows of that chunk)`: where the state after the step is."""
    chunk: Any = None
    """That schedule chunk (`packtool.mixture.schedule.Chunk`)."""
    runs: list[tuple[int, int, int]] | None = None
    """`(source, start, stop)` of each source's rows in `rows` (`MixedDataset._runs`), once
    known."""
    share: tuple[Any, int, bytes | None, bool] | None = None
    """With `MixedDataLoader` workers: None when this worker has rows in the step (`rows`),
    False when it has none; how many workers have rows in it; the step's layout (from its
    lowest owner only); whether the whole step fits a ring slot."""
    fresh: list[tuple[int, list[int]]] | None = None
    """Per source, the row groups of `rows` not used earlier in the step's block (the ones to
    hand to the decode thread); None: all of the step's."""

    @property
    def state(self) -> dict[str, Any]:
        """The `MixedDataset` state after the step (computed when first asked for)."""
        if not isinstance(self.state_fn, dict):
            self.state_fn = self.state_fn()
        return self.state_fn


class RowStream:
    """The mixed row stream from a schedule state, as a sliding buffer of rows with their
    source, epoch, position, row id, length, documents and cost."""

    def __init__(self, ds: MixtureView, state: dict[str, Any] | None) -> None:
        self.sources = ds.sources
        self.schedule = ds.new_schedule(state)
        self.buf = {f: np.zeros(0, np.float64 if f == "sq" else np.int64) for f in FIELDS}
        self.base = 0  # stream index of buf[0]
        self.p = 0  # next stream index to cut
        self.chunks: deque[tuple[int, Any, int]] = deque()  # (first row's index, chunk, id)
        self.chunk_ids = 0
        self.end = 0  # stream index after the last row read
        self.cum_len = np.zeros(1, np.int64)  # tokens before each buffered row (and after all)
        self.cum_docs = np.zeros(1, np.int64)
        self._room = 0  # rows the arrays behind the views above hold
        self._store: dict[str, np.ndarray] = {}

    def available(self) -> int:
        return self.end - self.p

    def ensure(self, n: int) -> int:
        """Read rows until `n` are available after `p` (or the mixture ends); the count."""
        while self.available() < n and self.schedule.done is None:
            chunk = self.schedule.next(max(n - self.available(), READ_ROWS))
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
            self._append(cols)
        return self.available()

    def _append(self, cols: dict[str, np.ndarray]) -> None:
        """Add rows at the end of the buffer (`buf`, `cum_len`, `cum_docs` are views of the
        first rows of arrays with room for more): the new rows are the only ones copied, but
        when the arrays are full (doubled: amortised O(1) a row) or when more than
        `FORGET_ROWS` rows already cut are forgotten (the rows still to cut moved to new
        arrays). A view handed out is never written to again."""
        m = len(cols["src"])
        n = self.end - self.base
        keep = self.p - self.base
        if keep <= FORGET_ROWS:
            keep = 0
        if keep or n + m > self._room:
            live = n - keep
            self._room = max(2 * (live + m), 2 * READ_ROWS)
            store = {f: np.empty(self._room, a.dtype) for f, a in self.buf.items()}
            for f, a in self.buf.items():
                store[f][:live] = a[keep:n]
            for f in ("cum_len", "cum_docs"):
                old = getattr(self, f)
                store[f] = np.empty(self._room + 1, np.int64)
                store[f][: live + 1] = old[keep : n + 1] - old[keep]
            self._store = store
            self.base += keep
            n = live
            while len(self.chunks) > 1 and self.chunks[1][0] <= self.p:
                self.chunks.popleft()
        st = self._store
        for f in FIELDS:
            st[f][n : n + m] = cols[f]
        for f, by in (("cum_len", "length"), ("cum_docs", "docs")):
            np.cumsum(cols[by], out=st[f][n + 1 : n + m + 1])
            st[f][n + 1 : n + m + 1] += st[f][n]
        self.buf = {f: st[f][: n + m] for f in FIELDS}
        self.cum_len = st["cum_len"][: n + m + 1]
        self.cum_docs = st["cum_docs"][: n + m + 1]
        self.end += m

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


BLOCK_STEPS = 64
"""Most global steps planned at once (`plan_blocks`)."""
BLOCK_ROWS = 4096
"""...and about as many rows of this rank's at most (one schedule chunk's worth)."""


def _batch_rows_guess(ds: MixtureView) -> int:
    """About how many rows a rank batch holds (what `cut_steps` reads ahead for)."""
    c = ds.config
    if c.rows_per_batch is not None:
        return c.rows_per_batch
    return max(64, 2 * c.tokens_per_batch // ds.max_len)


def _rows_per_batch(ds: MixtureView, stream: RowStream, guess: int) -> int:
    """About how many rows a rank batch holds, a quarter more (from the rows read: their mean
    length; `guess` when no rows are read or with `rows_per_batch`)."""
    c = ds.config
    n = stream.end - stream.base
    if c.rows_per_batch is not None or n == 0:
        return guess
    mean = (int(stream.cum_len[-1]) - int(stream.cum_len[0])) / n
    return int(1.25 * c.tokens_per_batch / max(mean, 1.0)) + 2


def _batch_ends(ds: MixtureView, stream: RowStream, q: int, count: int) -> list[int]:
    """For every stream index i from `q` to `q + count` (at most to the rows read): the end of a
    rank batch starting at i (greedy: `rows_per_batch` rows, or as many as fit
    `tokens_per_batch` and the document cap, at least one), or -1 where rows not read yet could
    change it (the mixture not done)."""
    c = ds.config
    i0, i1 = q - stream.base, stream.end - stream.base
    idx = np.arange(i0, min(i1, i0 + count))
    got = i1 - idx  # rows from i to the end of the buffer
    done = stream.schedule.done is not None
    if c.rows_per_batch is not None:
        n = np.minimum(got, c.rows_per_batch)
        valid = got >= c.rows_per_batch
    else:
        cl = stream.cum_len
        n = np.searchsorted(cl, cl[idx] + c.tokens_per_batch, "right") - 1 - idx
        if ds.max_docs is not None:
            cd = stream.cum_docs
            n = np.minimum(n, np.searchsorted(cd, cd[idx] + ds.max_docs - 1, "right") - 1 - idx)
        valid = n < got  # a batch that reaches the end of the buffer might take more rows
        n = np.maximum(np.minimum(n, got), 1)
    ends = idx + n + stream.base
    if not done:
        ends[~valid] = -1
    return ends.tolist()


def cut_steps(ds: MixtureView, stream: RowStream, most: int) -> list[list[tuple[int, int]]]:
    """The rank batches of up to `most` next global steps, as stream ranges (the last step of
    the stream may have fewer than W; the list ends after it).

    The same cuts as cutting one rank batch after another (`rows_per_batch` rows, or greedily
    up to `tokens_per_batch` and the document cap): every batch's end is found for all the rows
    read at once (`_batch_ends`), and the steps are a walk through those ends."""
    world = ds.world_size
    guess = _batch_rows_guess(ds)
    steps: list[list[tuple[int, int]]] = []
    ranges: list[tuple[int, int]] = []
    q = stream.p
    ends: list[int] = []
    lo = q  # ends[k] is the end of a batch starting at lo + k
    while len(steps) < most:
        e = ends[q - lo] if q - lo < len(ends) else -1
        if e < 0:
            left = world * (most - len(steps)) - len(ranges)  # rank batches still to cut
            if q - lo < len(ends):  # the batch may run past the rows read: read more
                want = stream.end - stream.p + max(guess, stream.end - q)
            else:
                want = q - stream.p + guess * left
            stream.ensure(want)
            if q >= stream.end and stream.schedule.done is not None:
                break  # the stream is over
            # the ends of batches starting in about what is left to cut (the walk finds more
            # if it gets past them)
            ends, lo = _batch_ends(ds, stream, q, left * _rows_per_batch(ds, stream, guess)), q
            continue
        ranges.append((q, e))
        q = e
        if len(ranges) == world:
            steps.append(ranges)
            ranges = []
    if ranges:
        steps.append(ranges)
    stream.p = q
    return steps


@dataclass
class Block:
    """Some global steps planned at once (`plan_blocks`): this rank's rows of each."""

    steps: list[Step]
    rows: dict[str, np.ndarray]
    """This rank's rows (`STEP_FIELDS`) of the steps, step after step; `steps[k].rows` is the
    slice `offsets[k]:offsets[k + 1]` of them."""
    offsets: list[int]


def global_steps(
    ds: MixtureView, stream: RowStream, first: int
) -> Iterator[list[tuple[int, list[tuple[int, int]]]]]:
    """Every global step from `first` to the end of the mixture (`total_steps`, the stream's
    end, a short last step kept or dropped by `drop_last`) as `(step, rank ranges)`, up to
    `BLOCK_STEPS` steps (one cut) at a time; the stream's rows are read as they are cut."""
    c = ds.config
    total = ds.spec.total_steps
    world = ds.world_size
    per_block = max(1, min(BLOCK_STEPS, BLOCK_ROWS // (_batch_rows_guess(ds) * world)))
    step = first
    while total is None or step < total:
        cut = cut_steps(ds, stream, per_block if total is None else min(per_block, total - step))
        if not cut:
            return
        steps: list[tuple[int, list[tuple[int, int]]]] = []
        last = False
        for ranges in cut:
            short = len(ranges) < world or (
                c.rows_per_batch is not None and ranges[-1][1] - ranges[-1][0] < c.rows_per_batch
            )
            if short and c.drop_last:
                last = True
                break
            steps.append((step, ranges))
            step += 1
            if short:
                last = True
                break
        yield steps
        if last:
            return


def count_steps(ds: MixtureView, stream: RowStream, first: int) -> int:
    """How many global steps there are from `first` to the end of the mixture (the steps
    `plan_blocks` plans, cut but not gathered: the schedule and each row's size only)."""
    return sum(len(steps) for steps in global_steps(ds, stream, first))


def may_end_before(ds: MixtureView, start: dict[str, Any], total: int) -> bool:
    """Whether the mixture may end before global step `total` from `start` (a state): it has
    ended, or a source drawn from may reach its `max_epochs` within what the steps left hold
    (`rows_per_batch` rows, or `tokens_per_batch` tokens, per rank batch at most) where that
    stops the mixture (`at_cap` "stop", or every source drawn from has a cap). False is
    certain: the steps left are `total` less the steps done. A streaming source's cap (epoch
    length unknown) may."""
    sched = start["schedule"]
    if sched["done"] is not None:
        return True
    c = ds.config
    batches = (total - int(start["step"])) * ds.world_size
    tokens = c.rows_per_batch is None
    most = batches * (c.tokens_per_batch if tokens else c.rows_per_batch)
    reach = {}  # per source drawn from: whether it may reach its cap
    for spec, src in zip(ds.spec.sources, ds.sources, strict=True):
        m = spec.max_epochs
        if spec.weight <= 0 or m is None:
            reach[spec.name] = False if spec.weight > 0 else None
            continue
        n = src.epoch_rows(0)
        if n is None:
            reach[spec.name] = True
            continue
        capped = math.floor(m) * n + (cap_rows(m, n) if m > math.floor(m) else 0)
        at = sched["sources"].get(spec.name, {"epoch": 0, "pos": 0})
        delivered = int(at["epoch"]) * n + int(at["pos"])
        if tokens:  # the fewest tokens the rows left before the cap can hold
            left = least_tokens(delivered, capped, n, src.epoch_tokens(0), ds.max_len)
        else:
            left = capped - delivered
        reach[spec.name] = left <= most
    drawn = [s for s in ds.spec.sources if s.weight > 0]
    return any(reach[s.name] and s.at_cap == "stop" for s in drawn) or all(
        reach[s.name] for s in drawn
    )


def least_tokens(first: int, stop: int, n: int, tokens: int, max_len: int) -> int:
    """The fewest tokens rows `first .. stop - 1` of a source can hold, counted over its epochs
    one after another (`n` rows and `tokens` tokens each, at most `max_len` a row): a whole
    epoch holds `tokens`, `k` of its rows at least what its other `n - k` rows leave. A
    bound in O(1), however many epochs the cap is away (planning them is what it saves)."""
    if stop <= first:
        return 0

    def part(k: int) -> int:
        return tokens if k >= n else max(0, tokens - (n - k) * max_len)

    e0, e1 = first // n, (stop - 1) // n
    if e0 == e1:
        return part(stop - first)
    return part((e0 + 1) * n - first) + (e1 - e0 - 1) * tokens + part(stop - e1 * n)


def plan_blocks(
    ds: MixtureView,
    stream: RowStream,
    first: int,
    own: Callable[[int], bool],
    *,
    step_rows: bool = True,
) -> Iterator[Block]:
    """Every global step from `first` (this rank's rows, those `own(step)` selects), planned a
    block of up to `BLOCK_STEPS` steps at a time (one cut, one sort and one gather per field
    for the block). Without `step_rows` the steps' `rows` are left to the caller (None unless
    rebalanced), which takes its share of the block's rows itself."""
    for steps in global_steps(ds, stream, first):
        planned = [(k, ranges) for k, ranges in steps if own(k)]
        if planned:
            yield _block(ds, stream, planned, step_rows)


def plan_steps(
    ds: MixtureView, stream: RowStream, first: int, own: Callable[[int], bool]
) -> Iterator[Step]:
    """Every global step from `first` (this rank's rows), planned only where `own(step)`."""
    for block in plan_blocks(ds, stream, first, own):
        yield from block.steps


def _block(
    ds: MixtureView,
    stream: RowStream,
    planned: list[tuple[int, list[tuple[int, int]]]],
    step_rows: bool,
) -> Block:
    r = ds.rank
    if ds.config.balance and ds.world_size > 1:  # rebalanced: step by step
        steps = [rank_step(ds, stream, k, ranges, ranges[-1][1]) for k, ranges in planned]
        sizes = [len(s.rows["src"]) for s in steps]
        rows = {f: np.concatenate([s.rows[f] for s in steps]) for f in STEP_FIELDS}
    else:
        # this rank's range of each step (a filler: the step's first row), grouped by source
        # within each step: one sort of (step, source) over the block, one gather per field
        starts = np.array([rg[r][0] if r < len(rg) else rg[0][0] for _, rg in planned])
        sizes_a = np.array([rg[r][1] - rg[r][0] if r < len(rg) else 1 for _, rg in planned])
        sizes = sizes_a.tolist()
        offsets_a = np.cumsum(sizes_a) - sizes_a
        at = np.repeat(starts - stream.base - offsets_a, sizes_a) + np.arange(sizes_a.sum())
        key = np.repeat(np.arange(len(planned)), sizes_a) * len(ds.sources) + stream.buf["src"][at]
        at = at[np.argsort(key, kind="stable")]
        rows = {f: stream.buf[f][at] for f in STEP_FIELDS}
        steps = []
        o = 0
        for (k, ranges), n in zip(planned, sizes, strict=True):
            part = {f: a[o : o + n] for f, a in rows.items()} if step_rows else None
            o += n
            filler = r >= len(ranges)
            steps.append(Step(k, part, filler, ranges[0][0], ranges[-1][1]))
    offsets = [0, *itertools.accumulate(sizes)]
    for s in steps:
        start, s.chunk, cid = next(x for x in reversed(stream.chunks) if x[0] <= s.end)
        s.ref = (s.step + 1, cid, s.end - start)
        s.state_fn = _state_fn(ds, s.chunk, s.step + 1, s.end - start)
    return Block(steps, rows, offsets)


def _state_fn(ds: MixtureView, chunk: Any, step: int, j: int) -> Callable[[], dict]:
    """The state after a step, made later: most steps' states are never asked for."""
    return lambda: ds.state_at(step, state_after(ds.names, chunk, j))


def rank_step(
    ds: MixtureView, stream: RowStream, step: int, ranges: list[tuple[int, int]], end: int
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
