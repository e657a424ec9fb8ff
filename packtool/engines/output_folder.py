"""The output folder of every `packtool pack` run, whichever engine runs it (after
`preflight.check_inputs`, before the first chunk).

`output_folder`: lock the output (one writer), check it, and build the new dataset in a staging
folder beside it (or load the state of the run to resume there); swap it in only when complete,
so a failure never harms the old dataset, and remove the staging folder of a fresh run that
fails, so that the corrected command needs no `--overwrite` (`packtool/dataset/output.py`).
`discard_staging` is that rule, which `tokenize --to megatron` keeps its staging folder by too.
The run's state itself (plan, partition records) is packtool/engines/records.py: it stays in
the staging folder until the switch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.dataset import hub_record
from packtool.dataset.manifest import INDEX_FILE
from packtool.dataset.names import OLD_STATE
from packtool.dataset.output import (
    OutputPaths,
    make_staging,
    output_paths,
    remove,
    remove_staging,
    staging_version,
    transaction,
)
from packtool.engines import records
from packtool.engines.config import RunConfig
from packtool.engines.output_checks import check_replaceable, finish_switch
from packtool.errors import (
    OVERWRITE,
    RESUME,
    AlreadyComplete,
    ConfigError,
    Detached,
    PacktoolError,
    StagingKept,
    option_choice,
)
from packtool.storage import hub
from packtool.storage import local as storage

STATE_DIR = records.RUN_DIR
"""The run's state in its staging folder (packtool/engines/records.py)."""

COMPLETE = "complete"
"""The state `output_folder` yields for `--resume` of a dataset whose run finished."""


@dataclass(frozen=True)
class Output:
    """What `output_folder` yields: where the run writes, and the run it resumes."""

    work: Path
    """The staging folder beside the output: every file of this run goes here, and it becomes
    the output when the run completes (`packtool.dataset.output.commit`)."""
    state: dict[str, Any] | None
    """The saved plan and fingerprint of the interrupted run to resume (`records.read_plan`),
    or None for a fresh run."""
    fingerprint: dict[str, Any] | None = None
    """The run's fingerprint (`preflight.fingerprint_of`), as `output_folder` checked a resume
    with it."""


@contextmanager
def output_folder(config: RunConfig, fingerprint: dict[str, Any]) -> Iterator[Output]:
    """Lock `config.out_dir`, prepare its staging folder, and swap it in when the body succeeds.
    `fingerprint`: the run's (`fingerprint_of`), which a resumed run's must match.

    The old output is untouched until the new one is complete (`index.json` written): then one
    `packtool.dataset.output.commit` replaces it. When the body fails, the staging folder of a fresh run
    is removed on a `PacktoolError` (a mistake: the corrected command is another run, which could
    not resume this one) and on any other error before a partition was recorded; it is kept, for
    `--resume`, on Ctrl-C, on other errors after a finished partition (a full disk), on a
    `StagingKept` (lost workers, a failure in the tail tree after every partition finished),
    and always in a resumed run. Parent folders this run created are removed when
    empty.
    """

    def prepare(paths: OutputPaths) -> dict[str, Any] | None:
        if paths.whole_object:
            raise ConfigError(
                f"{paths.shown}: a packed dataset is a folder (a prefix in a bucket), not one "
                ".parquet object; drop the .parquet"
            )
        if paths.hub and storage.is_file(paths.staging / INDEX_FILE):
            landed = hub_record.landed(paths.staging, paths.target)  # its answer was lost
            if landed is not None:
                remove_staging(paths)  # the build and its record: committed
                if config.resume:
                    raise AlreadyComplete(
                        f"{paths.shown}: the earlier run's commit reached the Hub after all "
                        f"({landed}): nothing to resume, nothing done",
                        paths.shown,
                    )
        if paths.hub and storage.is_file(paths.staging / INDEX_FILE) and not config.resume:
            # A Hub commit refused (or a run killed just before it): published only when asked.
            if not config.overwrite:
                raise ConfigError(
                    f"{paths.shown}: a dataset an earlier run built waits in {paths.staging} "
                    f"(its commit to the Hub did not happen); pass {RESUME} to commit it or "
                    f"{OVERWRITE} to start over"
                )
            remove(paths.staging)
        # (A bucket's version `.packtool-staging` does not name is this run's new one: empty.)
        built = not paths.remote or _named(paths)
        if built and storage.is_file(paths.staging / INDEX_FILE):
            # A run killed after writing index.json (written last) but before its swap.
            paths = finish_switch(config, paths, fingerprint)
            if config.resume:  # it said "already complete ... nothing done" for a commit it made
                raise AlreadyComplete(
                    f"{paths.shown}: committed the dataset the interrupted run had built (its "
                    f"{INDEX_FILE} was written before the switch): nothing else to resume",
                    paths.shown,
                )
        return _prepare(config, paths)

    def discard(exc: BaseException, state: dict[str, Any] | None) -> bool:
        return discard_staging(exc, state, output_paths(config.out_dir).staging)

    command = config.command or "packtool pack"
    with transaction(config.out_dir, command, prepare, discard) as (paths, state):
        # The run's state stays in the staging until `commit` (`names.RUN_STATE`).
        yield Output(work=paths.staging, state=state, fingerprint=fingerprint)


def built_here(out_dir: str | os.PathLike, engine: str) -> None:
    """Refuse an `hf://` output to an engine whose workers run on other machines: it is built
    in this machine's scratch folder and committed to the Hub once (packtool/storage/hub.py)."""
    if hub.is_hub(out_dir):
        raise ConfigError(
            f"{out_dir}: an hf:// output is built on this machine and committed to the Hub in "
            f"one commit, and the {engine} engine builds on other machines; use "
            f"{option_choice('--engine', 'engine', 'local')}, or pack to a bucket or a shared "
            "folder and upload that"
        )


