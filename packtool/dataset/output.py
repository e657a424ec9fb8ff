"""Where a command's output is built, who may build it, and how it replaces the old one.

`packtool pack` and `packtool tokenize` both write through here:

- **One writer per output.** `OutputLock` holds `fcntl.flock` on a hidden lock file beside the
  output for the life of the run; the file records pid, host, start time and command, so a second
  writer is refused at once with a line naming the first. The kernel drops the lock when its
  process dies (kill -9 included), so a lock left by a dead run is stale by construction: the
  next run takes it without asking.
- **Built beside, swapped in whole.** A run writes into a hidden staging path next to the output
  (`.NAME.packtool-staging`) and `commit` swaps it in with a fixed number of renames, whatever
  its size: staging -> `.NAME.packtool-ready` (the mark that it is complete), the old output ->
  `.NAME.packtool-old`, ready -> NAME, then the old one is deleted. A run killed between those
  renames is finished by `recover`, which every writer calls first (under the lock): a ready
  folder is moved in, a leftover old one deleted, so the output is always the old dataset or
  the new one, never a mixture. A file output (tokenize's `OUT.parquet`) is one atomic
  `os.replace`.
- **One sequence.** `transaction` runs these steps in their one order for every command (create
  the parent, lock, recover, the command's own checks and staging, its work, commit; on failure
  the staging discarded when the command says so and the parents it created removed): `pack`
  (packtool/engines/output_folder.py), `tokenize` (packtool/tokenize/tokenize.py) and `tokenize
  --to megatron` (packtool/engines/megatron/run.py: its own recovery and swap of the pair)
  differ only in what they check, keep and write.
- **Apart from the inputs.** `check_apart` refuses an output inside an input folder (a later run
  would read its own output) and an input inside the output (a replacement would delete it),
  on resolved paths, before anything is read or removed.

The staging, ready and old names sit in the output's parent folder, so they are on the output's
file system (a rename never copies) and hidden from the folder walk of `corpus.expand_inputs`.

**On an object store** (`-o s3://bucket/prefix`: nothing renames there) the same steps keep the
same guarantees with other means (docs/remote.md, "Writing"). Under the prefix:

    index.json            the commit: a link naming the current version ({"packtool_dataset": V})
    V/                    a version: shards and its own index.json, byte for byte a local dataset
    .packtool-lock        the lock object (a conditional put, renewed under a lease)
    .packtool-staging     the run in progress: names the version it builds (its staging)
                          and the one the link named when it began (what it may replace)

A run builds a fresh version `v-<time>-<random>/` (the staging), writing each object once and
whole; `commit` writes the link `index.json`, last (the switch: readers see the old dataset or
the new one), then deletes the run's state, `.packtool-staging` (after the state) and the old
version. `recover` deletes any version neither the link nor the staging names (left by a run
killed after its switch) and aborts unfinished multipart uploads in versions (no other writer
is alive: the lock is held). What each deletes: packtool/dataset/output_versions.py. A run
confirms it still holds the lock (a conditional renewal) before it creates `.packtool-staging`
(conditionally: only where none is) and before its link; a `.packtool-staging` whose run was
to replace a version the link no longer names is a lost lock's leftover, dropped by `recover`.
A committed version's objects never change: a later run always writes a new one, and a run
that discards an unfinished one (`remove_staging`) builds a version of another name.

**On the Hugging Face Hub** (`-o hf://...`: every object written there is a commit) the output
is built like a local one, in a staging folder under this machine's scratch folder with a lock
file beside it, and `commit` publishes it in one Hub commit (the version, the link, the old
version's deletion), made on top of the head `recover` read under the lock, so the Hub refuses
it if anyone committed since (packtool/storage/hub.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from packtool.dataset import hub_record
from packtool.dataset.manifest import INDEX_FILE, link_bytes
from packtool.dataset.names import RUN_STATE, check_name_fits
from packtool.dataset.output_versions import (
    REMOTE_STAGING,
    clean_after_switch,
    collect,
    create_staging_record,
    current_version,
    new_version,
    ours,
    remove,
    remove_staging_record,
    staging_known,
    staging_version,
    switch_problem,
)
from packtool.errors import RESUME, AlreadyComplete, ConfigError, Detached, json_value, one_line
from packtool.storage import hub, remote_write, writing
from packtool.storage import local as storage

STAGING_SUFFIX = ".packtool-staging"
READY_SUFFIX = ".packtool-ready"
OLD_SUFFIX = ".packtool-old"
LOCK_SUFFIX = ".packtool-lock"
REMOTE_LOCK = ".packtool-lock"
"""The objects under a remote output's prefix that hold its lock and name its run in progress."""
_rename = writing.rename  # every rename of the swap goes through here (tests interrupt it)
T = TypeVar("T")


