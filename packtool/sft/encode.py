"""Fine-tuning records -> tables of the tokenized schema with a `loss_mask` column.

- Conversations are rendered with the chat template (packtool/sft/template.py) and encoded as
  transformers' `apply_chat_template(..., tokenize=True)` encodes them (no BOS/EOS added: the
  template writes its own). Where the loss goes (`--train-on`):
  `assistant` (default): the assistant turns, from the template's `{% generation %}` blocks
  when it has them, else turn by turn (packtool/sft/turns.py); `last`: the last of those;
  `all`: every token.
- Prompt/completion records are encoded piece by piece, as a model sees them when it generates:
  [BOS] + prompt + completion + [EOS] (BOS/EOS as the tokenizer options say), the loss on the
  completion and the EOS (`--train-on all`: on every token). Encoding the prompt alone keeps its
  last token what it is at inference time, whatever the completion starts with.

Skipped and counted (an error with `--strict`): a template error (`template_error`, with its
message), a turn the template hides (`template_not_incremental`), a conversation without an
assistant turn or whose mask is all zeros past its first token, which labels never target
(`no_supervised_tokens`), a document of no tokens
(`empty`). Three stages run a batch apart: read + render (Python) | encode (the tokenizer's
threads) | masks + the table.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrow_numpy import strings
from packtool.dataset.masks import target_sums
from packtool.dataset.tokenized_table import kept_documents, tokenized_table
from packtool.errors import ConfigError, option_choice
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.read.sft_config import CHAT_KINDS, SFTConfig
from packtool.sft.inputs import Records, read_records
from packtool.sft.render import (
    POOL_MIN_BYTES,
    POOL_MIN_CONVERSATIONS,
    RenderedBatch,
    Renderer,
    RenderPool,
    pool_pays,
    render_processes,
    rendered_in_order,
)
from packtool.sft.template import ChatTemplate, TemplateFailure, load_chat_template
from packtool.sft.tokens import TextEncoder, masks_for
from packtool.sft.turns import check_turn_template
from packtool.storage import local as storage


def chat_template_for(sft: SFTConfig, tokenizer: Any) -> ChatTemplate:
    """The template `sft` names, or the tokenizer's own; checked for `sft.train_on`.

    Raises:
        ConfigError: no template, a bad one, or one whose turns cannot be found.
    """
    template = _chat_template(sft, tokenizer)
    if not template.has_generation and sft.train_on != "all":
        why = check_turn_template(template)
        if why is not None:
            raise ConfigError(
                f"{template.name}: assistant turns cannot be found in this template ({why}); "
                "use a template with {% generation %} blocks, or "
                + option_choice("--train-on", "train_on", "all")
            )
    return template


def template_record(sft: SFTConfig, tokenizer: Any) -> dict[str, Any]:
    """What identifies the template a run renders with, wherever it came from (`--chat-template`,
    the tokenizer's chat_template.jinja or tokenizer_config.json): the sha256 of its text and
    the special-token strings it sees. A resume compares it; `index.json` records it.

    Raises:
        ConfigError: no template, or one that does not compile.
    """
    template = _chat_template(sft, tokenizer)
    return {
        "sha256": template.sha256,
        "special_tokens": dict(sorted(template.special_tokens.items())),
    }


def note_template(sft: SFTConfig, tokenizer: Any) -> None:
    """Say on stderr (once a run, by its driver) what the template will make of the turn masks
    that a user would not expect: a template without `{% generation %}` blocks that writes
    nothing for `add_generation_prompt` has each assistant turn's opening (its role header)
    inside the turn (the turn is what the conversation up to it adds after the generation
    prompt, docs/sft.md), so it is trained as part of every answer, in silence until now."""
    if sft.train_on == "all":
        return
    template = _chat_template(sft, tokenizer)
    if template.has_generation or check_turn_template(template) is not None:
        return  # (one whose turns cannot be found is refused: `chat_template_for`)
    probe = [{"role": "user", "content": "x"}]
    try:
        same = (
            template.render(probe, add_generation_prompt=True).text == template.render(probe).text
        )
    except TemplateFailure:  # one that needs more than a user message: nothing to tell
        return
    if same:
        print(
            f"note: {template.name} writes nothing for add_generation_prompt, so each "
            "assistant turn's opening (its role header) is trained as part of the answer; use "
            "a template that writes it, or one with {% generation %} blocks",
            file=sys.stderr,
            flush=True,
        )


def _chat_template(sft: SFTConfig, tokenizer: Any) -> ChatTemplate:
    """The template `sft` names, or the tokenizer's own, with the special tokens it sees."""
    identity = tokenizer.identity
    folder = tokenizer.folder if identity.kind == "hf" else None  # a hub id's: its snapshot
    fallback = {}
    if identity.kind in ("hf", "tiktoken"):  # the ids' strings, where no config names them
        encoder = text_encoder(tokenizer, specials=True)
        own = tokenizer.own_ids  # the tokenizer's defaults: --eos-id/--no-eos change no text
        for name, i in (("bos_token", own["bos"]), ("eos_token", own["eos"])):
            token = encoder.token_text(i) if i is not None else None
            if token is not None:
                fallback[name] = token
    template = load_chat_template(sft.chat_template, tokenizer_dir=folder)
    template.special_tokens = {**fallback, **template.special_tokens}
    return template


@dataclass
class _Prepared:
    """One batch after stage 1: what to encode, and how to mask it."""

    texts: list[str]
    completions: list[str] | None = None
    """Prompt/completion encoded in context (`texts` the prompts, then each prompt + completion
    joined): the completions, encoded alone only where a token crosses a prompt's end."""
    rendered: RenderedBatch | None = None
    """Chat: the rendering (its supervised character spans, as flat arrays)."""
    wheres: list[str] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    """Each record's offset in its file (`Records.offsets`): its document id's offset."""
    sources: list[str] = field(default_factory=list)
    extras: dict[str, list[str | None]] = field(default_factory=dict)
    nbytes: int = 0


def _chat_prepared(records: Records, r: RenderedBatch, skips: SkipCounter) -> _Prepared:
    """Stage 1 of chat records, once rendered: the skips counted, the kept records' fields."""
    for i, reason, detail in r.skips:
        skips.add(reason, records.wheres[i], detail)
    kept = r.kept.tolist()
    return _Prepared(
        texts=r.texts(),
        rendered=r,
        wheres=[records.wheres[i] for i in kept],
        offsets=[records.offsets[i] for i in kept],
        sources=[records.sources[i] for i in kept],
        extras={k: [v[i] for i in kept] for k, v in records.extras.items()},
        nbytes=records.nbytes,
    )


@dataclass(frozen=True)
class EncodedChat:
    """One conversation encoded by `encode_chat`, or why it was skipped."""

    ids: np.ndarray | None = None
    mask: np.ndarray | None = None
    """uint8, 1 on the supervised tokens."""
    text: str | None = None
    skip: str | None = None
    """The skip reason (`template_error`, `unknown_role`, ...) when it was not encoded."""
    detail: str = ""


def encode_chat(
    conversations: Sequence[Any],
    *,
    template: ChatTemplate,
    tokenizer: Any,
    train_on: str = "assistant",
    processes: int | None = None,
) -> list[EncodedChat]:
    """Encode conversations (messages or ShareGPT lists) as `packtool pack` does, in memory.

    The library form of what the readers do to each record: for each conversation its token ids
    and loss mask (equal to transformers' `apply_chat_template(..., tokenize=True,
    return_assistant_tokens_mask=True)` for templates with `{% generation %}` blocks), or the
    reason it would be skipped.

    Args:
        conversations: each a list of message objects.
        template: the chat template (`chat_template.load_chat_template`).
        tokenizer: a `packtool.tokenizer.tokenizers.Tokenizer`.
        train_on: `assistant`, `last` or `all`.
        processes: worker processes that render (packtool/sft/render.py); None: one per core
            for `chat_render.POOL_MIN_CONVERSATIONS` conversations or more when rendering is
            most of the work (`chat_render.pool_pays`: turn masks); 0: this process.
            The result is the same.

    Raises:
        ConfigError: `train_on` is none of `assistant`, `last`, `all`.
    """
    from concurrent.futures import ThreadPoolExecutor

    renderer = Renderer(template, train_on)
    encoder = text_encoder(tokenizer, specials=True)
    if processes is None:
        big = len(conversations) >= POOL_MIN_CONVERSATIONS and pool_pays(renderer)
        processes = render_processes(None) if big else 0
    chunks = [conversations[at : at + _CHUNK] for at in range(0, len(conversations), _CHUNK)]
    out: list[EncodedChat] = []
    pool = RenderPool(renderer, processes) if processes else None
    try:
        # Render a chunk (here or in the pool) while the tokenizer (GIL released) encodes the
        # one before.
        rendered = rendered_in_order(
            iter(chunks), lambda c: c, renderer, pool, convert=True, drop_unsupervised=False
        )
        with ThreadPoolExecutor(1, thread_name_prefix="packtool-encode") as threads:
            jobs = []
            for chunk, r in rendered:
                texts = r.texts()
                jobs.append((threads.submit(encoder.encode, texts), len(chunk), r, texts))
            for job, n, r, texts in jobs:
                flat, lengths = job.result()
                out += _encoded(encoder, n, r, texts, flat, lengths)
    finally:
        if pool is not None:
            pool.close()
    return out


_CHUNK = 256
_ENCODERS: Any = None


def text_encoder(tokenizer: Any, *, specials: bool) -> TextEncoder:
    """A `TextEncoder` for `tokenizer`, made once (its byte-length table reads the vocabulary)."""
    global _ENCODERS
    import weakref

    if _ENCODERS is None:
        _ENCODERS = weakref.WeakKeyDictionary()
    per = _ENCODERS.setdefault(tokenizer, {})
    if specials not in per:
        per[specials] = TextEncoder(tokenizer, specials=specials)
    return per[specials]


def _encoded(
    encoder: TextEncoder,
    n: int,
    r: RenderedBatch,
    texts: list[str],
    flat: np.ndarray,
    lengths: np.ndarray,
) -> list[EncodedChat]:
    """The `EncodedChat` of each of the `n` conversations of a chunk, in order."""
    mask = masks_for(encoder, texts, r.span_counts, r.span_starts, r.span_ends, flat, lengths)
    off = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    out: list[EncodedChat | None] = [None] * n
    for i, reason, detail in r.skips:
        out[i] = EncodedChat(skip=reason, detail=detail)
    counts = r.span_counts.tolist()
    for j, i in enumerate(r.kept.tolist()):
        ids, m = flat[off[j] : off[j + 1]], mask[off[j] : off[j + 1]]
        if not len(ids):
            out[i] = EncodedChat(text=texts[j], skip="empty", detail="no tokens")
        elif not counts[j] or not m[1:].any():  # a first token is never a target
            out[i] = EncodedChat(ids=ids, mask=m, text=texts[j], skip="no_supervised_tokens")
        else:
            out[i] = EncodedChat(ids=ids, mask=m, text=texts[j])
    return out  # type: ignore[return-value]


def _prompt_completion(records: Records, in_context: bool = False) -> _Prepared:
    """Stage 1 of prompt/completion: the prompts, then the completions, as one list to encode;
    `in_context` (`TextEncoder.prefixes_every_text`): the prompts, then each prompt +
    completion joined (the completions kept aside, `in_context`)."""
    prompts = [p for p, _ in records.values]
    completions = [c for _, c in records.values]
    second = [p + c for p, c in records.values] if in_context else completions
    return _Prepared(
        texts=prompts + second,
        completions=completions if in_context else None,
        wheres=list(records.wheres),
        offsets=list(records.offsets),
        sources=list(records.sources),
        extras=records.extras,
        nbytes=records.nbytes,
    )


def in_context(
    encoder: TextEncoder, completions: list[str], flat: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """The prompts, then the completions, from the encoded prompts and joined texts
    (`_prompt_completion(in_context=True)`): each completion is the joined text's ids after its
    prompt's, where the joined ids begin with the prompt's (the prompt's tokens are what a
    model has at inference); else (a token across the boundary) the completion encoded alone,
    for those records only."""
    n = len(lengths) // 2
    off = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=off[1:])
    parts: list[np.ndarray | None] = []
    crossed = []
    for i in range(n):
        prompt, joined = flat[off[i] : off[i + 1]], flat[off[n + i] : off[n + i + 1]]
        same = np.array_equal(joined[: len(prompt)], prompt)
        parts.append(joined[len(prompt) :] if same else None)
        if not same:
            crossed.append(i)
    if crossed:
        alone, alone_lengths = encoder.encode([completions[i] for i in crossed])
        for i, piece in zip(crossed, np.split(alone, np.cumsum(alone_lengths)[:-1]), strict=True):
            parts[i] = piece
    sizes = np.fromiter((len(t) for t in parts), np.int64, n)
    ids = np.concatenate([flat[: off[n]], *parts]) if n else flat[:0]
    return ids, np.concatenate([lengths[:n], sizes])


def _scatter(dest_starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Flat positions `dest_starts[i] + 0 .. lengths[i] - 1` for every i."""
    total = int(lengths.sum())
    src = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=src[1:])
    return np.repeat(dest_starts - src[:-1], lengths) + np.arange(total, dtype=np.int64)


def assemble_prompt_completion(
    flat: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None, train_on: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(ids, mask, per-document lengths) of [BOS] + prompt + completion + [EOS].

    `flat`/`lengths`: the encoded prompts followed by the encoded completions.
    """
    n = len(lengths) // 2
    split = int(lengths[:n].sum())
    p_len, c_len = lengths[:n], lengths[n:]
    nb, ne = int(bos is not None), int(eos is not None)
    doc_len = p_len + c_len + nb + ne
    off = np.zeros(n + 1, np.int64)
    np.cumsum(doc_len, out=off[1:])
    ids = np.empty(int(off[-1]), flat.dtype)
    mask = np.zeros(int(off[-1]), np.uint8)
    p_at = _scatter(off[:-1] + nb, p_len)
    c_at = _scatter(off[:-1] + nb + p_len, c_len)
    ids[p_at] = flat[:split]
    ids[c_at] = flat[split:]
    mask[c_at] = 1
    if bos is not None:
        ids[off[:-1]] = bos
    if eos is not None:
        ids[off[1:] - 1] = eos
        mask[off[1:] - 1] = 1
    if train_on == "all":
        mask[:] = 1
    return ids, mask, doc_len


def sft_tables(
    paths: list[Path],
    kind: str,
    read: ReadConfig,
    tokenizer: Any,
    skips: SkipCounter,
    schema: pa.Schema,
    template_sha256: str | None = None,
) -> Iterator[tuple[pa.Table, int]]:
    """(table, input bytes) per batch: the tokenized `schema` with a `loss_mask` column.

    Document ids are each record's offset in its file (`Records.offsets`); the caller adds the
    file's index (packtool/read/docids.py). `template_sha256`: the template text the run began
    with (its fingerprint's); a worker that reads other text (the file edited since) stops the
    run rather than render some conversations with each.

    Raises:
        ConfigError: the chat template's text is not the one the run began with.
    """
    from packtool.dataset.tokenized_writer import PIPELINE_DEPTH
    from packtool.prefetch import prefetch

    chat = kind in CHAT_KINDS
    encoder = text_encoder(tokenizer, specials=chat)
    identity = tokenizer.identity
    pool: RenderPool | None = None
    if chat:
        template = chat_template_for(read.sft, tokenizer)
        if template_sha256 is not None and template.sha256 != template_sha256:
            raise ConfigError(
                f"{template.name}: the chat template changed during the run (sha256 "
                f"{template_sha256[:12]}... at its start, {template.sha256[:12]}... now); a "
                "dataset renders every conversation with one template, so the run stops: run "
                "it again once the template is final"
            )
        renderer = Renderer(template, read.sft.train_on)
        processes = render_processes(read.sft.render_processes)
        big = _input_bytes(paths) >= POOL_MIN_BYTES and pool_pays(renderer)
        if processes and (read.sft.render_processes or big):
            pool = RenderPool(renderer, processes)  # forked before the threads below start

    joined = not chat and encoder.prefixes_every_text()

    def prepared() -> Iterator[_Prepared]:
        records = read_records(paths, kind, read, skips)
        if not chat:
            yield from (_prompt_completion(r, in_context=joined) for r in records)
            return
        for batch, r in rendered_in_order(
            records, lambda b: b.values, renderer, pool, convert=False, drop_unsupervised=True
        ):
            yield _chat_prepared(batch, r, skips)

    def encoded() -> Iterator[tuple[_Prepared, tuple[np.ndarray, np.ndarray]]]:
        for p in prefetch(prepared(), depth=PIPELINE_DEPTH):
            yield p, encoder.encode(p.texts)

    stream = prefetch(encoded(), depth=PIPELINE_DEPTH)
    try:
        for p, (flat, lengths) in stream:
            if chat:
                r = p.rendered
                assert r is not None
                mask = masks_for(
                    encoder, p.texts, r.span_counts, r.span_starts, r.span_ends, flat, lengths
                )
                ids, doc_len = flat, lengths
            else:
                if joined:
                    assert p.completions is not None
                    flat, lengths = in_context(encoder, p.completions, flat, lengths)
                ids, mask, doc_len = assemble_prompt_completion(
                    flat, lengths, identity.bos_id, identity.eos_id, read.sft.train_on
                )
            yield _table(p, ids, mask, doc_len, schema, skips), p.nbytes
    finally:
        stream.close()
        if pool is not None:
            pool.close()


def _input_bytes(paths: list[Path]) -> int:
    import contextlib

    total = 0
    for path in paths:
        with contextlib.suppress(OSError):  # the reader names the file
            total += storage.size(path)
    return total


def _table(
    p: _Prepared,
    ids: np.ndarray,
    mask: np.ndarray,
    doc_len: np.ndarray,
    schema: pa.Schema,
    skips: SkipCounter,
) -> pa.Table:
    """The kept documents of a batch as a tokenized table (skips counted here)."""
    off = np.zeros(len(doc_len) + 1, np.int64)
    np.cumsum(doc_len, out=off[1:])
    supervised = target_sums(mask, off)
    keep = (doc_len > 0) & (supervised > 0)
    for i in np.flatnonzero(~keep):
        if doc_len[i] == 0:
            skips.add("empty", p.wheres[i], "no tokens")
        else:
            skips.add(
                "no_supervised_tokens", p.wheres[i], "the mask is all zeros past the first token"
            )
    rows = np.flatnonzero(keep)
    too_big = "a batch holds >= 2**31 tokens; lower ReadConfig.batch_bytes"
    ids, mask, off = kept_documents(ids, mask, off, rows, too_big=too_big)
    return tokenized_table(
        schema,
        doc_ids=np.asarray(p.offsets, dtype=np.int64)[rows],
        sources=[p.sources[i] for i in rows],
        ids=ids,
        offsets=off,
        mask=mask,
        extras={name: strings([values[i] for i in rows]) for name, values in p.extras.items()},
    )
