"""Kernel warm-up in packtool's own processes skips numba's extension entry points (awkward's,
installed with the gigatoken engine, imports awkward, fsspec and yaml: ~0.2 s per process);
a program importing packtool keeps numba's behaviour."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.packtool.pack.compiles import cold_compiles

CHECK = (
    "import sys; from packtool.pack import warmup; warmup.warm_up(); "
    "from numba.core import entrypoints; "
    "print(entrypoints._already_initialized, 'awkward' in sys.modules)"
)


@pytest.mark.parametrize(("setting", "loaded"), [("0", False), (None, True)])
def test_numba_extensions_are_skipped_only_when_asked(setting, loaded):
    env = {k: v for k, v in os.environ.items() if k != "PACKTOOL_NUMBA_EXTENSIONS"}
    if setting is not None:
        env["PACKTOOL_NUMBA_EXTENSIONS"] = setting
    out = subprocess.run(
        [sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, check=True
    ).stdout.split()
    # Either way numba counts its extensions as handled; only without the setting did it run
    # them (awkward's entry point imported awkward).
    assert out == ["True", str(loaded)]


def test_the_cli_sets_it_for_itself_and_its_workers():
    code = (
        "import os, sys; from packtool.cli import commands; "
        "sys.argv = ['packtool', '--help']; "
        "import contextlib, io\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    commands.main()\n"
        "print(os.environ.get('PACKTOOL_NUMBA_EXTENSIONS'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PACKTOOL_NUMBA_EXTENSIONS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip().splitlines()[-1] == "0", out.stderr


@pytest.mark.parametrize(("rounds", "warmed"), [(1, False), (3, True)])
def test_the_rounds_kernel_is_warmed_only_for_a_run_with_rounds(rounds, warmed):
    # Compiling it on a cold numba cache took ~13 s of a first `packtool pack` at --rounds 1,
    # which never calls it (10.8 s of kernel loading before it was warmed, 23.5 s after).
    code = (
        f"from packtool.pack import repack, warmup; warmup.warm_up({rounds}); "
        "print(bool(repack._repack.signatures))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == [str(warmed)]


DTYPES = {
    "_gather_segments": {"uint8", "uint16", "uint32"},
    "_scatter_segments": {"uint16", "uint32"},
}
"""The kernels warmed for several value dtypes on purpose (loss masks; token ids)."""


def test_the_warm_up_compiles_each_kernel_once(tmp_path):
    """On a cold numba cache `_grouped` compiled `_ffd_runs`, `_bfd_runs` and `_row_bound` a
    second time each: its group's `d = 0` reached them typed `Literal[int](0)` while numba
    inferred its type, a second specialization beside the int64 one `_decreasing` compiles.
    Each kernel is now compiled once, but for the value dtypes it is warmed for, and none of
    numba's costly library code (sorts, random, string formatting) is compiled."""
    # NUMBA_OPT=0: LLVM's optimisation level, which comes after numba's typing decides what it
    # compiles (the same events, a quarter less CPU: 9 s where 12).
    seen = cold_compiles(
        "from packtool.pack import warmup", "warmup.warm_up()", tmp_path,
        PACKTOOL_NUMBA_EXTENSIONS="0", NUMBA_OPT="0",
    )  # fmt: skip
    ours = [(q, args) for m, q, args in seen if m.startswith("packtool.")]
    names = {q for q, _ in ours}
    assert {"_decreasing", "_grouped", "_ffd_runs", "_bfd_runs", "_row_bound"} <= names
    assert {"first_fit", "_split", "_segment_sums"} | set(DTYPES) <= names
    for name in names:
        specializations = [args for q, args in ours if q == name]
        want = DTYPES.get(name)
        if want is None:
            assert len(specializations) == 1, (name, specializations)
        else:
            assert len(specializations) == len(want), (name, specializations)
            assert {
                dtype for dtype in want if any(f"({dtype}," in a for a in specializations)
            } == want
    heavy = ("numba.misc.quicksort", "numba.np.random", "numba.cpython.unicode")
    assert [x for x in seen if x[0].startswith(heavy)] == []
