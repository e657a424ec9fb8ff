"""Document ids that are unique across input files without remembering any id.

A document id names where its document was read: the index of its input file (in the order the
inputs expand to, `corpus.expand_inputs`) and its record offset inside that file. Two files can
then never give the same id, whatever ids they carry themselves, and no set of seen ids (memory
growing with the corpus) is needed to prove it.

Bit layout of the int64 (the sign bit stays 0, so every id is >= 0):

    bit 63   bits 62..39               bits 38..0
    0        file index (24 bits)      offset inside the file (39 bits)

so up to 16,777,216 input files of up to 549,755,813,887 records each. `packtool pack` uses it
for tokenized Parquet inputs (offset = the row in the file, counted over its row groups); the
`doc_ids` of the shards then decode to the tokenized row, and `index.json` lists the files
(`extra.doc_ids.files`). For a single input file the id is simply the row number.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

from packtool.errors import DataError

FILE_BITS = 24
OFFSET_BITS = 39
MAX_FILES = 1 << FILE_BITS
MAX_OFFSET = (1 << OFFSET_BITS) - 1
SCHEME = "file_offset"
"""The name `index.json` records for this layout (`extra.doc_ids.scheme`)."""


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
    """(file index, offset inside the file) of each id; the inverse of `encode`."""
    if isinstance(doc_ids, (int, np.integer)):
        return int(doc_ids) >> OFFSET_BITS, int(doc_ids) & MAX_OFFSET
    ids = np.asarray(doc_ids, dtype=np.int64)
    return ids >> OFFSET_BITS, ids & MAX_OFFSET


def record(files: list[str]) -> dict[str, Any]:
    """What `index.json` records under `extra.doc_ids` for ids made from `files`."""
    return {"scheme": SCHEME, "file_bits": FILE_BITS, "offset_bits": OFFSET_BITS, "files": files}


def locate(extra: dict[str, Any], doc_id: int) -> tuple[str, int]:
    """(input file, row) a packed document came from, from a manifest's `extra`.

    Raises:
        DataError: the dataset's ids are not of this scheme, or the id names no listed file.
    """
    info = extra.get("doc_ids") or {}
    if info.get("scheme") != SCHEME:
        raise DataError(
            f"the dataset's doc ids are {info.get('scheme', 'sequential')!r}, not {SCHEME!r}: "
            "they number documents in reading order"
        )
    file_index, offset = decode(int(doc_id))
    files = info.get("files", [])
    if file_index >= len(files):
        raise DataError(
            f"doc id {doc_id} names input file {file_index}; the dataset lists {len(files)}"
        )
    return files[file_index], offset
