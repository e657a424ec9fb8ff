"""The local (POSIX) file system, write side: every file packtool and the loader create or change.

- **Folders**: `make_dirs` (with the parents; a file in the way is named in a one-line
  `ConfigError`), `make_dir` (one, refused when it exists: a staging folder),
  `temporary_folder` (scratch space, removed after).
- **Writing a file**: `atomic_output` / `write_atomic` (through a hidden temporary name unique
  to the writer, fsync, one rename: a reader sees the old file or the whole new one, never a
  part), `open_output` (a stream the caller closes), `parquet_writer` / `write_parquet`
  (pyarrow's writers, by path: `local_files.py`'s, re-exported here),
  `temporary_name`, `sync_file`, `sync_stream`, `create_empty`; in place:
  `open_update` and `append_range` (the shard writer joins its parts with these).
- **Moving and removing**: `replace` (atomic, over what is there), `rename`, `remove_file`,
  `remove_tree`, `remove_empty_dir`, `sync_dir` (make the renames in a folder durable).
- **One writer**: `take_lock` holds an exclusive `flock` on a lock file; the kernel drops it
  when the process dies, so a lock left by a dead run is free by construction.

The names follow `pyarrow.fs` / fsspec (`open_output_stream` -> `open_output`, `move` ->
`replace`, `delete_file` / `delete_dir` -> `remove_file` / `remove_tree`, `create_dir` ->
`make_dirs`). A rename, a folder fsync and `flock` are what a POSIX file system gives and an
object store does not: the object-storage backend answers them another way (a conditional put
for the lock, the index written last for the commit). Each function is the call packtool made
before, so bytes on disk are unchanged; tests/test_architecture.py fails when a module outside
`packtool/storage/` touches the file system itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

from packtool.errors import ConfigError, naming
from packtool.storage import remote_write
from packtool.storage.local_files import parquet_writer as parquet_writer  # re-exported
from packtool.storage.local_files import write_parquet as write_parquet  # re-exported
from packtool.storage.remote import is_remote

# --- folders -----------------------------------------------------------------------------------


def discard_output(fd: int) -> None:
    """Point the open file descriptor `fd` at the null device: stdout once its reader has gone
    (what is still buffered for it then goes nowhere, instead of failing again at exit)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def hold_standard_descriptors() -> None:
    """Descriptors 0, 1 and 2 that are closed (`packtool ... >&-`) opened on the null device:
    a file the run opens would take the lowest free number, and whatever writes to that
    descriptor (a library's warning to fd 2, a worker process's output) would land in it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)


def name_limit(folder: str | os.PathLike) -> int:
    """The longest file name, in bytes, `folder`'s file system takes (`NAME_MAX`; 255 where it
    does not say)."""
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX, or the folder is not there
        return 255


def make_dirs(folder: str | os.PathLike) -> None:
    """`folder` and its parents, created where missing; a `ConfigError` that says why not.

    The bare OSError is misleading when a parent is a file: Python reports "File exists" or
    "Not a directory" for the folder the user asked for, not for the file in the way.
    """
    if is_remote(folder):
        return  # an object store has no folders: a prefix exists when an object is under it
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        blocker = next(
            (p for p in (folder, *folder.parents) if p.exists() and not p.is_dir()), None
        )
        why = f"{blocker} is a file, not a folder" if blocker else (exc.strerror or str(exc))
        raise ConfigError(f"cannot create output folder {folder} ({why})") from None


def make_dir(folder: str | os.PathLike) -> None:
    """One new folder (`FileExistsError` when something is there: it is not taken over); on an
    object store nothing (no folders there; the output's staging is named by an object,
    `packtool.dataset.output`)."""
    if is_remote(folder):
        return
    os.mkdir(folder)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A new private folder in the system's temporary place, removed with all it holds after."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


# --- writing a file ----------------------------------------------------------------------------


def temporary_name(path: str | os.PathLike) -> Path:
    """A hidden name beside `path`, unique to this writer, to write it under before the rename.
    For an object, a local file in `scratch_dir()`: it is written there, then uploaded whole by
    `replace` (an object appears complete or not at all)."""
    if is_remote(path):
        # With this host's tag: `scratch_dir` deletes the temporaries of this host's dead writers.
        name = str(path).rstrip("/").rsplit("/", 1)[-1]
        return (
            scratch_dir()
            / f".{name}.{os.getpid()}-{uuid.uuid4().hex[:8]}-{remote_write.host_tag()}.tmp"
        )
    path = Path(path)
    return path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")


_TEMPORARY = re.compile(r"\..+\.\d+-[0-9a-f]{8}(?:-[0-9a-f]{8})?\.tmp")
"""`temporary_name`'s names: beside the file, or (with the host's tag) in the scratch folder."""


def is_temporary(name: str) -> bool:
    """Whether `name` is one `temporary_name` gives: a file an atomic write had not yet renamed
    into place (a writer killed mid-write leaves it)."""
    return _TEMPORARY.fullmatch(name) is not None


TEMPORARY_GLOB = ".*.tmp"
"""What `looks_temporary` matches, as a glob pattern (`packtool verify` lists them so)."""


def looks_temporary(name: str) -> bool:
    """Whether `name` has a temporary's shape, `.X.tmp`: `is_temporary`'s names and an older
    packtool's (`.NAME.tmp`, before each writer's name was unique). What cleanups, `--overwrite`
    and `verify` go by; `is_temporary` is the exact test, where nothing else may be there."""
    return len(name) > len(".tmp") and name.startswith(".") and name.endswith(".tmp")


SCRATCH_ENV = "PACKTOOL_SCRATCH"


def scratch_dir() -> Path:
    """Where files bound for object storage are written before their upload: `PACKTOOL_SCRATCH`,
    else `packtool-scratch-UID` in the system's temporary folder, this user's alone (created
    0700; each file is removed once uploaded, so it holds what the workers are writing and
    uploading now: at most two shards each). A writer killed (`kill -9`, a lost node's process
    on a shared scratch folder aside) leaves its temporaries: the first call in each process
    deletes those of this host's writers that are dead (`_sweep_scratch`).

    The default is checked: a shared /tmp is anyone's to create names in, and a fixed
    `packtool-scratch` made by another user (or a link to one) held this user's Hub staging and
    uploads, readable and replaceable by them, with predictable lock paths inside.
    """
    import tempfile

    given = os.environ.get(SCRATCH_ENV)
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
    else:
        folder = Path(tempfile.gettempdir()) / f"packtool-scratch-{os.getuid()}"
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
        st = os.lstat(folder)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise ConfigError(
                f"{folder} is not a private folder of this user (a link, another user's, or "
                f"open to others); remove it or set {SCRATCH_ENV} to a folder of your own"
            )
    if str(folder) not in _SWEPT:
        _SWEPT.add(str(folder))
        _sweep_scratch(folder)
    return folder


_SWEPT: set[str] = set()
"""The scratch folders this process has swept (`_sweep_scratch`): once each."""
_SCRATCH_TEMPORARY = re.compile(r"\..+\.(\d+)-[0-9a-f]{8}-([0-9a-f]{8})\.tmp")
"""`temporary_name`'s name for an object's local file: its writer's pid, then its host's tag."""


def _sweep_scratch(folder: Path) -> None:
    """Delete the temporaries (`temporary_name`) in `folder` whose writer was a process of this
    host that is gone; another host's, a live pid's, and every other name are left alone."""
    host = remote_write.host_tag()
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return  # what cannot be listed is never deleted; the run says so where it writes
    for entry in entries:
        found = _SCRATCH_TEMPORARY.fullmatch(entry.name)
        if found is None or found[2] != host or not entry.is_file(follow_symlinks=False):
            continue
        if not _pid_alive(int(found[1])):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)


def _pid_alive(pid: int) -> bool:
    """A process of this host with `pid` runs (another user's counts: it may be the writer)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def open_output(path: str | os.PathLike, text: bool = False) -> IO[Any]:
    """`path` created (or truncated) for writing bytes, or UTF-8 text (the caller closes it)."""
    if text:
        return open(path, "w", encoding="utf-8")  # noqa: SIM115 - the caller closes it
    return open(path, "wb")  # noqa: SIM115


def open_update(path: str | os.PathLike) -> BinaryIO:
    """An existing file opened to read and write bytes in place (the caller closes it)."""
    return open(path, "r+b")  # noqa: SIM115 - the caller closes it


def open_append(path: str | os.PathLike, size: int) -> BinaryIO:
    """`path` opened to append bytes (created when missing), first cut back to its first
    `size` bytes (what a resumed writer keeps of a file it was appending to); the caller
    closes it. Not `O_APPEND`: `append_range`'s `copy_file_range` refuses such a file."""
    f = open(path, "r+b" if os.path.lexists(path) else "w+b")  # noqa: SIM115 - the caller closes it
    f.truncate(size)
    f.seek(size)
    return f


def create_exclusive(path: str | os.PathLike, data: bytes) -> bool:
    """Create `path` holding `data` if no file is there; False when one is. Written whole under a
    temporary name first, then hard-linked to `path` (`link` fails where a file is: of several
    processes, on any node of a shared file system, NFS, Lustre, GPFS, exactly one succeeds), so
    `path` never exists without its data: with `O_CREAT | O_EXCL`, then a write, a process
    killed between the two left an empty file for good (a Slurm worker's claim naming no
    owner, which nothing ever released). Where the file system has no hard links: `O_EXCL`,
    then the write. An object: a conditional put (`remote_write.create_exclusive`)."""
    if is_remote(path):
        return remote_write.create_exclusive(path, data)
    tmp = temporary_name(path)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            # NFSv2/3 may retry a link whose answer was lost and report EEXIST for its own
            # success: the temporary's second name says which (open(2)'s recipe).
            return os.stat(tmp).st_nlink == 2
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return _create_then_write(path, data)
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}
"""`link`'s errors on a file system that has no hard links (some FUSE, SMB and object mounts)."""


