"""A node-local cache of byte ranges of objects, shared by every process of the node.

What the loader reads a dataset in a bucket through (loader/store/shards.py): each row group's
byte range of a shard is downloaded once per node, by one ranged GET, into a file of its own
under `cache_dir`, and memory-mapped from there by every worker (and rank) that reads it.

- **Content-addressed.** A range's file is named by the shard's sha256 (from `index.json`) and
  the range: a shard that changed is another name, so a stale range is never read, and two
  versions of a dataset share the shards they share.
- **Downloaded once per node.** The first process to want a range creates `NAME.part` with
  `O_EXCL` and holds an `flock` on it while it downloads, then renames it to `NAME`; the others
  wait for `NAME`. A `.part` whose downloader died (no lock held: see `STALE_S`) is taken over.
  A link, FIFO or empty folder at `NAME` or `NAME.part` (the cache writes only files) is
  removed and the range downloaded anew; a folder holding files, or a removal that fails, is
  one line naming it. Every wait sleeps or changes what it waits on: no reader spins.
- **Never evicted while read.** A reader holds a shared `flock` on the range's file from open to
  close (`pinned`); eviction takes an exclusive one without waiting and skips what it cannot
  lock, and a reader that locked a file just unlinked notices (`st_nlink == 0`) and fetches it
  again.
- **Bounded.** Every process sweeps at its first download and then after each `limit / 16`
  bytes it downloads: when the files add up to more than `limit`, the least recently read
  (mtime, touched by `pinned`) are deleted down to 90% of it. While P processes download at
  once the cache can run over `limit` by at most P x `limit / 16` plus what is pinned; what a
  run left over the limit goes at the next process's first download. Only the cache's own
  names (`_NAME`: `XX/<sha256>-<start>-<end>`) are counted and deleted; anything else in the
  folder is left alone.
- **This user's alone.** The folder is made 0700 where missing, and one that another user owns
  or can write in is refused at construction: a CRC32 trailer is anyone's to write, so whoever
  can create files there could replace the training data. Files are made 0600 (a job's ranks
  and workers are one user), and a cached file another user owns is downloaded again.
- **Checked.** Each file ends with a CRC32 of each 16 KiB block of its bytes (cache_format.py);
  `pinned` checks the size and the blocks of the bytes it hands on (all of them, or those of
  `check`: a reader of one column of a row group, `RowIndex`'s stats, checks that column's
  blocks, not the whole range), and a file that fails (a flipped bit on disk, a file cut short
  by a crash: the rename is not synced) is deleted and downloaded again. A footer read from a
  damaged copy could abort the process inside pyarrow's C++ (no Python exception to catch), so
  nothing unchecked is parsed.

Records in: an object's URL, its content key (sha256), a byte range. Out: a read-only buffer of
those bytes (`pinned`) or the cached file's path (`fetch`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError, DataError
from packtool.storage import local
from packtool.storage.cache_fds import close_held, open_held
from packtool.storage.cache_format import (
    EMPTY,
    checked_map,
    trailer,
    trailer_size,
)

CACHE_ENV = "PACKTOOL_CACHE_DIR"
STALE_S = 2.0
"""A `.part` file whose downloader holds no lock was left by a dead process when it holds
bytes (the downloader writes only under its lock), or when it is empty and older than this."""
WAIT_S = 0.005
PIN_WAIT_S = 60.0
"""The longest `pinned` waits for its shared lock: a range's file is locked whole only for
moments (renamed into place, swept), so a lock held longer is one that is never let go."""
MERGED_BYTES = 16 << 20
"""The most bytes `fetch_many` asks for in one GET (adjacent ranges joined): S3's advice for a
ranged GET's size; one range larger than this is one GET of its own."""
MERGED_RANGES = 64
"""The most ranges one GET of `fetch_many` takes: each holds an open, locked `.part` until the
GET is done (small row groups must not run a process out of file descriptors)."""
_BUSY: Any = object()
"""`_claim`'s answer while another process downloads the range."""
_NAME = re.compile(r"([0-9a-f]{64})-(0|[1-9][0-9]*)-(0|[1-9][0-9]*)")
"""A cached range's name: its object's sha256 and the range (in the subfolder of the sha256's
first two digits). The sweep counts and deletes nothing else."""


