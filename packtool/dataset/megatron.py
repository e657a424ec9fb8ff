"""Megatron indexed datasets: `PREFIX.bin` (the tokens) and `PREFIX.idx` (where each document is).

The format Megatron-LM, Megatron-Bridge and MaxText train from, written byte for byte as
megatron-core's `IndexedDatasetBuilder` writes it (megatron/core/datasets/indexed_dataset.py),
one sequence per document as `tools/preprocess_data.py` makes them without sentence splitting:

- `.bin`: every document's token ids end to end, in the dtype Megatron picks for the vocabulary
  (`DType.optimal_dtype`: uint16 below 65,500 ids, else int32), no header.
- `.idx`: `MMIDIDX\\x00\\x00`, version 1 (`<Q`), the dtype's code (`<B`), the sequence count N and
  the document count N + 1 (`<Q` each), then N int32 sequence lengths, N int64 byte pointers
  into `.bin`, and N + 1 int64 document indices (0, 1, ..., N: one sequence per document).

`MegatronWriter` streams: token bytes go to `.bin` as tables arrive and the lengths to a hidden
side file, so memory never grows with the corpus. The index is written at `close`, because
its counts come first and its arrays one after another: one pass over the side file (4 bytes a
document read, 20 bytes a document written; at 10^9 documents ~24 GB, about 1% of the `.bin`
bytes), in blocks, never the whole index in memory. Megatron's own builder keeps every length in
a Python list instead.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from packtool.errors import ConfigError, DataError, naming, option_choice
from packtool.storage import local as storage
from packtool.storage import writing

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}
"""megatron-core's `DType` codes."""
UINT16_BELOW = 65_500
"""`DType.optimal_dtype`: uint16 for a vocabulary of fewer ids than this, else int32."""
INT32_IDS = 2**31
"""The most ids a Megatron dataset holds: int32's 0 .. 2**31 - 1 (`megatron_dtype`)."""
BLOCK = 1 << 20
"""Documents per block when the index is written (8 MB of pointers)."""


MEGATRON = "--to megatron / tokenize_megatron"
"""What a message about the format names: the CLI's choice and the library's function."""


def megatron_dtype(vocab_size: int) -> np.dtype:
    """The dtype megatron-core's `DType.optimal_dtype(vocab_size)` stores ids in.

    Raises:
        ConfigError: ids past int32's largest, which the format cannot hold (megatron-core
            has no wider id type: `optimal_dtype` gives int32 for any vocabulary of 65,500 ids
            or more, and a wider id would be written wrapped negative).
    """
    if vocab_size > INT32_IDS:
        raise ConfigError(
            f"{MEGATRON}: the vocabulary has {vocab_size:,} ids, but a "
            f"Megatron indexed dataset stores int32 ids, at most {INT32_IDS - 1:,}: choose an "
            f"EOS / BOS id below that ({option_choice('--eos-id', 'eos', 'N')}, "
            f"{option_choice('--bos-id', 'bos', 'N')}), or write tokenized Parquet "
            "(--to parquet / tokenize_corpus: uint32 ids)"
        )
    return np.dtype(np.uint16 if vocab_size < UINT16_BELOW else np.int32)


def megatron_paths(prefix: str | os.PathLike) -> tuple[Any, Any]:
    """(`PREFIX.bin`, `PREFIX.idx`); a prefix given as either file names the same pair. A URL
    prefix (`s3://bucket/data/corpus`) gives the pair's objects."""
    text = str(prefix)
    path = None if text.endswith(("/", os.sep)) else storage.as_path(prefix)
    # A folder: `x/`, `.`, `..`, `x/.` (which Path makes `x`), a bucket's root (`s3://b`, whose
    # name is empty: the pair was `s3://b/.bin`) or a Hub repository's
    last = text.replace(os.sep, "/").rsplit("/", 1)[-1]
    if path is None or last in (".", "..") or not path.name or _repository_root(text):
        raise ConfigError(
            f"-o {text}: a Megatron dataset is two files, PREFIX.bin and PREFIX.idx, so -o names "
            f"a file prefix, not a folder (e.g. {text.rstrip('/' + os.sep)}/corpus)"
        )
    name = path.name
    stem = name[: -len(".idx")] if name.endswith((".bin", ".idx")) else name
    if stem in ("", ".", ".."):  # `d/.idx` (whose suffix Path sees as none) wrote `d/.idx.bin`
        raise ConfigError(
            f"-o {text}: the prefix's name is empty once {name[len(stem) :]} is taken off (a "
            "Megatron dataset is PREFIX.bin and PREFIX.idx): give it a name, e.g. "
            f"{text[: len(text) - len(name)]}corpus"
        )
    return path.with_name(stem + ".bin"), path.with_name(stem + ".idx")


