"""`packtool verify`: re-check a packed dataset against its manifest and the shard contract.

What is checked, in this order, stopping at the first problem (a one-line `DataError` naming the
file, the row, what is wrong, expected vs found):

1. `index.json`: readable, a known `format_version`, every field of the right type and range, and
   consistent as a whole (`packtool.dataset.manifest_check`, run by `read_manifest` for every reader:
   tokens in = out + truncated + dropped, the document counts, totals == the sums over the shard
   entries, efficiency, bounds, eos/bos below the vocabulary); here, the shards listed in their
   names' order (partition, shard number: the order rows are read in), and `groups.json` where
   a dataset of many `--group-by` groups keeps them (its sha256, each group's counts, their
   sums: packtool/dataset/groups.py).
2. Every listed shard: present, byte size and sha256 as listed, a readable Parquet file with exactly
   the columns index.json lists, in declaration order, with the declared types (uint16 tokens when vocab_size <= 65,536, else uint32), no
   nulls, and as many rows and tokens as listed.
3. Every row, vectorised with numpy over whole row groups: length <= max_len; at least one
   document; len(doc_ids) == len(doc_chunks) == len(doc_offsets) - 1; doc_offsets starts at 0, is
   strictly increasing (documents are never empty), stays inside the row and ends at the row
   length; token ids < vocab_size; chunk indices >= 0. The optional columns index.json lists
   (`loss_mask`) are checked as packtool/dataset/columns.py declares them (packtool/audit/verify_columns.py):
   one value per token or per document, values in range, for `loss_mask` no document
   without a supervised token, and a derived column (`seq_lengths`) equal to its rule (the
   differences of `doc_offsets`); `counts.tokens_supervised` equals the mask's sum. Where
   documents end in EOS (an `eos_id` recorded, no chat template), every piece ends in `eos_id`
   or is `max_len` long (packtool/audit/piece_ends.py).
4. Across the dataset: every (doc_id, chunk) appears exactly once, the chunks of a split
   document are 0..k-1 with none missing, and `counts.segments` / `counts.documents_packed` (when
   recorded) equal the (doc_id, chunk) pieces / distinct doc_ids found.

Files in the folder that the manifest does not list (`*.parquet` leftovers of an interrupted run,
`.*.tmp` temporaries) are not data; they are reported as warnings, not errors.
"""

from __future__ import annotations

import errno
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.audit import piece_ends, verify_columns
from packtool.audit.pieces import Pieces
from packtool.dataset.columns import LOSS_MASK, bytes_parts
from packtool.dataset.groups import read_groups
from packtool.dataset.identity import token_dtype
from packtool.dataset.manifest import (
    INDEX_FILE,
    Manifest,
    open_dataset,
    packed_schema,
    sha256_file,
)
from packtool.errors import DataError, one_line
from packtool.progress import progress_enabled
from packtool.read import docids
from packtool.storage import local as storage
from packtool.storage import writing

COLUMNS = ("input_ids", "doc_offsets", "doc_ids", "doc_chunks")
DAMAGED = (pa.ArrowException, OSError, ValueError)
"""What pyarrow raises on a damaged Parquet file: a flipped byte of a column name in the footer
gives `UnicodeDecodeError` (a `ValueError`), which verify --no-checksums printed as a traceback."""
_NOT_DAMAGE = (errno.EMFILE, errno.ENFILE)
"""What a failed open says of this process or machine, not of the file: no file descriptor
left (the open-file limit, `ulimit -n`, or the system's)."""


def _not_damage(exc: BaseException, where: str) -> None:
    """Raise `exc` as an `OSError` naming `where` if it is one of `_NOT_DAMAGE`: it was reported
    as a damaged shard ("not a readable Parquet file ([Errno 24] Too many open files)")."""
    if isinstance(exc, OSError) and exc.errno in _NOT_DAMAGE:
        raise OSError(exc.errno, os.strerror(exc.errno), where) from None


