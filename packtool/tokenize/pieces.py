"""Reading the pieces of one partition (packtool/engines/plan.py) as tokenized tables.

A piece is a byte range of a JSON Lines file, row groups of a Parquet file, or a whole file;
`read_piece` reads a raw one, `partition_tables` reads every piece of a partition in order and
yields tables of the tokenized schema (packtool/tokenize/tokenize.py), tokenizing raw text on the way
(read and encode overlap in threads, as in `tokenize.tokenized_batches`).

Document ids are `docids.encode(file index, offset)` for every kind of input: the offset is the
line's byte offset (JSONL), the row (Parquet), the item (`.json` array) or 0 (text), so a worker
needs nothing but its pieces to number its documents, and the ids are the same however the
corpus is cut into partitions.

Before reading a file and after finishing it, its size and modification time are compared with
the plan's (`plan.check_unchanged`): an input edited during the run is a one-line error naming
it, not a silently mixed dataset.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized_writer import PIPELINE_DEPTH
from packtool.read import docids
from packtool.read.documents import BatchBuilder, DocumentBatch, ReadConfig, SkipCounter
from packtool.read.formats import read_file
from packtool.read.lines import TO_END
from packtool.read.pretokenized import read_pretokenized_file
from packtool.read.tokenized import read_tokenized_file
from packtool.tokenize.tokenize import RAW, RECORDS, TOKENIZED, batch_table, prefetch
from packtool.tokenizer.tokenizers import Tokenizer


@dataclass(frozen=True, kw_only=True)
class Source:
    """How to read a run's inputs (the same for every piece)."""

    mode: str
    read: ReadConfig
    schema: pa.Schema
    """The tokenized schema the tables come in."""
    identity: TokenizerIdentity
    mask_source: str | None = None
    """Pre-tokenized inputs: the column saying where the loss goes (`labels`, `loss_mask`)."""
    sft_kind: str | None = None
    """Fine-tuning records: their kind (`sft_inputs.sft_kind`)."""


@dataclass(frozen=True)
class FilePiece:
    """One piece with what a worker needs to read it and check it."""

    path: str
    size: int
    mtime_ns: int
    file_index: int
    start: int = 0
    end: int = TO_END


def read_piece(
    path: Path,
    file_index: int,
    config: ReadConfig,
    skips: SkipCounter,
    *,
    start: int = 0,
    end: int = TO_END,
) -> Iterator[DocumentBatch]:
    """The documents of one raw piece, in batches, with ids `docids.encode(file_index, offset)`.

    `start`/`end`: bytes of an uncompressed JSONL file (the lines that start in the range),
    row groups of a Parquet file, or `0, TO_END` for the whole file.
    """
    builder = BatchBuilder(config, file_index=file_index)
    for text, extras, nbytes, offset in read_file(path, config, skips, start, end):
        builder.add(text, str(path), extras, nbytes, offset)
        if builder.full:
            yield builder.flush()
    if builder.texts:
        yield builder.flush()


def partition_tables(
    source: Source,
    tokenizer: Tokenizer | None,
    pieces: list[FilePiece],
    skips: SkipCounter,
    check: Any,
) -> Iterator[tuple[pa.Table, int]]:
    """(tokenized table, input bytes) for every piece of a partition, in order.

    `check(piece)` is called before each piece is opened and after it is read (the engine
    passes `plan.check_unchanged`).
    """
    if source.mode == RAW:
        assert tokenizer is not None
        yield from _encoded(_raw_batches(source.read, pieces, skips, check), tokenizer, source)
        return
    for piece in pieces:
        check(piece)
        path = Path(piece.path)
        if source.mode == RECORDS:
            tables = _records(source, tokenizer, path, piece.file_index, skips)
        elif source.mode == TOKENIZED:
            tables = read_tokenized_file(
                path, piece.file_index, source.schema, source.identity, piece.start, piece.end
            )
        else:
            tables = read_pretokenized_file(
                path,
                source.mask_source,
                source.read,
                source.schema,
                source.identity.vocab_size,
                skips,
                file_index=piece.file_index,
                start=piece.start,
                end=piece.end,
            )
        yield from tables
        check(piece)


def _records(
    source: Source, tokenizer: Tokenizer | None, path: Path, file_index: int, skips: SkipCounter
) -> Iterator[tuple[pa.Table, int]]:
    """One file of fine-tuning records, with ids `docids.encode(file_index, k)`: the k-th record
    the file contributes (records are whole-file pieces; sft_tables numbers them 0, 1, 2, ...)."""
    from packtool.arrow_numpy import from_numpy, to_numpy
    from packtool.sft.encode import sft_tables

    assert tokenizer is not None and source.sft_kind is not None
    for table, nbytes in sft_tables(
        [path], source.sft_kind, source.read, tokenizer, skips, source.schema
    ):
        k = table.schema.get_field_index("doc_id")
        ids = docids.encode(file_index, to_numpy(table.column(k)).astype(np.int64))
        yield table.set_column(k, "doc_id", from_numpy(ids)), nbytes


def _raw_batches(
    config: ReadConfig, pieces: list[FilePiece], skips: SkipCounter, check: Any
) -> Iterator[DocumentBatch]:
    for piece in pieces:
        check(piece)
        yield from read_piece(
            Path(piece.path), piece.file_index, config, skips, start=piece.start, end=piece.end
        )
        check(piece)


def _encoded(
    batches: Iterator[DocumentBatch], tokenizer: Tokenizer, source: Source
) -> Iterator[tuple[pa.Table, int]]:
    # Three stages, each a batch or two ahead: read+parse | library encode (GIL released) |
    # copy ids out + build the table + the caller's own work (packing, writing).
    def encoded() -> Iterator[tuple[DocumentBatch, Any]]:
        for batch in prefetch(batches, depth=PIPELINE_DEPTH):
            yield batch, tokenizer.start_batch(batch.texts)

    for batch, raw in prefetch(encoded(), depth=PIPELINE_DEPTH):
        flat, lengths = tokenizer.finish_batch(raw)
        yield batch_table(batch, flat, lengths, source.schema), batch.nbytes
