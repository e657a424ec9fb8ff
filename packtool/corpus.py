"""Corpus readers: plain text, JSONL and Parquet (text and JSONL also .gz / .zst), from files,
folders and globs.

Documents stream out in `DocumentBatch`es of bounded size, so memory does not grow with the
corpus. Every document that cannot be used is a counted skip (`SkipCounter`), never a silent
drop; `strict=True` turns the first skip into a `DataError`.

Which bad input is an error and which is a skip (see docs/tokenize.md):

- error: a path that matches nothing, an unreadable, truncated or corrupt file, a Parquet file
  without the text column (or an extra field), a JSONL file in which no line has the text field;
- skip (reason): a line that is not a JSON object (`malformed_json`), a line without the text
  field or with a null/non-string value (`missing_field`), bytes that are not UTF-8
  (`invalid_utf8`), a document with no text (`empty`).

A UTF-8 byte order mark at the start of a text or JSONL file is not part of the data and is
dropped. A `.json` file that holds one JSON array (rather than JSON Lines) is read as the
objects in it.
"""

from __future__ import annotations

import glob
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from packtool import docids
from packtool.columns import names, optional
from packtool.compressed import open_stream, zstd_error
from packtool.corpus_lines import BOM as _BOM
from packtool.corpus_lines import TO_END, lines
from packtool.errors import ConfigError, DataError
from packtool.prefetch import map_ordered
from packtool.sft_config import SFTConfig

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".jsonl.gz", ".ndjson.gz", ".jsonl.zst", ".ndjson.zst")
PARQUET_SUFFIXES = (".parquet",)
TEXT_SUFFIXES = tuple(f"{s}{c}" for s in (".txt", ".md", ".text") for c in ("", ".gz", ".zst"))
"""One document per file; `.gz` / `.zst` are decompressed first."""
KNOWN_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES + TEXT_SUFFIXES
"""Suffixes picked up when walking a folder. A file named explicitly (or matched by a glob) with
any other suffix is read as plain text, one document per file (decompressed when it ends in
`.gz` / `.zst`), except `.json` (below)."""
_KNOWN_SHORT = ".jsonl, .ndjson, .parquet, .txt, .md, .text (text and JSONL also .gz / .zst)"
JSON_SUFFIXES = (".json", ".json.gz", ".json.zst")
"""Read as JSON Lines when named explicitly or matched by a glob (many datasets name JSON Lines
`.json`), but not picked up in folders, where `.json` files are usually configuration. A `.json`
file whose first character is `[` is read as one JSON array of objects instead."""

_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}

RESERVED_COLUMNS = ("doc_id", "source", "input_ids", "length", *names(optional()))
"""Column names of the tokenized table (with the declared optional ones, packtool/columns.py);
an extra field may not take one of them."""

# How many JSON objects without the text field, and none with it, before a file is an error.
_MISSING_FIELD_PATIENCE = 1000