_FLOATS = {pa.float32(): np.dtype(np.float32), pa.float64(): np.dtype(np.float64)}
"""Arrow float types whose names are not numpy's (`float` is float32 in Arrow)."""


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """What `verify_dataset` measured on a dataset that passed every check."""

    directory: Path
    shards: int
    rows: int
    tokens: int
    documents: int
    """Distinct (doc_id, chunk) pairs: the pieces documents were cut into (`segments`)."""
    max_len: int
    efficiency: float
    """tokens / (rows * max_len), measured from the shards."""
    bytes: int
    checksums: bool
    """Whether sha256 checksums were recomputed (sizes are always checked)."""
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0
    supervised_tokens: int | None = None
    """Tokens with loss_mask 1, for a dataset with a loss mask (else None)."""
    distinct_documents: int | None = None
    """Distinct doc_ids: the documents packed (what `pack`'s summary counts)."""

    def summary(self) -> str:
        """The one-line OK summary the CLI prints."""
        what = "sha256 verified" if self.checksums else "sha256 not checked"
        masked = ""
        if self.supervised_tokens is not None:
            share = self.supervised_tokens / (self.rows * self.max_len) if self.rows else 0.0
            masked = f", {self.supervised_tokens:,} supervised tokens (supervised efficiency {share:.2%})"
        return (
            f"OK {self.directory}: {self.shards} shards, {self.rows:,} rows, {self.tokens:,} "
            f"tokens, {self._documents()}, efficiency {self.efficiency:.2%} "
            f"(max_len {self.max_len}){masked}, {what}, {self.seconds:.1f}s"
        )

    def _documents(self) -> str:
        distinct = self.distinct_documents
        if distinct is None or distinct == self.documents:
            return f"{self.documents:,} documents"
        return f"{distinct:,} documents ({self.documents:,} pieces: long ones split)"


def token_type_for(vocab_size: int) -> pa.DataType:
    """The contract's token type, as the writer picks it: uint16 when every id is below 65,536."""
    return pa.from_numpy_dtype(token_dtype(vocab_size))


def row_problem(
    input_ids: NDArray[np.integer],
    doc_offsets: NDArray[np.integer],
    doc_ids: NDArray[np.integer],
    doc_chunks: NDArray[np.integer],
    *,
    max_len: int,
    vocab_size: int,
) -> str | None:
    """What is wrong with one row, or None: the plain reference for the vectorised checks.

    The checks run in the same priority order as `_first_bad_row`, so the message always
    describes the first problem of the first bad row.
    """
    length = len(input_ids)
    off = [int(x) for x in doc_offsets]
    if length > max_len:
        return f"row length {length} exceeds max_len {max_len}"
    if len(off) < 2:
        return f"row has no documents (doc_offsets {off}, expected at least [0, row length])"
    if len(doc_ids) != len(off) - 1 or len(doc_chunks) != len(off) - 1:
        return (
            f"{len(doc_ids)} doc_ids and {len(doc_chunks)} doc_chunks for {len(off)} doc_offsets "
            f"(expected len(doc_offsets) - 1 = {len(off) - 1} of each)"
        )
    if off[0] != 0:
        return f"doc_offsets starts at {off[0]}, expected 0"
    for k, v in enumerate(off):
        if v > length:
            return f"doc_offsets[{k}] = {v} is past the row end (row length {length})"
    for k in range(1, len(off)):
        if off[k] <= off[k - 1]:
            return (
                f"doc_offsets not strictly increasing at index {k}: {off[k - 1]} then {off[k]} "
                "(documents are never empty)"
            )
    if off[-1] != length:
        return f"doc_offsets ends at {off[-1]}, expected the row length {length}"
    for k, t in enumerate(input_ids):
        if int(t) >= vocab_size:
            return f"input_ids[{k}] = {int(t)} is not below the tokenizer's vocab_size {vocab_size}"
    for k, c in enumerate(doc_chunks):
        if int(c) < 0:
            return f"doc_chunks[{k}] = {int(c)} is negative (expected a chunk index >= 0)"
    return None


def list_parts(arr: pa.Array) -> tuple[NDArray[np.int64], np.ndarray]:
    """(offsets rebased to start at 0, values as numpy) of a list array, honouring slices."""
    offsets = _primitive_view(arr.offsets).astype(np.int64)
    values = arr.values
    if len(offsets) and (offsets[0] != 0 or offsets[-1] != len(values)):
        values = values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
        offsets = offsets - offsets[0]
    return offsets, _primitive_view(values)


