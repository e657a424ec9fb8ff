"""Tokenizers behind one interface: `byte`, a Hugging Face `tokenizer.json`, a tiktoken encoding.

`Tokenizer.encode_batch(texts)` returns a flat id array plus per-document lengths with BOS/EOS
added; the ids between them are exactly what the tokenizer's reference library returns for the
text (`tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids`,
`tiktoken.Encoding.encode_ordinary(text)`, or the text's UTF-8 bytes), whichever engine encodes
them (`packtool/tokenizer/engines.py`: the fastest one that loads the tokenizer and proves the
same ids on a probe text). Encoding runs on all cores: the Rust libraries release the GIL.
Names (`org/model`, folders, `.tiktoken` files) are resolved by `packtool/tokenizer/files.py`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from packtool.dataset.identity import TokenizerIdentity, token_dtype
from packtool.errors import ConfigError
from packtool.storage import local as storage
from packtool.tokenizer.choice import choose_engine, probe_digest
from packtool.tokenizer.engine_checks import engine_stamp, open_record
from packtool.tokenizer.engines import (
    GPT2_PATTERN,
    Encoder,
    Engine,
    EngineRefused,
    Source,
    encode_checked,
    flatten_lists,
    limit_threads,
    parse_engines,
)
from packtool.tokenizer.engines import engine as engine_entry
from packtool.tokenizer.files import TokenizerFiles, resolve
from packtool.tokenizer.json_settings import MAX_DEPTH, nesting_depth, without_unapplied
from packtool.tokenizer.openai_ranks import openai_encoding
from packtool.tokenizer.sentencepiece_model import USER_DEFINED, pieces_of_type
from packtool.tokenizer.specials import (
    BOS_NAMES,
    END_OF_TEXT,
    EOS_NAMES,
    EOS_TOKEN,
    SP_BOS,
    SP_EOS,
    add_specials,
    chosen_specials,
    default_id,
    given_ids,
    marked_special,
    own_bos,
    own_ids,
)

BYTE_VOCAB = 258
"""`byte`: ids 0-255 are the UTF-8 bytes, 256 is EOS, 257 is BOS (both always reserved)."""
BYTE_EOS = 256
BYTE_BOS = 257

REFERENCE = {"hf": "tokenizers", "tiktoken": "tiktoken", "sentencepiece": "sentencepiece"}
"""The library whose ids define each tokenizer kind's (every other engine must match it)."""


def check_vocab_fits(name: str, vocab_size: int) -> None:
    """Raise `ConfigError` naming `name` when ids up to `vocab_size` do not fit uint32."""
    if vocab_size > 2**32:
        raise ConfigError(
            f"{name}: the vocabulary has {vocab_size:,} ids, more than the uint32 token ids "
            "packtool stores can hold (2**32); the file is corrupt or not a text tokenizer: "
            "check it or use another tokenizer"
        )