def _repository_root(text: str) -> bool:
    """`hf://datasets/ORG/NAME`: a Hub repository, no file in it."""
    from packtool.storage import hub

    return hub.is_hub(text) and not hub.parse(text).path_in_repo


class MegatronWriter:
    """Streams documents into a `.bin` and writes its `.idx` at `close`.

    Args:
        bin_path: the token file to write (a temporary name; the caller moves it in place).
        idx_path: the index file to write at `close` (a temporary name too: a `.idx` is whole
            only once `close` returns; one it could not finish is deleted); None for a part of
            a partitioned run
            (packtool/engines/megatron/run.py), whose lengths stay in `lengths_path` for the merge.
        dtype: the token dtype (`megatron_dtype(vocab_size)`).
        lengths_path: where the side file of lengths goes (default: a hidden name by `idx_path`).
        where: `where(table, row)` names a document in errors (default: its number in the
            `.bin`, counting from 1).
    """

    def __init__(
        self,
        bin_path: Path,
        idx_path: Path | None,
        dtype: np.dtype,
        lengths_path: Path | None = None,
        where: Callable[[Any, int], str] | None = None,
    ) -> None:
        self.bin_path, self.idx_path, self.dtype = bin_path, idx_path, np.dtype(dtype)
        self.where = where or (lambda table, row: f"document {self.documents + row + 1:,}")
        if lengths_path is None:
            assert idx_path is not None, "a part writer names its lengths file"
            lengths_path = writing.temporary_name(idx_path.with_name(idx_path.name + ".lengths"))
        self.lengths_path = lengths_path
        self.documents = 0
        self.tokens = 0
        with naming(bin_path):
            self._bin: Any = writing.open_output(bin_path)
        with naming(self.lengths_path):
            self._lengths: Any = writing.open_output(self.lengths_path)

    def write(self, table: Any) -> None:
        """Append a table of the tokenized schema: each row's ids as one document."""
        from packtool.dataset.columns import flat_parts

        offsets, flat = flat_parts(table.column("input_ids"))
        lengths = np.diff(offsets).astype(np.int32)
        ids = flat if flat.dtype == self.dtype else self._narrowed(table, offsets, flat)
        with naming(self.bin_path):
            self._bin.write(ids.tobytes())
        with naming(self.lengths_path):
            self._lengths.write(lengths.tobytes())
        self.documents += len(lengths)
        self.tokens += int(offsets[-1])

    def _narrowed(self, table: Any, offsets: np.ndarray, flat: np.ndarray) -> np.ndarray:
        """`flat` in the `.bin`'s dtype; `DataError` naming the first document with an id that
        dtype cannot hold, which `astype` would wrap (3000000000 as int32: -1294967296)."""
        if len(flat) and not np.can_cast(flat.dtype, self.dtype):
            info = np.iinfo(self.dtype)
            if int(flat.min()) < info.min or int(flat.max()) > info.max:
                wide = flat.astype(np.int64)  # (a uint64 past it: negative, as bad)
                at = int(np.flatnonzero((wide < info.min) | (wide > info.max))[0])
                row = int(np.searchsorted(offsets, at, side="right")) - 1
                raise DataError(
                    f"{self.where(table, row)}: token id {int(flat[at])} does not fit the "
                    f"{self.dtype.name} ids of the Megatron .bin ({info.min:,} .. {info.max:,})"
                )
        return flat.astype(self.dtype)

    def close(self) -> None:
        """Flush the `.bin` (and the lengths) to the disk and write the `.idx` (fsynced too)."""
        for f, path in ((self._bin, self.bin_path), (self._lengths, self.lengths_path)):
            with naming(path):
                writing.sync_stream(f)
                f.close()
        if self.idx_path is None:
            return
        try:
            write_index(self.idx_path, self.lengths_path, self.dtype, self.documents)
        finally:
            writing.remove_file(self.lengths_path)

    def abort(self) -> None:
        """Close and delete everything this writer wrote."""
        for f in (self._bin, self._lengths):
            f.close()
        for path in (self.bin_path, self.lengths_path, self.idx_path):
            if path is not None:
                writing.remove_file(path)


