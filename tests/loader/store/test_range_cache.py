"""The node's range cache (packtool/storage/cache.py) against damage and odd states, with local
files standing for objects (`local.read_range` reads either): a damaged cached copy is never
handed on but downloaded again, a clock stepped back never makes readers wait, a past run's
excess goes at the first download, and a cache folder that cannot be written says so."""

from __future__ import annotations

import errno
import os
import threading
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtool.errors import ConfigError, DataError
from packtool.storage import cache as cache_module
from packtool.storage import cache_format
from packtool.storage.cache import RangeCache
from packtool.storage.cache_format import BLOCK, MAGIC, TRAILER, trailer, trailer_size

KEY = "ab" * 32


@pytest.fixture
def obj(tmp_path) -> Path:
    path = tmp_path / "object.bin"
    path.write_bytes(os.urandom(50_000))
    return path


def _read(cache: RangeCache, obj: Path, start: int, end: int) -> bytes:
    with cache.pinned(obj, KEY, start, end) as view:
        return bytes(view)


@pytest.mark.parametrize(
    "damage", ["flip", "truncate", "empty", "extend", "no_trailer", "old_trailer"]
)
def test_a_damaged_cached_copy_is_downloaded_again_never_handed_on(tmp_path, obj, damage):
    """A cut or emptied copy failed every read ('the shard is damaged') until the cache was
    emptied by hand; a flipped bit in a footer aborted every reader inside pyarrow."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    want = obj.read_bytes()[1000:9000]
    assert _read(cache, obj, 1000, 9000) == want
    path = cache.path(KEY, 1000, 9000)
    data = bytearray(path.read_bytes())
    assert len(data) == 8000 + TRAILER
    if damage == "flip":
        data[1234] ^= 0x04
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "empty":
        data = bytearray()
    elif damage == "extend":
        data += b"0123456789"
    elif damage == "no_trailer":  # a copy written before the trailers
        data = data[:-TRAILER]
    else:  # a copy written before block CRC32s (one CRC32 of the whole range: "PTc1")
        data[-4:] = b"PTc1"
    path.write_bytes(bytes(data))
    before = cache.downloaded
    assert _read(cache, obj, 1000, 9000) == want
    assert cache.downloaded == before + 8000  # downloaded again
    assert _read(cache, obj, 1000, 9000) == want and cache.downloaded == before + 8000


@given(size=st.integers(0, 3 * BLOCK + 17), seed=st.integers(0, 2**32 - 1))
def test_the_trailer_holds_zlibs_crc32_of_each_block_whoever_computes_it(size, seed):
    """ISA-L's CRC32 (python-isal, ~3.4x zlib's here) computes the trailer where it is
    installed; a cache written with it must read without it and back: zlib's values, block by
    block."""
    body = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()
    want = b"".join(
        zlib.crc32(body[i : i + BLOCK]).to_bytes(4, "little") for i in range(0, size, BLOCK)
    )
    assert trailer(memoryview(body)) == want + MAGIC
    assert len(trailer(memoryview(body))) == trailer_size(size)


def test_isal_is_the_crc32_where_installed():
    """The remote extras install python-isal; where it is missing, zlib's CRC32 (the same)."""
    try:
        from isal.isal_zlib import crc32
    except ImportError:
        crc32 = zlib.crc32
    assert cache_format._crc32 is crc32


