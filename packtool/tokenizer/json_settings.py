"""Settings of a tokenizer.json that packing never applies, removed before any engine reads it.

`tokenizers` applies a file's `truncation` and `padding` blocks to every encode, and its BPE
`dropout` draws merges at random. transformers' `tokenizer(text)` turns the first two off unless
a call asks for them (`set_truncation_and_padding`), so a model's users never see them; packing
with them kept cut every document to the block's `max_length` and filled it with pad ids, and
the reference library, truncating the engine probe too, rejected the fast engines that were
right. Dropout made the ids differ from run to run (a `--resume` mixed two encodings). So all
three are taken out here, once, for every engine and the reference alike, and said in one line.

Records in: the tokenizer.json text. Out: the text to encode with, and a note ("" when the file
had none of them; then the text is the file's, unparsed).
"""

from __future__ import annotations

import json
import re

_CANDIDATE = re.compile(r'"(?:truncation|padding)"\s*:\s*\{|"dropout"\s*:\s*[-0-9.]')
"""Where one of them may be set: a top-level block, or the model's dropout as a number (a
token's text is a JSON string, never followed by `{`; a vocabulary's value is an id, which the
model's `dropout` key cannot be)."""


def without_unapplied(text: str) -> tuple[str, str]:
    """`text` with its truncation, padding and BPE dropout removed, and what was removed."""
    if _CANDIDATE.search(text) is None:
        return text, ""  # the common file: not parsed (Llama 3's is ~9 MB)
    try:
        spec = json.loads(text)
    except json.JSONDecodeError:
        return text, ""  # the library's own load says what is wrong with it
    if not isinstance(spec, dict):
        return text, ""
    removed = []
    truncation = spec.get("truncation")
    if isinstance(truncation, dict):
        removed.append(f"truncation (max_length {truncation.get('max_length')})")
        spec["truncation"] = None
    if isinstance(spec.get("padding"), dict):
        removed.append("padding")
        spec["padding"] = None
    model = spec.get("model")
    if isinstance(model, dict) and model.get("dropout") not in (None, 0, 0.0):
        removed.append(f"BPE dropout {model['dropout']} (ids would differ from run to run)")
        model["dropout"] = None
    if not removed:
        return text, ""
    note = (
        f"tokenizer.json's {' and '.join(removed)} not applied: every document is encoded whole "
        "and the same way each run, as transformers' tokenizer(text) encodes without "
        "truncation or padding"
    )
    return json.dumps(spec, ensure_ascii=False), note
