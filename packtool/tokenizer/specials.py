"""The tokenizer's own special-token rule: what it puts around a text by itself.

transformers' `tokenizer(text)` adds what the tokenizer.json post-processor says: a
`TemplateProcessing` whose single-text template starts with a special token (Llama 2, Mistral:
`<s> $A`; Llama 3: `<|begin_of_text|> $A` inside a `Sequence`), `BertProcessing` (`[CLS] $A
[SEP]`) or `RobertaProcessing` (`<s> $A </s>`). packtool's default BOS is that first token, so
a Llama- or Mistral-style tokenizer puts its BOS before every document as transformers would.
transformers 5 follows the post-processor alone; `add_bos_token` / `add_eos_token` in
tokenizer_config.json (which older releases used to rebuild it for Llama classes) are reported
when they disagree, not obeyed.

The appended EOS is a document boundary for packing: the end-of-text token, also where
tokenizer_config.json's `eos_token` ends a chat turn (`<|eot_id|>`, `<|im_end|>`) and the
vocabulary has an end-of-text token beside it (docs/tokenize.md, "BOS and EOS"). A Megatron
dataset's end of document is `eos_token` as it is (`EOS_TOKEN`; docs/integrations.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np

from packtool.errors import ConfigError, option_choice
from packtool.tokenizer.engines import Source
from packtool.tokenizer.files import TokenizerConfig, TokenizerFiles

CHAT_TURN_ENDS = (
    "<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|eom_id|>", "<|eot|>", "<|return|>",
    "<|END_OF_TURN_TOKEN|>",
)  # fmt: skip
"""Tokens that end a chat turn rather than a text (instruct models' `eos_token`: Llama 3 and 4,
Qwen, Gemma, Phi-3, gpt-oss, Command-R)."""
END_OF_TEXT = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[EOS]")
"""End-of-text tokens, in the order one is chosen over a chat-turn end."""
# Names tried, in order, when a tokenizer's default EOS / BOS is asked for.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]", "<|eot_id|>", "[SEP]")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]", "[CLS]")

EOS_TOKEN = "eos_token"
"""`eos` of `load_tokenizer`: tokenizer_config.json's `eos_token` as it is, a chat-turn end
included (Megatron's `HuggingFaceTokenizer.eod`); without one, as "default"."""

SP_BOS, SP_EOS = "\x00sentencepiece:bos", "\x00sentencepiece:eos"
"""Keys (no real token text) under which a SentencePiece model's own BOS and EOS ids are kept."""


@dataclass(frozen=True)
class Added:
    """The special tokens a post-processor puts around a single text."""

    first: tuple[str, int] | None
    """(token, id) before the text, or None."""
    last: tuple[str, int] | None
    """(token, id) after the text, or None."""
    kind: str
    """The post-processor's type (`TemplateProcessing`, ...), or "" when there is none."""
    unlike: str = ""
    """What it puts before a text that one BOS id cannot be (several special tokens, or one
    of several ids), in words; "" when `first` is all of it."""
    before: tuple[tuple[str, int], ...] = ()
    """With `unlike`: every (token, id) it puts before a text, in order (each id of a special
    token of several), so the refusal can say what each one-id choice gives."""


NOTHING = Added(None, None, "")


def added_by_post_processor(tokenizer_json: str | None) -> Added:
    """What the tokenizer.json post-processor adds to one text (`NOTHING` for none, or for a
    file that is not JSON: the engines report that)."""
    try:
        processor = json.loads(tokenizer_json or "null") or {}
        processor = processor.get("post_processor") if isinstance(processor, dict) else None
    except ValueError:
        return NOTHING
    return _added(processor) if isinstance(processor, dict) else NOTHING


def _added(processor: dict[str, Any]) -> Added:
    kind = processor.get("type", "")
    if kind == "Sequence":
        for inner in processor.get("processors") or []:
            found = _added(inner) if isinstance(inner, dict) else NOTHING
            if found.first or found.last or found.unlike:
                return found
        return NOTHING
    if kind in ("BertProcessing", "RobertaProcessing"):
        return Added(_pair(processor.get("cls")), _pair(processor.get("sep")), kind)
    if kind == "TemplateProcessing":
        single = processor.get("single") or []
        ids = processor.get("special_tokens") or {}
        at = next((i for i, p in enumerate(single) if "Sequence" in p), None)
        if at is None:
            return NOTHING
        before = [p["SpecialToken"]["id"] for p in single[:at] if "SpecialToken" in p]
        after = [p["SpecialToken"]["id"] for p in single[at + 1 :] if "SpecialToken" in p]
        first = _special(before[:1], ids)
        unlike = ""
        if len(before) > 1:
            named = ", ".join(f"{name} {_ids_of(name, ids)}" for name in before)
            unlike = f"{len(before)} special tokens ({named})"
        elif before and first is None:
            unlike = f"special token {before[0]} as the ids {_ids_of(before[0], ids)}"
        each = tuple((name, i) for name in before for i in _id_list(name, ids)) if unlike else ()
        return Added(first, _special(after[-1:], ids), kind, unlike, each)
    return NOTHING


def _pair(value: Any) -> tuple[str, int] | None:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
        return str(value[0]), value[1]
    return None


def _ids_of(name: str, ids: dict[str, Any]) -> str:
    """A TemplateProcessing special token's ids, as the file gives them (`[0]`, `[1, 5]`)."""
    entry = ids.get(name)
    return str(entry.get("ids") if isinstance(entry, dict) else None).replace(" ", "")


def _id_list(name: str, ids: dict[str, Any]) -> list[int]:
    entry = ids.get(name)
    found = entry.get("ids") if isinstance(entry, dict) else None
    return [i for i in found if isinstance(i, int)] if isinstance(found, list) else []


def special_choice(which: str, value: int | str | None) -> str:
    """An EOS / BOS choice as both callers make it, for a message either may reach (the
    library's functions raise it to Python callers and to the CLI alike): `--bos-id 3 /
    bos=3`, `--no-bos / bos=None`, `--eos-id default / eos='default'`, `--eos-id N / eos=N`
    (`errors.option_choice`)."""
    if value is None:
        return f"--no-{which} / {which}=None"
    return option_choice(f"--{which}-id", which, value)


def prefix_refusal(where: str, added: Added) -> str:
    """Why the default BOS is refused where the post-processor puts more than one id before a
    text, and what each choice gives instead (`own_bos`; docs/tokenize.md, "BOS and EOS")."""
    choices = []
    names = [token for token, _ in dict.fromkeys(added.before)]
    for token, token_id in dict.fromkeys(added.before):
        what = token if names.count(token) == 1 else f"{token_id} (one of {token}'s ids)"
        choices.append(f"--bos-id {token_id} puts {what} alone before each document")
    ids = ", ".join(str(i) for _, i in added.before) or "its ids"
    return (
        f"{where}: its post-processor ({added.kind}) puts {added.unlike} before a text, so "
        f"transformers' tokenizer(text) starts with [{ids}]; a packtool dataset records one BOS "
        "id, and no choice gives that prefix: "
        + "; ".join([*choices, "--no-bos puts none"])
        + " (in Python: bos=ID or bos=None, to load_tokenizer or to any function given the "
        "tokenizer by name)"
    )


def _special(names: list[str], ids: dict[str, Any]) -> tuple[str, int] | None:
    if not names:
        return None
    entry = ids.get(names[0]) or {}
    token_ids = entry.get("ids") if isinstance(entry, dict) else None
    if not token_ids or len(token_ids) != 1:
        return None  # a multi-token special: not one BOS id
    return names[0], int(token_ids[0])


# --- the defaults `load_tokenizer` takes ----------------------------------------------------


def own_bos(source: Source, files: TokenizerFiles, vocab: dict[str, int]) -> tuple[int | None, str]:
    """`bos="auto"`: what the tokenizer itself puts before a text, and where that was read."""
    if source.kind == "sentencepiece":
        return sentencepiece_bos(files, vocab)
    if source.kind != "hf":
        return None, ""  # tiktoken encodings add nothing
    added = added_by_post_processor(source.json)
    flag = None if files.config is None else files.config.data.get("add_bos_token")
    if added.unlike:
        # transformers' tokenizer(text) starts with all of them; a dataset records one BOS id
        raise ConfigError(prefix_refusal(source.where, added))
    if added.first is not None:
        token, token_id = added.first
        note = (
            "; tokenizer_config.json's add_bos_token false is not obeyed, as transformers does"
            if flag is False
            else ""
        )
        return token_id, f"{token} (tokenizer.json post-processor {added.kind}{note})"
    if flag is True:
        return None, "(the post-processor adds none; add_bos_token true is not obeyed)"
    return None, "(the tokenizer adds none)"


def sentencepiece_bos(files: TokenizerFiles, vocab: dict[str, int]) -> tuple[int | None, str]:
    """A SentencePiece model's own rule: its BOS piece before every text, as Llama's and
    Mistral's reference code and transformers 4's slow tokenizers (add_bos_token true by default)
    put it; tokenizer_config.json's add_bos_token false, when present, turns it off."""
    bos = vocab.get(SP_BOS)
    flag = None if files.config is None else files.config.data.get("add_bos_token")
    if bos is None:
        return None, "(the model has no BOS piece)"
    if flag is False:
        return None, "(tokenizer_config.json: add_bos_token false)"
    return bos, f"{piece_of(vocab, bos)} (the SentencePiece model's BOS)"


def marked_special(tokenizer_json: str | None) -> frozenset[str]:
    """The added tokens tokenizer.json marks `special` (nothing for a file that is not JSON)."""
    try:
        added = (json.loads(tokenizer_json or "null") or {}).get("added_tokens") or []
    except (ValueError, AttributeError):
        return frozenset()
    return frozenset(
        t["content"] for t in added if isinstance(t, dict) and t.get("special") and "content" in t
    )


def piece_of(vocab: dict[str, int], token_id: int) -> str:
    return next((k for k, v in vocab.items() if v == token_id and k[:1] != "\x00"), str(token_id))


def default_id(
    which: str,
    value: int | str | None,
    vocab: dict[str, int],
    files: TokenizerFiles,
    spec: str,
    special: Callable[[], Collection[str]] = frozenset,
) -> tuple[int | None, str]:
    """The id to use and, for a default, the token text and where it came from. `special` gives
    the tokens the tokenizer marks special: where several names of the list are in the vocabulary,
    the first of those marked special wins (a `</s>` special token over an `<|endoftext|>` that is
    only a word of the vocabulary). `value` "eos_token" (EOS only) is "default" without the
    chat-turn exception: tokenizer_config.json's `eos_token` as it is, the id Megatron's
    HuggingFace tokenizer appends as its end of document (`--to megatron`)."""
    if value not in ("default", EOS_TOKEN):
        return value, ""  # type: ignore[return-value]
    config: TokenizerConfig | None = files.config
    token = None if config is None else config.token(f"{which}_token")
    if token is not None:
        assert config is not None
        origin = config.file_of(f"{which}_token")
        if token not in vocab:
            raise ConfigError(
                f"{config.path}: {which}_token {token!r} is not in the tokenizer's vocabulary "
                f"({files.name}); pass {special_choice(which, 'N')}"
                + (f" or {special_choice(which, None)}" if which == "eos" else "")
            )
        if which == "eos" and value == EOS_TOKEN:
            return vocab[token], f"{token} ({origin}'s eos_token, Megatron's EOD)"
        if which == "eos" and token in CHAT_TURN_ENDS:
            # An instruct model's eos_token ends a turn; a packed document ends with the text's end.
            # Where the file marks special tokens, only a special one (a `</s>` that is a plain
            # word of the vocabulary is text, not the end of one).
            ends = [name for name in END_OF_TEXT if name in vocab]
            marked = special() if ends else frozenset()
            ends = [name for name in ends if name in marked] if marked else ends
            if ends:
                why = f"end of text; {origin}'s eos_token {token} ends a chat turn"
                return vocab[ends[0]], f"{ends[0]} ({why})"
        return vocab[token], f"{token} ({origin})"
    own = SP_EOS if which == "eos" else SP_BOS
    if own in vocab:  # a SentencePiece model names its own BOS and EOS
        piece = piece_of(vocab, vocab[own])
        return vocab[own], f"{piece} (the SentencePiece model's {which.upper()})"
    names = EOS_NAMES if which == "eos" else BOS_NAMES
    found = [name for name in names if name in vocab]
    if len(found) > 1:
        marked = special()
        found = [name for name in found if name in marked] or found
    if found:
        return vocab[found[0]], found[0]
    flag = special_choice(which, "N")
    flag += f" or {special_choice(which, None)}" if which == "eos" else ""
    raise ConfigError(
        f"tokenizer {spec!r} has no default {which.upper()} token (looked for "
        f"{', '.join(names)}); pass {flag}"
    )


def own_ids(
    source: Source,
    files: TokenizerFiles,
    vocab: dict[str, int],
    spec: str,
    special: Callable[[], Collection[str]] = frozenset,
) -> dict[str, int | None]:
    """The EOS and BOS ids the tokenizer's own files give (`eos="default"`, `bos="auto"`),
    whatever `--eos-id`, `--bos-id`, `--no-eos`, `--no-bos` say: the `eos_token` / `bos_token`
    a chat template sees where no tokenizer_config.json names them (packtool/sft/encode.py).
    An EOS that could not be found, or a BOS that is no one id, is None here (the options made
    them unnecessary)."""
    try:
        eos = default_id("eos", "default", vocab, files, spec, special)[0]
    except ConfigError:
        eos = None
    try:
        bos = own_bos(source, files, vocab)[0]
    except ConfigError:  # several tokens before a text: no one BOS (the options chose one)
        bos = None
    return {"eos": eos, "bos": bos}


def add_specials(
    flat: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    """Flat ids of documents (`lengths`) with `bos` before and `eos` after each, as `dtype`."""
    n_special = (bos is not None) + (eos is not None)
    if n_special == 0:
        return flat.astype(dtype, copy=False), lengths
    out_lengths = lengths + n_special
    ends = np.cumsum(out_lengths)  # exclusive end of each document in the output
    starts = ends - out_lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    if bos is not None:
        out[starts] = bos
    if eos is not None:
        out[ends - 1] = eos
    # A boolean mask assignment: ~1 ns per token, ~8x faster than scattering through indices
    # (and than one slice copy per document unless documents average over ~1,000 tokens). The
    # cast to the id dtype comes first: a masked assignment that also casts (uint32 ids into
    # uint16) measured ~8 ns per token, 0.3 s of CPU for 38 M tokens.
    plain = np.ones(len(out), dtype=bool)
    if bos is not None:
        plain[starts] = False
    if eos is not None:
        plain[ends - 1] = False
    out[plain] = flat.astype(dtype, copy=False)
    return out, out_lengths


def chosen_specials(eos: Any, bos: Any) -> tuple[str, ...]:
    """The specials `load_tokenizer` was given other than by default (`eos` not "default",
    `bos` not "auto"): `Tokenizer.chosen_specials`."""
    return tuple(w for w, v, unset in (("eos", eos, "default"), ("bos", bos, "auto")) if v != unset)


def given_ids(eos: Any, bos: Any) -> dict[str, int | str]:
    """The EOS / BOS ids `load_tokenizer` was told to add, by `eos` / `bos`: an id, or `bos`
    "default" (the BOS token always); not a default rule, nor None (none added).
    `Tokenizer.given_ids`: pre-tokenized ids refuse them (`recorded.check_none_given`)."""
    chosen = {"eos": None if isinstance(eos, str) else eos, "bos": None if bos == "auto" else bos}
    return {w: v if isinstance(v, str) else int(v) for w, v in chosen.items() if v is not None}