@dataclass(frozen=True, kw_only=True)
class ReadConfig:
    """How to read a corpus."""

    text_field: str = "text"
    """The JSONL key holding a document's text."""
    text_column: str = "text"
    """The Parquet column holding a document's text."""
    extra_fields: tuple[str, ...] = ()
    """String fields (JSONL keys / Parquet columns) carried along with each document, e.g. for
    `--group-by`. A missing value becomes null. `source` (the file path) is always carried."""
    strict: bool = False
    """Raise `DataError` at the first skipped document instead of counting it."""
    batch_docs: int = 8192
    """At most this many documents per batch. Large batches keep the Rust tokenizers' threads
    busy: on 2 cores, 2,048-document batches measured ~5% slower than 8,192."""
    batch_bytes: int = 8 << 20
    """A batch ends once its texts reach this many bytes (bounds memory with long documents)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Fine-tuning inputs: the dataset's kind, field names, chat template, `--train-on`
    (packtool/sft_config.py; read by packtool/sft_inputs.py and packtool/sft_encode.py)."""

    def __post_init__(self) -> None:
        if not self.text_field:
            raise ConfigError("text_field must be a non-empty string")
        if not self.text_column:
            raise ConfigError("text_column must be a non-empty string")
        if isinstance(self.extra_fields, str) or not all(
            isinstance(f, str) and f for f in self.extra_fields
        ):
            raise ConfigError(
                f"extra_fields must be a tuple of non-empty names, got {self.extra_fields!r}"
            )
        clash = sorted(set(self.extra_fields) & set(RESERVED_COLUMNS))
        if clash:
            raise ConfigError(
                f"extra field {clash[0]!r} clashes with a built-in column "
                f"(reserved: {', '.join(RESERVED_COLUMNS)}; `source` is always the file path)"
            )
        if len(set(self.extra_fields)) != len(self.extra_fields):
            raise ConfigError(f"extra_fields has duplicates: {self.extra_fields!r}")
        if self.batch_docs < 1:
            raise ConfigError(f"batch_docs must be >= 1, got {self.batch_docs}")
        if self.batch_bytes < 1:
            raise ConfigError(f"batch_bytes must be >= 1, got {self.batch_bytes}")
        if not isinstance(self.sft, SFTConfig):
            raise ConfigError(f"sft must be an SFTConfig, got {type(self.sft).__name__}")


@dataclass(kw_only=True)
class DocumentBatch:
    """A batch of documents in reading order."""

    doc_ids: np.ndarray
    """int64, (n,): from `read_corpus`, global ids, sequential in reading order over all inputs
    (skips take none); from `read_piece`, `docids.encode(file index, record offset)`."""
    texts: list[str]
    sources: list[str]
    """The file each document came from."""
    extras: dict[str, list[str | None]] = field(default_factory=dict)
    """One list per `ReadConfig.extra_fields` entry."""
    nbytes: int = 0
    """Input bytes this batch consumed (uncompressed), for throughput figures."""

    def __len__(self) -> int:
        return len(self.texts)


class SkipCounter:
    """Counts skipped documents per reason and keeps the first few `file:line` examples.

    Args:
        strict: raise `DataError` at the first skip instead of counting it.
        max_examples: examples kept per reason.
    """

    def __init__(self, *, strict: bool = False, max_examples: int = 3) -> None:
        self.strict = strict
        self.max_examples = max_examples
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[str]] = {}

    def add(self, reason: str, where: str, detail: str = "") -> None:
        """Record one skipped document; `where` is `file` or `file:line`."""
        if self.strict:
            extra = f" ({detail})" if detail else ""
            raise DataError(
                f"{where}: {reason.replace('_', ' ')}{extra}; "
                "run without --strict to skip and count such documents"
            )
        self.counts[reason] = self.counts.get(reason, 0) + 1
        examples = self.examples.setdefault(reason, [])
        if len(examples) < self.max_examples:
            examples.append(f"{where} ({detail})" if detail else where)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))

    def summary(self) -> str:
        """One line: `3 skipped: empty 2 (a.jsonl:4, ...), malformed_json 1 (...)`, or `no skips`."""
        if not self.counts:
            return "no skips"
        parts = [
            f"{reason} {n} (e.g. {', '.join(self.examples.get(reason, []))})"
            for reason, n in sorted(self.counts.items())
        ]
        return f"{self.total} skipped: " + "; ".join(parts)

    def note(self) -> str:
        """` (<summary>)` to end an error message with, or "" when nothing was skipped."""
        return f" ({self.summary()})" if self.total else ""


def file_kind(path: Path) -> str:
    """`jsonl`, `parquet` or `text`, from the file name."""
    name = path.name.lower()
    if name.endswith(JSONL_SUFFIXES + JSON_SUFFIXES):
        return "jsonl"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    return "text"


