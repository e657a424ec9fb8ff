"""Which engine encodes a tokenizer: the first that loads it and passes a self-check.

`choose_engine` picks, for one loaded tokenizer, the first engine of `parse_engines` (the
registry order of packtool/tokenizer/engines.py) that

1. is installed and loads the file (engines refuse what they do not implement: fastokens
   refuses e.g. Metaspace / SentencePiece-style pre-tokenizers and BERT normalizers, gigatoken
   Lowercase normalizers and Unigram models), and
2. gives exactly the reference library's ids on `probe_texts` (special characters, long
   whitespace and digit runs, CJK, emoji, and every added token of this tokenizer).

The reference libraries pass by definition, so the choice never changes an id; it only changes
the speed. A recorded verdict (packtool/tokenizer/engine_checks.py) skips the probe.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from packtool.errors import ConfigError, one_line, option_choice
from packtool.tokenizer.engines import (
    Encoder,
    Engine,
    EngineRefused,
    Source,
    parse_engines,
)

_PIECES = (
    "Hello, world! It's a test: don't, won't, I'LL, we've, they'RE.",
    "x = 1234567890123456789; y=3.14159; z = 1,000,000 + 0x1F + 1e-9 + ٣٤٥ + １２３",
    "日本語のテキスト、中文文本。한국어 텍스트 ｶﾀｶﾅ",
    "emoji 🤗🚀👍🏽👨‍👩‍👧‍👦 🇫🇷 ✓ ♥",
    "café cafe\u0301 Å Ǆ ﬁ ß ΣΑΣ İstanbul",
    "مرحبا بالعالم नमस्ते สวัสดี Привет",
    "def f(x):\n    return x**2  # comment\n\n\n\tif x:\r\n\t\tpass\n",
    "!!!???...---___***### <<>> {{}} [[]] ``` ''' \"\"\"",
    "ctrl \x00\x01\x1f\x7f zero\u200bwidth\u200d joiner \ufeff bom \u00a0nbsp\u3000ideo",
    # Unicode's other whitespace, alone and at word starts: gigatoken 0.10 drops a U+0085 that
    # starts a word under a SentencePiece model's nmt_nfkc normalization (sentencepiece keeps it
    # as byte pieces). U+0085 is common in text decoded as Latin-1 that was cp1252 ("…").
    "\x85 nel \x85x \u2028ls\u2029ps \x0b\x0c\x1c\x1d\x1e \u1680\u2000\u2009\u202f\u205f end\x85",
    "<|endoftext|> <|endoftext <| endoftext |> <|im_start|>user<|im_end|> </s><s>[CLS][SEP]",
    # Unicode newer than the reference libraries' tables: marks `tokenizers`' NFC gives class 0
    # (it keeps their order; gigatoken's NFC, on current Unicode, reorders them), a Unicode 16
    # composition it lacks, and U+180E, whitespace only before Unicode 6.3 (`tokenizers` and
    # tiktoken no longer split on it; fastokens' PCRE2 `\s` still does).
    "x\u0344\u08d1 \u0628\u08d3\u0650 \U000113c2\U000113b8 and  \u180e1  \u180e",
    " leading",
    "trailing   ",
    "   ",
    "\n",
    "a",
)


def probe_texts(added: Sequence[str] = ()) -> list[str]:
    """The built-in probe: the pieces above, long runs, and this tokenizer's added tokens.

    Deterministic (a seeded generator), about 230 texts and 175 kB (more with added tokens).
    """
    rng = np.random.default_rng(0)
    runs = [c * n for c in (" ", "\t", "\n", "0", "7", "a", "ab", "\u3000", "é", "😀") for n in (2, 3, 17, 300, 5000)]  # fmt: skip
    runs += ["  \n \n\t \n  " * 50, " " * 1000 + "x", "x" + " " * 1000, "1 " * 2000]
    added = [a for a in added if a]
    words = [*_PIECES, *added, " ", "  ", "\n", "word", "Word", "123"]
    texts = [*_PIECES, *runs]
    for a in added:  # alone, glued to text, padded: exercises lstrip / rstrip / single_word
        texts += [a, f"x{a}y", f" {a} ", f"\n{a}\n", f"{a}{a}", f"word {a}word"]
    for _ in range(160):
        n = int(rng.integers(2, 12))
        texts.append("".join(words[i] for i in rng.integers(0, len(words), n)))
    texts.append("".join(_PIECES) * 40 + "".join(runs[:10]))  # one long document (~100 kB)
    return texts


PROBE_REVISION = "2"
"""Changed when what the probe holds changes beyond its built-in text, so checks recorded
against the old probe are made again (2: a SentencePiece model's user-defined pieces)."""


@functools.lru_cache(maxsize=1)
def probe_digest() -> str:
    """A short hash of the built-in probe text: recorded checks name the probe they passed."""
    h = hashlib.sha256(PROBE_REVISION.encode() + b"\0")
    for t in probe_texts():
        h.update(t.encode("utf-8", "surrogatepass") + b"\0")
    return h.hexdigest()[:16]


def _ids(encoder: Encoder, texts: list[str]) -> list[list[int]]:
    flat, lengths = encoder.flat(encoder.encode(texts))
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]


