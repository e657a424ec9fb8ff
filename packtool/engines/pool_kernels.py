"""The packer's numba kernels, loaded once in the local engine's fork server, so every worker
it forks has them.

Each partition worker loaded them itself (`warmup.warm_up`, in its first partition): numba's
import and its cache loading, ~1.2 s of CPU a worker process on this project's 2-core box,
paid again by every worker of every run (the tests' runs into a bucket spent more on it than on
their partitions). In the fork server, started while the driver plans (`local.start_pool_server`),
they load once; a forked worker's own `warm_up` then finds them loaded and costs nothing. The
extra rounds' kernel is not among them (`warm_up` loads it only for a run with `--rounds`).
numba starts no thread here, so the server still forks a single-threaded process.

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