def default_cache_dir() -> Path:
    """`$PACKTOOL_CACHE_DIR/ranges`, else `$XDG_CACHE_HOME/packtool/ranges`, else
    `~/.cache/packtool/ranges`: one per user and node (the root the tokenizer engines' check
    records use too)."""
    given = os.environ.get(CACHE_ENV)
    if given:
        return Path(given) / "ranges"
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(xdg).expanduser() / "packtool" / "ranges"


def _check_folder(folder: Path) -> None:
    """Refuse a cache folder that is a file, or lies under one (it would fail at the first
    download, reported as a damaged shard footer): its first existing part must be a folder."""
    there = folder
    while not there.exists() and there != there.parent:
        there = there.parent
    if there.exists() and not there.is_dir():
        inside = "" if there == folder else f" ({there} is a file)"
        raise ConfigError(
            f"cache_dir {folder} is not a folder{inside}; give cache_dir (or "
            f"${CACHE_ENV}) a folder, which is made if missing"
        )


class RangeCache:
    """Byte ranges of objects cached as files in `folder`, at most about `limit` bytes."""

    def __init__(self, folder: str | os.PathLike | None, limit: int) -> None:
        if folder is not None and not os.fspath(folder):
            raise ConfigError(
                "cache_dir is empty (it would be the current folder); give cache_dir a folder "
                f"of its own, or leave it out for ${CACHE_ENV}/ranges"
            )
        self.folder = Path(folder) if folder is not None else default_cache_dir()
        self.limit = int(limit)
        if self.limit < 1:
            raise ConfigError(f"cache_limit must be >= 1 byte, got {limit}")
        _check_folder(self.folder)
        self.uid = os.getuid()
        self._check_private()
        self._since_sweep = self.limit  # the first download sweeps: a past run's excess goes
        self.downloaded = 0
        """Bytes this process downloaded (cache misses it served itself)."""

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_since_sweep": self.limit, "downloaded": 0}

    def _check_private(self) -> None:
        """Make the folder (this user's alone, 0700) where missing, and refuse one that another
        user can write in: whoever can create files there can replace cached ranges (a CRC32
        trailer is anyone's to write) and so the training data. A job's ranks and workers, one
        user, share it."""
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            st = os.stat(self.folder)
        except OSError as exc:
            raise self._unwritable(exc, always=True) from None
        if st.st_uid != self.uid:
            whose, fix = f"another user's (uid {st.st_uid})", "a folder of your own"
        elif st.st_mode & 0o022:
            who = "others" if st.st_mode & 0o002 else "its group"
            whose = f"writable by {who} (mode {st.st_mode & 0o7777:o})"
            fix = f"a folder only you can write in (chmod go-w {self.folder})"
        else:
            return
        raise ConfigError(
            f"cache_dir {self.folder} is {whose}: whoever writes there can replace the cached "
            f"row groups, and so the training data; give cache_dir (or ${CACHE_ENV}) {fix}"
        )

    def path(self, key: str, start: int, end: int) -> Path:
        name = f"{key}-{start}-{end}"
        if not _NAME.fullmatch(name):  # the sweep would never see it: the cache's names only
            raise DataError(
                f"content key {key!r} is not a sha256 (64 hex digits); the dataset's "
                "index.json is damaged"
            )
        return self.folder / key[:2] / name

    def cached(self, key: str, start: int, end: int) -> bool:
        """Whether the range is in the cache now: one `lstat`, neither checked nor pinned (it
        can be evicted the next moment; `pinned` reads it safely, downloading it if gone)."""
        return self._present(self.path(key, start, end))

    def fetch(self, url: Any, key: str, start: int, end: int) -> Path:
        """The cached file of bytes `start`..`end` of `url` (content `key`), downloaded if no
        process of the node has (or is downloading) it."""
        path = self.path(key, start, end)
        while True:
            claim = self._claim(path)
            if claim is None:
                return path
            if claim is _BUSY:
                self._wait_or_take_over(_part(path))
                continue
            self._download(url, [(claim, path, start, end)])
            return path

    def fetch_many(self, url: Any, key: str, ranges: list[tuple[int, int]]) -> None:
        """Download those of `ranges` (byte ranges of `url`, content `key`) that no process of
        the node has or is downloading, each into its own file as `fetch` does one, with one
        GET for each run of adjacent ranges (at most `MERGED_BYTES` and `MERGED_RANGES`, or one
        range): the row groups a loader asks for next that lie side by side in a shard. A
        range another process is downloading is left to it (a reader of it waits in
        `pinned`). A run's ranges are claimed just before its GET: a process holds at most
        `MERGED_RANGES` open `.part`s a call."""
        wanted = sorted(set(ranges))
        at = 0
        while at < len(wanted):
            run = [wanted[at]]
            at += 1
            while (
                at < len(wanted)
                and len(run) < MERGED_RANGES
                and wanted[at][0] == run[-1][1]
                and wanted[at][1] - run[0][0] <= MERGED_BYTES
            ):
                run.append(wanted[at])
                at += 1
            self._fetch_run(url, key, run)

    def _fetch_run(self, url: Any, key: str, run: list[tuple[int, int]]) -> None:
        """Claim the adjacent ranges `run` and download what this process claimed, one GET for
        each stretch between ranges it did not (cached, or another's)."""
        claims: list[tuple[int, Path, int, int]] = []
        try:
            for start, end in run:
                path = self.path(key, start, end)
                claim = self._claim(path)
                if claim is None or claim is _BUSY:
                    mine, claims = claims, []
                    if mine:  # the stretch before this range: its own GET
                        self._download(url, mine)
                    continue
                claims.append((claim, path, start, end))
            mine, claims = claims, []
            if mine:
                self._download(url, mine)
        finally:
            for fd, path, _, _ in claims:  # not downloaded (an error before): let them go
                with contextlib.suppress(OSError):
                    os.unlink(_part(path))
                close_held(fd)

    def _claim(self, path: Path) -> Any:
        """One look at the range whose file is `path`: None when the file is there; `_BUSY`
        while another process downloads it; else the descriptor of its `.part`, created by
        this process with `O_EXCL` and locked, for this process to download it."""
        part = _part(path)
        while True:
            if self._present(path):
                return None
            try:
                fd = open_held(part, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileNotFoundError:
                try:
                    self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
                    path.parent.mkdir(mode=0o700, exist_ok=True)
                except OSError as exc:
                    raise self._unwritable(exc, always=True) from None
                continue
            except FileExistsError:
                return _BUSY
            except OSError as exc:
                raise self._unwritable(exc, always=True) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if self._present(path):  # finished by another process between our checks
                    os.unlink(part)
                    close_held(fd)
                    return None
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(part)
                close_held(fd)
                raise
            return fd

    def _download(self, url: Any, claims: list[tuple[int, Path, int, int]]) -> None:
        """One GET of the bytes of the adjacent ranges `claims` (their `.part`s created and
        locked by `_claim`: descriptor, file, start, end), each written with its trailer and
        renamed into place; the descriptors closed, and on a failure the `.part`s removed."""
        first, last = claims[0][2], claims[-1][3]
        done = 0
        try:
            data = local.read_range(url, first, last)
            if len(data) != last - first:  # the object's doing, not the cache's
                raise OSError(
                    f"{url}: bytes {first}..{last} came back {len(data):,} long; the object "
                    "is shorter than index.json says"
                )
            whole = memoryview(data)
            self.downloaded += last - first
            self._since_sweep += last - first
            if self._since_sweep > self.limit // 16:
                # Before the renames: room is made for these ranges, which are then the most
                # recently read, so the next sweep (of any process) evicts them last.
                self._since_sweep = 0
                self.sweep(incoming=last - first)
            for fd, path, start, end in claims:
                piece = whole[start - first : end - first]
                self._write(fd, piece)
                try:
                    os.rename(_part(path), path)
                except FileNotFoundError:
                    self._write_again(path, piece)
                done += 1
        except BaseException:
            for _, path, _, _ in claims[done:]:
                with contextlib.suppress(OSError):
                    os.unlink(_part(path))
            raise
        finally:
            for fd, _, _, _ in claims:
                close_held(fd)

    def _write(self, fd: int, piece: memoryview) -> None:
        """A range's bytes and their trailer written to its `.part` open at `fd`. A disk full
        below `limit` (a small tmpfs, others' files) is made room on (`_make_room`) and the
        write tried once more before it is one line."""
        tail = trailer(piece)
        for attempt in (1, 2):
            try:
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                for chunk in (piece, tail):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
                return
            except OSError as exc:
                full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
                if attempt == 2 or not full:
                    raise self._unwritable(exc) from None
                self._make_room(len(piece) + trailer_size(len(piece)))

    def _make_room(self, need: int) -> None:
        """Sweep until `need` more bytes fit on the disk (its free space): one listing."""
        free = 0
        with contextlib.suppress(OSError):
            free = (st := os.statvfs(self.folder)).f_bavail * st.f_frsize
        self.sweep(room=need - free)

    def _write_again(self, path: Path, piece: memoryview) -> None:
        """The `.part` of `path` was gone at its rename: cache_dir (or its subfolder) removed
        meanwhile (a tmp cleaner). Claimed anew (the folders made again) and written from the
        bytes in hand, once; gone again, one line naming cache_dir, not the shard."""
        claim = self._claim(path)
        if claim is None or claim is _BUSY:
            return  # there, or another process's download: a reader waits for it
        try:
            self._write(claim, piece)
            os.rename(_part(path), path)
        except FileNotFoundError:
            raise ConfigError(
                f"cache_dir {self.folder}: removed while a download was written into it, twice "
                f"({path}); give cache_dir (or ${CACHE_ENV}) a folder nothing cleans up"
            ) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(_part(path))  # gone after a rename
            close_held(claim)

    def _unwritable(self, exc: OSError, always: bool = False) -> Exception:
        """A cache folder that cannot take a download: one line naming it, not the shard
        (`always`: whatever the error)."""
        if always or exc.errno in (
            errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT
        ):  # fmt: skip
            where = f": {exc.filename}" if exc.filename else ""
            return ConfigError(
                f"cache_dir {self.folder}: cannot write a download there ({exc.strerror}{where}); "
                f"give cache_dir (or ${CACHE_ENV}) a writable folder with room for cache_limit "
                f"({self.limit:,} bytes)"
            )
        return exc

    def _present(self, path: Path) -> bool:
        """Whether the range's file is there. What else lies at its name (a link, a folder: the
        cache writes neither) is removed, to be downloaded anew."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        if stat.S_ISREG(st.st_mode):
            return True
        self._clear(path)
        return False

    def _clear(self, path: Path) -> None:
        """Remove what lies at `path`, one of the cache's names: a file or a link (never what it
        points to), an empty folder. A folder holding files, or a removal that fails, is one
        line naming it (in a loop of retries it would spin, and it is not the shard's fault)."""
        try:
            if stat.S_ISDIR(os.lstat(path).st_mode):
                os.rmdir(path)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise ConfigError(
                f"cache_dir {self.folder}: cannot remove {path} ({exc.strerror}), where the "
                "cache keeps a range; remove it by hand"
            ) from None

    def _wait_or_take_over(self, part: Path) -> None:
        """Another process downloads `part`: wait a moment; if it died, remove its `.part`. Each
        call sleeps or changes what lies at `part` (or raises): a caller's loop never spins."""
        try:
            st = os.lstat(part)
        except FileNotFoundError:
            return  # finished or gone: look again
        if not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid:
            self._clear(part)  # a link, a folder, another user's: no download of this user's
            return
        try:
            fd = open_held(part, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # replaced by a link since: removed at the next look
                raise self._unwritable(exc, always=True) from None
            return
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                time.sleep(WAIT_S)  # being downloaded
                return
            st = os.fstat(fd)
            # Age either way: a clock stepped back (or another machine's, on shared storage)
            # left an empty `.part` "in the future", and every reader waited until then.
            if st.st_nlink and (st.st_size > 0 or abs(time.time() - st.st_mtime) > STALE_S):
                self._clear(part)  # its downloader died
            else:
                time.sleep(WAIT_S)  # just created, not yet locked by its downloader
        finally:
            close_held(fd)

    @contextlib.contextmanager
    def pinned(
        self, url: Any, key: str, start: int, end: int, check: tuple[int, int] | None = None
    ) -> Iterator[memoryview]:
        """The bytes `start`..`end` of `url`, memory-mapped from the cache and checked against
        their CRC32s; the file cannot be evicted until the block ends. With `check` (`a`, `b`
        within the range), only the bytes `a`..`b` are checked and handed on (what a reader of
        part of the range reads: the view begins at byte `a`). A cached copy that fails the
        check is deleted and downloaded again."""
        a, b = (start, end) if check is None else check
        if not start <= a <= b <= end:
            raise ValueError(f"check {a}..{b} is not within the range {start}..{end}")
        damaged = 0
        while True:
            path = self.fetch(url, key, start, end)
            try:
                fd = open_held(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:  # evicted between fetch and open
                continue
            except OSError as exc:  # replaced by a link since fetch: removed by the next
                if exc.errno != errno.ELOOP:
                    raise self._unwritable(exc, always=True) from None
                continue
            try:
                self._lock_shared(fd, path)
            except BaseException:
                close_held(fd)
                raise
            st = os.fstat(fd)
            if st.st_nlink == 0:  # evicted before our lock: fetch it again
                close_held(fd)
                continue
            # Another user's file (in a folder once open to others) is not trusted: its CRC32
            # trailer is anyone's to write. Deleted and downloaded again, as a damaged copy
            # (and so is anything but a file: a folder or a FIFO put there since fetch).
            ours = st.st_uid == self.uid and stat.S_ISREG(st.st_mode)
            mapped = checked_map(path, st, end - start, (a - start, b - start)) if ours else None
            if mapped is not None:
                break
            close_held(fd)
            damaged += 1
            if damaged > 2:  # each copy just downloaded and written whole: the cache's doing
                raise ConfigError(
                    f"cache_dir {self.folder}: {path} fails its check (size, CRC32, owner) "
                    "three times right after being downloaded; is another process rewriting "
                    "it, or the disk failing? Empty cache_dir or give another"
                )
            self.discard(key, start, end)  # damaged on disk: downloaded again
        try:
            with contextlib.suppress(OSError):
                os.utime(fd)  # recently read: the last to be evicted
            if mapped is EMPTY:
                yield memoryview(b"")
                return
            view = memoryview(mapped)[a - start : b - start]
            try:
                yield view
            finally:
                with contextlib.suppress(BufferError):  # a slice still alive: closed when freed
                    view.release()
                    mapped.close()
        finally:
            close_held(fd)  # drops the shared lock

    def _lock_shared(self, fd: int, path: Path) -> None:
        """A shared lock on the range's file open at `fd`, waited for at most `PIN_WAIT_S`: a
        lock held longer is one line, not a reader waiting for ever."""
        deadline, pause = time.monotonic() + PIN_WAIT_S, WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(
                        f"cache_dir {self.folder}: {path} has been locked by another process "
                        f"for over {PIN_WAIT_S:g} s; end the process that holds it (fuser "
                        f"{path}) or empty cache_dir"
                    ) from None
                time.sleep(pause)
                pause = min(pause * 2, 0.1)

    def discard(self, key: str, start: int, end: int) -> None:
        """Delete a cached range (it failed its checks: the next read downloads it again)."""
        self._clear(self.path(key, start, end))

    def sweep(self, incoming: int = 0, room: int = 0) -> int:
        """Delete the least recently read unpinned ranges while the cache (with `incoming`
        bytes about to join it) holds more than its limit, or more than `room` bytes less than
        it holds now (a full disk that must gain `room`: `_make_room`), down to 90% of that;
        the bytes it holds after (`incoming` not counted).
        Only files of the cache's own names (`_NAME`, in the subfolder of their first two
        digits) are counted or deleted: whatever else lies in `folder` is left alone."""
        entries = []
        total = incoming
        try:
            subs = [s for s in os.scandir(self.folder) if len(s.name) == 2]
        except FileNotFoundError:
            subs = []
        except OSError as exc:
            raise self._unwritable(exc, always=True) from None
        for sub in subs:
            try:
                if not sub.is_dir(follow_symlinks=False):
                    continue
                found = list(os.scandir(sub.path))
            except OSError:  # gone, or another user's (a folder from before): not counted
                continue
            for e in found:
                # The cache's own ranges only: `.part`s are being written (or dead), and
                # anything else in cache_dir is someone's, neither counted nor deleted.
                own = _NAME.fullmatch(e.name)
                if not own or own[1][:2] != sub.name or not e.is_file(follow_symlinks=False):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime, st.st_size, e.path))
                    total += st.st_size
        limit = self.limit if room <= 0 else min(self.limit, max(0, total - room))
        if total <= limit:
            return total - incoming
        goal = int(limit * 0.9)
        for _, size, name in sorted(entries):
            if total <= goal:
                break
            fd = None
            try:
                fd = open_held(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except FileNotFoundError:
                total -= size
                continue
            except OSError:
                pass  # not this user's to read: never read from here (`pinned`), so deleted
            if fd is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    close_held(fd)
                    continue  # being read: kept
            try:
                os.unlink(name)
                total -= size
            except FileNotFoundError:
                total -= size
            except OSError:
                pass  # not this user's to delete (a folder from before): kept, counted
            finally:
                if fd is not None:
                    close_held(fd)
        return total - incoming


def _part(path: Path) -> Path:
    """Where the range whose file is `path` is written while it downloads (`NAME.part`)."""
    return path.with_name(path.name + ".part")
