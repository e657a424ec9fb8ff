"""Which of OpenAI's encodings a tiktoken ranks file is, with that encoding's split pattern and
special tokens.

A `.tiktoken` file holds ranks only: its split pattern and special tokens live in code
(`tiktoken_ext.openai_public`). packtool split every ranks file with GPT-2's pattern and put
`<|endoftext|>` after the last rank, so `cl100k_base.tiktoken` (GPT-4's) gave other ids than
tiktoken's `cl100k_base` and an EOS of 100256 where tiktoken's is 100257. A file is now known by
its sha256, the digest tiktoken itself checks its downloads against, and gets the pattern and
special tokens of tiktoken's own constructor for it. Both are read from tiktoken (each
constructor is called with a loader that hands back the hash it asks for, or the ranks already
read), so nothing of OpenAI's is copied here and no file is downloaded.

Records in: a ranks file's sha256 and its ranks. Out: (encoding name, pattern, special tokens),
or None for a file that is none of them.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_LOCK = threading.Lock()


class _Asked(Exception):
    def __init__(self, expected_hash: str | None) -> None:
        self.expected_hash = expected_hash


def _with_loader(loader: Any, name: str) -> Any:
    """Constructor `name` of tiktoken_ext.openai_public run with `loader` for its ranks file."""
    from tiktoken_ext import openai_public

    with _LOCK:
        real = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = loader
        try:
            return openai_public.ENCODING_CONSTRUCTORS[name]()
        finally:
            openai_public.load_tiktoken_bpe = real


@functools.lru_cache(maxsize=1)
def known_files() -> dict[str, str]:
    """sha256 of each OpenAI ranks file -> the first encoding built from it (r50k_base,
    p50k_base, cl100k_base, o200k_base with tiktoken 0.x; later ones share those files)."""
    from tiktoken_ext import openai_public

    def ask(_path: str, expected_hash: str | None = None) -> Any:
        raise _Asked(expected_hash)

    out: dict[str, str] = {}
    for name in openai_public.ENCODING_CONSTRUCTORS:
        try:
            _with_loader(ask, name)
        except _Asked as asked:
            if asked.expected_hash:
                out.setdefault(asked.expected_hash, name)
        except Exception:  # noqa: BLE001 - gpt2's own loader, or a layout tiktoken changed
            continue
    return out


def openai_encoding(sha256: str, ranks: dict[bytes, int]) -> tuple[str, str, dict[str, int]] | None:
    """(name, split pattern, special tokens) of the OpenAI encoding whose ranks file has
    `sha256`; None for any other file (or a tiktoken whose constructors cannot be read)."""
    try:
        name = known_files().get(sha256)
        if name is None:
            return None
        spec = _with_loader(lambda *_a, **_k: ranks, name)
        return name, spec["pat_str"], dict(spec["special_tokens"])
    except Exception:  # noqa: BLE001 - a tiktoken laid out otherwise: the file is "unknown"
        return None
