"""The tokenized-Parquet format: its schema, its metadata, and what a set of such files records.

Schema (docs/CONTRACTS.md): `doc_id` int64, `source` string, `input_ids` list<uint16|uint32>,
`length` int32, the declared optional columns the documents carry (`loss_mask`), then the
extra fields as strings. The schema metadata key `packtool` holds `{"format":
"packtool.tokenized", "version": 1 or 2, "tokenizer": {...}, "columns": [...]}`.

Written by `packtool tokenize` (packtool/tokenize/), read back as input by `pack` and `stats`
and by the loader's online packing; this module is the part all of them share, so the loader
reads tokenized Parquet without importing the tokenize stage.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.dataset import columns as shard_columns
from packtool.dataset.identity import IDENTITY_FIELDS, TokenizerIdentity
from packtool.errors import ConfigError, DataError, json_value
from packtool.prefetch import map_ordered
from packtool.storage import local as storage

FORMAT = "packtool.tokenized"
FORMAT_VERSION = 2
"""Written when the documents carry optional columns (`loss_mask`); plain files stay version 1."""
SUPPORTED_VERSIONS = (1, 2)
META_KEY = b"packtool"
DOC_CHUNK = "doc_chunk"
"""The column a tail adds to the tokenized schema (packtool/pack/tail.py): each piece's chunk
index within its document. Reserved: no extra field or column of a tokenized table may take it
(`read.documents.RESERVED_COLUMNS`, `pack.chunk.pack_table`)."""


def tokenized_schema(
    identity: TokenizerIdentity,
    extra_fields: Iterable[str] = (),
    token_type: pa.DataType | None = None,
    optional: Iterable[str] = (),
    special_names: dict[str, str] | None = None,
    chat_template: dict[str, Any] | None = None,
) -> pa.Schema:
    """The Arrow schema of tokenized Parquet, with the tokenizer identity in its metadata.

    `optional`: declared optional shard columns the documents carry (packtool/dataset/columns.py), after
    `length`, stored per document as the shards store them per row (`loss_mask`: bytes), a value
    for per-document ones.
    Files with one are version 2 (their metadata lists them); without, version 1 as before.
    `special_names`: where the EOS / BOS defaults came from (`Tokenizer.special_names`), kept as
    `special_tokens` so a `pack` of the file records them as a pack of the text does.
    `chat_template`: the template chat records were rendered with (`sft.encode.template_record`),
    kept so a `pack` of the file records it as a pack of the records does.
    """
    if token_type is None:
        token_type = pa.uint16() if identity.vocab_size <= 1 << 16 else pa.uint32()
    fields = [
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("input_ids", pa.list_(token_type), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
    ]
    optional = shard_columns.names(shard_columns.tokenized_optional(list(optional)))
    for c in map(shard_columns.get, optional):  # stored as the shards store them
        fields.append(
            c.field(token_type)
            if c.level == shard_columns.TOKEN
            else pa.field(c.name, c.arrow_type(token_type), nullable=False)
        )
    fields += [pa.field(name, pa.string()) for name in extra_fields]
    meta: dict[str, Any] = {"format": FORMAT, "version": 1, "tokenizer": identity.to_dict()}
    if optional:
        meta.update(version=FORMAT_VERSION, columns=list(optional))
    if special_names:
        meta["special_tokens"] = dict(special_names)
    if chat_template:
        meta["chat_template"] = dict(chat_template)
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta).encode()})


def optional_columns(meta: dict[str, Any]) -> tuple[str, ...]:
    """The optional columns a tokenized file's metadata records (none before version 2)."""
    return tuple(meta.get("columns", ())) if meta.get("version") == 2 else ()


def common_optional(tokenized: list[tuple[Path, dict[str, Any]]]) -> tuple[str, ...]:
    """The optional columns every tokenized input has; inputs that differ are a `DataError`."""
    first_path, first_meta = tokenized[0]
    first = optional_columns(first_meta)
    for p, meta in tokenized[1:]:
        other = optional_columns(meta)
        if other != first:
            raise DataError(
                f"{p}: has columns {list(other) or 'none'} beyond the ids, unlike {first_path} "
                f"({list(first) or 'none'}); a dataset is one kind: tokenize all of it the same way"
            )
    return first


