"""What each rank and each node of a multi-node job reads of a dataset in one epoch.

Run: `python -m benchmarks.node_reads [--rows 1048576] [--nodes 8] [--ranks-per-node 8]
[--rows-per-batch 8] [--window 16] [--no-docs]` (writes its block into docs/benchmarks.md,
"Several nodes", unless `--no-docs`).

No files: the epoch order and plan of a synthetic dataset (`loader.testing.synthetic_index`,
256-row row groups) cut for `nodes x ranks-per-node` ranks with `rows_per_batch`, as
`PackedDataset` cuts them (rank r of a step takes the r-th of the step's consecutive rank
batches), in the plain order and in the order dealt to nodes (`PackedDataset(nodes=...)`,
loader/order/nodes.py). Prints, per rank and per node (ranks `n*L .. n*L + L - 1`), the share
of the epoch's row groups its rows come from: what a rank decodes and what a node downloads
into its cache from a bucket (docs/remote.md, "Several nodes"). The defaults are a 64-rank job.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._common import best_of, markdown_table, publish
from loader.order.nodes import NodeOrder
from loader.order.permutation import EpochOrder
from loader.order.steps import EpochPlan, rank_rows
from loader.testing import synthetic_index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1 << 20)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--rows-per-batch", type=int, default=8)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    index = synthetic_index(args.rows)
    starts = index.group_starts
    world = args.nodes * args.ranks_per_node
    n_groups = len(starts) - 1
    head = (
        f"What each rank and node reads of a dataset in one epoch (`python -m "
        f"benchmarks.node_reads`, {time.strftime('%Y-%m-%d')}; no files: the epoch plan of a "
        f"synthetic dataset of {args.rows:,} rows in {n_groups:,} row groups, {args.nodes} nodes "
        f"x {args.ranks_per_node} ranks, rows_per_batch {args.rows_per_batch}, shuffle window "
        f"{args.window} row groups): the share of the row groups whose rows a rank reads (and "
        "decodes), and a node (and downloads from a bucket), in the plain order and dealt to "
        "nodes (`PackedDataset(nodes=...)`); and the time a rank spends on its rows of a step "
        "(`rank_rows` of the last rank, 500 steps, best of 3)."
    )
    rows, costs = [], []
    for name in ("plain order", f"nodes={args.nodes}"):
        order = EpochOrder(starts, fingerprint="node-reads", seed=0, epoch=0, window=args.window)
        if name != "plain order":
            stripe = args.ranks_per_node * args.rows_per_batch
            order = NodeOrder(order, nodes=args.nodes, stripe=stripe)
        plan = EpochPlan(order, world_size=world, rows_per_batch=args.rows_per_batch)
        touched = np.zeros((world, n_groups), dtype=bool)
        for step in range(plan.num_steps):
            for rank, got in enumerate(plan.step_rows(step)):
                touched[rank, np.searchsorted(starts, got, side="right") - 1] = True
        per_rank = touched.sum(axis=1) / n_groups
        nodes = touched.reshape(args.nodes, args.ranks_per_node, n_groups).any(axis=1)
        per_node = nodes.sum(axis=1) / n_groups
        for what, share, even in (
            ("row groups a rank reads", per_rank, 1 / world),
            ("row groups a node reads", per_node, 1 / args.nodes),
        ):
            stats = (share.min(), share.mean(), share.max(), even)
            rows.append([name, what, *(f"{x:.1%}" for x in stats)])
        dealt = 1 if name == "plain order" else args.nodes
        steps = range(min(500, plan.num_steps))

        def own_rows(plan: EpochPlan = plan, dealt: int = dealt, steps: range = steps) -> None:
            for step in steps:
                rank_rows(plan, step, world - 1, nodes=dealt)

        costs.append([name, f"{best_of(own_rows) / max(len(steps), 1) * 1e3:.3f}"])
    table = markdown_table(["order", "", "min", "mean", "max", "if split evenly"], rows)
    cost = markdown_table(["order", "a rank's rows of a step, ms (one thread)"], costs)
    publish("node-reads", f"{head}\n\n{table}\n\n{cost}", docs=not args.no_docs)


if __name__ == "__main__":
    main()
