"""The pure per-chunk packing step: a table of tokenized documents -> a table of packed rows.

`pack_table` takes an Arrow table in the tokenized schema (`doc_id`, `input_ids`, `length`, any
declared optional columns such as `loss_mask`, and any extra string columns) and returns packed
rows in the shard schema (`input_ids`, `doc_offsets`, `doc_ids`, `doc_chunks`, then the optional
columns it carried, packtool/pack/columns.py, and the derived ones such as `seq_lengths`,
`columns.with_derived`) plus exact counts. It reads no files and writes none, so
the local engine and a distributed one call it unchanged.

Steps: long documents are split / truncated / dropped into *segments* of at most `max_len`
tokens; segments are assigned to rows by a numba kernel (FFD or BFD), per group when
`group_by` is set; extra rounds repack the least-filled rows from a seeded shuffle; rows come out
in a seeded random order so the decreasing sort does not cluster long and short documents in
training order.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numpy.typing import NDArray

from packtool.arrow_numpy import from_numpy, to_numpy
from packtool.dataset import columns
from packtool.errors import ConfigError, DataError, option_choice
from packtool.pack import columns as pack_columns
from packtool.pack import kernels, limits, repack
from packtool.pack.flat_ids import FlatIds
from packtool.pack.limits import check_long_docs, check_split_chunks
from packtool.pack.rows import IDS, PackedRows
from packtool.pack.tail import DOC_CHUNK, TailPolicy, pieces_table, tail_rows

ALGORITHMS = kernels.ALGORITHMS

MAX_CHUNK_TOKENS = 2**31 - 1
"""Tokens one chunk's packed rows may hold: they are one Arrow table, whose `list` offsets are
int32. The engines cut their chunks by tokens too, so that none outgrows it
(packtool/pack/token_cut.py, which reads it at each call: tests lower it)."""


class ChunkTooLarge(ConfigError):
    """A chunk's packed rows would hold more than `MAX_CHUNK_TOKENS` tokens (`pack_table`);
    `token_cut.pack_cut` packs such a chunk in parts instead."""


MAX_ROUNDS = 1000
"""The most `rounds` a run takes: the summary and index.json list the rows after each, and
every round costs a pass over the least-filled rows (10^10 rounds was a 74.5 GiB allocation)."""


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """How documents become packed rows."""

    max_len: int
    """Tokens per row at most (2 to `kernels.MAX_LEN_LIMIT`)."""
    algorithm: str = "ffd"
    """`ffd` (first-fit-decreasing) or `bfd` (best-fit-decreasing)."""
    long_docs: str | None = None
    """Documents longer than max_len: `split` into max_len chunks, `truncate`, or `drop`. None
    decides by the inputs (`columns.policy_for`): `truncate` for data with a loss mask, which is
    never split, else `split`. A run records the policy it decided (`preflight.check_inputs`)."""
    rounds: int = 1
    """Packing passes; each extra round repacks the least-filled rows from a seeded shuffle."""
    seed: int = 0
    """Seeds the repack shuffles and the output row order."""
    group_by: str | None = None
    """Pack only documents sharing this column's value together (e.g. `source`, `lang`)."""

    def __post_init__(self) -> None:
        kernels.check_max_len(self.max_len, minimum=2)
        if self.algorithm not in ALGORITHMS:
            raise ConfigError(
                f"algorithm {self.algorithm!r} is unknown; choose one of {sorted(ALGORITHMS)}"
            )
        if self.long_docs is not None:  # None: decided by the inputs (engines/preflight.py)
            check_long_docs(self.long_docs)
        if not isinstance(self.rounds, int) or not 1 <= self.rounds <= MAX_ROUNDS:
            raise ConfigError(
                f"rounds must be an integer from 1 to {MAX_ROUNDS:,}, got {self.rounds!r} (each "
                "round repacks the least-filled rows again; a few already save most of what "
                "rounds can)"
            )
        if not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"seed must be a non-negative integer, got {self.seed!r}")


