"""The packed-shard columns, declared once: what every part of packtool derives its schema from.

A column is a name, a dtype (or the rule `TOKEN`: uint16 when the vocabulary fits, else uint32),
whether every dataset has it, and what one entry describes:

- `TOKEN`: one value per token, a list as long as the row's `input_ids` (e.g. `loss_mask`);
- `DOCUMENT`: one value per document in the row (`doc_ids`, `doc_chunks`);
- `OFFSETS`: the row's document boundaries (`doc_offsets`, documents + 1 entries);
- `ROW`: one scalar per row (none is declared yet; schema, `index.json` and `verify` handle it,
  the packer and the loader do not produce or read one).

A per-token column of one byte per token may be stored as `BYTES` (one binary value per row, the
values' bytes) rather than a list: `loss_mask` is, because Parquet decodes lists value by value.

A column may be *derived*: computed from other columns of the same row by a declared rule
(`Derivation`), such as `seq_lengths` = diff(`doc_offsets`), the per-row document lengths TRL's
packed format reads, so that `datasets.load_dataset` on a packtool folder feeds TRL directly.
`pack` writes every derived column for every new dataset (`with_derived`), `verify` checks the
stored values against the rule, it is never carried from the tokenized inputs, and it is
optional: datasets packed before it was declared lack it and stay valid (readers that need it
compute it with the same rule).

From `SHARD_COLUMNS` come the Parquet schema the shards are written with (`packed_schema`), the
`columns` list `index.json` records (format version 2), the schema and per-column checks of
`packtool verify` (list lengths by level, the declared value range, `every_document_positive`),
what `inspect` shows, the optional columns the tokenized Parquet may carry and that `pack` moves
with `input_ids` (`TOKEN` columns with the same offsets, `DOCUMENT` columns one value per piece),
and what the loader decodes, gathers and sends between processes (`loaded`).

Nothing else hard-codes an optional column's name, except where its meaning is used
(`loss_mask` -> labels in `loader/collate.py`; labels -> `loss_mask` in
`packtool/read/pretokenized.py`). docs/CONTRACTS.md says how to add a column.

Always look columns up through the functions here (`declared`, `get`, ...), never by copying
`SHARD_COLUMNS` at import: tests extend the declaration and expect every part to follow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from packtool.errors import DataError

if TYPE_CHECKING:
    import pyarrow as pa

TOKEN_DTYPE = "token"
"""The dtype rule of token ids: uint16 when every id is below 65,536, else uint32."""
TOKEN, DOCUMENT, OFFSETS, ROW = "token", "document", "offsets", "row"
LEVELS = (TOKEN, DOCUMENT, OFFSETS, ROW)
LIST, BYTES = "list", "bytes"
"""`Column.storage`: a Parquet list per row, or one binary value per row."""
IGNORE_INDEX = -100
"""The label that means "no loss here" (transformers, TRL, torch's cross_entropy default): what
labels carry where `loss_mask` is 0, at a document's last token and on padding. attention/model.py
keeps its own copy (it imports nothing of packtool); tests/attention/test_model.py pins the two equal."""
LOSS_MASK = "loss_mask"
SEQ_LENGTHS = "seq_lengths"
"""TRL's name for a row's document lengths (`trl.DataCollatorForLanguageModeling`)."""

Parts = Mapping[str, tuple[NDArray[np.int64], np.ndarray]]
"""Columns of some rows by name: (row offsets into the values, starting at 0; flat values)."""


@dataclass(frozen=True, kw_only=True)
class Derivation:
    """How a derived column is computed from other columns of the same rows."""

    inputs: tuple[str, ...]
    """The columns it is computed from (required ones, so every dataset can compute it)."""
    compute: Callable[[Parts], tuple[NDArray[np.int64], np.ndarray]]
    """Parts of `inputs` for some rows -> (row offsets from 0, flat values) of the column."""
    rule: str
    """The rule in words, for docs and `verify`'s messages."""


def piece_lengths(parts: Parts) -> tuple[NDArray[np.int64], NDArray[np.int32]]:
    """Each row's document (piece) lengths: the differences of its `doc_offsets`.

    Vectorised over all rows: the steps between consecutive flat offsets, less the step from one
    row's last offset to the next row's first. A row with k offsets has k - 1 lengths (none for
    a damaged row with no offset, which `verify` reports on its own).
    """
    off, values = parts["doc_offsets"]
    off = np.asarray(off, dtype=np.int64)
    flat = np.asarray(values, dtype=np.int64)
    entries = np.diff(off)
    row_start = np.zeros(len(flat), dtype=bool)
    row_start[off[:-1][entries > 0]] = True
    lengths = np.diff(flat)[~row_start[1:]].astype(np.int32)
    per_row = np.maximum(entries - 1, 0)
    return np.concatenate([[0], np.cumsum(per_row)]).astype(np.int64), lengths


@dataclass(frozen=True, kw_only=True)
class Column:
    """One shard column."""

    name: str
    dtype: str
    """A numpy dtype name (`int32`, `uint8`, ...) or `TOKEN_DTYPE`."""
    level: str
    """`TOKEN`, `DOCUMENT`, `OFFSETS` or `ROW` (what one entry describes)."""
    required: bool
    """Every dataset has it (format 1 had exactly the required columns)."""
    doc: str
    """One line for docs, `inspect` and error messages."""
    min_value: int | None = None
    """`verify`: every value is at least this (None: no bound, beyond the dtype's)."""
    max_value: int | None = None
    """`verify`: every value is at most this (token ids are checked against vocab_size)."""
    every_document_positive: bool = False
    """`verify`: each document holds a non-zero value past its first token (a supervised token
    the loader can make a target: labels shift, so a document's first token never is one)."""
    loaded: bool = False
    """An optional column the loader decodes and carries in its records (`TOKEN`/`DOCUMENT`)."""
    storage: str = LIST
    """How a row's values are stored: `LIST` (a Parquet list, the default) or `BYTES` (one
    binary value per row holding the values' bytes; only for a one-byte dtype per token).
    Parquet decodes a list value by value (with its repetition levels) at about the speed of the
    ids, while a binary value decodes as one copy, ~20x faster: a 0/1 mask stored as bytes
    costs the loader a few percent instead of a third (README, "What a loss mask costs")."""
    derived: Derivation | None = None
    """Computed from other columns of the row: written by `pack` for every new dataset, checked
    against the rule by `verify`, never read from the tokenized inputs (module docstring)."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"column {self.name}: level {self.level!r} is not one of {LEVELS}")
        if self.storage not in (LIST, BYTES):
            raise ValueError(f"column {self.name}: storage {self.storage!r} is not list or bytes")
        one_byte = self.dtype != TOKEN_DTYPE and np.dtype(self.dtype).itemsize == 1
        if self.storage == BYTES and (self.level != TOKEN or not one_byte):
            raise ValueError(f"column {self.name}: bytes storage needs one byte per token")
        if self.derived is not None and self.required:
            # Datasets packed before the column was declared lack it and must stay readable.
            raise ValueError(f"column {self.name}: a derived column cannot be required")

    def numpy_dtype(self, token_dtype: np.dtype | type = np.uint32) -> np.dtype:
        return np.dtype(token_dtype if self.dtype == TOKEN_DTYPE else self.dtype)

    def arrow_type(self, token_type: pa.DataType | None = None) -> pa.DataType:
        """The Arrow value type (of the list's items, except for `ROW` columns)."""
        import pyarrow as pa

        if self.dtype == TOKEN_DTYPE:
            return token_type or pa.uint32()
        return pa.from_numpy_dtype(np.dtype(self.dtype))

    def field(self, token_type: pa.DataType | None = None) -> pa.Field:
        """The shard schema's field: a list (or binary) per row, a scalar for `ROW` columns."""
        import pyarrow as pa

        value = self.arrow_type(token_type)
        if self.level == ROW:
            kind = value
        else:
            kind = pa.binary() if self.storage == BYTES else pa.list_(value)
        return pa.field(self.name, kind, nullable=False)

    def array(
        self, offsets: np.ndarray, values: np.ndarray, token_type: pa.DataType | None = None
    ) -> pa.Array:
        """A shard column from int32 row offsets and flat values, in this column's storage."""
        import pyarrow as pa

        from packtool.arrow_numpy import from_numpy

        offsets = from_numpy(np.asarray(offsets, np.int32))
        if self.storage == BYTES:
            data = np.ascontiguousarray(values, self.numpy_dtype())
            return pa.Array.from_buffers(
                pa.binary(), len(offsets) - 1, [None, offsets.buffers()[1], pa.py_buffer(data)]
            )
        return pa.ListArray.from_arrays(offsets, from_numpy(values, self.arrow_type(token_type)))

    def derive(self, parts: Parts) -> pa.Array:
        """This derived column for the rows of `parts` (which hold its `derived.inputs`)."""
        if self.derived is None:
            raise ValueError(f"column {self.name} is not derived")
        offsets, values = self.derived.compute(parts)
        if self.level == ROW:
            from packtool.arrow_numpy import from_numpy

            return from_numpy(values, self.arrow_type())
        return self.array(offsets, values)


SHARD_COLUMNS: tuple[Column, ...] = (
    Column(
        name="input_ids",
        dtype=TOKEN_DTYPE,
        level=TOKEN,
        required=True,
        doc="the row's token ids, documents back to back, unpadded",
    ),
    Column(
        name="doc_offsets",
        dtype="int32",
        level=OFFSETS,
        required=True,
        doc="the row's cu_seqlens: starts at 0, ends at the row length",
    ),
    Column(
        name="doc_ids",
        dtype="int64",
        level=DOCUMENT,
        required=True,
        doc="the source document of each piece",
    ),
    Column(
        name="doc_chunks",
        dtype="int32",
        level=DOCUMENT,
        required=True,
        doc="the chunk index of each piece of a split document, 0 otherwise",
        min_value=0,
    ),
    Column(
        name=LOSS_MASK,
        dtype="uint8",
        level=TOKEN,
        required=False,
        doc="1 where the token is a target of the loss (supervised), 0 where it is not",
        min_value=0,
        max_value=1,
        every_document_positive=True,
        loaded=True,
        storage=BYTES,
    ),
    Column(
        name=SEQ_LENGTHS,
        dtype="int32",
        level=DOCUMENT,
        required=False,
        doc="each piece's length, diff(doc_offsets): TRL's packed format",
        derived=Derivation(
            inputs=("doc_offsets",), compute=piece_lengths, rule="the differences of doc_offsets"
        ),
        # The loader has doc_offsets; this column is for readers that only take lengths.
        loaded=False,
    ),
)
"""Every shard column, in the order shards store them."""


def declared() -> tuple[Column, ...]:
    """The declaration (read at call time, so an extended declaration reaches every part)."""
    return SHARD_COLUMNS


def get(name: str) -> Column:
    """The column called `name` (`KeyError` naming the known ones)."""
    for c in declared():
        if c.name == name:
            return c
    raise KeyError(f"no shard column {name!r} (declared: {', '.join(names(declared()))})")


def names(columns: Iterable[Column]) -> tuple[str, ...]:
    return tuple(c.name for c in columns)


def required() -> tuple[Column, ...]:
    return tuple(c for c in declared() if c.required)


def optional() -> tuple[Column, ...]:
    return tuple(c for c in declared() if not c.required)


def derived() -> tuple[Column, ...]:
    """The derived columns (`Column.derived`), in declaration order."""
    return tuple(c for c in declared() if c.derived is not None)


def written(carried: Iterable[str] = ()) -> tuple[str, ...]:
    """The columns `pack` writes for inputs that carry the optional columns `carried`: the
    required ones, those, and every derived column, in declaration order."""
    return names(resolve([*names(required()), *carried, *names(derived())]))


def with_derived(table: pa.Table) -> pa.Table:
    """`table` (packed rows) with every derived column it lacks, columns in declaration order.

    What `pack` writes; a table without a derived column's inputs is returned without it.
    """
    for c in derived():
        if c.name in table.column_names or not set(c.derived.inputs) <= set(table.column_names):
            continue
        parts = {name: flat_parts(table.column(name)) for name in c.derived.inputs}
        table = table.append_column(c.field(), c.derive(parts))
    return table.select(ordered(table.column_names))


def ordered(present: Iterable[str]) -> list[str]:
    """`present` column names in the order shards store them: the declared ones in declaration
    order, then any others (extra string columns) as given."""
    present = list(present)
    order = [n for n in names(declared()) if n in present]
    return order + [n for n in present if n not in order]


def loaded_optional(present: Iterable[str]) -> tuple[Column, ...]:
    """The optional columns among `present` that the loader carries, in declaration order."""
    present = set(present)
    return tuple(c for c in optional() if c.loaded and c.name in present)


def resolve(present: Iterable[str] | None = None) -> tuple[Column, ...]:
    """The columns of a dataset that has `present` (None: the required ones), in declared order.

    Raises:
        DataError: a name is not declared, or a required column is missing.
    """
    if present is None:
        return required()
    present = list(present)
    known = set(names(declared()))
    for name in present:
        if name not in known:
            raise DataError(
                f"column {name!r} is not known to this packtool (known: {', '.join(sorted(known))})"
                "; upgrade packtool or repack the data"
            )
    missing = [c.name for c in required() if c.name not in present]
    if missing:
        raise DataError(f"required column {missing[0]!r} is missing")
    return tuple(c for c in declared() if c.name in set(present))


def packed_schema(
    token_type: pa.DataType | None = None, columns: Iterable[str] | None = None
) -> pa.Schema:
    """The Arrow schema of a packed shard holding `columns` (None: the required ones).

    Args:
        token_type: `pa.uint16()` when the vocabulary has at most 65,536 ids (every id fits), else
            `pa.uint32()` (the default).
        columns: the dataset's column names (any order; the schema follows the declaration's).
    """
    import pyarrow as pa

    return pa.schema([c.field(token_type) for c in resolve(columns)])


def manifest_columns(d: dict, version: int) -> tuple[str, ...] | str:
    """The column names an `index.json` dict records, or a sentence saying what is wrong.

    Format 1 had no `columns` entry: exactly the required columns. Format 2 lists them all.
    """
    if version == 1:
        return names(required())
    cols = d.get("columns")
    if not isinstance(cols, list) or not all(isinstance(c, str) for c in cols):
        return f"columns must be a list of column names, found {cols!r}"
    if len(set(cols)) != len(cols):
        return f"columns lists a name twice: {cols!r}"
    try:
        return names(resolve(cols))
    except DataError as exc:
        return str(exc)


def tokenized_optional(schema_names: Sequence[str]) -> tuple[Column, ...]:
    """Optional `TOKEN`/`DOCUMENT` columns a tokenized table carries (pack moves these along).

    Derived columns are not among them: pack computes those from the packed rows.
    """
    present = set(schema_names)
    return tuple(
        c
        for c in optional()
        if c.level in (TOKEN, DOCUMENT) and c.name in present and c.derived is None
    )


def bytes_parts(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(int32 offsets, uint8 values) zero-copy views of a binary column (`BYTES` storage).

    Offsets index into the values as stored (they start past 0 in a sliced array).
    """
    offsets = np.frombuffer(arr.buffers()[1], np.int32, count=len(arr) + 1, offset=4 * arr.offset)
    data = arr.buffers()[2]
    values = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    return offsets, values


def flat_parts(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(int64 offsets from 0, flat values) of a per-token column stored as a list or as bytes."""
    import pyarrow as pa

    from packtool.arrow_numpy import to_numpy

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if pa.types.is_binary(arr.type):
        offsets, values = bytes_parts(arr)
    else:
        offsets = to_numpy(arr.offsets)
        values = to_numpy(arr.values)
    offsets = offsets.astype(np.int64)
    if not len(offsets):
        return np.zeros(1, np.int64), values[:0]
    return offsets - offsets[0], values[int(offsets[0]) : int(offsets[-1])]
