"""packtool/storage/writing.py: files written whole or not at all, the lock, removal, in-place appends."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.storage import local as storage
from packtool.storage import writing

ROOT = Path(__file__).resolve().parents[3]


def test_atomic_output_replaces_the_file_whole(tmp_path):
    path = tmp_path / "index.json"
    path.write_bytes(b"old")
    with writing.atomic_output(path, text=True) as f:
        f.write("new")
        assert path.read_bytes() == b"old"  # nothing is seen before the block ends
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index.json"]


def test_atomic_output_that_fails_keeps_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), writing.atomic_output(path) as f:
        f.write(b"half")
        raise RuntimeError("a full disk, say")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_write_atomic_makes_the_parents_when_asked(tmp_path):
    path = tmp_path / "a" / "b" / "record.json"
    with pytest.raises(FileNotFoundError):
        writing.write_atomic(path, b"{}")
    writing.write_atomic(path, b"{}", make_parent=True)
    assert path.read_bytes() == b"{}"


def test_temporary_names_are_hidden_beside_and_unique(tmp_path):
    names = {writing.temporary_name(tmp_path / "shard-00000.parquet") for _ in range(100)}
    assert len(names) == 100
    assert all(n.parent == tmp_path and n.name.startswith(".shard-00000.parquet.") for n in names)
    assert all(n.name.endswith(".tmp") for n in names)


def test_is_temporary_knows_every_temporary_name_and_no_final_one(tmp_path):
    """What tells a staging folder a killed run left before its plan (records.never_planned)."""
    for path in (tmp_path / "plan.json", "s3://b/v/.packtool-run/plan.json"):
        assert writing.is_temporary(writing.temporary_name(path).name)
    for name in ("plan.json", ".plan.json", "shard-000000-00000.parquet", ".plan.json.tmp",
                 ".plan.json.12-0123abcd.tmp.x", "parts"):  # fmt: skip
        assert not writing.is_temporary(name), name


def test_looks_temporary_takes_every_temporary_and_an_older_packtools_but_not_dot_tmp(tmp_path):
    """The shape cleanups, --overwrite and verify go by (`.X.tmp`): finish and --overwrite took a
    user's file named `.tmp` for a temporary, which verify's `.*.tmp` never did."""
    for path in (tmp_path / "plan.json", "s3://b/v/shard-000000-00000.parquet"):
        name = writing.temporary_name(path).name
        assert writing.is_temporary(name) and writing.looks_temporary(name)
    assert writing.looks_temporary(".shard-00007.parquet.tmp")  # an older packtool's
    assert not writing.is_temporary(".shard-00007.parquet.tmp")
    for name in (".tmp", "x.tmp", ".plan.json", "shard-000000-00000.parquet", ".x.tmp.y"):
        assert not writing.looks_temporary(name), name
    files = [".tmp", "..tmp", ".a.tmp", "a.tmp", ".a.tmpx"]
    for name in files:
        (tmp_path / name).write_text("x")
    globbed = {p.name for p in storage.glob(tmp_path, writing.TEMPORARY_GLOB)}
    assert globbed == {n for n in files if writing.looks_temporary(n)} == {"..tmp", ".a.tmp"}


def test_make_dirs_names_the_file_in_the_way(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"file is a file, not a folder"):
        writing.make_dirs(tmp_path / "file" / "sub" / "out")
    writing.make_dirs(tmp_path / "x" / "y")
    writing.make_dirs(tmp_path / "x" / "y")  # again: nothing
    assert storage.is_dir(tmp_path / "x" / "y")


def test_make_dir_never_takes_over_what_is_there(tmp_path):
    writing.make_dir(tmp_path / "staging")
    with pytest.raises(FileExistsError):
        writing.make_dir(tmp_path / "staging")


def test_remove_tree_removes_a_symlink_not_what_it_names(tmp_path):
    target = tmp_path / "data"
    (target / "sub").mkdir(parents=True)
    (target / "sub" / "f").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target)
    writing.remove_tree(link)
    assert not storage.lexists(link) and (target / "sub" / "f").exists()
    writing.remove_tree(target)
    assert not storage.lexists(target)
    writing.remove_tree(target)  # nothing there: nothing to do


def test_remove_empty_dir_keeps_a_folder_that_holds_anything(tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / ".hidden").write_text("")
    (tmp_path / "empty").mkdir()
    assert not writing.remove_empty_dir(tmp_path / "full")
    assert writing.remove_empty_dir(tmp_path / "empty")
    assert not writing.remove_empty_dir(tmp_path / "empty")  # gone already
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


@settings(max_examples=40, deadline=None)
@given(
    head=st.binary(max_size=3000),
    source=st.binary(min_size=1, max_size=20_000),
    data=st.data(),
    kernel=st.booleans(),
)
def test_append_range_equals_slicing(tmp_path_factory, head, source, data, kernel):
    """The in-place join of the shard writer: `count` bytes of `source` from `offset`, appended,
    against the plain reference (bytes slicing), with the kernel copy and with the fallback."""
    folder = tmp_path_factory.mktemp("append")
    offset = data.draw(st.integers(0, len(source) - 1))
    count = data.draw(st.integers(0, len(source) - offset))
    (folder / "src").write_bytes(source)
    (folder / "out").write_bytes(head)
    real = getattr(os, "copy_file_range", None)
    if not kernel and real is not None:
        del os.copy_file_range  # not Linux: the fallback copy
    try:
        with writing.open_update(folder / "out") as out:
            out.seek(0, os.SEEK_END)
            writing.append_range(folder / "src", offset, count, out)
    finally:
        if real is not None:
            os.copy_file_range = real
    assert (folder / "out").read_bytes() == head + source[offset : offset + count]


def test_append_range_refuses_a_source_shorter_than_asked(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    (tmp_path / "src").write_bytes(b"abc")
    (tmp_path / "out").write_bytes(b"")
    with (
        writing.open_update(tmp_path / "out") as out,
        pytest.raises(OSError, match="shorter than its footer says") as info,
    ):
        writing.append_range(tmp_path / "src", 1, 10, out)
    # Named as a failed read of the source (until 2026-12-07 no errno and no filename: a
    # caller's `naming` put its own file's name on it)
    assert info.value.filename == str(tmp_path / "src") and info.value.errno == errno.EIO


def _append(tmp_path, source=b"abcdefgh"):
    (tmp_path / "src").write_bytes(source)
    (tmp_path / "out").write_bytes(b"head")
    with writing.open_update(tmp_path / "out") as out:
        out.seek(0, os.SEEK_END)
        writing.append_range(tmp_path / "src", 2, 4, out)
    return (tmp_path / "out").read_bytes()


@pytest.mark.parametrize(
    "code", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.EPERM, None]
)
def test_append_range_copies_plainly_where_the_kernel_copy_is_not_supported(
    tmp_path, monkeypatch, code
):
    def unsupported(*args):
        if code is None:
            return 0  # some file systems copy nothing rather than say no
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "copy_file_range", unsupported, raising=False)
    assert _append(tmp_path) == b"head" + b"cdef"


@pytest.mark.parametrize(
    ("code", "named"), [(errno.EIO, "src"), (errno.ENOSPC, "out"), (errno.EDQUOT, "out")]
)
def test_append_range_raises_a_failed_kernel_copy_naming_its_file(
    tmp_path, monkeypatch, code, named
):
    # Seen: any OSError of copy_file_range (a full disk, EIO) was taken for "not supported"
    # and the same bytes copied again by read/write, hiding the error it had met.
    def failing(*args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "copy_file_range", failing, raising=False)
    with pytest.raises(OSError) as info:
        _append(tmp_path)
    assert info.value.errno == code
    assert info.value.filename == str(tmp_path / named)
    assert (tmp_path / "out").read_bytes() == b"head"  # no plain copy after it


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="Linux /proc")
def test_append_range_names_the_source_when_its_plain_read_fails(tmp_path, monkeypatch):
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    (tmp_path / "out").write_bytes(b"")
    with writing.open_update(tmp_path / "out") as out, pytest.raises(OSError) as info:
        writing.append_range("/proc/self/mem", 0, 10, out)  # reading offset 0 is EIO
    assert info.value.errno == errno.EIO
    assert info.value.filename == "/proc/self/mem"


def test_take_lock_is_exclusive_and_released(tmp_path):
    path = tmp_path / ".out.packtool-lock"
    held = writing.take_lock(path)
    held.write(b'{"pid": 1}')
    # flock is per open file: a second open in this process is refused like another process
    with pytest.raises(writing.LockBusy) as busy:
        writing.take_lock(path)
    assert json.loads(busy.value.holder) == {"pid": 1}
    held.release()
    assert not path.exists()  # unlinked while held, so a waiter sees a new file
    held.release()  # again: nothing
    writing.take_lock(path).release()


def test_a_lock_held_by_a_killed_process_is_free(tmp_path):
    path = tmp_path / "lock"
    code = (
        "import sys, time\n"
        "from packtool.storage import writing\n"
        f"writing.take_lock({str(path)!r})\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == b"held"
        with pytest.raises(writing.LockBusy):
            writing.take_lock(path)
    finally:
        child.kill()
        child.wait()
    writing.take_lock(path).release()  # the kernel dropped it with the process


def test_sync_file_and_replace_keep_the_bytes(tmp_path):
    data = os.urandom(100_000)
    tmp = writing.temporary_name(tmp_path / "s.parquet")
    tmp.write_bytes(data)
    writing.sync_file(tmp)
    writing.replace(tmp, tmp_path / "s.parquet")
    assert (
        hashlib.sha256((tmp_path / "s.parquet").read_bytes()).digest()
        == hashlib.sha256(data).digest()
    )
    writing.sync_dir(tmp_path)
    writing.sync_dir(tmp_path / "missing")  # a folder that cannot be opened: nothing


def test_temporary_folder_is_removed_after(tmp_path):
    with writing.temporary_folder("packtool-test-") as folder:
        (folder / "ranks").write_bytes(b"x")
        assert storage.is_dir(folder)
    assert not storage.exists(folder)


def test_the_default_scratch_folder_is_this_users_alone(tmp_path, monkeypatch):
    """A fixed /tmp/packtool-scratch made by anyone (or a link to their folder) held this
    user's Hub staging and uploads, with predictable lock paths inside."""
    import stat as st

    from packtool.errors import ConfigError
    from packtool.storage import writing

    monkeypatch.delenv(writing.SCRATCH_ENV, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    folder = writing.scratch_dir()
    assert folder == tmp_path / f"packtool-scratch-{os.getuid()}"
    assert st.S_IMODE(folder.stat().st_mode) == 0o700
    assert writing.scratch_dir() == folder  # found again as it is
    folder.chmod(0o777)  # open to others: refused
    with pytest.raises(ConfigError, match="is not a private folder of this user"):
        writing.scratch_dir()
    folder.rmdir()
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o700)
    folder.symlink_to(elsewhere)  # a link planted at the name: refused
    with pytest.raises(ConfigError, match="is not a private folder of this user"):
        writing.scratch_dir()
    monkeypatch.setenv(writing.SCRATCH_ENV, str(tmp_path / "mine"))  # the user's own choice
    assert writing.scratch_dir() == tmp_path / "mine"


