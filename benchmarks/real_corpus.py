"""A JSONL corpus of real text found on this machine, made at bench time (never committed).

Sources, in this order, until the target size is reached: the troff sources of the system's man
pages (`/usr/share/man`, decompressed; English and every translation installed), then the Python
standard library's `.py` sources, then the `.py`, `.rst`, `.md` and `.txt` files of the installed
packages (site-packages). One document per file, `{"text": ...}` per line, files in sorted order,
so the same machine gives the same corpus. Nothing is repeated: repeated text would flatter
tokenizers that cache (fastokens caches pre-tokenized pieces) and compressors alike.
"""

from __future__ import annotations

import gzip
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import orjson

MAN = Path("/usr/share/man")
TEXT_SUFFIXES = (".py", ".rst", ".md", ".txt")


def _man_pages() -> Iterator[Path]:
    if MAN.is_dir():
        yield from sorted(p for p in MAN.rglob("*") if p.is_file() and not p.is_symlink())


def _stdlib() -> Iterator[Path]:
    std = Path(sysconfig.get_paths()["stdlib"])
    yield from sorted(p for p in std.rglob("*.py") if "site-packages" not in p.parts)


def _site_packages() -> Iterator[Path]:
    site = Path(sysconfig.get_paths()["purelib"])
    yield from sorted(p for p in site.rglob("*") if p.suffix in TEXT_SUFFIXES and p.is_file())


def _read(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        text = data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        return None
    return text if text.strip() else None


def build(path: Path, min_bytes: int) -> dict[str, int]:
    """Write `path` (once: an existing file of at least `min_bytes` is kept); return its counts.

    Raises:
        SystemExit: the machine does not hold `min_bytes` of such text.
    """
    if path.exists() and path.stat().st_size >= min_bytes:
        return {"bytes": path.stat().st_size, "documents": sum(1 for _ in open(path, "rb"))}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    written = docs = 0
    counts = {"man": 0, "stdlib": 0, "site-packages": 0}
    with open(tmp, "wb") as f:
        for kind, paths in (("man", _man_pages()), ("stdlib", _stdlib()), ("site-packages", _site_packages())):  # fmt: skip
            for p in paths:
                text = _read(p)
                if text is None:
                    continue
                line = orjson.dumps({"text": text}) + b"\n"
                f.write(line)
                written += len(line)
                docs += 1
                counts[kind] += 1
                if written >= min_bytes:
                    break
            if written >= min_bytes:
                break
    if written < min_bytes:
        tmp.unlink()
        raise SystemExit(f"only {written / 1e6:.0f} MB of real text found on this machine")
    tmp.replace(path)
    print(
        f"built {path} ({written / 1e6:.0f} MB, {docs:,} documents: {counts['man']:,} man pages, "
        f"{counts['stdlib']:,} stdlib files, {counts['site-packages']:,} site-packages files)"
    )
    return {"bytes": written, "documents": docs}
