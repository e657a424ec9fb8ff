"""Epoch order at scale: memory and time to first batch, lazy order vs the eager one it replaced.

Run: `python -m benchmarks.bench_order [--quick] [--repeat 3] [--eager-max 1e8] [--no-readme]`.

The order of 10^6, 10^8 and 10^9 rows (`--quick`: 10^5, 10^6, 10^7) of a synthetic dataset
(`loader.testing.synthetic_index`: 256-row row groups, row lengths 2048-4096 generated per row
group, nothing stored per row), cut for 8 ranks under a 64k-token budget with the default
16-row-group shuffle window. Each measurement runs in a fresh process:
- *lazy* (this loader): `EpochOrder` + `EpochPlan` + `RowIndex`; time to rank 0's first batch
  (the rows of step 0), fresh and after a resume at the middle step of the epoch (a plan that
  knows only the resume state's step and cursor); the bytes the order, plan and row index then
  hold (`loader.testing.held_bytes`) and the peak RSS growth. Also the one thing that needs the
  whole epoch: `len()` under a token budget (the cut to the end, every row's length), up to
  `--walk-max` rows (it also gives the true cursor of the middle step).
- *eager* (the order before this change, copied below as it was): every row's lengths and
  document counts read into arrays (what the loader did at open), the windowed permutation of all
  rows, the greedy cut of the whole epoch; a resume recomputed all of it. Run up to
  `--eager-max` rows (it needs ~50 bytes a row: 10^9 rows do not fit this machine).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks._common import markdown_table, update_block

WORLD = 8
BUDGET = 65_536
MAX_LEN = 4096
WINDOW = 16


# ---- the eager order, as loader/order/steps.py had it before the lazy one ------------------------


def eager_permutation(n_rows, *, fingerprint, seed, epoch, group_starts, window):
    import hashlib

    digest = hashlib.sha256(f"{fingerprint}:{seed}:{epoch}".encode()).digest()
    rng = np.random.default_rng(np.frombuffer(digest[:16], dtype=np.uint32).tolist())
    n_groups = len(group_starts) - 1
    groups = rng.permutation(n_groups)
    sizes = np.diff(group_starts)[groups]
    rows = np.repeat(group_starts[groups] - np.cumsum(np.concatenate([[0], sizes[:-1]])), sizes)
    rows += np.arange(int(sizes.sum()), dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(sizes)])[::window]
    bounds = np.append(bounds, len(rows)) if bounds[-1] != len(rows) else bounds
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        rows[a:b] = rows[a:b][rng.permutation(b - a)]
    return rows.astype(np.int64, copy=False)


def eager_cut(order, *, tokens_per_batch, lengths):
    n = len(order)
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths[order], out=cum[1:])
    bounds = [0]
    start = 0
    while start < n:
        end = int(np.searchsorted(cum, cum[start] + tokens_per_batch, side="right")) - 1
        end = max(end, start + 1)
        bounds.append(end)
        start = end
    return np.asarray(bounds, dtype=np.int64)


# ---- one measurement (a child process) --------------------------------------------------------


def _child(impl: str, n: int, step: int, cursor: int) -> dict:
    from loader.order.permutation import EpochOrder
    from loader.order.steps import EpochPlan
    from loader.testing import held_bytes, synthetic_index

    index = synthetic_index(n, group_rows=256, max_len=MAX_LEN)
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    t0 = time.perf_counter()
    out: dict = {}
    if impl == "eager":
        scan = list(index.scan())  # what the old loader read at open: every row's counts
        lengths = np.concatenate([s.lengths for s in scan]).astype(np.int64)
        n_docs = np.concatenate([s.n_docs for s in scan]).astype(np.int64)
        sq = np.concatenate([s.sq for s in scan])
        del scan
        out["index_s"] = time.perf_counter() - t0
        order = eager_permutation(
            n, fingerprint="f", seed=0, epoch=0, group_starts=index.group_starts, window=WINDOW
        )
        bounds = eager_cut(order, tokens_per_batch=BUDGET, lengths=lengths)
        b = step * WORLD
        rows = order[bounds[b] : bounds[b + 1]]
        out["first_s"] = time.perf_counter() - t0
        out["held"] = sum(a.nbytes for a in (lengths, n_docs, sq, order, bounds))
        out["steps"] = -(-(len(bounds) - 1) // WORLD)
    else:
        order = EpochOrder(index.group_starts, fingerprint="f", seed=0, epoch=0, window=WINDOW)
        plan = EpochPlan(order, world_size=WORLD, tokens_per_batch=BUDGET, index=index)
        if impl == "walk":  # len(): the cut to the end of the epoch
            out["steps"] = plan.num_steps
            out["first_s"] = time.perf_counter() - t0
            mid = out["steps"] // 2
            out["mid_step"], out["mid_cursor"] = mid, plan.cursor_after(mid)
            rows = plan.step_rows(mid)[0]
        else:
            plan.anchor(step * WORLD, cursor)  # what load_state_dict does with a state
            rows = plan.step_rows(step)[0]
            out["first_s"] = time.perf_counter() - t0
        out["held"] = held_bytes(plan)
    out["peak"] = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before, 0)
    out["rows"] = [int(rows[0]), len(rows)]
    return out


def _measure(impl: str, n: int, step: int = 0, cursor: int = 0) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.bench_order", "--child", impl, str(n)]
    res = subprocess.run(
        [*cmd, str(step), str(cursor)], capture_output=True, text=True, check=False
    )
    if res.returncode != 0:
        return {"error": (res.stderr.strip().splitlines() or ["killed"])[-1]}
    return json.loads(res.stdout.strip().splitlines()[-1])


def _best(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" not in r]
    return min(ok, key=lambda r: r["first_s"]) if ok else runs[0]


def _mb(x: float) -> str:
    return f"{x / 1e6:,.1f} MB" if x < 1e9 else f"{x / 1e9:,.2f} GB"


def _row(n: int, walk: dict | None, fresh: dict, resumed: dict, eager: dict | None) -> list:
    if eager is None:
        e_cells = ["–", "–", "does not fit (~50 bytes a row)"]
    elif "error" in eager:
        e_cells = ["–", "–", f"failed: {eager['error']}"]
    else:
        e_cells = [
            _mb(eager["held"]),
            _mb(eager["peak"]),
            f"{eager['first_s']:,.2f} s ({eager['index_s']:,.2f} s of it reading counts)",
        ]
    return [
        f"10^{round(np.log10(n))}",
        "–" if walk is None else f"{walk['steps']:,}",
        _mb(fresh["held"]),
        _mb(max(fresh["peak"], resumed["peak"])),
        f"{fresh['first_s'] * 1e3:,.0f} ms",
        f"{resumed['first_s'] * 1e3:,.0f} ms",
        "not run" if walk is None else f"{walk['first_s']:,.1f} s / {_mb(walk['peak'])}",
        *e_cells,
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="10^5, 10^6, 10^7 rows")
    ap.add_argument("--repeat", type=int, default=3, help="runs per lazy setting (best kept)")
    ap.add_argument("--eager-max", type=float, default=1e8, help="largest size run eagerly")
    ap.add_argument(
        "--walk-max", type=float, default=1e8, help="largest size whose whole epoch is cut"
    )
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    if args.child:
        impl, n, step, cursor = args.child
        print(json.dumps(_child(impl, int(n), int(step), int(cursor))))
        return
    sizes = (10**5, 10**6, 10**7) if args.quick else (10**6, 10**8, 10**9)
    table = []
    for n in sizes:
        walk = None
        if n <= args.walk_max:
            walk = _measure("walk", n)  # len(); also the middle step and its true cursor
            mid, cursor = walk["mid_step"], walk["mid_cursor"]
        else:  # a middle step at row n/2: what resuming costs does not depend on the cursor
            mid = round(n * 0.75 * MAX_LEN / BUDGET / WORLD / 2)
            cursor = n // 2
        fresh, resumed = [], []
        for _ in range(args.repeat):  # interleaved, so a load spike hits both alike
            fresh.append(_measure("lazy", n))
            resumed.append(_measure("lazy", n, mid, cursor))
        eager = _measure("eager", n, mid) if n <= args.eager_max else None
        table.append(_row(n, walk, _best(fresh), _best(resumed), eager))
        print(table[-1], flush=True)
    headers = [
        "rows",
        "steps",
        "lazy: held",
        "lazy: peak",
        "lazy: first batch",
        "lazy: first batch after a mid-epoch resume",
        "lazy: len() (the cut to the end) / peak",
        "eager: held",
        "eager: peak",
        "eager: first batch (fresh or resumed)",
    ]
    cpu = platform.processor() or platform.machine()
    body = "\n".join(
        [
            "Epoch order at scale: a synthetic dataset (`loader.testing.synthetic_index`: "
            f"256-row row groups, row lengths {MAX_LEN // 2}-{MAX_LEN} generated per row group), "
            f"{WORLD} ranks, {BUDGET:,}-token budget, {WINDOW}-row-group shuffle windows; rank 0's "
            "first batch in a fresh process. *lazy*: this loader (`EpochOrder` + `EpochPlan` + "
            "`RowIndex`); *held*: what the order, plan and row index hold after the first batch "
            "(the row-group table included); *peak*: peak RSS growth while computing it. The "
            "mid-epoch resume is a plan told the middle step and its cursor, as `load_state_dict` "
            f"does (true cursors from the cut up to {args.walk_max:.0e} rows; beyond, row n/2). "
            "*eager*: the order before this change (every row's counts read first, the whole "
            "permutation and cut; a resume recomputed all of it), run up to "
            f"{args.eager_max:.0e} rows. Best of {args.repeat} interleaved runs (eager and len(): "
            f"one). {os.cpu_count()} cores ({cpu}), load average {os.getloadavg()[0]:.1f} at "
            f"the end. Measured by `python -m benchmarks.bench_order"
            f"{' --quick' if args.quick else ''}`.",
            "",
            markdown_table(headers, table),
        ]
    )
    print(body)
    if not args.no_readme:
        update_block("order", body)


if __name__ == "__main__":
    main()
