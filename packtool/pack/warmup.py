"""Load every numba kernel of the pack stage before the first chunk needs it.

The first call of each kernel in a process imports numba (packtool/pack/jit.py says when, and
which of numba's extensions it skips) and costs ~0.1-0.2 s of cache loading (or a compile on a
cold cache); a partition worker calls `warm_up` in a background thread once its first batch is
being encoded, well before its first chunk is packed. The kernels of packtool/pack/kernels.py,
packtool/pack/repack.py (only for a run with extra rounds) and packtool/pack/flat_ids.py are
warmed here, above them, so none of them has to import another's user.
"""

from __future__ import annotations

from packtool.pack import flat_ids, kernels, repack


def warm_up(rounds: int = 1) -> None:
    """Warm the bin-packing kernels, the extra rounds' where the run has them (`rounds` > 1),
    then the flat-id gathers (the order a chunk uses them).

    The rounds' kernel only where it will run (a run at `--rounds 1` never calls it): compiling
    it on a cold cache took ~13 s of a first `packtool pack` of the sample corpus (10.8 s of
    kernel loading before it, 23.5 s with it); ~3 s of CPU since 2026-12 (packtool/pack/repack.py
    says why), in this background thread like the rest."""
    kernels.warm_up()
    if rounds > 1:
        repack.warm_up()
    flat_ids.warm_up()
