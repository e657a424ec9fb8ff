"""Conversations -> rendered texts and supervised character spans, in this process or in a pool.

Rendering a chat template is Python under the GIL (jinja2), while the tokenizer encodes on every
core with the GIL released; rendering is most of the CPU time of chat inputs (docs/sft.md). So
batches of conversations are rendered by `Renderer.render_batch` either here or, for inputs big
enough to repay the start-up, by a `RenderPool` of worker processes while this process reads,
encodes, masks and writes. Both paths run the same function on the same batches and hand back
the same `RenderedBatch` (flat arrays: one string of the texts end to end, their lengths, the
spans; no per-token or per-span Python objects cross a process boundary), consumed in order:
the output is identical, byte for byte, whichever path rendered it (tests/packtool/
test_chat_render.py).

Conversations go to the workers as `marshal` bytes (JSON-like values: ~6x cheaper to write than
pickle, which is the fallback for anything else); each worker compiles the template once, at
start-up. Workers are forked where the platform can (a fork costs milliseconds, a spawned worker
re-imports jinja2 and packtool: ~0.2 s each, measured in docs/sft.md), before packtool starts
its own threads.
"""

from __future__ import annotations

import marshal
import os
import pickle
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool import lifeline
from packtool.errors import DataError, option_choice
from packtool.read.sft_config import check_train_on
from packtool.sft.template import ChatTemplate, TemplateFailure, normalize_messages
from packtool.sft.turns import NotIncremental, common_prefix, turn_spans

POOL_MIN_BYTES = 8 << 20
"""Input bytes below which rendering stays in this process: a forked worker costs ~35 ms of CPU
to start (its template compiled, its pages copied), the transfers ~5 % of the rendering, and
8 MiB (~6,000 conversations of sample_data's shape) render in ~0.3 s; on a machine whose cores
other work already uses the pool gains nothing (docs/sft.md)."""
POOL_MIN_CONVERSATIONS = 6000
"""The same bound for in-memory conversations (`encode_chat`)."""


@dataclass
class RenderedBatch:
    """One batch of conversations, rendered: what the encoder and the mask need, as flat arrays.

    A conversation of the batch is either kept (rendered; in `kept`) or skipped (in `skips`).
    """

    text: str
    """The kept conversations' texts, end to end."""
    lengths: NDArray[np.int64]
    """(n_kept,) characters of each kept text."""
    kept: NDArray[np.int64]
    """(n_kept,) the kept conversations' positions in the batch, increasing."""
    span_counts: NDArray[np.int64]
    """(n_kept,) supervised spans of each kept conversation (0: none)."""
    span_starts: NDArray[np.int64]
    """(sum(span_counts),) span starts in characters of their own text, in order."""
    span_ends: NDArray[np.int64]
    skips: list[tuple[int, str, str]]
    """(position in the batch, skip reason, detail) of the skipped ones, in order."""

    def texts(self) -> list[str]:
        ends = np.cumsum(self.lengths).tolist()
        text = self.text
        return [text[e - n : e] for e, n in zip(ends, self.lengths.tolist(), strict=True)]


