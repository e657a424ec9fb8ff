"""Any input -> tokenized tables: the one dispatch, for a whole corpus and for one partition.

`partition_tables` reads a list of pieces in order and yields tables of the tokenized schema
(packtool/dataset/tokenized.py) by the inputs' mode (`RAW`, `TOKENIZED`, `PRETOKENIZED`,
`RECORDS`): raw text is read and encoded (read, encode and table-building overlap in threads),
fine-tuning records are rendered, encoded and masked (packtool/sft/encode.py), `packtool
tokenize` output and token ids made elsewhere are read and checked. `tokenize.tokenized_batches`
(`packtool tokenize`; `stats` through `read_tables`) calls it with one whole-file piece per
input; the engines' workers call it with a partition's pieces (packtool/engines/plan.py): a
byte range of a JSON Lines file, row groups of a Parquet file, or a whole file.

Document ids are `docids.encode(file index, offset)` for every kind of input: the offset is the
line's byte offset (JSONL), the row (Parquet), the item (`.json` array), the record (fine-tuning
files) or 0 (text), so a worker needs nothing but its pieces to number its documents, the ids
are the same however the corpus is cut into partitions, and `packtool tokenize` gives a document
the id `packtool pack` gives it.

Before reading a piece and after finishing it the caller's `check` runs (the engines compare
the file's size and modification time with the plan's, `plan.check_unchanged`): an input edited
during the run is a one-line error naming it, not a silently mixed dataset.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.arrow_numpy import from_numpy, strings, to_numpy
from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized_writer import PIPELINE_DEPTH
from packtool.errors import ConfigError, DataError
from packtool.prefetch import prefetch
from packtool.read import docids
from packtool.read.documents import BatchBuilder, DocumentBatch, ReadConfig, SkipCounter
from packtool.read.formats import OFFSET_UNITS, raw_kind, read_file, sequential_start
from packtool.read.lines import TO_END, line_number
from packtool.read.pretokenized import read_pretokenized_file
from packtool.read.tokenized import read_tokenized_file
from packtool.storage import local as storage
from packtool.tokenizer.tokenizers import Tokenizer

RAW, TOKENIZED, PRETOKENIZED, RECORDS = "raw", "tokenized", "pretokenized", "records"
"""What the inputs are, and so how they are read (`Source.mode`): raw text (tokenized here),
`packtool tokenize` output, ids made elsewhere, or fine-tuning records (prompt/completion, chat:
rendered, encoded and masked by packtool/sft/encode.py)."""


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
    template_sha256: str | None = None
    """Chat records: the sha256 of the template text the run began with (its fingerprint's); a
    worker that reads another text stops the run (`sft.encode.sft_tables`)."""


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
    piece = FilePiece(str(path), 0, 0, file_index, start, end)
    yield from _raw_batches(config, [piece], skips, lambda _: None)


def _fill(
    builder: BatchBuilder,
    path: Path,
    file_index: int,
    config: ReadConfig,
    skips: SkipCounter,
    start: int,
    end: int,
) -> Iterator[DocumentBatch]:
    """Add one piece's documents to `builder`, yielding each batch it fills (the last, partly
    full one stays in it: the next piece goes on filling it)."""
    builder.switch_file(file_index)
    source = str(path)  # once: a URL's `UPath.__str__` is ~8 us, per document it was 0.2 s / 180 MB
    for text, extras, nbytes, offset in read_file(path, config, skips, start, end):
        builder.add(text, source, extras, nbytes, offset)
        if builder.full:
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
    passes `plan.check_unchanged`); an object's checks run beside the reading (`_Checks`), and
    the stream ends only once they all passed.
    """
    checks = _Checks(check)
    with _checked(checks):
        if source.mode == RAW:
            assert tokenizer is not None
            batches = _raw_batches(source.read, pieces, skips, checks)
            starts = {piece.path: piece.start for piece in pieces}
            for table, nbytes in _encoded(batches, tokenizer, source):
                yield without_empty(table, skips, 0, starts), nbytes
            return
        if source.mode == RECORDS:
            yield from _records(source, tokenizer, pieces, skips, checks)
            return
        for piece in pieces:
            checks(piece)
            path = storage.as_path(piece.path)
            if source.mode == TOKENIZED:
                tables = read_tokenized_file(
                    path,
                    piece.file_index,
                    source.schema,
                    source.identity,
                    skips,
                    piece.start,
                    piece.end,
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
            checks(piece)


class _Checks:
    """`check(piece)` for a partition's pieces. A local file's runs at once (a stat). An
    object's is a request to its store (a HEAD: ~1 ms on loopback, tens of ms on a real store,
    two a piece), so it runs on a thread of its own, in order, while the reader goes on; a failed
    one is raised at the next check, at `finish` (the stream's end: the caller commits nothing
    before it), or in place of the error that reading a changed object gave. Reading the pieces
    of a bucket prefix from moto (12 objects, 180 MB) took 0.2-0.3 s less with the checks
    beside it (docs/benchmarks.md, "Object storage")."""

    def __init__(self, check: Any) -> None:
        self._check = check
        self._pool: ThreadPoolExecutor | None = None
        self._pending: collections.deque[Future] = collections.deque()
        self._lock = threading.Lock()

    def __call__(self, piece: FilePiece) -> None:
        with self._lock:
            while self._pending and self._pending[0].done():
                self._next()
            if not storage.is_remote(piece.path):
                self._check(piece)
                return
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="packtool-check")
            self._pending.append(self._pool.submit(self._check, piece))

    def finish(self) -> None:
        """Wait for the checks in flight; raise the first that failed (in the pieces' order)."""
        with self._lock:
            while self._pending:
                self._next()

    def _next(self) -> None:
        """The oldest check's outcome; a failure forgets those after it (the first in order is
        the one reported, wherever it is raised)."""
        try:
            self._pending.popleft().result()
        except BaseException:
            self._forget()
            raise

    def _forget(self) -> None:
        for pending in self._pending:
            pending.cancel()
        self._pending.clear()

    def close(self) -> None:
        with self._lock:
            self._forget()
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None


