"""Tokenize corpora into tokenized Parquet, and read tokenized Parquet back.

Tokenized schema (docs/CONTRACTS.md): `doc_id` int64, `source` string, `input_ids`
list<uint16|uint32>, `length` int32, then the extra fields as strings. The schema metadata key
`packtool` holds `{"format": "packtool.tokenized", "version": 1, "tokenizer": {...}}`.

`tokenized_batches` is what stats and pack call: it yields tables of that schema from raw corpora
(reading, tokenizing) or from tokenized Parquet (reading, after checking the tokenizer).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.corpus import (
    DocumentBatch,
    ReadConfig,
    SkipCounter,
    expand_inputs,
    read_corpus,
)
from packtool.errors import ConfigError, DataError, make_output_folder
from packtool.progress import Progress
from packtool.tokenizers import Tokenizer, TokenizerIdentity, describe_tokenizer, load_tokenizer

FORMAT = "packtool.tokenized"
FORMAT_VERSION = 1
META_KEY = b"packtool"
PART_PATTERN = "part-{:05d}.parquet"
PIPELINE_DEPTH = 1
"""Batches each pipeline stage may run ahead of the next (memory: about 3 stages x depth batches)."""

T = TypeVar("T")


def tokenized_schema(
    identity: TokenizerIdentity,
    extra_fields: Iterable[str] = (),
    token_type: pa.DataType | None = None,
) -> pa.Schema:
    """The Arrow schema of tokenized Parquet, with the tokenizer identity in its metadata."""
    if token_type is None:
        token_type = pa.uint16() if identity.vocab_size <= 1 << 16 else pa.uint32()
    fields = [
        pa.field("doc_id", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("input_ids", pa.list_(token_type), nullable=False),
        pa.field("length", pa.int32(), nullable=False),
    ]
    fields += [pa.field(name, pa.string()) for name in extra_fields]
    meta = {"format": FORMAT, "version": FORMAT_VERSION, "tokenizer": identity.to_dict()}
    return pa.schema(fields, metadata={META_KEY: json.dumps(meta).encode()})


def tokenized_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """The `packtool` metadata of a tokenized Parquet file, or None for any other file."""
    path = Path(path)
    if not path.name.lower().endswith(".parquet"):
        return None
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as exc:
        raise DataError(f"{path}: not a readable Parquet file ({exc})") from None
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        raise DataError(f"{path}: malformed packtool metadata") from None
    if meta.get("format") != FORMAT:
        return None
    if meta.get("version") != FORMAT_VERSION:
        raise DataError(
            f"{path}: tokenized format version {meta.get('version')!r} is not supported "
            f"(supported: {FORMAT_VERSION}); re-run packtool tokenize"
        )
    return meta


def input_identity(inputs: Iterable[str | os.PathLike]) -> TokenizerIdentity | None:
    """The tokenizer recorded in tokenized Parquet inputs (None when the inputs are raw)."""
    tokenized, _ = _split_inputs(expand_inputs(inputs))
    return _common_identity(tokenized) if tokenized else None


def _split_inputs(paths: list[Path]) -> tuple[list[tuple[Path, dict[str, Any]]], list[Path]]:
    tokenized, raw = [], []
    for p in paths:
        meta = tokenized_meta(p)
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


def _common_identity(tokenized: list[tuple[Path, dict[str, Any]]]) -> TokenizerIdentity:
    first_path, first_meta = tokenized[0]
    first = TokenizerIdentity.from_dict(first_meta["tokenizer"])
    for p, meta in tokenized[1:]:
        other = TokenizerIdentity.from_dict(meta["tokenizer"])
        if not other.matches(first):
            raise DataError(
                f"{p}: tokenized with {other.kind}:{other.name} (vocab {other.vocab_size}, "
                f"eos {other.eos_id}), unlike {first_path} ({first.kind}:{first.name}, "
                f"vocab {first.vocab_size}, eos {first.eos_id})"
            )
    return first


def tokenized_batches(
    inputs: Iterable[str | os.PathLike],
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str | None = "byte",
    workers: int | None = None,
    skips: SkipCounter | None = None,
) -> Iterator[pa.Table]:
    """Yield tables of the tokenized schema, from raw corpora or from tokenized Parquet.

    Reading runs one batch ahead in a thread, overlapping the (GIL-free) tokenizer.

    Args:
        inputs: files, folders, globs: all raw corpus files, or all tokenized Parquet.
        read_config: how to read raw corpora (also which extra fields to carry).
        tokenizer: a `Tokenizer` or a spec for `load_tokenizer`. For tokenized Parquet it must
            match the recorded tokenizer (pass None to accept whatever is recorded).
        workers: encoding threads when `tokenizer` is a spec (default: all cores).
        skips: counts skipped documents (a fresh one when None; pass one to read the counts).

    Raises:
        DataError: bad input (see `read_corpus`), or tokenized Parquet made with another
            tokenizer.
    """
    for table, _ in _tokenized_batches(
        inputs, read_config=read_config, tokenizer=tokenizer, workers=workers, skips=skips
    ):
        yield table


def _tokenized_batches(
    inputs: Iterable[str | os.PathLike],
    *,
    read_config: ReadConfig | None,
    tokenizer: Tokenizer | str | None,
    workers: int | None,
    skips: SkipCounter | None,
) -> Iterator[tuple[pa.Table, int]]:
    config = read_config or ReadConfig()
    paths = expand_inputs(inputs)
    tokenized, raw = _split_inputs(paths)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, workers=workers)
    if tokenized:
        yield from _read_tokenized(tokenized, config, tokenizer)
        return
    if tokenizer is None:
        raise ConfigError("raw corpus inputs need a tokenizer (e.g. --tokenizer byte)")
    skips = skips if skips is not None else SkipCounter(strict=config.strict)
    schema = tokenized_schema(tokenizer.identity, config.extra_fields)

    def encoded() -> Iterator[tuple[DocumentBatch, Any]]:
        for batch in prefetch(read_corpus(raw, config, skips), depth=PIPELINE_DEPTH):
            yield batch, tokenizer.start_batch(batch.texts)

    # Three stages, each a batch or two ahead: read+parse | library encode (GIL released) |
    # copy ids out + build the table + the caller's own work (writing, statistics).
    for batch, encoded_batch in prefetch(encoded(), depth=PIPELINE_DEPTH):
        flat, lengths = tokenizer.finish_batch(encoded_batch)
        yield batch_table(batch, flat, lengths, schema), batch.nbytes


def batch_table(
    batch: DocumentBatch, flat: np.ndarray, lengths: np.ndarray, schema: pa.Schema
) -> pa.Table:
    """Build a tokenized table from a document batch and its encoded ids (no per-token Python)."""
    if int(lengths.sum()) >= 2**31:
        raise ConfigError("a batch holds >= 2**31 tokens; lower ReadConfig.batch_bytes")
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    token_type = schema.field("input_ids").type.value_type
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=token_type))
    columns = [
        pa.array(batch.doc_ids, type=pa.int64()),
        pa.array(batch.sources, type=pa.string()),
        ids,
        pa.array(lengths.astype(np.int32)),
    ]
    columns += [pa.array(batch.extras[name], type=pa.string()) for name in schema.names[4:]]
    return pa.Table.from_arrays(columns, schema=schema)


def check_recorded_tokenizer(
    identity: TokenizerIdentity, tokenizer: Tokenizer, where: str | os.PathLike
) -> None:
    """Raise `DataError` naming both when `tokenizer` is not the one recorded in the input."""
    if tokenizer.identity.matches(identity):
        return
    want = tokenizer.identity
    raise DataError(
        f"{where}: tokenized with {identity.kind}:{identity.name} "
        f"(vocab {identity.vocab_size}, eos {identity.eos_id}, bos {identity.bos_id}), but "
        f"the requested tokenizer is {want.kind}:{want.name} (vocab {want.vocab_size}, "
        f"eos {want.eos_id}, bos {want.bos_id}); pass the same --tokenizer/--eos-id/--bos-id "
        "or re-tokenize the raw corpus"
    )


def _read_tokenized(
    tokenized: list[tuple[Path, dict[str, Any]]], config: ReadConfig, tokenizer: Tokenizer | None
) -> Iterator[tuple[pa.Table, int]]:
    identity = _common_identity(tokenized)
    if tokenizer is not None:
        check_recorded_tokenizer(identity, tokenizer, tokenized[0][0])
    columns = ["doc_id", "source", "input_ids", "length", *config.extra_fields]
    for path, _ in tokenized:
        pf = pq.ParquetFile(path)
        names = pf.schema_arrow.names
        missing = [c for c in columns if c not in names]
        if missing:
            raise DataError(
                f"{path}: no column {missing[0]!r} (columns: {', '.join(names)}); "
                "extra fields must be chosen when tokenizing"
            )
        schema = pf.schema_arrow
        schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        for rg in range(pf.num_row_groups):
            table = pf.read_row_group(rg, columns=columns)
            nbytes = pf.metadata.row_group(rg).total_byte_size
            yield table.cast(schema) if table.schema != schema else table, nbytes


def read_lengths(inputs: Iterable[str | os.PathLike]) -> np.ndarray:
    """Document lengths (int32, BOS/EOS included) from tokenized Parquet, reading only `length`.

    Raises:
        DataError: an input is not tokenized Parquet, or the files used different tokenizers.
    """
    tokenized, raw = _split_inputs(expand_inputs(inputs))
    if raw:
        raise DataError(f"{raw[0]}: not tokenized Parquet; run `packtool tokenize` first")
    _common_identity(tokenized)
    parts = [pq.read_table(p, columns=["length"]).column(0).to_numpy() for p, _ in tokenized]
    return np.concatenate(parts).astype(np.int32, copy=False) if parts else np.empty(0, np.int32)


def prefetch(iterator: Iterator[T], depth: int = 2) -> Iterator[T]:
    """Run `iterator` in a thread, `depth` items ahead; its exceptions re-raise here."""
    q: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        q.put(("item", item), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    # Close a generator here, in the thread that runs it, so that stages it
                    # reads from (nested prefetches) stop too.
                    close = getattr(iterator, "close", None)
                    if close is not None:
                        close()
                    return
            q.put(("done", None))
        except BaseException as exc:  # forwarded to the consumer
            q.put(("error", exc))

    thread = threading.Thread(target=produce, name="packtool-read", daemon=True)
    thread.start()
    try:
        while True:
            kind, value = q.get()
            if kind == "done":
                return
            if kind == "error":
                raise value
            yield value
    finally:
        stop.set()
        while thread.is_alive():
            with contextlib.suppress(queue.Empty):
                q.get(timeout=0.1)


@dataclass(kw_only=True)
class TokenizeSummary:
    """What `tokenize_corpus` did."""

    documents: int
    tokens: int
    seconds: float
    input_bytes: int
    skips: dict[str, int] = field(default_factory=dict)
    skip_line: str = "no skips"
    """`SkipCounter.summary()`: counts per reason with file:line examples."""
    files: list[str] = field(default_factory=list)
    """Files written."""
    output_bytes: int = 0
    tokenizer: dict[str, Any] = field(default_factory=dict)
    dtype: str = ""
    special_names: dict[str, str] = field(default_factory=dict)
    """`eos` / `bos` -> the token text a default id came from."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    def format(self) -> str:
        """One paragraph for the terminal."""
        where = self.files[0] if len(self.files) == 1 else f"{len(self.files)} part files"
        return (
            f"Tokenized {self.documents:,} documents into {self.tokens:,} tokens with "
            f"{describe_tokenizer(self.tokenizer, self.special_names)}, {self.dtype} ids, in "
            f"{self.seconds:.2f} s: {self.tokens_per_s:,.0f} tokens/s, "
            f"{self.input_bytes / 1e6 / max(self.seconds, 1e-9):.1f} MB/s of input. "
            f"Skips: {self.skip_line}. Wrote {where} ({self.output_bytes / 1e6:.1f} MB)."
        )


