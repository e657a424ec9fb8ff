"""The input formats, one registry: a file's format from its name, and its reader.

Each format is one module (packtool/read/text.py, jsonl.py, parquet.py) with its suffixes and
its reader; `FORMATS` lists them, and everything that asks what a file is (reading, the
partition plan, the fine-tuning readers, preflight) asks `format_of`. Adding a format is one
module and one entry here (docs/CONTRACTS.md, "Adding a reader format").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from packtool.read import jsonl, parquet, text
from packtool.read.compressed import COMPRESSIONS, compression_suffix, read_errors
from packtool.read.documents import Doc, ReadConfig, SkipCounter
from packtool.read.lines import TO_END, range_start
from packtool.storage.local import file_name


@dataclass(frozen=True)
class Format:
    """One input format."""

    name: str
    """`jsonl`, `parquet` or `text`: what plans, records and messages call it."""
    label: str
    """`JSONL`, `Parquet` or `text`: what prose calls it."""
    suffixes: tuple[str, ...]
    """Names this format reads when a file is named explicitly or matched by a glob."""
    walked: tuple[str, ...]
    """Names picked up when walking a folder (`.json` is read when named, not walked)."""
    read: Callable[..., Iterator[Doc]]
    """`read(path, config, skips, start, end)`: the documents of the file or of one piece (bytes
    of JSONL, row groups of Parquet: packtool/engines/plan.py decides where a file is cut)."""


def _read_text(path: Path, config: ReadConfig, skips: SkipCounter, start: int, end: int):
    return text.read_text(path, config, skips)  # one document a file: never cut


JSONL = Format(
    "jsonl",
    "JSONL",
    jsonl.JSONL_SUFFIXES + jsonl.JSON_SUFFIXES,
    jsonl.JSONL_SUFFIXES,
    jsonl.read_jsonl,
)
PARQUET = Format(
    "parquet",
    "Parquet",
    parquet.PARQUET_SUFFIXES,
    parquet.PARQUET_SUFFIXES,
    parquet.read_parquet,
)
TEXT = Format("text", "text", text.TEXT_SUFFIXES, text.TEXT_SUFFIXES, _read_text)
FORMATS = (JSONL, PARQUET, TEXT)
"""Every format, in the order a name is matched against them."""
FALLBACK = TEXT
"""A file named explicitly with no known suffix is read as plain text, one document a file."""

KNOWN_SUFFIXES = tuple(s for f in FORMATS for s in f.walked)
"""Suffixes picked up when walking a folder. A file named explicitly (or matched by a glob) with
any other suffix is read as plain text, one document per file (decompressed when it ends in
`.gz` / `.zst`), except `.json` (below)."""


RECORD_SUFFIXES = tuple(s for f in FORMATS if f is not TEXT for s in f.walked)
"""Suffixes of the walked files that hold records (JSONL, Parquet): beside them a folder's
`README.md` is a dataset card, passed over (`storage.passed_over.dataset_cards`)."""


def _known_short() -> str:
    plain = dict.fromkeys(s.removesuffix(compression_suffix(s)) for s in KNOWN_SUFFIXES)
    packed = [f.label for f in FORMATS if any(compression_suffix(s) for s in f.walked)]
    also = f" ({' and '.join(packed)} also {' / '.join(COMPRESSIONS)})" if packed else ""
    return ", ".join(plain) + also


KNOWN_SHORT = _known_short()
"""The walked suffixes as an error message names them: `.jsonl, .ndjson, .parquet, .txt, .md,
.text (JSONL and text also .gz / .zst)`."""


def format_of(path: Path) -> Format:
    """The format that reads `path`, from its name (`FALLBACK` for any other name; a web URL's
    query and fragment are not part of it: `storage.file_name`)."""
    name = file_name(path).lower()
    return next((f for f in FORMATS if name.endswith(f.suffixes)), FALLBACK)


def file_kind(path: Path) -> str:
    """`jsonl`, `parquet` or `text`, from the file name (`format_of(path).name`)."""
    return format_of(path).name


OFFSET_UNITS = {"jsonl": "byte", "json_array": "item", "text": "file"}
"""The document-id offset unit per `raw_kind` (packtool/read/docids.py); Parquet kinds count
rows. Fine-tuning records take their file type's (`engines.preflight.doc_id_units`)."""


def raw_kind(path: Path) -> str:
    """How a corpus file reads: `file_kind`, with a JSON array told from JSON Lines
    (`OFFSET_UNITS`)."""
    kind = file_kind(path)
    if kind == "jsonl" and jsonl.json_array_file(path):  # reads the file's first bytes
        kind = "json_array"
    return kind


def sequential_start(path: Path, start: int) -> int | None:
    """Where the reader of `path`'s piece starting at `start` first reads, when it reads on
    from there (what `storage.prefetch` fetches ahead for it); None for Parquet, read at
    offsets (its footer, then its row groups: `start` counts row groups there), and for a
    `.json` file, opened twice (its first bytes say whether it is one JSON array)."""
    if format_of(path) is PARQUET or file_name(path).lower().endswith(jsonl.JSON_SUFFIXES):
        return None  # a `.json` object is probed first (an array?), which took the block
    return range_start(start)  # a JSONL range; a whole file (text, compressed) at 0


def read_file(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[Doc]:
    """The documents of `path` (of its piece `[start, end)`: bytes or row groups, as its format
    counts them), read by its format's reader; every way a file can fail to read is one
    `DataError` naming it (unreadable, truncated, a corrupt gzip or zstd stream)."""
    with read_errors(path):
        yield from format_of(path).read(path, config, skips, start, end)
