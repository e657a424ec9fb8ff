"""Tokenizer engines: the libraries that turn text into ids, in one registry, fastest first.

A tokenizer *file* (a `tokenizer.json`, a tiktoken ranks file) defines the ids; its *reference*
library (`tokenizers`, `tiktoken`) is the ground truth. Other engines encode the same files
faster. `choose_engine` picks, for one loaded tokenizer, the first engine of `ENGINES` (ordered by
measured speed, docs/tokenize.md) that

1. supports the file's kind and is installed,
2. loads the file (engines refuse what they do not implement: fastokens refuses e.g. Metaspace /
   SentencePiece-style pre-tokenizers and BERT normalizers), and
3. gives exactly the reference library's ids on `probe_texts` (special characters, long
   whitespace and digit runs, CJK, emoji, and every added token of this tokenizer).

The reference libraries pass by definition, so the choice never changes an id; it only changes
the speed. Each engine's encoder returns one batch's ids as a flat uint32 array plus per-document
lengths, without per-token Python objects where the library allows it (fastokens hands over one
flat buffer).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packtool.errors import ConfigError
from packtool.storage import local as storage
from packtool.storage import writing


@dataclass(frozen=True)
class Source:
    """Everything an engine needs to build an encoder; plain data, so it pickles (Ray actors)."""

    kind: str
    """`hf` or `tiktoken`."""
    where: str
    """The file (or tiktoken encoding name), for messages."""
    json: str | None = None
    """hf: the tokenizer.json text."""
    ranks: dict[bytes, int] | None = None
    """tiktoken: token bytes -> rank."""
    pattern: str | None = None
    """tiktoken: the pre-tokenizer split pattern."""
    specials: dict[str, int] | None = None
    """tiktoken: special token text -> id (encoded as plain text: `encode_ordinary`)."""
    path: str | None = None
    """tiktoken: the ranks file, when there is one (engines that read files use it);
    sentencepiece: the `.model` file."""


class Encoder(Protocol):
    """One engine's encoder for one tokenizer."""

    def encode(self, texts: Sequence[str]) -> Any:
        """The library's own batch encoding (runs with the GIL released where it can)."""

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        """`(ids uint32, lengths int64)` of one `encode` result, documents back to back."""


class EngineRefused(Exception):
    """The engine cannot load this tokenizer; the message says why (one line)."""


@dataclass(frozen=True)
class Engine:
    """One registry entry."""

    name: str
    kinds: tuple[str, ...]
    """Tokenizer kinds it loads (`hf`, `tiktoken`)."""
    reference: bool
    """The library that defines the ids for its kinds (no self-check needed)."""
    module: str
    """The import name; also what `pip install` takes."""
    open: Callable[[Source, int], Encoder]
    """Build an encoder for `source` encoding with `workers` threads; raises `EngineRefused`."""


def limit_threads(workers: int | None) -> None:
    """Size the Rust engines' process-wide thread pools to `workers`, unless the user already did.

    `tokenizers` builds rayon's global pool and fastokens its own pool on their first parallel
    encode, from `RAYON_NUM_THREADS` / `FASTOKENS_BPE_THREADS` (read then, never resized), so this
    takes effect only before that first encode, and an explicit variable always wins.
    """
    if workers is None:
        return
    for var in ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS"):
        os.environ.setdefault(var, str(workers))


