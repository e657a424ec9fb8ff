"""Load every numba kernel of the pack stage before the first chunk needs it.

The first call of each kernel in a process costs ~0.1-0.2 s of cache loading (or a compile on a
cold cache); an engine calls `warm_up` in a background thread while the first chunk is still
being read. The kernels of packtool/pack/kernels.py and packtool/pack/flat_ids.py are warmed
here, above both, so neither module has to import the other's user.

numba runs every installed `numba_extensions` entry point before its first kernel: it scans
every installed distribution's metadata and imports what they name (awkward, a dependency of the
gigatoken engine, registers one: ~0.2 s of CPU per process). packtool's kernels use no
extension, so its own processes (the CLI sets `PACKTOOL_NUMBA_EXTENSIONS=0`; its pool workers
inherit it) skip them; a program that imports packtool as a library keeps numba's behaviour.
"""

from __future__ import annotations

import os

from packtool.pack import flat_ids, kernels


def warm_up() -> None:
    """Warm the bin-packing kernels, then the flat-id gathers (the order a chunk uses them)."""
    if os.environ.get("PACKTOOL_NUMBA_EXTENSIONS") == "0":
        from numba.core import entrypoints

        entrypoints._already_initialized = True  # numba's own "extensions loaded" flag
    kernels.warm_up()
    flat_ids.warm_up()
