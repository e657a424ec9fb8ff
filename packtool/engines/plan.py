"""The partition plan: which input bytes each partition worker reads, fixed before any is read.

`make_plan(files, partition_size)` is a pure function of the ordered input files (path, size,
modification time, kind; for a big Parquet file its row groups' sizes) and the target size:

- consecutive pieces are grouped into one partition while they fit in `partition_size` bytes
  (so many small files make few partitions; a piece never splits further);
- an uncompressed JSON Lines file larger than the target is cut into `ceil(size / target)`
  byte ranges of equal size; a range owns the lines that *start* inside it
  (packtool/read/lines.py), so every line is read by exactly one partition and nobody had to
  read the file to find its line boundaries;
- a Parquet file larger than the target is cut between row groups (consecutive row groups up
  to the target; a row group larger than the target is a piece of its own);
- everything else is one piece: compressed files (a stream cannot be entered in the middle), a
  `.json` array, a text file (one document).

The plan does not depend on the number of workers, the engine or the machine: it is what makes a
run's output the same on a laptop and on a cluster. It is saved in the run's staging folder
(packtool/engines/records.py) and compared on `--resume`, and every worker checks the size and
modification time of each file it opens against it (`check_unchanged`).

At 10^9 documents: the plan holds one entry per input file and per partition (a 5 TB corpus at
the default 256 MB is ~20,000 partitions), not per document; making it reads no input byte
except the footers of the Parquet files larger than the target.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.errors import OVERWRITE, ConfigError, DataError
from packtool.read.compressed import compression_of
from packtool.storage import local as storage
from packtool.tokenize.tables import FilePiece

PARTITION_SIZE = 256 << 20
"""Default target bytes per partition: big enough that per-partition costs (a process task, a
record, a tail, a few shards) vanish, small enough that a 100 GB corpus has ~400 partitions to
spread over workers."""
TO_END = -1
KINDS = ("jsonl", "json_array", "text", "parquet", "tokenized", "pretokenized", "records")
"""How a file is read: JSON Lines, one `.json` array, one text document, Parquet with a text
column, `packtool tokenize` output, token ids made elsewhere (packtool/read/pretokenized.py), fine-tuning
records (read whole: packtool/sft/encode.py)."""
PARQUET_KINDS = ("parquet", "tokenized", "pretokenized")


@dataclass(frozen=True)
class InputFile:
    """One input file as the plan sees it."""

    path: str
    size: int
    mtime_ns: int
    kind: str
    row_group_bytes: tuple[int, ...] | None = None
    """Bytes of each row group, for a Parquet file larger than the target (else None)."""

    @property
    def cut_by_bytes(self) -> bool:
        return self.kind == "jsonl" and compression_of(storage.as_path(self.path)) is None

    def to_json(self) -> list[Any]:
        return [self.path, self.size, self.mtime_ns, self.kind]


@dataclass(frozen=True)
class Piece:
    """Part of one file: bytes `[start, end)` of a JSONL file, row groups `[start, end)` of a
    Parquet file, or the whole file (`start=0, end=TO_END`)."""

    file: int
    start: int = 0
    end: int = TO_END

    def to_json(self) -> list[int]:
        return [self.file, self.start, self.end]


@dataclass(frozen=True)
class Plan:
    files: tuple[InputFile, ...]
    partitions: tuple[tuple[Piece, ...], ...]
    partition_size: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "partition_size": self.partition_size,
            "files": [f.to_json() for f in self.files],
            "partitions": [[p.to_json() for p in part] for part in self.partitions],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """The plan `to_dict` saved (`--resume` reads it instead of planning again)."""
        return cls(
            files=tuple(InputFile(str(p), int(n), int(t), str(k)) for p, n, t, k in d["files"]),
            partitions=tuple(
                tuple(Piece(int(f), int(a), int(b)) for f, a, b in part) for part in d["partitions"]
            ),
            partition_size=int(d["partition_size"]),
        )

    def descriptor(self, index: int) -> dict[str, Any]:
        """What a worker needs for partition `index`: its pieces and their files (small)."""
        pieces = self.partitions[index]
        files = {p.file: self.files[p.file].to_json() for p in pieces}
        return {
            "index": index,
            "partitions": len(self.partitions),
            "pieces": [p.to_json() for p in pieces],
            "files": files,
        }


def check_partition_size(value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"partition_size must be a positive number of bytes, got {value!r}")


def make_plan(files: Sequence[InputFile], partition_size: int) -> Plan:
    """The partitions of `files` (see the module docstring): a pure function of its arguments."""
    check_partition_size(partition_size)
    partitions: list[tuple[Piece, ...]] = []
    current: list[Piece] = []
    held = 0
    for index, f in enumerate(files):
        for piece, nbytes in _pieces(index, f, partition_size):
            if current and held + nbytes > partition_size:
                partitions.append(tuple(current))
                current, held = [], 0
            current.append(piece)
            held += nbytes
    if current:
        partitions.append(tuple(current))
    return Plan(files=tuple(files), partitions=tuple(partitions), partition_size=partition_size)


def _pieces(index: int, f: InputFile, target: int) -> list[tuple[Piece, int]]:
    if f.size <= target:
        return [(Piece(index), f.size)]
    if f.cut_by_bytes:
        n = math.ceil(f.size / target)
        bounds = [f.size * k // n for k in range(n + 1)]
        return [(Piece(index, a, b), b - a) for a, b in zip(bounds, bounds[1:], strict=False)]
    if f.kind in PARQUET_KINDS and f.row_group_bytes:
        out: list[tuple[Piece, int]] = []
        first, held = 0, 0
        for g, nbytes in enumerate(f.row_group_bytes):
            if g > first and held + nbytes > target:
                out.append((Piece(index, first, g), held))
                first, held = g, 0
            held += nbytes
        out.append((Piece(index, first, len(f.row_group_bytes)), held))
        return out
    return [(Piece(index), f.size)]


def describe(path: Path, kind: str, partition_size: int) -> InputFile:
    """The plan's view of `path` (a stat; the footer too for a Parquet file above the target)."""
    st = storage.stat(path)
    row_groups = None
    if kind in PARQUET_KINDS and st.st_size > partition_size:
        meta = storage.parquet_file(path).metadata
        row_groups = tuple(_stored_bytes(meta.row_group(g)) for g in range(meta.num_row_groups))
    return InputFile(str(path), st.st_size, st.st_mtime_ns, kind, row_groups)


