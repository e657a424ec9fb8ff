"""Online packing: a stream of tokenized documents -> packed rows and varlen batches, on the fly.

`OnlinePacker` keeps a bounded buffer of document *segments* (documents cut by the offline
long-document policy, `packtool.pack.chunk.make_segments`). When the buffer holds `buffer_docs`
segments (or `buffer_tokens` tokens, or its oldest new document has waited `buffer_seconds`),
the whole buffer is packed at once by a numba kernel, in arrays:

- `strategy="ffd"` (default): first-fit-decreasing (`packtool.pack.kernels.ffd_assign`) on the
  buffer's lengths.
- `strategy="bucketed"`: the two-level scheme of the seed serving system (loader/online/bucketed.py):
  full rows inside each length bucket, then FFD across buckets. Plain FFD packs tighter
  (benchmarks/bench_online.py, docs/online.md) and stays the default.

Rows filled below `min_fill × max_len` are not emitted: their segments stay in the buffer and are
packed again with the next refill (a row "kept open"), so the online efficiency approaches the
offline one. Two bounds keep the buffer moving: segments held back at most fill half the buffer
(the fullest of the under-filled rows go out first when more would be kept), and a segment held
back `max_holds` times goes out with its row whatever the fill. The final `flush()` emits every
row.

Everything is deterministic for a given input order and seed (the time window aside): where packs
happen depends only on the counts, and emitted rows are shuffled by
`default_rng([seed, *seed_key, pack])`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.collate import check_collate_kwargs
from loader.config import OnlineConfig, check_bool, check_int, make_config
from loader.online.bucketed import bucketed_assign
from loader.online.inputs import (
    DOCUMENTS,
    TableRowError,
    column_dict,
    doc_array,
    doc_id_array,
    flat_tokens,
    iterable,
    joined_masks,
    length_array,
    private,
    table_columns,
    token_columns,
)
from loader.online.rows import EMPTY_I64, PackedRows, RowBatcher
from loader.online.segments import Segments
from loader.online.state import check_packer_state, config_state, saved
from loader.record import tensor_ids
from packtool.dataset.columns import LOSS_MASK
from packtool.errors import ConfigError, DataError, PacktoolError
from packtool.pack import kernels
from packtool.pack.chunk import PackCounts, drop_unsupervised, make_segments


class PackerClosedError(PacktoolError):
    """Documents were pushed into a packer after its final flush."""


class OnlinePacker:
    """Packs a stream of tokenized documents into rows of at most `max_len` tokens, on the fly.

    Feed it with `push(tokens, lengths)` (flat token ids of many documents and their lengths),
    `push_lengths(lengths)` (plan only, no tokens), `push_table(table)` (tokenized Parquet
    tables, e.g. from `packtool.tokenize.tokenize.tokenized_batches`) or `push_docs(arrays)`; take packed
    rows with `pop()`; call `flush()` at the end. `pack_stream(source)` and `batches(source, ...)`
    do all of it over an iterator.

    Args:
        config: The packing settings; or give them as keyword arguments (`max_len=4096`, ...).
        seed_key: Extra integers mixed into the row-order seed (e.g. rank, worker, epoch).

    `stats` counts everything: documents in / empty / split / truncated / dropped, tokens in /
    out / truncated / dropped, segments, rows, packs, rows held back, flushes. Every input token
    comes out exactly once or is counted as truncated or dropped.
    """

    def __init__(
        self, config: OnlineConfig | None = None, *, seed_key: tuple[int, ...] = (), **settings: Any
    ) -> None:
        self.config = config = make_config(OnlineConfig, settings, config)
        if not isinstance(seed_key, (tuple, list)):  # an int was a bare TypeError
            raise ConfigError(f"seed_key must be a tuple of integers >= 0, got {seed_key!r}")
        for k in seed_key:  # int('a') was Python's ValueError; -1 numpy's, at the first pack
            check_int("seed_key entries", k, 0)
        self.seed_key = tuple(int(k) for k in seed_key)
        self._parts: list[Segments] = []
        self._n_segs = 0
        self._n_tokens = 0
        self._oldest: float | None = None
        self._out: list[PackedRows] = []
        self._has_tokens: bool | None = None
        self._columns: tuple[str, ...] | None = None  # optional columns, set by the first push
        self._dtype: np.dtype | None = None
        self._counts = PackCounts()
        self._packs = 0
        self._held_rows = 0
        self._forced_rows = 0
        self._flushes = 0
        self._next_doc_id = 0
        self._closed = False
        self._pending: list[NDArray] = []  # read by a running pack_stream(), not yet pushed
        self._batcher: RowBatcher | None = None  # a running batches()'s rows not yet batched

    # ---- input ------------------------------------------------------------------------------

    def push(
        self,
        tokens: NDArray[np.integer] | None,
        lengths: NDArray[np.integer],
        doc_ids: NDArray[np.integer] | None = None,
        *,
        loss_mask: NDArray | None = None,
        columns: dict[str, NDArray] | None = None,
    ) -> None:
        """Add documents: `tokens` holds their ids back to back, `lengths` one entry per document.

        `doc_ids` default to a running count. Empty documents are counted and skipped; long ones
        follow `long_docs`. Packs run as soon as the buffer is full.

        `loss_mask` (0/1, one per token, 1 = supervised; an array or any tensor) travels with
        the tokens into the rows and becomes the batches' labels (`loader.collate`). With a
        mask no document is split (`long_docs="split"` is refused: use `truncate` or `drop`),
        and a document without a supervised token past its first (the first is never a target:
        labels shift) is left out and counted (`documents_unsupervised`, in
        `documents_dropped`). A packer takes documents all with a mask or all without.
        `columns` carries any declared optional per-token column the same way, by name
        (`loss_mask=m` is `columns={"loss_mask": m}`).

        Raises:
            PackerClosedError: after `flush(final=True)`.
            DataError: `lengths` do not match `tokens`, or are negative; a mask that is not
                one 0/1 value per token.
            ConfigError: documents with and without a mask in one packer, `long_docs="split"`
                with a mask, or lengths split into over `limits.MAX_SPLIT_CHUNKS` pieces.
        """
        self._push(tokens, lengths, doc_ids, column_dict(columns, loss_mask), owned=False)

    def _push(
        self, tokens: Any, lengths: Any, doc_ids: Any, columns: dict[str, Any], *, owned: bool
    ) -> None:
        """`push()`; `owned`: the packer may keep the arrays (else any the caller could reuse,
        sharing its memory, is copied: the buffer keeps them until the next pack)."""
        given = tokens = tensor_ids(tokens, "token ids")  # a CUDA or grad-tracking tensor too
        columns = {name: tensor_ids(v, name, floats=True) for name, v in columns.items()}  # mask
        if self._closed:
            raise PackerClosedError(
                "this OnlinePacker was closed by its final flush(); create a new one for more data"
            )
        lengths = length_array(lengths)
        if doc_ids is not None:
            doc_ids = doc_id_array(doc_ids, len(lengths))
        has = tokens is not None
        if self._has_tokens is None:
            self._has_tokens = has
        elif self._has_tokens != has:
            raise ConfigError("do not mix push() with tokens and push_lengths() in one packer")
        if has:
            tokens = flat_tokens(tokens, int(lengths.sum()))
            if self._dtype is None:
                self._dtype = tokens.dtype
            elif tokens.dtype != self._dtype:
                merged = np.result_type(self._dtype, tokens.dtype)
                # uint64 beside a signed type is float64, which rounds ids past 2^53; both fit
                # int64 (checked above), the batch's type.
                self._dtype = merged if merged.kind in "iu" else np.dtype(np.int64)
        extra, self._columns = token_columns(tokens, columns, self._columns, self.config.long_docs)
        mask = extra.get(LOSS_MASK)
        if doc_ids is None:
            doc_ids = np.arange(self._next_doc_id, self._next_doc_id + len(lengths), dtype=np.int64)
        self._next_doc_id += len(lengths)
        if len(lengths) == 0:
            return
        segs, counts = make_segments(lengths, self.config.max_len, self.config.long_docs)
        doc_start = np.cumsum(lengths) - lengths
        if mask is not None:
            segs = drop_unsupervised(segs, counts, mask, doc_start, lengths)
        self._counts += counts
        # counted when the rows come out
        self._counts.tokens_out -= counts.tokens_out
        self._counts.tokens_supervised -= counts.tokens_supervised
        if has:
            start = doc_start[segs.doc] + segs.start
            if int(segs.length.sum()) < len(tokens):
                # Truncated or dropped tokens: only the kept ones are buffered (and checkpointed),
                # not the whole push (100 documents of 100k tokens truncated to 32: 10M ids).
                tokens, extra, start = Segments.compact(tokens, extra, start, segs.length)
            elif not owned:  # the buffer keeps them until the next pack
                tokens = private(tokens, given)
                extra = {name: private(v, columns[name]) for name, v in extra.items()}
        else:
            start = EMPTY_I64[:0] if not len(segs.length) else np.zeros(len(segs.length), np.int64)
        part = Segments(
            tokens,
            start,
            segs.length,
            doc_ids[segs.doc],
            segs.chunk,
            np.zeros(len(segs.length), np.int32),
            extra,
        )
        self._add(part)

    def push_lengths(
        self, lengths: NDArray[np.integer], doc_ids: NDArray[np.integer] | None = None
    ) -> None:
        """Add documents by length only: rows come out as segment layouts without tokens."""
        self._push(None, lengths, doc_ids, {}, owned=True)

    def push_table(self, table: pa.Table | pa.RecordBatch) -> None:
        """Add a tokenized table (`input_ids` list column, `doc_id` used when present, a
        `length` column checked against it)."""
        if not isinstance(table, (pa.Table, pa.RecordBatch)):
            got = type(table).__name__  # not a bare AttributeError on .schema
            raise DataError(f"push_table takes a pyarrow Table or RecordBatch, got {got}")
        if "input_ids" not in table.schema.names:
            raise DataError(
                f"a tokenized table needs an `input_ids` column (columns: {table.schema.names}); "
                "run `packtool tokenize` or use packtool.tokenize.tokenize.tokenized_batches"
            )
        ids = table.column("input_ids")
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not (pa.types.is_list(ids.type) or pa.types.is_large_list(ids.type)):
            raise DataError(f"input_ids must be a list column, found {ids.type}")
        if ids.null_count:  # a null read as an empty document: one left out without a word
            row = int(np.flatnonzero(ids.is_null().to_numpy(zero_copy_only=False))[0])
            raise TableRowError(row, "is null")
        offsets = ids.offsets.to_numpy().astype(np.int64)
        held = ids.values.slice(offsets[0], offsets[-1] - offsets[0])
        if held.null_count:  # read as NaN: "token ids must be integers, got dtype float64"
            at = int(np.flatnonzero(held.is_null().to_numpy(zero_copy_only=False))[0])
            row = int(np.searchsorted(offsets - offsets[0], at, side="right")) - 1
            raise TableRowError(row, "holds a null token id")
        values = ids.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
        if pa.types.is_null(ids.type.value_type):  # list<null>: only empty documents
            values = np.zeros(0, np.int64)
        doc_ids = None
        if "doc_id" in table.schema.names:
            doc_ids = table.column("doc_id").to_numpy()
        extra = table_columns(table, offsets)  # a `length` column checked against the lists
        self._push(values, np.diff(offsets), doc_ids, extra, owned=True)  # arrow's: immutable

    def push_docs(self, docs: Iterable[Any], masks: Iterable[Any] | None = None) -> None:
        """Add documents given one token array (or list of ints) each, and optionally a loss
        mask (0/1 per token) for each. Each is copied as it is read: a source may refill one
        buffer for every document."""
        docs = iterable(docs, f"push_docs takes {DOCUMENTS}")
        arrays = [doc_array(d, i, own=True) for i, d in enumerate(docs)]
        self._push_arrays(arrays, None if masks is None else joined_masks(masks, arrays))

    def _push_arrays(self, arrays: list[NDArray], mask: NDArray | None = None) -> None:
        """Add documents that `doc_array` made 1-D integer arrays (`mask`: their loss masks,
        joined: `joined_masks`)."""
        if not arrays:
            return
        lengths = np.fromiter((len(a) for a in arrays), np.int64, len(arrays))
        non_empty = [a for a in arrays if len(a)]
        tokens = np.concatenate(non_empty) if non_empty else np.zeros(0, np.int64)
        self._push(tokens, lengths, None, {} if mask is None else {LOSS_MASK: mask}, owned=True)

    def _add(self, part: Segments) -> None:
        c = self.config
        n = len(part.length)
        a = 0
        while a < n:
            if self._oldest is None and c.buffer_seconds is not None:
                self._oldest = time.monotonic()
            # take segments up to the doc bound, and up to the token bound
            b = min(n, a + c.buffer_docs - self._n_segs)
            if c.buffer_tokens is not None:
                room = c.buffer_tokens - self._n_tokens
                cum = np.cumsum(part.length[a:b])
                b = min(b, a + int(np.searchsorted(cum, room, side="left")) + 1)
            piece = part.take(a, b) if (a, b) != (0, n) else part
            self._parts.append(piece)
            self._n_segs += b - a
            self._n_tokens += int(piece.length.sum())
            a = b
            if self._full():
                self._pack(final=False)
        if self._full():
            self._pack(final=False)

    def _full(self) -> bool:
        c = self.config
        if self._n_segs >= c.buffer_docs:
            return True
        if c.buffer_tokens is not None and self._n_tokens >= c.buffer_tokens:
            return True
        return (
            c.buffer_seconds is not None
            and self._oldest is not None
            and time.monotonic() - self._oldest >= c.buffer_seconds
        )

    def poll(self) -> None:
        """Pack now if the time window has run out (for time-windowed streams between pushes)."""
        if self._n_segs and self._full():
            self._pack(final=False)

    # ---- packing ----------------------------------------------------------------------------

    def _assign(self, lengths: NDArray[np.int64]) -> tuple[NDArray, NDArray, int]:
        c = self.config
        if c.strategy == "bucketed":
            return bucketed_assign(lengths, c.max_len, c.bucket)
        return kernels.ffd_assign(lengths, c.max_len)

    def _pack(self, *, final: bool) -> None:
        self._oldest = None
        if not self._parts:
            return
        buf = Segments.concat(self._parts)
        self._parts = []
        self._n_segs = self._n_tokens = 0
        c = self.config
        row, offset, n_rows = self._assign(buf.length)
        fill = np.bincount(row, weights=buf.length, minlength=n_rows).astype(np.int64)
        keep = np.zeros(n_rows, bool)
        if not final and n_rows:
            under = fill < c.min_fill * c.max_len
            oldest = np.zeros(n_rows, np.int32)
            np.maximum.at(oldest, row, buf.holds)
            forced = under & (oldest >= c.max_holds)
            self._forced_rows += int(forced.sum())
            cand = np.flatnonzero(under & ~forced)
            if len(cand):
                # least-filled first; the buffer keeps at most half its bounds held back
                cand = cand[np.argsort(fill[cand], kind="stable")]
                segs = np.bincount(row, minlength=n_rows)[cand]
                ok = np.cumsum(segs) <= c.buffer_docs // 2
                if c.buffer_tokens is not None:
                    ok &= np.cumsum(fill[cand]) <= c.buffer_tokens // 2
                keep[cand[: int(np.argmin(ok)) if not ok.all() else len(cand)]] = True
        held = keep[row]
        emit_rows = np.flatnonzero(~keep)
        n_emit = len(emit_rows)
        self._held_rows += n_rows - n_emit
        self._packs += 1
        if final:
            self._flushes += 1
        if n_emit:
            rank = np.full(n_rows, -1, np.int64)
            if c.shuffle_rows:
                rng = np.random.default_rng([c.seed, *self.seed_key, self._packs])
                rank[emit_rows] = rng.permutation(n_emit)
            else:
                rank[emit_rows] = np.arange(n_emit)
            sel = np.flatnonzero(~held)
            # (row rank, offset) pairs are unique: one argsort of a combined key (faster than
            # lexsort, and stability is moot)
            order = sel[np.argsort(rank[row[sel]] * (c.max_len + 1) + offset[sel])]
            seg_len = buf.length[order]
            per_row = np.bincount(rank[row[order]], minlength=n_emit)
            row_docs = np.zeros(n_emit + 1, np.int64)
            np.cumsum(per_row, out=row_docs[1:])
            toks = (
                None
                if buf.tokens is None
                else kernels.gather_segments(buf.tokens, buf.start[order], seg_len)
            )
            if toks is not None and self._dtype is not None:
                toks = toks.astype(self._dtype, copy=False)
            cols = buf.gather_columns(buf.start[order], seg_len)
            self._out.append(
                PackedRows(row_docs, seg_len, buf.doc[order], buf.chunk[order], toks, cols)
            )
            self._counts.rows += n_emit
            self._counts.tokens_out += int(seg_len.sum())
            if LOSS_MASK in cols:
                self._counts.tokens_supervised += int(cols[LOSS_MASK].sum(dtype=np.int64))
        if held.any():
            hsel = np.flatnonzero(held)
            hsel = hsel[np.argsort(row[hsel] * (c.max_len + 1) + offset[hsel])]
            hlen = buf.length[hsel]
            cols = buf.gather_columns(buf.start[hsel], hlen)
            if buf.tokens is None:
                toks, start = None, np.zeros(len(hsel), np.int64)
            else:
                toks = kernels.gather_segments(buf.tokens, buf.start[hsel], hlen)
                start = np.cumsum(hlen) - hlen
            kept = Segments(
                toks, start, hlen, buf.doc[hsel], buf.chunk[hsel], buf.holds[hsel] + 1, cols
            )
            self._parts = [kept]
            self._n_segs = len(hsel)
            self._n_tokens = int(hlen.sum())
            if c.buffer_seconds is not None:  # held: packed again one window after this pack
                self._oldest = time.monotonic()

    def flush(self, *, final: bool = True) -> None:
        """Pack what is buffered now. `final=True` emits every row and closes the packer."""
        check_bool("final", final)  # final="no" closed the packer
        if self._n_segs:
            self._pack(final=final)
        elif final and not self._closed:
            self._flushes += 1
        if final:
            self._closed = True

    def pop(self) -> PackedRows:
        """The rows packed since the last `pop()`; none: empty arrays of the rows' dtypes."""
        if not self._out:  # tokens None only for a packer fed lengths only (int64 before a push)
            dtype = None if self._has_tokens is False else self._dtype or np.dtype(np.int64)
            return PackedRows.empty(dtype, self._columns or ())
        out = PackedRows.concat(self._out)
        self._out = []
        return out

    @property
    def buffered(self) -> tuple[int, int]:
        """`(segments, tokens)` waiting in the buffer."""
        return self._n_segs, self._n_tokens

    @property
    def stats(self) -> dict[str, Any]:
        s: dict[str, Any] = self._counts.to_dict()
        s.update(
            packs=self._packs,
            flushes=self._flushes,
            rows_held_back=self._held_rows,
            rows_forced=self._forced_rows,
            segments_buffered=self._n_segs,
            tokens_buffered=self._n_tokens,
            stream_closed=self._closed,
        )
        s["efficiency"] = s["tokens_out"] / (s["rows"] * self.config.max_len) if s["rows"] else 0.0
        return s

    # ---- resume -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: buffered segments (tokens included), rows not
        yet popped, counters; during `pack_stream` / `batches`, also the documents read from the
        source but not yet pushed and the rows packed but not yet batched (resume: load it, then
        run over the source from the first document not yet read). Arrays as torch tensors, so
        `torch.load`'s default `weights_only=True` loads a checkpoint holding it."""
        buf = Segments.concat(self._parts) if self._parts else None
        rest = [] if self._batcher is None else [self._batcher.rest()]
        out = [r for r in rest + self._out if r.n_rows]  # the batcher's rows come first
        pending = None
        if self._pending:
            lengths = np.fromiter(map(len, self._pending), np.int64, len(self._pending))
            pending = {"tokens": np.concatenate(self._pending), "lengths": lengths}
        return saved(
            {
                "config": config_state(self.config),
                "seed_key": list(self.seed_key),
                "buffer": None if buf is None else buf.to_state(),
                "out": PackedRows.concat(out).to_state() if out else None,
                "pending": pending,
                "has_tokens": self._has_tokens,
                "columns": None if self._columns is None else list(self._columns),
                "dtype": None if self._dtype is None else self._dtype.str,
                "counts": self._counts.to_dict(),
                "packs": self._packs,
                "held_rows": self._held_rows,
                "forced_rows": self._forced_rows,
                "flushes": self._flushes,
                "next_doc_id": self._next_doc_id,
                "closed": self._closed,
            }
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state_dict()` (saved with the same settings).

        Raises:
            DataError: Not a packer state, one saved with other settings, or a damaged one (a
                part missing or malformed; loader/online/state.py checks every part).
        """
        state = check_packer_state(state, self.config)  # its tensors as numpy arrays
        self.load_checked_state(state)

    def load_checked_state(self, state: dict[str, Any]) -> None:
        """Continue from a state that `check_packer_state` already passed, without checking it
        again: `load_state_dict` after its check, and `StreamingPackedDataset`, which checks the
        packer part of its own state with the rest of it before it uses any part."""
        self.seed_key = tuple(state["seed_key"])
        buf = state["buffer"]
        self._parts = [] if buf is None else [Segments.from_state(buf)]
        self._n_segs = 0 if buf is None else len(buf["length"])
        self._n_tokens = 0 if buf is None else int(buf["length"].sum())
        timed = buf is not None and self.config.buffer_seconds is not None  # held: window from now
        self._oldest = time.monotonic() if timed else None
        self._out = [] if state["out"] is None else [PackedRows.from_state(state["out"])]
        self._has_tokens = state["has_tokens"]
        columns = state.get("columns")  # absent in states saved before optional columns
        self._columns = None if columns is None else tuple(columns)
        self._dtype = None if state["dtype"] is None else np.dtype(state["dtype"])
        self._counts = PackCounts(**state["counts"])
        self._packs = state["packs"]
        self._held_rows = state["held_rows"]
        self._forced_rows = state["forced_rows"]
        self._flushes = state["flushes"]
        self._next_doc_id = state["next_doc_id"]
        self._closed = state["closed"]
        self._pending, self._batcher = [], None
        pending = state.get("pending")  # absent in states saved before it
        if pending is not None:  # pushed now: packs are cut by counts, so the rows are the same
            self._push(pending["tokens"], pending["lengths"], None, {}, owned=True)

    # ---- iterators --------------------------------------------------------------------------

    def pack_stream(
        self, source: Iterable[Any], *, docs_per_push: int = 4096
    ) -> Iterator[PackedRows]:
        """Pack a whole stream, yielding rows as packs complete and the rest at its end.

        `source` yields `pyarrow` tables of the tokenized schema (`tokenized_batches`), or token
        arrays / lists of ints, one per document (collected `docs_per_push` at a time; the
        documents collected are in `state_dict()`).
        """
        check_int("docs_per_push", docs_per_push, 1)
        source = iterable(source, f"pack_stream takes {DOCUMENTS} or tokenized tables")
        return self._stream(source, int(docs_per_push))

    def _push_pending(self) -> None:
        pending, self._pending = self._pending, []
        self._push_arrays(pending)

    def _stream(self, source: Iterable[Any], docs_per_push: int) -> Iterator[PackedRows]:
        self._pending = []
        try:
            for item in source:
                if isinstance(item, (pa.Table, pa.RecordBatch)):
                    self._push_pending()
                    self.push_table(item)
                else:
                    # Checked one by one, so a bad document fails alone, not with its neighbours;
                    # copied, since the source may refill its array before the next push.
                    i = self._next_doc_id + len(self._pending)
                    self._pending.append(doc_array(item, i, own=True))
                    if len(self._pending) < docs_per_push:
                        continue
                    self._push_pending()
                out = self.pop()
                if out.n_rows:
                    yield out
        except BaseException:
            # The source failed, a document was bad, or the consumer stopped: the documents
            # already handed over stay in the packer, so flush() + pop() still return them.
            self._push_pending()
            raise
        self._push_pending()
        self.flush(final=True)
        out = self.pop()
        if out.n_rows:
            yield out

    def batches(
        self,
        source: Iterable[Any],
        *,
        rows_per_batch: int | None = None,
        tokens_per_batch: int | None = None,
        drop_last: bool = False,
        **collate_kwargs: Any,
    ) -> Iterator[dict]:
        """Loader batches (`loader.collate` dicts) from a stream; see `RowBatcher`. The rows not
        yet batched are in `state_dict()`. `collate_kwargs` are checked now (a `pad_tokens`
        below the most tokens a batch can hold is a `ConfigError`)."""
        batcher = RowBatcher(
            max_len=self.config.max_len,
            rows_per_batch=rows_per_batch,
            tokens_per_batch=tokens_per_batch,
        )
        check_bool("drop_last", drop_last)
        check_collate_kwargs(collate_kwargs, batcher.batch_tokens)  # now, not at a batch
        source = iterable(source, f"batches takes {DOCUMENTS} or tokenized tables")
        return self._batches(source, batcher, drop_last, collate_kwargs)

    def _batches(
        self, source: Iterable[Any], batcher: RowBatcher, drop_last: bool, kwargs: dict[str, Any]
    ) -> Iterator[dict]:
        self._batcher = batcher
        try:
            for rows in self._stream(source, 4096):
                batcher.add(rows)
                for b in batcher.ready():
                    yield b.collate(**kwargs)
            for b in batcher.ready(final=True) if not drop_last else ():
                yield b.collate(**kwargs)
        except BaseException:
            # Rows packed but not yet batched go back to the packer (pop() returns them first).
            rest = batcher.rest()  # not the rows a stopped `ready()` already handed out
            if rest.n_rows:
                self._out.insert(0, rest)
            raise
        finally:
            self._batcher = None
