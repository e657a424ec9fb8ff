"""What packtool reads of a SentencePiece model itself: each piece's type.

`sentencepiece`'s Python API tells control, unknown, unused and byte pieces apart, not
user-defined ones (pieces always matched whole in the text, such as Mistral v3 / v7's `[REF]`),
and its protobuf classes need the `protobuf` package, which packtool does not depend on. A model
file is a protobuf `ModelProto` whose field 1 repeats `SentencePiece {piece = 1; score = 2;
type = 3}`; the few lines below read that field from the wire format and skip every other.

Records in: the serialized model (`SentencePieceProcessor.serialized_model_proto()`). Out: the
texts of its pieces of one type.
"""

from __future__ import annotations

USER_DEFINED = 4
"""`SentencePiece.Type.USER_DEFINED` (NORMAL 1, UNKNOWN 2, CONTROL 3, UNUSED 5, BYTE 6)."""


def pieces_of_type(model: bytes, kind: int) -> list[str]:
    """The pieces of `model` whose type is `kind`, in id order."""
    out = []
    for field, value in _fields(model):
        if field == 1 and isinstance(value, bytes):
            piece, type_ = "", 1  # NORMAL when the field is absent (proto2 default)
            for f, v in _fields(value):
                if f == 1 and isinstance(v, bytes):
                    piece = v.decode("utf-8", "replace")
                elif f == 3 and isinstance(v, int):
                    type_ = v
            if type_ == kind:
                out.append(piece)
    return out


def _fields(data: bytes):  # type: ignore[no-untyped-def]
    """(field number, value) of one message: varints as ints, length-delimited as bytes."""
    i, n = 0, len(data)
    while i < n:
        key, i = _varint(data, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(data, i)
            yield field, value
        elif wire == 2:
            size, i = _varint(data, i)
            yield field, data[i : i + size]
            i += size
        elif wire == 5:
            i += 4
        elif wire == 1:
            i += 8
        else:  # groups (3, 4) are not in a SentencePiece model
            raise ValueError(f"unexpected protobuf wire type {wire}")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if i >= len(data):
            raise ValueError("truncated protobuf varint")
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, i
        shift += 7
