"""Balance attention cost across data-parallel ranks within one global step.

Attention time grows with Σ len² over a batch's documents, not with its token count, so two
ranks with the same number of tokens can wait on each other for a long time. Within a global
step (whose rows are fixed by the seed), `balance_step` reassigns rows to ranks with greedy
longest-processing-time first (LPT): rows sorted by cost, each to the least-loaded rank that still
has room (row count, token budget and document caps); LPT is within 4/3 of the optimal makespan.
"""

from __future__ import annotations

import heapq

import numpy as np


def row_cost(sq_cost: np.ndarray, lengths: np.ndarray, linear: float) -> np.ndarray:
    """Cost of each row: Σ len² over its documents plus `linear` × its tokens."""
    return sq_cost + float(linear) * lengths


def balance_step(
    rows: np.ndarray,
    cost: np.ndarray,
    world_size: int,
    *,
    lengths: np.ndarray | None = None,
    n_docs: np.ndarray | None = None,
    rows_cap: int | None = None,
    tokens_cap: int | None = None,
    docs_cap: int | None = None,
) -> np.ndarray | None:
    """Assign rows to ranks so the most loaded rank carries as little cost as LPT finds.

    Args:
        rows: The step's row ids, `(n,)` (only their count matters here).
        cost: Each row's cost, `(n,)`.
        world_size: Number of ranks.
        lengths: Each row's tokens, needed with `tokens_cap`.
        n_docs: Each row's documents, needed with `docs_cap`.
        rows_cap: Most rows a rank may take.
        tokens_cap: Most tokens a rank may take.
        docs_cap: Most documents a rank may take.

    Returns:
        The rank of each row, int64 `(n,)`, or None when some row fits no rank under the caps.
    """
    n = len(rows)
    order = np.argsort(-np.asarray(cost, dtype=np.float64), kind="stable")
    assignment = np.empty(n, dtype=np.int64)
    load = np.zeros(world_size, dtype=np.float64)
    count = np.zeros(world_size, dtype=np.int64)
    tokens = np.zeros(world_size, dtype=np.int64)
    docs = np.zeros(world_size, dtype=np.int64)
    capped = tokens_cap is not None or docs_cap is not None
    heap = [(0.0, r) for r in range(world_size)]
    for i in order.tolist():
        if not capped and rows_cap is None:
            c, r = heapq.heappop(heap)
        else:
            # Caps make the least-loaded rank possibly unusable: scan ranks by load (W is small).
            r = -1
            for cand in np.argsort(load, kind="stable").tolist():
                if rows_cap is not None and count[cand] >= rows_cap:
                    continue
                if tokens_cap is not None and tokens[cand] + lengths[i] > tokens_cap:
                    continue
                if docs_cap is not None and docs[cand] + n_docs[i] > docs_cap:
                    continue
                r = cand
                break
            if r < 0:
                return None
        assignment[i] = r
        load[r] += cost[i]
        count[r] += 1
        if lengths is not None:
            tokens[r] += lengths[i]
        if n_docs is not None:
            docs[r] += n_docs[i]
        if not capped and rows_cap is None:
            heapq.heappush(heap, (float(load[r]), r))
    return assignment


def imbalance(loads: np.ndarray) -> float:
    """max / mean of per-rank loads (1.0 is perfect balance)."""
    loads = np.asarray(loads, dtype=np.float64)
    mean = loads.mean() if len(loads) else 0.0
    return float(loads.max() / mean) if mean > 0 else 1.0


def step_loads(cost: np.ndarray, assignment: np.ndarray, world_size: int) -> np.ndarray:
    """Total cost per rank for one step."""
    return np.bincount(assignment, weights=cost, minlength=world_size)
