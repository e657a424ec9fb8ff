"""packtool/storage/local.py, stat and random reads (finding inputs: tests/packtool/read/)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from packtool.storage import local as storage


def test_file_states_change_with_the_file(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"1")
    b.write_bytes(b"22")
    before = storage.file_states([a, b])
    assert [(p, size) for p, size, _ in before] == [(a, 1), (b, 2)]
    assert storage.file_states([a, b]) == before
    b.write_bytes(b"333")
    assert storage.file_states([a, b]) != before
    assert [st.st_size for st in storage.stat_all([b, a])] == [3, 1]


def test_random_file_sees_what_is_appended(tmp_path):
    path = tmp_path / "grows"
    path.write_bytes(b"")
    file = storage.open_random(path)
    try:
        assert file.size() == 0 and file.read_at(10, 0) == b""
        with open(path, "ab") as f:
            f.write(b"hello world")
        assert file.size() == 11
        assert file.read_at(5, 6) == b"world" and file.read_at(100, 6) == b"world"
        file.sync_data()
    finally:
        file.close()


def test_stat_and_kinds(tmp_path):
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "d").mkdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert storage.size(tmp_path / "f") == 3 == storage.stat(tmp_path / "f").st_size
    assert storage.is_file(tmp_path / "f") and not storage.is_dir(tmp_path / "f")
    assert storage.is_dir(tmp_path / "d") and not storage.is_mount(tmp_path / "d")
    assert not storage.exists(tmp_path / "dangling") and storage.lexists(tmp_path / "dangling")
    assert storage.is_symlink(tmp_path / "dangling")
    assert sorted(p.name for p in storage.list_dir(tmp_path)) == ["d", "dangling", "f"]
    assert storage.glob(tmp_path, "*") == sorted(tmp_path.iterdir())
    (tmp_path / "d" / "x.json").write_text("{}")
    assert storage.glob(tmp_path, "*.json", recursive=True) == [tmp_path / "d" / "x.json"]
    assert storage.resolve(tmp_path / "d" / ".." / "f") == (tmp_path / "f").resolve()
    assert storage.is_mount(os.sep)


def test_what_is_at_a_path_that_is_not_a_regular_file(tmp_path):
    # `what_is_at` (what is at this path), not to be confused with `formats.file_kind` (which
    # format a file name says): both were called `file_kind`.
    (tmp_path / "f").write_bytes(b"abc")
    (tmp_path / "d").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "f")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    os.mkfifo(tmp_path / "fifo")
    names = ["f", "link", "d", "dangling", "missing", "fifo"]
    assert [storage.what_is_at(tmp_path / n) for n in names] == [
        None,
        None,
        "a folder",
        "a dangling symbolic link",
        "nothing",
        "a pipe (FIFO)",
    ]


def test_a_small_file_is_read_within_a_bounded_address_space(tmp_path):
    # read_bytes read `f.read(SMALL_FILE_LIMIT + 1)`, which allocates its 4 GiB first: every
    # manifest and run record was a MemoryError in a process under `ulimit -v` (HPC jobs often
    # run so) or with overcommit off. Here the process may map 3 GiB in all.
    (tmp_path / "index.json").write_text('{"a": 1}\n')
    code = (
        "import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30)); "
        "from packtool.storage import local; "
        "sys.stdout.write(local.read_text(sys.argv[1]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "index.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, '{"a": 1}\n'), done.stderr[-500:]
    # A file that grows past its stat is read to its end (here: appended before the read).
    big = tmp_path / "grows"
    big.write_bytes(b"x" * 10)
    real_stat = os.stat

    def stale(path, *a, **k):  # the size the file had a moment before
        st = real_stat(path, *a, **k)
        return os.stat_result((st.st_mode, *st[1:6], 4, *st[7:])) if str(path) == str(big) else st

    with pytest.MonkeyPatch.context() as m:
        m.setattr(os, "stat", stale)
        assert storage.read_bytes(big) == b"x" * 10
