"""A chunk's packed rows, their token ids gathered when they are asked for.

Packing decides every row before any token id is copied: each piece's first token in the
chunk's ids and its length, in output order, and the rows' offsets. Copying the ids is then the
one pass over every token of the chunk (`FlatIds.gather`); the other columns are small (one
value per piece or per row) and are built at once.

`PackedRows.table()` gathers every row (what `pack_table`'s callers get as `PackedChunk.table`).
`PackedRows.blocks(rows)` gathers `rows` rows at a time, the next block in a second thread
while the caller writes this one: the shard writer (one core, ~0.4 s for the 38 M tokens of the
README's end-to-end corpus) then starts at once, instead of after a gather of the whole chunk
(0.05 s, up to 0.2 s when the 75 MB it writes are pages the process never touched), and the
chunk's ids are never all copied at once (each block's buffer is freed once it is written).
The blocks are the rows of `table()`, in order: written through `ShardWriter`, which cuts row
groups of its own size from whatever tables it is given, the shards are the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.arrow_numpy import from_numpy
from packtool.pack.flat_ids import FlatIds

IDS = "input_ids"


class PackedRows:
    """Packed rows: the per-piece gather plan of their ids plus their other columns.

    Args:
        values: the chunk's ids.
        src: each piece's first token in `values` (global coordinates), in output order.
        seg_len: each piece's length, in output order.
        row_offsets: int32, (rows + 1,): the rows' token offsets.
        seg_offsets: int32 or int64, (rows + 1,): the rows' piece offsets.
        rest: every other column of the rows (one entry per row).
        names: the table's column order, `input_ids` among them.
    """

    def __init__(
        self,
        values: FlatIds,
        src: NDArray[np.int64],
        seg_len: NDArray[np.int64],
        row_offsets: NDArray[np.int32],
        seg_offsets: NDArray,
        rest: pa.Table,
        names: list[str],
    ) -> None:
        if len(row_offsets) != rest.num_rows + 1 or len(seg_offsets) != rest.num_rows + 1:
            raise ValueError("row_offsets and seg_offsets need one entry per row, plus one")
        if IDS not in names or sorted(names) != sorted([IDS, *rest.column_names]):
            raise ValueError(f"names {names} must be {IDS} and the other columns")
        self._values = values
        self._src = src
        self._seg_len = seg_len
        self._row_offsets = row_offsets
        self._seg_offsets = np.asarray(seg_offsets, dtype=np.int64)
        self._rest = rest
        self._names = names

    @property
    def num_rows(self) -> int:
        return self._rest.num_rows

    def table(self) -> pa.Table:
        """Every row, ids gathered (one copy of every token)."""
        return self.block(0, self.num_rows)

    def block(self, start: int, stop: int) -> pa.Table:
        """Rows `start` to `stop` (clipped to the rows), ids gathered."""
        start, stop = max(0, min(start, self.num_rows)), max(0, min(stop, self.num_rows))
        stop = max(start, stop)
        s0, s1 = int(self._seg_offsets[start]), int(self._seg_offsets[stop])
        tokens = from_numpy(self._values.gather(self._src[s0:s1], self._seg_len[s0:s1]))
        offsets = self._row_offsets[start : stop + 1]
        ids = pa.ListArray.from_arrays(from_numpy(offsets - offsets[0]), tokens)
        rest = self._rest.slice(start, stop - start)
        cols = {IDS: ids, **{n: rest.column(n) for n in rest.column_names}}
        return pa.table({n: cols[n] for n in self._names})

    def blocks(self, rows: int, start: int = 0, stop: int | None = None) -> Iterator[pa.Table]:
        """Rows `start` to `stop` (default: all) in blocks of `rows` (the last fewer; none
        without rows), each gathered in a second thread while the caller holds the one before."""
        if rows < 1:
            raise ValueError(f"rows must be >= 1, got {rows}")
        stop = self.num_rows if stop is None else min(stop, self.num_rows)
        bounds = [(a, min(a + rows, stop)) for a in range(max(start, 0), stop, rows)]
        if not bounds:
            return
        with ThreadPoolExecutor(1, thread_name_prefix="packtool-gather") as pool:
            ahead: Future = pool.submit(self.block, *bounds[0])
            try:
                for bound in bounds[1:]:
                    block = ahead.result()
                    ahead = pool.submit(self.block, *bound)
                    yield block
                yield ahead.result()
            finally:
                ahead.cancel()  # the caller stopped early (an error while writing)
