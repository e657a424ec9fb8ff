"""`--rounds` with `--group-by`: every group's extra rounds in one numba call
(`packtool.pack.repack.repack_groups`) against the Python call per group and round it replaced
(`packtool.pack.reference.repack_reference` with the `kernels.ff_assign` the old path called).
docs/benchmarks.md block `pack-rounds`; run by `python -m benchmarks.bench_pack --only pack-rounds`.
"""

from __future__ import annotations

import os
import time

import numpy as np

from benchmarks._common import markdown_table
from packtool.pack import kernels, repack
from packtool.pack.reference import repack_reference

MAX_LEN = 1024
PER_GROUP = 8
"""Documents per group: log-normal lengths (median 320, sigma 1), about 3 rows per group."""


def _groups(n_groups: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(320), 1.0, n_groups * PER_GROUP), 1, MAX_LEN)
    return lengths.astype(np.int64), np.repeat(np.arange(n_groups, dtype=np.int64), PER_GROUP)


def _run(fn, lens, codes, n_groups, rounds, **kw):  # type: ignore[no-untyped-def]
    row, offset, rows = kernels.grouped_assign(lens, codes, MAX_LEN, "ffd", n_groups)
    rng = np.random.default_rng([0, 1])
    t0 = time.thread_time()  # CPU time: on a loaded box a long call's wall time is mostly waits
    history = fn(lens, codes, row, offset, rows, MAX_LEN, rounds, rng, **kw)
    seconds = time.thread_time() - t0
    return seconds, (row.tolist(), offset.tolist(), list(history), rng.integers(0, 2**62))


def bench_rounds(
    groups: tuple[int, ...] = (300, 3000), rounds: tuple[int, ...] = (4, 16), repeat: int = 3
) -> str:
    """Time the extra rounds both ways; return the markdown block `pack-rounds`."""
    load_before = os.getloadavg()[0]
    repack.warm_up()
    table = []
    for n_groups in groups:
        lens, codes = _groups(n_groups)
        for r in rounds:
            new = [_run(repack.repack_groups, lens, codes, n_groups, r) for _ in range(repeat)]
            old_s, old = _run(
                repack_reference, lens, codes, n_groups, r, first_fit=kernels.ff_assign
            )  # once: it is the slow one
            new_s = min(s for s, _ in new)
            same = all(result == old for _, result in new)
            table.append(
                [
                    f"{n_groups:,}",
                    str(r),
                    f"{old_s:.2f}",
                    f"{new_s * 1e3:.1f} ms",
                    f"{old_s / new_s:,.0f}x",
                    "yes" if same else "NO",
                ]
            )
            print(
                f"{n_groups} groups, {r} rounds: {old_s:.2f} s -> {new_s * 1e3:.1f} ms", flush=True
            )
    header = ["groups", "rounds", "a Python call per group and round (s)", "one numba call"]
    return (
        f"Rounds 2..R of every group (`--group-by`, `--rounds R`), {PER_GROUP} documents a group "
        f"(log-normal lengths, median 320, sigma 1) at max_len {MAX_LEN:,}, the first round "
        f"(FFD) excluded; CPU time of the calling thread (wall time on this shared box is mostly "
        "waiting: 3,000 groups x 4 rounds took 57-113 ms of wall time for ~9 ms of CPU at load "
        f"30); one numba call best of {repeat}, the Python path once; 'same' compares "
        "rows, offsets, rows per round and the generator's next draw. "
        "`python -m benchmarks.bench_pack --only pack-rounds`\n\n"
        + markdown_table([*header, "speed-up", "same"], table)
        + f"\n\nLoad average (1 min) {load_before:.1f} before and {os.getloadavg()[0]:.1f} after "
        "the run (a shared 2-core box)."
    )