def staging_folder(out_dir: str | os.PathLike) -> Path:
    """Where a run into `out_dir` builds its output (and keeps an interrupted run's state)."""
    return output_paths(out_dir).staging


def _prepare(config: RunConfig, paths: OutputPaths) -> dict[str, Any] | None:
    """Check the output and its staging folder; return the saved state when resuming.

    Nothing is removed from the output itself: `--overwrite` only allows `commit` to replace it.
    """
    out, shown = paths.target, paths.shown
    # Each check is a request or two before the run on a store (~10-50 ms apiece): a prefix is
    # in the way only as an object (one HEAD), and holds no mount point.
    folder = not paths.remote and storage.is_dir(out)
    in_the_way = storage.is_file(out) if paths.remote else not folder and storage.exists(out)
    if in_the_way:
        raise ConfigError(f"output {shown} exists and is not a folder")
    if folder and storage.is_mount(out):
        raise ConfigError(
            f"output {shown} is a mount point, which packtool cannot swap a new dataset into; "
            "write to a folder inside it"
        )
    if config.resume:
        return _load_state(paths)
    if paths.remote:  # a staging version is there only where `.packtool-staging` names it (a
        there = _named(paths)  # new one's name is this run's own: a time and a random tag)
        abandoned = there and records.never_planned(paths.staging)
    else:
        abandoned = _abandoned(paths)
        there = abandoned or storage.exists(paths.staging)
    if there:
        if not abandoned and not config.overwrite:
            done = len(records.finished_partitions(paths.staging))
            left = f"{done:,} finished partition{'s' if done != 1 else ''}" if done else "plan"
            raise ConfigError(
                f"an interrupted run into {shown} left its {left} in {paths.staging}; pass "
                f"{RESUME} to finish it or {OVERWRITE} to start over"
            )
        # (Without a saved plan it was killed while it checked or planned: nothing to keep.)
        from packtool.engines.slurm.state import stop_jobs

        stop_jobs(paths.staging, config.out_dir)  # a detached Slurm run's: gone first
        paths = remove_staging(paths, leftover=True)
    check_replaceable(paths, config.overwrite)
    make_staging(paths)
    return None


def _abandoned(paths: OutputPaths) -> bool:
    """Whether the staging folder is what a run killed before it saved its plan leaves
    (`records.never_planned`: nothing, or the plan's temporary). Asked under the output's lock,
    so never of a live run's folder. A remote output's staging is the version its
    `.packtool-staging` object names (else a fresh run's new version: not abandoned)."""
    if paths.remote:
        return _named(paths) and records.never_planned(paths.staging)
    return storage.is_dir(paths.staging) and records.never_planned(paths.staging)


def _named(paths: OutputPaths) -> bool:
    """Whether the remote output's `.packtool-staging` names the version this run would build
    (an earlier run's, left behind), not a new one (read once under the lock: no request
    after the first, `output_versions.staging_known`)."""
    return staging_version(paths.target) == paths.staging.name


def _load_state(paths: OutputPaths) -> dict[str, Any]:
    out, shown = paths.target, paths.shown
    if _abandoned(paths):
        if storage.exists(out / INDEX_FILE):  # an --overwrite killed early: the old dataset
            return {COMPLETE: True}  # `check_complete` decides, once the options are known
        raise ConfigError(
            f"{shown}: the interrupted run stopped before it saved its plan, so there is "
            f"nothing to resume; run again without {RESUME}"
        )
    if not storage.is_dir(paths.staging / STATE_DIR):
        if storage.exists(out / INDEX_FILE):
            return {COMPLETE: True}  # `check_complete` decides, once the options are known
        if any(storage.exists(where / old) for where in (out, paths.staging) for old in OLD_STATE):
            raise ConfigError(
                f"{shown} holds a run interrupted by an older packtool, which this one cannot "
                f"finish; start over with {OVERWRITE}"
            )
        if not _holds_anything(paths) and not storage.exists(paths.staging):
            raise ConfigError(f"{shown} does not exist: nothing to resume; drop {RESUME}")
        raise ConfigError(f"{shown}: no interrupted run to resume; use {OVERWRITE}")
    return records.read_plan(paths.staging)


def _holds_anything(paths: OutputPaths) -> bool:
    """The output exists (a remote one: holds more than this run's own lock object)."""
    if not paths.remote:
        return storage.exists(paths.target)
    return any(not p.name.startswith(".packtool-") for p in storage.list_dir(paths.target))


def discard_staging(exc: BaseException, state: dict[str, Any] | None, staging: Path) -> bool:
    """Whether a failed run's staging folder goes (see `output_folder`; `tokenize --to
    megatron` keeps its staging folder by the same rule). When it goes, so do a bucket output's
    Slurm files in the current folder (`slurm.state.remove_scratch`: on a file system they are
    in the staging folder); kept with it, they are what a `--resume` re-attaches with."""
    drop = _discarded(exc, state, staging)
    if drop and storage.is_remote(staging):
        from packtool.engines.slurm.state import remove_scratch

        remove_scratch(staging)
    return drop


def _discarded(exc: BaseException, state: dict[str, Any] | None, staging: Path) -> bool:
    if isinstance(exc, Detached):
        return False  # the run goes on in a scheduler's jobs: they write into the staging folder
    if not isinstance(exc, Exception) or state is not None:
        return False  # Ctrl-C / SystemExit, or a resumed run: keep the work for --resume
    if isinstance(exc, PacktoolError) and not isinstance(exc, StagingKept):
        return True  # a mistake: the corrected command is another run (not workers that died,
        # nor the tail tree failing after every partition finished: `StagingKept`)
    return not records.finished(staging)
