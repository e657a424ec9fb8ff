"""The engine options of the command line (packtool/cli/engine_options.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli import one_error_line, run

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"


@pytest.mark.parametrize(
    "flag,value", [("--time", "1:00:00"), ("--sbatch-arg", "--requeue"), ("--qos", "x")]
)
def test_a_slurm_option_without_the_slurm_engine_names_the_flag_typed(tmp_path, flag, value):
    """`--time` without --engine slurm said `--time-limit needs --engine slurm` (the option's
    internal name), `--sbatch-arg` said `--sbatch-args`."""
    code, _, err = run("pack", SAMPLE, "-o", tmp_path / "out", flag, value)
    assert code != 0 and one_error_line(err) == f"error: {flag} needs --engine slurm", err


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_the_ray_address_help_gives_the_default_the_engine_uses(command):
    """The help said the default was ray.init's, a cluster `ray start` left on this machine
    included; the engine starts a private Ray there unless RAY_ADDRESS is set (RayConfig,
    docs/scale-out.md)."""
    code, out, _ = run(command, "--help")
    help_text = " ".join(out.split())
    assert code == 0
    assert (
        "default: $RAY_ADDRESS, else a new one here (never a cluster `ray start` left" in help_text
    )