class Renderer:
    """Renders conversations with a template and finds their supervised spans.

    Args:
        template: the chat template.
        train_on: `assistant`, `last` or `all` (packtool/read/sft_config.py).

    Raises:
        ConfigError: `train_on` is none of these.
    """

    def __init__(self, template: ChatTemplate, train_on: str) -> None:
        check_train_on(train_on)
        self.template = template
        self.train_on = train_on

    def spans(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """(text, spans) of one normalised conversation.

        Raises:
            TemplateFailure: the template failed on it.
            NotIncremental: its turns cannot be found (templates without generation blocks).
        """
        t = self.template
        if self.train_on == "all":
            text = t.render(messages).text
            return text, [(0, len(text))]
        turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
        if not turns:
            return t.render(messages).text, []
        if t.has_generation:
            r = t.render(messages, track=True)
            spans = list(r.spans)
            if self.train_on == "last":
                spans = _last_turn(t, messages, turns[-1], r.text, spans)
            return r.text, spans
        return turn_spans(t, messages, turns[-1:] if self.train_on == "last" else turns)

    def render_batch(
        self, values: Sequence[Any], *, convert: bool, drop_unsupervised: bool
    ) -> RenderedBatch:
        """Render a batch of conversations.

        Args:
            values: conversations: role/content message lists, or (`convert`) anything a user
                passes (`sft_inputs.to_messages` checks and maps ShareGPT messages).
            convert: pass each through `to_messages` first (its `BadRecord` is a skip).
            drop_unsupervised: a conversation without an assistant turn is a skip
                (`no_supervised_tokens`) rather than kept with no spans.
        """
        from packtool.sft.inputs import BadRecord, to_messages

        texts: list[str] = []
        kept: list[int] = []
        counts: list[int] = []
        starts: list[int] = []
        ends: list[int] = []
        skips: list[tuple[int, str, str]] = []
        for i, value in enumerate(values):
            try:
                messages = to_messages(value) if convert else value
                text, spans = self.spans(normalize_messages(messages))
            except BadRecord as bad:
                skips.append((i, bad.reason, bad.detail))
                continue
            except TemplateFailure as exc:
                skips.append((i, "template_error", str(exc)))
                continue
            except NotIncremental as exc:
                skips.append((i, "template_not_incremental", str(exc)))
                continue
            if not spans and drop_unsupervised:
                skips.append((i, "no_supervised_tokens", "no assistant turn"))
                continue
            shown = _content_shown_as_list(messages, text)
            if shown is not None:
                skips.append((i, "content_parts", shown))
                continue
            texts.append(text)
            kept.append(i)
            counts.append(len(spans))
            for a, b in spans:
                starts.append(a)
                ends.append(b)
        return RenderedBatch(
            text="".join(texts),
            lengths=np.fromiter(map(len, texts), np.int64, len(texts)),
            kept=np.asarray(kept, np.int64),
            span_counts=np.asarray(counts, np.int64),
            span_starts=np.asarray(starts, np.int64),
            span_ends=np.asarray(ends, np.int64),
            skips=skips,
        )


def _content_shown_as_list(messages: list[Any], text: str) -> str | None:
    """Why the rendered `text` is not the conversation: a message's content is a list of parts
    (OpenAI's `[{"type": "text", "text": ...}]`, as transformers passes it to the template),
    and the template, written for string contents, printed the list as Python writes it
    (`[{'type': 'text', ...}]`), which trained the model on that repr in silence. None: no
    such content, or the template read the parts (Llama 3's and Qwen's templates do)."""
    for i, m in enumerate(messages):
        content = m.get("content") if isinstance(m, dict) else None
        # (An empty one writes `[]` / `{}`, which any text may hold: nothing to tell by.)
        if isinstance(content, (list, dict)) and content and str(content) in text:
            what = "a list of parts" if isinstance(content, list) else "an object"
            return (
                f"message {i}'s content is {what}, which the chat template writes as Python "
                "does; give the content as a string, or a template that reads parts"
            )
    return None


# --- the pool -------------------------------------------------------------------------------

_WORKER: Renderer | None = None


def _start_worker(
    source: str, special_tokens: dict[str, str], name: str, train_on: str, driver: int
) -> None:
    global _WORKER
    lifeline.follow(driver)  # a driver killed outright takes its render workers with it
    _WORKER = Renderer(ChatTemplate(source, special_tokens=special_tokens, name=name), train_on)


def _render_in_worker(payload: bytes, packed_with: str, convert: bool, drop: bool) -> Any:
    values = marshal.loads(payload) if packed_with == "marshal" else pickle.loads(payload)
    assert _WORKER is not None, "the pool's initializer builds the renderer"
    return _WORKER.render_batch(values, convert=convert, drop_unsupervised=drop)


def _ready() -> int:
    return os.getpid()


def start_method() -> str:
    """`fork` where the platform has it (see the module docstring), else `spawn`."""
    import multiprocessing as mp

    return "fork" if "fork" in mp.get_all_start_methods() else "spawn"


class RenderPool:
    """Worker processes that render batches with one template (`Renderer.render_batch`).

    Args:
        renderer: what to render with (its template's source, special tokens and name, and
            `train_on`, are sent to each worker, which compiles the template once).
        processes: worker processes.
        method: the multiprocessing start method (`fork`, `forkserver`, `spawn`).
    """

    def __init__(self, renderer: Renderer, processes: int, method: str | None = None) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        t = renderer.template
        self.processes = processes
        self.method = method or start_method()
        self._executor = ProcessPoolExecutor(
            processes,
            mp_context=mp.get_context(self.method),
            initializer=_start_worker,
            initargs=(t.source, dict(t.special_tokens), t.name, renderer.train_on, os.getpid()),
        )
        # Start every worker now, before the caller starts threads (a fork copies only the
        # thread that forks).
        self._executor.submit(_ready)

    def submit(
        self, values: Sequence[Any], *, convert: bool, drop_unsupervised: bool
    ) -> Future[RenderedBatch]:
        try:
            payload, how = marshal.dumps(list(values)), "marshal"
        except ValueError:  # not plain JSON-like values (e.g. from an unusual Parquet column)
            payload, how = pickle.dumps(list(values), protocol=pickle.HIGHEST_PROTOCOL), "pickle"
        return self._executor.submit(_render_in_worker, payload, how, convert, drop_unsupervised)

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)

    def __enter__(self) -> RenderPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pool_pays(renderer: Renderer) -> bool:
    """Whether rendering is most of the work, so that a default pool repays its start-up.

    Measured (docs/sft.md): turn masks (two watched renders, ~70 % of the CPU time) gained up
    to 1.6x on 14,000 conversations; a template with `{% generation %}` blocks (one render,
    about half) lost 13-25 % on the shared 2-core machine measured, so it renders in process
    unless a pool is asked for.
    """
    return not renderer.template.has_generation and renderer.train_on != "all"


