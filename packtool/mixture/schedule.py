"""The mixture schedule: which source each next row of a mixture comes from. Pure, incremental.

**The rule.** Weights `w_i` (normalised, sum 1) count units (tokens, or rows); `D` is the units
delivered so far in the current segment, `d_i` those from source i, and its *lag* is
`e_i = w_i * D - d_i`. A source is *eligible* when it is not ahead (`e_i >= 0`); among the
eligible ones the next row comes from the source whose lag would first reach one row, `M`
units (`M` = max_len in tokens mode, 1 in rows mode): the smallest `(M - e_i) / w_i`
(non-preemptive earliest deadline first; ties go to the earlier source). Then at every prefix of
the stream every source is within one row of its target: `|d_i - w_i * D| < M`.

Why: a chosen source was not ahead, and a row adds at most `M`, so nobody gets a row ahead. For
the other side read source i's next row as a job released when `D` reaches `d_i / w_i` that
must start before `D` reaches `(d_i + M) / w_i`, i.e. finish by its deadline `b`. If one
started late, take the last start `a` of a job with a later deadline before it (or `a` = 0):
that job was at most `M` long and every job run from its end to the late job's end was
released after `a` with deadline at most `b`. Per source those jobs hold less than
`w_i * (b - a - M)` units, so in all less than `b - a - M`, yet they fill at least `b - a - M`:
a contradiction. Megatron's rule (largest `e_i`, no eligibility) reaches 1.7 rows on random
weights; this one never reaches 1 (tests/packtool/mixture/test_schedule.py checks it with exact
fractions). Lags are computed afresh from the integer counters, so a resumed schedule makes the
same float decisions as an uninterrupted one; float64 rounding is ~1e-3 tokens at 10^13.

**Incremental.** State is per source (epoch, position in its epoch order, rows, tokens, units
in the segment, capped) plus the stream totals: O(sources), whatever the steps done. Row
lengths come in windows from a `LengthReader` (the loader's epoch order; `SyntheticLengths`
for `packtool mix`). A *segment* starts when a source is dropped at its cap or the mixture
changes at a resume: the counters restart and the weights of the sources left renormalise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from packtool.errors import ConfigError, DataError
from packtool.mixture.deficit import CAP, OK, REFILL, mix_window
from packtool.mixture.resume import restore
from packtool.mixture.schedule_state import STATE_VERSION, total_reached
from packtool.mixture.spec import SourceSpec

WINDOW = 16384
"""Row lengths per source handed to the kernel at a time (a reader may ask for fewer)."""


class LengthReader(Protocol):
    """Row lengths of a source, by epoch and position in that epoch's order."""

    def epoch_rows(self, epoch: int) -> int | None:
        """Rows in `epoch` (None: not known before the epoch ends, e.g. online packing)."""

    def lengths(self, epoch: int, start: int, n: int) -> NDArray[np.int64]:
        """Lengths of the rows at positions `start .. start + n - 1`; fewer only where the
        epoch ends (none: `start` is past its end)."""


