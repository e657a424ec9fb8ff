"""loader/packed/workers.py: an error of packtool's own that a loader's worker raises reaches the
main process as the worker raised it, carried by the worker, not parsed from torch's text."""

from __future__ import annotations

import pickle
import threading
import traceback

import pytest

from loader import PackedDataLoader, PackedDataset
from loader.packed.workers import WorkerFailed
from packtool.errors import ConfigError, DataError


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


class NeedsTwo(DataError):
    """A DataError whose class pickles but whose rebuilding fails: `__new__` takes two
    required arguments, so unpickling it (with its `args`, one message) raises TypeError."""

    def __new__(cls, message: str, shard: int):
        return super().__new__(cls, message)

    def __init__(self, message: str, shard: int) -> None:
        super().__init__(message)
        self.shard = shard


def _local_error() -> DataError:
    class ShardGone(DataError):  # defined in a function: its class cannot be pickled
        pass

    return ShardGone("shard 2 is gone")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(
    ("make", "name", "message"),
    [
        (_local_error, "ShardGone", "shard 2 is gone"),
        (lambda: NeedsTwo("shard 3 is gone", 3), "NeedsTwo", "shard 3 is gone"),
    ],
)
def test_a_worker_error_whose_class_cannot_travel_is_still_its_one_line_message(
    random_dataset, monkeypatch, capfd, make, name, message
):
    """Before: a local class failed to pickle in the worker (the error was lost and the loader
    ended as if the data had: no batch, no error), and a class that pickles but cannot be
    rebuilt failed in the main process with an unpickling traceback. Either now comes as the
    nearest packtool class it derives from (DataError) naming the original type and message."""
    exc = make()
    monkeypatch.setattr(PackedDataset, "_generate_blocks", _fail_with(exc))
    ds = PackedDataset(random_dataset, rows_per_batch=4)
    with pytest.raises(DataError) as info:
        next(iter(PackedDataLoader(ds, num_workers=1)))
    text = str(info.value)
    assert type(info.value) is DataError
    assert "\n" not in text
    assert name in text and message in text
    assert "pickl" not in text.lower() and "Traceback" not in text
    (line,) = traceback.format_exception_only(info.value)
    assert line.startswith("packtool.errors.DataError: ")
    assert "pickle" not in capfd.readouterr().err  # nor a traceback printed by the worker


class HoldsALock(DataError):
    """A DataError whose class pickles by name but which holds an attribute that does not (a
    lock): it travels as its own class, by its message alone."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.lock = threading.Lock()
        self.shard = 4


def test_an_error_with_an_unpicklable_attribute_comes_as_its_class_named_once():
    """Before: it came back as HoldsALock whose message was "tests...HoldsALock: shard 4 is
    gone", so its printed line named the class twice ("...HoldsALock: ...HoldsALock: shard 4
    is gone"). Its attributes are gone (documented): only its class and message travel."""
    back = pickle.loads(pickle.dumps(WorkerFailed(HoldsALock("shard 4 is gone")))).error
    assert type(back) is HoldsALock
    assert str(back) == "shard 4 is gone" and back.args == ("shard 4 is gone",)
    (line,) = traceback.format_exception_only(back)
    assert line == f"{HoldsALock.__module__}.HoldsALock: shard 4 is gone\n"
    assert not hasattr(back, "lock") and not hasattr(back, "shard")
    # A parent class standing in still names the original class, once.
    local = pickle.loads(pickle.dumps(WorkerFailed(_local_error()))).error
    assert type(local) is DataError
    assert str(local).count("ShardGone") == 1 and str(local).endswith(": shard 2 is gone")


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_worker_error_with_an_unpicklable_attribute_names_its_class_once(
    random_dataset, monkeypatch
):
    monkeypatch.setattr(
        PackedDataset, "_generate_blocks", _fail_with(HoldsALock("shard 4 is gone"))
    )
    ds = PackedDataset(random_dataset, rows_per_batch=4)
    with pytest.raises(HoldsALock) as info:
        next(iter(PackedDataLoader(ds, num_workers=1)))
    (line,) = traceback.format_exception_only(info.value)
    assert line == f"{HoldsALock.__module__}.HoldsALock: shard 4 is gone\n"


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_a_worker_error_leaves_no_workers_iterator_to_a_later_fork(
    random_dataset, monkeypatch, capfd
):
    # Before: the raised error's traceback held `from_workers`' frame, whose `item` held the
    # error: a cycle that kept torch's iterator over the workers alive after the error was
    # dropped, until a collection, often in a worker forked by the next iteration, which
    # printed torch's "AssertionError: can only test a child process" traceback per worker.
    import gc

    from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

    monkeypatch.setattr(PackedDataset, "_generate_blocks", _fail_with(DataError("row group 3")))
    dl = PackedDataLoader(PackedDataset(random_dataset, rows_per_batch=4), num_workers=1)
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):
            try:
                next(iter(dl))
            except DataError as e:
                assert str(e) == "row group 3"
            alive = [o for o in gc.get_objects() if type(o) is _MultiProcessingDataLoaderIter]
            assert alive == []
    finally:
        gc.enable()
    assert "can only test a child process" not in capfd.readouterr().err


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_workers": 1.5}, "num_workers must be an integer >= 0, got 1.5"),
        ({"num_workers": -1}, "num_workers must be an integer >= 0, got -1"),
        ({"num_workers": "2"}, "num_workers must be an integer >= 0, got '2'"),
        (
            {"num_workers": 1, "prefetch_factor": 0},
            "prefetch_factor must be an integer >= 1, got 0",
        ),
        ({"num_workers": 1, "prefetch_factor": 2.5}, "prefetch_factor must be an integer >= 1"),
    ],
)
def test_a_worker_count_that_is_no_count_is_one_line(random_dataset, kwargs, message):
    # Before: num_workers=1.5 was a TypeError from the ring's allocation ("'float' object
    # cannot be interpreted as an integer") at the first iteration, prefetch_factor=0 torch's
    # AssertionError there, plus a traceback from the iterator's __del__.
    from loader import MixedDataLoader, MixedDataset
    from packtool.mixture.spec import MixtureSpec, SourceSpec

    spec = MixtureSpec(
        sources=(SourceSpec(name="a", path=random_dataset, weight=1),), total_steps=2
    )
    for loader in (
        lambda: PackedDataLoader(PackedDataset(random_dataset, rows_per_batch=4), **kwargs),
        lambda: MixedDataLoader(MixedDataset(spec, rows_per_batch=4), **kwargs),
    ):
        with pytest.raises(ConfigError) as info:
            next(iter(loader()))
        assert str(info.value).startswith(message)