@given(data=st.data())
def test_a_check_of_part_of_a_range_reads_and_checks_only_its_blocks(tmp_path_factory, data):
    """A reader of one column of a row group (`RowIndex`'s stats: `doc_offsets` alone) checked
    the CRC32 of the whole range, in every process, for every row group an epoch plans. Now it
    checks the blocks its bytes lie in, and is handed only those bytes: a flipped bit there is
    downloaded again; one elsewhere is left to the reader of those bytes (a whole pin here),
    which downloads it again."""
    folder = tmp_path_factory.mktemp("partial")
    obj = folder / "object.bin"
    obj.write_bytes(os.urandom(3 * BLOCK + 5000))
    body = obj.read_bytes()
    cache = RangeCache(folder / "c", 1 << 30)
    start = data.draw(st.integers(0, 2 * BLOCK), label="start")
    end = data.draw(st.integers(start + 1, len(body)), label="end")
    a = data.draw(st.integers(start, end), label="a")
    b = data.draw(st.integers(a, end), label="b")
    flip = data.draw(st.integers(0, end - start - 1), label="flipped byte")
    assert _read(cache, obj, start, end) == body[start:end]
    path = cache.path(KEY, start, end)
    damaged = bytearray(path.read_bytes())
    assert len(damaged) == end - start + trailer_size(end - start)
    damaged[flip] ^= 0x10
    path.write_bytes(bytes(damaged))
    before = cache.downloaded
    with cache.pinned(obj, KEY, start, end, check=(a, b)) as view:
        assert bytes(view) == body[a:b]
    checked = a < b and (a - start) // BLOCK <= flip // BLOCK < -(-(b - start) // BLOCK)
    assert cache.downloaded == before + (end - start if checked else 0)
    assert _read(cache, obj, start, end) == body[start:end]  # whole: never the flipped byte
    assert cache.downloaded == before + end - start


def test_a_check_outside_the_range_is_refused(tmp_path, obj):
    cache = RangeCache(tmp_path / "c", 1 << 30)
    refused = pytest.raises(ValueError, match="not within the range")
    with refused, cache.pinned(obj, KEY, 100, 200, check=(50, 150)):
        pass


def test_an_empty_range_and_a_fresh_copy_pass_their_check(tmp_path, obj):
    cache = RangeCache(tmp_path / "c", 1 << 30)
    assert _read(cache, obj, 5, 5) == b""
    assert _read(cache, obj, 0, 50_000) == obj.read_bytes()
    assert cache.downloaded == 50_000


def test_an_unlocked_empty_part_from_the_future_is_taken_over(tmp_path, obj):
    """A reader killed mid-GET leaves an empty `.part`; with its mtime ahead of the clock
    (a clock stepped back, another machine's clock) every reader waited until then."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    path = cache.path(KEY, 0, 100)
    path.parent.mkdir(parents=True)
    part = path.with_name(path.name + ".part")
    part.touch()
    future = time.time() + 600
    os.utime(part, (future, future))
    done = []
    t = threading.Thread(target=lambda: done.append(_read(cache, obj, 0, 100)), daemon=True)
    t.start()
    t.join(timeout=20)
    assert done == [obj.read_bytes()[:100]]


def test_a_past_runs_excess_goes_at_the_first_download(tmp_path, obj):
    """The sweep counter started at 0 in every process: each could add limit / 16 before its
    first sweep, and what a run left over the limit stayed."""
    big = RangeCache(tmp_path / "c", 1 << 30)
    for i in range(10):  # a past run: 200 KB of ranges
        _read(big, obj, i * 3000, i * 3000 + 20_000)
    assert big.sweep() == 10 * (20_000 + trailer_size(20_000))
    small = RangeCache(tmp_path / "c", 100_000)
    _read(small, obj, 45_000, 46_000)  # one download, far below limit / 16
    held = sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert held <= 100_000  # measured on disk (a sweep() here would sweep)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_cache_folder_that_cannot_be_written_says_so(tmp_path, obj, monkeypatch, code):
    """A full or read-only cache_dir was reported as a damaged shard ('footer unreadable',
    'the shard is damaged'). The file system's answer is stood in for here (the tests run as
    root on a disk that is neither full nor read-only)."""
    real = os.open

    def refusing(path, flags, *args):
        if str(path).endswith(".part"):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, flags, *args)

    monkeypatch.setattr(cache_module.os, "open", refusing)
    cache = RangeCache(tmp_path / "c", 1 << 20)
    with pytest.raises(ConfigError, match=rf"^cache_dir {tmp_path / 'c'}: cannot write a download"):
        _read(cache, obj, 0, 100)


def test_the_sweep_counts_and_deletes_only_the_caches_own_files(tmp_path, obj):
    """The sweep counted and deleted every file two levels under cache_dir, oldest first: a
    dataset copied to cache_dir/other_dataset lost all 12 of its files to a 2 MB limit."""
    folder = tmp_path / "c"
    cache = RangeCache(folder, 30_000)
    theirs = [
        folder / "other_dataset" / "shard-00000.parquet",
        folder / "notes" / "a.txt",
        folder / "ab" / "notes.txt",  # the cache's own subfolder, not its name
        folder / "ab" / f"{KEY}-0-100.bak",
        folder / "ab" / f"{KEY.upper()}-0-100",
        folder / "zz" / f"{KEY}-0-100",  # a range's name in the wrong subfolder
        folder / "keep.txt",
    ]
    for path in theirs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(20_000))
        os.utime(path, (1, 1))  # older than any range
    for i in range(4):
        _read(cache, obj, i * 8000, i * 8000 + 8000)
    held = 3 * (8000 + TRAILER)  # 4 ranges over the 30 KB limit: down to 27 KB, the oldest gone
    assert cache.sweep() == held
    assert all(path.read_bytes() and len(path.read_bytes()) == 20_000 for path in theirs)
    assert not cache.path(KEY, 0, 8000).exists() and cache.path(KEY, 24_000, 32_000).exists()


def test_an_empty_cache_dir_is_refused(tmp_path, monkeypatch):
    """cache_dir="" meant the current folder, whose checkpoints and notes the sweep deleted."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^cache_dir is empty") as caught:
        RangeCache("", 1 << 20)
    assert "\n" not in str(caught.value)


