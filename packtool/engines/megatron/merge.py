"""The merge of `tokenize --to megatron`'s parts into one pair, while the parts are made
(packtool/engines/megatron/run.py runs it; packtool/engines/megatron/part.py writes the parts).

The driver keeps a frontier: when the record of partition `k` arrives and every partition before
it is merged, part `k`'s bytes are appended to `merged.bin` and its lengths to `merged.lengths`
(in the kernel, `copy_file_range`), both fsynced, then the part files removed; parts that finish
out of order wait on disk (the driver holds two integers each). The first part is renamed, not
copied, so a corpus of one partition is never copied at all. The appends are the driver's I/O,
the one place a Ray or Slurm run moves token bytes through it: on a shared file system that does
not copy on its servers (Lustre, most FUSE mounts) each appended byte is read into the driver's
node and written back (docs/scale-out.md).

**Resume.** Nothing about the merge is saved besides the files themselves. A resumed run first
completes the first part's move if a kill fell between its two renames (one of the pair moved,
the other still the part's file: no rename moves two files), then reads the records of the
finished partitions, finds the longest prefix of them that the merged files hold whole (their
sizes), cuts both files back to it, and goes on from there; a part whose bytes were appended
but whose files a kill left behind is removed then. So a kill at any step of the merge loses
nothing a finished partition wrote.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from packtool.engines.megatron.part import part_paths
from packtool.errors import OVERWRITE, DataError, naming
from packtool.storage import local as storage
from packtool.storage import writing

MERGED_BIN = "merged.bin"
MERGED_LENGTHS = "merged.lengths"


class Merge:
    """The merge frontier (see the module docstring): parts appended in plan order as they
    finish; `restore` re-finds it in a resumed run from the merged files' sizes."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.bin_path, self.lengths_path = work / MERGED_BIN, work / MERGED_LENGTHS
        self.next = 0
        """The first partition not merged yet."""
        self.bin_bytes = 0
        self.documents = 0
        self.waiting: dict[int, tuple[int, int]] = {}
        """Finished partitions beyond the frontier: (bin bytes, documents)."""
        self._bin: Any = None
        self._lengths: Any = None

    def restore(self, sizes: dict[int, tuple[int, int]]) -> None:
        """A resumed run: `sizes` are the finished partitions' (bin bytes, documents)."""
        if 0 in sizes:
            self._finish_first_move()
        have_bin = storage.size(self.bin_path) if storage.is_file(self.bin_path) else 0
        have_len = storage.size(self.lengths_path) if storage.is_file(self.lengths_path) else 0
        while self.next in sizes:
            nbytes, docs = sizes[self.next]
            if self.bin_bytes + nbytes > have_bin or 4 * (self.documents + docs) > have_len:
                break
            self.bin_bytes += nbytes
            self.documents += docs
            for path in part_paths(self.work, self.next):  # appended; a kill left its files
                writing.remove_file(path)
            self.next += 1
        self.waiting = {p: s for p, s in sizes.items() if p >= self.next}
        for p in self.waiting:
            for path in part_paths(self.work, p):
                if not storage.is_file(path):
                    raise DataError(
                        f"{path}: a finished partition's part is missing; start over with "
                        f"{OVERWRITE}"
                    )
        if self.next or storage.is_file(self.bin_path):
            self._open()
        self._advance()

    def _finish_first_move(self) -> None:
        """The first part moves to the merged pair by two renames: after a kill between them
        one file of the pair is moved (the merged file there, the part's gone) and the other
        not; move that one too. Only that move makes a merged file without the other."""
        pairs = list(zip(part_paths(self.work, 0), (self.bin_path, self.lengths_path), strict=True))
        if any(storage.is_file(merged) and not storage.is_file(part) for part, merged in pairs):
            for part, merged in pairs:
                if storage.is_file(part) and not storage.is_file(merged):
                    writing.replace(part, merged)

    def add(self, record: dict[str, Any]) -> None:
        """A partition finished: merge it, and what waited for it."""
        self.waiting[int(record["partition"])] = (
            int(record["bin_bytes"]),
            int(record["documents"]),
        )
        self._advance()

    def _open(self) -> None:
        with contextlib.ExitStack() as stack:
            with naming(self.bin_path):
                self._bin = stack.enter_context(writing.open_append(self.bin_path, self.bin_bytes))
            with naming(self.lengths_path):
                self._lengths = stack.enter_context(
                    writing.open_append(self.lengths_path, 4 * self.documents)
                )
            stack.pop_all()

    def _advance(self) -> None:
        while self.next in self.waiting:
            nbytes, docs = self.waiting.pop(self.next)
            part_bin, part_lengths = part_paths(self.work, self.next)
            if self._bin is None:  # the first part: renamed, not copied (two renames: restore)
                writing.replace(part_bin, self.bin_path)
                writing.replace(part_lengths, self.lengths_path)
                self.bin_bytes, self.documents = nbytes, docs
                self._open()
            else:
                # A full disk names the merged file (its bare OSError named none: the CLI
                # printed "error: No space left on device"); a failed read names the part
                # (`append_range` names the file it failed on)
                with naming(self.bin_path):
                    writing.append_range(part_bin, 0, nbytes, self._bin)
                with naming(self.lengths_path):
                    writing.append_range(part_lengths, 0, 4 * docs, self._lengths)
                with naming(self.bin_path):
                    writing.sync_stream(self._bin)
                with naming(self.lengths_path):
                    writing.sync_stream(self._lengths)
                self.bin_bytes += nbytes
                self.documents += docs
                writing.remove_file(part_bin)  # only once its bytes are on the disk
                writing.remove_file(part_lengths)
            self.next += 1

    def close(self) -> None:
        """Both merged files synced and closed; the first failure is raised once both are
        closed (until 2026-12-07 a failed sync of `.bin` left `.lengths` open)."""
        files = ((self._bin, self.bin_path), (self._lengths, self.lengths_path))
        self._bin = self._lengths = None
        failed: OSError | None = None
        for f, path in files:
            if f is None:
                continue
            try:
                with naming(path):
                    writing.sync_stream(f)
                    f.close()
            except OSError as exc:
                with contextlib.suppress(OSError):
                    f.close()  # (its descriptor is let go even where the flush fails again)
                failed = failed or exc
        if failed is not None:
            raise failed


__all__ = ["MERGED_BIN", "MERGED_LENGTHS", "Merge"]
