"""The engines by name (`--engine local|ray|slurm`): each one's `Driver`, made once its own
checks pass, for `packtool pack` (`pack_on`) and `packtool tokenize --to megatron`
(packtool/engines/megatron/run.py), which drive different runs with the same drivers.

    name -> driver(name, engine_config, out_dir, workers)        -> base.Driver
              local: local.local_driver                            (drive, early start,
              ray:   ray.ray_driver     (Ray imports; not hf://)    Slurm jobs taken over,
              slurm: slurm.driver.slurm_driver (sbatch --test-only) what goes after)

The engine modules never import this one: a run of one engine is `run_pack`, `run_pack_ray`
or `run_pack_slurm` there, each `base.pack_with` with its own driver.
"""

from __future__ import annotations

import os
from typing import Any

from packtool.engines.base import Driver, pack_with
from packtool.engines.config import RunConfig
from packtool.engines.summary import PackSummary
from packtool.errors import ConfigError
from packtool.tokenizer.tokenizers import Tokenizer

ENGINES = ("local", "ray", "slurm")
"""The engines, as `--engine` names them."""


def driver(
    engine: str, engine_config: Any, out_dir: str | os.PathLike, workers: int | None
) -> Driver:
    """The `Driver` of `engine` for runs into `out_dir`, after that engine's own checks.

    `engine_config`: a `ray.RayConfig` or `slurm.driver.SlurmConfig` (None: the defaults, with
    at most `workers` Ray actors); `workers`: the local engine's partition workers."""
    if engine == "local":
        from packtool.engines.local import local_driver

        return local_driver(workers)
    if engine == "ray":
        from packtool.engines.ray import RayConfig, ray_driver

        return ray_driver(engine_config or RayConfig(actors=workers), out_dir)
    if engine == "slurm":
        from packtool.engines.slurm.driver import SlurmConfig, slurm_driver

        return slurm_driver(engine_config or SlurmConfig(), out_dir)
    raise ConfigError(f"engine {engine!r} is unknown; choose {', '.join(ENGINES)}")


def pack_on(
    engine: str,
    config: RunConfig,
    tokenizer: Tokenizer | str | None = None,
    engine_config: Any = None,
    *,
    bos: int | str | None = "auto",
) -> PackSummary:
    """Pack `config` on the engine named `engine`, as `run_pack`, `run_pack_ray` or
    `run_pack_slurm` do, but with `engine_config` None Ray gets at most `config.workers`
    actors (as `--workers` gives the CLI), where `run_pack_ray` starts one per CPU; `bos` as
    `run_pack`'s."""
    return pack_with(
        config, tokenizer, driver(engine, engine_config, config.out_dir, config.workers), bos=bos
    )
