"""RequestBatcher's queue: the cost of forming a batch against the backlog waiting.

Run from the repo root: `python -m benchmarks.bench_request_queue [--no-docs]` (about a minute).
Writes docs/benchmarks.md block `request_queue`.

A server that falls behind has a backlog; forming each batch must not cost more the longer the
backlog gets, or the batcher falls further behind. Steady state at each backlog B: B requests
queued (log-normal lengths, median 256 tokens, clipped to 1..4096, as bench_online's serving
section), then batches of budget 16,384 tokens taken one after another, each followed by as many
new arrivals as it took, so the backlog stays B. Reported: microseconds of batch forming per
request taken. Baseline in the same run: first fit by scanning a list in arrival order (what
`RequestBatcher` did until 2026-12-05: the earliest request that fits, then the next, ...),
checked to take exactly the same requests.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import markdown_table, publish
from loader.online.request_queue import RequestQueue

BUDGET = 16_384
BATCHES = 400


def _sizes(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(256), 1.0, n), 1, 4096).astype(np.int64)


class ListFirstFit:
    """The plain reference: a list in arrival order, scanned for each request taken."""

    def __init__(self) -> None:
        self.items: list[tuple[int, int]] = []

    def append(self, item: int, size: int) -> None:
        self.items.append((item, size))

    def take(self, room: int) -> list[int]:
        taken, kept = [], []
        for item, size in self.items:
            if size <= room:
                taken.append(item)
                room -= size
            else:
                kept.append((item, size))
        self.items = kept
        return taken


def _run(queue: object, backlog: int, seed: int) -> tuple[float, int, list[list[int]]]:
    """(seconds forming batches, requests taken, the batches) at a steady `backlog`."""
    sizes = _sizes(backlog + BATCHES * 200, seed)
    for i in range(backlog):
        queue.append(i, int(sizes[i]))
    nxt, spent, taken, batches = backlog, 0.0, 0, []
    for _ in range(BATCHES):
        t0 = time.perf_counter()
        got = queue.take(BUDGET, None) if isinstance(queue, RequestQueue) else queue.take(BUDGET)
        spent += time.perf_counter() - t0
        batches.append(got)
        taken += len(got)
        for _ in got:  # as many arrive as left: the backlog stays
            queue.append(nxt, int(sizes[nxt]))
            nxt += 1
    return spent, taken, batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    rows = []
    for backlog in (100, 1_000, 5_000, 40_000):
        new_s, new_n, new_batches = _run(RequestQueue(), backlog, seed=backlog)
        old_s, old_n, old_batches = _run(ListFirstFit(), backlog, seed=backlog)
        if new_batches != old_batches:
            raise SystemExit(f"backlog {backlog}: the queue took other requests than first fit")
        new_us, old_us = new_s / new_n * 1e6, old_s / old_n * 1e6
        rows.append(
            [
                f"{backlog:,}",
                f"{new_n / BATCHES:.0f}",
                f"{new_us:.1f}",
                f"{old_us:.1f}",
                f"{old_us / new_us:.2f}x",
            ]
        )
    table = markdown_table(
        [
            "backlog (requests)",
            "requests per batch",
            "RequestQueue (us / request)",
            "list first fit (us / request)",
            "speed-up",
        ],
        rows,
    )
    body = (
        "RequestBatcher's queue, steady backlog, batches of 16,384 tokens (log-normal requests, "
        f"median 256 tokens), {BATCHES} batches each; identical batches checked. "
        "`python -m benchmarks.bench_request_queue`\n\n" + table
    )
    publish("request_queue", body, docs=not args.no_docs)


if __name__ == "__main__":
    main()
