"""Token ids made elsewhere: Parquet with `input_ids` and a `labels` or `loss_mask` column.

The usual shape of fine-tuning data that someone already tokenized (TRL, axolotl, a
`datasets.map` over a chat template): one row per document (a conversation, a prompt with its
completion), `input_ids` a list of token ids, and where the loss goes either as `labels` (the
transformers convention: `input_ids` with -100 where there is no loss, unshifted) or as
`loss_mask` (1 = supervised, 0 = not; integers or booleans).

Which Parquet files are read this way (no packtool metadata; `packtool tokenize` output is read
by packtool/tokenize/tokenize.py): those with an `input_ids` list-of-integers column and either a
`labels`/`loss_mask` column, or no text column (`--text-column`). A file with a text column, ids
and no mask keeps being read as text.

The ids are taken as they are: no BOS or EOS is added, and every id must be below the
tokenizer's vocabulary size (`--tokenizer` names the tokenizer that made them; it is recorded in
`index.json`). What comes out are tables of the tokenized schema (packtool/tokenize/tokenize.py) with a
`loss_mask` column (uint8) when the input has labels or a mask, so `tokenize`, `stats` and `pack`
treat them like any tokenized input.

Bad input: a row whose labels or mask differ in length from its ids, a label that is neither
-100 nor the id at its position (shifted labels would silently train on the wrong targets), a
mask value other than 0/1, or an id outside the vocabulary is a one-line `DataError` naming the
file and row. Skipped and counted (an error with `--strict`): a row with null or empty ids
(`missing_field`, `empty`), and a row whose mask is all zeros past its first token
(`no_supervised_tokens`: it would train on nothing; labels shift, so the first token is never a
target). Files with a mask mixed with files without one are a `DataError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.arrow_numpy import from_numpy
from packtool.dataset.columns import IGNORE_INDEX, LOSS_MASK
from packtool.dataset.masks import target_sums
from packtool.dataset.tokenized_table import kept_documents, tokenized_table
from packtool.errors import ConfigError, DataError, one_line, option_choice
from packtool.prefetch import map_ordered
from packtool.read import docids
from packtool.read.documents import ReadConfig, SkipCounter, as_extra
from packtool.storage import local as storage

TOO_BIG = "a row group holds >= 2**31 tokens; write the file with smaller groups"

LABELS = "labels"
MASK_SOURCES = (LABELS, LOSS_MASK)
"""Columns that say where the loss goes."""


def _int_list(t: pa.DataType, *, bools: bool = False) -> bool:
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)):
        return False
    v = t.value_type
    return pa.types.is_integer(v) or (bools and pa.types.is_boolean(v))


def mask_source(path: Path, config: ReadConfig) -> str | None | bool:
    """How `path` is read: False (not pre-tokenized), None (ids, no mask), or the mask's column.

    Raises:
        DataError: the file has both `labels` and `loss_mask` (which one is meant?).
    """
    if not storage.file_name(path).lower().endswith(".parquet"):
        return False
    try:
        schema = storage.parquet_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    if b"packtool" in (schema.metadata or {}):
        return False
    if "input_ids" not in schema.names:
        return False
    if not _int_list(kind := schema.field("input_ids").type):
        if config.text_column in schema.names and not set(MASK_SOURCES) & set(schema.names):
            return False  # text, beside a column of another meaning
        # ids of floats, strings or nested lists: read as text, "no text column 'text'"
        raise DataError(f"{path}: input_ids is {kind}, not lists of integer token ids")
    if "doc_offsets" in schema.names:
        # a row of a packed shard holds several documents: read as one document a row, their
        # boundaries (and ids) were lost without a word
        raise DataError(
            f"{path}: a shard of a packed dataset (rows of several documents, `doc_offsets`); "
            "packtool reads corpora and tokenized Parquet: pack the corpus it was made from, or "
            "train on it as it is (loader.PackedDataset)"
        )
    found = [c for c in MASK_SOURCES if c in schema.names]
    if len(found) > 1:
        raise DataError(f"{path}: has both `labels` and `loss_mask`; keep the one that is meant")
    if found:
        return found[0]
    return None if config.text_column not in schema.names else False


def split_pretokenized(paths: list[Path], config: ReadConfig) -> tuple[list[Path], str | None]:
    """The pre-tokenized inputs (all or none of `paths`) and their mask column (None: no mask).

    Raises:
        ConfigError: pre-tokenized files mixed with other inputs.
        DataError: some files have a mask and others do not, or masks of both kinds.
    """
    kinds = list(map_ordered(lambda p: mask_source(p, config), paths))  # footers, in parallel
    pre = [(p, k) for p, k in zip(paths, kinds, strict=True) if k is not False]
    if not pre:
        return [], None
    if len(pre) != len(paths):
        other = next(p for p, k in zip(paths, kinds, strict=True) if k is False)
        raise ConfigError(
            f"inputs mix pre-tokenized Parquet ({pre[0][0]}) with other inputs ({other}); "
            "pass one kind at a time"
        )
    first_path, first = pre[0]
    for p, k in pre[1:]:
        if k != first:

            def what(kind: str | None) -> str:
                return f"a `{kind}` column" if kind else "no labels or loss_mask"

            raise DataError(
                f"{p}: has {what(k)}, unlike {first_path} ({what(first)}); a dataset is one "
                "kind: give every file a mask or none"
            )
    return [p for p, _ in pre], first


def _list_parts(arr: pa.Array) -> tuple[np.ndarray, pa.Array]:
    """(int64 offsets rebased to 0, the values they index) of a list array."""
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return offsets - offsets[0], values


def _first_row(bad: np.ndarray, offsets: np.ndarray) -> tuple[int, int]:
    """(row, position in the row) of the first flagged value."""
    k = int(np.flatnonzero(bad)[0])
    row = int(np.searchsorted(offsets, k, side="right") - 1)
    return row, k - int(offsets[row])


def _mask_of(
    table: pa.Table,
    source: str,
    ids: np.ndarray,
    offsets: np.ndarray,
    where: str,
    first_row: int,
    null_ids: np.ndarray | None,
) -> np.ndarray:
    """The uint8 loss mask of a row group's documents (checked against the ids). Rows whose
    ids are null (`null_ids`) are skipped as `missing_field`, so their labels or mask are not
    read: a row of null ids and null labels stopped the run ("`labels` holds nulls")."""
    col = table.column(source).combine_chunks()
    if not _int_list(col.type, bools=source == LOSS_MASK):
        raise DataError(f"{where}: `{source}` is {col.type}, not a list of integers")
    if null_ids is not None:
        col = pc.if_else(pa.array(null_ids), pa.scalar([], col.type), col)
    m_off, m_values = _list_parts(col)
    if col.null_count or m_values.null_count:
        row = (
            int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
            if col.null_count
            else _first_row(m_values.is_null().to_numpy(zero_copy_only=False), m_off)[0]
        )
        raise DataError(f"{where}:row {first_row + row}: `{source}` holds nulls")
    if len(m_off) != len(offsets) or not np.array_equal(m_off, offsets):
        lens, m_lens = np.diff(offsets), np.diff(m_off)
        row = int(np.flatnonzero(lens != m_lens)[0])
        raise DataError(
            f"{where}:row {first_row + row}: {m_lens[row]} `{source}` for {lens[row]} "
            "input_ids; they must be the same length"
        )
    values = m_values.to_numpy(zero_copy_only=False)
    if source == LABELS:
        values = values.astype(np.int64, copy=False)
        ignored = values == IGNORE_INDEX
        wrong = ~ignored & (values != ids)
        if wrong.any():
            row, pos = _first_row(wrong, offsets)
            k = int(offsets[row]) + pos
            raise DataError(
                f"{where}:row {first_row + row}: labels[{pos}] = {int(values[k])} but "
                f"input_ids[{pos}] = {int(ids[k])}; labels must be the input_ids with "
                f"{IGNORE_INDEX} where there is no loss (unshifted, as transformers takes them)"
            )
        return (~ignored).astype(np.uint8)
    values = values.astype(np.int64, copy=False)
    wrong = (values != 0) & (values != 1)
    if wrong.any():
        row, pos = _first_row(wrong, offsets)
        raise DataError(
            f"{where}:row {first_row + row}: loss_mask[{pos}] = "
            f"{int(values[int(offsets[row]) + pos])}; a loss mask holds 0 or 1"
        )
    return values.astype(np.uint8)


def read_pretokenized_file(
    path: Path,
    source: str | None,
    config: ReadConfig,
    schema: pa.Schema,
    vocab_size: int,
    skips: SkipCounter,
    *,
    file_index: int,
    start: int = 0,
    end: int = -1,
) -> Iterator[tuple[pa.Table, int]]:
    """Tables of the tokenized `schema` (with `loss_mask` when `source` is set), one per row
    group of `[start, end)` (-1: to the last) of one pre-tokenized file (`split_pretokenized`),
    every id below `vocab_size`, `skips` counting the rows left out. Document ids:
    `docids.encode(file_index, row in the file)`. Memory: one row group at a time."""
    pf = storage.parquet_file(path)
    names = pf.schema_arrow.names
    wanted = ["input_ids", *([source] if source else []), *config.extra_fields]
    missing = [c for c in wanted if c not in names]
    if missing:
        raise DataError(f"{path}: no column {missing[0]!r} (columns: {', '.join(names)})")
    stop = pf.num_row_groups if end == -1 else end
    first_row = sum(pf.metadata.row_group(g).num_rows for g in range(start))
    for rg in range(start, stop):
        try:
            table = pf.read_row_group(rg, columns=wanted)
        except (OSError, pa.ArrowException) as exc:
            raise DataError(f"{path}: row group {rg} unreadable ({one_line(exc)})") from None
        nbytes = pf.metadata.row_group(rg).total_byte_size
        out = _convert(
            table,
            source,
            config,
            schema,
            vocab_size,
            skips,
            str(path),
            first_row,
            file_index,
        )
        first_row += table.num_rows
        yield out, nbytes


def _convert(
    table: pa.Table,
    source: str | None,
    config: ReadConfig,
    schema: pa.Schema,
    vocab_size: int,
    skips: SkipCounter,
    where: str,
    first_row: int,
    file_index: int,
) -> pa.Table:
    ids_col = table.column("input_ids").combine_chunks()
    null = ids_col.is_null().to_numpy(zero_copy_only=False) if ids_col.null_count else None
    if ids_col.values.null_count:
        raise DataError(f"{where}: input_ids hold null token ids")
    offsets, values = _list_parts(ids_col)
    ids = values.to_numpy(zero_copy_only=False)
    bad = (ids < 0) | (ids >= vocab_size)  # in their own type: uint64 2**63 was cast negative
    if bad.any():
        row, pos = _first_row(bad, offsets)
        raise DataError(
            f"{where}:row {first_row + row}: input_ids[{pos}] = "
            f"{int(ids[int(offsets[row]) + pos])} is outside the tokenizer's vocabulary "
            f"(0..{vocab_size - 1}); pass the tokenizer that made these ids: "
            + option_choice("--tokenizer", "tokenizer", "SPEC")
        )
    ids = ids.astype(np.int64, copy=False)
    lengths = np.diff(offsets)
    keep = lengths > 0
    if null is not None:
        keep &= ~null
    mask = None
    if source is not None:
        mask = _mask_of(table, source, ids, offsets, where, first_row, null)
        supervised = target_sums(mask, offsets)
    for row in np.flatnonzero(~keep):
        if null is not None and null[row]:
            skips.add("missing_field", f"{where}:row {first_row + row}", "input_ids is null")
        else:
            skips.add("empty", f"{where}:row {first_row + row}")
    if mask is not None:
        for row in np.flatnonzero(keep & (supervised == 0)):
            skips.add(
                "no_supervised_tokens",
                f"{where}:row {first_row + row}",
                f"no {source} entry past the first token says loss (the first is never a target)",
            )
        keep &= supervised > 0
    rows = np.flatnonzero(keep)
    kept_ids, kept_mask, new_off = kept_documents(ids, mask, offsets, rows, too_big=TOO_BIG)
    doc_ids = docids.encode(file_index, first_row + rows.astype(np.int64))
    extras = {}
    for name in config.extra_fields:
        col = table.column(name).take(from_numpy(rows))
        extras[name] = as_strings(col, name, where)
    return tokenized_table(
        schema,
        doc_ids=doc_ids,
        sources=[where] * len(rows),
        ids=kept_ids,
        offsets=new_off,
        mask=kept_mask,
        extras=extras,
    )


def as_strings(col: Any, name: str, where: str) -> Any:
    """A kept (or `--group-by`) column as the string column stores it (of pre-tokenized Parquet
    and of tokenized Parquet another tool wrote, packtool/read/tokenized.py): lists, structs and maps
    as `documents.as_extra` writes them (JSON text, as a text Parquet file's kept column; Arrow
    casts none of them to strings, which was a traceback), the rest cast.

    Raises:
        DataError: a binary column holding bytes that are not UTF-8.
    """
    if col.type == pa.string():
        return col
    if pa.types.is_nested(col.type):
        try:
            return pa.array([as_extra(v) for v in col.to_pylist()], pa.string())
        except (UnicodeDecodeError, TypeError) as exc:
            raise DataError(f"{where}: column {name!r} cannot be kept as text ({exc})") from None
    try:
        return col.cast(pa.string())
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid) as exc:
        raise DataError(
            f"{where}: column {name!r} cannot be kept as text ({one_line(exc)})"
        ) from None
