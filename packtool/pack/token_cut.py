"""Chunks cut by tokens as well as by documents, so that none outgrows one Arrow table.

A chunk's packed rows are one Arrow table, whose `list` offsets are int32: at most
`chunk.MAX_CHUNK_TOKENS` (2^31 - 1) tokens. The engines cut chunks by `--chunk-docs`
documents (pieces, in the tail tree), which bounds their tokens only through the documents'
lengths: at `--max-len` 2^24 a merge node's input is up to 64 x 32 rows of 2^24 tokens (2^35),
and 100,000 documents of a few million tokens are far more than 2^31 too. Such a chunk failed
at the end of its packing ("lower --chunk-docs"); in the tail tree's root, after every
partition had finished.

`pack_cut` packs a chunk with one `pack_table` call whenever its rows fit in one table: the
very call the engines made before, so a run that succeeded before writes the same bytes. Only
a chunk that cannot fit (its pieces keep more tokens than the limit and its tail can take out)
or that `pack_table` refuses (`ChunkTooLarge`: it might have fitted) is packed in consecutive
parts instead, each of at most the limit's tokens with the rows the part before set aside
(`tail`), as the chunks of a partition follow each other. `read_limit` is how many tokens the tail tree reads
into one chunk: past it, the chunk could not have fitted even with the most tokens its tail
takes out, so cutting there changes no run that succeeded.

Pure, like packtool/pack/chunk.py: tables in, `PackedChunk`s out.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.dataset import columns
from packtool.errors import ConfigError, option_choice
from packtool.pack import chunk
from packtool.pack import columns as pack_columns
from packtool.pack.chunk import ChunkTooLarge, PackConfig, PackedChunk, pack_table
from packtool.pack.flat_ids import FlatIds
from packtool.pack.tail import TailPolicy

_SAME = TailPolicy()
"""`pack_cut`'s `between` default: a stand-in for "`tail`" (None is a policy of its own)."""


def read_limit(config: PackConfig, tail: TailPolicy | None) -> int:
    """Tokens of pieces to read into one chunk at most: the limit plus the most tokens the
    chunk's `tail` can set aside (each of its rows has a free slot). A chunk with more could
    not fit, so a cut there changes no run that succeeded before, and a process holds one
    chunk of at most this many tokens (~2.7 G at `max_len` 2^24) instead of every child's
    tail."""
    rows = tail.max_rows if tail is not None else 0
    return chunk.MAX_CHUNK_TOKENS + rows * config.max_len


def pack_cut(
    table: pa.Table,
    config: PackConfig,
    *,
    chunk_index: tuple[int, ...],
    carry: pa.Table | None = None,
    tail: TailPolicy | None = None,
    between: TailPolicy | None = _SAME,
) -> Iterator[PackedChunk]:
    """`pack_table(table, config, chunk_index=..., carry=..., tail=...)`, in parts if its rows
    would outgrow one Arrow table; the parts one after another, each written before the next
    is packed (the last one's `tail` is the chunk's).

    A part holds `carry`'s pieces, then `table`'s documents, in order, as many as fit in
    `chunk.MAX_CHUNK_TOKENS` with the pieces the part before set aside (as the kept tokens of
    a document under the long-document policy count, an upper bound of what it packs); part k
    (from 1) is seeded by (*chunk_index, k). Where the set-aside pieces leave no room for the
    next document (a limit lowered below 32 rows, as tests do), they are packed alone, into
    rows of their own. `between`: the tail policy of every part but the
    last (default: `tail`; the tail tree's root keeps no tail, but its parts hand rows on).

    Raises:
        ConfigError: one document keeps more tokens than a chunk holds (2^31 - 1).
    """
    tokens = np.concatenate([_piece_tokens(carry), _kept_tokens(table, config)])
    ends = np.cumsum(tokens)
    total = int(ends[-1]) if len(ends) else 0
    if total > chunk.MAX_CHUNK_TOKENS and not _may_fit(table, config, tail, total):
        whole = None  # it cannot: no packing to throw away
    else:
        try:  # fits (`total`), or may fit once its tail is set aside
            whole = pack_table(table, config, chunk_index=chunk_index, carry=carry, tail=tail)
        except ChunkTooLarge:
            whole = None
    if whole is not None:
        yield whole
        return
    between = tail if between is _SAME else between
    n_carry = carry.num_rows if carry is not None else 0
    start, k, held = 0, 1, None  # held: the pieces the part before set aside
    while True:
        room = chunk.MAX_CHUNK_TOKENS - int(_piece_tokens(held).sum())
        before = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, before + room, side="right"))
        flush = stop == start and start < len(tokens)  # nothing fits beside `held`
        if flush and held is None:
            _too_long(table, start - n_carry, int(tokens[start]), room)
        last = stop >= len(tokens)
        pieces = _pieces(held, carry, start, min(stop, n_carry))
        docs = table.slice(max(start - n_carry, 0), max(stop - max(start, n_carry), 0))
        policy = None if flush else tail if last else between  # flush: `held` into rows
        packed = pack_table(docs, config, chunk_index=(*chunk_index, k), carry=pieces, tail=policy)
        yield packed
        if last:
            return
        held, start, k = packed.tail, stop, k + 1


