"""loader/packed/workers.py: an error of packtool's own that a loader's worker raises reaches the
main process as the worker raised it, carried by the worker, not parsed from torch's text."""

from __future__ import annotations

import traceback

import pytest

from loader import PackedDataLoader, PackedDataset
from packtool.errors import DataError


class ShardLost(DataError):
    """A DataError whose constructor takes more than its message (torch's `reraise` cannot
    build one from its text)."""

    def __init__(self, message: str, shard: int) -> None:
        super().__init__(message)
        self.shard = shard


def _fail_with(exc: Exception):
    def blocks(self, *args, **kwargs):
        yield from ()
        raise exc

    return blocks


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_worker_error_with_a_note_is_its_one_line_message(random_dataset, monkeypatch):
    # Before: the message was cut from torch's traceback text, which prints a note after it:
    # "shard 2 is damaged\nwhile reading row group 3" (two lines).
    exc = DataError("shard 2 is damaged")
    exc.add_note("while reading row group 3")
    monkeypatch.setattr(PackedDataset, "_generate_blocks", _fail_with(exc))
    ds = PackedDataset(random_dataset, rows_per_batch=4)
    with pytest.raises(DataError) as info:
        next(iter(PackedDataLoader(ds, num_workers=1)))
    assert type(info.value) is DataError
    assert str(info.value) == "shard 2 is damaged"
    lines = traceback.format_exception_only(info.value)
    assert lines == ["packtool.errors.DataError: shard 2 is damaged\n"], lines


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_worker_error_comes_whole_whatever_its_constructor(random_dataset, monkeypatch):
    # Before: torch's `reraise` could not build a ShardLost from its text, so the trainer got
    # torch's RuntimeError "Caught ShardLost in DataLoader worker process 0. Original ...".
    monkeypatch.setattr(PackedDataset, "_generate_blocks", _fail_with(ShardLost("lost", 2)))
    ds = PackedDataset(random_dataset, rows_per_batch=4)
    with pytest.raises(ShardLost) as info:
        next(iter(PackedDataLoader(ds, num_workers=1)))
    assert (str(info.value), info.value.shard) == ("lost", 2)
    assert "Caught" not in str(info.value) and "Traceback" not in str(info.value)


def _fail_in_workers(exc: Exception, real):
    def start_plan(self, *args, **kwargs):
        from torch.utils.data import get_worker_info

        if get_worker_info() is not None:
            raise exc
        return real(self, *args, **kwargs)

    return start_plan


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_worker_error_before_its_first_batch_is_its_one_line_message(random_dataset, monkeypatch):
    # Before: only the ring generator was carried, so an error in `__iter__`'s setup (the plan,
    # before the first batch) came as torch's "Caught DataError in DataLoader worker process 0.
    # \nOriginal Traceback ..." (a RuntimeError-like text, not the worker's one line).
    real = PackedDataset._start_plan
    monkeypatch.setattr(
        PackedDataset, "_start_plan", _fail_in_workers(DataError("shard 2 is damaged"), real)
    )
    ds = PackedDataset(random_dataset, rows_per_batch=4)
    with pytest.raises(DataError) as info:
        next(iter(PackedDataLoader(ds, num_workers=1)))
    assert type(info.value) is DataError
    assert str(info.value) == "shard 2 is damaged"
    next(iter(PackedDataLoader(ds, num_workers=0)))  # in process the setup runs as before