def render_processes(requested: int | None) -> int:
    """Worker processes for rendering: `requested`, or (None) one per core when there are two
    or more (a single core gains nothing), else 0: render in this process."""
    if requested is not None:
        return requested
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return cores if cores >= 2 else 0


def rendered_in_order(
    batches: Iterator[Any],
    values: Callable[[Any], Sequence[Any]],
    renderer: Renderer,
    pool: RenderPool | None,
    *,
    convert: bool,
    drop_unsupervised: bool,
) -> Iterator[tuple[Any, RenderedBatch]]:
    """(batch, its `RenderedBatch`) for each batch of `batches`, in order.

    With a pool, up to two batches per worker are in flight; otherwise each is rendered here.
    An exception raised while reading a batch comes after the batches read before it (whose
    skips, raised under `--strict`, then come first, as they do without a pool).

    Args:
        batches: anything; `values(batch)` gives its conversations.
        values: the conversations of a batch.
        renderer: renders in this process (no pool).
        pool: renders in workers, or None.
        convert: see `Renderer.render_batch`.
        drop_unsupervised: see `Renderer.render_batch`.
    """
    opts = {"convert": convert, "drop_unsupervised": drop_unsupervised}
    if pool is None:
        for batch in batches:
            yield batch, renderer.render_batch(values(batch), **opts)
        return
    pending: deque[tuple[Any, Future[RenderedBatch]]] = deque()
    window = 2 * pool.processes

    def done(batch: Any, job: Future[RenderedBatch]) -> tuple[Any, RenderedBatch]:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return batch, job.result()
        except BrokenProcessPool:
            raise DataError(
                "a chat template rendering process died (out of memory?); rerun with "
                f"{option_choice('--render-processes', 'render_processes', 0)} to render in "
                "the main process"
            ) from None

    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except Exception:
            while pending:
                yield done(*pending.popleft())
            raise
        pending.append((batch, pool.submit(values(batch), **opts)))
        if len(pending) > window:
            yield done(*pending.popleft())
    while pending:
        yield done(*pending.popleft())


def _last_turn(
    t: ChatTemplate,
    messages: list[dict[str, Any]],
    last: int,
    text: str,
    spans: list[tuple[int, int]],
) -> list[tuple[int, int]]:
    """The `{% generation %}` blocks of the last assistant turn (message `last`): those that
    start where the whole render parts from the render of the conversation before that turn
    (their common start: a template may close a conversation otherwise, phi-3's with an EOS
    after a user turn), or later. The last block alone was taken: a template that closes the
    conversation with a block of its own (phi-3's `{% generation %}{{ eos_token }}`) or cuts a
    turn into several (reasoning, tool call, content) trained its last token or block only.
    With the last turn the first message, nothing comes before it: every block (rendering an
    empty conversation fails in most real templates, and skipped it as a template_error)."""
    start = common_prefix(text, t.render(messages[:last]).text) if last else 0
    return [(a, b) for a, b in spans if a >= start] or spans[-1:]
