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
import warnings
import weakref
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from loader.collate import check_collate_kwargs, collate, collate_kwargs_dict
from loader.config import MAX_BATCH_TOKENS, check_int
from loader.online.inputs import not_a_sequence, private, several_sequences
from loader.online.request_queue import RequestQueue
from loader.record import Documents, outside_int64, tensor_ids
from packtool.errors import ConfigError, DataError, PacktoolError


class BatcherClosedError(PacktoolError):
    """A request was submitted after `RequestBatcher.close()`."""


class BatcherTimeoutError(PacktoolError, TimeoutError):
    """`RequestBatcher.close(timeout)` or leaving its `with` block gave up waiting for a model
    call (`run_batch`) still running; the batcher's thread goes on in the background."""


_NUMBERS = (int, float, np.integer, np.floating)
"""What a time setting may be (a bool is refused apart)."""

EXIT_TIMEOUT = 60.0
"""Default `exit_timeout`: seconds leaving a `with RequestBatcher(...)` block waits for a model
call before `BatcherTimeoutError` (batch after batch finishing, a long drain, is waited for)."""


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


def _request_tokens(tokens: Any, token_budget: int, vocab_size: int | None) -> np.ndarray:
    """A request's token ids as a 1-D int64 array (a torch tensor on any device is fine).

    `(1, T)` (a tokenizer's batch of one) is accepted; `(B, T)` with B > 1 is refused, since
    flattened it would silently become one request of B sequences. The array returned is a
    copy where the given one shares the caller's memory. Ids are checked here, per
    request: a negative one (or one past `vocab_size`) would otherwise fail the model call of
    every request batched with it, and mixed dtypes (uint64 beside int64) would meet in a
    float64 concatenation that rounds ids past 2^53.

    Raises:
        DataError: Why the request cannot be served (its future gets it).
    """
    tokens = tensor_ids(tokens, "request token ids")  # a CUDA or grad-tracking tensor too
    try:
        arr = np.asarray(tokens)
    except ValueError as exc:  # ragged nested lists: several sequences
        raise DataError(f"a request is one sequence of token ids ({exc})") from None
    if arr.ndim == 0 and (what := not_a_sequence(tokens)) is not None:
        raise DataError(f"a request must be a sequence of token ids (list/array), got {what}")
    if arr.ndim == 0:  # not the request [5]
        raise DataError(
            f"a request is one 1-d array of token ids, got a single value ({arr.item()!r:.40})"
        )
    if several_sequences(arr):
        raise DataError(f"a request is one sequence of token ids, got shape {arr.shape}")
    if not isinstance(tokens, (list, tuple)):
        # The caller may refill its array (or tensor, or an object whose __array__ hands out
        # its buffer) once submit returns: the request is checked and served from a copy.
        arr = private(arr, tokens)
    arr = arr.reshape(-1)
    if arr.size == 0:
        raise DataError("empty request: a request needs at least one token")
    if (bad := outside_int64(arr)) is not None:  # numpy's dtype object, e.g. for [2**64]
        problem = f"ids must be >= 0, got {bad}" if bad < 0 else f"id {bad} does not fit int64"
        raise DataError(f"request token {problem}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise DataError(f"request token ids must be integers, got dtype {arr.dtype}")
    if arr.size > token_budget:
        raise DataError(
            f"request of {arr.size} tokens exceeds the token budget {token_budget}; "
            "shorten it or raise token_budget"
        )
    low, high = int(arr.min()), int(arr.max())
    if low < 0:
        raise DataError(f"request token ids must be >= 0, got {low}")
    if vocab_size is not None and high >= vocab_size:
        raise DataError(f"request token id {high} is past the vocabulary (vocab_size {vocab_size})")
    if high > np.iinfo(np.int64).max:
        raise DataError(f"request token id {high} does not fit int64")
    return arr.astype(np.int64, copy=False)


class RequestBatcher:
    """Batches concurrent requests into packed varlen batches for one model function.

    Args:
        run_batch: The model: takes the batch dict, returns an array/tensor whose first axis runs
            over the batch's tokens (`cu_seqlens[-1]` entries), or a list of as many entries;
            with `collate_kwargs={"layout": "hf"}` also a model's `(1, T, ...)` output (each
            request gets rows of `out[0]`). Called on the batcher's thread.
        max_wait_ms: A request waits at most this long for others to join its batch.
        token_budget: Tokens per batch at most; a request longer than this is rejected.
        max_requests: Requests per batch at most (None: only the token budget limits).
        collate_kwargs: Passed to `loader.collate` (e.g. `pad_tokens` for a static shape; it must
            be at least `token_budget`, and `pad_docs` caps the requests per batch).
        vocab_size: Token ids must be below this (None: only `>= 0` is checked); a request
            with another id fails alone, on its own future.
        exit_timeout: Seconds leaving the `with` block waits for one model call (default 60;
            None: no bound): when no batch finishes in that time, `BatcherTimeoutError` (a
            warning where the block is left by an exception, which goes on).

    Use as a context manager, or call `close()` to drain and stop. A batcher dropped without
    `close()` is closed when garbage-collected (its queued requests are still served).
    """

    def __init__(
        self,
        *,
        run_batch: Callable[[dict], Any],
        max_wait_ms: float = 50.0,
        token_budget: int = 8192,
        max_requests: int | None = None,
        collate_kwargs: dict[str, Any] | None = None,
        vocab_size: int | None = None,
        exit_timeout: float | None = EXIT_TIMEOUT,
    ) -> None:
        if not callable(run_batch):
            raise ConfigError(f"run_batch must be callable, got {run_batch!r}")
        # numpy numbers too (np.int64(50) from a config array was "must be a number")
        if isinstance(max_wait_ms, bool) or not isinstance(max_wait_ms, _NUMBERS):
            raise ConfigError(f"max_wait_ms must be a number of milliseconds, got {max_wait_ms!r}")
        if not max_wait_ms >= 0:
            raise ConfigError(f"max_wait_ms must be >= 0, got {max_wait_ms!r}")
        self.exit_timeout = _check_timeout("exit_timeout", exit_timeout)
        # numpy integers are integers; bools are not counts (max_requests=True was 1)
        check_int("token_budget", token_budget, 1)
        token_budget = int(token_budget)
        if token_budget > MAX_BATCH_TOKENS:  # a batch's cu_seqlens is int32
            raise ConfigError(
                f"token_budget {token_budget:,} is more tokens than a batch can hold: cu_seqlens "
                f"is int32, so at most {MAX_BATCH_TOKENS:,}"
            )
        if vocab_size is not None:
            check_int("vocab_size", vocab_size, 1)
            vocab_size = int(vocab_size)
        if max_requests is not None:
            check_int("max_requests", max_requests, 1)
            max_requests = int(max_requests)
        collate_kwargs = collate_kwargs_dict(collate_kwargs)
        max_requests = _check_collate(collate_kwargs, token_budget, max_requests)
        self.run_batch = run_batch
        self.max_wait = float(max_wait_ms) / 1000.0
        self.token_budget = token_budget
        self.max_requests = max_requests
        self.collate_kwargs = collate_kwargs
        self.vocab_size = vocab_size
        # The thread holds only the core, so a batcher nobody references can be collected; its
        # finalizer then closes the core and the thread ends after serving what was queued.
        self._core = _Core(run_batch, self.max_wait, token_budget, max_requests, collate_kwargs)
        self._thread = threading.Thread(target=self._core.loop, name="RequestBatcher", daemon=True)
        self._thread.start()
        weakref.finalize(self, self._core.shut)

    # ---- client side ------------------------------------------------------------------------

    def submit(self, tokens: Any) -> Future:
        """Queue one request (a 1-D array or list of token ids); its future gets its output rows.

        Raises:
            BatcherClosedError: after `close()`.
        """
        fut: Future = Future()
        core = self._core
        try:
            arr, bad = _request_tokens(tokens, self.token_budget, self.vocab_size), None
        except DataError as exc:
            arr, bad = None, exc
        with core.cond:
            if core.closing:
                raise BatcherClosedError("this RequestBatcher is closed; submit to a new one")
            core.stats.requests += 1
            if bad is not None:
                core.stats.rejected += 1
                fut.set_exception(bad)
                return fut
            core.queue.append(_Request(arr, fut, time.monotonic(), core.seq), arr.size)
            core.seq += 1
            core.queued_tokens += arr.size
            core.cond.notify()
        return fut

    def close(self, timeout: float | None = None) -> None:
        """Refuse new requests, dispatch every queued one, and stop the thread (called by the
        model, on the batcher's own thread: the thread stops once its batch returns).

        Args:
            timeout: Seconds to wait for the thread to serve the queue and stop (None: as
                long as it takes).

        Raises:
            BatcherTimeoutError: The thread is still running after `timeout` (a model call
                still running); it goes on in the background.
        """
        timeout = _check_timeout("timeout", timeout)
        self._core.shut()
        if threading.current_thread() is self._thread:  # a thread cannot join itself
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise BatcherTimeoutError(self._still_running(timeout))

    def __enter__(self) -> RequestBatcher:
        return self

    def __exit__(self, kind: type | None, *exc: object) -> None:
        """`close()`, waiting while batches keep finishing, up to `exit_timeout` for each."""
        core = self._core
        core.shut()
        if threading.current_thread() is self._thread:
            return
        with core.cond:  # the batches finished so far: a wait with none more is no progress
            finished = core.stats.batches + core.stats.failed_batches
        while True:
            self._thread.join(self.exit_timeout)
            if not self._thread.is_alive():
                return
            with core.cond:
                now = core.stats.batches + core.stats.failed_batches
            if now == finished:  # no batch finished in a whole exit_timeout
                break
            finished = now
        message = self._still_running(self.exit_timeout)
        if kind is not None:  # the block's own error goes on; this one is said alongside
            warnings.warn(message, stacklevel=2)
            return
        raise BatcherTimeoutError(message)

    def _still_running(self, waited: float | None) -> str:
        with self._core.cond:
            queued = len(self._core.queue)
        return (
            f"RequestBatcher: the model call (run_batch) is still running after {waited:g} s; "
            f"its thread goes on in the background ({queued} request"
            f"{'' if queued == 1 else 's'} queued)"
        )

    @property
    def stats(self) -> dict[str, Any]:
        """Counters, batch fill (tokens / budget) and the time requests waited to be dispatched."""
        core = self._core
        with core.cond:  # copied under the lock; the percentiles of 100k waits are taken after
            s = core.stats
            out: dict[str, Any] = {
                "requests": s.requests,
                "rejected": s.rejected,
                "cancelled": s.cancelled,
                "batches": s.batches,
                "failed_batches": s.failed_batches,
                "tokens": s.tokens,
                "queued": len(core.queue),
                "mean_fill": s.tokens / (s.batches * self.token_budget) if s.batches else 0.0,
            }
            waits = list(s.waits_ms)
            closed = core.closing
        arr = np.fromiter(waits, np.float64, len(waits)) if waits else np.zeros(1)
        p50, p99 = np.percentile(arr, [50, 99])
        out.update(
            wait_ms_p50=float(p50),
            wait_ms_p99=float(p99),
            wait_ms_max=float(arr.max()),
            closed=closed,
        )
        return out


def _check_timeout(name: str, value: Any) -> float | None:
    """A wait in seconds: a number >= 0, or None (no bound)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, _NUMBERS) or not value >= 0:
        raise ConfigError(f"{name} must be a number of seconds >= 0 or None, got {value!r}")
    return None if value == float("inf") else float(value)  # inf overflows a lock's wait


def _check_collate(
    kwargs: dict[str, Any], token_budget: int, max_requests: int | None
) -> int | None:
    """Validate `collate_kwargs` up front (a bad one would fail every batch); the request cap.

    Returns:
        `max_requests`, lowered so a batch never holds more documents than `pad_docs` allows.
    """
    check_collate_kwargs(kwargs)
    pad_tokens = kwargs.get("pad_tokens")
    if pad_tokens is not None and pad_tokens < token_budget:
        raise ConfigError(
            f"collate_kwargs pad_tokens={pad_tokens} is smaller than token_budget={token_budget}; "
            "a full batch would not fit its static shape"
        )
    pad_docs = kwargs.get("pad_docs")
    if pad_docs is not None:
        room = pad_docs - (1 if pad_tokens is not None else 0)  # one entry for the padding
        if room < 1:
            raise ConfigError(f"collate_kwargs pad_docs={pad_docs} leaves no room for a request")
        max_requests = room if max_requests is None else min(max_requests, room)
    return max_requests


def _token_rows(out: Any, total: int, hf: bool) -> Any:
    """`run_batch`'s output as rows over the batch's `total` tokens: an array or tensor whose
    first axis has `total` entries, a list or tuple of `total` entries, or with `layout="hf"` a
    model's `(1, T, ...)` output (its batch axis taken off).

    Raises:
        DataError: Anything else: requests would be handed rows that are not theirs.
    """
    shape = getattr(out, "shape", None)
    if hf and shape is not None and len(shape) >= 2 and tuple(shape[:2]) == (1, total):
        return out[0]
    if shape is None and isinstance(out, (list, tuple)):
        if len(out) != total:
            raise DataError(
                f"run_batch returned {type(out).__name__} of {len(out)} entries; expected {total}"
            )
        return out
    if shape is None or len(shape) == 0 or shape[0] != total:
        raise DataError(
            f"run_batch returned {type(out).__name__} of shape {shape}; expected a first axis "
            f"of {total} tokens" + (" (or, with layout='hf', (1, T, ...))" if hf else "")
        )
    return out


class _Core:
    """The queue, the counters and the serving thread's loop (all the thread references)."""

    def __init__(
        self,
        run_batch: Callable[[dict], Any],
        max_wait: float,
        token_budget: int,
        max_requests: int | None,
        collate_kwargs: dict[str, Any],
    ) -> None:
        self.run_batch = run_batch
        self.max_wait = max_wait
        self.token_budget = token_budget
        self.max_requests = max_requests
        self.collate_kwargs = collate_kwargs
        self.cond = threading.Condition()
        self.queue: RequestQueue[_Request] = RequestQueue()
        self.queued_tokens = 0
        self.closing = False
        self.seq = 0
        self.stats = _Stats()

    def shut(self) -> None:
        with self.cond:
            self.closing = True
            self.cond.notify()

    def take(self) -> list[_Request]:
        """Requests for the next batch: arrival order while they fit, then gap filling (each
        found in the queue's size index: the cost does not grow with the backlog)."""
        chosen = self.queue.take(self.token_budget, self.max_requests)
        self.queued_tokens -= sum(r.tokens.size for r in chosen)
        return chosen

    def loop(self) -> None:
        try:
            self._serve()
        finally:
            # Only reached early by a bug: no client may wait forever on a dead thread.
            with self.cond:
                self.closing = True
                stranded = self.queue.drain()
            for r in stranded:
                if r.future.set_running_or_notify_cancel():
                    r.future.set_exception(BatcherClosedError("the RequestBatcher thread stopped"))

    def _serve(self) -> None:
        while True:
            with self.cond:
                while True:
                    if not self.queue:
                        if self.closing:
                            return
                        self.cond.wait()
                        continue
                    now = time.monotonic()
                    deadline = self.queue.oldest().arrived + self.max_wait
                    full = self.queued_tokens >= self.token_budget or (
                        self.max_requests is not None and len(self.queue) >= self.max_requests
                    )
                    if full or self.closing or now >= deadline:
                        break
                    # max_wait_ms=inf: no deadline (an infinite timeout overflows time_t)
                    self.cond.wait(min(deadline - now, threading.TIMEOUT_MAX))
                batch = self.take()
                now = time.monotonic()
                live = []
                for r in batch:
                    if r.future.set_running_or_notify_cancel():
                        live.append(r)
                        self.stats.waits_ms.append((now - r.arrived) * 1000.0)
                    else:
                        self.stats.cancelled += 1
            if live:
                self.run(live)

    def run(self, reqs: list[_Request]) -> None:
        lens = np.fromiter((r.tokens.size for r in reqs), np.int64, len(reqs))
        try:
            tokens = np.concatenate([r.tokens for r in reqs])
            ids = np.fromiter((r.seq for r in reqs), np.int64, len(reqs))
            # batch: input_ids (T,), cu_seqlens int32 (n + 1,), ... as loader.collate builds it
            batch = collate(Documents(tokens, lens, ids), **self.collate_kwargs)
            out = self.run_batch(batch)
            # the batch's token axis: cu_seqlens[-1], the static shape's padding included; a
            # longer or shorter first axis would hand requests rows that are not theirs
            total = int(batch["input_ids"].numel())
            out = _token_rows(out, total, self.collate_kwargs.get("layout") == "hf")
        except BaseException as exc:  # handed to every caller of this batch
            # BaseException too: a model raising SystemExit / KeyboardInterrupt would otherwise
            # end the thread, leaving this batch's callers and every later one waiting forever.
            with self.cond:
                self.stats.failed_batches += 1
            for r in reqs:
                r.future.set_exception(exc)
            return
        with self.cond:
            self.stats.batches += 1
            self.stats.tokens += int(lens.sum())
        cu = np.r_[0, np.cumsum(lens)]
        for i, r in enumerate(reqs):
            r.future.set_result(out[int(cu[i]) : int(cu[i + 1])])