def _create_then_write(path: str | os.PathLike, data: bytes) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    return True


def create_empty(path: str | os.PathLike) -> None:
    """An empty file at `path` (one already there is kept as it is)."""
    Path(path).touch()


def append_range(source: str | os.PathLike, offset: int, count: int, out: BinaryIO) -> None:
    """Append `count` bytes of `source` from `offset` to the end of `out` (in the kernel with
    `copy_file_range` where it can: Linux; a plain copy where the system or the file system
    has no such copy, `_NO_KERNEL_COPY`). Any other failure is raised naming its file: `source`
    for a read (EIO), `out` for a write (a full disk, `_WRITE_ERRORS`); until 2026-12-07 every
    OSError of the kernel copy was taken for "not supported" and the bytes copied again."""
    out.flush()
    with open(source, "rb") as f:
        try:
            while count > 0:
                done = os.copy_file_range(f.fileno(), out.fileno(), count, offset)
                if done <= 0:
                    break  # copied nothing (some file systems): the plain copy says why
                offset += done
                count -= done
            if count <= 0:
                return
        except AttributeError:  # not Linux
            pass
        except OSError as exc:
            if exc.errno not in _NO_KERNEL_COPY:
                raise _named(exc, out if exc.errno in _WRITE_ERRORS else source) from None
        f.seek(offset)
        out.seek(0, os.SEEK_END)
        while count > 0:
            with naming(source):
                block = f.read(min(count, 1 << 22))
            if not block:
                # A failed read of `source`, named (no errno nor name: the caller's `naming`
                # put the merged file's on it, after "[Errno None]", until 2026-12-07)
                raise OSError(errno.EIO, "shorter than its footer says", os.fspath(source))
            try:
                out.write(block)
            except OSError as exc:
                raise _named(exc, out) from None
            count -= len(block)


