"""Test helpers for chat inputs: real templates from TRL, a BPE tokenizer trained at test time.

The templates are read from the installed `trl` package (`trl/chat_templates/*.jinja`, real
model families' templates, with and without `{% generation %}` blocks); nothing of them is
copied into this repository. The tokenizer is a small byte-level BPE trained on sample_data
with every special token the templates write, so their control tokens encode as single ids, as
in the real tokenizers.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from packtool.sft.template import GENERATION_RE

ROOT = Path(__file__).resolve().parents[2]
SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
_TOKEN_RE = re.compile(
    r"<\|[^\s<>|]{1,40}\|>|<[a-z_]{2,30}>|<｜[^\s<>]{1,40}｜>|\[/?[A-Z_]{2,20}\]"
)


def template_dir() -> Path | None:
    try:
        import trl
    except ImportError:
        return None
    folder = Path(trl.__file__).parent / "chat_templates"
    return folder if folder.is_dir() else None


def templates(generation: bool | None = None) -> list[Path]:
    """TRL's templates (with `{% generation %}` blocks, without, or all)."""
    folder = template_dir()
    if folder is None:
        return []
    out = []
    for path in sorted(folder.glob("*.jinja")):
        has = GENERATION_RE.search(path.read_text(encoding="utf-8")) is not None
        if generation is None or has == generation:
            out.append(path)
    return out


def needs_trl():
    return pytest.mark.skipif(template_dir() is None, reason="trl (dev extra) is not installed")


@cache
def special_tokens() -> tuple[str, ...]:
    found = set(SPECIALS.values())
    for path in templates():
        found.update(_TOKEN_RE.findall(path.read_text(encoding="utf-8")))
    return tuple(sorted(found))


@cache
def trained_tokenizer_dir(root: str, kind: str = "bytelevel") -> Path:
    """A folder with tokenizer.json (a BPE with the specials) and tokenizer_config.json.

    `kind`: `bytelevel` (GPT-2 / Llama 3 / Qwen style), `trim` (the same with a post-processor
    that trims offsets, as GPT-2's does), or `metaspace` (SentencePiece style, Llama 2 / Mistral /
    Gemma: no byte alphabet, offsets from the tokenizer).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    folder = Path(root) / f"tok-{kind}"
    folder.mkdir(parents=True, exist_ok=True)
    if kind == "metaspace":
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        alphabet: list[str] = []
    else:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    if kind == "trim":
        tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=2000,
        special_tokens=list(special_tokens()),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    lines = (ROOT / "sample_data" / "corpus.jsonl").read_text("utf-8").splitlines()[:400]
    texts = [json.loads(line)["text"] for line in lines]
    texts.append("".join(sorted(set("hello world é 日本語 🙂 x Ünï\t."))))  # every test character
    tok.train_from_iterator(texts, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(SPECIALS), encoding="utf-8")
    return folder


def hf_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **SPECIALS)
