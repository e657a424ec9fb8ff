"""Helpers every benchmark shares: timing, peak RSS, a markdown table, and its block in
docs/benchmarks.md."""

from __future__ import annotations

import compileall
import re
import resource
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
"""Where every benchmark writes its figures; the README links here."""


def compile_sources() -> None:
    """Byte-compile the project's own modules (packtool, loader, attention) into their
    `__pycache__`, as `pip install` does for an installed package, before a benchmark times
    child processes. An editable install is never compiled, and where PYTHONDONTWRITEBYTECODE
    is set (this box sets it) every `packtool` process compiled its ~100 modules from source
    each time (~0.2 s of its start-up), while the libraries it is compared with ran from the
    bytecode pip wrote at install. Python reads these caches whatever that variable says."""
    for package in ("packtool", "loader", "attention"):
        compileall.compile_dir(ROOT / package, quiet=1)


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of `repeat` wall-clock timings of `fn()`, in seconds (least noise on a shared box)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def peak_rss_mib(children: bool = False) -> float:
    """Peak resident set size of this process (or of its waited-for children), in MiB."""
    who = resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF
    return resource.getrusage(who).ru_maxrss / 1024.0


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def publish(name: str, body: str, docs: bool = True) -> None:
    """Print a benchmark's block and, when `docs`, write it into docs/benchmarks.md."""
    print(body)
    if docs:
        update_block(name, body)
        print(f"\ndocs/benchmarks.md block `{name}` updated.")


def update_block(name: str, body: str) -> None:
    """Replace the text between `<!-- bench:NAME:start -->` and `<!-- bench:NAME:end -->` in
    docs/benchmarks.md (the markers are appended at the end when absent)."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = BENCHMARKS.read_text(encoding="utf-8")
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    BENCHMARKS.write_text(text, encoding="utf-8")