@contextlib.contextmanager
def _checked(checks: _Checks) -> Iterator[None]:
    """The stream's end waits for its checks (the first failure in order raised); an error
    reading a piece waits for them too, a failed check being its cause (an object replaced
    under its reader); a stream closed early forgets them."""
    try:
        yield
    except Exception:  # not GeneratorExit (a BaseException): a stream closed early
        checks.finish()
        raise
    else:
        checks.finish()
    finally:
        checks.close()


def _records(
    source: Source,
    tokenizer: Tokenizer | None,
    pieces: list[FilePiece],
    skips: SkipCounter,
    check: Any,
) -> Iterator[tuple[pa.Table, int]]:
    """Files of fine-tuning records (whole-file pieces), rendered and encoded in one stream (so
    batches and the render pool span files), with ids `docids.encode(file index, offset)`: the
    record's offset in its file (`sft.inputs.Records.offsets`: byte, item or row, the unit
    `engines.preflight.doc_id_units` records). Every piece is checked before the stream starts and each after its last
    record went by."""
    from packtool.sft.encode import sft_tables

    assert tokenizer is not None and source.sft_kind is not None
    if not pieces:
        return
    for piece in pieces:
        check(piece)
    index = {piece.path: i for i, piece in enumerate(pieces)}
    at = 0  # the piece being read
    paths = [storage.as_path(piece.path) for piece in pieces]
    for table, nbytes in sft_tables(
        paths,
        source.sft_kind,
        source.read,
        tokenizer,
        skips,
        source.schema,
        source.template_sha256,
    ):
        rows = table.column("source").to_pylist()
        k = table.schema.get_field_index("doc_id")
        offsets = to_numpy(table.column(k))  # each record's offset in its file (no pandas)
        ids = np.empty(len(rows), dtype=np.int64)
        start = 0
        while start < len(rows):  # the rows of one file are a run, files in reading order
            f = index[rows[start]]
            end = start + 1
            while end < len(rows) and rows[end] == rows[start]:
                end += 1
            while at < f:
                check(pieces[at])  # files before it are done
                at += 1
            ids[start:end] = docids.encode(pieces[f].file_index, offsets[start:end])
            start = end
        yield table.set_column(k, table.schema.field(k), from_numpy(ids)), nbytes
    for piece in pieces[at:]:
        check(piece)


def _raw_batches(
    config: ReadConfig, pieces: list[FilePiece], skips: SkipCounter, check: Any
) -> Iterator[DocumentBatch]:
    # One builder over the pieces: a corpus of many small files still gives full batches.
    builder = BatchBuilder(config, file_index=pieces[0].file_index if pieces else 0)
    mine = ahead = None  # (object, start) prefetched for this piece and for the next
    try:
        for k, piece in enumerate(pieces):
            mine, ahead = ahead, None
            if k + 1 < len(pieces):  # an object's first block arrives while this piece is read
                after = pieces[k + 1]
                begins = sequential_start(storage.as_path(after.path), after.start)
                if begins is not None:
                    end = None if after.end == TO_END else after.end
                    storage.prefetch(after.path, begins, end, after.size)
                    ahead = (after.path, begins)
            check(piece)
            yield from _fill(
                builder,
                storage.as_path(piece.path),
                piece.file_index,
                config,
                skips,
                piece.start,
                piece.end,
            )
            check(piece)
    finally:
        # A partition that fails or is stopped before the next piece (a check, a bad document,
        # the consumer's error) drops its block: kept, it held up to 16 MB in the worker until
        # newer prefetches pushed it out. One its reader took is not there: nothing to drop.
        for key in (mine, ahead):
            if key is not None:
                storage.forget_prefetch(*key)
    if builder.texts:
        yield builder.flush()