def tokenized_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """The `packtool` metadata of a tokenized Parquet file, or None for any other file."""
    path = storage.as_path(path)
    if not path.name.lower().endswith(".parquet"):
        return None
    try:
        schema = storage.parquet_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        meta = json_value(raw)
    except ValueError:
        raise DataError(f"{path}: malformed packtool metadata") from None
    if not isinstance(meta, dict):  # `null`, a list: valid JSON, no metadata of ours
        raise DataError(f"{path}: malformed packtool metadata (not a JSON object)")
    if meta.get("format") != FORMAT:
        return None
    if meta.get("version") not in SUPPORTED_VERSIONS:
        raise DataError(
            f"{path}: tokenized format version {meta.get('version')!r} is not supported "
            f"(supported: {list(SUPPORTED_VERSIONS)}); re-run packtool tokenize"
        )
    _check_tokenizer(path, meta.get("tokenizer"))
    return meta


def _check_tokenizer(path: Path, recorded: Any) -> None:
    """The metadata's tokenizer: a vocabulary size and special ids inside it (what `verify`
    holds a packed dataset to, checked here, before anything is built from the file)."""
    if not isinstance(recorded, dict):
        raise DataError(
            f"{path}: malformed packtool metadata (no tokenizer); re-run packtool tokenize"
        )
    vocab = recorded.get("vocab_size")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or not 1 <= vocab <= 2**32:
        # past 2**32, more ids than the uint32 the format holds (a ConfigError naming no file)
        raise DataError(f"{path}: malformed packtool metadata (tokenizer vocab_size {vocab!r})")
    for name in ("eos_id", "bos_id"):
        value = recorded.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
            raise DataError(
                f"{path}: packtool metadata says tokenizer {name} {value!r}, outside its "
                f"vocabulary of {vocab:,}; the file was damaged or edited: re-run packtool tokenize"
            )


def split_tokenized(paths: list[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], list[Path]]:
    """Inputs split into `packtool tokenize` files (with their metadata) and other files; a
    mix of both is a `ConfigError`. Each footer is read once, several at a time."""
    tokenized, raw = [], []
    for p, meta in zip(paths, map_ordered(tokenized_meta, paths), strict=True):  # footers
        if meta is None:
            raw.append(p)
        else:
            tokenized.append((p, meta))
    if tokenized and raw:
        raise ConfigError(
            f"inputs mix tokenized Parquet ({tokenized[0][0]}) with raw corpus files ({raw[0]}); "
            "pass one kind at a time"
        )
    return tokenized, raw


def common_identity(tokenized: list[tuple[Path, dict[str, Any]]]) -> TokenizerIdentity:
    """The tokenizer every tokenized input records; inputs that differ are a `DataError`."""
    first_path, first_meta = tokenized[0]
    first = TokenizerIdentity.from_dict(first_meta["tokenizer"])
    for p, meta in tokenized[1:]:
        other = TokenizerIdentity.from_dict(meta["tokenizer"])
        if not other.matches(first):
            differ = [f for f in IDENTITY_FIELDS if getattr(other, f) != getattr(first, f)]
            sha = "sha256" in differ
            raise DataError(
                f"{p}: tokenized with {other.kind}:{other.name} ({_told(other, sha)}), unlike "
                f"{first_path} ({first.kind}:{first.name}, {_told(first, sha)}); they differ "
                f"in {', '.join(differ)}"
            )
    return first


def _told(identity: TokenizerIdentity, sha: bool) -> str:
    """An identity's fields in a mismatch message: every one `matches` compares (two that
    differed in their BOS alone read the same before), the hash only where the hashes differ."""
    eos, bos = ("none" if v is None else v for v in (identity.eos_id, identity.bos_id))
    told = f"vocab {identity.vocab_size}, eos {eos}, bos {bos}"
    return told + (f", sha256 {identity.sha256[:12]}" if sha else "")


def tokenized_lengths(
    tokenized: list[tuple[Path, dict[str, Any]]], skips: Any = None
) -> np.ndarray:
    """Document lengths (int32, BOS/EOS included) of `packtool tokenize` files (as
    `split_tokenized` gives them), reading only the `length` column; rows of no token are no
    documents (`length_tables`).

    Raises:
        DataError: as `length_tables`.
    """
    parts = [lengths for lengths, _ in length_tables(tokenized, skips=skips)]
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.empty(0, np.int32)


