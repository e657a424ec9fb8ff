"""Tokenizer engines: the libraries that turn text into ids, in one registry, fastest first.

A tokenizer *file* (a `tokenizer.json`, a tiktoken ranks file, a SentencePiece model) defines the
ids; its *reference* library (`tokenizers`, `tiktoken`, `sentencepiece`) is the ground truth.
Other engines encode the same files faster. `ENGINES` lists them in the order `auto` tries them
(by measured speed, docs/tokenize.md; an engine's `first_for` moves it ahead for the tokenizers
it is fastest on); packtool/tokenizer/choice.py picks one per tokenizer behind a self-check, so
the choice never changes an id. Each engine's encoder returns one batch's ids as a flat uint32
array plus per-document lengths, without per-token Python objects where the library allows it
(fastokens and gigatoken hand over flat buffers)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from packtool.errors import ConfigError, PacktoolError, one_line
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
    note: str = ""
    """What of the file is not applied (packtool/tokenizer/json_settings.py); "" for none."""


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
    first_for: Callable[[Source], bool] | None = None
    """Tokenizers this engine is tried first for, ahead of the registry order (auto only)."""


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


@contextlib.contextmanager
def refusing(expected: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Around an engine's load: a failure is `EngineRefused`, one line. `expected` (the
    library's own errors for a bad file) say only their message; anything else, a Rust panic
    among them (pyo3's `PanicException` is a `BaseException`, not an `Exception`), is named
    with its type. Ctrl-C and exits pass through."""
    try:
        yield
    except EngineRefused:
        raise
    except expected as exc:
        raise EngineRefused(one_line(exc, 240)) from None
    except BaseException as exc:
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        raise EngineRefused(f"{type(exc).__name__}: {one_line(exc, 240)}") from None


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

    with refusing((ValueError, OSError, TypeError)):
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


def _write_ranks(path: Path, ranks: dict[bytes, int]) -> None:
    import base64

    with writing.open_output(path) as f:
        for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
            f.write(base64.b64encode(token) + b" %d\n" % rank)


# --- gigatoken ---------------------------------------------------------------------------------

# GPT-2's pre-tokenizer split pattern (tiktoken's r50k_base / gpt2).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_POOL_PID: int | None = None
"""The process that first encoded through gigatoken's rayon pool: the pool lives there."""


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

    with refusing((ValueError, OSError, TypeError, KeyError, ImportError)):
        import awkward  # noqa: F401  (its ~0.4 s import lands here, off the first batch)

        if source.kind == "hf":
            tok = gigatoken.Tokenizer.from_json(source.json)
        elif source.kind == "sentencepiece":
            try:
                tok = gigatoken.Tokenizer.from_json(_sentencepiece_json(source))
            except BaseException as exc:  # a damaged cached conversion: convert it again
                if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                    raise
                tok = gigatoken.Tokenizer.from_json(_sentencepiece_json(source, cached=False))
        else:
            scheme = _gigatoken_scheme(source.pattern or "")
            # No special tokens: tiktoken's encode_ordinary encodes their text as plain text.
            if source.path is not None:
                tok = gigatoken.Tokenizer.from_tiktoken(
                    source.path, pretokenizer=scheme, special_tokens={}
                )
            else:  # a tiktoken encoding from tiktoken's cache: hand gigatoken a ranks file
                with writing.temporary_folder("packtool-ranks-") as tmp:
                    path = Path(tmp) / "ranks.tiktoken"
                    _write_ranks(path, source.ranks or {})
                    tok = gigatoken.Tokenizer.from_tiktoken(
                        str(path), pretokenizer=scheme, special_tokens={}
                    )
        return _GigatokenEncoder(tok, workers)


def _sentencepiece_json(source: Source, cached: bool = True) -> str:
    """A SentencePiece model as a tokenizer.json, with no added tokens.

    sentencepiece never matches its control pieces (`<s>`, `</s>`) in the text, so the added
    tokens gigatoken's conversion lists are dropped (the self-check holds the result to
    sentencepiece's ids either way). The conversion is gigatoken's own, an internal module:
    if it moves, this engine refuses and `sentencepiece` encodes. It runs in Python (~0.5 s of
    CPU with the GIL held for a 32,000-piece model), so its result is kept in the cache folder
    of the engine checks (`converted/`, by the model's sha256 and gigatoken's build) and read
    back on later loads (unless `cached` is false); a cache that cannot be read or written, or
    a damaged one, only means converting again.
    """
    import json

    from gigatoken._load.sentencepiece import sentencepiece_to_tokenizer_json

    data = storage.read_bytes(source.path or "")
    kept = _converted_path(data)
    if kept is not None and cached:
        try:
            return storage.read_bytes(kept).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            pass
    spec = json.loads(sentencepiece_to_tokenizer_json(data))
    spec["added_tokens"] = []
    text = json.dumps(spec)
    if kept is not None:
        with contextlib.suppress(OSError):  # a cache that cannot be written: convert next time
            writing.write_atomic(kept, text.encode("utf-8"), make_parent=True)
    return text


def _converted_path(model: bytes) -> Path | None:
    from packtool.tokenizer.engine_checks import cache_dir, library_version

    folder, version = cache_dir(), library_version("gigatoken")
    if folder is None or version is None:
        return None
    key = hashlib.sha256(model + b"\0" + version.encode()).hexdigest()[:32]
    return folder / "converted" / f"sentencepiece-{key}.json"


