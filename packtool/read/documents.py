"""What reading yields: documents in `DocumentBatch`es, skips counted, options in `ReadConfig`.

Every reader (packtool/read/text.py, jsonl.py, parquet.py) yields `Doc` tuples; `BatchBuilder`
gathers them into batches of bounded size, so memory does not grow with the corpus. Every
document that cannot be used is a counted skip (`SkipCounter`), never a silent drop;
`strict=True` turns the first skip into a `DataError`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from packtool.dataset.columns import names, optional
from packtool.dataset.tokenized import DOC_CHUNK
from packtool.errors import ConfigError, DataError, option_choice
from packtool.quantities import check_bool, check_int
from packtool.read import docids
from packtool.read.sft_config import SFTConfig

RESERVED_COLUMNS = ("doc_id", "source", "input_ids", "length", *names(optional()), DOC_CHUNK)
"""Column names of the tokenized table (with the declared optional ones, packtool/dataset/columns.py)
and `doc_chunk`, the column a tail of pieces adds to it (packtool/pack/tail.py); an extra field
may not take one of them."""


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
    """Raise `DataError` at the first skipped document instead of counting it, whatever
    `SkipCounter` the caller passes (`run_skips` makes it strict)."""
    batch_docs: int = 8192
    """At most this many documents per batch. Large batches keep the Rust tokenizers' threads
    busy: on 2 cores, 2,048-document batches measured ~5% slower than 8,192."""
    batch_bytes: int = 8 << 20
    """A batch ends once its texts reach this many bytes (bounds memory with long documents)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Fine-tuning inputs: the dataset's kind, field names, chat template, `--train-on`
    (packtool/read/sft_config.py; read by packtool/sft/inputs.py and packtool/sft/encode.py)."""

    def __post_init__(self) -> None:
        for name in ("text_field", "text_column"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        check_bool("strict", self.strict)
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
        check_int("batch_docs", self.batch_docs)
        check_int("batch_bytes", self.batch_bytes)
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
                f"run without {option_choice('--strict', 'strict', True)} to skip and count "
                "such documents"
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


def run_skips(skips: SkipCounter | None, config: ReadConfig) -> SkipCounter:
    """The counter a read counts its skips in (`read_corpus`, `tokenized_batches`): `skips`,
    or a fresh one, strict as `config.strict`, when None. `config.strict` makes the read strict
    whatever counter is passed: a counter passed with `strict=False` is made strict (its
    `strict` set to True, and left so), so the first skip is a `DataError` and nothing is
    counted, as `--strict` does. (Until 2026-12-06 the caller's counter was used as it was: a
    `ReadConfig(strict=True)` beside `SkipCounter()` skipped and counted with no error.)"""
    if skips is None:
        return SkipCounter(strict=config.strict)
    if config.strict:
        skips.strict = True
    return skips


Doc = tuple[str, tuple[str | None, ...], int, int]
"""(text, extra field values, input bytes, record offset in the file: see `read_piece`)."""


class BatchBuilder:
    """Documents gathered into `DocumentBatch`es of at most `batch_docs` documents or
    `batch_bytes` of text, their ids sequential (`file_index` None) or file index + offset."""

    def __init__(self, config: ReadConfig, file_index: int | None = None) -> None:
        self.config = config
        self.file_index = file_index
        self.next_id = 0
        self._reset()

    def switch_file(self, file_index: int) -> None:
        """The documents added from now on come from input file `file_index` (a batch may hold
        several files' documents, each with its own file's ids)."""
        assert self.file_index is not None, "sequential ids name no file"
        if file_index != self.file_index:
            self.file_index = file_index
            self._runs.append((file_index, len(self.texts)))

    def _reset(self) -> None:
        self._runs = [(self.file_index, 0)]
        """(file index, first document) of each file's run of documents in the batch."""
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
            offsets = np.asarray(self.offsets, dtype=np.int64)
            ends = [start for _, start in self._runs[1:]] + [n]
            parts = [
                docids.encode(f, offsets[start:end])
                for (f, start), end in zip(self._runs, ends, strict=True)
                if end > start
            ]
            ids = np.concatenate(parts) if len(parts) > 1 else parts[0] if parts else offsets
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


def _text(value: Any) -> str:
    """A nested value JSON has no type for: a binary Parquet value's UTF-8 text.

    Raises:
        UnicodeDecodeError: bytes that are not UTF-8 (the readers name the column).
        TypeError: anything else.
    """
    if isinstance(value, bytes):
        return value.decode("utf-8")
    raise TypeError(f"a {type(value).__name__} cannot be kept as text")


def as_extra(value: Any) -> str | None:
    """An extra field's value as the string column stores it: JSON for objects, lists and
    booleans (`true`, as the record wrote it; Python's `True` is no JSON), numbers as text."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):  # a binary Parquet column: its text (not Python's b'...')
        return value.decode("utf-8")
    if isinstance(value, (dict, list, bool)):
        try:
            return orjson.dumps(value).decode()
        except TypeError:  # an integer beyond 64 bits (jsonl.exact_fields), Parquet bytes
            return json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=_text)
    return str(value)
