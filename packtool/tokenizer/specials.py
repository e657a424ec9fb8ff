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
vocabulary has an end-of-text token beside it (docs/tokenize.md, "BOS and EOS").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

CHAT_TURN_ENDS = ("<|eot_id|>", "<|im_end|>", "<end_of_turn>", "<|end|>", "<|eom_id|>")
"""Tokens that end a chat turn rather than a text (instruct models' `eos_token`)."""
END_OF_TEXT = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>", "[EOS]")
"""End-of-text tokens, in the order one is chosen over a chat-turn end."""


@dataclass(frozen=True)
class Added:
    """The special tokens a post-processor puts around a single text."""

    first: tuple[str, int] | None
    """(token, id) before the text, or None."""
    last: tuple[str, int] | None
    """(token, id) after the text, or None."""
    kind: str
    """The post-processor's type (`TemplateProcessing`, ...), or "" when there is none."""


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
            if found.first or found.last:
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
        return Added(_special(before[:1], ids), _special(after[-1:], ids), kind)
    return NOTHING


def _pair(value: Any) -> tuple[str, int] | None:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
        return str(value[0]), value[1]
    return None


def _special(names: list[str], ids: dict[str, Any]) -> tuple[str, int] | None:
    if not names:
        return None
    entry = ids.get(names[0]) or {}
    token_ids = entry.get("ids") if isinstance(entry, dict) else None
    if not token_ids or len(token_ids) != 1:
        return None  # a multi-token special: not one BOS id
    return names[0], int(token_ids[0])
