"""The last module of the local engine's fork server's preload: the driver watch that
`pool_server` started ends here (`pool_server.end_watch`).

From here the server's own loop sees its driver's end (EOF on its "alive" pipe), and it forks
its workers with the threads it had before the watch (packtool/engines/pool_kernels.py says
which). `engines.local` lists it last in the preload; imported anywhere else (not in a fork
server's `main`) it does nothing, as `pool_server`.
"""

from __future__ import annotations

from packtool.engines.pool_server import end_watch, in_fork_server

if in_fork_server():
    end_watch()