def test_a_killed_writer_s_scratch_temporaries_go_when_the_next_run_starts(tmp_path, monkeypatch):
    # A pack into a bucket killed with kill -9 left its shard temporaries in the scratch folder
    # for good (11 after a few runs), though it holds at most two shards a worker. The next
    # process to use it deletes this host's temporaries whose writer is dead, and nothing else.
    scratch = tmp_path / "scratch"
    monkeypatch.setenv(writing.SCRATCH_ENV, str(scratch))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def python(code: str) -> str:
        return subprocess.run(
            [sys.executable, "-c", f"from packtool.storage import writing\n{code}"],
            env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip

    left = Path(  # written, never uploaded nor removed: as by a writer killed with -9
        python(
            "p = writing.temporary_name('s3://b/v/shard-000000-00000.parquet')\n"
            "p.write_bytes(b'half a shard'); print(p)"
        )
    )
    assert left.is_file()
    live = writing.temporary_name("s3://b/v/shard-000001-00000.parquet")  # this process's
    live.write_bytes(b"being written")
    hub = scratch / "hub" / "abc" / "staging"  # a Hub build waiting for --resume
    hub.mkdir(parents=True)
    (hub / left.name).write_bytes(b"kept")
    mine = scratch / ".notes.123-0123abcd.tmp"  # not a name packtool gives
    mine.write_bytes(b"kept")
    tag = left.name.rsplit("-", 1)[1].removesuffix(".tmp")  # the writer's host
    elsewhere = scratch / left.name.replace(tag, "ffffffff" if tag != "ffffffff" else "00000000")
    elsewhere.write_bytes(b"another host's writer (a shared scratch folder): kept")
    python("writing.scratch_dir()")  # a run starts
    assert not left.exists()
    assert live.is_file() and (hub / left.name).is_file() and mine.is_file()
    assert elsewhere.is_file()


def test_a_sweep_in_another_pid_namespace_keeps_a_live_writer_s_temporaries(tmp_path, monkeypatch):
    # A container of the same host name sharing the scratch folder (host networking, a
    # hostPath scratch) could not see this writer's pid, took it for dead and deleted the
    # temporary it was writing. The tag now names the pid namespace too.
    scratch = tmp_path / "scratch"
    monkeypatch.setenv(writing.SCRATCH_ENV, str(scratch))
    live = writing.temporary_name("s3://b/v/shard-000000-00000.parquet")  # this live process's
    live.write_bytes(b"being written")
    sweep = "from packtool.storage import writing; writing.scratch_dir()"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", sweep]
    subprocess.run(command, env=env, check=True)  # a run starts in another pid namespace
    assert live.is_file()


def test_create_exclusive_is_one_winner_and_never_a_file_without_its_data(tmp_path):
    """Before: `O_CREAT | O_EXCL`, then the write: a process killed between the two left the
    file without (all of) its data for good (a Slurm worker's claim naming no owner, which
    nothing released: the run waited for ever). Now the data is written under a temporary
    name and linked in."""
    import signal
    import time

    path = tmp_path / "000001"
    assert writing.create_exclusive(path, b"7_1") and not writing.create_exclusive(path, b"8_0")
    assert path.read_bytes() == b"7_1" and [p.name for p in tmp_path.iterdir()] == ["000001"]
    # Killed mid-write, again and again: each name is there whole or not at all.
    big = 16 << 20
    child = (
        "import sys; from pathlib import Path; from packtool.storage import writing\n"
        f"data = bytes({big})\n"
        "for i in range(10**6):\n"
        "    writing.create_exclusive(Path(sys.argv[1]) / f'{i:06d}', data)\n"
    )
    for attempt in range(4):
        folder = tmp_path / f"kill{attempt}"
        folder.mkdir()
        proc = subprocess.Popen([sys.executable, "-c", child, str(folder)], cwd=ROOT)
        end = time.monotonic() + 30
        while len(list(folder.glob("[0-9]*"))) < 2 and time.monotonic() < end:
            time.sleep(0.01)
        time.sleep(0.003 * attempt)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        written = sorted(folder.glob("[0-9]*"))
        assert len(written) >= 2
        assert {p.stat().st_size for p in written} == {big}, [p.stat().st_size for p in written]
