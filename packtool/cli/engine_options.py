"""Where `pack` (and `tokenize --to megatron`) runs: `@engine_options` (`--engine local|ray|slurm` and each engine's options),
parsed into `EngineOptions`, whose `run` hands the run to that engine's driver. A third
command-line module beside packtool/cli/commands.py and input_options.py; like them it only
parses options into configs and calls the library.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from packtool.cli.input_checks import explicit
from packtool.errors import ConfigError

SLURM_OPTIONS = (
    "slurm_partition",
    "account",
    "qos",
    "time_limit",
    "cpus_per_task",
    "mem",
    "sbatch_args",
    "tasks_per_job",
    "slurm_workers",
    "slurm_setup",
    "no_wait",
)
"""The options that only `--engine slurm` reads."""


@dataclass(frozen=True)
class EngineOptions:
    """The parsed `@engine_options`."""

    engine: str
    ray_address: str | None
    slurm: dict[str, Any]

    def config(self, workers: int | None) -> Any:
        """The chosen engine's config (`RayConfig`, `SlurmConfig`; None for local)."""
        if self.engine == "ray":
            from packtool.engines.ray import RayConfig

            return RayConfig(address=self.ray_address, actors=workers)
        if self.engine == "slurm":
            from packtool.engines.slurm.driver import SlurmConfig

            s = self.slurm
            return SlurmConfig(
                partition=s["slurm_partition"],
                account=s["account"],
                qos=s["qos"],
                time=s["time_limit"],
                cpus_per_task=s["cpus_per_task"],
                mem=s["mem"],
                sbatch_args=s["sbatch_args"],
                tasks_per_job=s["tasks_per_job"],
                workers=s["slurm_workers"],
                setup=s["slurm_setup"],
                wait=not s["no_wait"],
            )
        return None

    def run(self, config: Any, tokenizer: Any, workers: int | None) -> Any:
        """Run `config` (a `RunConfig`) on the chosen engine; its `PackSummary`."""
        from packtool.engines.drivers import pack_on

        return pack_on(self.engine, config, tokenizer, self.config(workers))


def engine_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the engine options; the command receives `engines: EngineOptions`."""
    options = [
        click.option(
            "--engine",
            type=click.Choice(["local", "ray", "slurm"]),
            default="local",
            show_default=True,
            help="local: this machine's cores; ray: Ray Data, on a cluster (pip install "
            "'packtool[ray]'); slurm: Slurm job arrays (docs/scale-out.md, 'Slurm').",
        ),
        click.option(
            "--ray-address",
            default=None,
            metavar="ADDR",
            help=(
                "Ray cluster to join (auto, HOST:6379, local for a new one here); default: "
                "$RAY_ADDRESS, else a new one here (never a cluster `ray start` left on this "
                "machine: give auto for that)."
            ),
        ),
        click.option("--slurm-partition", default=None, metavar="NAME", help="Slurm partition."),
        click.option("--account", default=None, metavar="NAME", help="Slurm account to charge."),
        click.option("--qos", default=None, metavar="NAME", help="Slurm quality of service."),
        click.option(
            "--time",
            "time_limit",
            default=None,
            metavar="TIME",
            help="Time limit per Slurm array task (sbatch --time).",
        ),
        click.option(
            "--cpus-per-task",
            type=click.IntRange(min=1),
            default=None,
            help="Cores per Slurm array task, its tokenizer threads [default: 1].",
        ),
        click.option("--mem", default=None, metavar="SIZE", help="Memory per task (sbatch --mem)."),
        click.option(
            "--sbatch-arg",
            "sbatch_args",
            multiple=True,
            metavar="ARG",
            help="Extra raw sbatch argument, e.g. --sbatch-arg=--requeue (repeatable).",
        ),
        click.option(
            "--tasks-per-job",
            type=click.IntRange(min=1),
            default=1,
            show_default=True,
            help="Partitions per Slurm array task (more: fewer task starts).",
        ),
        click.option(
            "--slurm-workers",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help="Pull mode: N long-lived array tasks that take partitions one after another "
            "until none is left (each task's start paid once; instead of --tasks-per-job).",
        ),
        click.option(
            "--slurm-setup",
            default=None,
            metavar="LINE",
            help="Shell line each Slurm task runs first (module load ..., source "
            "venv/bin/activate); tasks run this Python and packtool, which every node must see.",
        ),
        click.option(
            "--no-wait",
            is_flag=True,
            help="--engine slurm: submit, print the job ids and exit; the same command with "
            "--resume waits for the jobs and finishes.",
        ),
    ]

    @functools.wraps(fn)
    def wrapper(*args: Any, engine: str, ray_address: str | None, **kwargs: Any) -> Any:
        ctx = click.get_current_context()
        slurm = {name: kwargs.pop(name) for name in SLURM_OPTIONS}
        given = [
            n
            for n in SLURM_OPTIONS
            if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT
        ]
        if engine != "slurm" and given:
            # The flag as typed (`--time`), not the parameter's name (`time_limit`).
            flag = next(p.opts[0] for p in ctx.command.params if p.name == given[0])
            raise ConfigError(f"{flag} needs --engine slurm")
        if engine != "ray" and ray_address is not None:
            raise ConfigError("--ray-address needs --engine ray")
        workers_given = "workers" in kwargs and bool(explicit(ctx, ("workers",)))
        if engine == "slurm" and workers_given:  # it was ignored without a word
            raise ConfigError(
                "--workers counts this machine's worker processes (or Ray's actors); with "
                "--engine slurm the work runs in Slurm tasks: pass --slurm-workers N (pull "
                "mode) or --cpus-per-task N instead"
            )
        return fn(*args, engines=EngineOptions(engine, ray_address, slurm), **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper
