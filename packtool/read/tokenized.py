"""Tokenized Parquet read back as input: every row checked, and ids unique across files.

`packtool pack` and `packtool stats` trust nothing in a tokenized file they did not just write:
it may come from another tool, be edited by hand, or be damaged. Each row group read goes
through `checked_table`, vectorised over the whole row group (a min/max and a comparison, small
next to decompressing it), so that every input `pack` accepts makes a dataset `verify` accepts:

- `input_ids` is a list of integer ids, none null, each in `0 .. vocab_size - 1` of the
  recorded tokenizer; they are cast to the contract's token type (uint16 when every id of the
  vocabulary fits, else uint32), which is what the shards are written in;
- `length` equals the number of ids of its row;
- a `loss_mask` holds one 0 or 1 per id (`dataset.tokenized.checked_mask`, which `stats` uses
  too: a mask of 2s or of the wrong length was packed, or failed in the packer naming no file);
- a row of no id is an `empty` skip (counted; an error with `--strict`), as an empty text or
  empty pre-tokenized ids are: it was a document to `stats` and `tokenize` and `empty` to `pack`;
- `doc_id` is replaced by `packtool.read.docids.encode(file index, row in the file)`: the ids two
  separately tokenized files carry (both 0, 1, 2, ...) can then never collide, and no set of
  seen ids is kept. The original `doc_id` stays in the tokenized file, at that row.

A problem is a `DataError` naming the file and the row.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrow_numpy import from_numpy
from packtool.dataset.columns import LOSS_MASK
from packtool.dataset.identity import TokenizerIdentity, token_dtype
from packtool.dataset.tokenized import checked_mask
from packtool.errors import DataError
from packtool.read import docids
from packtool.read.documents import SkipCounter
from packtool.read.pretokenized import as_strings
from packtool.storage import local as storage


def checked_table(
    table: pa.Table,
    *,
    path: Path,
    first_row: int,
    file_index: int,
    identity: TokenizerIdentity,
    schema: pa.Schema,
    skips: SkipCounter,
) -> pa.Table:
    """One row group of a tokenized file, checked, as a table of `schema`: ids cast, doc ids
    renumbered, the other columns in the format's types, rows of no id left out (`skips`).

    Args:
        table: the row group (columns doc_id, source, input_ids, length, loss_mask, extras).
        path: its file, for messages.
        first_row: the row group's first row within the file.
        file_index: the file's position among the inputs (see `packtool.read.docids`).
        identity: the tokenizer recorded in the file.
        schema: the tokenized schema of the run (`dataset.tokenized.tokenized_schema`).
        skips: counts the rows of no id, `empty`.

    Raises:
        DataError: a null, out-of-vocabulary or mistyped id, a null or wrong `length`, a loss
            mask that is not one 0/1 value per id, a null `source`, or a column that cannot be
            read as its type (an extra field of bytes that are not UTF-8).
    """

    def fail(row: int, what: str) -> DataError:
        return DataError(f"{path}: row {first_row + row}: {what}")

    ids = table.column("input_ids").combine_chunks()
    if not (pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type)) or not (
        pa.types.is_integer(ids.type.value_type)
    ):
        raise DataError(f"{path}: input_ids is {ids.type}, not a list of integer token ids")
    if ids.null_count:
        raise fail(_first_null(ids), "null input_ids")
    offsets = ids.offsets.to_numpy().astype(np.int64)
    values = ids.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    offsets -= offsets[0]
    if values.null_count:
        raise fail(_row_of(_first_null(values), offsets), "a null token id")
    vocab = identity.vocab_size
    if len(values):
        extremes = pc.min_max(values)
        if extremes["min"].as_py() < 0 or extremes["max"].as_py() >= vocab:
            v = values.to_numpy()
            pos = int(np.flatnonzero((v < 0) | (v >= vocab))[0])
            raise fail(
                _row_of(pos, offsets),
                f"token id {v[pos]} is outside the vocabulary of the recorded tokenizer "
                f"({identity.kind}:{identity.name}, ids 0..{vocab - 1}); the file is damaged or "
                "does not match its metadata",
            )
    lengths = np.diff(offsets)
    length = table.column("length")
    if not pa.types.is_integer(length.type):  # a float 9.9 would compare as 9.9, not 9
        raise DataError(f"{path}: column 'length' holds {length.type}, not integer token counts")
    if length.null_count:  # `int(nan)` in the message below was a ValueError traceback
        raise fail(_first_null(length), "no length (null)")
    recorded = length.to_numpy()
    if not np.array_equal(recorded, lengths):
        row = int(np.flatnonzero(recorded != lengths)[0])
        raise fail(row, f"length is {recorded[row]} but the row has {lengths[row]} ids")
    token_type = pa.from_numpy_dtype(token_dtype(vocab))
    if ids.type.value_type != token_type or not pa.types.is_list(ids.type):
        ids = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values.cast(token_type))
    n = table.num_rows
    new_ids = docids.encode(file_index, np.arange(first_row, first_row + n, dtype=np.int64))
    columns: dict[str, Any] = {
        "doc_id": pa.array(new_ids, pa.int64()),
        "input_ids": ids,
        "length": pa.array(lengths.astype(np.int32), pa.int32()),
    }
    if LOSS_MASK in schema.names:
        columns[LOSS_MASK] = checked_mask(table.column(LOSS_MASK), lengths, path, first_row)
    # `source` and the extra fields as the format stores them, strings; another writer's
    # list, struct or binary column is kept as the pre-tokenized reader keeps one (JSON text,
    # UTF-8), where `Table.cast` was an Arrow traceback
    for name in [f.name for f in schema if f.name not in columns]:
        col = as_strings(table.column(name), name, str(path))
        if name == "source" and col.null_count:  # no file to say a document came from
            raise fail(_first_null(col), "null source (the file the document came from)")
        columns[name] = col
    table = pa.Table.from_pydict(columns, schema=schema)
    if lengths.all():
        return table
    for row in np.flatnonzero(lengths == 0).tolist():
        skips.add("empty", f"{path}:row {first_row + row}", "no token id")
    return table.filter(from_numpy(lengths > 0))


def _first_null(arr: pa.Array | pa.ChunkedArray) -> int:
    """The position of the first null of `arr`."""
    return int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])


def _row_of(position: int, offsets: np.ndarray) -> int:
    """The row whose ids hold flat position `position`."""
    return int(np.searchsorted(offsets, position, side="right") - 1)


def read_tokenized_file(
    path: Path,
    file_index: int,
    schema: pa.Schema,
    identity: TokenizerIdentity,
    skips: SkipCounter,
    start: int = 0,
    end: int = -1,
) -> Iterator[tuple[pa.Table, int]]:
    """Row groups `[start, end)` (-1: to the last) of tokenized file number `file_index`, checked
    (`checked_table`, rows of no id counted in `skips`), as tables of `schema`, with the row
    group's bytes."""
    columns = schema.names
    # Page CRC32s, where the writer stored them (packtool tokenize does), catch a damaged page.
    pf = storage.parquet_file(path, page_checksum_verification=True)
    names = pf.schema_arrow.names
    missing = [c for c in columns if c not in names]
    if missing:
        raise DataError(
            f"{path}: no column {missing[0]!r} (columns: {', '.join(names)}); "
            "extra fields must be chosen when tokenizing"
        )
    stop = pf.num_row_groups if end == -1 else end
    row = sum(pf.metadata.row_group(g).num_rows for g in range(start))
    for rg in range(start, stop):
        try:
            table = pf.read_row_group(rg, columns=columns)
        except (pa.ArrowException, OSError) as exc:
            raise DataError(f"{path}: row group {rg} unreadable ({exc})") from None
        # Ids checked against the vocabulary, doc ids made unique across files (docids.py).
        rows = table.num_rows
        table = checked_table(
            table,
            path=path,
            first_row=row,
            file_index=file_index,
            identity=identity,
            schema=schema,
            skips=skips,
        )
        row += rows
        yield table, pf.metadata.row_group(rg).total_byte_size