def check_room_for_text(
    max_len: int, eos_id: int | None, bos_id: int | None, name: str | None = None
) -> None:
    """Refuse a max_len that BOS + EOS alone fill: no row could hold a token of any document.

    Such rows are legal but every document would come out cut into pieces of specials and
    single tokens; it is a typo (`--max-len 2` for 2048) far more often than a wish. `name` is
    what the message calls the length (`packtool stats` checks its candidates too; None: the
    option, `--max-len N / max_len=N`).
    """
    specials = (eos_id is not None) + (bos_id is not None)
    if max_len <= specials:
        given, fix = (
            (f"{name} {max_len}", f"{name} {specials + 1}")
            if name is not None
            else tuple(option_choice("--max-len", "max_len", n) for n in (max_len, specials + 1))
        )
        raise ConfigError(
            f"{given} leaves no room for text: every document already takes "
            f"{specials} tokens for BOS and EOS; use {fix} or more"
        )


@dataclass
class PackCounts:
    """Exact accounting: tokens_in == tokens_out + tokens_truncated + tokens_dropped."""

    documents_in: int = 0
    documents_packed: int = 0
    documents_split: int = 0
    documents_truncated: int = 0
    documents_dropped: int = 0
    documents_empty: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    tokens_truncated: int = 0
    tokens_dropped: int = 0
    segments: int = 0
    rows: int = 0
    documents_unsupervised: int = 0
    """With a loss mask: documents left out for holding no supervised token (in `dropped`)."""
    tokens_supervised: int = 0
    """With a loss mask: supervised tokens packed (a share of `tokens_out`)."""

    def __iadd__(self, other: PackCounts) -> PackCounts:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        return self

    def to_dict(self) -> dict[str, int]:
        return {f.name: int(getattr(self, f.name)) for f in fields(self)}