def test_a_content_key_that_is_no_sha256_is_refused(tmp_path):
    """Every name the cache writes is one its sweep counts (and none lies outside cache_dir)."""
    cache = RangeCache(tmp_path / "c", 1 << 20)
    for key in ("../../etc/x", KEY.upper(), KEY[:-1]):
        with pytest.raises(DataError, match=r"is not a sha256 \(64 hex digits\)"):
            cache.path(key, 0, 10)


@pytest.mark.parametrize(
    "mode, owner, says",
    [
        (0o1777, None, r"writable by others \(mode 1777\)"),
        (0o775, None, r"writable by its group \(mode 775\)"),
        (0o755, 65534, r"another user's \(uid 65534\)"),
    ],
)
def test_a_cache_dir_another_user_can_write_in_is_refused(tmp_path, mode, owner, says):
    """In a mode-1777 cache_dir, a file uid 65534 planted under a range's name with a valid
    CRC trailer was delivered: 293,891 tokens of 'A' in place of the dataset's."""
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, mode)
    if owner is not None:
        os.chown(folder, owner, owner)
    with pytest.raises(ConfigError, match=rf"^cache_dir {folder} is {says}: ") as caught:
        RangeCache(folder, 1 << 20)
    assert "\n" not in str(caught.value)


def test_a_missing_cache_dir_is_made_this_users_alone(tmp_path, obj):
    """Under a loose umask the folder and its files were open to the group (0775, 0664)."""
    old = os.umask(0o002)
    try:
        cache = RangeCache(tmp_path / "new" / "c", 1 << 20)
        assert _read(cache, obj, 0, 100) == obj.read_bytes()[:100]
    finally:
        os.umask(old)
    path = cache.path(KEY, 0, 100)
    modes = [p.stat().st_mode & 0o777 for p in (tmp_path / "new" / "c", path.parent, path)]
    assert modes == [0o700, 0o700, 0o600]
    RangeCache(tmp_path / "new" / "c", 1 << 20)  # and accepted by the next process


