"""Joining Parquet files written in parallel into the file one writer would have written.

pyarrow writes one file on one thread. A shard's row groups can be written as *parts*, each a
complete Parquet file from its own writer (same schema, same options), on several threads at
once (the writer releases the GIL); `stitch(parts)` then returns the bytes the single sequential
writer would have produced: its pages are the parts' pages, unchanged (a page holds no file
offset), and its footer is the first part's footer with every part's row groups appended,
their file offsets moved by the bytes written before them, their ordinals renumbered and the
row count summed.

The footer is Thrift's compact protocol. This module reads it into a generic tree (field id,
type, value: nothing about Parquet's structs but the fields it moves) and writes it back;
`stitch` checks that writing each part's footer back gives exactly its bytes, and refuses
(`StitchError`) a footer holding anything whose offsets it does not move (page indexes, bloom
filters, encryption, column chunks in other files). A caller then writes the rows again with one
writer. No library does this: pyarrow's `FileMetaData.append_row_groups` merges footers for
`_metadata` files but leaves the offsets as they were (no Python package here speaks Thrift's
compact protocol for Parquet without pulling in a second Parquet implementation).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

MAGIC = b"PAR1"

# Compact protocol type codes.
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
_INTS = (_I16, _I32, _I64)

# Field ids (parquet.thrift) of what a stitch moves or refuses.
_FM_NUM_ROWS, _FM_ROW_GROUPS = 3, 4
_FM_ENCRYPTED = (8, 9)  # encryption_algorithm, footer_signing_key_metadata
_RG_COLUMNS, _RG_FILE_OFFSET, _RG_ORDINAL = 1, 5, 7
_CC_FILE_PATH, _CC_FILE_OFFSET, _CC_META = 1, 2, 3
_CC_REFUSED = (4, 6, 8, 9)  # offset index, column index, crypto metadata, encrypted metadata
_CM_OFFSETS = (9, 11)  # data_page_offset, dictionary_page_offset
_CM_REFUSED = (10, 14)  # index_page_offset, bloom_filter_offset


class StitchError(ValueError):
    """The parts cannot be joined exactly (write the rows with one writer instead)."""


# --- Thrift compact protocol: struct = list of [field id, type, value] in file order ---------


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def byte(self) -> int:
        b = self.data[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        shift = out = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if not b & 0x80:
                return out
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, kind: int) -> object:
        if kind in _INTS:
            return self.zigzag()
        if kind == _BYTE:
            return self.byte()
        if kind == _DOUBLE:
            self.pos += 8
            return self.data[self.pos - 8 : self.pos]
        if kind == _BINARY:
            n = self.varint()
            self.pos += n
            return self.data[self.pos - n : self.pos]
        if kind in (_LIST, _SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            # a bool element is one byte (1 true, 2 false), like _BYTE
            return [
                elem,
                [self.value(_BYTE if elem in (_TRUE, _FALSE) else elem) for _ in range(size)],
            ]
        if kind == _STRUCT:
            return self.struct()
        raise StitchError(f"unsupported Thrift compact type {kind} in a Parquet footer")

    def struct(self) -> list[list]:
        fields: list[list] = []
        last = 0
        while True:
            head = self.byte()
            if head == 0:
                return fields
            kind, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            value = kind == _TRUE if kind in (_TRUE, _FALSE) else self.value(kind)
            fields.append([fid, kind, value])
            last = fid


def _varint(n: int, out: bytearray) -> None:
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)


def _zigzag(n: int, out: bytearray) -> None:
    _varint((n << 1) ^ (n >> 63), out)


def _write_value(kind: int, value: object, out: bytearray) -> None:
    if kind in _INTS:
        _zigzag(value, out)  # type: ignore[arg-type]
    elif kind == _BYTE:
        out.append(value)  # type: ignore[arg-type]
    elif kind == _DOUBLE:
        out += value  # type: ignore[operator]
    elif kind == _BINARY:
        _varint(len(value), out)  # type: ignore[arg-type]
        out += value  # type: ignore[operator]
    elif kind in (_LIST, _SET):
        elem, items = value  # type: ignore[misc]
        if len(items) < 15:
            out.append(len(items) << 4 | elem)
        else:
            out.append(0xF0 | elem)
            _varint(len(items), out)
        for item in items:
            _write_value(_BYTE if elem in (_TRUE, _FALSE) else elem, item, out)
    elif kind == _STRUCT:
        _write_struct(value, out)  # type: ignore[arg-type]
    else:  # pragma: no cover - the reader refuses it first
        raise StitchError(f"unsupported Thrift compact type {kind}")


def _write_struct(fields: list[list], out: bytearray) -> None:
    last = 0
    for fid, kind, value in fields:
        if kind in (_TRUE, _FALSE):
            kind = _TRUE if value else _FALSE
        delta = fid - last
        if 0 < delta <= 15:
            out.append(delta << 4 | kind)
        else:
            out.append(kind)
            _zigzag(fid, out)
        if kind not in (_TRUE, _FALSE):
            _write_value(kind, value, out)
        last = fid
    out.append(0)


def parse_footer(data: bytes) -> list[list]:
    """A Thrift compact struct (a Parquet footer) as [[field id, type, value], ...]."""
    reader = _Reader(data)
    fields = reader.struct()
    if reader.pos != len(data):
        raise StitchError("trailing bytes after the Parquet footer")
    return fields


def write_footer(fields: list[list]) -> bytes:
    """`parse_footer`'s inverse."""
    out = bytearray()
    _write_struct(fields, out)
    return bytes(out)


