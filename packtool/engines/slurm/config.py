"""The Slurm engine's options (`SlurmConfig`) and the names of its files in the run's state."""

from __future__ import annotations

from dataclasses import dataclass

from packtool.errors import ConfigError, option_choice

SLURM_DIR = "slurm"
"""Inside the run state folder: the context, the task descriptors and scripts, the jobs."""
JOBS_DIR = "jobs"
"""One small file per submitted job (written once): which partitions each of its tasks runs."""
CLAIMS_DIR = "claims"
"""Pull mode: one file per partition a worker took (`PPPPPP`, holding its `JOB_TASK`)."""
ERRORS_DIR = "errors"
"""One file per partition whose task raised a packtool error (`PPPPPP-JOB_TASK.json`: the
error's class and line), which the driver raises as itself instead of resubmitting."""
PROBE_OK = "probe-ok"
"""Written into the run's Slurm folder by the probe job from a node: the nodes see it."""


@dataclass(frozen=True)
class SlurmConfig:
    """How the Slurm engine submits (docs/scale-out.md, "Slurm")."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    """Per task, as sbatch takes it (`1:00:00`)."""
    cpus_per_task: int | None = None
    """Cores per task (default 1): the task's tokenizer threads (at most the CPUs it may run on:
    `task._cpus`)."""
    mem: str | None = None
    sbatch_args: tuple[str, ...] = ()
    """Raw extra sbatch arguments (`--constraint=cpu`, `--requeue`, ...)."""
    tasks_per_job: int = 1
    """Partitions per array task: more amortises the task's start (imports, tokenizer load)."""
    workers: int | None = None
    """Pull mode (`--slurm-workers N`, packtool/engines/slurm/pilots.py): N long-lived array
    tasks, each taking the next unclaimed partition until none is left, so a task's start and
    Slurm's scheduling are paid N times a run, not once per partition. None: fixed shares of
    `tasks_per_job` partitions."""
    setup: str | None = None
    """A shell line run before each task (`module load ...`, `source venv/bin/activate`): where it
    ends non-zero the task stops with that status; after it the task goes back to the driver's
    working folder (`arrays.ArrayDriver._setup`)."""
    wait: bool = True
    """False: submit, print the job ids and return (`Detached`); `--resume` finishes."""
    max_retries: int = 3
    """Times a partition is resubmitted after the task that had it ended without it."""
    poll_seconds: float = 1.0

    def __post_init__(self) -> None:
        for name, flag in (
            ("tasks_per_job", "--tasks-per-job"),
            ("cpus_per_task", "--cpus-per-task"),
            ("workers", "--slurm-workers"),  # pack's --workers is another option
        ):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ConfigError(f"{flag} / {name} must be an integer >= 1, got {value!r}")
        if not isinstance(self.max_retries, int) or self.max_retries < 0:
            raise ConfigError(f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        if self.workers is not None and self.tasks_per_job != 1:
            raise ConfigError(
                f"{option_choice('--slurm-workers', 'workers', 'N')} and "
                f"{option_choice('--tasks-per-job', 'tasks_per_job', 'N')} exclude each other: "
                "workers take partitions one after another until none is left"
            )

    def options(self, name: str) -> list[str]:
        """The sbatch options every task of the run gets."""
        out = [f"--job-name={name}"]
        for flag, value in (
            ("--partition", self.partition),
            ("--account", self.account),
            ("--qos", self.qos),
            ("--time", self.time),
            ("--cpus-per-task", self.cpus_per_task),
            ("--mem", self.mem),
        ):
            if value is not None:
                out.append(f"{flag}={value}")
        return out + list(self.sbatch_args)