class SyntheticLengths:
    """A source known only by its totals (`index.json`): rows of the mean length, spread so an
    epoch holds exactly `tokens` tokens (row r: floor((r+1)T/R) - floor(rT/R))."""

    def __init__(self, rows: int, tokens: int) -> None:
        self.rows = int(rows)
        self.tokens = int(tokens)

    def epoch_rows(self, epoch: int) -> int:
        return self.rows

    def lengths(self, epoch: int, start: int, n: int) -> NDArray[np.int64]:
        stop = min(start + n, self.rows)
        if stop <= start:
            return np.zeros(0, np.int64)
        r = np.arange(start, stop + 1, dtype=np.int64)
        # (r * T) // R in exact integers: object arithmetic only when int64 could overflow
        if self.tokens and stop > (2**62) // self.tokens:
            c = np.array([x * self.tokens // self.rows for x in r.tolist()], dtype=np.int64)
        else:
            c = r * self.tokens // self.rows
        return np.diff(c)


def load_kernel() -> None:
    """Load the compiled schedule kernel into this process (from numba's cache). DataLoader
    workers forked afterwards inherit it; otherwise each loads it and numba's typing modules
    on its first chunk, every iteration (~0.5 s of CPU a worker on a 2-core box)."""
    one = [SourceSpec(name="warm", path="-", weight=1.0)]
    Schedule(one, [SyntheticLengths(8, 8)], unit="rows", max_len=1).next(1)


@dataclass(frozen=True)
class Chunk:
    """Rows the schedule chose, in stream order."""

    src: NDArray[np.int32]
    """Source index of each row."""
    epoch: NDArray[np.int64]
    """The source epoch each row belongs to."""
    pos: NDArray[np.int64]
    """Its position in that epoch's order."""
    length: NDArray[np.int64]
    """Its tokens."""
    start: dict[str, Any]
    """The schedule state before the chunk."""
    end: dict[str, Any]
    """The state after the chunk (a drop or the end of the mixture applied)."""
    prefix: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    """Per-source prefix counts, made by `Schedule.state_after` when first needed."""

    def __len__(self) -> int:
        return len(self.src)


PREFIX_CELLS = 1 << 22
"""Largest sources x rows chunk whose per-source prefix counts are kept (3 int64 matrices of
32 MiB each at most); beyond, each state is counted directly from the chunk's first j rows."""


def state_after(names: Sequence[str], chunk: Chunk, j: int) -> dict[str, Any]:
    """The schedule state after the first `j` rows of `chunk` (`names`: the sources in order),
    from the state before it and per-source prefix counts made once per chunk."""
    if j >= len(chunk):
        return chunk.end
    k, n = len(names), len(chunk)
    if k * n > PREFIX_CELLS:  # one state out of a big chunk (`packtool mix`): O(n), no matrices
        src = chunk.src[:j]
        rows = np.bincount(src, minlength=k).tolist()
        tokens = np.bincount(src, weights=chunk.length[:j], minlength=k).astype(np.int64).tolist()
        found, at = np.unique(src[::-1], return_index=True)
        last = [-1] * k
        for i, a in zip(found.tolist(), at.tolist(), strict=True):
            last[i] = j - 1 - a
    else:
        if not chunk.prefix:  # per source: rows, tokens and the last row's index before each j
            mine = chunk.src[None, :] == np.arange(k)[:, None]
            zero = np.zeros((k, 1), np.int64)
            chunk.prefix["rows"] = np.concatenate([zero, np.cumsum(mine, axis=1)], axis=1)
            chunk.prefix["tokens"] = np.concatenate(
                [zero, np.cumsum(np.where(mine, chunk.length, 0), axis=1)], axis=1
            )
            last_m = np.maximum.accumulate(np.where(mine, np.arange(n), -1), axis=1)
            chunk.prefix["last"] = np.concatenate([zero - 1, last_m], axis=1)
        rows = chunk.prefix["rows"][:, j].tolist()
        tokens = chunk.prefix["tokens"][:, j].tolist()
        last = chunk.prefix["last"][:, j].tolist()
    start = chunk.start
    sources = dict(start["sources"])  # entries shared with `start` unless they change
    for i, name in enumerate(names):
        if rows[i]:
            s = dict(sources[name])
            s["epoch"], s["pos"] = int(chunk.epoch[last[i]]), int(chunk.pos[last[i]]) + 1
            s["rows"] += rows[i]
            s["tokens"] += tokens[i]
            s["seg"] += tokens[i] if start["unit"] == "tokens" else rows[i]
            sources[name] = s
    return {
        **start,
        "rows": start["rows"] + int(j),
        "tokens": start["tokens"] + sum(tokens),
        "sources": sources,
    }


def cap_rows(m: float, n: int) -> int:
    """Rows of an epoch of `n` that the fractional part of max_epochs `m` allows, rounded down,
    counted in exact arithmetic on the largest number the float `m` stands for (up to half a
    unit in its last place above it, not included). In floats, 1.15 is 1.1499999999999999...:
    0.15 x 400 rows came to 59.99999999999996 and floored to 59. The decimal written counts
    exactly (60), and so does a ratio such as 1/23 (one row of 23), which the float's own
    decimal (0.043478260869565216, below 1/23) would not; a whole row lies within that half unit
    only where `n` times 10^(the cap's decimal places) is above ~10^15."""
    top = (Fraction(m) + Fraction(math.nextafter(m, math.inf))) / 2
    return math.ceil((top - math.floor(m)) * n) - 1


def _allowed(spec: SourceSpec, reader: LengthReader, epoch: int) -> int | None:
    """Rows `spec` may deliver from `epoch` under its cap (None: the whole epoch); the part of a
    fractional cap's last epoch is `cap_rows`, for the loader and `packtool mix` alike."""
    m = spec.max_epochs
    if m is None:
        return None
    full = math.floor(m)
    if epoch < full:
        return None
    if epoch == full and m > full:
        n = reader.epoch_rows(epoch)
        if n is None:
            raise ConfigError(
                f"source {spec.name!r}: max_epochs {m} is fractional, but its epoch length is "
                "not known ahead (online packing); give a whole number"
            )
        return cap_rows(m, n)
    return 0


def check_caps(sources: Sequence[SourceSpec], readers: Sequence[LengthReader]) -> None:
    """Refuse, up front, a cap no row fits under and a fractional cap on a source whose epoch
    length is not known ahead (both surfaced only once the stream ran: the first as a mixture
    that ended at once, with no batch and no warning).

    Raises:
        ConfigError: naming the source and its cap.
    """
    for spec, reader in zip(sources, readers, strict=True):
        m = spec.max_epochs
        if m is None or spec.weight <= 0 or m == math.floor(m):
            continue
        _allowed(spec, reader, math.floor(m))  # a fractional cap: the epoch length must be known
        rows = reader.epoch_rows(0)
        if m < 1 and _allowed(spec, reader, 0) == 0:
            raise ConfigError(
                f"source {spec.name!r}: max_epochs {spec.max_epochs} of its {rows:,} rows allows "
                f"no row; give at least 1/{rows:,} (or drop the source)"
            )


class Schedule:
    """The incremental mixture schedule (see the module docstring).

    Args:
        sources: The mixture's sources, in order (ties go to the earlier one).
        readers: One `LengthReader` per source.
        unit: `tokens` or `rows`.
        max_len: One row in tokens (the sources' common max_len).
        total_tokens: End the stream once this many tokens are delivered.
        fingerprints: Per source, what identifies its data (a resume onto other data under the
            same name is refused).
        former_fingerprints: Per source, other fingerprints a state saved by an earlier
            version recorded for the same data (accepted at a resume; default none).
        state: Continue from `state()` of an earlier schedule (see `restore` for changes).

    Raises:
        DataError: A state of other data, or a damaged one; an empty source.
    """

    def __init__(
        self,
        sources: Sequence[SourceSpec],
        readers: Sequence[LengthReader],
        *,
        unit: str,
        max_len: int,
        total_tokens: int | None = None,
        fingerprints: Sequence[str | None] | None = None,
        former_fingerprints: Sequence[Sequence[str]] | None = None,
        state: dict[str, Any] | None = None,
    ) -> None:
        self.specs = list(sources)
        self.readers = list(readers)
        self.names = [s.name for s in self.specs]
        k = len(self.specs)
        self.unit = unit
        self.max_len = int(max_len)
        self.total_tokens = total_tokens
        self.fingerprints = list(fingerprints) if fingerprints is not None else [None] * k
        self.former_fingerprints = [
            tuple(f) for f in (former_fingerprints if former_fingerprints is not None else [()] * k)
        ]
        self.epoch = np.zeros(k, np.int64)
        self.pos = np.zeros(k, np.int64)
        self.rows = np.zeros(k, np.int64)
        self.tokens = np.zeros(k, np.int64)
        self.seg = np.zeros(k, np.int64)
        self.capped = np.zeros(k, bool)
        self.delivered_rows = 0
        """Rows in the stream so far (all sources, removed ones included)."""
        self.delivered_tokens = 0
        self.segment = {"index": 0, "rows": 0, "tokens": 0}
        self.events: list[dict[str, Any]] = []
        self.dormant: dict[str, Any] = {}
        self.done: str | None = None
        self.changes: list[str] = []
        """What a resume changed (empty: none, or a fresh start)."""
        self._weights_key = b""
        self._weights_cache = np.zeros(k)
        check_caps(self.specs, self.readers)
        if state is not None:
            self._restore(state)
        self._window = np.zeros(k * WINDOW, np.int64)
        self._wpos = np.arange(k, dtype=np.int64) * WINDOW
        self._wend = self._wpos.copy()
        self._cap_left = np.full(k, -1, np.int64)
        self._fresh = np.ones(k, bool)  # window must be (re)filled before use
        self._settle()

    # ---- weights and segments ---------------------------------------------------------------

    @property
    def weights(self) -> NDArray[np.float64]:
        """The segment's normalised weights (0 for capped or zero-weight sources)."""
        w = np.array(
            [0.0 if c else float(s.weight) for s, c in zip(self.specs, self.capped, strict=True)]
        )
        total = math.fsum(w.tolist())
        return w / total if total > 0 else w

    @property
    def _weights(self) -> NDArray[np.float64]:
        key = self.capped.tobytes()
        if self._weights_key != key:
            self._weights_cache, self._weights_key = self.weights, key
        return self._weights_cache

    def event(self, what: str, message: str, source: str | None = None) -> None:
        """Note `what` happened (`dropped`, `stopped`, `changed`) at the rows delivered so far."""
        self.events.append(
            {
                "what": what,
                "source": source,
                "rows": self.delivered_rows,
                "tokens": self.delivered_tokens,
                "message": message,
            }
        )

    def new_segment(self) -> None:
        """Start a segment (new weights): its targets count from the rows delivered so far."""
        self.seg[:] = 0
        self.segment = {
            "index": self.segment["index"] + 1,
            "rows": self.delivered_rows,
            "tokens": self.delivered_tokens,
        }

    def _cap(self, i: int) -> None:
        """Source i delivered its last row under its cap."""
        spec = self.specs[i]
        self.capped[i] = True
        if spec.at_cap == "stop":
            self.done = f"source {spec.name!r} reached max_epochs {spec.max_epochs}"
            self.event("stopped", f"the mixture ended: {self.done}", spec.name)
            return
        ended = self._none_left()
        if ended is not None:
            self.done = ended
            self.event("stopped", f"the mixture ended: {self.done}", spec.name)
            return
        self.new_segment()
        shares = ", ".join(
            f"{n} {w:.4g}" for n, w in zip(self.names, self.weights, strict=True) if w > 0
        )
        self.event(
            "dropped",
            f"source {spec.name!r} reached max_epochs {spec.max_epochs} after "
            f"{int(self.tokens[i]):,} tokens and was dropped; the others renormalised "
            f"({shares})",
            spec.name,
        )

    def _none_left(self) -> str | None:
        """Why the mixture is over when every source with a weight is capped (None: one is not)."""
        if any(w > 0 for w in self.weights):
            return None
        rest = [n for n, c in zip(self.names, self.capped, strict=True) if not c]
        if not rest:
            return "every source reached its max_epochs"
        # weight 0 and no cap: never drawn from, so the mixture ends all the same
        return (
            "every source with a weight reached its max_epochs; only weight-0 "
            f"source(s) {', '.join(map(repr, rest))} remain, which are never drawn from"
        )

    def _settle(self) -> None:
        """Apply what the state implies at once: a total already reached, sources at their cap."""
        if self.done is not None:
            return
        if self.total_tokens is not None and self.delivered_tokens >= self.total_tokens:
            self.done = total_reached(self.total_tokens)
            return
        for i, spec in enumerate(self.specs):
            if self.done is not None:
                return
            if spec.weight <= 0:
                continue
            if self.capped[i]:
                if spec.at_cap == "stop":  # (a capped source resumed with at_cap drop -> stop)
                    self.done = f"source {spec.name!r} reached max_epochs {spec.max_epochs}"
                    self.event("stopped", f"the mixture ended: {self.done}", spec.name)
                continue
            allowed = _allowed(spec, self.readers[i], int(self.epoch[i]))
            if allowed is not None and self.pos[i] >= allowed:
                self._cap(i)
        ended = None if self.done is not None else self._none_left()
        if ended is not None:  # every weighted source capped before (a changed mixture resumed:
            self.done = ended  # its `done` is not restored): nothing to draw, `next` spun for good
            self.event("stopped", f"the mixture ended: {ended}")

    # ---- windows ----------------------------------------------------------------------------

    def _refill(self, i: int) -> bool:
        """A new window of source i from its cursor; False when its cap fired instead."""
        spec, reader = self.specs[i], self.readers[i]
        want_max = min(int(getattr(reader, "window", WINDOW) or WINDOW), WINDOW)
        while True:
            epoch, pos = int(self.epoch[i]), int(self.pos[i])
            allowed = _allowed(spec, reader, epoch)
            if allowed is not None and pos >= allowed:
                self._cap(i)
                return False
            want = want_max if allowed is None else min(want_max, allowed - pos)
            # One row more than used: whether the epoch ends inside this window is then known
            # here, whatever the window boundaries (they differ after a resume).
            lens = np.asarray(reader.lengths(epoch, pos, want + 1), dtype=np.int64)
            if len(lens) == 0:
                if pos == 0:
                    raise DataError(f"source {spec.name!r} has no rows (epoch {epoch} is empty)")
                self.epoch[i], self.pos[i] = epoch + 1, 0
                continue
            if lens.min() < 1 or lens.max() > self.max_len:
                raise DataError(
                    f"source {spec.name!r}: a row of {int(lens.max())} tokens (or empty) in a "
                    f"mixture of max_len {self.max_len}; the dataset is damaged"
                )
            ends_epoch = len(lens) <= want
            lens = lens[:want]
            at_cap = (allowed is not None and pos + len(lens) == allowed) or (
                ends_epoch and _allowed(spec, reader, epoch + 1) == 0
            )
            base = i * WINDOW
            self._window[base : base + len(lens)] = lens
            self._wpos[i], self._wend[i] = base, base + len(lens)
            self._cap_left[i] = len(lens) if at_cap else -1
            self._fresh[i] = False
            return True

    # ---- the stream -------------------------------------------------------------------------

    def next(self, n: int) -> Chunk:
        """The next rows of the stream: `n`, fewer when a segment or the mixture ends (none
        only once `done`)."""
        start = self.state()
        out_src = np.empty(n, np.int32)
        out_epoch, out_pos, out_len = (np.empty(n, np.int64) for _ in range(3))
        got = 0
        tokens_mode = self.unit == "tokens"
        max_units = float(self.max_len if tokens_mode else 1)
        while got < n and self.done is None:
            capped = False
            for i in np.flatnonzero(self._fresh & (self._weights > 0)).tolist():
                if not self._refill(i):
                    capped = True
                    break
            if capped:  # a cap fired before its row was read: new weights, or the end
                if got:
                    break
                start = self.state()
                continue
            left = 2**62 if self.total_tokens is None else self.total_tokens - self.delivered_tokens
            end, status, which, _ = mix_window(
                self._weights, self.seg, self._window, self._wpos, self._wend, self._cap_left,
                self.epoch, self.pos, self.rows, self.tokens, tokens_mode, max_units, left,
                out_src, out_epoch, out_pos, out_len, got, n,
            )  # fmt: skip
            self.delivered_rows += end - got
            self.delivered_tokens += int(out_len[got:end].sum())
            got = end
            if status == REFILL:
                self._fresh[which] = True
                continue
            if status == CAP:
                self._cap(which)
            total = self.total_tokens
            if self.done is None and total is not None and self.delivered_tokens >= total:
                self.done = total_reached(self.total_tokens)
            if status != OK:
                break
        return Chunk(
            out_src[:got], out_epoch[:got], out_pos[:got], out_len[:got], start, self.state()
        )

    # ---- state ------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Where the schedule stands: small (per source a few integers), JSON-friendly."""
        w = self.weights
        sources = {}
        for i, name in enumerate(self.names):
            spec = self.specs[i]
            sources[name] = {
                "fingerprint": self.fingerprints[i],
                "epoch": int(self.epoch[i]),
                "pos": int(self.pos[i]),
                "rows": int(self.rows[i]),
                "tokens": int(self.tokens[i]),
                "seg": int(self.seg[i]),
                "capped": bool(self.capped[i]),
                "weight": float(spec.weight),
                "max_epochs": spec.max_epochs,
                "at_cap": spec.at_cap,
                "share": float(w[i]),
            }
        return {
            "version": STATE_VERSION,
            "unit": self.unit,
            "max_len": self.max_len,
            "rows": self.delivered_rows,
            "tokens": self.delivered_tokens,
            "done": self.done,
            "segment": dict(self.segment),
            "sources": sources,
            "order": list(sources),  # a save with sorted keys reorders `sources`, not a list
            "dormant": dict(self.dormant),
            "events": list(self.events),
        }

    def state_after(self, chunk: Chunk, j: int) -> dict[str, Any]:
        """The state after the first `j` rows of `chunk` (a step boundary inside it)."""
        return state_after(self.names, chunk, j)

    def _restore(self, state: dict[str, Any]) -> None:
        restore(self, state)