def object_lock(target: Any) -> Any:
    """The lock of an output written as one object (a file of a bucket, a Megatron `.idx`):
    the lock object beside it, or on the Hub the repository's lock file."""
    return (
        hub.lock_file(target)
        if hub.is_hub(target)
        else target.parent / f".{target.name}{LOCK_SUFFIX}"
    )


@dataclass(frozen=True)
class OutputPaths:
    """The output and the hidden names beside it (all absolute, symlinks resolved)."""

    shown: str
    """The output as the user gave it, for messages."""
    target: Path
    staging: Path
    ready: Path
    old: Path
    lock: Path
    remote: bool = False
    """An object store's prefix: the versions protocol (the module docstring)."""
    whole_object: bool = False
    """One object in a store (`tokenize -o s3://.../OUT.parquet`): built in a local scratch
    file (the staging) and uploaded whole by `commit` (an object appears complete or not at
    all); the lock object beside it."""
    hub: bool = False
    """A folder on the Hugging Face Hub (`hf://`): built in a local staging folder under this
    machine's scratch folder, locked by a file beside it, and published by `commit` in one Hub
    commit (packtool/storage/hub.py)."""
    held: OutputLock | None = dataclasses.field(default=None, compare=False, repr=False)
    """The lock `transaction` holds on the output (`make_staging` checks it is still held)."""


_NEW_VERSIONS: dict[str, str] = {}
"""The version a fresh run of this process builds into each remote output (until it is named)."""
_HUB_PARENTS: dict[str, str | None] = {}
"""The head of each Hub output's repository when this process took its lock (`recover`)."""


def output_paths(out: str | os.PathLike, *, read_staging: bool = True) -> OutputPaths:
    """The paths of output `out`. A symlinked output is written where the link points. A remote
    output's staging is the version its `.packtool-staging` object names, else a new one
    (`read_staging=False`: a new one, unread: what `transaction` locks and recovers with, the
    staging read under the lock)."""
    if storage.is_remote(out) and str(out).lower().endswith(".parquet"):
        target = storage.as_path(str(out))
        return OutputPaths(
            shown=str(out),
            target=target,
            staging=writing.temporary_name(target),  # local: uploaded by `commit`
            ready=target,
            old=target,
            lock=object_lock(target),
            remote=True,
            whole_object=True,
        )
    if hub.is_hub(out):
        if not hub.parse(out).path_in_repo:  # README.md and .gitattributes live there
            raise ConfigError(
                f"{out}: name a folder inside the repository for the dataset "
                f"({str(out).rstrip('/')}/PREFIX); its root holds files packtool did not write"
            )
        target = storage.as_path(str(out).rstrip("/"))
        scratch = hub.scratch_folder(target)
        return OutputPaths(
            shown=str(out),
            target=target,
            staging=scratch / "staging",
            ready=scratch / "staging",
            old=scratch / "staging",
            lock=hub.lock_file(target),
            hub=True,
        )
    if storage.is_remote(out):
        target = storage.as_path(str(out).rstrip("/"))
        named = staging_version(target) if read_staging else None
        version = named or _NEW_VERSIONS.setdefault(str(target), new_version())
        return OutputPaths(
            shown=str(out),
            target=target,
            staging=target / version,
            ready=target / version,
            old=target / version,
            lock=target / REMOTE_LOCK,
            remote=True,
        )
    target = storage.resolve(out)
    side = target.parent / f".{target.name}"
    return OutputPaths(
        shown=os.fspath(out),
        target=target,
        staging=Path(f"{side}{STAGING_SUFFIX}"),
        ready=Path(f"{side}{READY_SUFFIX}"),
        old=Path(f"{side}{OLD_SUFFIX}"),
        lock=Path(f"{side}{LOCK_SUFFIX}"),
    )