def _stored_bytes(rg: Any) -> int:
    """A row group's bytes on disk (its column chunks, compressed)."""
    return sum(rg.column(c).total_compressed_size for c in range(rg.num_columns))


def check_unchanged(path: str, size: int, mtime_ns: int) -> None:
    """Raise a one-line `DataError` when `path` is not the file the run was planned on (an
    object: asked of the store, not of the listing the plan was made from)."""
    try:
        st = storage.stat(path, fresh=True)
    except OSError as exc:
        raise DataError(
            f"{path}: cannot be read any more ({exc.strerror or exc}); it was there when the run "
            "was planned"
        ) from None
    if (st.st_size, st.st_mtime_ns) != (size, mtime_ns):
        what = f"size {size:,} -> {st.st_size:,} bytes" if st.st_size != size else "modified"
        raise DataError(
            f"{path}: changed since the run was planned ({what}); inputs must not change during "
            f"a run: run it again once they are final (with {OVERWRITE} where it resumed an "
            "earlier run, whose finished partitions read the old file)"
        )


def descriptor_pieces(descriptor: dict[str, Any]) -> list[FilePiece]:
    """A partition descriptor's pieces (`Plan.descriptor`), with what a worker needs to read
    and check each."""
    files = {int(k): v for k, v in descriptor["files"].items()}
    out = []
    for f, start, end in descriptor["pieces"]:
        path, size, mtime_ns, _ = files[f]
        out.append(FilePiece(path, size, mtime_ns, f, start, end))
    return out


def check_piece(piece: FilePiece) -> None:
    """`check_unchanged` for a piece's file (what `partition_tables` calls around each piece)."""
    check_unchanged(piece.path, piece.size, piece.mtime_ns)
