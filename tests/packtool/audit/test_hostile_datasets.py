"""A dataset folder someone else made: what its files name is read only where the dataset
lives, only as regular files, and bounded. A FIFO named index.json hung every reader, a link to
/dev/zero grew it without bound, a shard linked to a file elsewhere was read as data."""

from __future__ import annotations

import os
import sys
import threading
import traceback

import pytest

from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import INDEX_FILE
from packtool.errors import DataError
from packtool.read import docids
from tests.packtool.audit.test_verify import SHARDS


def finishes(call, seconds: float = 60.0):
    """`call()`'s exception (or None), failing the test if it has not returned in time (a
    FIFO's open waits for ever; a busy CI box has taken over 20 s for a 10 ms call), with where
    the call waits."""
    out: list = []

    def run() -> None:
        try:
            call()
            out.append(None)
        except Exception as exc:  # noqa: BLE001 - what it raised is the result
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    if not out:
        frame = sys._current_frames().get(t.ident)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(gone)"
        pytest.fail(f"it hung for {seconds:.0f} s, waiting in:\n{stack}")
    return out[0]


@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_an_index_json_that_is_no_regular_file_is_one_line(packed_dataset_factory, kind):
    from loader import PackedDataset

    d = packed_dataset_factory(SHARDS)
    (d / INDEX_FILE).unlink()
    if kind == "fifo":
        os.mkfifo(d / INDEX_FILE)
    else:
        (d / INDEX_FILE).symlink_to("/dev/zero")
    for read in (verify_dataset, lambda p: PackedDataset(p, rows_per_batch=1)):
        exc = finishes(lambda read=read: read(d))
        assert isinstance(exc, DataError) and "not a regular file" in str(exc), exc


def test_a_shard_linked_outside_the_folder_is_refused(packed_dataset_factory, tmp_path):
    from loader import PackedDataset

    d = packed_dataset_factory(SHARDS)
    shard = d / "shard-00000.parquet"
    elsewhere = tmp_path / "elsewhere.parquet"
    os.replace(shard, elsewhere)
    shard.symlink_to(elsewhere)
    for read in (verify_dataset, lambda p: PackedDataset(p, rows_per_batch=1)):
        with pytest.raises(DataError, match="outside the dataset folder"):
            read(d)
    shard.unlink()
    os.replace(elsewhere, d / "kept.parquet")
    shard.symlink_to("kept.parquet")  # a link inside the folder is fine
    assert verify_dataset(d, checksums=False).rows == 6


def test_sources_named_outside_the_folder_are_refused(tmp_path):
    info = {"scheme": docids.SCHEME, "sources": "/etc/passwd", "num_files": 1}
    with pytest.raises(DataError, match="expected a file name inside the dataset folder"):
        docids.source({"doc_ids": info}, 7, tmp_path)


def test_a_document_source_that_is_a_fifo_or_device_is_not_read(tmp_path):
    fifo = tmp_path / "input.jsonl"
    os.mkfifo(fifo)
    exc = finishes(lambda: docids.where(str(fifo), 5, "byte", size=0))
    assert exc is None
    assert docids.where(str(fifo), 5, "byte", size=0) == f"{fifo}:byte 5"
    assert docids.where("/dev/zero", 10**9, "byte", size=0) == "/dev/zero:byte 1000000000"
    text = tmp_path / "real.jsonl"
    text.write_text('{"text": "a"}\n{"text": "b"}\n')
    assert docids.where(str(text), 14, "byte", size=28) == f"{text}:line 2 (byte 14)"


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_a_shard_that_is_no_regular_file_is_named_so_and_never_waited_on(
    packed_dataset_factory, kind
):
    """Before: inspect opened a FIFO at a shard's name and waited for ever (r3), and verify
    called a FIFO or folder there `missing (listed in index.json with 100 rows)`."""
    from packtool.audit.inspect import inspect_dataset, read_row

    d = packed_dataset_factory(SHARDS)
    shard = d / "shard-00000.parquet"
    shard.unlink()
    os.mkfifo(shard) if kind == "fifo" else shard.mkdir()
    what = "a pipe (FIFO)" if kind == "fifo" else "a folder"
    exc = finishes(lambda: verify_dataset(d, checksums=False))
    assert isinstance(exc, DataError), exc
    assert f"{what}, not a regular file" in str(exc) and "missing" not in str(exc), exc
    for call in (lambda: inspect_dataset(d), lambda: read_row(d, 0)):
        exc = finishes(call)
        assert isinstance(exc, DataError) and f"{what}, not a regular file" in str(exc), exc