class Tokenizer:
    """A loaded tokenizer; make one with `load_tokenizer`."""

    def __init__(
        self,
        *,
        kind: str,
        name: str,
        base_vocab: int,
        eos_id: int | None,
        bos_id: int | None,
        sha256: str,
        engine: str | None = None,
        workers: int | None = None,
    ) -> None:
        for what, value in (("eos", eos_id), ("bos", bos_id)):
            if value is not None and not 0 <= value < 2**32:
                raise ConfigError(f"{what} id must be in [0, 2**32), got {value}")
        vocab = max(base_vocab, (eos_id or 0) + 1, (bos_id or 0) + 1)
        check_vocab_fits(name, vocab)
        self.base_vocab = base_vocab
        """The tokenizer's own ids (`identity.vocab_size` also counts an EOS / BOS past them)."""
        self.identity = TokenizerIdentity(
            kind=kind,
            name=name,
            vocab_size=vocab,
            eos_id=eos_id,
            bos_id=bos_id,
            sha256=sha256,
            engine=engine,
        )
        self.dtype = token_dtype(vocab)
        self.workers = workers or _cpu_count()
        self.engine_note = ""
        """Why faster engines were passed over (one line; "" when the fastest was used)."""
        self.file_note = ""
        """What of the tokenizer file packing does not apply (one line; "" for nothing)."""
        self.engine_check = ""
        """How the engine's ids were proven: `probe`, `record` (packtool/tokenizer/engine_checks.py), or
        "" (the reference library, or `byte`)."""
        self.special_names: dict[str, str] = {}
        """`eos` / `bos` -> the token text and where the id came from, for summaries."""
        self.given_ids: dict[str, int | str] = {}
        """`eos` / `bos` -> the id chosen (`specials.given_ids`; the CLI adds `--eos-id default`)."""
        self.engine_asked: str | None = None  # an engine chosen (warned of over tokenized ids)
        self.chosen_specials: tuple[str, ...] = ()
        """`eos` / `bos` whose id the caller chose (`load_tokenizer`'s `eos` / `bos` other than
        their defaults; the CLI: --eos-id / --no-eos / --bos-id / --no-bos given). Tokenized
        Parquet read with this tokenizer takes the EOS / BOS it records for the others
        (packtool/tokenize/recorded.py)."""
        self.own_ids = {"eos": eos_id, "bos": bos_id}
        """EOS / BOS by the tokenizer's files alone, whatever the options (`specials.own_ids`)."""
        self.folder: Any = None  # the folder its file was resolved to (a hub id's snapshot)

    @property
    def vocab_size(self) -> int:
        return self.identity.vocab_size

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents, adding BOS/EOS.

        Returns:
            `(flat_ids, lengths)`: ids of all documents back to back, dtype `self.dtype`, and
            per-document token counts (int64, BOS/EOS included).
        """
        return self.finish_batch(self.start_batch(texts))

    def start_batch(self, texts: Sequence[str]) -> Any:
        """The first half of `encode_batch`: the library's own encoding (GIL released).

        Pipelines run it in one thread and `finish_batch` (the copy into arrays, which holds
        the GIL) in another, so that copying one batch overlaps encoding the next.
        """
        return self._library_encode(texts) if texts else None

    def finish_batch(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        """The second half of `encode_batch`: flat ids and lengths with BOS/EOS added."""
        if raw is None:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        flat, lengths = self._flat(raw)
        return add_specials(flat, lengths, self.identity.bos_id, self.identity.eos_id, self.dtype)

    def encode(self, text: str) -> np.ndarray:
        """One document (BOS/EOS added)."""
        return self.encode_batch([text])[0]

    def encode_bare(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """`(flat_ids, lengths)` of `texts` with no BOS/EOS added (rendered chat texts, prompts
        and completions), through the same checked encode as documents: a text the tokenizer
        cannot encode is one `ConfigError` line naming it (`engines.encode_checked`)."""
        if not texts:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        flat, lengths = self._flat(self._library_encode(texts))
        return flat.astype(self.dtype, copy=False), lengths

    def _library_encode(self, texts: Sequence[str]) -> Any:
        raise NotImplementedError

    def _flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        return flatten_lists(raw)

    def __repr__(self) -> str:
        i = self.identity
        return (
            f"Tokenizer({i.kind}:{i.name}, engine={i.engine}, vocab={i.vocab_size}, "
            f"eos={i.eos_id}, bos={i.bos_id})"
        )


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids 0-255; nothing to download."""

    def start_batch(self, texts: Sequence[str]) -> Any:
        # Join with placeholder bytes where BOS/EOS go, widen once, then overwrite the
        # placeholders: a memcpy-speed path with no per-token work at all.
        bos, eos = self.identity.bos_id, self.identity.eos_id
        if not texts:
            return None
        encoded = [t.encode("utf-8") for t in texts]
        n_special = (bos is not None) + (eos is not None)
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + n_special
        head = b"\0" if bos is not None else b""
        tail = b"\0" if eos is not None else b""
        joined = head + (b"\0" * n_special).join(encoded) + tail
        out = np.frombuffer(joined, dtype=np.uint8).astype(self.dtype)
        ends = np.cumsum(lengths)
        if bos is not None:
            out[ends - lengths] = bos
        if eos is not None:
            out[ends - 1] = eos
        return out, lengths

    def finish_batch(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        if raw is None:
            return np.empty(0, self.dtype), np.empty(0, np.int64)
        return raw

    def _library_encode(self, texts: Sequence[str]) -> Any:
        # The generic path (per-document id lists); tests check the fast path against it.
        return [list(t.encode("utf-8")) for t in texts]


class EngineTokenizer(Tokenizer):
    """A `tokenizer.json` or tiktoken tokenizer encoded by one engine of the registry.

    Pickles as its `Source` plus the engine's name (Ray ships tokenizers to actors); unpickling
    rebuilds the same engine's encoder, which proved its ids when the tokenizer was loaded.
    """

    def __init__(self, encoder: Encoder, source: Source, **kw: Any) -> None:
        self.encoder = encoder
        self.source = source
        super().__init__(**kw)

    @property
    def workers(self) -> int:
        return self._workers

    @workers.setter
    def workers(self, n: int) -> None:
        # The Ray engine sets 1 per actor; tiktoken's encoder reads it at every batch.
        self._workers = n
        if hasattr(self.encoder, "workers"):
            self.encoder.workers = n

    def _library_encode(self, texts: Sequence[str]) -> Any:
        return encode_checked(self.encoder, texts, self.source, self.identity.engine or "")

    def _flat(self, raw: Any) -> tuple[np.ndarray, np.ndarray]:
        return self.encoder.flat(raw)

    def __getstate__(self) -> dict[str, Any]:
        """No encoder (Rust objects and thread pools do not pickle); a bucket folder as its URL:
        its `UPath` holds the run's storage options, credentials that went into every pickle of
        a run's context (Slurm's `context.pkl` is a file). A worker takes its own (forwarded)."""
        folder = str(self.folder) if storage.is_remote(self.folder) else self.folder
        return {**self.__dict__, "encoder": None, "folder": folder}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if isinstance(self.folder, str):
            self.folder = storage.as_path(self.folder)
        self.encoder = engine_entry(self.identity.engine or "").open(self.source, self.workers)


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with storage.open_input(path) as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_tokenizer(
    spec: str,
    *,
    eos: int | str | None = "default",
    bos: int | str | None = "auto",
    workers: int | None = None,
    engine: str = "auto",
) -> Tokenizer:
    """Load a tokenizer.

    Args:
        spec: `byte`; a `tokenizer.json` path (or `hf:PATH`); a folder holding `tokenizer.json`;
            a Hugging Face repository id `org/model` (the local cache first, else downloaded);
            `PATH.tiktoken` or `tiktoken:PATH` (a local ranks file, loaded offline with GPT-2's
            split pattern); `tiktoken:NAME` (an encoding in tiktoken's cache, e.g. tiktoken:gpt2).
            See `packtool.tokenizer.files.resolve`.
        eos: id appended to every document: `"default"` (the tokenizer's own end-of-text token:
            `eos_token` of `tokenizer_config.json` when there is one, unless it ends a chat
            turn and an end-of-text token is in the vocabulary; else the first of `EOS_NAMES`
            in the vocabulary), `"eos_token"` (`eos_token` of `tokenizer_config.json` even
            where it ends a chat turn: Megatron's end of document, for `--to megatron`; else as
            "default"), an int, or None for none.
        bos: id put before every document: `"auto"` (default: the tokenizer's own rule, what
            its tokenizer.json post-processor puts first, as transformers' `tokenizer(text)`
            does; none for `byte` and tiktoken: packtool.tokenizer.specials), `"default"` (the
            tokenizer's BOS token always, from `bos_token` / `BOS_NAMES`), an int, or None.
        workers: threads for encoding (default: all cores). Sets `RAYON_NUM_THREADS` and
            `FASTOKENS_BPE_THREADS` when they are not set (see `limit_threads`).
        engine: `auto` (the fastest engine that loads this tokenizer and passes the self-check on
            a probe text; the reference library otherwise) or engine names, comma-separated, tried
            in order (`fastokens`, `gigatoken`, `tokenizers`, `tiktoken`, `sentencepiece`).

    Raises:
        ConfigError: unknown spec, unreadable tokenizer, no default EOS/BOS to be found, or no
            named engine that encodes this tokenizer exactly.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"tokenizer must be a non-empty string, got {spec!r}")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    for what, value in (("eos", eos), ("bos", bos)):
        words = ("default", "auto") if what == "bos" else ("default", EOS_TOKEN)
        if isinstance(value, bool) or not (
            value is None or value in words or isinstance(value, (int, np.integer))
        ):
            raise ConfigError(
                f"{what} must be {' or '.join(map(repr, words))}, an integer id or None, "
                f"got {value!r}"
            )
    if spec == "byte":
        if engine.strip() not in ("auto", "byte"):
            raise ConfigError(
                f"tokenizer engine {engine!r} does not apply to 'byte' (built into packtool); "
                "engines encode tokenizer.json and tiktoken tokenizers (use auto)"
            )
        byte = ByteTokenizer(
            kind="byte",
            name="byte",
            base_vocab=BYTE_VOCAB,
            eos_id=BYTE_EOS if eos in ("default", EOS_TOKEN) else eos,  # type: ignore[arg-type]
            bos_id=BYTE_BOS if bos == "default" else None if bos == "auto" else bos,  # type: ignore[arg-type]
            sha256=hashlib.sha256(b"packtool-byte-v1").hexdigest(),
            engine="byte",
            workers=workers,
        )
        byte.chosen_specials, byte.given_ids = chosen_specials(eos, bos), given_ids(eos, bos)
        byte.engine_asked = None if engine == "auto" else engine
        return byte
    files = resolve(spec)
    limit_threads(workers)
    if files.kind == "tiktoken":
        source, digest = _tiktoken_source(files)
        sha_of: Callable[[], str] = lambda: digest  # noqa: E731
    elif files.kind == "sentencepiece":
        source, sha_of = _sentencepiece_source(files)
    else:
        source, sha_of = _hf_source(files)
    ref_name = REFERENCE[files.kind]
    threads = workers or _cpu_count()
    candidates, _ = parse_engines(engine, source.kind, source)
    with ThreadPoolExecutor(2, thread_name_prefix="packtool-load") as pool:
        # The fastest candidate builds first, in a thread: fastokens' builder releases the GIL
        # (~0.4 s for GPT-2), the reference library's holds it. The reference library loads
        # only when needed: for the probe or the vocabulary, unless a record has both.
        stamps = {
            e.name: engine_stamp(e.module, probe_digest()) for e in candidates if not e.reference
        }
        sha = sha_of()
        record = open_record(sha, ref_name)

        def failed(e: Engine) -> str | None:  # recorded as failing here: why (not even built)
            if e.reference or record is None:
                return None
            return record.failed(e.name, stamps[e.name])

        first = next((e for e in candidates if failed(e) is None), None)
        first = first if first is not None and not first.reference else None
        building = pool.submit(first.open, source, threads) if first is not None else None
        loading: Future[Encoder] | None = None
        names = _looked_up(files)
        known = record.vocab(names) if record is not None and source.kind == "hf" else None

        def reference(wait: bool = True) -> Encoder | None:
            nonlocal loading
            if loading is None:
                loading = pool.submit(engine_open, ref_name, source, workers)
            return loading.result() if wait else None

        if not (first and record and record.proven(first.name, stamps[first.name])) or (
            source.kind == "hf" and known is None
        ):
            reference(wait=False)  # the probe or the vocabulary needs it: load it meanwhile
        choice = choose_engine(
            source,
            reference,
            ref_name,
            spec=engine,
            workers=threads,
            added=lambda: _added_tokens(reference(), source),
            proven=lambda e: record is not None and record.proven(e.name, stamps[e.name]),
            failed=failed,
            opener=lambda e: (
                building.result() if e is first and building else e.open(source, threads)
            ),  # type: ignore[union-attr]
        )
        if source.kind == "hf":
            base_vocab, vocab = known if known is not None else _vocab(reference(), source)
        elif source.kind == "sentencepiece":
            base_vocab, vocab = _vocab(reference(), source)
        else:
            base_vocab, vocab = _vocab(None, source)
    if record is not None and (
        choice.checked == "probe" or choice.failed or (source.kind == "hf" and not known)
    ):
        stamp = stamps.get(choice.engine) if choice.checked == "probe" else None
        fails = {n: (v, why) for n, why in choice.failed if (v := stamps.get(n)) is not None}
        record.remember(base_vocab, {n: vocab.get(n) for n in names}, choice.engine, stamp, fails)
    marked = partial(marked_special, source.json)  # parsed only where two names compete
    eos_id, eos_from = default_id("eos", eos, vocab, files, spec, marked)
    if bos == "auto":
        bos_id, bos_from = own_bos(source, files, vocab)
    else:
        bos_id, bos_from = default_id("bos", bos, vocab, files, spec, marked)
    tok = EngineTokenizer(
        choice.encoder,
        source,
        kind=files.kind,
        name=files.name,
        base_vocab=base_vocab,
        eos_id=eos_id,
        bos_id=bos_id,
        sha256=sha,
        engine=choice.engine,
        workers=workers,
    )
    tok.engine_note = choice.note
    tok.file_note = source.note
    tok.engine_check = choice.checked
    tok.special_names = {k: v for k, v in (("eos", eos_from), ("bos", bos_from)) if v}
    tok.folder = files.path.parent if files.path is not None else None
    if (eos, bos) != ("default", "auto"):  # the options changed them
        tok.own_ids = own_ids(source, files, vocab, spec, marked)
    tok.chosen_specials, tok.given_ids = chosen_specials(eos, bos), given_ids(eos, bos)
    tok.engine_asked = None if engine == "auto" else engine
    return tok


def _looked_up(files: TokenizerFiles) -> set[str]:
    """Every token name `_default_id` may look up for these files."""
    names = set(EOS_NAMES) | set(BOS_NAMES) | set(END_OF_TEXT)
    if files.config is not None:
        names |= {
            t for t in (files.config.token("eos_token"), files.config.token("bos_token")) if t
        }
    return names


def engine_open(name: str, source: Source, workers: int | None) -> Encoder:
    """Open engine `name` for `source`, as a `ConfigError` naming the file when it refuses."""
    try:
        return engine_entry(name).open(source, workers or _cpu_count())
    except EngineRefused as exc:
        what = {"hf": "Hugging Face tokenizer.json", "tiktoken": "tiktoken ranks file"}.get(
            source.kind, "SentencePiece model"
        )
        raise ConfigError(
            f"{source.where}: not a {what} ({exc}); check the file (re-download it) or "
            "pass another tokenizer"
        ) from None


def _hf_source(files: TokenizerFiles) -> tuple[Source, Callable[[], str]]:
    path = files.path
    assert path is not None
    try:
        data = storage.read_bytes(path)
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the tokenizer file ({exc}); check it") from None
    if nesting_depth(data) > MAX_DEPTH:  # gigatoken's parser would overflow the stack (SIGSEGV)
        raise ConfigError(
            f"{path}: not a usable tokenizer.json (nested deeper than {MAX_DEPTH} levels, which "
            "the tokenizers library refuses too); check the file (re-download it)"
        )
    text, note = without_unapplied(text)  # truncation, padding, BPE dropout
    # The digest as a function: load_tokenizer takes it once the engine has started building.
    source = Source(kind="hf", where=str(path), json=text, note=note)
    return source, lambda: hashlib.sha256(data).hexdigest()


def _vocab(reference: Encoder | None, source: Source) -> tuple[int, dict[str, int]]:
    """(one more than the largest id, the token texts EOS/BOS defaults are looked up in)."""
    if source.kind == "sentencepiece":
        assert reference is not None
        sp = reference.sp  # type: ignore[attr-defined]
        vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
        for key, special in ((SP_BOS, sp.bos_id()), (SP_EOS, sp.eos_id())):
            if special >= 0:  # the model's own BOS / EOS, whatever their pieces are called
                vocab[key] = special
        return sp.get_piece_size(), vocab
    if source.kind == "hf":
        assert reference is not None
        vocab = reference.tok.get_vocab(with_added_tokens=True)  # type: ignore[attr-defined]
        return max(vocab.values(), default=-1) + 1, vocab
    specials = source.specials or {}
    ids = [*(source.ranks or {}).values(), *specials.values()]
    return max(ids, default=-1) + 1, dict(specials)


def _added_tokens(reference: Encoder, source: Source) -> list[str]:
    """The added-token texts (special or not), for the engine probe."""
    if source.kind == "hf":
        decoder = reference.tok.get_added_tokens_decoder()  # type: ignore[attr-defined]
        return [t.content for _, t in sorted(decoder.items())]
    if source.kind == "sentencepiece":
        # Control pieces (never matched in the text) and user-defined ones (always matched, as
        # one piece: Mistral v3 / v7's `[REF]`, `[REFERENCE_DOC_3]`; gigatoken's conversion
        # splits them, and a probe without them passed it)
        sp = reference.sp  # type: ignore[attr-defined]
        control = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.IsControl(i)]
        return control + pieces_of_type(sp.serialized_model_proto(), USER_DEFINED)
    return list(source.specials or {})


def _sentencepiece_source(files: TokenizerFiles) -> tuple[Source, Callable[[], str]]:
    path = files.path
    assert path is not None
    try:
        data = storage.read_bytes(path)
    except OSError as exc:
        raise ConfigError(
            f"{path}: cannot read the SentencePiece model ({exc}); check it"
        ) from None
    source = Source(kind="sentencepiece", where=str(path), path=str(path))
    return source, lambda: hashlib.sha256(data).hexdigest()


def _tiktoken_source(files: TokenizerFiles) -> tuple[Source, str]:
    import tiktoken

    if files.path is not None:
        from tiktoken.load import load_tiktoken_bpe

        path = files.path
        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as exc:  # malformed lines: ValueError, binascii.Error, ...
            raise ConfigError(
                f"{path}: not a tiktoken ranks file ({exc}); check the file (re-download it)"
            ) from None
        if not ranks:
            raise ConfigError(f"{path}: tiktoken ranks file is empty")
        check_vocab_fits(str(path), max(ranks.values()) + 2)  # + <|endoftext|>, added below
        sha = _sha256_file(path)
        known = openai_encoding(sha, ranks)  # cl100k_base.tiktoken splits as tiktoken's does
        if known is not None:
            _, pattern, specials = known
            note = ""
        else:
            pattern, specials = GPT2_PATTERN, {"<|endoftext|>": max(ranks.values()) + 1}
            note = (
                f"{path.name} is not the ranks file of an OpenAI encoding (r50k, p50k, cl100k, "
                "o200k): a ranks file names no split pattern, so GPT-2's is used, and "
                f"<|endoftext|> is id {specials['<|endoftext|>']} (after the last rank); a "
                "tokenizer made with another pattern needs its tokenizer.json"
            )
        source = Source(
            kind="tiktoken", where=str(path), ranks=ranks, pattern=pattern,
            specials=specials, path=str(path), note=note,
        )  # fmt: skip
    else:
        target = files.encoding or ""
        known = tiktoken.list_encoding_names()
        if target not in known:
            raise ConfigError(
                f"unknown tiktoken encoding {target!r}; known: {', '.join(known)} "
                "(or pass tiktoken:PATH.tiktoken for a local ranks file)"
            )
        try:
            enc = tiktoken.get_encoding(target)
        except Exception as exc:  # network or cache failure
            raise ConfigError(
                f"cannot load tiktoken encoding {target!r}: it is not in tiktoken's cache and "
                f"could not be downloaded ({type(exc).__name__}); pass tiktoken:PATH.tiktoken "
                "with a local ranks file instead"
            ) from None
        h = hashlib.sha256(enc._pat_str.encode())
        for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(token)
            h.update(rank.to_bytes(4, "little"))
        sha = h.hexdigest()
        source = Source(
            kind="tiktoken", where=target, ranks=dict(enc._mergeable_ranks),
            pattern=enc._pat_str, specials=dict(enc._special_tokens),
        )  # fmt: skip
    return source, sha


def limit_rayon_threads(workers: int | None) -> None:
    """Kept for callers of earlier releases: `packtool.tokenizer.engines.limit_threads`."""
    limit_threads(workers)
