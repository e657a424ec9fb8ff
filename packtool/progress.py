"""A small progress bar (tqdm) for long steps: documents, tokens and MB/s of input.

Disabled when stderr is not a terminal or when `PACKTOOL_NO_PROGRESS=1`, so logs and tests stay
clean. Usage::

    with Progress("tokenize") as bar:
        bar.update(docs=len(batch), tokens=n_tokens, nbytes=batch.nbytes)
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any


def progress_enabled() -> bool:
    """True when a bar should be drawn: stderr is a TTY and `PACKTOOL_NO_PROGRESS` is not 1."""
    if os.environ.get("PACKTOOL_NO_PROGRESS", "") == "1":
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # closed or replaced stream
        return False


class Progress:
    """Counts documents, tokens and input bytes; draws a tqdm bar when enabled.

    Args:
        desc: label in front of the bar.
        enabled: force on/off; default `progress_enabled()`.
        total_docs: documents expected, when known (gives an ETA).
    """

    def __init__(self, desc: str, *, enabled: bool | None = None, total_docs: int | None = None):
        self.docs = 0
        self.tokens = 0
        self.nbytes = 0
        self.start = time.perf_counter()
        self._last_postfix = 0.0
        self._bar: Any = None
        if enabled if enabled is not None else progress_enabled():
            from tqdm import tqdm

            self._bar = tqdm(
                desc=desc,
                total=total_docs,
                unit=" docs",
                unit_scale=True,
                dynamic_ncols=True,
                mininterval=0.5,
                file=sys.stderr,
                leave=False,
            )

    def update(self, *, docs: int = 0, tokens: int = 0, nbytes: int = 0) -> None:
        self.docs += docs
        self.tokens += tokens
        self.nbytes += nbytes
        if self._bar is None:
            return
        self._bar.update(docs)
        now = time.perf_counter()
        if now - self._last_postfix >= 0.5:
            self._last_postfix = now
            self._bar.set_postfix_str(
                f"{_si(self.tokens)} tokens, {self.mb_per_s:.1f} MB/s", refresh=False
            )

    def note(self, text: str) -> None:
        """Show `text` after the counts (a driver's word on where the work is)."""
        if self._bar is not None:
            self._bar.set_postfix_str(text, refresh=True)

    def write(self, text: str) -> None:
        """`text` as a line on stderr, the bar (if drawn) redrawn below it."""
        if self._bar is not None:
            self._bar.write(text, file=sys.stderr)
        else:
            print(text, file=sys.stderr, flush=True)

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    @property
    def mb_per_s(self) -> float:
        return self.nbytes / 1e6 / max(self.elapsed, 1e-9)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _si(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}"
    return str(int(n))
