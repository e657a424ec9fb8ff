"""Fine-tuning records: what kind a dataset is, and its records as prompts or conversations.

Kinds (packtool/read/sft_config.py), detected from the first record of the first file unless
`--format` names one:

- `messages`: `{"messages": [{"role": ..., "content": ...}, ...]}` (OpenAI / TRL style; other
  keys of a message such as `tool_calls` or `reasoning_content` are kept for the template);
- `sharegpt`: `{"conversations": [{"from": "human" | "gpt" | "system" | ..., "value": ...}]}`,
  mapped to roles (`human` -> user, `gpt` -> assistant, ...); a conversation list whose messages
  have `role` is read as `messages` whatever its field is called;
- `prompt-completion`: `{"prompt": "...", "completion": "..."}` (field names configurable);
- `text`: anything else (the plain corpus readers in packtool/read/corpus.py).

A record that has a conversation field is chat, one with both prompt and completion fields is
prompt-completion, one with the text field is text, in that order. JSONL (also `.json` arrays,
`.gz`/`.zst`) and Parquet (a `list<struct<role, content>>` column, or string prompt/completion
columns) are read. A dataset is one kind: a file of another kind is a `DataError`; inside a file,
a record of another kind is a counted skip (`other_kind`, naming what it is), as are records
without the fields (`missing_field`, an error when the first 1,000 of a file all lack them),
conversations that are not lists of message objects (`malformed_conversation`), a role outside
system / developer / user / assistant / tool (`unknown_role`) and empty conversations (`empty`).
`--strict` turns each into a one-line error naming the record.

Memory: one batch of records at a time (`ReadConfig.batch_docs` / `batch_bytes`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError, DataError, option_choice
from packtool.prefetch import map_ordered
from packtool.read import formats
from packtool.read.compressed import read_errors
from packtool.read.documents import ReadConfig, SkipCounter, as_extra
from packtool.read.jsonl import a_json_type, json_objects, json_type
from packtool.read.sft_config import (
    CHAT_KINDS,
    MESSAGES,
    PROMPT_COMPLETION,
    SFT_KINDS,
    SHAREGPT,
    TEXT,
    TOKENIZED,
    SFTConfig,
)
from packtool.storage import local as storage

ROLES = ("system", "developer", "user", "assistant", "tool")
"""The roles a conversation may use (an unknown one is a counted skip)."""
SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "tool": "tool",
    "function": "tool",
    "observation": "tool",
}
_PATIENCE = 1000
"""Records of a file lacking the kind's fields, with none having them, before it is an error."""
_SNIFF_LINES = 100
BATCH_RECORDS = 512
"""At most this many records per batch (or `ReadConfig.batch_docs`, if smaller): a record costs
a render, so smaller batches than for text keep rendering and encoding overlapped (packtool/
packtool/sft/encode.py) while still giving the tokenizer's threads enough texts at once."""


class BadRecord(Exception):
    """A record that is skipped: `reason` (a SkipCounter reason) and a detail."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def kind_of_record(obj: dict[str, Any], read: ReadConfig) -> str | None:
    """The kind one record's fields say (None: none of the known fields)."""
    sft = read.sft
    for name in sft.conversation_fields():
        value = obj.get(name)
        if isinstance(value, list):
            first = next((m for m in value if isinstance(m, dict)), None)
            if first is not None and "from" in first and "role" not in first:
                return SHAREGPT
            return MESSAGES
    if sft.prompt_field in obj and sft.completion_field in obj:
        return PROMPT_COMPLETION
    if read.text_field in obj:
        return TEXT
    return None


def _kind_of_columns(path: Path, read: ReadConfig) -> str | None:
    import pyarrow as pa

    try:
        schema = storage.parquet_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    sft = read.sft
    for name in sft.conversation_fields():
        if name in schema.names:
            t = schema.field(name).type
            if pa.types.is_list(t) or pa.types.is_large_list(t):
                v = t.value_type
                if pa.types.is_struct(v):
                    fields = {v.field(i).name for i in range(v.num_fields)}
                    return SHAREGPT if "from" in fields and "role" not in fields else MESSAGES
                return MESSAGES  # a list of something else: each record says what is wrong
    if sft.prompt_field in schema.names and sft.completion_field in schema.names:
        return PROMPT_COMPLETION
    return TEXT if read.text_column in schema.names else None


def file_record_kind(path: Path, read: ReadConfig) -> str | None:
    """The kind of a raw corpus file, from its first record (None: it does not say)."""
    return _reader(path).kind(path, read)


def _kind_of_objects(path: Path, read: ReadConfig) -> str | None:
    with closing(_first_objects(path)) as objects:
        for obj in objects:
            found = kind_of_record(obj, read)
            if found is not None:
                return found
    return None