def column_parts(arr: pa.Array) -> tuple[NDArray[np.int64] | None, np.ndarray]:
    """(offsets, values) of a shard column: a list, a binary value per row (the values' bytes,
    as uint8) or, for a per-row scalar, (None, the values)."""
    if pa.types.is_binary(arr.type):
        offsets, values = bytes_parts(arr)
        offsets = offsets.astype(np.int64)
        return offsets - offsets[0], values[int(offsets[0]) : int(offsets[-1])]
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return list_parts(arr)
    return None, _primitive_view(arr)


def _primitive_view(arr: pa.Array) -> np.ndarray:
    """A zero-copy numpy view of a null-free integer array.

    Straight from the data buffer: pyarrow's own `to_numpy` / `__array__` import pandas on first
    use, which costs about a second of start-up for a command that otherwise takes milliseconds.
    """
    dtype = _FLOATS.get(arr.type) or np.dtype(str(arr.type))
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(0, dtype=dtype)
    return np.frombuffer(buf, dtype=dtype, count=arr.offset + len(arr))[arr.offset :]


def _rows_of(positions: NDArray[np.int64], offsets: NDArray[np.int64]) -> NDArray[np.int64]:
    """The row each flat value position belongs to."""
    return np.searchsorted(offsets, positions, side="right") - 1


def first_bad_row(
    parts: dict[str, tuple[NDArray[np.int64], np.ndarray]], *, max_len: int, vocab_size: int
) -> int | None:
    """The first row (in this batch) that breaks a row invariant, or None; fully vectorised."""
    ids_off, ids = parts["input_ids"]
    off_off, off = parts["doc_offsets"]
    did_off, _ = parts["doc_ids"]
    ch_off, chunks = parts["doc_chunks"]
    n = len(ids_off) - 1
    row_len = np.diff(ids_off)
    n_off = np.diff(off_off)
    bad = row_len > max_len
    bad |= n_off < 2
    bad |= (np.diff(did_off) != n_off - 1) | (np.diff(ch_off) != n_off - 1)
    has = n_off > 0
    starts = off_off[:-1][has]
    bad[has] |= off[starts] != 0
    bad[has] |= off[off_off[1:][has] - 1] != row_len[has]
    if len(off):
        # Positions, not rows, break these; map the (few) bad positions back to rows.
        row_of_off = np.repeat(np.arange(n, dtype=np.int64), n_off)
        past = np.flatnonzero(off > row_len[row_of_off])
        is_start = np.zeros(len(off), dtype=bool)
        is_start[starts] = True
        not_inc = np.flatnonzero((np.diff(off) <= 0) & ~is_start[1:]) + 1
        bad[row_of_off[past]] = True
        bad[row_of_off[not_inc]] = True
    if len(ids):
        big = np.flatnonzero(ids >= vocab_size)
        bad[_rows_of(big, ids_off)] = True
    if len(chunks):
        neg = np.flatnonzero(chunks < 0)
        bad[_rows_of(neg, ch_off)] = True
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def _fail(where: str, what: str) -> DataError:
    return DataError(f"{where}: {one_line(what)}")


def _id_files(manifest: Manifest, directory: Path) -> int | None:
    """How many input files a `file_offset` dataset's ids may name; None for other schemes.
    A list kept in `SOURCES_FILE` is read and checked against the sha256 index.json records
    (an edited or replaced list passed, and inspect then named the wrong files)."""
    info = manifest.extra.get("doc_ids") or {}
    if info.get("scheme") != docids.SCHEME:
        return None
    return len(docids.input_files(manifest.extra, directory)[0])


def _bad_doc_id(dids: NDArray[np.integer], id_files: int | None) -> int | None:
    """The position of the first id that is negative (every scheme numbers from 0) or names an
    input file the dataset does not list, or None."""
    bad = dids < 0
    if id_files is not None:
        bad |= (dids.astype(np.int64, copy=False) >> docids.OFFSET_BITS) >= id_files
    hits = np.flatnonzero(bad)
    return int(hits[0]) if len(hits) else None


