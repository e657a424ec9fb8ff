"""The swap of a finished `tokenize --to megatron` pair into place, and a killed one finished
(packtool/engines/megatron/run.py commits with it; its docstring says the steps and why).

**Into a bucket the staging folder is local** (the scratch folder of the machine that ran,
named by the URL), so a swap cut short waits there while other machines may write the prefix:
machine A's `.idx` upload fails, machine B overwrites the pair, and A's next run on the prefix
found A's `ready.idx` and uploaded it over B's `.bin` (A's index addressing bytes B's `.bin`
does not have), or, cut before A's `.bin` went up, put A's older pair back over B's. Until
2026-12-06 nothing checked. Now the swap keeps a note in the staging folder (`SWAP_NOTE`):
what `.idx` the bucket held when the swap began (its size, date and ETag, `remote.stat`; none)
and, once the `.bin` is up, the uploaded `.bin`'s, noted before the local `merged.bin` goes. A
leftover is finished only while the bucket is as the swap left it: before its `.bin` upload, the
`.idx` there is the one it replaces (or none: the swap deleted it, or another cut swap did);
after it, the `.bin` there is the one it uploaded. Otherwise another run has written the pair
since: the leftover is stale, dropped with a one-line warning, never uploaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from packtool.dataset.output import remove
from packtool.engines.megatron.merge import MERGED_BIN
from packtool.engines.megatron.record import READY_RECORD, record_path
from packtool.errors import json_value
from packtool.storage import hub, remote_write, writing
from packtool.storage import local as storage

READY_IDX = "ready.idx"
"""In the staging folder: the finished index, waiting for the swap (see run.py's docstring)."""
SWAP_NOTE = "swap.json"
"""In a bucket pair's staging folder: what the swap replaces and what it uploaded (above)."""


def note_swap(work: Path, idx_path: Any, bin_bytes: int) -> None:
    """Before `ready.idx` is in place (so every leftover that has one has this too): the bucket's
    `.idx` that the swap replaces, as it is now (under the confirmed lock)."""
    note = {"replaces_idx": _identity(idx_path), "bin_bytes": bin_bytes}
    writing.write_atomic(work / SWAP_NOTE, (json.dumps(note) + "\n").encode())


def drop_stale_swap(work: Path, bin_path: Any, idx_path: Any, shown: str) -> bool:
    """A bucket swap this machine left cut short, when another run has written the pair since
    (the module docstring): its folder removed with a one-line warning; True when dropped."""
    folder = work if storage.is_file(work / READY_IDX) else done_folder(work)
    if not storage.is_file(folder / READY_IDX):
        return False
    why = _stale(folder, bin_path, idx_path)
    if why is None:
        return False
    print(
        f"warning: {shown}: the swap a run on this machine left unfinished ({folder}) is not "
        f"finished: {why}, so another run has written the pair since; dropped, nothing uploaded",
        file=sys.stderr,
        flush=True,
    )
    remove(folder)
    return True


def _stale(folder: Path, bin_path: Any, idx_path: Any) -> str | None:
    """Why the leftover in `folder` no longer belongs to the bucket's pair, or None."""
    note = _read_note(folder / SWAP_NOTE)
    if storage.is_file(folder / MERGED_BIN):  # its .bin not uploaded (or not known to be)
        now = _identity(idx_path)
        if now is not None and now != note.get("replaces_idx"):
            return f"{idx_path} is not the index it was to replace"
        return None
    now, uploaded = _identity(bin_path), note.get("uploaded_bin")
    if now is None:
        return f"{bin_path} it uploaded is gone"
    if note.get("bin_bytes") not in (None, now[0]):
        return f"{bin_path} is {now[0]} bytes, not the {note['bin_bytes']} it uploaded"
    if uploaded is None:  # a leftover of a packtool before the note: cannot tell, so never
        return f"what it uploaded as {bin_path} was not noted"
    return None if now == uploaded else f"{bin_path} is not the one it uploaded"


def _identity(path: Any) -> list[int] | None:
    """An object's size and `mtime_ns` (its date and ETag: `remote.stat`), asked of the store;
    None when there is none."""
    try:
        st = storage.stat(path, fresh=True)
    except FileNotFoundError:
        return None
    return [int(st.st_size), int(st.st_mtime_ns)]


def _read_note(path: Path) -> dict[str, Any]:
    """The swap's note; {} when there is none (a leftover of a packtool before it) or it is
    damaged: then nothing is known to match, and a leftover whose `.bin` is up is dropped."""
    try:
        note = json_value(storage.read_text(path))
    except (OSError, ValueError):
        return {}
    return note if isinstance(note, dict) else {}


def finish_swap(work: Path, bin_path: Path, idx_path: Path, shown: str = "") -> bool:
    """Put a finished pair in place from the staging folder (see run.py's docstring); False
    when no finished index waits. Idempotent: a killed swap is redone from where it stopped. A
    failed upload leaves the swap's folder as it is (the next run finishes it, if the bucket is
    still as it left it: `drop_stale_swap`); a failed Hub commit the staging folder
    (`transaction` keeps it)."""
    done = done_folder(work)
    if hub.is_hub(idx_path):  # one Hub commit holds both: never one without the other
        ready, merged = work / READY_IDX, work / MERGED_BIN
        if not storage.is_file(ready):
            remove(done)
            return False
        pair = {bin_path: merged} if storage.is_file(merged) else {}
        if storage.is_file(work / READY_RECORD):
            pair[record_path(idx_path)] = work / READY_RECORD
        hub.put_files({**pair, idx_path: ready}, shown)
        remove(done)  # (a stale one: the rename below needs the name free)
        writing.replace(work, done)
        remove(done)
        return True
    if storage.is_file(work / READY_IDX):
        # One rename takes the staging folder aside first: from here the swap is finished from
        # `done` by whoever comes next, and a half-deleted folder under the staging name (which
        # reads as an interrupted run) can never be left.
        remove(done)
        writing.replace(work, done)
    elif not storage.is_file(done / READY_IDX):
        remove(done)  # what a run killed while deleting a swapped folder left
        return False
    ready, merged, record = done / READY_IDX, done / MERGED_BIN, done / READY_RECORD
    if storage.is_file(merged):
        writing.remove_file(idx_path)  # first: no .idx ever names another .bin
        writing.remove_file(record_path(idx_path))  # the old pair's record goes with it
        if storage.is_remote(bin_path):
            _upload_bin(merged, bin_path, done / SWAP_NOTE)
        else:
            writing.replace(merged, bin_path)
    if storage.is_file(record):  # (record.py; a staging folder before it had none)
        writing.replace(record, record_path(idx_path))
    writing.replace(ready, idx_path)
    writing.sync_dir(idx_path.parent)
    remove(done)
    return True


def _upload_bin(merged: Path, bin_path: Any, note_path: Path) -> None:
    """The `.bin` uploaded, then noted as uploaded (`drop_stale_swap` checks the bucket's
    against it), and only then the local `merged.bin` removed: a leftover without it has the
    note, one killed before the note uploads again."""
    remote_write.upload(merged, bin_path)
    note = _read_note(note_path)
    note["uploaded_bin"] = _identity(bin_path)
    writing.write_atomic(note_path, (json.dumps(note) + "\n").encode())
    writing.remove_file(merged)


def done_folder(work: Path) -> Path:
    """Where a swapped staging folder goes to be deleted (always local: a bucket prefix's
    staging folder is a local scratch folder)."""
    return work.with_name(work.name + ".done")


__all__ = ["READY_IDX", "SWAP_NOTE", "done_folder", "drop_stale_swap", "finish_swap", "note_swap"]
