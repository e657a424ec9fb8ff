"""A tokenizer.json made plain before any engine reads it: its nesting bounded, and the settings
packing never applies removed.

Nesting: `tokenizers` (serde_json) refuses a file nested deeper than 128 levels, but gigatoken's
parser recurses until the stack runs out: a file nested ~100,000 deep killed the whole process
with a segmentation fault (no error to catch). `nesting_depth` measures the depth without parsing
(numpy over the bytes: 12 ms for GPT-2's 3.5 MB file, 20 ms for 6.3 MB), so such a file gets one
line instead.

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

import numpy as np

MAX_DEPTH = 128
"""The deepest nesting any engine is handed: the reference library's (serde_json's) own limit,
so no file `tokenizers` loads is refused (a real tokenizer.json nests 4-10 levels)."""

_NOT_STRUCTURE = bytes(b for b in range(256) if b not in b'"[]{}')


def nesting_depth(data: bytes) -> int:
    """How deeply the JSON in `data` nests its arrays and objects (`[]` is 1, `{"a": [1]}` is 2).

    Without parsing: quotes a backslash escapes are blanked (an odd run of backslashes before a
    quote escapes it), everything but quotes and brackets is dropped, and the brackets outside
    strings are counted up and down. For valid JSON this is exact; for broken JSON it is some
    number, and the library's own load then says what is wrong."""
    raw = np.frombuffer(data, dtype=np.uint8)
    slash = np.flatnonzero(raw == 92)  # backslashes: only inside strings, and rare
    if len(slash):
        first = np.ones(len(slash), dtype=bool)
        first[1:] = slash[1:] != slash[:-1] + 1  # each run of consecutive backslashes
        odd = np.bincount(np.cumsum(first) - 1) % 2 == 1
        after = slash[np.flatnonzero(np.r_[first[1:], True])] + 1  # the byte after each run
        escaped = after[odd & (after < len(raw))]
        escaped = escaped[raw[escaped] == 34]
        if len(escaped):
            blanked = raw.copy()
            blanked[escaped] = 32
            data = blanked.tobytes()
    kept = np.frombuffer(data.translate(None, _NOT_STRUCTURE), dtype=np.uint8)
    in_string = (np.cumsum(kept == 34, dtype=np.int64) & 1).astype(bool)
    step = (
        (kept == 91).view(np.int8)
        + (kept == 123).view(np.int8)
        - (kept == 93).view(np.int8)
        - (kept == 125).view(np.int8)
    )
    step[in_string] = 0
    return int(np.cumsum(step, dtype=np.int64).max(initial=0))


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
