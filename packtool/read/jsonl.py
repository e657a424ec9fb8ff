"""JSON Lines (`.jsonl`, `.ndjson`, also `.gz` / `.zst`) and `.json` files: one object a document.

A line that is not a JSON object is a `malformed_json` skip, an object without the text field
(or with a null or non-string one) a `missing_field` skip, bytes that are not UTF-8
`invalid_utf8`; a file in which no line has the text field is an error (a line whose text is
null has it: a skip, as a null Parquet value is, that never leads to this error). A `.json` file whose
first character is `[` is read as one JSON array of objects. Byte ranges of a file (a partition's
piece) start and end at line starts (packtool/read/lines.py). The fine-tuning readers
(packtool/sft/inputs.py) read records through `json_objects` too.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from packtool.dataset.manifest import is_dataset_index
from packtool.errors import DataError, json_value, option_choice
from packtool.read.compressed import (
    binary_kind,
    byte_place,
    compressed_too,
    open_stream,
    read_errors,
)
from packtool.read.documents import Doc, ReadConfig, SkipCounter, as_extra
from packtool.read.lines import BOM, TO_END, lines
from packtool.storage import local as storage

JSONL_SUFFIXES = compressed_too((".jsonl", ".ndjson"))
JSON_SUFFIXES = compressed_too((".json",))
"""Read as JSON Lines when named explicitly or matched by a glob (many datasets name JSON Lines
`.json`), but not picked up in folders, where `.json` files are usually configuration. A `.json`
file whose first character is `[` is read as one JSON array of objects instead."""

_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}

# How many JSON objects without the text field, and none with it, before a file is an error
# (an object whose text field is null has it).
MISSING_FIELD_PATIENCE = 1000


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type (`number`, `array`, `null`, ...)."""
    return _JSON_TYPES.get(type(value), "number")


def a_json_type(value: Any) -> str:
    """`json_type` with its article, for "is ...": `an array`, `an object`, `a string`, `null`."""
    name = json_type(value)
    return name if name == "null" else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def json_array_file(path: Path) -> bool:
    """A `.json` file whose first non-blank byte is `[`: one JSON array, not JSON Lines."""
    if not storage.file_name(path).lower().endswith(JSON_SUFFIXES):
        return False
    with read_errors(path), open_stream(path) as f:
        head = f.read(4096).removeprefix(BOM).lstrip()
    return head.startswith(b"[")


_BIG = float(1 << 63)


KEPT_DEPTH = 400
"""The deepest a kept field (`fields`: the extra fields a run keeps or groups by) may nest: its
value is stored as JSON text, written (and, for an integer orjson read as a float, parsed
again) by the standard library, which recurses, and fails past ~990 levels; orjson reads up to
1,024. A record whose kept field nests deeper is a `malformed_json` skip naming the field."""


def _lossy(value: Any) -> bool:
    """Whether orjson may have read an integer of `value` as a float: it reads integers beyond
    64 bits so (`18446744073709551616` -> `1.8446744073709552e+19`, the same float as the next
    integer up)."""
    return _holds(value, lambda v: type(v) is float and not -_BIG <= v < _BIG)


def _too_deep(obj: dict[str, Any], fields: Sequence[str]) -> str | None:
    """Why a record is a skip for a kept field nested past `KEPT_DEPTH` (None: none is)."""
    for name in fields:
        if _depth(obj.get(name)) > KEPT_DEPTH:
            return f"field {name!r} nested too deeply (past {KEPT_DEPTH} levels)"
    return None


def exact_fields(obj: Any, data: bytes, fields: Sequence[str]) -> Any:
    """`obj`, parsed by orjson from `data`, parsed again by the standard library (which keeps
    integers of any size) where one of `fields` (the extra fields a run keeps or groups by) may
    hold an integer orjson read as a float: two ids beyond 2^64 were one group.

    Raises:
        ValueError: a kept field nested past `KEPT_DEPTH`, or (parsed again) a record nested
            past the standard library's reach: the reader's `malformed_json` skip.
    """
    if fields and isinstance(obj, dict):
        why = _too_deep(obj, fields)
        if why is not None:
            raise ValueError(why)
        if any(_lossy(obj.get(f)) for f in fields):
            return json_value(data)
    return obj


