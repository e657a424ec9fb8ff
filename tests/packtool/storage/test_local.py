"""packtool/storage/local.py, stat and random reads (finding inputs: tests/packtool/read/)."""

from __future__ import annotations

import os

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
