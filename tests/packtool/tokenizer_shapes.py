"""Tokenizers of the shapes modern models use, trained at test time (nothing downloaded).

`build(shape, folder)` trains a small byte-level BPE with the `tokenizers` trainer on the Python
standard library's sources and writes `folder/tokenizer.json`. `stdlib_sample()` is the real
text the id tests run on.
"""

from __future__ import annotations

import base64
import fnmatch
import functools
import os
import sysconfig
from pathlib import Path

# Llama-3's and Qwen2's pre-tokenizer split patterns (public in their tokenizer.json files).
LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SPECIALS = {
    "gpt2": ["<|endoftext|>"],
    "llama3": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"],
    "qwen": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "lowercase": ["<|endoftext|>"],
    "metaspace": ["</s>", "<s>"],
    "bert": ["[SEP]", "[CLS]"],
}
FAST_SHAPES = ("gpt2", "llama3", "qwen", "lowercase")
"""Shapes fastokens and gigatoken load (GPT-2 ByteLevel; Llama-3 / Qwen Split +
ByteLevel(use_regex=False), Qwen with an NFC normalizer; a Lowercase normalizer). gigatoken's ids
differ where an added token is `single_word` (its probe fails: `build(..., single_word=True)`,
the default, so fastokens encodes); without one they are `tokenizers`' ids."""
GIGATOKEN_SHAPES = ("gpt2", "llama3")
"""FAST_SHAPES gigatoken encodes exactly (it refuses a Lowercase normalizer, and its NFC, on
newer Unicode than `tokenizers`' tables, fails the probe for Qwen's NFC normalizer)."""
REFUSED_SHAPES = ("metaspace", "bert")
"""Shapes fastokens refuses at load (a SentencePiece-style Metaspace pre-tokenizer; a
BertNormalizer), so packtool falls back to `tokenizers`."""


@functools.cache
def _stdlib_files() -> tuple[Path, ...]:
    """The standard library's `.py` files outside site-packages, sorted: what
    `sorted(p for p in std.rglob("*.py") if "site-packages" not in p.parts)` lists, found once
    per process, without walking site-packages (here 8,400 of its 8,700 folders: the rglob
    took ~0.6-3.6 s of CPU, and each `every` of `stdlib_sample` ran its own)."""
    std = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for root, dirs, names in os.walk(std):  # as rglob in 3.11: symlinked folders not entered
        dirs[:] = [d for d in dirs if d != "site-packages"]
        found += [Path(root, n) for n in dirs + names if fnmatch.fnmatchcase(n, "*.py")]
    return tuple(sorted(p for p in found if "site-packages" not in p.parts))


@functools.cache
def stdlib_sample(every: int = 50, max_chars: int = 40_000) -> tuple[str, ...]:
    """Every `every`-th `.py` file of the standard library (sorted), each cut to `max_chars`."""
    out = []
    for p in _stdlib_files()[::every]:
        try:
            text = p.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if text:
            out.append(text[:max_chars])
    return tuple(out)


def build(shape: str, folder: Path, vocab_size: int = 1200, single_word: bool = True) -> Path:
    """Train a tokenizer of `shape` and save it as `folder/tokenizer.json` (with a
    `single_word` added token `<word>`, or that token without the flag)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers import pre_tokenizers as pre

    tok = Tokenizer(models.BPE(ignore_merges=shape == "llama3"))
    byte_level = pre.ByteLevel(add_prefix_space=False, use_regex=False)
    if shape in ("gpt2", "lowercase"):
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    elif shape in ("llama3", "qwen"):
        pattern = LLAMA3 if shape == "llama3" else QWEN
        tok.pre_tokenizer = pre.Sequence([pre.Split(Regex(pattern), "isolated"), byte_level])
    elif shape == "metaspace":
        tok.pre_tokenizer = pre.Metaspace()
    elif shape == "bert":
        tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
        tok.normalizer = normalizers.BertNormalizer()
    if shape == "qwen":
        tok.normalizer = normalizers.NFC()
    if shape == "lowercase":
        tok.normalizer = normalizers.Lowercase()
    if shape != "metaspace":
        tok.decoder = decoders.ByteLevel()
    alphabet = pre.ByteLevel.alphabet() if shape != "metaspace" else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS[shape],
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(stdlib_sample(every=97), trainer=trainer)
    # Added tokens with the flags real tokenizers use: a non-special one, one that strips the
    # whitespace on its left, a single-word one.
    tok.add_tokens([AddedToken("def ", normalized=False)])
    tok.add_special_tokens(
        [AddedToken("<sep>", lstrip=True), AddedToken("<word>", single_word=single_word)]
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tokenizer.json"
    tok.save(str(path))
    return path


def byte_level_ranks(tokenizer_json: Path, out: Path) -> Path:
    """A tiktoken ranks file from a byte-level BPE tokenizer.json (ranks = merge order)."""
    import json

    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    added = {t["content"] for t in data["added_tokens"]}
    byte_of = _unicode_to_bytes()
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for token, _ in sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1]):
        if token in added:  # special tokens are not merges (tiktoken keeps them apart)
            continue
        raw = bytes(byte_of[c] for c in token)
        if raw not in ranks:
            ranks[raw] = len(ranks)
    out.write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()),
        encoding="utf-8",
    )
    return out


def _unicode_to_bytes() -> dict[str, int]:
    """GPT-2's byte <-> printable character table, inverted."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def mistral_model(version: str = "v1") -> Path:
    """A real SentencePiece BPE model: Mistral's, as the mistral-common package ships it
    (`tokenizer.model.v1`, `mistral_instruct_tokenizer_*.model.v3` / `.v7`), read in place."""
    import mistral_common

    data = Path(mistral_common.__file__).parent / "data"
    name = "tokenizer.model.v1" if version == "v1" else None
    if name is None:
        name = next(p.name for p in sorted(data.glob(f"*.model.{version}")))
    return data / name


SENTENCEPIECE_FORMS = ("normalizer", "metaspace")
"""The two tokenizer.json forms of a SentencePiece BPE: hub files of Llama 2 / Mistral v0.1
(`Prepend("▁")` + `Replace(" ", "▁")` normalizers, no pre-tokenizer) and newer conversions
(`Metaspace(prepend_scheme="first", split=False)` pre-tokenizer, no normalizer)."""


def sentencepiece_json(model: Path, form: str, out: Path) -> Path:
    """`model` as a tokenizer.json of `form`, with the BOS post-processor the hub files have.

    The vocabulary and merges come from gigatoken's converter; whether the file is faithful is
    for its callers to check (its ids against sentencepiece's, through `tokenizers`)."""
    import json

    from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

    spec = json.loads(sentencepiece_to_tokenizer_json(model.read_bytes()))
    bos = {"SpecialToken": {"id": "<s>", "type_id": 0}}
    spec["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}},
    }  # fmt: skip
    spec["decoder"] = {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
    if form == "metaspace":
        spec["normalizer"] = None
        spec["pre_tokenizer"] = {
            "type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False,
        }  # fmt: skip
    elif form != "normalizer":
        raise ValueError(f"unknown form {form!r}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return out