class LongInteger(float):
    """An integer literal of more digits than Python converts (`sys.get_int_max_str_digits()`,
    4,300 by default) as `standard_json` reads it: infinity of its sign, a number beyond a
    double's range as orjson judges it (read where it is not used, as `1e400`), told apart for
    the skip's words. The standard library refused it, and its line was a `malformed_json` skip
    named "number is infinity when parsed as double" (orjson's words), a `.json` array holding
    one an error, until 2026-12-07."""

    __slots__ = ()

    def __new__(cls, digits: str) -> LongInteger:
        return super().__new__(cls, "-inf" if digits.startswith("-") else "inf")

    def __reduce__(self) -> tuple:
        return (float, (float(self),))  # pickled or copied: the infinity it reads as


def _integer(digits: str) -> int | float:
    """An integer literal as the standard library reads it, or a `LongInteger` where it has
    too many digits to convert (`int` checks the length before converting: no quadratic cost)."""
    try:
        return int(digits)
    except ValueError:
        return LongInteger(digits)


LONE_SURROGATE = "no low surrogate in string"
"""The skip's detail for a string holding a lone surrogate escape (orjson's words)."""


def standard_json(data: bytes) -> Any:
    """What orjson refused, parsed by the standard library where JSON's grammar allows it: a
    number beyond a double's range (`1e400`, a valid JSON number orjson refuses as infinity;
    read as `inf`; an integer of more digits than Python converts, a `LongInteger`), a string
    holding a lone surrogate escape (`"\\ud800"`; see `unkeepable`).
    None where it is not JSON either: `NaN` and `Infinity`, bytes that are not UTF-8 (the
    standard library would guess UTF-16 or UTF-32, and drop a byte order mark), nesting past
    the interpreter's recursion limit."""
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_not_json, parse_int=_integer)
    except (ValueError, RecursionError):  # JSONDecodeError and UnicodeDecodeError included
        return None


def unkeepable(obj: Any, fields: Sequence[str], whole: bool = False) -> str | None:
    """Why a record `standard_json` parsed is still a `malformed_json` skip (None: it is read):
    a string with a lone surrogate anywhere (no UTF-8 text holds one), or a kept field
    (`fields`) holding a number beyond a double's range (kept as text it would be `inf`, or
    null inside an object: not what was written); with `whole` (a fine-tuning record, used
    whole: a tool call's arguments go to the chat template), such a number anywhere."""
    if _lone_surrogate(obj):
        return LONE_SURROGATE
    if fields and isinstance(obj, dict) and (deep := _too_deep(obj, fields)) is not None:
        return deep
    if whole and (why := _beyond(obj)) is not None:
        return why
    if isinstance(obj, dict):
        for name in fields:
            if (why := _beyond(obj.get(name))) is not None:
                return f"field {name!r} holds {why}"
    return None


def _beyond(value: Any) -> str | None:
    """What a parsed value holds beyond a double's range, in words (None: nothing)."""
    if not _infinite(value):
        return None
    if _holds(value, lambda v: type(v) is LongInteger):
        return f"a number with more than {sys.get_int_max_str_digits()} digits"
    return "a number beyond a double's range"


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _holds(value: Any, test: Any) -> bool:
    """Whether `test` is true of a scalar anywhere in a parsed value (an object's keys too),
    walked with a stack: orjson reads values nested up to 1,024 deep, and a recursive walk
    (until 2026-12-06) was a RecursionError past ~330 levels."""
    if not isinstance(value, (dict, list)):
        return bool(test(value))
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        elif test(v):
            return True
    return False