def test_a_cached_file_another_user_planted_is_downloaded_again(tmp_path, obj):
    """A cached copy was checked only against its own CRC trailer, which anyone can write."""
    cache = RangeCache(tmp_path / "c", 1 << 20)
    want = obj.read_bytes()[1000:3000]
    assert _read(cache, obj, 1000, 3000) == want
    path = cache.path(KEY, 1000, 3000)
    forged = b"A" * 2000
    path.write_bytes(forged + zlib.crc32(forged).to_bytes(4, "little") + MAGIC)
    os.chown(path, 65534, 65534)
    before = cache.downloaded
    assert _read(cache, obj, 1000, 3000) == want
    assert cache.downloaded == before + 2000 and path.stat().st_uid == os.getuid()


def _read_within(cache: RangeCache, obj: Path, start: int, end: int) -> bytes | Exception:
    """`_read`, or the error it raised, on a thread given 10 s (a spinning reader never ends)."""
    out: list = []

    def run() -> None:
        try:
            out.append(_read(cache, obj, start, end))
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout=10)
    assert out, "still reading after 10 s"
    return out[0]


def _plant(path: Path, kind: str, other: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "dangling_link":
        os.symlink(path.parent / "nowhere", path)
    elif kind == "link":  # to another cached file of the same size, valid trailer and all
        os.symlink(other, path)
    elif kind == "folder":
        path.mkdir()
    elif kind == "full_folder":
        path.mkdir()
        (path / "x").write_text("x")
    else:
        os.mkfifo(path)


@pytest.mark.parametrize("where", ["part", "range"])
@pytest.mark.parametrize("kind", ["dangling_link", "link", "folder", "fifo", "full_folder"])
def test_a_link_or_folder_at_a_cache_name_is_replaced_or_named(tmp_path, obj, where, kind):
    """A dangling link or a folder at NAME.part made every reader spin at 100% CPU forever;
    a folder at a range's name failed every run as 'the cached copy fails its CRC32 after
    downloading anew ... the shard is damaged'."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    other = cache.path(KEY, 100, 200)
    _read(cache, obj, 100, 200)
    path = cache.path(KEY, 0, 100)
    planted = path.with_name(path.name + ".part") if where == "part" else path
    _plant(planted, kind, other)
    got = _read_within(cache, obj, 0, 100)
    if kind == "full_folder":  # someone's files: not the cache's to delete
        assert isinstance(got, ConfigError), got
        assert str(got) == (
            f"cache_dir {tmp_path / 'c'}: cannot remove {planted} (Directory not empty), "
            "where the cache keeps a range; remove it by hand"
        )
        assert (planted / "x").exists()
    else:
        assert got == obj.read_bytes()[:100]
        assert path.is_file() and not path.is_symlink() and other.is_file()


def test_a_dead_downloaders_part_that_cannot_be_removed_is_one_line(tmp_path, obj, monkeypatch):
    """The take-over's failed unlink was ignored and the reader tried again at once, forever."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    path = cache.path(KEY, 0, 100)
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True)
    part.write_bytes(b"half a download")  # bytes and no lock: its downloader died
    real = os.unlink

    def refusing(name, *args, **kwargs):
        if str(name) == str(part):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(cache_module.os, "unlink", refusing)
    got = _read_within(cache, obj, 0, 100)
    assert isinstance(got, ConfigError), got
    assert str(got).startswith(f"cache_dir {tmp_path / 'c'}: cannot remove {part} (Permission")