def _check_manifest(manifest: Manifest, index: Path) -> tuple[int, int]:
    """(vocab_size, max_len): the manifest was checked as a whole when `read_manifest` read it.

    Types and ranges of every field, shard paths (inside the folder, each listed once), and the
    identities (`packtool.dataset.manifest_check`): counts.rows / counts.tokens_out against the shard
    entries, efficiency, tokens in = out + truncated + dropped, documents, bounds. Here: the
    order of the shard list (`shard_order_problem`).
    """
    problem = shard_order_problem([s.file for s in manifest.shards])
    if problem is not None:
        raise _fail(str(index), problem)
    return manifest.tokenizer["vocab_size"], manifest.max_len


_SHARD_NUMBERS = re.compile(r"shard-(\d+)(?:-(\d+))?\.parquet")
"""`names.PACK_SHARD_PATTERN` (partition or merge node, shard in it) or `names.SHARD_PATTERN`."""


def shard_order_problem(files: list[str]) -> str | None:
    """The first shard listed out of its names' order, or None: rows are read in the order the
    shards are listed, and packtool lists them by partition and shard number (CONTRACTS.md).
    Swapped entries passed every other check (each entry's size and sha256 follow it) and
    changed the row order. Names packtool does not write (both kinds mixed, a folder) have no
    order to check."""
    keys = []
    for name in files:
        found = _SHARD_NUMBERS.fullmatch(name)
        if found is None:
            return None
        keys.append(tuple(int(n) for n in found.groups() if n is not None))
    if len({len(k) for k in keys}) > 1:
        return None
    for i in range(1, len(keys)):
        if keys[i] <= keys[i - 1]:
            return (
                f"shards[{i}] ({files[i]}) is listed after {files[i - 1]}; shards are listed by "
                "partition and shard number, the order their rows are read in"
            )
    return None


def unlisted_files(directory: Path, manifest: Manifest) -> list[str]:
    """Warning lines for files that look like data but are not in the manifest.

    Looked for where a run writes them: the dataset folder itself (pack writes nothing in a
    subfolder) and the folder of any shard the manifest lists in a subfolder, not below. A
    subfolder is someone else's: another dataset, a `packtool tokenize` output.
    """
    listed = {storage.resolve(directory / s.file) for s in manifest.shards}
    folders = dict.fromkeys([directory, *((directory / s.file).parent for s in manifest.shards)])
    lines = []
    for folder in folders:
        # Any Parquet file, not only `names.is_shard_name`'s: what looks like data and is not
        # listed is worth a word (a hidden one, `.x.parquet`, is not looked at).
        for p in storage.glob(folder, "*.parquet"):
            if storage.resolve(p) not in listed and not p.name.startswith("."):
                lines.append(
                    f"{p}: not listed in {INDEX_FILE}, so not part of the dataset "
                    "(a leftover of an interrupted run? delete it)"
                )
        for p in storage.glob(folder, writing.TEMPORARY_GLOB):
            lines.append(f"{p}: temporary file of an interrupted write; ignored (delete it)")
    return lines


def _progress(items: list, *, enabled: bool):
    """A progress bar over shards on stderr (only on a terminal; see packtool.progress)."""
    from tqdm import tqdm

    return tqdm(
        items,
        desc="verify",
        unit="shard",
        disable=not (enabled and progress_enabled()),
        file=sys.stderr,
        leave=False,
    )


