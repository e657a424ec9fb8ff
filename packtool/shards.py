"""Writing packed rows as Parquet shards, atomically (temporary file, fsync, rename), with a CRC32
checksum on every page.

A shard that has its final name is complete; anything still being written is a hidden
`.NAME.tmp` file. Shards never straddle chunks, so the shards of a chunk depend only on that
chunk, which is what lets `--resume` reproduce an uninterrupted run byte for byte.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from packtool.errors import ConfigError, naming
from packtool.manifest import ShardInfo, packed_schema, sha256_file

SHARD_PATTERN = "shard-{:05d}.parquet"
COMPRESSIONS = ("none", "snappy", "lz4", "zstd")


@dataclass(frozen=True, kw_only=True)
class ShardConfig:
    """How packed rows are laid out on disk."""

    shard_rows: int = 16384
    """Rows per shard file at most (a chunk's last shard may hold fewer)."""
    row_group_rows: int = 256
    """Rows per Parquet row group: the unit the loader reads and caches (256 rows of 4096 tokens
    is ~1 M tokens, fetched in ~6 ms; larger groups decode no faster but cost more per fetch)."""
    compression: str = "lz4"
    """Parquet codec: none, snappy, lz4 or zstd. lz4 decodes about as fast as none at a quarter
    of the bytes (Parquet stores uint16 ids as 4-byte ints); zstd is the smallest but decodes
    ~30 % slower (README, "Shard layout")."""
    compression_level: int | None = 1
    """Codec level where the codec has one (zstd 1: cheap to write, fast to read)."""

    def __post_init__(self) -> None:
        if self.shard_rows < 1:
            raise ConfigError(f"shard_rows must be >= 1, got {self.shard_rows}")
        if self.row_group_rows < 1:
            raise ConfigError(f"row_group_rows must be >= 1, got {self.row_group_rows}")
        if self.compression not in COMPRESSIONS:
            raise ConfigError(
                f"compression {self.compression!r} is unknown; choose one of {list(COMPRESSIONS)}"
            )


def _write_one(path: Path, table: pa.Table, config: ShardConfig) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    codec = None if config.compression == "none" else config.compression
    level = config.compression_level if codec in ("zstd",) else None
    with naming(tmp):  # a full disk names the file
        pq.write_table(
            table,
            tmp,
            row_group_size=config.row_group_rows,
            compression=codec,
            compression_level=level,
            # Token lists are high-entropy ids: dictionary encoding only costs time.
            use_dictionary=False,
            write_statistics=False,
            # A CRC32 per page, checked by the loader on every read: a flipped bit in a page is
            # an error instead of different tokens (README, "Loader", for the cost).
            write_page_checksum=True,
        )
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shards(
    directory: Path, table: pa.Table, first_index: int, config: ShardConfig
) -> list[ShardInfo]:
    """Write one chunk's packed rows as shards numbered from `first_index`; return their info.

    The table's columns (the required ones plus any declared optional ones, packtool/columns.py)
    are written in declaration order with the declared types.
    """
    token_type = table.schema.field("input_ids").type.value_type
    schema = packed_schema(token_type, tuple(table.column_names))
    table = table.select(schema.names).cast(schema)
    infos = []
    for i, start in enumerate(range(0, max(table.num_rows, 1), config.shard_rows)):
        part = table.slice(start, config.shard_rows)
        if part.num_rows == 0:
            break
        name = SHARD_PATTERN.format(first_index + i)
        path = directory / name
        _write_one(path, part, config)
        tokens = int(pc_sum_lengths(part))
        infos.append(
            ShardInfo(
                file=name,
                rows=part.num_rows,
                tokens=tokens,
                bytes=path.stat().st_size,
                sha256=sha256_file(path),
            )
        )
    return infos


def pc_sum_lengths(table: pa.Table) -> int:
    """Tokens in a packed table (sum of row lengths) without touching the values."""
    ids = table.column("input_ids").combine_chunks()
    offsets = ids.offsets
    return int(offsets[len(offsets) - 1].as_py() - offsets[0].as_py()) if len(ids) else 0