def length_tables(
    tokenized: list[tuple[Path, dict[str, Any]]], columns: tuple[str, ...] = (), skips: Any = None
) -> Iterator[tuple[np.ndarray, pa.Table]]:
    """Each row group of `packtool tokenize` files read for its `length` and `columns`: the
    lengths, checked, and the table. What `stats` reads, with a loss mask or without.

    A row of length 0 is left out, an `empty` skip counted in `skips` (a
    `packtool.read.documents.SkipCounter`, or None), as `pack` and `tokenize` read it
    (packtool/read/tokenized.py): it was a document to `stats` and `empty` to `pack`.

    Raises:
        DataError: a file without one of the columns (or `input_ids`), a `length` column of no
            integer type, a length that is not its row's number of ids (checked from the
            footer, no id read), or a length that is null, negative or past int32 (the lengths' type: one such was
            wrapped, 2^32 + 7 read as 7); a `loss_mask` among `columns` that is not one 0/1
            value per token (`checked_mask`; it comes back as bytes, however it was stored);
            a row group that cannot be read (a damaged page: its CRC32 is checked).
    """
    for p, _ in tokenized:
        # Page CRC32s checked, as `pack` reads the file (read/tokenized.py): a flipped bit in
        # the `length` page gave other statistics, with no word
        pf = storage.parquet_file(p, page_checksum_verification=True)
        names = pf.schema_arrow.names
        for name in ("length", *columns):
            if name not in names:
                raise DataError(f"{p}: no column {name!r} (columns: {', '.join(names)})")
        kind = pf.schema_arrow.field("length").type
        if not pa.types.is_integer(kind):  # a float 9.9 was cut to 9
            raise DataError(
                f"{p}: column 'length' holds {kind}, not integer token counts; the file was "
                "damaged or edited: re-run packtool tokenize"
            )
        ids_leaf = _ids_leaf(pf, p)
        row = 0
        for rg in range(pf.num_row_groups):
            try:
                table = pf.read_row_group(rg, columns=["length", *columns])
            except (pa.ArrowException, OSError) as exc:  # it named no file
                raise DataError(f"{p}: row group {rg} unreadable ({exc})") from None
            column = table.column("length")
            lengths = column.to_numpy(zero_copy_only=False)
            if column.null_count:
                bad, what = np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False)), None
            else:
                bad = np.flatnonzero((lengths < 0) | (lengths > np.iinfo(np.int32).max))
                what = lengths[bad[0]] if len(bad) else None
            if len(bad):
                said = "no length (null)" if what is None else f"length {what}"
                raise DataError(
                    f"{p}: row {row + int(bad[0])} has {said}, not a token count; the file "
                    "was damaged or edited: re-run packtool tokenize"
                )
            _check_ids_count(pf, rg, ids_leaf, lengths, p, row)
            if shard_columns.LOSS_MASK in columns:
                mask = checked_mask(table.column(shard_columns.LOSS_MASK), lengths, p, row)
                table = table.set_column(
                    table.schema.get_field_index(shard_columns.LOSS_MASK), "loss_mask", mask
                )
            first, row = row, row + table.num_rows
            if not lengths.all():
                if skips is not None:
                    for k in np.flatnonzero(lengths == 0).tolist():
                        skips.add("empty", f"{p}:row {first + k}", "no token id")
                keep = lengths > 0
                lengths, table = lengths[keep], table.filter(pa.array(keep))
            yield lengths, table


def _ids_leaf(pf: Any, path: Path) -> int:
    """The Parquet column index of `input_ids`' values, refusing what `pack` refuses to read as
    ids (a missing column, one that is no list of integers)."""
    if "input_ids" not in pf.schema_arrow.names:
        raise DataError(
            f"{path}: no column 'input_ids' (columns: {', '.join(pf.schema_arrow.names)})"
        )
    kind = pf.schema_arrow.field("input_ids").type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind)) or not (
        pa.types.is_integer(kind.value_type)
    ):
        raise DataError(f"{path}: input_ids is {kind}, not a list of integer token ids")
    schema = pf.metadata.schema
    return next(i for i in range(len(schema)) if schema.column(i).path.split(".")[0] == "input_ids")