def _first_objects(path: Path) -> Iterator[dict[str, Any]]:
    """The objects among the first `_SNIFF_LINES` records of a JSONL / JSON file (none past a
    part that cannot be read: the reader says so, with its own message)."""
    objects = json_objects(path, SkipCounter())
    try:
        for i, (_, obj, *_) in enumerate(objects):
            if isinstance(obj, dict):
                yield obj
            if i >= _SNIFF_LINES:
                break
    except (OSError, EOFError, DataError):
        return
    finally:
        close = getattr(objects, "close", None)
        if close is not None:
            close()


def first_fields(paths: list[Path]) -> list[str]:
    """The field names of the raw inputs' first records, sorted: the keys of the objects among
    each JSONL / JSON file's first records, a Parquet file's columns, none for a text file.
    What a message about a field option names as the fields found."""

    with closing(map_ordered(lambda p: _reader(p).fields(p), paths)) as each:
        return sorted(set().union(*each))


def _object_fields(path: Path) -> set[str]:
    return {name for obj in _first_objects(path) for name in obj}


def _column_names(path: Path) -> set[str]:
    import pyarrow as pa

    try:
        return set(storage.parquet_schema(path).names)
    except (OSError, pa.ArrowInvalid):  # unreadable: the reader says so
        return set()


def dataset_kind(paths: list[Path], read: ReadConfig) -> str:
    """The kind of raw inputs: `--format`, or detected; every file must agree.

    Raises:
        DataError: files of different kinds.
    """
    forced = read.sft.format
    kind = forced if forced not in ("auto", TOKENIZED) else None
    first_path = None
    # A first record of every file, read in parallel and taken in input order.
    with closing(map_ordered(lambda p: file_record_kind(p, read), paths)) as kinds:
        for path, found in zip(paths, kinds, strict=True):
            if found is None:
                continue
            if found == SHAREGPT and kind == MESSAGES or found == MESSAGES and kind == SHAREGPT:
                continue  # chat either way: each message says which form it has
            if kind is None:
                kind, first_path = found, path
            elif found != kind:
                against = (
                    f"{first_path} ({kind})"
                    if first_path
                    else option_choice("--format", "format", kind)
                )
                raise DataError(
                    f"{path}: holds {found} records, unlike {against}; a dataset is one kind "
                    f"(pass {option_choice('--format', 'format', 'KIND')} to say which)"
                )
    return kind or TEXT


def sft_kind(paths: list[Path], read: ReadConfig, *, tokenized: bool) -> str | None:
    """The SFT kind of the inputs (prompt-completion / messages / sharegpt), or None.

    Args:
        paths: the input files.
        read: the reading options (`read.sft.format`).
        tokenized: the inputs are tokenized Parquet (then there is nothing to detect).

    Raises:
        ConfigError: a `--format` that contradicts the inputs.
        DataError: files of different kinds.
    """
    fmt = read.sft.format
    if tokenized:
        if fmt not in ("auto", TOKENIZED):
            raise ConfigError(
                f"the inputs are tokenized Parquet; {option_choice('--format', 'format', fmt)} "
                f"is for raw records (use {option_choice('--format', 'format', 'auto')} or "
                "'tokenized')"
            )
        return None
    if fmt == TOKENIZED:
        raise ConfigError(
            f"{option_choice('--format', 'format', TOKENIZED)}, but {paths[0]} is not "
            "tokenized Parquet (packtool tokenize "
            "output, or Parquet with an input_ids column)"
        )
    if fmt == TEXT:
        return None
    try:
        key = storage.file_states(paths)
    except OSError:  # the reader names the file
        return None
    kind = _dataset_kind_cached(key, read)
    return kind if kind in SFT_KINDS else None


@functools.lru_cache(maxsize=8)
def _dataset_kind_cached(files: tuple[tuple[Path, int, int], ...], read: ReadConfig) -> str:
    # The CLI, preflight and the reader each ask; the answer reads a record of every file, so
    # it is kept for the same files (same sizes and times) and options.
    return dataset_kind([p for p, _, _ in files], read)


