"""numba kernels that import numba at their first call, not when their module is imported.

`@jit.njit(cache=True, nogil=True)` marks a kernel as `@numba.njit(...)` would. The first call of
any marked kernel imports numba and turns every kernel marked so far into its numba dispatcher,
rebinding the names in the kernels' modules, so a kernel that calls another compiles against the
real dispatcher (numba resolves a kernel's globals when it compiles it). Kernels marked after
that are numba dispatchers at once.

Why: importing numba costs ~0.25 s holding the GIL. `packtool pack` imports the packer's modules
while the tokenizer is built in another thread, and the tokenizer's build (its Python half, and
awkward's import for gigatoken) also needs the GIL, so the import delayed the first encode by
about its own length. With lazy kernels the import happens where the first kernel is loaded: the
kernel warm-up, which a partition runs once its encoding has begun (packtool/engines/worker.py).

numba runs every installed `numba_extensions` entry point before its first kernel: it scans
every installed distribution's metadata and imports what they name (awkward, a dependency of the
gigatoken engine, registers one: ~0.2 s of CPU per process). packtool's kernels use no
extension, so its own processes (the CLI sets `PACKTOOL_NUMBA_EXTENSIONS=0`; its pool workers
inherit it; a Slurm array task sets it too, whoever started the run) skip them; a program that
imports packtool as a library keeps numba's behaviour.

A name bound elsewhere with `from module import kernel` before the first call keeps the lazy
wrapper, which forwards each call to the dispatcher (one Python call more per kernel call; the
kernels are called once per chunk, never per token).
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

_LOCK = threading.Lock()
_PENDING: list[LazyKernel] = []
_MODULES: list[dict[str, Any]] = []
"""The globals of every module holding a kernel (rebound at the first call)."""
_NUMBA: Any = None
"""The numba module, once a kernel has been called."""


class LazyKernel:
    """A kernel that becomes `numba.njit(**options)(fn)` at the first call of any kernel."""

    def __init__(self, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        functools.update_wrapper(self, fn)
        self.py_func = fn
        self.options = options
        self.dispatcher: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return (self.dispatcher or _load(self))(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<lazy numba kernel {self.py_func.__qualname__}>"


def njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """`numba.njit(**options)`, applied at the first call of any kernel (see the module)."""

    def mark(fn: Callable[..., Any]) -> Any:
        with _LOCK:
            if _NUMBA is not None:
                return _compiled(_NUMBA, fn, options)
            kernel = LazyKernel(fn, options)
            _PENDING.append(kernel)
            if not any(g is fn.__globals__ for g in _MODULES):
                _MODULES.append(fn.__globals__)
            return kernel

    return mark


def loaded() -> bool:
    """Whether numba has been imported for the kernels."""
    return _NUMBA is not None


def _load(kernel: LazyKernel) -> Any:
    """Import numba, turn every pending kernel into its dispatcher, rebind their names."""
    global _NUMBA
    with _LOCK:
        if kernel.dispatcher is None:
            import numba

            if os.environ.get("PACKTOOL_NUMBA_EXTENSIONS") == "0":
                from numba.core import entrypoints

                entrypoints._already_initialized = True  # numba's own "extensions loaded" flag
            for k in _PENDING:
                k.dispatcher = _compiled(numba, k.py_func, k.options)
            for names in _MODULES:
                for name, value in list(names.items()):
                    if isinstance(value, LazyKernel) and value.dispatcher is not None:
                        names[name] = value.dispatcher
            _PENDING.clear()
            _NUMBA = numba
    return kernel.dispatcher


def _compiled(numba: Any, fn: Callable[..., Any], options: dict[str, Any]) -> Any:
    """`numba.njit(**options)(fn)`, or without its on-disk cache where numba finds no folder it
    may write one to (packtool installed read-only, and no writable `~/.cache`: a container run
    as another user, a shared cluster install), which numba refuses with a RuntimeError; the
    kernel then compiles in each process that calls it, which a process that is no
    multiprocessing child (the driver; the forkserver that loads the workers' kernels) says once."""
    try:
        return numba.njit(**options)(fn)
    except RuntimeError as exc:
        if not options.get("cache") or "no locator available" not in str(exc):
            raise
    global _UNCACHED
    if not _UNCACHED and multiprocessing.parent_process() is None:  # not once per worker
        _UNCACHED = True
        print(
            f"note: numba finds no writable folder to cache packtool's kernels in (beside "
            f"{fn.__code__.co_filename}, nor its user cache): they compile in every run (seconds); "
            "set NUMBA_CACHE_DIR to a writable folder to keep them",
            file=sys.stderr,
            flush=True,
        )
    return numba.njit(**{**options, "cache": False})(fn)


_UNCACHED = False
"""Whether the main process has said that its kernels compile without a cache."""
