"""One partition of `packtool tokenize --to megatron`: its documents as a part `.bin` + lengths.

The worker side of packtool/engines/megatron/run.py. Any engine runs it through
`worker.run_partition` (a descriptor of kind `MEGATRON`), on the same pieces the pack workers
read (`plan.descriptor_pieces`) through the same dispatch (`tables.partition_tables`): the
documents of the partition in reading order, each as the tokenizer encodes it. They are written
by `dataset.megatron.MegatronWriter` (in a thread, overlapping the tokenizer, as `packtool
tokenize` does) under hidden names, which become `part-PPPPPP.bin` / `.lengths` once complete;
last comes the completion record (`records.write_record`). A worker killed at any point leaves
no record, and running the partition again writes the same bytes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from packtool.dataset.megatron import MegatronWriter
from packtool.dataset.tokenized_writer import BackgroundWriter
from packtool.engines import records
from packtool.engines.plan import check_piece, descriptor_pieces
from packtool.read.documents import SkipCounter
from packtool.storage import writing
from packtool.tokenize.tables import (
    PRETOKENIZED,
    Source,
    partition_tables,
    skipped_where,
    without_empty,
)
from packtool.tokenizer.specials import add_specials
from packtool.tokenizer.tokenizers import Tokenizer

MEGATRON = "megatron"
"""The descriptor kind of a Megatron part (`worker.run_partition` dispatches on it)."""
PARTS_DIR = "megatron"
"""Inside the run state folder: the parts not merged yet (`part_paths`)."""


@dataclass(frozen=True, kw_only=True)
class MegatronContext:
    """What a Megatron part's worker needs besides its descriptor (shipped once per worker)."""

    source: Source
    tokenizer: Tokenizer | None
    work: str
    """The run's staging folder (absolute; on a cluster, a path every node sees)."""
    dtype: str
    """The `.bin` dtype (`dataset.megatron.megatron_dtype`)."""


def part_paths(work: Path, p: int) -> tuple[Path, Path]:
    """Partition `p`'s token file and lengths file (int32, one per document)."""
    folder = records.run_dir(work) / PARTS_DIR
    return folder / f"part-{p:06d}.bin", folder / f"part-{p:06d}.lengths"


def _with_eos(table: Any, eos: int) -> Any:
    """Pre-tokenized ids with `eos` after each document (`preprocess_data.py --append-eod`; the
    ids themselves are used unchanged)."""
    ids = table.column("input_ids").combine_chunks()
    lengths = table.column("length").to_numpy().astype(np.int64)
    flat = ids.flatten().to_numpy(zero_copy_only=False)
    out, out_lengths = add_specials(flat, lengths, None, eos, flat.dtype)  # as text gets its EOS
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(out_lengths, out=offsets[1:])
    k = table.schema.get_field_index("input_ids")
    field = table.schema.field(k)
    new_ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(out, field.type.value_type))
    table = table.set_column(k, field, new_ids)
    k = table.schema.get_field_index("length")
    return table.set_column(k, table.schema.field(k), pa.array(out_lengths.astype(np.int32)))


def _without_empty(table: Any, skips: SkipCounter, eos: int | None, starts: dict[str, int]) -> Any:
    """`table` without its documents of no token besides the EOS appended to them (text the
    tokenizer turns into nothing, such as whitespace), each counted as an `empty` skip, as `pack`
    counts them: Megatron's preprocess_data appends no end of document to a text of no ids and
    gives it no sequence (docs/integrations.md). Under a BOS-adding tokenizer such a text is
    [BOS, EOS], a token besides the EOS: kept, as Megatron keeps it (its ids are [BOS])."""
    return without_empty(table, skips, int(eos is not None), starts)


def run_part(ctx: MegatronContext, descriptor: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one partition into its part files and completion record; return the record.

    Raises:
        DataError: bad input (as the readers say), or an input changed since the run was planned.
    """
    t0 = time.perf_counter()
    p = int(descriptor["index"])
    work = Path(ctx.work)
    bin_path, lengths_path = part_paths(work, p)
    writing.make_dirs(bin_path.parent)
    bin_tmp, lengths_tmp = writing.temporary_name(bin_path), writing.temporary_name(lengths_path)
    pieces = descriptor_pieces(descriptor)
    starts = {piece.path: piece.start for piece in pieces}

    def where(table: Any, row: int) -> str:  # a document the writer refuses, as readers name it
        return skipped_where(
            str(table.column("source")[row]), table.column("doc_id")[row].as_py(), starts
        )

    writer = MegatronWriter(
        bin_tmp, None, np.dtype(ctx.dtype), lengths_path=lengths_tmp, where=where
    )
    skips = SkipCounter(strict=ctx.source.read.strict)
    nbytes = 0
    try:
        queue = BackgroundWriter(writer)
        try:
            eos = ctx.source.identity.eos_id
            for table, n in partition_tables(ctx.source, ctx.tokenizer, pieces, skips, check_piece):
                if ctx.source.mode == PRETOKENIZED and eos is not None:
                    table = _with_eos(table, eos)
                queue.put(_without_empty(table, skips, eos, starts))
                nbytes += n
        finally:
            queue.close()
        writer.close()
        writing.replace(bin_tmp, bin_path)
        writing.replace(lengths_tmp, lengths_path)
    except BaseException:
        writer.abort()
        raise
    record = {
        "partition": p,
        "kind": MEGATRON,
        "documents": writer.documents,
        "tokens": writer.tokens,
        "bin_bytes": writer.tokens * np.dtype(ctx.dtype).itemsize,
        "input_bytes": nbytes,
        "skips": {"counts": skips.counts, "examples": skips.examples},
        "seconds": {"read+tokenize+write": time.perf_counter() - t0},
        "shards": [],  # the shape `records.read_record` checks: this record has no shards
        "counts": {},
    }
    records.write_record(work, record)
    return record