ENCODING_STARTED = threading.Event()
"""Set when this process hands its first batch to a tokenizer: what a partition's kernel
warm-up waits for (packtool/engines/worker.py), so that numba's import and cache loading, which
hold the GIL, come after the tokenizer's build and the first batch's read, not before."""


def _encoded(
    batches: Iterator[DocumentBatch], tokenizer: Tokenizer, source: Source
) -> Iterator[tuple[pa.Table, int]]:
    # Three stages, each a batch or two ahead: read+parse | library encode (GIL released) |
    # copy ids out + build the table + the caller's own work (packing, writing).
    def encoded() -> Iterator[tuple[DocumentBatch, Any]]:
        for batch in prefetch(batches, depth=PIPELINE_DEPTH):
            ENCODING_STARTED.set()
            yield batch, tokenizer.start_batch(batch.texts)

    for batch, raw in prefetch(encoded(), depth=PIPELINE_DEPTH):
        flat, lengths = tokenizer.finish_batch(raw)
        yield batch_table(batch, flat, lengths, source.schema), batch.nbytes


def without_empty(table: pa.Table, skips: SkipCounter, nothing: int, starts: dict[str, int]) -> Any:
    """`table` without its documents of at most `nothing` tokens, each an `empty` skip named as
    the readers name an empty text (`skipped_where`). 0: text the tokenizer turns into no id
    (whitespace under a stripping normalizer, with no BOS/EOS), an empty document to `tokenize`,
    `stats` and `pack` alike, as an empty text is (docs/tokenize.md); the Megatron writer passes
    1 with an EOS (packtool/engines/megatron/part.py)."""
    lengths = to_numpy(table.column("length"))
    empty = np.flatnonzero(lengths <= nothing)
    if not len(empty):
        return table
    sources, ids = table.column("source"), table.column("doc_id")
    for i in empty.tolist():
        full = len(skips.examples.get("empty", ())) >= skips.max_examples and not skips.strict
        where = "" if full else skipped_where(str(sources[i]), ids[i].as_py(), starts)
        skips.add("empty", where, "no token after tokenizing")
    return table.filter(lengths > nothing)


def skipped_where(path: str, doc_id: int, starts: dict[str, int]) -> str:
    """`file:line`, `file:byte N`, `file:row N`, `file:item N` or `file`, as the readers name a
    skipped document (from its id: `docids.decode`); `starts` holds each piece's first byte (a
    line is counted only where the piece starts the file, as the JSONL reader counts them)."""
    offset = int(docids.decode(int(doc_id))[1])
    local = storage.as_path(path)
    unit = OFFSET_UNITS.get(raw_kind(local), "row")  # as the dataset's ids count them
    if unit == "byte" and starts.get(path) == 0:
        try:
            return f"{path}:{line_number(local, offset)}"
        except (OSError, EOFError, DataError):
            pass
    return docids.where(path, offset, unit, count_lines=False)


def batch_table(
    batch: DocumentBatch, flat: np.ndarray, lengths: np.ndarray, schema: pa.Schema
) -> pa.Table:
    """Build a tokenized table from a document batch and its encoded ids (no per-token Python)."""
    if int(lengths.sum()) >= 2**31:
        raise ConfigError("a batch holds >= 2**31 tokens; lower ReadConfig.batch_bytes")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    token_type = schema.field("input_ids").type.value_type
    # Straight from the buffers (packtool/arrow_numpy.py: `pa.array` would import pandas).
    ids = pa.ListArray.from_arrays(from_numpy(offsets), from_numpy(flat, token_type))
    columns = [
        from_numpy(batch.doc_ids, pa.int64()),
        strings(batch.sources),
        ids,
        from_numpy(lengths.astype(np.int32)),
    ]
    columns += [strings(batch.extras[name]) for name in schema.names[4:]]
    return pa.Table.from_arrays(columns, schema=schema)  # raw text carries no optional column