def to_messages(value: Any) -> list[dict[str, Any]]:
    """A conversation (messages or ShareGPT) as role/content messages.

    Raises:
        BadRecord: not a list of message objects, a missing or unknown role, or empty.
    """
    if not isinstance(value, list):
        raise BadRecord("malformed_conversation", f"a JSON {json_type(value)}, not a list")
    if not value:
        raise BadRecord("empty", "no messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise BadRecord("malformed_conversation", f"message {i} is {a_json_type(m)}")
        if "role" in m or "from" not in m:
            role = m.get("role")
            msg = dict(m)
        else:
            raw = m.get("from")
            role = SHAREGPT_ROLES.get(raw, raw) if isinstance(raw, str) else raw
            msg = {k: v for k, v in m.items() if k not in ("from", "value")}
            msg = {"role": role, "content": m.get("value"), **msg}
        if not isinstance(role, str):
            raise BadRecord("malformed_conversation", f"message {i} has no role")
        if role not in ROLES:
            raise BadRecord("unknown_role", f"message {i} has role {role!r}")
        msg["role"] = role
        out.append(msg)
    return out


@dataclass
class Records:
    """A batch of fine-tuning records, in reading order."""

    wheres: list[str] = field(default_factory=list)
    """`file:line` / `file:row N`, for skips."""
    offsets: list[int] = field(default_factory=list)
    """Each record's offset in its file, the unit of a corpus file of its type (the byte where
    its JSON line starts, its item in a JSON array, its Parquet row): its document id's offset
    (packtool/read/docids.py), so an id leads back to the record, whatever was skipped."""
    sources: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    """Per record: its messages (chat) or `(prompt, completion)`."""
    extras: dict[str, list[str | None]] = field(default_factory=dict)
    nbytes: int = 0
    text_bytes: int = 0

    def __len__(self) -> int:
        return len(self.values)


def _value(obj: dict[str, Any], kind: str, sft: SFTConfig, read: ReadConfig) -> Any:
    """What a record holds for `kind`, or `BadRecord`."""
    if kind in CHAT_KINDS:
        for name in sft.conversation_fields(kind):
            if name in obj:
                return to_messages(obj[name])
    else:
        p, c = obj.get(sft.prompt_field), obj.get(sft.completion_field)
        if sft.prompt_field in obj and sft.completion_field in obj:
            if not isinstance(p, str) or not isinstance(c, str):
                if isinstance(p, list) and isinstance(c, list):  # TRL's conversational form
                    raise BadRecord(
                        "missing_field",
                        f"{sft.prompt_field!r} and {sft.completion_field!r} are message lists: "
                        "conversational prompt/completion is not supported; write one "
                        "\"messages\" list (the prompt's messages, then the completion's)",
                    )
                bad = sft.prompt_field if not isinstance(p, str) else sft.completion_field
                raise BadRecord(
                    "missing_field", f"{bad!r} is {a_json_type(obj[bad])}, not a string"
                )
            return p, c
    other = kind_of_record(obj, read)
    if other is not None and other != kind:
        raise BadRecord("other_kind", f"a {other} record in a {kind} dataset")
    if kind in CHAT_KINDS:
        wanted = " or ".join(repr(f) for f in sft.conversation_fields(kind))
    else:  # name the one missing (a record with a prompt and no completion said "no both")
        missing = [f for f in (sft.prompt_field, sft.completion_field) if f not in obj]
        wanted = " and ".join(repr(f) for f in missing)
    raise BadRecord("missing_field", f"no {wanted}")


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of a record's text (what `ReadConfig.batch_bytes` counts; CJK text is ~3
    bytes a character)."""
    if isinstance(value, tuple):
        return sum(len(v.encode("utf-8", "surrogatepass")) for v in value)
    return sum(
        len(m["content"].encode("utf-8", "surrogatepass"))
        for m in value
        if isinstance(m.get("content"), str)
    )


def read_records(
    paths: list[Path], kind: str, read: ReadConfig, skips: SkipCounter
) -> Iterator[Records]:
    """Batches of the records of `paths`, for an SFT `kind` (see the module docstring).

    Under `--strict` a bad record's error comes after the batch of the records read before it,
    which are rendered and checked first, so the error names the first bad record in reading
    order also where an earlier one of its batch fails only once rendered (no assistant turn, a
    template error) and it fails as it is read (until 2026-12-08 it was named instead)."""
    batch = Records(extras={f: [] for f in read.extra_fields})
    limit = min(read.batch_docs, BATCH_RECORDS)
    try:
        for path in paths:
            source = str(path)  # once a file (a URL's is ~8 us)
            for where, obj, nbytes, offset in _objects(path, kind, read, skips):
                try:
                    value = _value(obj, kind, read.sft, read)
                except BadRecord as bad:
                    skips.add(bad.reason, where, bad.detail)
                    continue
                extras = []  # before the record joins the batch: a bad column leaves none of it
                for name in read.extra_fields:
                    try:
                        extras.append(as_extra(obj.get(name)))
                    except UnicodeDecodeError:  # a binary Parquet column
                        raise DataError(
                            f"{where}: column {name!r} holds bytes that are not UTF-8 text"
                        ) from None
                batch.wheres.append(where)
                batch.offsets.append(offset)
                batch.sources.append(source)
                batch.values.append(value)
                for name, extra in zip(read.extra_fields, extras, strict=True):
                    batch.extras[name].append(extra)
                size = _text_bytes(value)
                batch.nbytes += nbytes or size  # Parquet: the text, as the corpus readers count it
                batch.text_bytes += size
                if len(batch) >= limit or batch.text_bytes >= read.batch_bytes:
                    yield batch
                    batch = Records(extras={f: [] for f in read.extra_fields})
    except DataError:
        if not (skips.strict and len(batch)):
            raise
        yield batch  # rendered and checked before this error is raised
        raise
    if len(batch):
        yield batch


def _objects(
    path: Path, kind: str, read: ReadConfig, skips: SkipCounter
) -> Iterator[tuple[str, dict[str, Any], int, int]]:
    """(where, record, bytes, offset) of one file; a file whose records never have the fields
    fails."""
    source = _reader(path).rows(path, kind, read, skips)
    missing, seen = 0, False
    with read_errors(path):  # each way a file fails to read: one line naming it
        for where, obj, nbytes, offset in source:
            if not isinstance(obj, dict):
                skips.add("malformed_json", where, f"a JSON {json_type(obj)}, not an object")
                continue
            if seen:  # (the kind of a record is asked only until one has the fields)
                pass
            elif kind_of_record(obj, read) not in (
                kind,
                *((SHAREGPT, MESSAGES) if kind in CHAT_KINDS else ()),
            ):
                missing += 1
                if missing >= _PATIENCE:
                    raise DataError(
                        f"{path}: none of the first {_PATIENCE} records is a {kind} record "
                        f"(fields found: {', '.join(sorted(obj)) or 'none'}); pass "
                        f"{option_choice('--format', 'format', 'KIND')} or the field options"
                    )
            else:
                seen = True
            yield where, obj, nbytes, offset


def _json_rows(
    path: Path, kind: str, read: ReadConfig, skips: SkipCounter
) -> Iterator[tuple[str, Any, int, int]]:
    """(where, object, bytes, offset): the byte of a JSON line, the index of an array's item
    (the kept fields read exactly: `jsonl.exact_fields`)."""
    return json_objects(path, skips, fields=read.extra_fields, whole=True)


def _text_rows(
    path: Path, kind: str, read: ReadConfig, skips: SkipCounter
) -> Iterator[tuple[str, Any, int, int]]:
    raise DataError(f"{path}: a plain text file in a {kind} dataset; pass JSONL or Parquet")


def _parquet_rows(
    path: Path, kind: str, read: ReadConfig, skips: SkipCounter
) -> Iterator[tuple[str, Any, int, int]]:
    import pyarrow as pa

    try:
        pf = storage.parquet_file(path)
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    sft = read.sft
    if kind in CHAT_KINDS:
        wanted = [next((f for f in sft.conversation_fields(kind) if f in names), None)]
    else:
        wanted = [f if f in names else None for f in (sft.prompt_field, sft.completion_field)]
    if None in wanted:
        need = (
            " or ".join(sft.conversation_fields(kind))
            if kind in CHAT_KINDS
            else f"{sft.prompt_field} and {sft.completion_field}"
        )
        raise DataError(f"{path}: no column {need} (columns: {', '.join(names)})")
    for name in read.extra_fields:
        if name not in names:
            raise DataError(f"{path}: no extra field {name!r} (columns: {', '.join(names)})")
    columns = [*wanted, *read.extra_fields]
    row = 0
    try:
        for rb in pf.iter_batches(batch_size=read.batch_docs, columns=columns):
            for obj in rb.to_pylist():
                row += 1  # named from 0, as pyarrow and inspect count rows
                yield f"{path}:row {row - 1}", obj, 0, row - 1
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise DataError(f"{path}: corrupt Parquet data near row {row} ({exc})") from None


@dataclass(frozen=True)
class RecordReader:
    """How the fine-tuning readers read one input format of `packtool.read.formats.FORMATS`."""

    kind: Callable[[Path, ReadConfig], str | None]
    """The record kind a file's first records say (None: they do not say)."""
    fields: Callable[[Path], set[str]]
    """The field names of a file's first records (none where it cannot be read)."""
    rows: Callable[[Path, str, ReadConfig, SkipCounter], Iterator[tuple[str, Any, int, int]]]
    """(where, record, bytes, offset) of each record of a file, read as a dataset of a kind."""


RECORD_READERS = {
    formats.JSONL.name: RecordReader(_kind_of_objects, _object_fields, _json_rows),
    formats.PARQUET.name: RecordReader(_kind_of_columns, _column_names, _parquet_rows),
    formats.TEXT.name: RecordReader(lambda path, read: TEXT, lambda path: set(), _text_rows),
}
"""The record reader of each format, by its name (`formats.format_of`): the fine-tuning
readers dispatch on the format registry as the corpus readers do (`Format.read`)."""


def _reader(path: Path) -> RecordReader:
    return RECORD_READERS[formats.format_of(path).name]
