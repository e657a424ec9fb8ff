"""Writing tokenized Parquet: one file or numbered part files, encoded in a background thread.

What `packtool.tokenize.tokenize.tokenize_corpus` writes through; Parquet encoding and compression release
the GIL, so the writer thread overlaps the reading and encoding stages.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from packtool.dataset.names import PART_PATTERN
from packtool.errors import naming
from packtool.storage import local as storage
from packtool.storage import writing

PIPELINE_DEPTH = 1
"""Batches each pipeline stage may run ahead of the next (memory: about 3 stages x depth batches)."""


class PartWriter:
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
        self._local: Path | None = None
        """A part bound for a bucket: written here (local scratch), uploaded whole when closed."""
        self._tokens = 0

    def _open(self) -> None:
        path = self.target if self.single else self.target / PART_PATTERN.format(len(self.files))
        self.files.append(path)
        self._local = writing.temporary_name(path) if storage.is_remote(path) else None
        with naming(path):
            self._writer = writing.parquet_writer(
                self._local or path,
                self.schema,
                compression="zstd",
                # Dictionaries for the strings (source, extra fields), not for ids or masks.
                use_dictionary=[
                    n for n in self.schema.names if self.schema.field(n).type == pa.string()
                ],
                write_page_checksum=True,  # checked when pack and stats read it back
            )
        self._tokens = 0

    def write(self, table: pa.Table) -> None:
        if self._writer is None:
            self._open()
        elif not self.single and self._tokens >= self.part_tokens:
            self._close_part()
            self._open()
        assert self._writer is not None
        with naming(self.files[-1]):  # a full disk names the file
            self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._tokens += int(pc.sum(table.column("length")).as_py() or 0)

    def close(self) -> list[Path]:
        if self._writer is not None:
            self._close_part()
        return self.files

    def _close_part(self) -> None:
        assert self._writer is not None
        with naming(self.files[-1]):
            self._writer.close()
            if self._local is not None:
                writing.replace(self._local, self.files[-1])  # one upload: whole, or absent
                self._local = None

    def abort(self) -> None:
        if self._writer is not None:
            # The real error is being raised already; a failing close must not mask it.
            with contextlib.suppress(Exception):
                self._writer.close()
        if self._local is not None:
            writing.remove_file(self._local)
            self._local = None


class BackgroundWriter:
    """Writes tables in a thread (Parquet encoding and compression release the GIL)."""

    def __init__(self, writer: PartWriter, depth: int | None = None) -> None:
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
