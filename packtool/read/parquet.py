"""Parquet with a text column: one row a document, read a row group range at a time.

Any Arrow layout of text counts (string, large_string, string_view, their binary twins decoded
as UTF-8, dictionaries of them). A file without the text column (or an extra field) is an
error; a null or empty text a counted skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import DataError, option_choice
from packtool.read.documents import Doc, ReadConfig, SkipCounter, as_extra
from packtool.read.lines import TO_END
from packtool.storage import local as storage

PARQUET_SUFFIXES = (".parquet",)


def text_kind(arrow_type: Any) -> str | None:
    """`string` or `binary` for a column that holds text, else None.

    Every Arrow layout of text counts: string / large_string / string_view, their binary twins
    (decoded as UTF-8), and a dictionary of any of them (a pandas Categorical, or what Parquet
    writers store for low-cardinality columns); `to_pylist` gives the values of each alike.
    """
    import pyarrow as pa

    t = arrow_type.value_type if pa.types.is_dictionary(arrow_type) else arrow_type
    for kind, tests in (
        ("string", ("is_string", "is_large_string", "is_string_view")),
        ("binary", ("is_binary", "is_large_binary", "is_binary_view")),
    ):
        # The view types came with pyarrow 16; older ones cannot read such a column anyway.
        if any(getattr(pa.types, test, lambda _: False)(t) for test in tests):
            return kind
    return None


def read_parquet(
    path: Path, config: ReadConfig, skips: SkipCounter, start: int = 0, end: int = TO_END
) -> Iterator[Doc]:
    """The documents of row groups `[start, end)` (`TO_END`: the rest) of a text Parquet file."""
    import pyarrow as pa

    try:
        pf = storage.parquet_file(path)
    except pa.ArrowInvalid as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    names = pf.schema_arrow.names
    wanted = [config.text_column, *config.extra_fields]
    for name in wanted:
        if name not in names:
            what = "text column" if name == config.text_column else "extra field"
            text_column = option_choice("--text-column", "text_column", "NAME")
            hint = f"; pass {text_column}" if name == config.text_column else ""
            raise DataError(f"{path}: no {what} {name!r} (columns: {', '.join(names)}){hint}")
        if names.count(name) > 1:
            raise DataError(
                f"{path}: {names.count(name)} columns are named {name!r}; packtool cannot tell "
                "which to read (rename them)"
            )
    columns = list(dict.fromkeys(wanted))  # a kept field may be the text column itself
    shown = str(path)  # once, not per row (a URL's is ~8 us)
    text_type = pf.schema_arrow.field(config.text_column).type
    kind = text_kind(text_type)
    if kind is None:
        raise DataError(
            f"{path}: text column {config.text_column!r} has type {text_type}, not a string"
        )
    is_binary = kind == "binary"
    meta = pf.metadata
    groups = list(range(start, meta.num_row_groups if end == TO_END else end))
    row = sum(meta.row_group(g).num_rows for g in range(start))  # rows before the piece
    try:
        batches = pf.iter_batches(batch_size=config.batch_docs, columns=columns, row_groups=groups)
        for record_batch in batches if groups else ():
            text_col = record_batch.column(0)
            try:
                texts, decode = text_col.to_pylist(), is_binary
            except UnicodeDecodeError:  # a string column a writer filled with other bytes
                texts, decode = _as_binary(text_col).to_pylist(), True
            extra_cols = [
                _extra_values(record_batch.column(columns.index(name)), name, path, row)
                for name in config.extra_fields
            ]
            for i, text in enumerate(texts):
                where = f"{shown}:row {row}"  # 0-based, as inspect and pyarrow count rows
                row += 1
                if text is None:
                    skips.add("missing_field", where, f"{config.text_column!r} is null")
                    continue
                if decode:
                    try:
                        text = text.decode("utf-8")
                    except UnicodeDecodeError:
                        skips.add("invalid_utf8", where)
                        continue
                if not text:
                    skips.add("empty", where)
                    continue
                yield text, tuple(col[i] for col in extra_cols), len(text), row - 1
    except (pa.ArrowInvalid, pa.ArrowIOError) as exc:
        raise DataError(f"{path}: corrupt Parquet data near row {row} ({exc})") from None


def _as_binary(col: Any) -> Any:
    """A text column's values as bytes (no check that they are UTF-8): a string array viewed
    as its binary twin (the same buffers), a dictionary decoded first."""
    import pyarrow as pa

    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    t = col.type
    if pa.types.is_large_string(t):
        return col.view(pa.large_binary())
    if getattr(pa.types, "is_string_view", lambda _: False)(t):
        return col.view(pa.binary_view())
    return col.view(pa.binary()) if pa.types.is_string(t) else col


def _extra_values(col: Any, name: str, path: Path, row: int) -> list[Any]:
    try:
        return [as_extra(v) for v in col.to_pylist()]
    except UnicodeDecodeError:
        import pyarrow as pa

        raw = col.cast(pa.binary()) if not pa.types.is_binary(col.type) else col
        bad = next(i for i, v in enumerate(raw.to_pylist()) if v is not None and not _utf8(v))
        raise DataError(
            f"{path}: column {name!r} holds bytes that are not UTF-8 text at row {row + bad}"
        ) from None


def _utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True