def make_staging(paths: OutputPaths) -> None:
    """Create the staging output: a new folder; on an object store the `.packtool-staging`
    object naming the version the run builds."""
    if paths.remote:
        # Only by the lock's holder: checked now (a writer stalled past its lease, the lock
        # taken over, must not name its run over another's), and created only where no other
        # run's object is (a conditional put where the store has one). What the link names now
        # is recorded: a run is switched in only over that version (`collect` drops it else).
        if paths.held is not None:
            paths.held.confirm()
        record = {"version": paths.staging.name, "replaces": current_version(paths.target)}
        if not create_staging_record(paths.target, record):
            raise ConfigError(
                f"{paths.shown}: another run's {REMOTE_STAGING} appeared under the output while "
                "this one held its lock (another writer took it over?); nothing was committed"
            )
        return
    if paths.hub:  # what the run replaces, for a commit made later (`--resume`) to check
        hub_record.begin(paths.staging, current_version(paths.target))
    writing.make_dir(paths.staging)


def remove_staging(paths: OutputPaths, *, leftover: bool = False) -> OutputPaths:
    """Delete the staging output; return the paths a fresh run then builds into. On an object
    store: the version's objects, then the object naming it, and the fresh run gets a new
    version (never the discarded one, into which a job of the discarded run, still alive,
    could yet upload), after aborting the version's unfinished multipart uploads (the staging
    object going, no later `recover` would). `leftover`: another run's (killed, or anything
    at that name), so a local folder holding files packtool did not write is refused."""
    if paths.remote and paths.held is not None:
        # Only by the lock's holder, asked now: `.packtool-staging` is known from when the
        # lock was taken (`staging_known`), and a writer stalled past its lease took the
        # record of the writer that took the lock over for its own, and deleted it.
        paths.held.confirm()
    committed = paths.remote and not paths.whole_object
    committed = committed and paths.staging.name == current_version(paths.target)
    if paths.remote and not paths.whole_object and not committed:
        remote_write.abort_uploads(paths.staging)
    if leftover and not paths.remote and not paths.hub and storage.is_dir(paths.staging):
        _check_ours(paths.staging, paths)  # a user's notes in it were deleted with --overwrite
    if not committed:  # the version the link names is a dataset: never touched
        remove(paths.staging)
    if paths.hub:
        hub_record.remove(paths.staging)  # a stale record would refuse the next commit
    if not paths.remote or paths.whole_object:
        return paths
    if staging_version(paths.target) == paths.staging.name:  # never another run's
        remove_staging_record(paths.target)
    version = _NEW_VERSIONS[str(paths.target)] = new_version()
    fresh = paths.target / version
    return dataclasses.replace(paths, staging=fresh, ready=fresh, old=fresh)