@dataclass
class PackedChunk:
    """What `pack_table` returns for one chunk."""

    rows: PackedRows
    """Packed rows in the shard schema, in seeded random order; their ids are gathered when
    asked for (`table`, or `rows.blocks(n)` a block at a time, as the shard writer takes them)."""
    counts: PackCounts
    rows_per_round: list[int]
    """Rows after each round (first entry: the plain FFD/BFD pass), less the rows the last round
    set aside as `tail` in every entry (they are repacked at the end; engines/merge.py adds the
    tail's own rows per round)."""
    segment_lengths: NDArray[np.int64]
    """Lengths of the packed segments (for the lower bound over the whole corpus)."""
    groups: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Group value -> (rows, tokens), when group_by is set."""
    tail: pa.Table | None = None
    """The pieces of the rows set aside (`pack_table(..., tail=...)`), or None."""

    @functools.cached_property
    def table(self) -> pa.Table:
        """Every packed row (the ids gathered on first use)."""
        return self.rows.table()


@dataclass
class _Segments:
    doc: NDArray[np.int64]  # index of the source document in the chunk
    start: NDArray[np.int64]  # first token inside the document
    length: NDArray[np.int64]
    chunk: NDArray[np.int32]  # chunk index of a split document, 0 otherwise


def make_segments(
    lengths: NDArray[np.int64], max_len: int, policy: str
) -> tuple[_Segments, PackCounts]:
    """Cut documents into pieces of at most `max_len` tokens according to the long-doc policy."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    counts = PackCounts(documents_in=n, tokens_in=int(lengths.sum()))
    empty = lengths == 0
    long = lengths > max_len
    counts.documents_empty = int(empty.sum())
    if policy == "split":
        pieces = np.where(empty, 0, -(-lengths // max_len))
        # counted before np.repeat allocates them: a length of 2**40 was a 1 TiB MemoryError
        bound = limits.MAX_SPLIT_CHUNKS
        check_split_chunks(lengths, max_len, int(np.minimum(pieces, bound + 1).sum()))
        counts.documents_split = int(long.sum())
    elif policy == "truncate":
        pieces = (~empty).astype(np.int64)
        counts.documents_truncated = int(long.sum())
        counts.tokens_truncated = int((lengths[long] - max_len).sum())
    else:  # drop
        pieces = (~empty & ~long).astype(np.int64)
        counts.documents_dropped = int(long.sum())
        counts.tokens_dropped = int(lengths[long].sum())
    doc = np.repeat(np.arange(n, dtype=np.int64), pieces)
    # Index of each piece within its document: position minus the document's first piece.
    first = np.cumsum(pieces) - pieces
    chunk = np.arange(len(doc), dtype=np.int64) - np.repeat(first, pieces)
    start = chunk * max_len
    length = np.minimum(max_len, lengths[doc] - start)
    counts.documents_packed = int((pieces > 0).sum())
    counts.segments = len(doc)
    counts.tokens_out = int(length.sum())
    return _Segments(doc, start, length, chunk.astype(np.int32)), counts


def drop_unsupervised(
    segs: _Segments,
    counts: PackCounts,
    mask: NDArray,
    doc_start: NDArray[np.int64],
    lengths: NDArray[np.int64],
) -> _Segments:
    """Leave out the pieces without a supervised token past their first; count them as dropped
    documents.

    With a loss mask nothing is split, so each piece is a whole document or its truncated head.
    """
    src = doc_start[segs.doc] + segs.start
    supervised = pack_columns.supervised_per_segment(mask, src, segs.length)
    # A document's first token is never a target (labels shift): supervised only there, it
    # trains on nothing. With a mask nothing is split, so each piece starts its document.
    first = np.zeros(len(src), np.int64)
    has = segs.length > 0
    first[has] = mask[src[has]]
    gone = supervised - first == 0
    counts.tokens_supervised = int(supervised[~gone].sum())
    if gone.any():
        doc_len = lengths[segs.doc[gone]]
        cut = doc_len > segs.length[gone]  # truncated first: its truncation is undone
        counts.documents_truncated -= int(cut.sum())
        counts.tokens_truncated -= int((doc_len - segs.length[gone])[cut].sum())
        counts.documents_unsupervised += int(gone.sum())
        counts.documents_dropped += int(gone.sum())
        counts.tokens_dropped += int(doc_len.sum())
        counts.documents_packed -= int(gone.sum())
        counts.segments -= int(gone.sum())
        counts.tokens_out -= int(segs.length[gone].sum())
        keep = ~gone
        segs = _Segments(segs.doc[keep], segs.start[keep], segs.length[keep], segs.chunk[keep])
    return segs


def _first_round(
    seg_len: NDArray[np.int64], max_len: int, algorithm: str
) -> tuple[NDArray, NDArray, int]:
    row, offset, n_rows = kernels.assign(seg_len, max_len, algorithm)
    return np.asarray(row, dtype=np.int64), np.asarray(offset, dtype=np.int64), int(n_rows)


def _assign(
    seg_len: NDArray[np.int64], config: PackConfig, rng: np.random.Generator
) -> tuple[NDArray[np.int64], NDArray[np.int64], list[int]]:
    if len(seg_len) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), [0] * config.rounds
    row, offset, n_rows = _first_round(seg_len, config.max_len, config.algorithm)
    rows = np.array([n_rows], np.int64)
    group = np.zeros(len(seg_len), np.int64)
    history = repack.repack_groups(
        seg_len, group, row, offset, rows, config.max_len, config.rounds, rng
    )
    return row, offset, history.tolist()


def _group_codes(table: pa.Table, column: str) -> tuple[NDArray[np.int64], list[str]]:
    if column not in table.column_names:
        available = [c for c in table.column_names if c not in ("input_ids", "length", "doc_id")]
        group_by = option_choice("--group-by", "group_by", column)
        raise ConfigError(f"{group_by}: no such field; available: {available}")
    values = pc.cast(table.column(column), pa.string())
    # Documents without the field form their own group, named "". A chunk in which no document
    # has it is no error (the field may appear in later chunks): the engine checks the whole run.
    values = values.fill_null("")
    encoded = pc.dictionary_encode(values).combine_chunks()
    names = encoded.dictionary.to_pylist()
    # Sort group names so the output does not depend on which value appears first.
    order = np.argsort(np.array(names, dtype=object), kind="stable")
    rank = np.empty(len(names), dtype=np.int64)
    rank[order] = np.arange(len(names))
    return rank[encoded.indices.to_numpy(zero_copy_only=False)], [names[i] for i in order]


def pack_table(
    table: pa.Table,
    config: PackConfig,
    *,
    chunk_index: int | tuple[int, ...] = 0,
    carry: pa.Table | None = None,
    tail: TailPolicy | None = None,
) -> PackedChunk:
    """Pack one chunk of tokenized documents into rows of at most `config.max_len` tokens.

    Args:
        table: tokenized documents (`doc_id` int64, `input_ids` list of ints, `length`).
        config: the packing configuration.
        chunk_index: position of this chunk in the corpus (an int, or a tuple such as
            (partition, chunk)); seeds this chunk's randomness so that every chunk differs and a
            rerun reproduces each one exactly.
        carry: pieces an earlier chunk set aside (`PackedChunk.tail`: `table`'s columns plus
            `doc_chunk`), packed with `table`'s documents. They were counted where they were
            cut, so they add rows here but no document, segment or token counts.
        tail: set the least-filled rows aside as `PackedChunk.tail` instead of writing them
            (packtool/pack/tail.py); None keeps every row.

    A column of `table` named `doc_chunk` is a `ConfigError`: the name is reserved for the
    chunk index a tail's pieces carry (`carry=`), as `ReadConfig` refuses it as an extra field.
    """
    if DOC_CHUNK in table.column_names:
        raise ConfigError(
            f"tokenized table: column {DOC_CHUNK!r} is reserved (the chunk index of a carried "
            "tail's pieces, packtool/pack/tail.py); rename the column"
        )
    n_carry = carry.num_rows if carry is not None else 0
    if n_carry:
        pieces = carry.drop_columns([DOC_CHUNK])
        if pieces.schema != table.schema:
            pieces = pieces.cast(table.schema)
        table = pa.concat_tables([pieces, table])  # no copy: FlatIds reads chunk by chunk
    values = FlatIds(table.column("input_ids"))
    doc_start = values.doc_start
    lengths = np.diff(doc_start)
    if "length" in table.column_names:
        recorded = to_numpy(table.column("length"))
        if len(recorded) != len(lengths) or not np.array_equal(recorded, lengths):
            raise DataError("tokenized table: `length` does not match the number of input_ids")
    optional = pack_columns.carried(table)
    long_docs = pack_columns.policy_for(columns.names(optional), config.long_docs)
    pack_columns.check_policy(columns.names(optional), long_docs, api=True)
    segs, counts = make_segments(lengths[n_carry:], config.max_len, long_docs)
    segs.doc += n_carry
    flat: dict[str, NDArray] = {}
    if columns.LOSS_MASK in columns.names(optional):
        flat[columns.LOSS_MASK] = pack_columns.token_values(table, columns.LOSS_MASK, doc_start)
        segs = drop_unsupervised(segs, counts, flat[columns.LOSS_MASK], doc_start, lengths)
    new_lengths = segs.length
    if n_carry:  # one segment per carried piece, first (placement ties go to the carried)
        chunk = to_numpy(carry.column(DOC_CHUNK)).astype(np.int32)
        segs = _Segments(
            np.concatenate([np.arange(n_carry, dtype=np.int64), segs.doc]),
            np.concatenate([np.zeros(n_carry, np.int64), segs.start]),
            np.concatenate([lengths[:n_carry], segs.length]),
            np.concatenate([chunk, segs.chunk]),
        )
    seed = chunk_index if isinstance(chunk_index, tuple) else (chunk_index,)
    rng = np.random.default_rng([config.seed, *seed])
    placed = _place(table, segs, config, rng)
    set_aside = None
    if tail is not None and placed.n_rows:
        fill = np.bincount(placed.row, weights=segs.length, minlength=placed.n_rows)
        is_tail = tail_rows(
            fill.astype(np.int64), placed.row_group, placed.names, config.max_len, tail
        )
        if is_tail.any():
            gone = is_tail[placed.row]
            pick = np.flatnonzero(gone)
            set_aside = pieces_table(
                table,
                values,
                doc_start,
                segs.doc[pick],
                segs.start[pick],
                segs.length[pick],
                segs.chunk[pick],
                flat,
            )
            placed = placed.without(is_tail, gone, segs.length)
            keep = ~gone
            segs = _Segments(segs.doc[keep], segs.start[keep], segs.length[keep], segs.chunk[keep])
    counts.rows = placed.n_rows
    out = _packed_rows(table, values, doc_start, segs, placed, optional, flat, rng)
    return PackedChunk(
        rows=out,
        counts=counts,
        rows_per_round=[int(h) for h in placed.history],
        segment_lengths=new_lengths,
        groups=placed.groups,
        tail=set_aside,
    )


@dataclass
class _Placement:
    """Where each segment went: row and offset, with the rows per round, group and group totals."""

    row: NDArray[np.int64]
    offset: NDArray[np.int64]
    history: NDArray[np.int64]
    row_group: NDArray[np.int64]
    names: list[str]
    groups: dict[str, tuple[int, int]]

    @property
    def n_rows(self) -> int:
        return int(self.history[-1])

    def without(
        self, is_tail: NDArray[np.bool_], gone: NDArray[np.bool_], seg_len: NDArray[np.int64]
    ) -> _Placement:
        """The placement of the segments left once the rows `is_tail` are set aside."""
        kept_rows = ~is_tail
        new_id = np.cumsum(kept_rows) - 1
        groups = dict(self.groups)
        if groups:
            lost_rows = np.bincount(self.row_group[is_tail], minlength=len(self.names))
            lost_tokens = np.bincount(
                self.row_group[self.row[gone]], weights=seg_len[gone], minlength=len(self.names)
            )
            for g in np.flatnonzero(lost_rows):  # only groups that lost rows: not O(groups)
                r, t = groups[self.names[g]]
                groups[self.names[g]] = (r - int(lost_rows[g]), t - int(lost_tokens[g]))
        return _Placement(
            row=new_id[self.row[~gone]],
            offset=self.offset[~gone],
            history=self.history - int(is_tail.sum()),
            row_group=self.row_group[kept_rows],
            names=self.names,
            groups=groups,
        )


def _place(
    table: pa.Table, segs: _Segments, config: PackConfig, rng: np.random.Generator
) -> _Placement:
    """Assign every segment to a row (per group when `config.group_by` is set)."""
    if config.group_by is None:
        row, offset, hist = _assign(segs.length, config, rng)
        history = np.asarray(hist, dtype=np.int64)
        return _Placement(row, offset, history, np.zeros(int(history[-1]), np.int64), [""], {})
    codes, names = _group_codes(table, config.group_by)
    seg_group = codes[segs.doc]
    n_groups = len(names)
    # Every group's first round in one kernel call: a call per group cost O(max_len) each and a
    # scan of every segment (18 s for 10^5 one-document groups, now 0.1 s).
    row, offset, rows = kernels.grouped_assign(
        segs.length, seg_group, config.max_len, config.algorithm, n_groups
    )
    # Every group's extra rounds in one kernel call too, groups in name order (a group of one
    # row is never repacked, nor draws); a Python call per group and round cost 0.2 ms each.
    history = repack.repack_groups(
        segs.length, seg_group, row, offset, rows, config.max_len, config.rounds, rng
    )
    row += (np.cumsum(rows) - rows)[seg_group]  # each group's rows after the groups before it
    tokens = np.bincount(seg_group, weights=segs.length, minlength=n_groups).astype(np.int64)
    present = np.flatnonzero(np.bincount(seg_group, minlength=n_groups))
    totals = zip(rows[present].tolist(), tokens[present].tolist(), strict=True)
    groups = dict(zip([names[g] for g in present.tolist()], totals, strict=True))
    row_group = np.repeat(np.arange(n_groups, dtype=np.int64), rows)
    return _Placement(row, offset, history, row_group, names, groups)


def _packed_rows(
    table: pa.Table,
    values: FlatIds,
    doc_start: NDArray[np.int64],
    segs: _Segments,
    placed: _Placement,
    optional: tuple,
    flat: dict[str, NDArray],
    rng: np.random.Generator,
) -> PackedRows:
    """The packed rows in the shard schema, in a seeded random order (ids not yet gathered)."""
    n_rows, row, offset = placed.n_rows, placed.row, placed.offset
    # Output order: rows in a seeded permutation, documents inside a row in placement order.
    row_rank = rng.permutation(n_rows)[row] if n_rows else row
    order = np.lexsort((offset, row_rank))
    seg_len = segs.length[order]
    out_row = row_rank[order]
    row_len = np.bincount(out_row, weights=seg_len, minlength=n_rows).astype(np.int64)
    segs_per_row = np.bincount(out_row, minlength=n_rows).astype(np.int64)
    total = int(seg_len.sum())
    if total > MAX_CHUNK_TOKENS:
        raise ChunkTooLarge(
            f"a chunk of {total:,} tokens is too large for one Arrow table (at most "
            f"{MAX_CHUNK_TOKENS:,}); pack fewer documents at once"
        )

    # Segment i's tokens are values[src_i : src_i + len_i], laid out one after another (gathered
    # when the rows are asked for: PackedRows).
    src = doc_start[segs.doc[order]] + segs.start[order]
    dst = np.cumsum(seg_len) - seg_len

    row_offsets = np.concatenate([[0], np.cumsum(row_len)]).astype(np.int32)
    seg_offsets = np.concatenate([[0], np.cumsum(segs_per_row)]).astype(np.int32)
    # doc_offsets of a row: each segment's start inside the row, then the row length.
    within = dst - np.repeat(row_offsets[:-1].astype(np.int64), segs_per_row)
    ends_at = seg_offsets[1:]
    doc_off_values = np.insert(within, ends_at, row_len).astype(np.int32)
    doc_off_offsets = (seg_offsets + np.arange(n_rows + 1)).astype(np.int32)

    doc_ids = to_numpy(table.column("doc_id")).astype(np.int64)[segs.doc[order]]
    extra = pack_columns.gather(
        table, optional, doc_start, segs.doc[order], src, seg_len, row_offsets, seg_offsets, flat
    )
    rest = pa.table(
        {
            "doc_offsets": pa.ListArray.from_arrays(
                from_numpy(doc_off_offsets), from_numpy(doc_off_values)
            ),
            "doc_ids": pa.ListArray.from_arrays(from_numpy(seg_offsets), from_numpy(doc_ids)),
            "doc_chunks": pa.ListArray.from_arrays(
                from_numpy(seg_offsets), from_numpy(segs.chunk[order])
            ),
            **extra,
        }
    )
    rest = columns.with_derived(rest)  # e.g. seq_lengths, from doc_offsets (never the ids)
    names = columns.ordered([IDS, *rest.column_names])
    return PackedRows(values, src, seg_len, row_offsets, seg_offsets, rest, names)
