"""Document ids that are unique across input files without remembering any id.

A document id names where its document was read: the index of its input file (in the order the
inputs expand to, `corpus.expand_inputs`) and its record offset inside that file. Two files can
then never give the same id, whatever ids they carry themselves, and no set of seen ids (memory
growing with the corpus) is needed to prove it.

Bit layout of the int64 (the sign bit stays 0, so every id is >= 0):

    bit 63   bits 62..39               bits 38..0
    0        file index (24 bits)      offset inside the file (39 bits)

so up to 16,777,216 input files, and offsets up to 549,755,813,887 (512 GiB). `packtool pack`
numbers every document this way, with the offset in the unit of its file's kind:

- `byte`: JSON Lines (also `.gz` / `.zst`): the byte offset where the document's line starts
  (in the decompressed stream), so a worker reading any byte range of the file knows its ids
  without counting the lines before it, and the same line has the same id however the file is
  cut into partitions;
- `row`: Parquet (text, tokenized, pre-tokenized): the row in the file, counted over its row
  groups (a tokenized input's id then leads back to its tokenized row);
- `item`: a `.json` file holding one array: the element's index;
- `file`: a text file, one document: 0;
- fine-tuning records (prompt/completion, chat) take the unit of their file's type (`byte`,
  `item` or `row`), so a skipped record moves no later id; datasets packed before 2026-12-05
  record `record`: the k-th record the file contributed, skipped records not counted.

`index.json` records the scheme, the input files and each one's unit (`extra.doc_ids`); with
more than `INLINE_FILES` files the two lists go to `SOURCES_FILE` beside it, so that the
manifest every loader rank reads stays small (10^5 files are ~10 MB of paths). `locate` and
`where` turn an id back into a file and offset, and a `file:line N` a person can open.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.dataset.manifest import INDEX_FILE, SOURCES_FILE
from packtool.errors import DataError, json_value
from packtool.read.compressed import byte_place
from packtool.storage import local as storage
from packtool.storage.remote import scheme as remote_scheme

FILE_BITS = 24
OFFSET_BITS = 39
MAX_FILES = 1 << FILE_BITS
MAX_OFFSET = (1 << OFFSET_BITS) - 1
SCHEME = "file_offset"
"""The name `index.json` records for this layout (`extra.doc_ids.scheme`)."""
UNITS = ("byte", "row", "item", "file", "record")
"""What an offset counts, per input file (see the module docstring)."""
INLINE_FILES = 1000
"""Up to this many input files are listed inside `index.json`; more go to `SOURCES_FILE`."""
LINE_COUNT_BYTES = 256 << 20
"""A document's line is counted only where it starts below this byte: the count reads the file
up to the offset (1 GB of JSONL ~1.6 s, decompressed first for `.gz` / `.zst`; a bucket's object
is downloaded that far). Past it, its place is `file:byte B` (`where`)."""


def encode(file_index: int, offsets: NDArray[np.integer] | int) -> NDArray[np.int64] | int:
    """The ids of records at `offsets` inside input file `file_index`.

    Raises:
        DataError: the file index or an offset does not fit its bits.
    """
    if not 0 <= file_index < MAX_FILES:
        raise DataError(
            f"input file number {file_index} is beyond the {MAX_FILES:,} files ids can name"
        )
    if isinstance(offsets, (int, np.integer)):
        if not 0 <= offsets <= MAX_OFFSET:
            raise DataError(
                f"record {offsets} is beyond the {MAX_OFFSET + 1:,} records per file ids can name"
            )
        return (int(file_index) << OFFSET_BITS) | int(offsets)
    offsets = np.asarray(offsets, dtype=np.int64)
    if len(offsets) and (offsets.min() < 0 or offsets.max() > MAX_OFFSET):
        raise DataError(
            f"a record offset is beyond the {MAX_OFFSET + 1:,} records per file ids can name"
        )
    return (np.int64(file_index) << np.int64(OFFSET_BITS)) | offsets


def decode(doc_ids: NDArray[np.integer] | int) -> tuple[Any, Any]:
    """(file index, offset inside the file) of each id; the inverse of `encode`.

    Raises:
        DataError: an id is negative (`encode` makes none: its sign bit is 0). Decoded, -7 was
            file index -1, which Python's indexing took for the last input file.
    """
    if isinstance(doc_ids, (int, np.integer)):
        if doc_ids < 0:
            raise _negative(int(doc_ids))
        return int(doc_ids) >> OFFSET_BITS, int(doc_ids) & MAX_OFFSET
    ids = np.asarray(doc_ids, dtype=np.int64)
    if ids.size and ids.min() < 0:
        raise _negative(int(ids.flat[np.argmax(ids < 0)]))
    return ids >> OFFSET_BITS, ids & MAX_OFFSET


def _negative(doc_id: int) -> DataError:
    return DataError(
        f"doc id {doc_id} is negative (ids are file index << {OFFSET_BITS} | offset, never below 0)"
    )


def record(
    files: list[str],
    units: list[str] | None = None,
    *,
    sizes: list[int] | None = None,
    sources_sha256: str | None = None,
) -> dict[str, Any]:
    """What `index.json` records under `extra.doc_ids` for ids made from `files`.

    `units`: each file's offset unit (default `row` for all). `sizes`: each file's size in bytes
    when it was read (`where` counts a line only in a file of that size). With `sources_sha256`,
    the lists live in `SOURCES_FILE` (whose sha256 it is) and the record only counts them.
    """
    units = units if units is not None else ["row"] * len(files)
    head = {"scheme": SCHEME, "file_bits": FILE_BITS, "offset_bits": OFFSET_BITS}
    if sources_sha256 is not None:
        return {**head, "num_files": len(files), "sources": SOURCES_FILE, "sha256": sources_sha256}
    return {**head, "files": files, "units": units, **({"sizes": sizes} if sizes else {})}


def sources_bytes(files: list[str], units: list[str], sizes: list[int] | None = None) -> bytes:
    """The contents of `SOURCES_FILE` for `files` (when there are more than `INLINE_FILES`)."""
    import json

    data = {"files": files, "units": units, **({"sizes": sizes} if sizes else {})}
    return (json.dumps(data) + "\n").encode()


def _lists(info: dict[str, Any], directory: Any) -> tuple[list[str], list[str], list[Any]]:
    """(files, units, sizes): a size None where none was recorded (packed before they were)."""
    if "files" in info:
        files = info["files"]
        return files, info.get("units") or ["row"] * len(files), _sizes(info, len(files))
    if directory is None:
        raise DataError(f"the dataset lists its input files in {SOURCES_FILE}; pass its folder")
    from pathlib import Path

    name = info.get("sources", SOURCES_FILE)
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise DataError(
            f"{Path(directory) / INDEX_FILE}: extra.doc_ids.sources is {name!r}; expected a file "
            "name inside the dataset folder"
        )
    path = Path(directory) / name
    try:
        raw = storage.read_bytes(path)  # a regular file only (a FIFO would hang the read)
    except OSError as exc:
        raise DataError(f"{path}: unreadable list of input files ({exc})") from None
    want = info.get("sha256")
    if isinstance(want, str) and hashlib.sha256(raw).hexdigest() != want:
        # An edited list credits documents to the wrong files; index.json records its digest.
        raise DataError(
            f"{path}: its sha256 is not the one index.json records (doc_ids.sha256): the list "
            "of input files was changed or damaged"
        )
    try:
        data = json_value(raw)
        files, units = data["files"], data["units"]
    except (ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: unreadable list of input files ({exc})") from None
    count = info.get("num_files", len(files) if isinstance(files, list) else -1)
    if not (_texts(files) and _texts(units)) or not len(files) == len(units) == count:
        # As strictly as index.json's own lists (manifest_check): a file named 123 or ["a"]
        # was shown as "from 123:byte ..." or failed as an unhashable key.
        raise DataError(
            f"{path}: not {count} input files with their units (doc_ids.num_files in index.json)"
        )
    return files, units, _sizes(data, count)


def _texts(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _sizes(info: dict[str, Any], count: int) -> list[Any]:
    sizes = info.get("sizes")
    if isinstance(sizes, list) and len(sizes) == count:
        return [n if isinstance(n, int) and not isinstance(n, bool) else None for n in sizes]
    return [None] * count


def input_files(extra: dict[str, Any], directory: Any = None) -> tuple[list[str], list[str]]:
    """(files, units) a `file_offset` dataset's ids name, read (and checked against the
    recorded sha256) from `SOURCES_FILE` where the manifest keeps them there."""
    return _lists(extra.get("doc_ids") or {}, directory)[:2]


def locate(extra: dict[str, Any], doc_id: int, directory: Any = None) -> tuple[str, int]:
    """(input file, offset) a packed document came from, from a manifest's `extra`.

    `directory`: the dataset folder, needed when the files are listed in `SOURCES_FILE`.

    Raises:
        DataError: the dataset's ids are not of this scheme, or the id names no listed file.
    """
    file, offset, _ = source(extra, doc_id, directory)
    return file, offset


def source(extra: dict[str, Any], doc_id: int, directory: Any = None) -> tuple[str, int, str]:
    """(input file, offset, unit) a packed document came from (see `locate`)."""
    return _origin(_listed(extra, directory), doc_id)[:3]


def place(extra: dict[str, Any], doc_id: int, directory: Any = None) -> str:
    """`where` a packed document came from, its line counted only in a file of the size
    recorded when it was packed (see `source`)."""
    file, offset, unit, size = _origin(_listed(extra, directory), doc_id)
    return where(file, offset, unit, size=size)


def places(extra: dict[str, Any], doc_ids: Any, directory: Any = None) -> list[str]:
    """`place` of each document (a row's), the lines counted in one scan per file; an id that
    names no listed file is `unknown (why)`.

    Raises:
        DataError: the dataset's ids are not of this scheme, or its list of files is damaged.
    """
    listed = _listed(extra, directory)
    origins: list[Any] = []
    for doc_id in doc_ids:
        try:
            origins.append(_origin(listed, doc_id))
        except DataError as exc:
            origins.append(f"unknown ({exc})")
    offsets: dict[tuple[str, Any], list[int]] = {}
    for o in origins:
        if not isinstance(o, str) and o[2] == "byte":
            offsets.setdefault((o[0], o[3]), []).append(o[1])
    numbers = {key: _line_numbers(key[0], found, key[1]) for key, found in offsets.items()}
    return [
        o
        if isinstance(o, str)
        else _byte_place(o[0], o[1], numbers[o[0], o[3]].get(o[1]))
        if o[2] == "byte"
        else where(*o[:3])
        for o in origins
    ]


def _listed(extra: dict[str, Any], directory: Any) -> tuple[list[str], list[str], list[Any]]:
    info = extra.get("doc_ids") or {}
    if info.get("scheme") != SCHEME:
        raise DataError(
            f"the dataset's doc ids are {info.get('scheme', 'sequential')!r}, not {SCHEME!r}: "
            "they number documents in reading order"
        )
    return _lists(info, directory)


def _origin(
    listed: tuple[list[str], list[str], list[Any]], doc_id: int
) -> tuple[str, int, str, Any]:
    """(file, offset, unit, size recorded or None) of `doc_id` in `_listed`'s lists."""
    files, units, sizes = listed
    file_index, offset = decode(int(doc_id))
    if not 0 <= file_index < len(files):  # (decode refuses a negative id: never below 0)
        raise DataError(
            f"doc id {doc_id} names input file {file_index}; the dataset lists {len(files)}"
        )
    return files[file_index], offset, units[file_index], sizes[file_index]


def where(
    file: str, offset: int, unit: str, *, count_lines: bool = True, size: int | None = None
) -> str:
    """`file:line N (byte B)`, `file:row N`, `file:item N` or `file`: a document's place.

    A line number is counted from the byte offset (one read of the file up to it) only when
    the offset is below `LINE_COUNT_BYTES` and the file found is `size` bytes, the size
    recorded when it was packed: a relative path resolved from another folder, or a file
    changed since, names other lines (and a line can start at the byte there too). Else, with
    `count_lines=False`, or when the file is gone: `file:byte B`.
    """
    if unit == "byte":
        numbers = _line_numbers(file, [offset], size) if count_lines else {}
        return _byte_place(file, offset, numbers.get(offset))
    if unit == "record":  # an older dataset's fine-tuning ids: skipped records not counted
        return f"{file}:record {offset} of those kept"
    if unit in ("row", "item"):
        return f"{file}:{unit} {offset}"
    return file


def _byte_place(file: str, offset: int, line: int | None) -> str:
    """`file:line N (byte B)` or `file:byte B`; B is said to be of the decompressed text for a
    `.gz` / `.zst` (`compressed.byte_place`: until 2026-12-07 it read as the file's own byte)."""
    byte = byte_place(file, offset)
    return f"{file}:{byte}" if line is None else f"{file}:line {line} ({byte})"


def _line_numbers(file: str, offsets: list[int], size: int | None) -> dict[int, int | None]:
    """`lines.line_numbers` of the `offsets` below `LINE_COUNT_BYTES` in `file` (one scan up
    to the last of them), or {} where lines are not counted: no size recorded, a file of
    another size, or one that is no regular file."""
    offsets = [o for o in offsets if o < LINE_COUNT_BYTES]  # the read is bounded by the cap
    # A dataset names its files; one handed to us may name a FIFO (the read waited for ever)
    # or a device (read up to the offset): lines are counted in regular files only. Nor at
    # any web address it names (a dataset from elsewhere made inspect fetch from hosts it
    # chose, a cloud's metadata address included); a bucket's object is read through the
    # endpoint and credentials the user set.
    local = not storage.is_remote(file)
    if not offsets or size is None or remote_scheme(file) in ("http", "https"):
        return {}
    if local and not storage.is_file(file):
        return {}
    from packtool.read.lines import line_numbers

    try:  # an object in a bucket too (`Path(url)` was no file: the line was dropped)
        if storage.size(file) != size:
            return {}
        return line_numbers(storage.as_path(file), offsets)
    except (OSError, EOFError, DataError):
        return {}