@pytest.mark.parametrize("refused", ["open", "unlink", "scandir"])
def test_a_file_the_sweep_cannot_open_or_delete_never_fails_a_read(
    tmp_path, obj, monkeypatch, refused
):
    """Another user's file in the cache made the sweep raise EACCES, reported as a damaged shard
    ('footer unreadable ([Errno 13] Permission denied: <another dataset's cache file>)'). The
    file system's answer is stood in for (the tests run as root)."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    for i in range(4):
        _read(cache, obj, i * 8000, i * 8000 + 8000)
        os.utime(cache.path(KEY, i * 8000, i * 8000 + 8000), (i + 1, i + 1))
    theirs = cache.path(KEY, 0, 8000)  # the oldest
    real = getattr(os, refused)

    def refusing(name, *args, **kwargs):
        if os.fspath(name) in (str(theirs), str(theirs.parent)):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(name))
        return real(name, *args, **kwargs)

    monkeypatch.setattr(cache_module.os, refused, refusing)
    small = RangeCache(tmp_path / "c", 20_000)
    assert _read(small, obj, 40_000, 48_000) == obj.read_bytes()[40_000:48_000]
    left = sorted(p.name for p in theirs.parent.iterdir())
    if refused == "open":  # not this user's to read, but in this user's folder: deleted
        assert str(theirs.name) not in left and len(left) == 2
    elif refused == "unlink":  # kept, the next oldest deleted in its place
        assert str(theirs.name) in left and len(left) == 2
    else:  # a subfolder it cannot list is not counted
        assert len(left) == 5


def _gets(monkeypatch) -> list[tuple[int, int]]:
    """The GETs the cache makes (`local.read_range`), recorded."""
    asked: list[tuple[int, int]] = []
    real = cache_module.local.read_range

    def counting(url, start, end):
        asked.append((start, end))
        return real(url, start, end)

    monkeypatch.setattr(cache_module.local, "read_range", counting)
    return asked


def test_fetch_many_joins_adjacent_ranges_and_leaves_what_is_there_or_taken(
    tmp_path, obj, monkeypatch
):
    """Row groups side by side come in one GET (at most `MERGED_BYTES`, or one range), each
    cached on its own; a range already cached or being downloaded by another process is not
    asked for."""
    import fcntl

    monkeypatch.setattr(cache_module, "MERGED_BYTES", 450)
    cache = RangeCache(tmp_path / "c", 1 << 20)
    cache.fetch(obj, KEY, 300, 400)  # cached before
    busy = cache.path(KEY, 700, 800).with_name(f"{KEY}-700-800.part")
    busy.parent.mkdir(parents=True, exist_ok=True)
    other = os.open(busy, os.O_CREAT | os.O_WRONLY, 0o600)  # another process downloads it
    fcntl.flock(other, fcntl.LOCK_EX)
    asked = _gets(monkeypatch)
    ranges = [(0, 100), (100, 300), (300, 400), (400, 600), (600, 700), (700, 800), (800, 900),
              (2000, 2100), (2100, 2600)]  # fmt: skip
    try:
        cache.fetch_many(obj, KEY, list(reversed(ranges)))
    finally:
        os.close(other)
    # 0-300 joined; 300-400 was there; 400-700 joined; 700-800 another's; 800-900 alone;
    # 2000-2100 then 2100-2600 (together past MERGED_BYTES: apart).
    assert asked == [(0, 300), (400, 700), (800, 900), (2000, 2100), (2100, 2600)]
    data = obj.read_bytes()
    del asked[:]
    os.unlink(busy)  # its downloader is gone: the reader below fetches it itself
    for start, end in ranges:
        assert _read(cache, obj, start, end) == data[start:end]
    assert asked == [(700, 800)]
    assert not list((tmp_path / "c").rglob("*.part"))


def test_a_failed_joined_download_leaves_no_part_and_what_came_before_cached(
    tmp_path, obj, monkeypatch
):
    cache = RangeCache(tmp_path / "c", 1 << 20)
    real = cache_module.local.read_range

    def failing(url, start, end):
        if start >= 1000:
            raise OSError("connection reset by peer")
        return real(url, start, end)

    monkeypatch.setattr(cache_module.local, "read_range", failing)
    with pytest.raises(OSError, match="connection reset"):
        cache.fetch_many(obj, KEY, [(0, 100), (100, 200), (1000, 1100), (1100, 1200), (5000, 5100)])
    assert not list((tmp_path / "c").rglob("*.part"))  # the failed run's and the one after it
    names = sorted(p.name for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert names == [f"{KEY}-0-100", f"{KEY}-100-200"]
    monkeypatch.setattr(cache_module.local, "read_range", real)
    assert _read(cache, obj, 1000, 1100) == obj.read_bytes()[1000:1100]


def test_fetch_many_holds_at_most_merged_ranges_parts_at_once(tmp_path, obj, monkeypatch):
    """Every range of a call was claimed (an open, locked `.part`) before the first GET: 540
    descriptors for a 16 MB run of 30 KB row groups, and a process out of them failed readers
    of other ranges. A run's ranges are claimed just before its GET, at most `MERGED_RANGES`."""
    monkeypatch.setattr(cache_module, "MERGED_RANGES", 4)
    cache = RangeCache(tmp_path / "c", 1 << 20)
    asked = _gets(monkeypatch)
    held: list[int] = []
    real = cache._download

    def counting(url, claims):
        held.append(len(list((tmp_path / "c").rglob("*.part"))))
        return real(url, claims)

    monkeypatch.setattr(cache, "_download", counting)
    cache.fetch_many(obj, KEY, [(i * 100, i * 100 + 100) for i in range(10)])
    assert asked == [(0, 400), (400, 800), (800, 1000)]
    assert held == [4, 4, 2]
    data = obj.read_bytes()
    assert all(
        _read(cache, obj, i * 100, i * 100 + 100) == data[i * 100 : i * 100 + 100]
        for i in range(10)
    )


