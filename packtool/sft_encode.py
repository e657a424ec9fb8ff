"""Fine-tuning records -> tables of the tokenized schema with a `loss_mask` column.

- Conversations are rendered with the chat template (packtool/chat_template.py) and encoded as
  transformers' `apply_chat_template(..., tokenize=True)` encodes them (no BOS/EOS added: the
  template writes its own). Where the loss goes (`--train-on`):
  `assistant` (default): the assistant turns, from the template's `{% generation %}` blocks
  when it has them, else turn by turn (packtool/chat_turns.py); `last`: the last of those;
  `all`: every token.
- Prompt/completion records are encoded piece by piece, as a model sees them when it generates:
  [BOS] + prompt + completion + [EOS] (BOS/EOS as the tokenizer options say), the loss on the
  completion and the EOS (`--train-on all`: on every token). Encoding the prompt alone keeps its
  last token what it is at inference time, whatever the completion starts with.

Skipped and counted (an error with `--strict`): a template error (`template_error`, with its
message), a turn the template hides (`template_not_incremental`), a conversation without an
assistant turn or whose mask is all zeros (`no_supervised_tokens`), a document of no tokens
(`empty`). Three stages run a batch apart: read + render (Python) | encode (the tokenizer's
threads) | masks + the table.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.chat_template import (
    ChatTemplate,
    TemplateFailure,
    load_chat_template,
    normalize_messages,
)
from packtool.chat_tokens import TextEncoder, masks_for
from packtool.chat_turns import NotIncremental, check_turn_template, turn_spans
from packtool.columns import LOSS_MASK, get
from packtool.corpus import ReadConfig, SkipCounter
from packtool.errors import ConfigError
from packtool.masks import segment_sums
from packtool.sft_config import CHAT_KINDS, SFTConfig
from packtool.sft_inputs import Records, read_records


def chat_template_for(sft: SFTConfig, tokenizer: Any) -> ChatTemplate:
    """The template `sft` names, or the tokenizer's own; checked for `sft.train_on`.

    Raises:
        ConfigError: no template, a bad one, or one whose turns cannot be found.
    """
    identity = tokenizer.identity
    folder = Path(identity.name).parent if identity.kind == "hf" else None
    fallback = {}
    if identity.kind == "hf":  # the ids' strings, when no tokenizer_config.json names them
        encoder = text_encoder(tokenizer, specials=True)
        for name, i in (("bos_token", identity.bos_id), ("eos_token", identity.eos_id)):
            token = encoder.token_text(i) if i is not None else None
            if token is not None:
                fallback[name] = token
    template = load_chat_template(sft.chat_template, tokenizer_dir=folder)
    template.special_tokens = {**fallback, **template.special_tokens}
    if not template.has_generation and sft.train_on != "all":
        why = check_turn_template(template)
        if why is not None:
            raise ConfigError(
                f"{template.name}: assistant turns cannot be found in this template ({why}); "
                "use a template with {% generation %} blocks, or --train-on all"
            )
    return template


@dataclass
class _Prepared:
    """One batch after stage 1: what to encode, and how to mask it."""

    texts: list[str]
    spans: list[list[tuple[int, int]]] = field(default_factory=list)
    """Chat: per conversation, the character spans that are supervised."""
    wheres: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    extras: dict[str, list[str | None]] = field(default_factory=dict)
    nbytes: int = 0


class ChatPreparer:
    """Renders conversations and finds their supervised spans (stage 1)."""

    def __init__(self, template: ChatTemplate, train_on: str, skips: SkipCounter) -> None:
        self.template = template
        self.train_on = train_on
        self.skips = skips

    def spans(self, messages: list[dict[str, Any]]) -> tuple[str, list[tuple[int, int]]]:
        """(text, spans) of one normalised conversation; raises what `__call__` counts."""
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
            return r.text, spans[-1:] if self.train_on == "last" else spans
        return turn_spans(t, messages, turns[-1:] if self.train_on == "last" else turns)

    def __call__(self, records: Records) -> _Prepared:
        out = _Prepared(texts=[], extras={k: [] for k in records.extras}, nbytes=records.nbytes)
        for i, (where, value) in enumerate(zip(records.wheres, records.values, strict=True)):
            try:
                text, spans = self.spans(normalize_messages(value))
            except TemplateFailure as exc:
                self.skips.add("template_error", where, str(exc))
                continue
            except NotIncremental as exc:
                self.skips.add("template_not_incremental", where, str(exc))
                continue
            if not spans:
                self.skips.add("no_supervised_tokens", where, "no assistant turn")
                continue
            out.texts.append(text)
            out.spans.append(spans)
            out.wheres.append(where)
            out.sources.append(records.sources[i])
            for k, v in records.extras.items():
                out.extras[k].append(v[i])
        return out


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
) -> list[EncodedChat]:
    """Encode conversations (messages or ShareGPT lists) as `packtool pack` does, in memory.

    The library form of what the readers do to each record: for each conversation its token ids
    and loss mask (equal to transformers' `apply_chat_template(..., tokenize=True,
    return_assistant_tokens_mask=True)` for templates with `{% generation %}` blocks), or the
    reason it would be skipped.

    Args:
        conversations: each a list of message objects.
        template: the chat template (`chat_template.load_chat_template`).
        tokenizer: a `packtool.tokenizers.Tokenizer`.
        train_on: `assistant`, `last` or `all`.
    """
    from concurrent.futures import ThreadPoolExecutor

    prep = ChatPreparer(template, train_on, SkipCounter())
    encoder = text_encoder(tokenizer, specials=True)
    out: list[EncodedChat] = []
    # Render a chunk while the tokenizer (GIL released) encodes the one before.
    with ThreadPoolExecutor(1, thread_name_prefix="packtool-encode") as pool:
        jobs = []
        for at in range(0, len(conversations), _CHUNK):
            results, texts, spans = _render_chunk(prep, conversations[at : at + _CHUNK])
            jobs.append((pool.submit(encoder.encode, texts), results, texts, spans))
        for job, results, texts, spans in jobs:
            flat, lengths = job.result()
            out += _encoded(encoder, results, texts, spans, flat, lengths)
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


def _render_chunk(
    prep: ChatPreparer, conversations: Sequence[Any]
) -> tuple[list[EncodedChat | None], list[str], list[list[tuple[int, int]]]]:
    from packtool.sft_inputs import BadRecord, to_messages

    results: list[EncodedChat | None] = []
    texts, spans = [], []
    for conversation in conversations:
        try:
            text, doc_spans = prep.spans(normalize_messages(to_messages(conversation)))
        except BadRecord as bad:
            results.append(EncodedChat(skip=bad.reason, detail=bad.detail))
            continue
        except TemplateFailure as exc:
            results.append(EncodedChat(skip="template_error", detail=str(exc)))
            continue
        except NotIncremental as exc:
            results.append(EncodedChat(skip="template_not_incremental", detail=str(exc)))
            continue
        results.append(None)
        texts.append(text)
        spans.append(doc_spans)
    return results, texts, spans


def _encoded(
    encoder: TextEncoder,
    results: list[EncodedChat | None],
    texts: list[str],
    spans: list[list[tuple[int, int]]],
    flat: np.ndarray,
    lengths: np.ndarray,
) -> list[EncodedChat]:
    mask = masks_for(encoder, texts, spans, flat, lengths)
    off = np.concatenate([[0], np.cumsum(lengths)])
    out, j = [], 0
    for r in results:
        if r is not None:
            out.append(r)
            continue
        ids, m = flat[off[j] : off[j + 1]], mask[off[j] : off[j + 1]]
        if not len(ids):
            out.append(EncodedChat(text=texts[j], skip="empty", detail="no tokens"))
        elif not spans[j] or not m.any():
            out.append(EncodedChat(ids=ids, mask=m, text=texts[j], skip="no_supervised_tokens"))
        else:
            out.append(EncodedChat(ids=ids, mask=m, text=texts[j]))
        j += 1
    return out


def _prompt_completion(records: Records) -> _Prepared:
    """Stage 1 of prompt/completion: the prompts, then the completions, as one list to encode."""
    prompts = [p for p, _ in records.values]
    completions = [c for _, c in records.values]
    return _Prepared(
        texts=prompts + completions,
        wheres=list(records.wheres),
        sources=list(records.sources),
        extras=records.extras,
        nbytes=records.nbytes,
    )


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
) -> Iterator[tuple[pa.Table, int]]:
    """(table, input bytes) per batch: the tokenized `schema` with a `loss_mask` column.

    Document ids run 0, 1, 2, ... over the documents kept, in reading order.
    """
    from packtool.prefetch import prefetch
    from packtool.tokenized_writer import PIPELINE_DEPTH

    chat = kind in CHAT_KINDS
    prepare: Any
    if chat:
        prepare = ChatPreparer(chat_template_for(read.sft, tokenizer), read.sft.train_on, skips)
    else:
        prepare = _prompt_completion
    encoder = text_encoder(tokenizer, specials=chat)
    identity = tokenizer.identity

    def prepared() -> Iterator[_Prepared]:
        for records in read_records(paths, kind, read, skips):
            yield prepare(records)

    def encoded() -> Iterator[tuple[_Prepared, tuple[np.ndarray, np.ndarray]]]:
        for p in prefetch(prepared(), depth=PIPELINE_DEPTH):
            yield p, encoder.encode(p.texts)

    next_id = 0
    for p, (flat, lengths) in prefetch(encoded(), depth=PIPELINE_DEPTH):
        if chat:
            mask = masks_for(encoder, p.texts, p.spans, flat, lengths)
            ids, doc_len = flat, lengths
        else:
            ids, mask, doc_len = assemble_prompt_completion(
                flat, lengths, identity.bos_id, identity.eos_id, read.sft.train_on
            )
        table = _table(p, ids, mask, doc_len, next_id, schema, skips)
        next_id += table.num_rows
        yield table, p.nbytes


def _table(
    p: _Prepared,
    ids: np.ndarray,
    mask: np.ndarray,
    doc_len: np.ndarray,
    first_id: int,
    schema: pa.Schema,
    skips: SkipCounter,
) -> pa.Table:
    """The kept documents of a batch as a tokenized table (skips counted here)."""
    off = np.zeros(len(doc_len) + 1, np.int64)
    np.cumsum(doc_len, out=off[1:])
    supervised = segment_sums(mask, off)
    keep = (doc_len > 0) & (supervised > 0)
    for i in np.flatnonzero(~keep):
        if doc_len[i] == 0:
            skips.add("empty", p.wheres[i], "no tokens")
        else:
            skips.add("no_supervised_tokens", p.wheres[i], "the mask is all zeros")
    rows = np.flatnonzero(keep)
    if len(rows) < len(doc_len):
        take = _scatter(off[rows], doc_len[rows])  # the kept documents' token positions
        ids, mask = ids[take], mask[take]
        doc_len = doc_len[rows]
        off = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(doc_len, out=off[1:])
    if off[-1] >= 2**31:
        raise ConfigError("a batch holds >= 2**31 tokens; lower ReadConfig.batch_bytes")
    token_type = schema.field("input_ids").type.value_type
    off32 = pa.array(off.astype(np.int32))
    columns: dict[str, Any] = {
        "doc_id": pa.array(np.arange(first_id, first_id + len(rows), dtype=np.int64)),
        "source": pa.array([p.sources[i] for i in rows], pa.string()),
        "input_ids": pa.ListArray.from_arrays(off32, pa.array(ids, token_type)),
        "length": pa.array(doc_len.astype(np.int32)),
        LOSS_MASK: get(LOSS_MASK).array(off, mask),
    }
    for name, values in p.extras.items():
        columns[name] = pa.array([values[i] for i in rows], pa.string())
    return pa.Table.from_pydict(columns, schema=schema)