_NO_KERNEL_COPY = {
    errno.EXDEV,  # across file systems (Linux before 5.3; some since)
    errno.ENOSYS,  # no such system call
    errno.EOPNOTSUPP,
    errno.ENOTSUP,
    errno.EINVAL,  # a file system (or file kind) the kernel copy does not take
    errno.EBADF,  # `out` opened O_APPEND
    errno.EPERM,  # a sandbox's seccomp filter refusing the call
}
"""`copy_file_range`'s answers that mean "not here": the plain copy does the work instead."""

_WRITE_ERRORS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
"""`copy_file_range`'s failures that are the output's (the rest are taken as the source's)."""


def _named(exc: OSError, file: Any) -> OSError:
    """`exc` naming `file` (a path, or an open file's name); as it is when it names one or
    `file` has no name."""
    name = file if isinstance(file, (str, os.PathLike)) else getattr(file, "name", None)
    if exc.filename is not None or not isinstance(name, (str, os.PathLike)):
        return exc
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    return OSError(exc.errno, why, os.fspath(name))


def sync_stream(f: IO[Any]) -> None:
    """Flush an open output stream to the disk (Python's buffer, then `fsync`)."""
    f.flush()
    os.fsync(f.fileno())


def sync_file(path: str | os.PathLike) -> None:
    """Flush a file another writer closed to the disk (`fsync`), its name in any error."""
    with naming(path), open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike, text: bool = False, make_parent: bool = False
) -> Iterator[IO[Any]]:
    """A stream whose bytes become `path` whole when the block ends without an error.

    Written under `temporary_name(path)`, flushed and fsynced, then renamed over `path`; an
    error (a full disk: named by the temporary's path) removes the temporary and leaves `path`
    as it was.
    """
    if not is_remote(path):
        path = Path(path)
        if make_parent:
            path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        with naming(tmp), open_output(tmp, text) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(path: str | os.PathLike, data: bytes, make_parent: bool = False) -> None:
    """`data` as the whole of `path`, through `atomic_output`."""
    with atomic_output(path, make_parent=make_parent) as f:
        f.write(data)


# --- moving and removing -----------------------------------------------------------------------