def test_a_forked_child_holds_none_of_the_caches_locks(tmp_path, obj):
    """DataLoader workers forked while the main process downloaded inherited its locked
    `.part` (a `flock` belongs to the open file description, which fork shares): renamed into
    place the file stayed locked by the workers, and every reader of it (their own `pinned`,
    other ranks) waited forever. A child closes the cache's descriptors; the parent's locks
    are its own again, and go when it lets go of them."""
    import fcntl

    cache = RangeCache(tmp_path / "c", 1 << 30)
    path = cache.path(KEY, 0, 100)
    claim = cache._claim(path)  # a download under way: its `.part` created and locked
    assert isinstance(claim, int)
    ready, go = os.pipe()
    started, running = os.pipe()
    with cache.pinned(obj, KEY, 200, 300) as view:
        assert bytes(view) == obj.read_bytes()[200:300]
        pid = os.fork()
        if pid == 0:  # the worker: none of the parent's cache descriptors open
            try:
                os.fstat(claim)
                code = 1
            except OSError:
                code = 0
            os.write(running, b"x")
            os.read(ready, 1)  # lives on while the parent checks
            os._exit(code)
    os.read(started, 1)  # the child is past its fork
    os.close(started)
    os.close(running)
    cache._download(obj, [(claim, path, 0, 100)])  # the parent's descriptors closed
    try:
        for name in (path, cache.path(KEY, 200, 300)):
            fd = os.open(name, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # nobody holds it
            finally:
                os.close(fd)
        assert _read(cache, obj, 0, 100) == obj.read_bytes()[:100]
    finally:
        os.write(go, b"x")
        _, status = os.waitpid(pid, 0)
        os.close(ready)
        os.close(go)
    assert os.waitstatus_to_exitcode(status) == 0


def test_a_range_locked_for_good_is_one_line_not_a_hang(tmp_path, obj, monkeypatch):
    """`pinned` waited for its shared lock without end: a file another process holds locked
    (a descriptor inherited from before the fix, a hung process) hung every reader."""
    import fcntl

    monkeypatch.setattr(cache_module, "PIN_WAIT_S", 0.05)
    cache = RangeCache(tmp_path / "c", 1 << 30)
    path = cache.fetch(obj, KEY, 0, 100)
    other = os.open(path, os.O_RDONLY)  # another process's lock on it, never let go
    fcntl.flock(other, fcntl.LOCK_EX)
    try:
        with pytest.raises(ConfigError, match=rf"^cache_dir {tmp_path / 'c'}: .* locked"):
            _read(cache, obj, 0, 100)
    finally:
        os.close(other)


def test_a_cache_dir_removed_during_a_download_is_made_again(tmp_path, obj, monkeypatch):
    """cache_dir removed while a range downloaded (a tmp cleaner, `rm -rf ~/.cache/packtool`):
    the rename of its `.part` failed (ENOENT) and the loader called the shard damaged. The
    folders are made again and the bytes in hand written once more; removed again, one line."""
    import shutil

    cache = RangeCache(tmp_path / "c", 1 << 30)
    real = cache_module.local.read_range
    removals = []

    def removed_meanwhile(url, start, end):
        data = real(url, start, end)
        if len(removals) < want_removals:
            removals.append(1)
            shutil.rmtree(tmp_path / "c")
        return data

    monkeypatch.setattr(cache_module.local, "read_range", removed_meanwhile)
    want_removals = 1
    assert _read(cache, obj, 0, 100) == obj.read_bytes()[:100]
    assert cache.downloaded == 100  # one GET: written again from the bytes in hand

    def removed_twice(fd, data):  # the rename of the second try fails too
        shutil.rmtree(tmp_path / "c", ignore_errors=True)
        return real_write(fd, data)

    real_write = os.write
    monkeypatch.setattr(cache_module.os, "write", removed_twice)
    with pytest.raises(ConfigError, match=rf"^cache_dir {tmp_path / 'c'}: removed while"):
        cache.fetch(obj, KEY, 100, 200)


def test_a_disk_full_below_cache_limit_makes_room_and_downloads(tmp_path, obj, monkeypatch):
    """A disk that filled before `cache_limit` (a small tmpfs, other files on it) ended the run
    at the next download. The least recently read ranges nobody holds are deleted until it
    fits, and the write tried once more; a disk still full is the one line."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    for i in range(5):
        _read(cache, obj, i * 8000, i * 8000 + 8000)
    full = [1]
    real_write = os.write

    def full_once(fd, data):
        if full:
            full.pop()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    class NoRoom:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(cache_module.os, "statvfs", lambda path: NoRoom())
    monkeypatch.setattr(cache_module.os, "write", full_once)
    with cache.pinned(obj, KEY, 0, 8000):  # the oldest, but held: kept
        assert _read(cache, obj, 45_000, 50_000) == obj.read_bytes()[45_000:50_000]
    left = sorted(p.name for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert f"{KEY}-0-8000" in left and f"{KEY}-8000-16000" not in left
    assert len(left) < 6
    full.extend([1, 1])  # full again after room was made
    with pytest.raises(ConfigError, match=rf"^cache_dir {tmp_path / 'c'}: cannot write"):
        _read(cache, obj, 20_000, 21_000)


def test_a_disk_full_lists_the_cache_folder_once(tmp_path, obj, monkeypatch):
    """Making room on a full disk swept the cache twice (once to its limit, once to make room):
    2 listings of cache_dir and of each of its subfolders (O(files) twice) per ENOSPC. One
    listing, and the least recently read range still goes to make room."""
    cache = RangeCache(tmp_path / "c", 1 << 30)
    for i in range(5):
        _read(cache, obj, i * 8000, i * 8000 + 8000)
    full = [1]
    real_write, real_scandir = os.write, os.scandir
    listed: list[str] = []

    def full_once(fd, data):
        if full:
            full.pop()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def counted(path):
        listed.append(str(path))
        return real_scandir(path)

    class NoRoom:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(cache_module.os, "statvfs", lambda path: NoRoom())
    monkeypatch.setattr(cache_module.os, "write", full_once)
    monkeypatch.setattr(cache_module.os, "scandir", counted)
    assert _read(cache, obj, 45_000, 50_000) == obj.read_bytes()[45_000:50_000]
    assert listed.count(str(tmp_path / "c")) == 1, listed
    assert listed.count(str(tmp_path / "c" / KEY[:2])) == 1, listed
    left = sorted(p.name for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert f"{KEY}-0-8000" not in left and f"{KEY}-45000-50000" in left
