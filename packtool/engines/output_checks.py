"""What `packtool pack` checks of its output before it changes anything there.

- `check_replaceable`: an output that holds anything is replaced only with `--overwrite`, and
  never when it holds files `pack` did not write (`written_by_pack`).
- `finish_switch`: a run killed after it wrote its dataset's `index.json` (written last) but
  before its switch left a complete dataset in its staging; it is switched in, as it would have
  been, only when that is safe (`output_versions.switch_problem`: a manifest of a packtool
  dataset, every shard it lists there whole, nothing else in the folder) and only by a run that goes
  on: `--resume` (then nothing is left to resume) or `--overwrite` once its own checks passed.
  `--resume` switches it in only when it was made by the run's options and inputs
  (`resume_checks.check_built`, refused as an unfinished run's resume is).
  A plain run is refused with a line saying so, and changes nothing.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from packtool.dataset.names import written_entry
from packtool.dataset.output import OutputPaths, commit, output_paths, remove
from packtool.dataset.output_versions import is_version, ours, switch_problem
from packtool.engines import records
from packtool.engines.config import RunConfig
from packtool.engines.resume_checks import check_built
from packtool.errors import OVERWRITE, RESUME, ConfigError
from packtool.storage import local as storage

STATE_DIR = records.RUN_DIR


def check_replaceable(paths: OutputPaths, overwrite: bool) -> None:
    """Refuse an output that holds anything without `overwrite`, and one holding files `pack`
    did not write even with it."""
    out, shown = paths.target, paths.shown
    # A prefix's listing says it all (none: empty), with no HEAD and listing of `is_dir` first;
    # with each entry's kind (an object, or a prefix: keys under it).
    present = storage.scan_dir(out) if paths.remote or storage.is_dir(out) else []
    if paths.remote:  # its lock and staging objects are inside the prefix
        present = [(p, f) for p, f in present if not p.name.startswith(".packtool-")]
    if present and not overwrite:
        raise ConfigError(
            f"output folder {shown} is not empty; pass {OVERWRITE} to replace it "
            f"or {RESUME} to finish an interrupted run"
        )
    foreign = sorted({p.name for p, f in present if not written_by_pack(p, f)})
    if foreign:
        # --overwrite replaces a dataset; it never deletes files packtool did not write.
        shown_files = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ConfigError(
            f"{OVERWRITE}: {shown} holds files packtool pack did not write ({shown_files}); "
            "choose an empty folder or remove them yourself"
        )


def written_by_pack(path: Path, file: bool) -> bool:
    """Shards, the manifest and its list of sources, the run state (also an older packtool's),
    temporaries (`names.written_entry`; not tokenize's parts, which `pack` never writes); in a
    bucket a version folder. `file`: the entry is a regular file (not a link), or an object (not
    a prefix), as its folder's listing (`scan_dir`) says. By name and kind: a folder named
    shard-x.parquet holding notes was deleted, and in a bucket, a prefix of that name (until
    2026-12-06: a listing's every entry was taken for an object there)."""
    name = path.name
    if written_entry(name, file, parts=False):
        return True
    # a version of a dataset on an object store: a prefix (no object) holding packtool's names
    return not file and is_version(name) and ours(path)


def finish_switch(
    config: RunConfig, paths: OutputPaths, fingerprint: dict[str, Any]
) -> OutputPaths:
    """Switch in the dataset an earlier run left in `paths.staging` with its `index.json`
    written, when safe and asked (`--resume`; the module docstring); the paths the run then
    builds into. With `--overwrite` a staging packtool wrote is left to the run's checks,
    which discard it (the run replaces the output itself: one that fails leaves it as it was).
    `fingerprint`: the run's, which a `--resume` must share with the one that built it.

    Raises:
        ConfigError: it is not safe to switch in (and `--overwrite`, which discards a staging
            packtool wrote, was not given), the run is a plain one, or a `--resume` of other
            options or inputs.
    """
    problem = switch_problem(paths.staging)
    if config.overwrite and not config.resume and ours(paths.staging):
        # Discarded by the run's checks, as any unfinished run's staging: this run replaces
        # the output itself. (It was switched in first, so an --overwrite that then failed,
        # "nothing was committed", had replaced the old dataset with the killed run's.)
        return paths
    if problem is not None:
        mine = ours(paths.staging)
        raise ConfigError(
            f"{paths.shown}: {paths.staging}, left by an earlier run, is not switched in: "
            f"{problem}; "
            + (f"pass {OVERWRITE} to discard it" if mine else "move or remove it yourself")
        )
    if not (config.resume or config.overwrite):
        raise ConfigError(
            f"{paths.shown}: a run killed before its switch left a complete dataset in "
            f"{paths.staging}; pass {RESUME} to switch it in, or {OVERWRITE} to discard it and "
            "build anew"
        )
    if config.resume and not config.overwrite:
        check_built(fingerprint, paths.staging, paths.shown)  # a refused run switches nothing
    if config.overwrite:
        check_replaceable(paths, overwrite=True)  # a refused run switches nothing
    remove(paths.staging / STATE_DIR)
    commit(paths)
    # On a bucket: the next run's new version (under the same lock).
    return dataclasses.replace(output_paths(config.out_dir), held=paths.held)