def flatten_lists(ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per-document id lists -> `(flat uint32, lengths int64)`.

    `array.array("I").extend(list)` converts in C: the cheapest way from Python int lists to one
    buffer (faster than np.fromiter or np.concatenate of per-document arrays).
    """
    import array

    flat = array.array("I")
    lengths = array.array("q")
    for doc in ids:
        lengths.append(len(doc))
        flat.extend(doc)
    return np.frombuffer(flat, dtype=np.uint32), np.frombuffer(lengths, dtype=np.int64)


# --- fastokens --------------------------------------------------------------------------------


class _FastokensEncoder:
    def __init__(self, tok: Any, split_special: bool) -> None:
        self.tok = tok
        # tiktoken's encode_ordinary encodes special-token text as plain text; tokenizers'
        # encode(add_special_tokens=False) matches added tokens in the text. fastokens does either.
        self.split_special = split_special

    def encode(self, texts: Sequence[str]) -> Any:
        return self.tok.encode_batch_flat(
            list(texts), add_special_tokens=False, split_special_tokens=self.split_special
        )

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        ids, offsets = raw  # little-endian uint32 ids, uint64 offsets (n + 1), no copies here
        return np.frombuffer(ids, np.uint32), np.diff(np.frombuffer(offsets, np.uint64)).astype(
            np.int64
        )


def _open_fastokens(source: Source, workers: int) -> Encoder:
    import fastokens

    try:
        if source.kind == "hf":
            return _FastokensEncoder(fastokens.Tokenizer.from_json_str(source.json), False)
        if source.path is not None:
            tok = fastokens.Tokenizer.from_tiktoken(
                source.path, pattern=source.pattern, special_tokens=source.specials
            )
        else:  # a tiktoken encoding from tiktoken's cache: hand fastokens a ranks file
            with writing.temporary_folder("packtool-ranks-") as tmp:
                path = Path(tmp) / "ranks.tiktoken"
                _write_ranks(path, source.ranks or {})
                tok = fastokens.Tokenizer.from_tiktoken(
                    str(path), pattern=source.pattern, special_tokens=source.specials
                )
        return _FastokensEncoder(tok, True)
    except (ValueError, OSError, TypeError) as exc:
        raise EngineRefused(_one_line(exc)) from None
    except BaseException as exc:  # a Rust panic (pyo3 PanicException) is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise EngineRefused(f"{type(exc).__name__}: {_one_line(exc)}") from None


def _write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    import base64

    with writing.open_output(path) as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" %d\n" % rank)


# --- gigatoken ---------------------------------------------------------------------------------

# GPT-2's pre-tokenizer split pattern (tiktoken's r50k_base / gpt2).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_GIGATOKEN_SCHEMES: dict[str, str] = {}
"""tiktoken split pattern -> the name of gigatoken's pre-tokenizer for it (filled on first use)."""
_POOL_PID: int | None = None
"""The process that first encoded in parallel: gigatoken's rayon pool lives there."""


class _GigatokenEncoder:
    def __init__(self, tok: Any, workers: int) -> None:
        self.tok = tok
        self.workers = workers

    def encode(self, texts: Sequence[str]) -> Any:
        global _POOL_PID
        # A rayon pool built before a fork has no threads in the child: injecting work there
        # waits forever. So a forked child of a process that encoded in parallel encodes on its
        # own thread (gigatoken's own guard would do so in every multiprocessing worker).
        parallel = self.workers > 1 and _POOL_PID in (None, os.getpid())
        if parallel:
            _POOL_PID = os.getpid()
        return self.tok.encode_batch(list(texts), parallel=parallel)

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        import awkward as ak

        layout = ak.to_layout(raw)  # one flat uint32 buffer + int64 offsets, no copies here
        offsets = np.asarray(layout.offsets.data)
        ids = np.asarray(layout.content.data)[offsets[0] : offsets[-1]]
        return ids.astype(np.uint32, copy=False), np.diff(offsets).astype(np.int64, copy=False)


def _open_gigatoken(source: Source, workers: int) -> Encoder:
    import gigatoken

    try:
        import awkward  # noqa: F401  (its ~0.4 s import lands here, off the first batch)

        if source.kind == "hf":
            tok = gigatoken.Tokenizer.from_json(source.json)
        elif source.kind == "sentencepiece":
            tok = gigatoken.Tokenizer.from_json(_sentencepiece_json(source))
        else:
            scheme = _gigatoken_scheme(source.pattern or "")
            path = source.path
            if path is None:
                raise EngineRefused("loads tiktoken ranks from a file only")
            # No special tokens: tiktoken's encode_ordinary encodes their text as plain text.
            tok = gigatoken.Tokenizer.from_tiktoken(path, pretokenizer=scheme, special_tokens={})
        return _GigatokenEncoder(tok, workers)
    except EngineRefused:
        raise
    except (ValueError, OSError, TypeError, KeyError, ImportError) as exc:
        raise EngineRefused(_one_line(exc)) from None
    except BaseException as exc:  # a Rust panic (pyo3 PanicException) is a BaseException
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise EngineRefused(f"{type(exc).__name__}: {_one_line(exc)}") from None


def _sentencepiece_json(source: Source) -> str:
    """A SentencePiece model as a tokenizer.json, with no added tokens.

    sentencepiece never matches its control pieces (`<s>`, `</s>`) in the text, so the added
    tokens gigatoken's conversion lists are dropped (the self-check holds the result to
    sentencepiece's ids either way). The conversion is gigatoken's own, an internal module:
    if it moves, this engine refuses and `sentencepiece` encodes.
    """
    import json

    from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

    spec = json.loads(sentencepiece_to_tokenizer_json(storage.read_bytes(source.path or "")))
    spec["added_tokens"] = []
    return json.dumps(spec)


def _gigatoken_scheme(pattern: str) -> str:
    """The gigatoken pre-tokenizer that splits as `pattern` does (GPT-2's, as packtool and
    tiktoken spell it; other ranks files are left to fastokens and tiktoken)."""
    if not _GIGATOKEN_SCHEMES:
        from tiktoken_ext import openai_public

        _GIGATOKEN_SCHEMES[GPT2_PATTERN] = "gpt2"
        _GIGATOKEN_SCHEMES[openai_public.r50k_pat_str] = "gpt2"
    scheme = _GIGATOKEN_SCHEMES.get(pattern)
    if scheme is None:
        raise EngineRefused("no pre-tokenizer of its own for this split pattern")
    return scheme


# --- tokenizers (reference for tokenizer.json) ---------------------------------------------------


class _HFEncoder:
    def __init__(self, tok: Any) -> None:
        self.tok = tok
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def encode(self, texts: Sequence[str]) -> Any:
        # Rust encodes on all cores (GIL released); `.ids` lists are made in `flat`.
        return self._encode(list(texts), add_special_tokens=False)

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        return flatten_lists(e.ids for e in raw)


def _open_tokenizers(source: Source, workers: int) -> Encoder:
    from tokenizers import Tokenizer as HFTok

    try:
        return _HFEncoder(HFTok.from_str(source.json))
    except Exception as exc:  # the library raises plain Exception on a bad file
        raise EngineRefused(_one_line(exc)) from None


# --- tiktoken (reference for ranks files) ----------------------------------------------------


class _TiktokenEncoder:
    def __init__(self, enc: Any, workers: int) -> None:
        self.enc = enc
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None

    def encode(self, texts: Sequence[str]) -> Any:
        encode = self.enc.encode_ordinary
        if self.workers <= 1 or len(texts) < 2:
            return [encode(t) for t in texts]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="packtool-tiktoken")
        # One task per slice, not per text: fewer futures; the Rust core releases the GIL.
        step = -(-len(texts) // (self.workers * 4))
        slices = [texts[i : i + step] for i in range(0, len(texts), step)]
        return [
            ids for part in self._pool.map(lambda s: [encode(t) for t in s], slices) for ids in part
        ]

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        return flatten_lists(raw)


def tiktoken_encoding(source: Source) -> Any:
    """A `tiktoken.Encoding` for a tiktoken source."""
    import tiktoken

    return tiktoken.Encoding(
        name=Path(source.where).stem or "encoding",
        pat_str=source.pattern,
        mergeable_ranks=source.ranks,
        special_tokens=source.specials or {},
    )


def _open_tiktoken(source: Source, workers: int) -> Encoder:
    try:
        return _TiktokenEncoder(tiktoken_encoding(source), workers)
    except ValueError as exc:
        raise EngineRefused(_one_line(exc)) from None


# --- sentencepiece ----------------------------------------------------------------------------


class _SentencePieceEncoder:
    """`sentencepiece` itself: the reference for `.model` files (ids as `sp.encode(text)`)."""

    def __init__(self, sp: Any, workers: int) -> None:
        self.sp = sp
        self.workers = workers

    def encode(self, texts: Sequence[str]) -> Any:
        # The C++ batch encode releases the GIL and runs on `workers` threads.
        return self.sp.encode(list(texts), out_type=int, num_threads=self.workers)

    def flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        return flatten_lists(raw)


def _open_sentencepiece(source: Source, workers: int) -> Encoder:
    import sentencepiece

    try:
        sp = sentencepiece.SentencePieceProcessor(model_file=source.path)
    except (RuntimeError, OSError) as exc:
        raise EngineRefused(f"not a SentencePiece model ({_one_line(exc)})") from None
    return _SentencePieceEncoder(sp, workers)


ENGINES: tuple[Engine, ...] = (
    # Fastest first (docs/tokenize.md measures them). gigatoken encoded every shape measured
    # (GPT-2's ByteLevel, a Split regex, both SentencePiece forms, .model files) at 1.3-6x
    # fastokens and 10-40x the reference libraries, with identical ids; fastokens next (it loads
    # split patterns gigatoken has no pre-tokenizer for); then the reference libraries.
    Engine("gigatoken", ("hf", "tiktoken", "sentencepiece"), False, "gigatoken", _open_gigatoken),
    Engine("fastokens", ("hf", "tiktoken"), False, "fastokens", _open_fastokens),
    Engine("tiktoken", ("tiktoken",), True, "tiktoken", _open_tiktoken),
    Engine("tokenizers", ("hf",), True, "tokenizers", _open_tokenizers),
    Engine("sentencepiece", ("sentencepiece",), True, "sentencepiece", _open_sentencepiece),
)
ENGINE_NAMES = tuple(e.name for e in ENGINES)


def _one_line(value: Any, limit: int = 240) -> str:
    text = " ".join(str(value).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def engine(name: str) -> Engine:
    """The registry entry called `name`."""
    for e in ENGINES:
        if e.name == name:
            return e
    raise ConfigError(
        f"unknown tokenizer engine {name!r}; choose auto or one of {', '.join(ENGINE_NAMES)}"
    )


def parse_engines(spec: str, kind: str) -> tuple[list[Engine], bool]:
    """`auto` or a comma-separated list of engine names -> (engines to try in order, forced).

    Raises:
        ConfigError: an unknown name, or a name that does not load this tokenizer kind.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"tokenizer engine must be 'auto' or engine names, got {spec!r}")
    if spec.strip() == "auto":
        return [e for e in ENGINES if kind in e.kinds], False
    chosen = [engine(n.strip()) for n in spec.split(",") if n.strip()]
    for e in chosen:
        if kind not in e.kinds:
            fit = ", ".join(x.name for x in ENGINES if kind in x.kinds)
            what = {"hf": "tokenizer.json files", "tiktoken": "tiktoken encodings"}.get(
                kind, "SentencePiece models"
            )
            raise ConfigError(
                f"tokenizer engine {e.name!r} does not load {what}; engines for this tokenizer: "
                f"{fit} (or auto)"
            )
    return chosen, True


# --- the self-check -------------------------------------------------------------------------

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
    "<|endoftext|> <|endoftext <| endoftext |> <|im_start|>user<|im_end|> </s><s>[CLS][SEP]",
    " leading",
    "trailing   ",
    "   ",
    "\n",
    "a",
)


def probe_texts(added: Sequence[str] = ()) -> list[str]:
    """The built-in probe: the pieces above, long runs, and this tokenizer's added tokens.

    Deterministic (a seeded generator), about 300 documents and 200 kB.
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
        return f"failed on the probe text ({type(exc).__name__}: {_one_line(exc, 120)})"
    want = _ids(reference, texts)
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
    failed: tuple[str, ...] = ()
    """Engines that loaded the tokenizer and failed the self-check here (to be recorded)."""


def choose_engine(
    source: Source,
    reference: Callable[[], Encoder],
    reference_name: str,
    *,
    spec: str = "auto",
    workers: int = 1,
    added: Callable[[], Sequence[str]] = tuple,
    proven: Callable[[Engine], bool] = lambda e: False,
    failed: Callable[[Engine], bool] = lambda e: False,
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
        failed: whether an engine already failed the probe for it with its installed version (a
            record): then it is passed over without loading it.
        opener: builds an engine's encoder (default `engine.open(source, workers)`; the caller
            may have started building one in another thread).

    Raises:
        ConfigError: none of the named engines can encode this tokenizer exactly (the message
            names the file, each engine's reason and what to do).
    """
    engines, forced = parse_engines(spec, source.kind)
    passed_over: list[str] = []
    failures: list[str] = []
    for e in engines:
        if e.name == reference_name:
            return Choice(e.name, reference(), "; ".join(passed_over), failed=tuple(failures))
        try:
            __import__(e.module)
        except ImportError:
            passed_over.append(f"{e.name} is not installed (pip install {e.module})")
            continue
        if not e.reference and failed(e):
            passed_over.append(f"{e.name} failed the self-check on this tokenizer (recorded)")
            continue
        try:
            candidate = opener(e) if opener is not None else e.open(source, workers)
        except EngineRefused as exc:
            passed_over.append(f"{e.name} cannot load it ({exc})")
            continue
        if e.reference or proven(e):
            checked = "" if e.reference else "record"
            return Choice(e.name, candidate, "; ".join(passed_over), checked, tuple(failures))
        problem = self_check(candidate, reference(), added())
        if problem is None:
            return Choice(e.name, candidate, "; ".join(passed_over), "probe", tuple(failures))
        passed_over.append(f"{e.name} {problem}")
        failures.append(e.name)
    fallback = "auto" if forced else reference_name
    raise ConfigError(
        f"{source.where}: no tokenizer engine of {spec!r} can encode this tokenizer exactly: "
        f"{'; '.join(passed_over)}; use --tokenizer-engine {fallback}"
    )