class OutputLock:
    """An exclusive lock (`storage.writing.take_lock`) on `paths.lock`, held from `__enter__` to
    `__exit__`.

    Raises:
        ConfigError: (on enter) another live process holds the lock; the message names it.
    """

    def __init__(self, paths: OutputPaths, command: str = "") -> None:
        self.paths = paths
        self.command = command
        self._held: writing.HeldLock | None = None

    def __enter__(self) -> OutputLock:
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "tag": remote_write.host_tag(),  # its pid namespace: whose pids it may ask about
            "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": self.command[:300],
        }
        try:
            self._held = writing.take_lock(self.paths.lock, json.dumps(info).encode())
        except writing.LockBusy as busy:
            raise ConfigError(
                f"{self.paths.shown} is being written by another packtool "
                f"({_describe_holder(busy.holder)}); wait for it to finish or stop it"
            ) from None
        except OSError as exc:  # the first write of a run: name the output as given
            raise ConfigError(f"cannot write {self.paths.shown} ({exc.strerror or exc})") from None
        return self

    def confirm(self) -> None:
        """Make sure this run still holds the lock (an object store's: renewed now, on the
        condition that it is still this holder's), before a write that names the run.

        Raises:
            ConfigError: another writer took the lock over.
        """
        if not self.holds():
            raise ConfigError(
                f"{self.paths.shown}: another writer took over this run's lock (its lease ran "
                "out unrenewed); nothing was committed"
            )

    def holds(self) -> bool:
        """`confirm` without the error: whether this run still holds the lock."""
        confirm = getattr(self._held, "confirm", None)
        return confirm is None or bool(confirm())

    @property
    def lost(self) -> bool:
        """Another writer took the lock over (an object store's lease ran out unrenewed)."""
        return bool(getattr(self._held, "lost", False))

    def __exit__(self, *exc: object) -> None:
        if self._held is not None:
            self._held.release()
            self._held = None


def _still_held(lock: OutputLock) -> bool:
    """`lock.holds()` for a failed run; True where that cannot be told (the store out of reach:
    the run's own error stands)."""
    try:
        return lock.holds()
    except Exception:
        return True


def _describe_holder(note: bytes) -> str:
    try:
        info = json_value(note or b"{}")
        if not isinstance(info, dict):
            info = {}
    except ValueError:
        info = {}
    if "pid" not in info:
        return "a process that is starting up"
    command = info.get("command") or "packtool"
    return (
        f"pid {info['pid']} on {info.get('host', '?')}, since {info.get('started', '?')}: {command}"
    )


def recover(paths: OutputPaths) -> None:
    """Finish a replacement that a killed run left half done; call with the lock held.

    A ready folder is complete (it was renamed from staging only when complete): it becomes the
    output. An old folder beside an output is the dataset it replaced: deleted. An old folder
    with no output (a failure between two renames of `commit`) is put back.
    """
    if paths.hub:
        # The commit `commit` makes is on top of the head seen now, under the lock: the Hub
        # refuses it if anyone committed in between. A single commit leaves nothing to finish.
        _HUB_PARENTS[str(paths.target)] = hub.head(paths.target, paths.shown)
        return
    if paths.whole_object:
        if not hub.is_hub(paths.target):
            remote_write.abort_uploads(paths.target, exact=True)  # a killed upload's parts
        return
    if paths.remote:
        collect(paths.target)
        return
    # Only folders packtool writes are moved or deleted: a `.OUT.packtool-ready` or `-old`
    # that is anything else (made by hand, by another tool) made the next run swap the user's
    # OUT aside and delete it, without --overwrite.
    if storage.exists(paths.ready):
        _check_ours(paths.ready, paths)
        _check_complete(paths.ready, paths)
        if storage.lexists(paths.target) and not storage.lexists(paths.old):
            _check_ours(paths.target, paths)
            _rename(paths.target, paths.old)
        _rename(paths.ready, paths.target)
        writing.sync_dir(paths.target.parent)
    if storage.lexists(paths.old):
        _check_ours(paths.old, paths)
        if storage.lexists(paths.target):
            remove(paths.old)
        else:
            _rename(paths.old, paths.target)


def _check_complete(folder: Path, paths: OutputPaths) -> None:
    """A ready folder is renamed from a complete staging only: a packed dataset that may be
    switched in (`switch_problem`), or a tokenize run's part files. An empty one (made by hand)
    replaced the user's dataset without --overwrite."""
    if storage.is_file(folder / INDEX_FILE):
        why = switch_problem(folder)
    else:
        parts = [e for e in storage.list_dir(folder) if e.name.startswith("part-")]
        why = None if parts else "it holds no dataset"
    if why is not None:
        raise ConfigError(
            f"{folder} (beside output {paths.shown}) is not a complete output packtool wrote "
            f"({why}), so an interrupted replacement is not finished with it: move or remove it "
            "yourself"
        )


