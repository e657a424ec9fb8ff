"""Load every numba kernel of the pack stage before the first chunk needs it.

The first call of each kernel in a process costs ~0.1-0.2 s of cache loading (or a compile on a
cold cache); an engine calls `warm_up` in a background thread while the first chunk is still
being read. The kernels of packtool/pack/kernels.py and packtool/pack/flat_ids.py are warmed
here, above both, so neither module has to import the other's user.
"""

from __future__ import annotations

from packtool.pack import flat_ids, kernels


def warm_up() -> None:
    """Warm the bin-packing kernels, then the flat-id gathers (the order a chunk uses them)."""
    kernels.warm_up()
    flat_ids.warm_up()
