"""Serving: group requests that arrive over time into packed varlen batches within a time window.

`RequestBatcher` takes requests (token arrays) from any number of threads. A background thread
collects them and calls the model function on one varlen batch (the loader batch dict of
`loader.collate`: `input_ids`, `cu_seqlens`, `max_seqlen`, `position_ids`, `labels`, `doc_ids`),
then hands every request the rows `cu_seqlens[i]:cu_seqlens[i + 1]` of the output.

When a batch goes: as soon as the waiting requests fill the token budget, or when the oldest one
has waited `max_wait_ms`, whichever comes first; a request is never held by the batcher past its
deadline. Only a model call still running can delay it further (one batch runs at a time; the next
batch is formed the moment the model is free, from everything that arrived meanwhile).

What goes into a batch: requests in arrival order while they fit the budget, then later (shorter)
requests that fill the gap left (first fit in arrival order), so a long request at the head of the
queue does not leave the rest of the budget empty. Requests longer than the budget are rejected on
their future (`DataError`); there is no split policy, since a request's output must come from one
model call.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loader.collate import collate
from packtool.errors import ConfigError, DataError, PacktoolError


class BatcherClosedError(PacktoolError):
    """A request was submitted after `RequestBatcher.close()`."""


@dataclass
class _Request:
    tokens: np.ndarray
    future: Future
    arrived: float
    seq: int


@dataclass
class _Stats:
    requests: int = 0
    rejected: int = 0
    cancelled: int = 0
    batches: int = 0
    tokens: int = 0
    failed_batches: int = 0
    waits_ms: deque[float] = field(default_factory=lambda: deque(maxlen=100_000))
    """The most recent dispatch waits (bounded, for a long-running server)."""


class RequestBatcher:
    """Batches concurrent requests into packed varlen batches for one model function.

    Args:
        run_batch: The model: takes the batch dict, returns an array/tensor whose first axis runs
            over the batch's tokens (`cu_seqlens[-1]` entries). Called on the batcher's thread.
        max_wait_ms: A request waits at most this long for others to join its batch.
        token_budget: Tokens per batch at most; a request longer than this is rejected.
        max_requests: Requests per batch at most (None: only the token budget limits).
        collate_kwargs: Passed to `loader.collate` (e.g. `pad_tokens` for a static shape).

    Use as a context manager, or call `close()` to drain and stop.
    """

    def __init__(
        self,
        *,
        run_batch: Callable[[dict], Any],
        max_wait_ms: float = 50.0,
        token_budget: int = 8192,
        max_requests: int | None = None,
        collate_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if not callable(run_batch):
            raise ConfigError(f"run_batch must be callable, got {run_batch!r}")
        if not max_wait_ms >= 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise ConfigError(f"token_budget must be an integer >= 1, got {token_budget!r}")
        if max_requests is not None and (not isinstance(max_requests, int) or max_requests < 1):
            raise ConfigError(f"max_requests must be an integer >= 1 or None, got {max_requests!r}")
        self.run_batch = run_batch
        self.max_wait = max_wait_ms / 1000.0
        self.token_budget = token_budget
        self.max_requests = max_requests
        self.collate_kwargs = dict(collate_kwargs or {})
        self._cond = threading.Condition()
        self._queue: list[_Request] = []
        self._queued_tokens = 0
        self._closing = False
        self._seq = 0
        self._stats = _Stats()
        self._thread = threading.Thread(target=self._loop, name="RequestBatcher", daemon=True)
        self._thread.start()

    # ---- client side ------------------------------------------------------------------------

    def submit(self, tokens: Any) -> Future:
        """Queue one request (a 1-D array or list of token ids); its future gets its output rows.

        Raises:
            BatcherClosedError: after `close()`.
        """
        fut: Future = Future()
        arr = (
            np.asarray(tokens).reshape(-1)
            if not hasattr(tokens, "numpy")
            else tokens.numpy().reshape(-1)
        )
        with self._cond:
            if self._closing:
                raise BatcherClosedError("this RequestBatcher is closed; submit to a new one")
            self._stats.requests += 1
            bad = None
            if arr.size == 0:
                bad = DataError("empty request: a request needs at least one token")
            elif not np.issubdtype(arr.dtype, np.integer):
                bad = DataError(f"request token ids must be integers, got dtype {arr.dtype}")
            elif arr.size > self.token_budget:
                bad = DataError(
                    f"request of {arr.size} tokens exceeds the token budget {self.token_budget}; "
                    "shorten it or raise token_budget"
                )
            if bad is not None:
                self._stats.rejected += 1
                fut.set_exception(bad)
                return fut
            self._queue.append(_Request(arr, fut, time.monotonic(), self._seq))
            self._seq += 1
            self._queued_tokens += arr.size
            self._cond.notify()
        return fut

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, dispatch every queued one, and stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self._thread.join(timeout)

    def __enter__(self) -> RequestBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def stats(self) -> dict[str, Any]:
        """Counters, batch fill (tokens / budget) and the time requests waited to be dispatched."""
        with self._cond:
            s = self._stats
            waits = np.asarray(s.waits_ms) if s.waits_ms else np.zeros(1)
            return {
                "requests": s.requests,
                "rejected": s.rejected,
                "cancelled": s.cancelled,
                "batches": s.batches,
                "failed_batches": s.failed_batches,
                "tokens": s.tokens,
                "queued": len(self._queue),
                "mean_fill": s.tokens / (s.batches * self.token_budget) if s.batches else 0.0,
                "wait_ms_p50": float(np.percentile(waits, 50)),
                "wait_ms_p99": float(np.percentile(waits, 99)),
                "wait_ms_max": float(waits.max()),
                "closed": self._closing,
            }

    # ---- batcher thread ---------------------------------------------------------------------

    def _take(self) -> list[_Request]:
        """Requests for the next batch: arrival order while they fit, then gap filling."""
        chosen, left, room = [], [], self.token_budget
        cap = self.max_requests or len(self._queue)
        for r in self._queue:
            if len(chosen) < cap and r.tokens.size <= room:
                chosen.append(r)
                room -= r.tokens.size
            else:
                left.append(r)
        self._queue = left
        self._queued_tokens -= self.token_budget - room
        return chosen

    def _loop(self) -> None:
        while True:
            with self._cond:
                while True:
                    if not self._queue:
                        if self._closing:
                            return
                        self._cond.wait()
                        continue
                    now = time.monotonic()
                    deadline = self._queue[0].arrived + self.max_wait
                    full = self._queued_tokens >= self.token_budget or (
                        self.max_requests is not None and len(self._queue) >= self.max_requests
                    )
                    if full or self._closing or now >= deadline:
                        break
                    self._cond.wait(deadline - now)
                batch = self._take()
                now = time.monotonic()
                live = []
                for r in batch:
                    if r.future.set_running_or_notify_cancel():
                        live.append(r)
                        self._stats.waits_ms.append((now - r.arrived) * 1000.0)
                    else:
                        self._stats.cancelled += 1
            if live:
                self._run(live)

    def _run(self, reqs: list[_Request]) -> None:
        lens = np.fromiter((r.tokens.size for r in reqs), np.int64, len(reqs))
        try:
            tokens = np.concatenate([r.tokens for r in reqs])
            ids = np.fromiter((r.seq for r in reqs), np.int64, len(reqs))
            # batch: input_ids (T,), cu_seqlens int32 (n + 1,), ... as loader.collate builds it
            batch = collate(tokens, lens, ids, **self.collate_kwargs)
            out = self.run_batch(batch)
            total = int(lens.sum())
            if not hasattr(out, "shape") or len(out.shape) == 0 or out.shape[0] < total:
                raise DataError(
                    f"run_batch returned {type(out).__name__} of shape "
                    f"{getattr(out, 'shape', None)}; expected a first axis of {total} tokens"
                )
        except Exception as exc:  # handed to every caller of this batch
            with self._cond:
                self._stats.failed_batches += 1
            for r in reqs:
                r.future.set_exception(exc)
            return
        with self._cond:
            self._stats.batches += 1
            self._stats.tokens += int(lens.sum())
        cu = np.r_[0, np.cumsum(lens)]
        for i, r in enumerate(reqs):
            r.future.set_result(out[int(cu[i]) : int(cu[i + 1])])
