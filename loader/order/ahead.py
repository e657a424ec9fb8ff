"""Steps started ahead of their turn: what a dataset's iteration decodes in the background.

`PackedDataset` and `loader.mixture.dataset.MixedDataset` start each upcoming step (hand its
row groups to the store's decode thread, and from a bucket its downloads) up to `AHEAD_STEPS`
steps before the step is gathered, while fewer than `AHEAD_GROUPS` row groups wait to be used.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

AHEAD_STEPS = 1024
"""Most upcoming steps whose rows are planned ahead of the one being produced."""
AHEAD_GROUPS = 16
"""Most row groups decoded ahead and not yet used (one default shuffle window; 0: none)."""
_END = object()
S = TypeVar("S")
T = TypeVar("T")


def look_ahead(
    steps: Iterable[S],
    start: Callable[[S], T],
    *,
    most: int,
    busy: Callable[[], bool],
    after: Callable[[T | None], None] | None = None,
) -> Iterator[T]:
    """`start(step)` of each step, called ahead of the step's turn: `start` hands the row groups
    the step will need, in first-use order, to the decode thread, which decodes them while the
    steps before are gathered. Looks ahead up to `most` steps while not `busy()` (a windowed
    shuffle needs a whole window of new row groups every window: `AHEAD_GROUPS` waiting), at
    least one. `after(next item, or None)` runs once each item has been handed out.
    `PackedDataset` and `loader.mixture.dataset.MixedDataset` share it.
    """
    queue: deque[T] = deque()
    upcoming = iter(steps)
    more = True
    while True:
        while more and len(queue) < most and (not queue or not busy()):
            step = next(upcoming, _END)
            if step is _END:
                more = False
                break
            queue.append(start(step))
        if not queue:
            return
        yield queue.popleft()
        if after is not None:
            after(queue[0] if queue else None)