def expand_inputs(inputs: Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, folders (recursively, known suffixes only) and globs into a file list.

    Each input's matches are sorted; the inputs keep their order; duplicates are dropped.

    Raises:
        DataError: an input matches no file.
    """
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    out: list[Path] = []
    seen: set[Path] = set()
    for raw in inputs:
        text = os.fspath(raw)
        path = Path(text)
        if path.is_dir():
            matches = _walk(path)
            if not matches:
                raise DataError(f"{text}: folder has no corpus files (looked for {_KNOWN_SHORT})")
        elif path.is_file():
            matches = [path]
        elif os.path.lexists(path):
            raise DataError(_not_a_file(path))
        elif glob.has_magic(text):
            matches = []
            for name in sorted(glob.glob(text, recursive=True)):
                p = Path(name)
                if p.is_file():
                    matches.append(p)
                elif not p.is_dir():
                    raise DataError(_not_a_file(p))
            if not matches:
                raise DataError(f"{text}: glob matches no files")
        else:
            raise DataError(f"{text}: no such file or folder")
        for p, key in zip(matches, map_ordered(Path.resolve, matches), strict=True):
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def _walk(folder: Path) -> list[Path]:
    """The corpus files under `folder`, sorted; hidden names and symlinked folders are skipped.

    Nothing that looks like a corpus file is passed over in silence: an entry with a corpus
    suffix that is not a readable regular file (a dangling symlink, a named pipe) and a sub-folder
    that cannot be listed are errors.
    """

    def cannot_list(exc: OSError) -> None:
        raise DataError(f"{exc.filename}: cannot list folder ({exc.strerror or exc})")

    found = []
    for top, dirs, files in os.walk(folder, onerror=cannot_list):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        named = [
            Path(top) / name
            for name in files
            if not name.startswith(".") and name.lower().endswith(KNOWN_SUFFIXES)
        ]
        # A stat per file, in parallel (on a mount a stat waits on latency), taken in order.
        for p, regular in zip(named, map_ordered(Path.is_file, named), strict=True):
            if regular:
                found.append(p)
            elif not p.is_dir():
                raise DataError(_not_a_file(p))
    return sorted(found)


_KINDS = (
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_a_file(path: Path) -> str:
    """Why `path`, which exists as a name, is not an input packtool can read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
    except OSError as exc:
        return f"{path}: cannot be followed ({exc.strerror or exc})"
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return (
        f"{path}: {kind}, not a regular file; packtool reads an input more than once (to check "
        "it, to read it, to resume), so save the stream to a file first"
    )


def read_corpus(
    inputs: Iterable[str | os.PathLike],
    config: ReadConfig | None = None,
    skips: SkipCounter | None = None,
) -> Iterator[DocumentBatch]:
    """Stream the documents of `inputs` as batches, in input order.

    Files are opened lazily, one at a time: the first batch arrives before later files are read.

    Args:
        inputs: files, folders and globs (see `expand_inputs`).
        config: reading options; defaults to `ReadConfig()`.
        skips: where skipped documents are counted; a fresh counter (strict as `config.strict`)
            when None.

    Raises:
        DataError: a missing path, an unreadable file, a missing Parquet column, or any skip in
            strict mode.
    """
    config = config or ReadConfig()
    skips = skips if skips is not None else SkipCounter(strict=config.strict)
    paths = expand_inputs(inputs)
    builder = _BatchBuilder(config)
    for path in paths:
        for text, extras, nbytes, _ in _read_file(path, config, skips):
            builder.add(text, str(path), extras, nbytes)
            if builder.full:
                yield builder.flush()
    if builder.texts:
        yield builder.flush()


class _BatchBuilder:
    def __init__(self, config: ReadConfig, file_index: int | None = None) -> None:
        self.config = config
        self.file_index = file_index
        self.next_id = 0
        self._reset()

    def _reset(self) -> None:
        self.texts: list[str] = []
        self.sources: list[str] = []
        self.extras: dict[str, list[str | None]] = {f: [] for f in self.config.extra_fields}
        self.nbytes = 0
        self.text_bytes = 0
        self.offsets: list[int] = []

    def add(
        self, text: str, source: str, extras: tuple[str | None, ...], nbytes: int, offset: int = 0
    ) -> None:
        self.texts.append(text)
        self.offsets.append(offset)
        self.sources.append(source)
        for name, value in zip(self.config.extra_fields, extras, strict=True):
            self.extras[name].append(value)
        self.nbytes += nbytes
        self.text_bytes += len(text)  # characters: a cheap stand-in for bytes

    @property
    def full(self) -> bool:
        return (
            len(self.texts) >= self.config.batch_docs or self.text_bytes >= self.config.batch_bytes
        )

    def flush(self) -> DocumentBatch:
        n = len(self.texts)
        if self.file_index is None:
            ids = np.arange(self.next_id, self.next_id + n, dtype=np.int64)
        else:
            ids = docids.encode(self.file_index, np.asarray(self.offsets, dtype=np.int64))
        batch = DocumentBatch(
            doc_ids=ids,
            texts=self.texts,
            sources=self.sources,
            extras=self.extras,
            nbytes=self.nbytes,
        )
        self.next_id += n
        self._reset()
        return batch


_Doc = tuple[str, tuple[str | None, ...], int, int]
"""(text, extra field values, input bytes, record offset in the file: see `read_piece`)."""


def _read_file(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[_Doc]:
    kind = file_kind(path)
    try:
        if kind == "jsonl":
            yield from _read_jsonl(path, config, skips, start, end)
        elif kind == "parquet":
            yield from _read_parquet(path, config, skips, start, end)
        else:
            yield from _read_text(path, config, skips)
    except OSError as exc:  # also gzip.BadGzipFile
        raise DataError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except EOFError as exc:
        raise DataError(f"{path}: file is truncated ({exc})") from None
    except zstd_error() as exc:
        raise DataError(f"{path}: corrupt zstd stream ({exc})") from None


def _as_extra(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return orjson.dumps(value).decode()
    return str(value)


def _json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (`number`, `array`, `null`, ...)."""
    return _JSON_TYPES.get(type(value), "number")


def _read_text(path: Path, config: ReadConfig, skips: SkipCounter) -> Iterator[_Doc]:
    with open_stream(path) as f:
        data = f.read()
    nbytes = len(data)
    data = data.removeprefix(_BOM)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        skips.add("invalid_utf8", str(path), f"byte {exc.start}")
        return
    if not text:
        skips.add("empty", str(path))
        return
    yield text, (None,) * len(config.extra_fields), nbytes, 0


def _json_array_file(path: Path) -> bool:
    """A `.json` file whose first non-blank byte is `[`: one JSON array, not JSON Lines."""
    if not path.name.lower().endswith(JSON_SUFFIXES):
        return False
    with open_stream(path) as f:
        head = f.read(4096).removeprefix(_BOM).lstrip()
    return head.startswith(b"[")


def _read_json_array(path: Path) -> Iterator[tuple[str, Any, int, int]]:
    """(where, object, bytes, item index) for each element of a file holding one JSON array."""
    with open_stream(path) as f:
        data = f.read().removeprefix(_BOM)
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DataError(
            f"{path}: starts with '[' but is not one valid JSON array ({exc}); "
            "JSON Lines files must have one object per line"
        ) from None
    if not isinstance(items, list):  # pragma: no cover - a leading '[' parses as an array
        raise DataError(f"{path}: expected a JSON array")
    per_item = len(data) // max(len(items), 1)
    for i, obj in enumerate(items):
        yield f"{path}:item {i}", obj, per_item, i


def _jsonl_objects(
    path: Path, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[tuple[str, Any, int, int]]:
    """(where, parsed object, bytes, byte offset) per non-blank line starting in `[start, end)`;
    unparseable lines are counted skips. `where` is `file:line`, or `file:byte N` inside a
    range that does not start the file (its line numbers are unknown there)."""
    for offset, lineno, line in lines(path, start, end):
        if not line.strip():
            continue  # a blank line is not a document
        where = f"{path}:{lineno}" if lineno is not None else f"{path}:byte {offset}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                skips.add("invalid_utf8", where)
            else:
                skips.add("malformed_json", where, str(exc).split(":")[0])
            continue
        yield where, obj, len(line), offset


def _read_jsonl(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[_Doc]:
    field_name = config.text_field
    extra_fields = config.extra_fields
    seen_field = False
    objects_without = 0
    first_keys: list[str] = []
    if _json_array_file(path):
        objects = _read_json_array(path)
    else:
        objects = _jsonl_objects(path, skips, start, end)
    for where, obj, nbytes, offset in objects:
        if not isinstance(obj, dict):
            skips.add("malformed_json", where, f"a JSON {_json_type(obj)}, not an object")
            continue
        text = obj.get(field_name)
        if text is None:
            if not seen_field:
                objects_without += 1
                if not first_keys:
                    first_keys = sorted(obj)
                if objects_without >= _MISSING_FIELD_PATIENCE:
                    _raise_missing_field(path, field_name, first_keys)
            what = f"no {field_name!r}" if field_name not in obj else f"{field_name!r} is null"
            skips.add("missing_field", where, what)
            continue
        seen_field = True
        if not isinstance(text, str):
            skips.add("missing_field", where, f"{field_name!r} is a {_json_type(text)}")
            continue
        if not text:
            skips.add("empty", where)
            continue
        extras = tuple(_as_extra(obj.get(name)) for name in extra_fields)
        yield text, extras, nbytes, offset
    if objects_without and not seen_field:
        _raise_missing_field(path, field_name, first_keys)


def _raise_missing_field(path: Path, field_name: str, keys: list[str]) -> None:
    raise DataError(
        f"{path}: no line has the text field {field_name!r} "
        f"(fields found: {', '.join(keys) or 'none'}); pass --text-field NAME"
    )


def _text_kind(arrow_type: Any) -> str | None:
    """`string` or `binary` for a column that holds text, else None.

    Every Arrow layout of text counts: string / large_string / string_view, their binary twins
    (decoded as UTF-8), and a dictionary of any of them (a pandas Categorical, or what Parquet
    writers store for low-cardinality columns); `to_pylist` gives the values of each alike.
    """
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    for kind, tests in (
        ("string", ("is_string", "is_large_string", "is_string_view")),
        ("binary", ("is_binary", "is_large_binary", "is_binary_view")),
    ):
        # The view types came with pyarrow 16; older ones cannot read such a column anyway.
        if any(getattr(pa.types, test, lambda _: False)(t) for test in tests):
            return kind
    return None


def _read_parquet(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[_Doc]:
    """The documents of row groups `[start, end)` (`TO_END`: the rest) of a text Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    wanted = [config.text_column, *config.extra_fields]
    for name in wanted:
        if name not in names:
            what = "text column" if name == config.text_column else "extra field"
            hint = "; pass --text-column NAME" if name == config.text_column else ""
            raise DataError(f"{path}: no {what} {name!r} (columns: {', '.join(names)}){hint}")
    text_type = pf.schema_arrow.field(config.text_column).type
    kind = _text_kind(text_type)
    if kind is None:
        raise DataError(
            f"{path}: text column {config.text_column!r} has type {text_type}, not a string"
        )
    is_binary = kind == "binary"
    meta = pf.metadata
    groups = list(range(start, meta.num_row_groups if end == TO_END else end))
    row = sum(meta.row_group(g).num_rows for g in range(start))  # rows before the piece
    try:
        batches = pf.iter_batches(batch_size=config.batch_docs, columns=wanted, row_groups=groups)
        for record_batch in batches if groups else ():
            text_col = record_batch.column(0)
            texts = text_col.to_pylist()
            extra_cols = [
                [_as_extra(v) for v in record_batch.column(i + 1).to_pylist()]
                for i in range(len(config.extra_fields))
            ]
            for i, text in enumerate(texts):
                row += 1
                where = f"{path}:row {row}"
                if text is None:
                    skips.add("missing_field", where, f"{config.text_column!r} is null")
                    continue
                if is_binary:
                    try:
                        text = text.decode("utf-8")
                    except UnicodeDecodeError:
                        skips.add("invalid_utf8", where)
                        continue
                if not text:
                    skips.add("empty", where)
                    continue
                yield text, tuple(col[i] for col in extra_cols), len(text), row - 1
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise DataError(f"{path}: corrupt Parquet data near row {row} ({exc})") from None