def tokenize_corpus(
    inputs: Iterable[str | os.PathLike],
    out: str | os.PathLike,
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str = "byte",
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    part_tokens: int = 200_000_000,
) -> TokenizeSummary:
    """Tokenize `inputs` into tokenized Parquet at `out`.

    Args:
        inputs: files, folders, globs of raw corpus files.
        out: a `.parquet` file, or a folder that gets `part-00000.parquet`, ... (a new part after
            `part_tokens` tokens). Written under a temporary name and renamed at the end.
        read_config: how to read the inputs.
        tokenizer: a `Tokenizer` or a `load_tokenizer` spec.
        workers: encoding threads (default: all cores).
        overwrite: replace an existing `out` (a folder only if it holds nothing but part files).
        progress: draw a progress bar (default: when stderr is a terminal).
        part_tokens: tokens per part file when `out` is a folder.

    Raises:
        ConfigError: `out` exists without `overwrite`, or bad options.
        DataError: bad input (see `read_corpus`), or no document at all (the skips are named;
            nothing is written and an existing `out` is kept).
    """
    if part_tokens < 1:
        raise ConfigError(f"part_tokens must be >= 1, got {part_tokens}")
    inputs = list(inputs)
    config = read_config or ReadConfig()
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, workers=workers)
    out = Path(out)
    single = out.name.lower().endswith(".parquet")
    _check_out(out, single, overwrite)
    skips = SkipCounter(strict=config.strict)
    schema = tokenized_schema(tokenizer.identity, config.extra_fields)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    _remove(tmp)
    # The outermost folder this call creates (None: out's folder exists), removed on failure.
    made = next((p for p in reversed(out.parents) if not p.exists()), None)
    make_output_folder(out.parent)
    try:  # the first write, up front: a failure names the user's path, not our temporary one
        if single:
            tmp.touch()
        else:
            tmp.mkdir()
    except OSError as exc:
        if made is not None:
            _remove_empty_folders(out.parent, made)
        raise ConfigError(f"cannot write {out} ({exc.strerror or exc})") from None
    start = time.perf_counter()
    writer = _PartWriter(tmp, schema, single=single, part_tokens=part_tokens)
    try:
        with Progress("tokenize", enabled=progress) as bar:
            tables = _tokenized_batches(
                inputs, read_config=config, tokenizer=tokenizer, workers=workers, skips=skips
            )
            write_q = _BackgroundWriter(writer)
            try:
                for table, nbytes in tables:
                    write_q.put(table)
                    tokens = int(pc.sum(table.column("length")).as_py() or 0)
                    bar.update(docs=table.num_rows, tokens=tokens, nbytes=nbytes)
            finally:
                write_q.close()
        if bar.docs == 0:
            # As `stats` and `pack` do: an output without a document is a mistake, not a result.
            raise DataError(f"no documents in {', '.join(map(str, inputs))}{skips.note()}")
        files = writer.close()
    except BaseException:
        writer.abort()
        _remove(tmp)
        if made is not None:
            _remove_empty_folders(out.parent, made)
        raise
    seconds = time.perf_counter() - start
    if single:
        if out.exists():
            out.unlink()
        os.replace(tmp, out)
        files = [out]
    else:
        if out.exists():
            _remove_parts(out)
        os.replace(tmp, out)
        files = [out / f.name for f in files]
    return TokenizeSummary(
        documents=bar.docs,
        tokens=bar.tokens,
        seconds=seconds,
        input_bytes=bar.nbytes,
        skips=skips.to_dict(),
        skip_line=skips.summary(),
        files=[str(f) for f in files],
        output_bytes=sum(f.stat().st_size for f in files),
        tokenizer=tokenizer.identity.to_dict(),
        dtype=str(tokenizer.dtype),
        special_names=tokenizer.special_names,
    )