def _depth(value: Any) -> int:
    """How deeply a parsed value nests its arrays and objects (a scalar 0, `[1]` 1)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, depth = stack.pop()
        inside = v.values() if isinstance(v, dict) else v if isinstance(v, list) else None
        if inside is not None:
            deepest = max(deepest, depth + 1)
            stack.extend((x, depth + 1) for x in inside)
    return deepest


def _infinite(value: Any) -> bool:
    return _holds(value, lambda v: isinstance(v, float) and not math.isfinite(v))


def _lone_surrogate(value: Any) -> bool:
    """Whether a parsed value holds a string (a key or a value) with a lone surrogate."""
    return _holds(value, lambda v: isinstance(v, str) and not _utf8(v))


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def read_json_array(
    path: Path, fields: Sequence[str] = (), skips: SkipCounter | None = None, whole: bool = False
) -> Iterator[tuple[str, Any, int, int]]:
    """(where, object, bytes, item index) for each element of a file holding one JSON array;
    `fields` as `exact_fields` says. An element `unkeepable` refuses (in an array orjson
    refuses whole, read by `standard_json`) is a `malformed_json` skip, as such a line is."""
    with read_errors(path), open_stream(path) as f:
        data = f.read()
    bom = data.startswith(BOM)
    data = data.removeprefix(BOM)
    try:
        items = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        items = standard_json(data)
        if items is None:
            _check_utf8(path, data, len(BOM) if bom else 0)
            raise DataError(
                f"{path}: starts with '[' but is not one valid JSON array ({exc}); "
                "JSON Lines files must have one object per line"
            ) from None
    if not isinstance(items, list):  # pragma: no cover - a leading '[' parses as an array
        raise DataError(f"{path}: expected a JSON array")
    if fields and any(
        isinstance(o, dict)
        and _too_deep(o, fields) is None
        and any(_lossy(o.get(f)) for f in fields)
        for o in items
    ):
        try:
            items = json_value(data, parse_int=_integer)  # once a file, only for such a number
        except ValueError as exc:  # an item nested past the standard library's reach
            raise DataError(
                f"{path}: {exc} to read its kept fields exactly (an integer beyond 64 bits is "
                "there); write it as JSON Lines, where such a record is a skip"
            ) from None
    per_item = len(data) // max(len(items), 1)
    for i, obj in enumerate(items):
        why = unkeepable(obj, fields, whole) if skips is not None else None
        if why is not None:
            skips.add("malformed_json", f"{path}:item {i}", why)
            continue
        yield f"{path}:item {i}", obj, per_item, i


def _check_utf8(path: Path, data: bytes, skipped: int) -> None:
    """Refuse a JSON array whose bytes are not UTF-8, naming the first bad byte's line, column
    (in characters) and offset in the file, or in its decompressed text (`byte_place`;
    `skipped`: a byte order mark before `data`).
    orjson checks the encoding before parsing and named "line 1 column 1 (char 0)" until
    2026-12-07, wherever the byte was.

    Raises:
        DataError: `data` is not UTF-8.
    """
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[line_start : exc.start].decode("utf-8")) + 1
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}: not UTF-8: byte 0x{data[exc.start]:02x} at line {line} column {column} "
            f"({byte_place(path, exc.start + skipped)}); JSON text is UTF-8: save the file as "
            "UTF-8 (or as JSON Lines, where such a line is an invalid_utf8 skip)"
        ) from None


def json_objects(
    path: Path,
    skips: SkipCounter,
    start: int = 0,
    end: int = TO_END,
    fields: Sequence[str] = (),
    whole: bool = False,
) -> Iterator[tuple[str, Any, int, int]]:
    """The objects of a JSON records file: `read_json_array`'s for a `json_array_file` (read
    whole: `start` and `end` do not apply, the partition plan never cuts one), else
    `jsonl_objects`'s for the lines starting in `[start, end)`. Every reader of JSON records
    asks this one function which a file is. `whole`: the records are used whole
    (`unkeepable`)."""
    if json_array_file(path):
        return read_json_array(path, fields, skips, whole)
    return jsonl_objects(path, skips, start, end, fields, whole)


def jsonl_objects(
    path: Path,
    skips: SkipCounter,
    start: int = 0,
    end: int = TO_END,
    fields: Sequence[str] = (),
    whole: bool = False,
) -> Iterator[tuple[str, Any, int, int]]:
    """(where, parsed object, bytes, byte offset) per non-blank line starting in `[start, end)`;
    unparseable lines are counted skips. `where` is `file:line`, or `file:byte N` inside a
    range that does not start the file (its line numbers are unknown there). `fields` as
    `exact_fields` says."""
    with read_errors(path):
        yield from _objects(path, skips, start, end, fields, whole)


def _objects(
    path: Path,
    skips: SkipCounter,
    start: int,
    end: int,
    fields: Sequence[str] = (),
    whole: bool = False,
) -> Iterator[tuple[str, Any, int, int]]:
    name = str(path)  # once: a URL's `UPath.__str__` is ~8 us, as long as a short line's parse
    if start == 0 and is_dataset_index(path):
        raise DataError(
            f"{path}: the index.json of a packed dataset; packtool reads corpora and tokenized "
            "Parquet: train on the dataset as it is (loader.PackedDataset), check it with "
            "packtool verify / inspect, or pack the corpus it was made from"
        )
    for offset, lineno, line in lines(path, start, end):
        if not line.strip():
            continue  # a blank line is not a document
        where = f"{name}:{lineno}" if lineno is not None else f"{name}:byte {offset}"
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            obj = standard_json(line)
            why = None if obj is None else unkeepable(obj, fields, whole)
            if obj is not None and why is None:
                yield where, obj, len(line), offset
                continue
            if why is not None and why != LONE_SURROGATE:
                skips.add("malformed_json", where, why)
                continue
            if offset == 0 and (found := binary_kind(line)) is not None:
                kind, hint = found  # a whole file of documents, not one bad line: never a skip
                raise DataError(f"{path}: holds {kind}, not text; {hint}") from None
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                skips.add("invalid_utf8", where)
            else:
                why = str(exc).split(":")[0]
                if b"\r" in line.rstrip(b"\r\n"):  # old Mac line breaks: lines, one skip
                    why += "; the line holds CR (\\r) line breaks, JSONL lines end with \\n"
                skips.add("malformed_json", where, why)
            continue
        try:
            obj = exact_fields(obj, line, fields)
        except ValueError as exc:  # nested too deeply to keep a field of it
            skips.add("malformed_json", where, str(exc))
            continue
        yield where, obj, len(line), offset


def read_jsonl(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[Doc]:
    field_name = config.text_field
    extra_fields = config.extra_fields
    seen_field = False
    objects_without = 0
    first_keys: list[str] = []
    for where, obj, nbytes, offset in json_objects(path, skips, start, end, extra_fields):
        if not isinstance(obj, dict):
            skips.add("malformed_json", where, f"a JSON {json_type(obj)}, not an object")
            continue
        if field_name not in obj:
            if not seen_field:
                objects_without += 1
                if not first_keys:
                    first_keys = sorted(obj)
                if objects_without >= MISSING_FIELD_PATIENCE and start == 0:
                    raise_missing_field(path, field_name, first_keys)
            skips.add("missing_field", where, f"no {field_name!r}")
            continue
        # A null text has the field (as a null Parquet value has the column): a counted skip
        # below, never "no line has the text field" nor a step towards that error.
        seen_field = True
        text = obj[field_name]
        if not isinstance(text, str):
            skips.add("missing_field", where, f"{field_name!r} is {a_json_type(text)}")
            continue
        if not text:
            skips.add("empty", where)
            continue
        extras = tuple(as_extra(obj.get(name)) for name in extra_fields)
        yield text, extras, nbytes, offset
    # Judged on the file, not on this byte range: by its first MISSING_FIELD_PATIENCE objects
    # (all of them in a shorter file), read on past this range's end when it holds fewer, so
    # every cut of the file gives the answer of one read (ranges past the first never judge).
    if start == 0 and objects_without and not seen_field:
        left = MISSING_FIELD_PATIENCE - objects_without
        if end == TO_END or left <= 0 or not _field_ahead(path, field_name, end, left):
            raise_missing_field(path, field_name, first_keys)


def _field_ahead(path: Path, field_name: str, start: int, count: int) -> bool:
    """Whether one of the first `count` objects from byte `start` on has the text field (lines
    read only to look: their skips are another range's to count)."""
    for _, obj, _, _ in jsonl_objects(path, SkipCounter(), start):
        if isinstance(obj, dict):
            if field_name in obj:
                return True
            count -= 1
            if count <= 0:
                return False
    return False


def raise_missing_field(path: Path, field_name: str, keys: list[str]) -> None:
    raise DataError(
        f"{path}: no line has the text field {field_name!r} "
        f"(fields found: {', '.join(keys) or 'none'}); pass "
        + option_choice("--text-field", "text_field", "NAME")
    )