# --- the stitch --------------------------------------------------------------------------------


def _field(fields: list[list], fid: int) -> list | None:
    return next((f for f in fields if f[0] == fid), None)


def footer_of(tail: bytes, size: int) -> tuple[int, bytes]:
    """(bytes of row groups, raw footer) of a Parquet file of `size` bytes from its last bytes
    (`tail`: at least the footer and the 8 bytes after it)."""
    if size < 12 or tail[-4:] != MAGIC:
        raise StitchError("a part is not a complete Parquet file")
    n = int.from_bytes(tail[-8:-4], "little")
    if n + 8 > len(tail) or n + 12 > size:
        raise StitchError("a part's footer is longer than the part")
    return size - 12 - n, tail[-8 - n : -8]


def _parsed(raw: bytes) -> list[list]:
    footer = parse_footer(raw)
    if write_footer(footer) != raw:
        raise StitchError("a part's footer does not read back to the same bytes")
    if any(_field(footer, fid) for fid in _FM_ENCRYPTED):
        raise StitchError("an encrypted footer")
    return footer


def _move(row_group: list[list], shift: int, ordinal: int) -> None:
    """Move one row group's offsets by `shift` bytes and renumber it `ordinal`."""
    for field in row_group:
        if field[0] == _RG_FILE_OFFSET:
            field[2] += shift
        elif field[0] == _RG_ORDINAL:
            field[2] = ((ordinal + 2**15) % 2**16) - 2**15  # the writer's int16 cast
        elif field[0] == _RG_COLUMNS:
            for chunk in field[2][1]:
                _move_chunk(chunk, shift)


def _move_chunk(chunk: list[list], shift: int) -> None:
    for field in chunk:
        if field[0] in _CC_REFUSED or field[0] == _CC_FILE_PATH:
            raise StitchError("a column chunk with page indexes, encryption or in another file")
        if field[0] == _CC_FILE_OFFSET and field[2]:  # pyarrow writes 0 (deprecated field)
            field[2] += shift
        elif field[0] == _CC_META:
            for meta in field[2]:
                if meta[0] in _CM_REFUSED:
                    raise StitchError("a column chunk with a bloom filter or an index page")
                if meta[0] in _CM_OFFSETS:
                    meta[2] += shift


def stitched_footer(parts: Sequence[tuple[int, bytes]]) -> bytes:
    """The end of the joined file (footer, its length, the magic) for parts given as
    (bytes of row groups, raw footer) each (`footer_of`); the file is the magic, then every
    part's row groups in order, then this.

    Raises:
        StitchError: the parts differ in anything but their row groups, or hold something
            this module does not move (see the module docstring).
    """
    footers = [_parsed(raw) for _, raw in parts]
    first = footers[0]
    head = [f for f in first if f[0] not in (_FM_NUM_ROWS, _FM_ROW_GROUPS)]
    row_groups = _field(first, _FM_ROW_GROUPS)
    num_rows = _field(first, _FM_NUM_ROWS)
    if row_groups is None or num_rows is None:
        raise StitchError("a part's footer has no row groups")
    offset = parts[0][0]
    for (body, _), footer in zip(parts[1:], footers[1:], strict=True):
        if [f for f in footer if f[0] not in (_FM_NUM_ROWS, _FM_ROW_GROUPS)] != head:
            raise StitchError("the parts' schemas or metadata differ")
        more = _field(footer, _FM_ROW_GROUPS)
        rows = _field(footer, _FM_NUM_ROWS)
        if more is None or rows is None:
            raise StitchError("a part's footer has no row groups")
        for rg in more[2][1]:
            _move(rg, offset, len(row_groups[2][1]))
            row_groups[2][1].append(rg)
        num_rows[2] += rows[2]
        offset += body
    footer_bytes = write_footer(first)
    return footer_bytes + struct.pack("<I", len(footer_bytes)) + MAGIC


def stitch(parts: Sequence[bytes]) -> bytes:
    """`stitched_footer` on whole files in memory: the joined file's bytes."""
    if len(parts) == 1:
        return parts[0]
    split = [footer_of(p, len(p)) for p in parts]
    bodies = [p[4 : 4 + n] for p, (n, _) in zip(parts, split, strict=True)]
    return b"".join([MAGIC, *bodies, stitched_footer(split)])