def _check_ours(folder: Path, paths: OutputPaths) -> None:
    if not ours(folder):
        raise ConfigError(
            f"{folder} (beside output {paths.shown}) is not a dataset packtool wrote, so an "
            "interrupted replacement is not finished with it: move or remove it yourself"
            if folder != paths.target
            else f"output {paths.shown} holds files packtool did not write, so the dataset "
            f"ready beside it ({paths.ready}) does not replace it: move one of them yourself"
        )


def commit(paths: OutputPaths, resumable: bool = True) -> None:
    """Swap the complete staging output in for the old one (see the module docstring).
    `resumable`: the command can `--resume` (what a refused Hub commit's message says)."""
    if paths.whole_object and hub.is_hub(paths.target):
        try:
            hub.put_files({paths.target: paths.staging}, paths.shown)  # one Hub commit
        finally:
            remove(paths.staging)  # tokenize's one object: built again by a rerun
        return
    if paths.whole_object:
        writing.replace(paths.staging, paths.target)  # one upload: the object whole, or not
        return
    if paths.hub:
        version = new_version()
        link = {INDEX_FILE: link_bytes(version)}
        old = current_version(paths.target)
        hub_record.check(paths.staging, paths.shown, old)
        if old is not None and not storage.exists(paths.target / old):
            old = None  # a link to nothing: a commit deleting a missing folder is refused
        hub_record.note_commit(paths.staging, version)
        remove(paths.staging / RUN_STATE)  # kept till now: see `names.RUN_STATE`
        try:
            hub.publish(
                paths.target,
                paths.staging,
                version,
                link,
                old,
                _HUB_PARENTS.get(str(paths.target)),
                shown=paths.shown,
                resumable=resumable,
            )
        except BaseException:
            if not resumable:  # tokenize: a rerun builds it again (the message says so)
                remove(paths.staging)
            raise
        remove(paths.staging)
        hub_record.remove(paths.staging)
        return
    if paths.remote:
        # The switch: one PUT of the link; then the run in progress is over, the old version goes.
        writing.write_atomic(paths.target / INDEX_FILE, link_bytes(paths.staging.name))
        _NEW_VERSIONS.pop(str(paths.target), None)
        try:  # committed: what is left to do is cleaning up, which the next writer redoes
            clean_after_switch(paths.target, paths.staging.name)
        except Exception as exc:
            print(
                f"warning: {paths.shown}: the new dataset is committed ({paths.staging.name}), "
                f"but cleaning up after it failed ({exc}); what is left (the object naming the "
                "run, the replaced version, unfinished uploads) goes at the next run into it",
                file=sys.stderr,
                flush=True,
            )
        return
    if storage.is_file(paths.staging):
        writing.replace(paths.staging, paths.target)  # one atomic step for a file
        writing.sync_dir(paths.target.parent)
        return
    if storage.lexists(paths.target) and not ours(paths.target):
        # Checked at the start (not empty: refused without --overwrite, files packtool did not
        # write: refused with it), but `--resume` checks no such thing, and a file made there
        # while the run ran (or since the run a `--resume` finishes) was deleted by the swap.
        raise ConfigError(
            f"output {paths.shown} holds files packtool did not write (made while this run "
            f"ran?); the new dataset stays in {paths.staging}: move them, then run the same "
            f"command with {RESUME} to switch it in"
        )
    remove(paths.staging / RUN_STATE)  # kept till now: see `names.RUN_STATE`
    try:
        _rename(paths.staging, paths.ready)
        if storage.lexists(paths.target):
            _rename(paths.target, paths.old)
        _rename(paths.ready, paths.target)
        writing.sync_dir(paths.target.parent)
    except Exception:
        # Put things as they were or as they should be; if that fails too, the next run's
        # `recover` does it. Either way the output is never a mixture.
        with contextlib.suppress(OSError):
            recover(paths)
        raise
    remove(paths.old)


def create_parent(paths: OutputPaths) -> Path | None:
    """Create the output's parent folders; return the outermost one made (None: it existed;
    always for an object store, which has no folders)."""
    if paths.remote or paths.hub:
        return None
    parent = paths.target.parent
    made = next((p for p in reversed(parent.parents) if not storage.exists(p)), None)
    if made is None and not storage.exists(parent):
        made = parent
    writing.make_dirs(parent)
    return made