def _check_out(out: Path, single: bool, overwrite: bool) -> None:
    if not out.exists():
        return
    if not overwrite:
        raise ConfigError(f"{out} already exists; pass --overwrite to replace it")
    if single and out.is_dir():
        raise ConfigError(
            f"{out} is a folder; give a .parquet file name or a folder without .parquet"
        )
    if not single:
        if not out.is_dir():
            raise ConfigError(f"{out} exists and is not a folder")
        others = [p.name for p in out.iterdir() if not _is_part(p)]
        if others:
            raise ConfigError(
                f"{out} holds files that are not tokenize parts ({', '.join(sorted(others)[:3])}); "
                "refusing to replace it, choose another output"
            )


def _is_part(p: Path) -> bool:
    return p.is_file() and p.name.startswith("part-") and p.name.endswith(".parquet")


def _remove_parts(out: Path) -> None:
    for p in out.iterdir():
        if _is_part(p):
            p.unlink()
    out.rmdir()


def _remove_empty_folders(folder: Path, outermost: Path) -> None:
    """Remove `folder` and its parents up to `outermost` while they are empty."""
    while folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        if folder == outermost:
            return
        folder = folder.parent


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


class _PartWriter:
    """Writes tables to one file or to numbered part files."""

    def __init__(self, target: Path, schema: pa.Schema, *, single: bool, part_tokens: int):
        self.target, self.schema, self.single, self.part_tokens = (
            target,
            schema,
            single,
            part_tokens,
        )
        self.files: list[Path] = []
        self._writer: pq.ParquetWriter | None = None
        self._tokens = 0

    def _open(self) -> None:
        path = self.target if self.single else self.target / PART_PATTERN.format(len(self.files))
        self.files.append(path)
        self._writer = pq.ParquetWriter(
            path,
            self.schema,
            compression="zstd",
            use_dictionary=[
                n for n in self.schema.names if n not in ("input_ids", "doc_id", "length")
            ],
        )
        self._tokens = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self._open()
        elif not self.single and self._tokens >= self.part_tokens:
            self._writer.close()
            self._open()
        assert self._writer is not None
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._tokens += int(pc.sum(table.column("length")).as_py() or 0)

    def close(self) -> list[Path]:
        if self._writer is not None:
            self._writer.close()
        return self.files

    def abort(self) -> None:
        if self._writer is not None:
            # The real error is being raised already; a failing close must not mask it.
            with contextlib.suppress(Exception):
                self._writer.close()


class _BackgroundWriter:
    """Writes tables in a thread (Parquet encoding and compression release the GIL)."""

    def __init__(self, writer: _PartWriter, depth: int | None = None) -> None:
        self.writer = writer
        self.q: queue.Queue[pa.Table | None] = queue.Queue(maxsize=depth or PIPELINE_DEPTH)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="packtool-write", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (table := self.q.get()) is not None:
            if self.error is None:
                try:
                    self.writer.write(table)
                except BaseException as exc:  # re-raised in the caller
                    self.error = exc

    def put(self, table: pa.Table) -> None:
        if self.error is not None:
            raise self.error
        self.q.put(table)

    def close(self) -> None:
        self.q.put(None)
        self.thread.join()
        if self.error is not None:
            raise self.error