def replace(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename `source` to `target` in one atomic step, over a file at `target`. A local file
    onto an object: uploaded whole (`remote_write.upload`), then deleted here."""
    if is_remote(target):
        if is_remote(source):
            raise NotImplementedError(f"no rename on an object store ({source} -> {target})")
        remote_write.upload(source, target)
        os.unlink(source)
        return
    os.replace(source, target)


def rename(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Rename `source` to `target` (a folder onto a non-empty folder is refused). Not on an
    object store: nothing there renames (`packtool.dataset.output` commits without it)."""
    if is_remote(source) or is_remote(target):
        raise NotImplementedError(f"no rename on an object store ({source} -> {target})")
    os.rename(source, target)


def remove_file(path: str | os.PathLike, missing_ok: bool = True) -> None:
    """Delete one file (or a symlink); nothing there is fine when `missing_ok`."""
    if is_remote(path):
        remote_write.remove(path)
        return
    Path(path).unlink(missing_ok=missing_ok)


REMOVE_TRIES, REMOVE_PAUSE = 50, 0.1
"""How often `remove_tree` deletes a folder again that a writer still fills, and how many
seconds apart."""


def remove_tree(path: str | os.PathLike) -> None:
    """Delete a file or a folder tree, if it is there (a symlink itself, never what it names);
    every object under a prefix. A folder that a writer still fills as it goes (a failed
    run's worker not yet stopped: a Ray actor's process outlives its pool's shutdown by a
    moment) is deleted again, up to `REMOVE_TRIES` times: its "Directory not empty" was the
    failed run's message until 2026-12-07, in place of the run's own error."""
    if is_remote(path):
        remote_write.remove_tree(path)
        return
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        for tries_left in range(REMOVE_TRIES - 1, -1, -1):
            try:
                shutil.rmtree(path)
                return
            except FileNotFoundError:  # a file (or the folder) went meanwhile: look again
                if not path.is_dir():
                    return
                if not tries_left:
                    raise
            except OSError as exc:
                if exc.errno != errno.ENOTEMPTY or not tries_left:
                    raise
            time.sleep(REMOVE_PAUSE)
    elif os.path.lexists(path):
        path.unlink()


def remove_empty_dir(folder: str | os.PathLike) -> bool:
    """Delete `folder` if it is an empty folder; whether it did (an object store has none)."""
    if is_remote(folder):
        return False
    folder = Path(folder)
    if folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        return True
    return False


def sync_dir(folder: str | os.PathLike) -> None:
    """Make the renames in `folder` durable (some file systems cannot, object stores need not:
    then nothing)."""
    if is_remote(folder):
        return
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


# --- one writer --------------------------------------------------------------------------------


class LockBusy(Exception):
    """Another live process holds the lock; `holder` is what it wrote in the lock file."""

    def __init__(self, holder: bytes) -> None:
        super().__init__("lock held")
        self.holder = holder


class HeldLock:
    """An exclusive `flock` on a lock file, held until `release`; the file can carry a note
    (who holds it) for the next writer to read."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def write(self, data: bytes) -> None:
        """`data` as the lock file's content (its path named by a full disk)."""
        assert self._fd is not None
        with naming(self.path):
            os.ftruncate(self._fd, 0)
            os.write(self._fd, data)

    def release(self) -> None:
        """Unlink the lock file while still holding it (see `take_lock`), then let go. Again:
        nothing."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


def take_lock(path: str | os.PathLike, note: bytes = b"") -> Any:
    """An exclusive lock on the file at `path` (created if missing), never waiting; `note` (who
    holds it) written in it. On an object store a lock object under a lease
    (`remote_write.take_lock`: a conditional put, renewed while held; its `lost` says whether
    another writer took it over).

    Raises:
        LockBusy: another live process holds it.
        OSError: the file cannot be created.
    """
    if is_remote(path):
        try:
            return remote_write.take_lock(path, note)
        except remote_write.RemoteLockBusy as busy:
            raise LockBusy(busy.holder) from None
    held = _take_flock(Path(path))
    if note:
        try:
            held.write(note)
        except BaseException:
            held.release()
            raise
    return held


def _take_flock(path: Path) -> HeldLock:
    while True:
        # O_NOFOLLOW: a symlink planted at the lock's name made its target the lock, and the
        # holder's note was written over that file (any file the user may write).
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            raise ConfigError(
                f"{path} is a symbolic link, not a lock file packtool made; remove it"
            ) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"{path} is not a regular file, so it is no lock; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 4096, 0)
            except OSError:
                holder = b""
            os.close(fd)
            raise LockBusy(holder) from None
        # The previous holder unlinks the file as it lets go: if that happened between our
        # open and our flock, we hold a lock on a file no one else will open. Start again.
        try:
            st = os.stat(path)
            same = (st.st_ino, st.st_dev) == (os.fstat(fd).st_ino, os.fstat(fd).st_dev)
        except FileNotFoundError:
            same = False
        if same:
            return HeldLock(path, fd)
        os.close(fd)
