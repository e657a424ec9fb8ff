"""The tokenizer identity a dataset records, and the token dtype its vocabulary size implies.

Written into tokenized Parquet's metadata and `index.json` (`TokenizerIdentity.to_dict`), read
back by every stage that checks two datasets or inputs were made with the same tokenizer (pack,
verify, mixtures, the loader). Part of the format, so it needs no tokenizer library: the loader
and verify read it without loading packtool/tokenizer/.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from packtool.errors import ConfigError

IDENTITY_FIELDS = ("kind", "vocab_size", "eos_id", "bos_id", "sha256")
"""The fields two identities must share to give the same ids (not `name`, not `engine`)."""


@dataclass(frozen=True, kw_only=True)
class TokenizerIdentity:
    """What a tokenizer is, recorded in tokenized Parquet and `index.json`.

    Two identities match when everything but `name` and `engine` is equal (the same file under
    another path is the same tokenizer, and every engine gives the same ids).
    """

    kind: str
    """`byte`, `hf`, `tiktoken` or `sentencepiece`."""
    name: str
    """What the user passed (`byte`, a tokenizer.json path, `tiktoken:gpt2`)."""
    vocab_size: int
    """One more than the largest id that can appear (EOS/BOS included)."""
    eos_id: int | None
    bos_id: int | None
    sha256: str
    """Hash of the vocabulary (the file, or the ranks) so a changed tokenizer is noticed."""
    engine: str | None = None
    """The library that encoded (`fastokens`, `gigatoken`, `tokenizers`, `tiktoken`,
    `sentencepiece`, `byte`); None when not
    recorded. Not compared by `matches`: every engine gives the reference library's ids."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TokenizerIdentity:
        keys = ("kind", "name", "vocab_size", "eos_id", "bos_id", "sha256", "engine")
        return cls(**{k: d.get(k) for k in keys})

    def matches(self, other: TokenizerIdentity) -> bool:
        return all(getattr(self, f) == getattr(other, f) for f in IDENTITY_FIELDS)


def describe_tokenizer(identity: dict[str, Any], names: dict[str, str] | None = None) -> str:
    """One line for summaries: `hf:x.json (engine fastokens, vocab 50,257, eos 50256 <|endoftext|>, bos none)`."""
    names = names or {}

    def special(which: str) -> str:
        value = identity.get(f"{which}_id")
        if value is None:
            return f"{which} none" + (f" {names[which]}" if names.get(which) else "")
        return f"{which} {value}" + (f" {names[which]}" if names.get(which) else "")

    vocab = identity.get("vocab_size")
    return (
        f"{identity.get('kind')}:{identity.get('name')} (engine {identity.get('engine') or 'unknown'}, "
        f"vocab {vocab:,}, {special('eos')}, {special('bos')})"
        if isinstance(vocab, int)
        else f"{identity.get('kind')}:{identity.get('name')}"
    )


def token_dtype(vocab_size: int) -> np.dtype:
    """`uint16` when every id fits (vocab_size <= 65,536, i.e. ids below 65,536), else `uint32`."""
    if vocab_size < 1:
        raise ConfigError(f"vocab_size must be >= 1, got {vocab_size}")
    if vocab_size > 2**32:
        raise ConfigError(f"vocab_size {vocab_size} does not fit uint32 token ids")
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)