def self_check(candidate: Encoder, reference: Encoder, added: Sequence[str]) -> str | None:
    """None when `candidate` gives `reference`'s ids on the probe, else what differs (one line)."""
    texts = probe_texts(added)
    try:
        got = _ids(candidate, texts)
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"failed on the probe text ({type(exc).__name__}: {one_line(exc, 120)})"
    try:
        want = _ids(reference, texts)
    except BaseException as exc:  # the file cannot encode every text: nothing proves `candidate`
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        return f"the reference library failed on the probe text ({type(exc).__name__})"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g != w:
            return f"ids differ from the reference on probe text {texts[i][:40]!r}"
    # One by one too: an engine may batch differently from how it encodes a single document.
    for i in (0, 3, len(texts) - 1):
        if _ids(candidate, [texts[i]]) != [want[i]]:
            return f"ids differ from the reference on probe text {texts[i][:40]!r} alone"
    return None


@dataclass(frozen=True)
class Choice:
    """The outcome of `choose_engine`."""

    engine: str
    encoder: Encoder
    note: str = ""
    """Why faster engines were passed over (one line), or "" when the fastest was used."""
    checked: str = ""
    """How the ids were proven: `probe` (the self-check ran), `record` (a passed check was
    recorded for this file and these versions, packtool/tokenizer/engine_checks.py), "" (the reference)."""
    failed: tuple[tuple[str, str], ...] = ()
    """(engine, why) of the engines that refused the tokenizer or failed the self-check here (to
    be recorded)."""


def choose_engine(
    source: Source,
    reference: Callable[[], Encoder],
    reference_name: str,
    *,
    spec: str = "auto",
    workers: int = 1,
    added: Callable[[], Sequence[str]] = tuple,
    proven: Callable[[Engine], bool] = lambda e: False,
    failed: Callable[[Engine], str | None] = lambda e: None,
    opener: Callable[[Engine], Encoder] | None = None,
) -> Choice:
    """The engine that encodes `source`: the first of `spec` that loads it and passes the probe.

    Args:
        source: the tokenizer.
        reference: returns the reference library's encoder for it (the caller may be loading it
            in another thread meanwhile: a large tokenizer.json takes a second per library).
        reference_name: that library's engine name.
        spec: `auto` (the registry order) or engine names, comma-separated (tried in order; the
            reference library may be among them).
        workers: encoding threads.
        added: returns the tokenizer's added-token texts, for the probe.
        proven: whether an engine already passed the probe for this tokenizer with its
            installed version (a record, packtool/tokenizer/engine_checks.py): then it is not run again.
        failed: why an engine already refused this tokenizer or failed the probe with its
            installed version (a record; "" when not said), or None: a recorded engine is
            passed over without building it.
        opener: builds an engine's encoder (default `engine.open(source, workers)`; the caller
            may have started building one in another thread).

    Raises:
        ConfigError: none of the named engines can encode this tokenizer exactly (the message
            names the file, each engine's reason and what to do).
    """
    engines, forced = parse_engines(spec, source.kind, source)
    passed_over: list[str] = []
    failures: list[tuple[str, str]] = []
    for e in engines:
        if e.name == reference_name:
            return Choice(e.name, reference(), "; ".join(passed_over), failed=tuple(failures))
        try:
            __import__(e.module)
        except ImportError:
            passed_over.append(f"{e.name} is not installed (pip install {e.module})")
            continue
        why = None if e.reference else failed(e)
        if why is not None:
            passed_over.append(f"{e.name} {why or 'was passed over for this tokenizer'} (recorded)")
            continue
        try:
            candidate = opener(e) if opener is not None else e.open(source, workers)
        except EngineRefused as exc:
            passed_over.append(f"{e.name} cannot load it ({exc})")
            failures.append((e.name, f"cannot load it ({exc})"))
            continue
        if e.reference or proven(e):
            checked = "" if e.reference else "record"
            return Choice(e.name, candidate, "; ".join(passed_over), checked, tuple(failures))
        problem = self_check(candidate, reference(), added())
        if problem is None:
            return Choice(e.name, candidate, "; ".join(passed_over), "probe", tuple(failures))
        passed_over.append(f"{e.name} {problem}")
        failures.append((e.name, problem))
    fallback = "auto" if forced else reference_name
    raise ConfigError(
        f"{source.where}: no tokenizer engine of {spec!r} can encode this tokenizer exactly: "
        f"{'; '.join(passed_over)}; use {option_choice('--tokenizer-engine', 'engine', fallback)}"
    )
