"""The hand-off between a dataset and the DataLoader workers of its loader.

`PackedDataLoader` and `MixedDataLoader` both run their dataset in DataLoader worker processes
that send compact batches through a shared-memory ring (transport.py). Two things pass between
the loader and the dataset for that, the same for both:

- In each worker, the loader's `WorkerInit` hands the ring to that worker's copy of the
  dataset (`WorkerHandoff.use_ring`); with it, the copy produces compact batches for the ring
  instead of collated ones.
- In the main process, the loader tells the dataset that its workers iterate it
  (`WorkerHandoff.workers_iterate`): their copies advance and the main one does not, so the
  dataset's own `state_dict()` would repeat data and is refused (`check_own_state`) until the
  dataset iterates in process or loads a state (`in_process`).

Each dataset holds one `WorkerHandoff` as its `handoff` attribute. A worker's copy sends
packtool's own errors on as items (`WorkerHandoff.carry`); both loaders read their workers'
items through `from_workers`, which raises them as the worker raised them.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from torch.utils.data import get_worker_info

from loader.config import check_int
from loader.packed.transport import Ring
from packtool.errors import ConfigError, PacktoolError

T = TypeVar("T")


class WorkerHandoff:
    """A dataset's side of being iterated by the workers of its loader.

    Args:
        dataset: The dataset's class name, for the refusal message.
        loader: The loader's class name, likewise.
    """

    def __init__(self, dataset: str, loader: str) -> None:
        self.dataset, self.loader = dataset, loader
        self.ring: Ring | None = None
        """The loader's ring, in a worker process of that loader (None elsewhere): the dataset's
        `__iter__` produces compact batches for it when set."""
        self.workers = 0
        """Workers of the loader that iterated the dataset last (main process; 0: it iterated
        here or loaded a state since)."""

    def use_ring(self, ring: Ring) -> None:
        """Make this worker's copy produce compact batches for `ring` (`WorkerInit` calls it
        in each worker, before the worker iterates)."""
        self.ring = ring

    def workers_iterate(self, num_workers: int) -> None:
        """The loader, in the main process, starts `num_workers` workers on the dataset: from
        now on this copy's position is not the stream's, and `check_own_state` refuses."""
        self.workers = num_workers

    def in_process(self) -> None:
        """The dataset's own position is the stream's again (the dataset calls it when it
        iterates in the main process or loads a state)."""
        self.workers = 0

    def carry(self, make: Callable[[], Iterable[T]]) -> Iterator[T | WorkerFailed]:
        """The items `make()` gives, this worker's output for the loader's ring, with an error of
        packtool's own raised while making them sent on as a last item (`WorkerFailed`), which
        the loader's `from_workers` raises in the main process as it was raised here.

        `make` runs at the first item, inside the carry: the dataset's setup for the iteration
        (its plan, the ring's start) goes in it, so an error there is carried too, not left to
        torch's "Caught DataError in DataLoader worker process 0. Original Traceback ..."."""
        try:
            yield from make()
        except PacktoolError as exc:
            yield WorkerFailed(exc)

    def check_own_state(self) -> None:
        """Refuse the dataset's own `state_dict()` in the main process after the loader's
        workers iterated it (the dataset's `state_dict` calls it first).

        Raises:
            ConfigError: This copy did not advance; a state of it would repeat data.
        """
        if self.workers and get_worker_info() is None:
            raise ConfigError(
                f"{self.dataset}.state_dict(): a {self.loader} with {self.workers} worker(s) "
                "iterated this dataset in its worker processes, so this process's copy did not "
                "advance and its state would repeat data; save the loader's state instead "
                f"({self.loader}.state_dict(), resumed with its load_state_dict)"
            )


class WorkerInit:
    """The `worker_init_fn` a loader starts its workers with: hands the ring to this worker's
    copy of the dataset (its `handoff`), then runs the user's own `worker_init_fn`, if any.

    `PackedDataLoader` and `MixedDataLoader` install one for each ring they make.
    """

    def __init__(self, ring: Ring, user_fn: Callable[[int], None] | None) -> None:
        self.ring = ring
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        get_worker_info().dataset.handoff.use_ring(self.ring)
        if self.user_fn is not None:
            self.user_fn(worker_id)


def check_worker_args(num_workers: Any, kwargs: dict[str, Any]) -> None:
    """Refuse, in one line, a `num_workers` or `prefetch_factor` that is no count: the loaders
    size their ring by them, and torch checks neither's type (a `num_workers` of 1.5 was a
    TypeError inside the ring's allocation, a `prefetch_factor` of 0 an AssertionError at the
    first iteration and a traceback from the iterator's `__del__`)."""
    check_int("num_workers", num_workers, 0)
    if kwargs.get("prefetch_factor") is not None:
        check_int("prefetch_factor", kwargs["prefetch_factor"], 1)


def from_workers(items: Iterable[T]) -> Iterator[T]:
    """`items`, a DataLoader's iterator over its worker processes, with an error of packtool's
    own (`PacktoolError`) that a worker raised given back as the worker raised it: its class
    and its message (one line), instead of torch's "Caught DataError in DataLoader worker
    process 0. Original Traceback ..." (40-odd lines). The worker sends it as an item
    (`WorkerHandoff.carry`); any other error is torch's, unchanged."""
    for item in items:
        if isinstance(item, WorkerFailed):
            error = item.error
            # The raised error's traceback holds this frame: without `item` and `error` in it,
            # no cycle keeps `items` (the workers' iterator) alive after the caller drops the
            # error, to be collected in a worker forked by the next iteration (torch's "can
            # only test a child process" traceback, once per worker).
            del item
            try:
                raise error from None
            finally:
                del error
        yield item


class WorkerFailed:
    """An error of packtool's own raised in a loader's worker, sent to the main process as an
    item (`WorkerHandoff.carry`), where `from_workers` raises it.

    Pickled as its class, its `args` and its attributes, not through the class's constructor
    (a subclass may take more than a message); without the notes Python's `add_note` gave it,
    so the main process prints the one line the worker raised. An error that cannot travel so
    (a class defined in a function, an attribute that does not pickle, a class whose `__new__`
    refuses its `args` when rebuilt) comes as the nearest class it derives from that can (a
    `DataError` for most), its one line naming the original class and message; where that
    class is its own (only an attribute failed), as its class and message alone, the class
    named once, without any of its attributes (none travels, not even those that pickle: an
    error is made of its message, not by its constructor). Until
    2026-12-07 the first was lost in the worker (the loader ended as if the data had, with no
    error) and the last was a traceback of the unpickling in the main process.
    """

    def __init__(self, error: PacktoolError) -> None:
        self.error = error

    def __reduce__(self) -> tuple:
        exc = self.error
        attrs = {k: v for k, v in vars(exc).items() if k != "__notes__"}
        try:
            whole: bytes | None = pickle.dumps((type(exc), exc.args, attrs))
        except Exception:  # any failure to pickle: the stand-in goes instead
            whole = None
        cls, message = type(exc), _one_line(exc)
        nearest = _nearest(cls, message)
        if nearest is not cls:  # a parent stands in: its line names the original class
            message = f"{cls.__module__}.{cls.__qualname__}: {message}"
        return (_rebuild, (whole, nearest, message))


def _one_line(exc: BaseException) -> str:
    """`exc`'s message as one line."""
    try:
        message = str(exc)
    except Exception:  # a __str__ that fails: its args instead
        message = repr(exc.args)
    return " ".join(message.split())


def _nearest(cls: type, line: str) -> type[PacktoolError]:
    """The first class of `cls`'s ancestry (itself first) among packtool's errors that pickles
    by name (defined at a module's top level, found there again) and makes an error of `line`
    alone (`__new__`, as `_rebuild` makes it)."""
    for base in cls.__mro__:
        if not (isinstance(base, type) and issubclass(base, PacktoolError)):
            continue
        with contextlib.suppress(Exception):  # not this one: its parent
            if pickle.loads(pickle.dumps(base)) is base:
                base.__new__(base, line)
                return base
    return PacktoolError


def _rebuild(whole: bytes | None, nearest: type[PacktoolError], line: str) -> WorkerFailed:
    """The worker's error (main process); when it cannot be rebuilt here, `nearest` saying
    `line`."""
    if whole is not None:
        try:
            cls, args, attrs = pickle.loads(whole)
            exc = cls.__new__(cls, *args)
            exc.args = args
            vars(exc).update(attrs)
            return WorkerFailed(exc)
        except Exception:  # rebuilt another way: below
            pass
    try:
        stand_in = nearest.__new__(nearest, line)
    except Exception:  # it made one in the worker, not here
        stand_in = PacktoolError(line)
    stand_in.args = (line,)
    return WorkerFailed(stand_in)