def verify_dataset(
    path: str | Path, *, checksums: bool = True, progress: bool = False
) -> VerifyReport:
    """Re-check a packed dataset; raise `DataError` naming the first problem.

    Args:
        path: The dataset folder (with `index.json`), or its `index.json`.
        checksums: Recompute each shard's sha256 (byte sizes are checked either way).
        progress: Show a progress bar over shards on stderr (only on a terminal).

    Returns:
        A `VerifyReport` with measured totals and warning lines (unlisted files).

    Raises:
        DataError: On the first problem, as one line: file, row, what is wrong, expected vs found.
    """
    start = time.perf_counter()
    directory, manifest = open_dataset(path)
    index = directory / INDEX_FILE
    vocab, max_len = _check_manifest(manifest, index)
    warnings = unlisted_files(directory, manifest)
    optional = verify_columns.optional_columns(manifest.columns)
    eos = piece_ends.ending_eos(manifest.tokenizer, manifest.extra)
    id_files = _id_files(manifest, directory)
    # A dataset's groups kept in groups.json: its sha256 and its counts checked as index.json's
    # own are at open (`read_manifest`), which never reads the file.
    read_groups(manifest, directory)
    supervised = 0
    # Its spill folder goes with it, also where a problem ends the check early.
    pieces = Pieces(manifest.counts.get("segments"))
    shard_starts: list[int] = []
    total_rows = total_tokens = total_bytes = 0
    shards = list(manifest.shards)
    for shard in _progress(shards, enabled=progress):
        file = directory / shard.file
        where = str(file)
        kind = storage.what_is_at(file)
        if kind == "nothing":
            raise _fail(where, f"missing (listed in {INDEX_FILE} with {shard.rows:,} rows)")
        if kind is not None:  # a FIFO, a folder, a device: never opened (a FIFO's open waits)
            raise _fail(
                where,
                f"{kind}, not a regular file (listed in {INDEX_FILE} as a shard of "
                f"{shard.rows:,} rows)",
            )
        size = storage.size(file)
        if size != shard.bytes:
            raise _fail(
                where,
                f"size is {size:,} bytes, expected {shard.bytes:,} ({INDEX_FILE}); "
                "truncated or rewritten",
            )
        # An object of a store: downloaded once (one stream of GETs, not a ranged GET per
        # column chunk and a second read for the checksum), then checked as a local file.
        with storage.local_copy(file, size) as local:
            if checksums:
                digest = sha256_file(local)
                if digest != shard.sha256:
                    raise _fail(
                        where,
                        f"sha256 mismatch: expected {shard.sha256}, found {digest}; the file is "
                        "corrupt or was changed after packing",
                    )
            try:
                # Page CRC32s too: with --no-checksums they are what catches a flipped bit.
                pf = storage.parquet_file(local, memory_map=True, page_checksum_verification=True)
                schema, num_rows = pf.schema_arrow, pf.metadata.num_rows
            except DAMAGED as exc:
                _not_damage(exc, where)
                raise _fail(where, f"not a readable Parquet file ({exc})") from None
            problem = schema_problem(schema, manifest)
            if problem is not None:
                raise _fail(where, problem)
            if num_rows != shard.rows:
                raise _fail(where, f"has {num_rows:,} rows, expected {shard.rows:,} ({INDEX_FILE})")
            shard_starts.append(total_rows)
            shard_tokens = 0
            row_base = 0
            for rg in range(pf.num_row_groups):
                try:
                    table = pf.read_row_group(rg, columns=list(manifest.columns))
                except DAMAGED as exc:
                    _not_damage(exc, where)
                    raise _fail(where, f"row group {rg} unreadable ({exc})") from None
                parts = {}
                for name in manifest.columns:
                    col = table.column(name).combine_chunks()
                    if col.null_count or (hasattr(col, "values") and col.values.null_count):
                        raise _fail(where, f"row group {rg}: {name} contains nulls")
                    parts[name] = column_parts(col)
                core = first_bad_row(parts, max_len=max_len, vocab_size=vocab)
                more = verify_columns.first_bad_row(parts, optional)
                bad = min((b for b in (core, more) if b is not None), default=None)
                if bad is None and eos is not None:  # the rows' invariants hold: offsets usable
                    bad = piece_ends.first_bad_row(parts, eos_id=eos, max_len=max_len)
                if bad is not None:
                    row = _one_row(parts, bad)
                    what = (
                        row_problem(*(row[c] for c in COLUMNS), max_len=max_len, vocab_size=vocab)
                        or verify_columns.row_problem(row, optional)
                        or (
                            eos is not None
                            and piece_ends.row_problem(
                                row["input_ids"], row["doc_offsets"], eos_id=eos, max_len=max_len
                            )
                        )
                        or "breaks a row invariant"
                    )
                    r = row_base + bad
                    raise _fail(f"{where}: row {r} (global row {total_rows + r})", what)
                n = table.num_rows
                did_off, dids = parts["doc_ids"]
                bad_id = _bad_doc_id(dids, id_files)
                if bad_id is not None:
                    r = row_base + int(np.searchsorted(did_off, bad_id, side="right")) - 1
                    raise _fail(
                        f"{where}: row {r} (global row {total_rows + r})",
                        f"doc id {int(dids[bad_id])} "
                        + (
                            "is negative"
                            if dids[bad_id] < 0
                            else f"names input file {int(dids[bad_id]) >> docids.OFFSET_BITS}, "
                            f"but the dataset lists {id_files:,} (ids: file index << "
                            f"{docids.OFFSET_BITS} | offset)"
                        ),
                    )
                pieces.add(
                    dids.astype(np.int64, copy=False),
                    parts["doc_chunks"][1].astype(np.int64, copy=False),
                    np.repeat(np.arange(n, dtype=np.int64), np.diff(did_off))
                    + total_rows
                    + row_base,
                )
                ids_off = parts["input_ids"][0]
                shard_tokens += int(ids_off[-1]) if len(ids_off) else 0
                if LOSS_MASK in parts:
                    supervised += int(parts[LOSS_MASK][1].sum(dtype=np.int64))
                row_base += n
            if shard_tokens != shard.tokens:
                raise _fail(
                    where, f"has {shard_tokens:,} tokens, expected {shard.tokens:,} ({INDEX_FILE})"
                )
            total_rows += row_base
            total_tokens += shard_tokens
            total_bytes += size
            pf.close()  # its mapping too: a downloaded copy's space is freed as it is removed

    starts = np.asarray(shard_starts)

    def where(global_row: int) -> str:
        i = int(np.searchsorted(starts, global_row, side="right") - 1)
        return f"{directory / shards[i].file}: row {global_row - shard_starts[i]}"

    documents, distinct, split = pieces.check(where, _fail)
    pieces.close()
    counts = manifest.counts
    measured = [
        ("segments", documents, "(doc_id, chunk) pieces"),
        ("documents_packed", distinct, "distinct doc_ids"),
        ("documents_split", split, "doc_ids in several chunks"),
    ]
    if LOSS_MASK in manifest.columns:
        measured.append(("tokens_supervised", supervised, "supervised tokens (loss_mask 1)"))
    for key, found, what in measured:
        if key in counts and counts[key] != found:
            raise _fail(
                str(index), f"counts.{key} is {counts[key]:,} but the shards hold {found:,} {what}"
            )
    return VerifyReport(
        directory=directory,
        shards=len(shards),
        rows=total_rows,
        tokens=total_tokens,
        documents=documents,
        distinct_documents=distinct,
        max_len=max_len,
        efficiency=total_tokens / (total_rows * max_len) if total_rows else 0.0,
        bytes=total_bytes,
        checksums=checksums,
        warnings=tuple(warnings),
        seconds=time.perf_counter() - start,
        supervised_tokens=supervised if LOSS_MASK in manifest.columns else None,
    )