def _check_ids_count(
    pf: Any, rg: int, leaf: int, lengths: np.ndarray, path: Path, first_row: int
) -> None:
    """`length` against the ids of row group `rg`, reading no id (`stats` reported a `length`
    edited past its ids, which `pack`, checking row by row, refused). The footer counts one
    entry of the ids column per id and one per empty list, and (in its statistics, where the
    writer kept them) each empty list as a null: so sum(length) + the rows of length 0, and
    those rows, wherever each `length` is its row's count. Two edits that cancel out in one
    row group pass; `pack` still refuses them. Only where the counts differ is `input_ids`
    read, to name the row in `pack`'s words, and where a row has length 0: the footer counts a
    null row as it counts an empty one, and `pack` refuses a null row ("null input_ids", as a
    null length or id: no packtool writer makes one) where an empty one is an `empty` skip;
    `stats` took it for an empty row, a skip, until 2026-12-06. (`tokenize` skips empty
    documents: only another writer's files have their ids read for this.)

    Raises:
        DataError: a `length` that is not its row's number of ids, or a null among the ids
            where the footer's counts or a row of length 0 led to reading them.
    """
    column = pf.metadata.row_group(rg).column(leaf)
    zeros = int((lengths == 0).sum())
    stats = column.statistics if column.is_stats_set else None
    nulls = stats.null_count if stats is not None and stats.has_null_count else None
    if not zeros and column.num_values == int(lengths.sum(dtype=np.int64)) and nulls in (None, 0):
        return
    ids = pf.read_row_group(rg, columns=["input_ids"]).column("input_ids").combine_chunks()
    if ids.null_count:
        bad = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: row {first_row + bad}: null input_ids")
    offsets = ids.offsets.to_numpy()
    counts = np.diff(offsets)
    wrong = np.flatnonzero(counts != lengths)
    if len(wrong):
        k = int(wrong[0])
        raise DataError(
            f"{path}: row {first_row + k}: length is {lengths[k]} but the row has {counts[k]} ids"
        )
    values = ids.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    where = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
    if len(where):  # the counts agree row by row: a null id, as pack says it
        row = _row_at(offsets - offsets[0], int(where[0]))
        raise DataError(f"{path}: row {first_row + row}: a null token id")
    # The rows agree with `length`: the footer was only a hint. What a writer counts as a null
    # of a list column is not fixed by the format (pyarrow < 6 counted leaf nulls only, cuDF and
    # Polars have differed), so a valid file `pack` reads is never refused on it.


def checked_mask(column: Any, lengths: np.ndarray, path: Any, first_row: int) -> pa.Array:
    """A row group's `loss_mask` as tokenized Parquet stores it (one binary value per document,
    one byte per token), checked: one value per token (`lengths`: the documents' token counts),
    each 0 or 1. Another writer's list of integers or booleans per document is read the same.

    Checked here for every reader of tokenized Parquet (`pack`, `tokenize`, `stats`): a mask of
    2s was packed ("supervised: 200% of tokens out") into a dataset `verify` refused, and a mask
    of one byte per document failed inside the packer naming no file.

    Raises:
        DataError: naming `path` and the row: a null, a value other than 0/1, a mask whose
            length is not its document's, or a column of another type.
    """
    col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = col.type
    if pa.types.is_large_binary(kind):
        kind = pa.binary()
        col = col.cast(kind)  # a row group under 2 GiB of mask: fits int32 offsets
    is_list = pa.types.is_list(kind) or pa.types.is_large_list(kind)
    if not (
        pa.types.is_binary(kind)
        or (
            is_list
            and (pa.types.is_integer(kind.value_type) or pa.types.is_boolean(kind.value_type))
        )
    ):
        raise DataError(
            f"{path}: column 'loss_mask' holds {kind}, not a per-token mask (bytes, or lists "
            "of 0/1 integers); the file was damaged or edited: re-run packtool tokenize"
        )
    if col.null_count:
        bad = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{path}: row {first_row + bad}: loss_mask is null")
    if is_list and col.values.null_count:
        k = int(np.flatnonzero(col.flatten().is_null().to_numpy(zero_copy_only=False))[0])
        row = _row_at(shard_columns.flat_parts(col)[0], k)
        raise DataError(f"{path}: row {first_row + row}: loss_mask holds a null")
    offsets, values = shard_columns.flat_parts(col)
    counts = np.diff(offsets)
    if not np.array_equal(counts, lengths):
        bad = int(np.flatnonzero(counts != lengths)[0])
        n = int(counts[bad])
        raise DataError(
            f"{path}: row {first_row + bad}: loss_mask has {n} value{'' if n == 1 else 's'} for "
            f"{int(lengths[bad])} tokens; a loss mask holds one 0/1 value per token"
        )
    values = np.asarray(values).view(np.uint8) if values.dtype == bool else np.asarray(values)
    wrong = np.flatnonzero((values < 0) | (values > 1))
    if len(wrong):
        k = int(wrong[0])
        row = _row_at(offsets, k)
        raise DataError(
            f"{path}: row {first_row + row}: loss_mask[{k - int(offsets[row])}] = "
            f"{int(values[k])}; a loss mask holds 0 or 1"
        )
    if pa.types.is_binary(kind):
        return col
    return shard_columns.get(shard_columns.LOSS_MASK).array(offsets, values.astype(np.uint8))


def _row_at(offsets: np.ndarray, position: int) -> int:
    """The document whose values hold flat position `position` (`offsets` from 0)."""
    return int(np.searchsorted(offsets, position, side="right") - 1)
