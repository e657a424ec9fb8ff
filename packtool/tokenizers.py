"""Tokenizers behind one interface: `byte`, a Hugging Face `tokenizer.json`, a tiktoken encoding.

`Tokenizer.encode_batch(texts)` returns a flat id array plus per-document lengths with BOS/EOS
added; the ids between them are exactly what the underlying library returns for the text
(`tokenizers.Tokenizer.encode(text, add_special_tokens=False).ids`,
`tiktoken.Encoding.encode_ordinary(text)`, or the text's UTF-8 bytes). Encoding runs on all
cores: the Rust libraries release the GIL.
"""

from __future__ import annotations

import array
import hashlib
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError

BYTE_VOCAB = 258
"""`byte`: ids 0-255 are the UTF-8 bytes, 256 is EOS, 257 is BOS (both always reserved)."""
BYTE_EOS = 256
BYTE_BOS = 257

# Names tried, in order, when a tokenizer's default EOS / BOS is asked for.
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "[EOS]", "<|eot_id|>", "[SEP]")
BOS_NAMES = ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]", "[CLS]")

# GPT-2's pre-tokenizer split pattern (tiktoken's r50k_base / gpt2).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


@dataclass(frozen=True, kw_only=True)
class TokenizerIdentity:
    """What a tokenizer is, recorded in tokenized Parquet and `index.json`.

    Two identities match when everything but `name` is equal (the same file under another path
    is the same tokenizer).
    """

    kind: str
    """`byte`, `hf` or `tiktoken`."""
    name: str
    """What the user passed (`byte`, a tokenizer.json path, `tiktoken:gpt2`)."""
    vocab_size: int
    """One more than the largest id that can appear (EOS/BOS included)."""
    eos_id: int | None
    bos_id: int | None
    sha256: str
    """Hash of the vocabulary (the file, or the ranks) so a changed tokenizer is noticed."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenizerIdentity:
        return cls(
            **{k: d.get(k) for k in ("kind", "name", "vocab_size", "eos_id", "bos_id", "sha256")}
        )

    def matches(self, other: TokenizerIdentity) -> bool:
        return (self.kind, self.vocab_size, self.eos_id, self.bos_id, self.sha256) == (
            other.kind,
            other.vocab_size,
            other.eos_id,
            other.bos_id,
            other.sha256,
        )


def token_dtype(vocab_size: int) -> np.dtype:
    """`uint16` when every id fits (vocab_size <= 65,536, i.e. ids below 65,536), else `uint32`."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}")
    if vocab_size > 2**32:
        raise ConfigError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


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
        workers: int | None = None,
    ) -> None:
        for what, value in (("eos", eos_id), ("bos", bos_id)):
            if value is not None and not 0 <= value < 2**32:
                raise ConfigError(f"{what} id must be in [0, 2**32), got {value}")
        vocab = max(base_vocab, (eos_id or 0) + 1, (bos_id or 0) + 1)
        self.identity = TokenizerIdentity(
            kind=kind, name=name, vocab_size=vocab, eos_id=eos_id, bos_id=bos_id, sha256=sha256
        )
        self.dtype = token_dtype(vocab)
        self.workers = workers or _cpu_count()

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
        flat, lengths = _flatten(raw)
        return _add_specials(flat, lengths, self.identity.bos_id, self.identity.eos_id, self.dtype)

    def encode(self, text: str) -> np.ndarray:
        """One document (BOS/EOS added)."""
        return self.encode_batch([text])[0]

    def _library_encode(self, texts: Sequence[str]) -> Iterable[list[int]]:
        raise NotImplementedError

    def __repr__(self) -> str:
        i = self.identity
        return f"Tokenizer({i.kind}:{i.name}, vocab={i.vocab_size}, eos={i.eos_id}, bos={i.bos_id})"


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

    def _library_encode(self, texts: Sequence[str]) -> Iterable[list[int]]:
        # The generic path (per-document id lists); tests check the fast path against it.
        return [list(t.encode("utf-8")) for t in texts]


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` tokenizer from a `tokenizer.json` file."""

    def __init__(self, tok: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.tok = tok
        self._encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

    def _library_encode(self, texts: Sequence[str]) -> Iterable[list[int]]:
        # Rust encodes on all cores (GIL released); `.ids` lists are made in finish_batch.
        encodings = self._encode(list(texts), add_special_tokens=False)
        return (e.ids for e in encodings)


class TiktokenTokenizer(Tokenizer):
    """A tiktoken `Encoding` (`encode_ordinary`: special-token text is encoded as plain text)."""

    def __init__(self, enc: Any, **kw: Any) -> None:
        super().__init__(**kw)
        self.enc = enc
        self._pool: ThreadPoolExecutor | None = None

    def _library_encode(self, texts: Sequence[str]) -> Iterable[list[int]]:
        workers = self.workers
        if workers <= 1 or len(texts) < 2:
            return [self.enc.encode_ordinary(t) for t in texts]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(workers, thread_name_prefix="packtool-tiktoken")
        # One task per slice, not per text: fewer futures; the Rust core releases the GIL.
        step = -(-len(texts) // (workers * 4))
        slices = [texts[i : i + step] for i in range(0, len(texts), step)]
        encode = self.enc.encode_ordinary
        return list(chain.from_iterable(self._pool.map(lambda s: [encode(t) for t in s], slices)))

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pool": None}  # a thread pool does not pickle


def _flatten(ids: Iterable[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    # array.array("I").extend(list) converts in C: the cheapest way from Python int lists to
    # one flat buffer (faster than np.fromiter or np.concatenate of per-document arrays).
    flat = array.array("I")
    lengths = array.array("q")
    for doc in ids:
        lengths.append(len(doc))
        flat.extend(doc)
    return np.frombuffer(flat, dtype=np.uint32), np.frombuffer(lengths, dtype=np.int64)


def _add_specials(
    flat: np.ndarray, lengths: np.ndarray, bos: int | None, eos: int | None, dtype: np.dtype
) -> tuple[np.ndarray, np.ndarray]:
    n_special = (bos is not None) + (eos is not None)
    if n_special == 0:
        return flat.astype(dtype, copy=False), lengths
    out_lengths = lengths + n_special
    ends = np.cumsum(out_lengths)  # exclusive end of each document in the output
    starts = ends - out_lengths
    out = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    # A boolean mask assignment is ~8x faster than scattering through an index array.
    plain = np.ones(len(out), dtype=bool)
    if bos is not None:
        out[starts] = bos
        plain[starts] = False
    if eos is not None:
        out[ends - 1] = eos
        plain[ends - 1] = False
    out[plain] = flat
    return out, out_lengths


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def load_tokenizer(
    spec: str,
    *,
    eos: int | str | None = "default",
    bos: int | str | None = None,
    workers: int | None = None,
) -> Tokenizer:
    """Load a tokenizer.

    Args:
        spec: `byte`; a `tokenizer.json` path (or `hf:PATH`); `tiktoken:NAME` (an encoding in
            tiktoken's cache, e.g. `tiktoken:gpt2`) or `tiktoken:PATH` (a local ranks file such as
            `gpt2.tiktoken`, loaded offline with GPT-2's split pattern).
        eos: id appended to every document: `"default"` (the tokenizer's own end-of-text token),
            an int, or None for none.
        bos: id put before every document: None (default), `"default"` or an int.
        workers: threads for encoding (default: all cores). For a Hugging Face tokenizer this
            sets `RAYON_NUM_THREADS` when it is not set (see `limit_rayon_threads`).

    Raises:
        ConfigError: unknown spec, unreadable tokenizer, or no default EOS/BOS to be found.
    """
    if not isinstance(spec, str) or not spec:
        raise ConfigError(f"tokenizer must be a non-empty string, got {spec!r}")
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    for what, value in (("eos", eos), ("bos", bos)):
        if isinstance(value, bool) or not (
            value is None or value == "default" or isinstance(value, (int, np.integer))
        ):
            raise ConfigError(f"{what} must be 'default', an integer id or None, got {value!r}")
    if spec == "byte":
        return ByteTokenizer(
            kind="byte",
            name="byte",
            base_vocab=BYTE_VOCAB,
            eos_id=BYTE_EOS if eos == "default" else eos,  # type: ignore[arg-type]
            bos_id=BYTE_BOS if bos == "default" else bos,  # type: ignore[arg-type]
            sha256=hashlib.sha256(b"packtool-byte-v1").hexdigest(),
            workers=workers,
        )
    if spec.startswith("tiktoken:"):
        return _load_tiktoken(spec, spec.removeprefix("tiktoken:"), eos, bos, workers)
    path = Path(spec.removeprefix("hf:"))
    if spec.startswith("hf:") or path.name.endswith(".json") or path.exists():
        return _load_hf(spec, path, eos, bos, workers)
    raise ConfigError(
        f"unknown tokenizer {spec!r}; use 'byte', a tokenizer.json path (or hf:PATH), "
        "'tiktoken:NAME' (e.g. tiktoken:gpt2) or 'tiktoken:PATH.tiktoken'"
    )


def _pick(
    which: str, value: int | str | None, vocab: dict[str, int], names: tuple[str, ...], spec: str
) -> int | None:
    if value != "default":
        return value  # type: ignore[return-value]
    for name in names:
        if name in vocab:
            return vocab[name]
    flag = "--eos-id N or --no-eos" if which == "eos" else "--bos-id N"
    raise ConfigError(
        f"tokenizer {spec!r} has no default {which.upper()} token (looked for "
        f"{', '.join(names)}); pass {flag}"
    )


def limit_rayon_threads(workers: int | None) -> None:
    """Size the Rust `tokenizers` thread pool to `workers`, unless the user already chose.

    The pool is rayon's global pool: process-wide, built on the library's first parallel encode
    from `RAYON_NUM_THREADS` (read then, not at import), and never resized. So this takes effect
    only before that first encode, and an explicit `RAYON_NUM_THREADS` always wins.
    """
    if workers is not None and "RAYON_NUM_THREADS" not in os.environ:
        os.environ["RAYON_NUM_THREADS"] = str(workers)


def _load_hf(spec: str, path: Path, eos: Any, bos: Any, workers: int | None) -> Tokenizer:
    from tokenizers import Tokenizer as HFTok

    limit_rayon_threads(workers)

    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ConfigError(f"tokenizer file {str(path)!r} does not exist")
    try:
        tok = HFTok.from_file(str(path))
    except Exception as exc:  # the library raises plain Exception on a bad file
        raise ConfigError(f"{path}: not a Hugging Face tokenizer.json ({exc})") from None
    vocab = tok.get_vocab(with_added_tokens=True)
    return HFTokenizer(
        tok,
        kind="hf",
        name=str(path),
        base_vocab=max(vocab.values(), default=-1) + 1,
        eos_id=_pick("eos", eos, vocab, EOS_NAMES, spec),
        bos_id=_pick("bos", bos, vocab, BOS_NAMES, spec),
        sha256=_sha256_file(path),
        workers=workers,
    )


def _load_tiktoken(spec: str, target: str, eos: Any, bos: Any, workers: int | None) -> Tokenizer:
    import tiktoken

    path = Path(target)
    if path.suffix == ".tiktoken" or path.is_file():
        from tiktoken.load import load_tiktoken_bpe

        if not path.is_file():
            raise ConfigError(f"tiktoken ranks file {target!r} does not exist")
        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as exc:  # malformed lines: ValueError, binascii.Error, ...
            raise ConfigError(f"{path}: not a tiktoken ranks file ({exc})") from None
        if not ranks:
            raise ConfigError(f"{path}: tiktoken ranks file is empty")
        enc = tiktoken.Encoding(
            name=path.stem,
            pat_str=GPT2_PATTERN,
            mergeable_ranks=ranks,
            special_tokens={"<|endoftext|>": max(ranks.values()) + 1},
        )
        sha = _sha256_file(path)
        name = str(path)
    else:
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
        h = hashlib.sha256(enc.pat_str.encode())
        for token, rank in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(token)
            h.update(rank.to_bytes(4, "little"))
        sha = h.hexdigest()
        name = target
    specials = dict(enc._special_tokens)
    return TiktokenTokenizer(
        enc,
        kind="tiktoken",
        name=name,
        base_vocab=enc.n_vocab,
        eos_id=_pick("eos", eos, specials, EOS_NAMES, spec),
        bos_id=_pick("bos", bos, specials, BOS_NAMES, spec),
        sha256=sha,
        workers=workers,
    )