def schema_problem(found: pa.Schema, manifest: Manifest) -> str | None:
    """What is wrong with a shard's schema (the columns index.json lists, in order, of their
    declared types), or None; `inspect --row` checks the shard it reads with it too."""
    vocab = manifest.tokenizer["vocab_size"]
    expected = packed_schema(token_type_for(vocab), manifest.columns)
    if found.names != expected.names:
        return f"columns are {found.names}, expected exactly {expected.names} (index.json columns)"
    for f, e in zip(found, expected, strict=True):
        if not pa.types.is_list(e.type):  # a per-row column: a scalar of the declared type
            ok = f.type.equals(e.type)
        else:
            ok = pa.types.is_list(f.type) and f.type.value_type.equals(e.type.value_type)
        if not ok:
            hint = ""
            if f.name == "input_ids":
                hint = (
                    f" for vocab_size {vocab:,} (uint16 when every id is below 65,536, else uint32)"
                )
            return f"column {f.name} is {_type_name(f.type)}, expected {_type_name(e.type)}{hint}"
    return None


def _one_row(parts: dict[str, tuple], r: int) -> dict[str, np.ndarray]:
    """Row `r`'s values by column (list columns sliced, scalar columns indexed)."""
    return {n: v[r] if o is None else v[o[r] : o[r + 1]] for n, (o, v) in parts.items()}


def _type_name(t: pa.DataType) -> str:
    return f"list<{t.value_type}>" if pa.types.is_list(t) else str(t)