def _gigatoken_scheme(pattern: str) -> str:
    """The gigatoken pre-tokenizer that splits as `pattern` does (GPT-2's, as packtool and
    tiktoken spell it; other ranks files are left to fastokens and tiktoken)."""
    from tiktoken_ext import openai_public

    if pattern not in (GPT2_PATTERN, openai_public.r50k_pat_str):
        raise EngineRefused("no pre-tokenizer of its own for this split pattern")
    return "gpt2"


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

    with refusing((Exception,)):  # the library raises plain Exception on a bad file
        return _HFEncoder(HFTok.from_str(source.json))


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
    with refusing((ValueError,)):  # duplicate ranks panic in Rust
        return _TiktokenEncoder(tiktoken_encoding(source), workers)


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

    with refusing((RuntimeError, OSError)):  # engine_open says "not a SentencePiece model"
        sp = sentencepiece.SentencePieceProcessor(model_file=source.path)
    return _SentencePieceEncoder(sp, workers)


def _splits_with_a_pattern(source: Source) -> bool:
    """A ranks file, or a tokenizer.json with a `Split` pre-tokenizer (Llama 3, Qwen, DeepSeek):
    fastokens runs such a pattern through PCRE2, ~5x slower than its GPT-2 ByteLevel split."""
    return source.kind == "tiktoken" or (
        source.json is not None and _SPLIT.search(source.json) is not None
    )


_SPLIT = re.compile(r'(?<!\\)"type"\s*:\s*"Split"')
"""A `Split` pre-tokenizer in tokenizer.json text (a token's text has its quotes escaped)."""

ENGINES: tuple[Engine, ...] = (
    # Fastest first, end to end (docs/tokenize.md "Choosing the engine"). fastokens: GPT-2's
    # ByteLevel split and SentencePiece's normalizer form, where gigatoken encodes as fast but
    # costs more to start (its batch result is an awkward Array: ~0.5 s of imports). gigatoken:
    # first for split patterns (1.4x fastokens end to end on GPT-2's converted file), and next
    # for what fastokens refuses (the Metaspace form, `.model` files): 10-40x the reference
    # libraries on every shape measured. Then the reference libraries.
    Engine("fastokens", ("hf", "tiktoken"), False, "fastokens", _open_fastokens),
    Engine(
        "gigatoken",
        ("hf", "tiktoken", "sentencepiece"),
        False,
        "gigatoken",
        _open_gigatoken,
        first_for=_splits_with_a_pattern,
    ),
    Engine("tiktoken", ("tiktoken",), True, "tiktoken", _open_tiktoken),
    Engine("tokenizers", ("hf",), True, "tokenizers", _open_tokenizers),
    Engine("sentencepiece", ("sentencepiece",), True, "sentencepiece", _open_sentencepiece),
)
ENGINE_NAMES = tuple(e.name for e in ENGINES)


_NOT_THE_FILE = (KeyboardInterrupt, SystemExit, MemoryError, PacktoolError)
"""Failures of an encode that are never the tokenizer file's (`encode_checked`)."""


def encode_checked(encoder: Encoder, texts: Sequence[str], source: Source, name: str) -> Any:
    """`encoder.encode(texts)`, where a failure the tokenizer causes is one line naming it.

    A tokenizer file can load (and pass the probe, which only the faster engines run) and still
    fail on some text: an unknown character in a tokenizer.json whose unknown token is not in
    its vocabulary, a ranks file without all 256 single bytes (tiktoken panics in Rust: a
    `BaseException`). Such a failure recurs on one document alone (`_failing_text`, a batch of
    one); then the run stops as on a bad option (the tokenizer is at fault, so there is nothing
    to resume). A failure no single document reproduces (the tiktoken engine's own thread pool
    failing to start a thread, say: a batch of one is encoded on this thread) is raised as it
    came, and a run keeps its finished work for `--resume`. (The Rust engines encode a batch of
    one on their pools too: a pool that cannot start at all is still taken for the file's.)"""
    try:
        return encoder.encode(texts)
    except BaseException as exc:
        if isinstance(exc, _NOT_THE_FILE):
            raise
        found = _failing_text(encoder, texts)
        if found is None:
            raise
        text, why = found
        raise ConfigError(
            f"{source.where}: the {name} engine could not encode the text beginning "
            f"{text[:40]!r} ({type(why).__name__}: {one_line(why, 160)}): this tokenizer cannot "
            "encode every text (a character with no id and no unknown token?); fix its file or "
            "use another"
        ) from None


def _failing_text(encoder: Encoder, texts: Sequence[str]) -> tuple[str, BaseException] | None:
    """The first of `texts` the encoder fails on alone (a batch of one), with its error; None
    when each encodes."""
    for text in texts:
        try:
            encoder.encode([text])
        except BaseException as exc:
            if isinstance(exc, _NOT_THE_FILE):
                raise
            return text, exc
    return None


def engine(name: str) -> Engine:
    """The registry entry called `name`."""
    for e in ENGINES:
        if e.name == name:
            return e
    raise ConfigError(
        f"unknown tokenizer engine {name!r}; choose auto or one of {', '.join(ENGINE_NAMES)}"
    )


def parse_engines(spec: str, kind: str, source: Source | None = None) -> tuple[list[Engine], bool]:
    """`auto` or a comma-separated list of engine names -> (engines to try in order, forced).

    `auto` is the registry order, with the engines whose `first_for` takes `source` ahead.

    Raises:
        ConfigError: an unknown name, or a name that does not load this tokenizer kind.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"tokenizer engine must be 'auto' or engine names, got {spec!r}")
    if spec.strip() == "auto":
        fit = [e for e in ENGINES if kind in e.kinds]
        ahead = [e for e in fit if source is not None and e.first_for and e.first_for(source)]
        return ahead + [e for e in fit if e not in ahead], False
    chosen = [engine(n.strip()) for n in spec.split(",") if n.strip()]
    if not chosen:
        raise ConfigError(f"tokenizer engine {spec!r} names no engine; give 'auto' or names")
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
