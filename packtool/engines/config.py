"""What one `packtool pack` run is asked to do: the options both engines take."""

from __future__ import annotations

from dataclasses import dataclass

from packtool.dataset.shards import ShardConfig
from packtool.engines.plan import PARTITION_SIZE, check_partition_size
from packtool.errors import OVERWRITE, RESUME, ConfigError
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from packtool.storage.local import input_list, input_text


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One `packtool pack` run."""

    inputs: tuple[str, ...]
    """Files, folders, globs, URLs: stored as a tuple of strings. One str or `os.PathLike` given
    here is one input (never the characters of its name), as `expand_inputs` takes it."""
    out_dir: str
    pack: PackConfig
    shards: ShardConfig = ShardConfig()
    read: ReadConfig = ReadConfig()
    chunk_docs: int = 100_000
    """Documents per packing chunk inside a partition: bounds a worker's memory. Chunks hand
    their part-empty rows on (packtool/pack/tail.py), so their size costs no efficiency."""
    partition_size: int = PARTITION_SIZE
    """Target input bytes per partition, the unit of parallel work and of resume
    (packtool/engines/plan.py). The output depends on it, never on the number of workers."""
    workers: int | None = None
    """Partition workers (local engine: processes on this machine; default: one per core, at
    most one per partition). The output does not depend on it."""
    overwrite: bool = False
    resume: bool = False
    command: str = ""
    """The command line, recorded in the manifest."""
    progress: bool | None = None
    """Draw a progress bar (default: when stderr is a terminal)."""

    def __post_init__(self) -> None:
        inputs = tuple(input_text(i) for i in input_list(self.inputs))
        object.__setattr__(self, "inputs", inputs)  # frozen: set once, here
        if not isinstance(self.chunk_docs, int) or self.chunk_docs < 1:
            raise ConfigError(f"chunk_docs must be a positive integer, got {self.chunk_docs!r}")
        check_partition_size(self.partition_size)
        if self.workers is not None and (not isinstance(self.workers, int) or self.workers < 1):
            raise ConfigError(f"workers must be a positive integer, got {self.workers!r}")
        if self.overwrite and self.resume:
            raise ConfigError(f"{OVERWRITE} and {RESUME} exclude each other; choose one")


REDACTED = "<redacted>"
"""What the CLI's recorded command holds where it hid a secret (`cli/command_line.py`)."""


def resume_command(command: str) -> str | None:
    """`command` as the one that finishes its run: `--resume` once, without `--overwrite` (the
    two exclude each other) or `--no-wait` (it would submit nothing and wait for nothing).
    None where a secret was hidden in it (`REDACTED`): copied, it would fail; the caller says
    "the same command with --resume" instead."""
    import shlex

    if REDACTED in command:
        return None
    try:
        words = shlex.split(command)
    except ValueError:  # not a shell line (an API caller's own text): say it in words
        return f"{command} --resume"
    kept = [w for w in words if w not in ("--overwrite", "--no-wait", "--resume")]
    return shlex.join([*kept, "--resume"])