def write_index(idx_path: Path, lengths_path: Path, dtype: np.dtype, documents: int) -> None:
    """Write the `.idx` of `documents` documents whose int32 lengths are the file
    `lengths_path`, in blocks (see the module docstring), and fsync it. A `.idx` it cannot
    finish (a full disk) is deleted: its header alone would look like an index (one it could not
    open, it never wrote: left as it is)."""
    with naming(idx_path), writing.open_output(idx_path) as out:
        try:
            _write_index(out, lengths_path, np.dtype(dtype), documents)
        except BaseException:
            out.close()
            writing.remove_file(idx_path)
            raise


def _write_index(out: Any, lengths_path: Path, dtype: np.dtype, documents: int) -> None:
    """`write_index`'s bytes, into the opened `out`."""
    n = documents
    out.write(INDEX_HEADER)
    out.write(struct.pack("<Q", INDEX_VERSION))
    out.write(struct.pack("<B", DTYPE_CODES[dtype]))
    out.write(struct.pack("<Q", n))
    out.write(struct.pack("<Q", n + 1))
    writing.append_range(lengths_path, 0, 4 * n, out)
    itemsize = dtype.itemsize
    at = np.int64(0)  # the byte where the next block's first document starts
    with storage.open_input(lengths_path) as lengths:
        while block := lengths.read(4 * BLOCK):
            sizes = np.frombuffer(block, dtype=np.int32).astype(np.int64) * itemsize
            pointers = np.empty(len(sizes), dtype=np.int64)
            pointers[0] = at
            np.cumsum(sizes[:-1], out=pointers[1:])
            pointers[1:] += at
            at += sizes.sum()
            out.write(pointers.tobytes())
    for start in range(0, n + 1, BLOCK):
        out.write(np.arange(start, min(start + BLOCK, n + 1), dtype=np.int64).tobytes())
    writing.sync_stream(out)


def read_megatron_index(idx_path: str | os.PathLike) -> dict[str, Any]:
    """The `.idx` at `idx_path`: {dtype, lengths, pointers, document_indices}, read whole (for
    checks and tests; Megatron's `IndexedDataset` memory-maps it). `DataError` naming the file
    when it is not this format."""
    data = storage.read_bytes(idx_path)
    head = len(INDEX_HEADER) + 8 + 1 + 8 + 8
    if len(data) < head or not data.startswith(INDEX_HEADER):
        raise DataError(f"{idx_path}: not a Megatron indexed dataset index (bad header)")
    version, code, n, docs = struct.unpack_from("<QBQQ", data, len(INDEX_HEADER))
    codes = {v: k for k, v in DTYPE_CODES.items()}
    if version != INDEX_VERSION or code not in codes:
        raise DataError(f"{idx_path}: index version {version}, dtype code {code}: not supported")
    if len(data) != head + 4 * n + 8 * n + 8 * docs:
        raise DataError(f"{idx_path}: {len(data)} bytes, not what {n} sequences need")
    lengths = np.frombuffer(data, np.int32, n, head)
    pointers = np.frombuffer(data, np.int64, n, head + 4 * n)
    documents = np.frombuffer(data, np.int64, docs, head + 12 * n)
    return {
        "dtype": codes[code],
        "lengths": lengths,
        "pointers": pointers,
        "document_indices": documents,
    }
