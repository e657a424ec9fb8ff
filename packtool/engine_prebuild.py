"""Starting fastokens' build of a local tokenizer.json before the rest of the tokenizer loads.

fastokens builds GPT-2's tables in ~0.35 s (GIL released), and that build is the critical path
of a command's start-up. `load_tokenizer` starts it only after importing numpy and packtool's
tokenizer modules and reading the file (~0.05 s, longer while another thread imports numba).
`start(spec, engine)` starts it first: it reads the file and builds in a thread, importing
nothing but fastokens (~3 ms). The CLI calls it just before `load_tokenizer`.
`take(text)`, in fastokens' opener, hands over the engine built from exactly that text (the
file as `load_tokenizer` read it), and the opener builds as before for any other text, a
failed early build, or none. The engine choice, the self-check and every error are unchanged:
only the build's start moves.

Only a path to an existing `.json` file, with `--tokenizer-engine` auto or naming fastokens
first, is built early; hub ids, folders and ranks files load as before. At most one early build
is held: a second `start` replaces the first.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_held: list[tuple[str, Future]] = []  # (the file's text, its build), at most one


def start(spec: str, engine: str = "auto") -> bool:
    """Start building `spec` with fastokens in a thread, if it is a local tokenizer.json that
    `engine` would open with fastokens first; whether a build started."""
    names = [n.strip() for n in str(engine).split(",") if n.strip()]
    if names not in (["auto"],) and names[:1] != ["fastokens"]:
        return False
    path = Path(spec)
    if path.suffix != ".json" or not path.is_file():
        return False
    try:
        import fastokens

        text = path.read_bytes().decode("utf-8")
    except (ImportError, OSError, UnicodeDecodeError):  # load_tokenizer says what is wrong
        return False
    pool = ThreadPoolExecutor(1, thread_name_prefix="packtool-prebuild")
    future = pool.submit(fastokens.Tokenizer.from_json_str, text)
    pool.shutdown(wait=False)
    with _lock:
        _held[:] = [(text, future)]
    return True


def take(text: str) -> Any | None:
    """The fastokens tokenizer `start` built from exactly `text` (waiting for its build), or
    None: none started, another text, or the build failed (the caller then builds and reports
    the error as it always did)."""
    with _lock:
        if not _held or _held[0][0] != text:
            return None
        _, future = _held.pop()
    try:
        return future.result()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # a Rust panic (pyo3's PanicException) is a BaseException
        return None
