"""The packer's numba kernels, loaded once in the local engine's fork server, so every worker
it forks has them.

Each partition worker loaded them itself (`warmup.warm_up`, in its first partition): numba's
import and its cache loading, paid again by every worker of every run (the tests' runs into a
bucket spent more on it than on their partitions). What it costs: `warmup.warm_up()` in a
fresh process that has imported `packtool.pack.warmup` (as a worker has), numba's cache warm,
took 0.63-0.73 s of CPU (`time.process_time`) where numba's extensions are skipped (the CLI
and every process it starts: packtool/pack/jit.py), 0.88-1.28 s where they are not (a
program using packtool as a library, awkward installed); 2026-12-07, this project's 2-core
box at load ~3, five runs each. (The `load kernels` stage of a run's `time` line is the wall
time of the same call on a worker's background thread, beside its reading: docs/pack.md.)
In the fork server, started while the driver plans (`local.start_pool_server`), they load
once; a forked worker's own `warm_up` then finds them loaded and costs nothing. The extra
rounds' kernel is not among them (`warm_up` loads it only for a run with `--rounds`).

The server forks its workers with 2 threads: the interpreter's and pyarrow's (jemalloc's
background thread, `jemalloc_bg_thd`, there since its imports); numba adds none (a fork copies
only the forking thread). The thread that watches the driver during the preload
(`pool_server.watch_driver`) has ended by then (`pool_ready`): a driver that ends while the
kernels load or compile (a preflight error) ends the server with it.

`engines.local` lists this module in its preload after `pool_server`; imported anywhere else
(not in a fork server's `main`) it does nothing, as `pool_server`. A failure to load them (a
numba cache it cannot write, say) is left to the workers, each of which then tries as before:
an exception here would kill the server, and every worker with it, saying nothing of why.
"""

from __future__ import annotations

import contextlib

from packtool.engines.pool_server import in_fork_server

if in_fork_server():
    from packtool.pack import warmup

    with contextlib.suppress(Exception):  # the server must live: the workers then load them
        warmup.warm_up()
