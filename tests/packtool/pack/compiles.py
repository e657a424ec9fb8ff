"""What numba compiles for a call, on a cold cache: the tests that hold packtool's kernels to
one compile each (tests/packtool/pack/test_repack.py, test_warmup.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

_LISTEN = """
import json
from numba.core import event
{imports}

seen = []


class Seen(event.Listener):
    def on_start(self, e):
        pass

    def on_end(self, e):
        fn = e.data["dispatcher"].py_func
        seen.append([fn.__module__, fn.__qualname__, str(e.data["args"])])


with event.install_listener("numba:compile", Seen()):
    {call}
print(json.dumps(seen))
"""


def cold_compiles(imports: str, call: str, cache: Path, **env: str) -> list[tuple[str, str, str]]:
    """(module, qualified name, argument types) of every function numba compiles for `call`
    (after `imports`) in a fresh process whose numba cache is the empty folder `cache`."""
    code = _LISTEN.format(imports=imports, call=call)
    environ = {**os.environ, "NUMBA_CACHE_DIR": str(cache), **env}
    out = subprocess.run(
        [sys.executable, "-c", code], env=environ, capture_output=True, text=True, check=True
    )
    return [tuple(x) for x in json.loads(out.stdout.splitlines()[-1])]