def _may_fit(table: pa.Table, config: PackConfig, tail: TailPolicy | None, total: int) -> bool:
    """Whether a chunk whose pieces keep `total` tokens may still fit in one table: its rows
    hold `total` less what its `tail` sets aside (at most `max_rows` rows, each with a free
    slot), or less with a loss mask (pieces without a supervised token are left out)."""
    if columns.LOSS_MASK in columns.names(pack_columns.carried(table)):
        return True
    aside = tail.max_rows * config.max_len if tail is not None else 0
    return total - aside <= chunk.MAX_CHUNK_TOKENS


def _piece_tokens(pieces: pa.Table | None) -> NDArray[np.int64]:
    """Each carried piece's tokens: all of it (pieces are cut already)."""
    if pieces is None:
        return np.zeros(0, np.int64)
    return np.diff(FlatIds(pieces.column("input_ids")).doc_start)


def _kept_tokens(table: pa.Table, config: PackConfig) -> NDArray[np.int64]:
    """Each document's tokens that its long-document policy keeps (`chunk.make_segments`):
    all under `split`, at most max_len under `truncate`, none of a long one under `drop`."""
    lengths = np.diff(FlatIds(table.column("input_ids")).doc_start)
    names = columns.names(pack_columns.carried(table))
    policy = pack_columns.policy_for(names, config.long_docs)
    if policy == "truncate":
        return np.minimum(lengths, config.max_len)
    if policy == "drop":
        return np.where(lengths > config.max_len, 0, lengths)
    return lengths


def _pieces(
    held: pa.Table | None, carry: pa.Table | None, start: int, stop: int
) -> pa.Table | None:
    """The pieces a part packs first: those the part before set aside, then `carry[start:stop]`."""
    parts = [] if held is None or not held.num_rows else [held]
    if carry is not None and stop > start:
        more = carry.slice(start, stop - start)
        if parts and more.schema != parts[0].schema:
            more = more.cast(parts[0].schema)
        parts.append(more)
    return pa.concat_tables(parts) if parts else None


def _too_long(table: pa.Table, doc: int, tokens: int, room: int) -> None:
    name = f"document {table.column('doc_id')[doc].as_py()}" if doc >= 0 else "a carried piece"
    raise ConfigError(
        f"{name} keeps {tokens:,} tokens, more than one chunk's packed rows can hold "
        f"({room:,} of {chunk.MAX_CHUNK_TOKENS:,}: one Arrow table); "
        f"{option_choice('--long-docs', 'long_docs', 'truncate')} or 'drop' would cut it"
    )


__all__ = ["pack_cut", "read_limit"]