def remove_empty_parents(paths: OutputPaths, made: Path | None) -> None:
    """Remove the parent folders `create_parent` made, while they are empty."""
    if made is None:
        return
    folder = paths.target.parent
    while writing.remove_empty_dir(folder):
        if folder == made:
            return
        folder = folder.parent


@contextlib.contextmanager
def transaction(
    out: str | os.PathLike,
    command: str,
    prepare: Callable[[OutputPaths], T],
    discard: Callable[[BaseException, T], bool],
    resumable: bool = True,
    *,
    paths: OutputPaths | None = None,
    recover_with: Callable[[OutputPaths], None] = recover,
    commit_with: Callable[[OutputPaths], None] | None = None,
) -> Iterator[tuple[OutputPaths, T]]:
    """The output transaction of every command that writes a dataset: the steps in one order.

    Creates the output's parent folders, takes `OutputLock`, finishes what a killed run left
    (`recover`), then runs `prepare(paths)` (the command's own checks and its staging path:
    what it returns is handed on; on an object store the paths are read under the lock, since a
    run that committed while this one waited for it leaves another `.packtool-staging`, and
    again after `prepare`, since a run in progress that it finished or discarded leaves the
    next one a new version) and the
    body; when the body succeeds the staging output is
    swapped in (`commit`). When the body fails, the staging is removed if
    `discard(exc, prepared)` says so (`pack` keeps it for `--resume`), and on any failure the
    parent folders this call created are removed again when empty. Call `check_apart` first,
    before anything is read. An output of its own shape (a Megatron pair: two files, its
    staging folder local) gives its `paths` and its own `recover_with` and `commit_with`.

    Yields:
        The output's paths and what `prepare` returned.
    """
    paths = paths or output_paths(out, read_staging=False)
    made = create_parent(paths)
    versions = paths.remote and not paths.whole_object
    try:
        if not (paths.remote or paths.hub):
            check_name_fits(paths.shown, paths.target, (paths.lock, paths.staging, paths.old))
        with (
            OutputLock(paths, command) as lock,
            staging_known(paths.target) if versions else contextlib.nullcontext(),
        ):
            recover_with(paths)  # reads a remote output's state itself, under the lock
            if versions:
                # Named under the lock (`recover` read `.packtool-staging`, known from then
                # on): a run that committed (or started) before this one took it changed it.
                paths = output_paths(out)
            paths = dataclasses.replace(paths, held=lock)
            prepared = prepare(paths)
            if versions:
                # `prepare` may have finished or discarded the run in progress: a new version
                paths = dataclasses.replace(output_paths(out), held=lock)
            try:
                yield paths, prepared
            except BaseException as exc:
                drop = discard(exc, prepared)
                # A failure (not Ctrl-C, not a run handed to a scheduler or already complete)
                # asks whether the lock is still held: one conditional renewal, where remote.
                failed = isinstance(exc, Exception) and not isinstance(
                    exc, (Detached, AlreadyComplete)
                )
                held = _still_held(lock) if drop or failed else True
                if drop and held:  # lost: nothing here is ours
                    try:
                        remove_staging(paths)
                    except OSError as gone:  # said; the run ends with its own error
                        print(f"warning: {paths.staging}: not removed ({gone})", file=sys.stderr)
                if not held and failed:
                    # What failed is the takeover's doing (its --overwrite deleted this run's
                    # objects: "parts/000000.json: no such object"): say so first.
                    what = one_line(f"{type(exc).__name__}: {exc}", 200)
                    raise ConfigError(
                        f"{paths.shown}: another writer took over this run's lock (its lease ran "
                        f"out unrenewed) and this run stopped ({what}); nothing was committed"
                    ) from exc
                raise
            lock.confirm()  # renewed now, conditionally: a lost lock commits nothing
            if commit_with is None:
                commit(paths, resumable)
            else:
                commit_with(paths)
    except BaseException:
        remove_empty_parents(paths, made)
        raise
