"""pyarrow's files at names that are not UTF-8 (packtool/storage/local_files.py)."""

from __future__ import annotations

import os
import sys

import pyarrow as pa
import pytest

from packtool.storage import local, writing
from packtool.storage.local_files import arrow_path

pytestmark = pytest.mark.skipif(sys.platform == "darwin", reason="macOS names must be UTF-8")
TABLE = pa.table({"x": list(range(100)), "s": [f"row {i}" for i in range(100)]})


def test_a_utf8_name_goes_as_it_is(tmp_path):
    for name in ("plain.parquet", "中文.parquet"):
        with arrow_path(tmp_path / name) as given:
            assert given == tmp_path / name
        assert not (tmp_path / name).exists()  # nothing opened, nothing created


@pytest.mark.parametrize("how", ["writer", "write_table"])
def test_parquet_round_trip_at_a_name_that_is_not_utf8(tmp_path, how):
    path = tmp_path / os.fsdecode(b"sub\xff") / os.fsdecode(b"t\xe9.parquet")
    path.parent.mkdir()
    if how == "writer":
        with writing.parquet_writer(path, TABLE.schema) as w:
            w.write_table(TABLE)
    else:
        writing.write_parquet(TABLE, path, row_group_size=10)
    assert os.listdir(path.parent) == [path.name]  # written under its own name, nothing else
    assert local.parquet_schema(path) == TABLE.schema
    assert local.parquet_metadata(path).num_rows == 100
    assert local.parquet_file(path).read().equals(TABLE)
    assert local.parquet_file(path, memory_map=True).read().equals(TABLE)
    with local.memory_map(path) as mapped:
        assert mapped.size() == path.stat().st_size


def test_a_missing_file_at_such_a_name_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        local.parquet_schema(tmp_path / os.fsdecode(b"gone\xff.parquet"))


@pytest.mark.parametrize("name", [b"plain.parquet", b"err\xff.parquet"])
def test_a_failed_write_parquet_leaves_no_file_at_either_name(tmp_path, name):
    """Before: at a name that is not UTF-8 the failed write's partial file stayed (pyarrow's
    own removal was given `/proc/self/fd/N`, which cannot be removed); a UTF-8 name left none."""
    path = tmp_path / os.fsdecode(name)
    with pytest.raises(Exception, match="nosuch"):
        writing.write_parquet(TABLE, path, compression="nosuch")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", [b"plain.parquet", b"err\xff.parquet"])
@pytest.mark.parametrize(
    ("options", "message"),
    [({"compression": "nosuch"}, "nosuch"), ({"version": "9.9"}, "9.9")],
)
def test_a_parquet_writer_that_fails_to_start_leaves_no_file(tmp_path, name, options, message):
    """Before: `pq.ParquetWriter` opens (creates) the file, then refuses an option, and the
    empty file stayed at either name (0 bytes, looking like a written file)."""
    path = tmp_path / os.fsdecode(name)
    with pytest.raises(Exception, match=message):
        writing.parquet_writer(path, TABLE.schema, **options)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("name", [b"plain.parquet", b"old\xff.parquet"])
@pytest.mark.parametrize("options", [{"compression": "nosuch"}, {}])
def test_a_parquet_writer_never_truncates_a_file_that_holds_data(tmp_path, name, options):
    """Before: given an existing file, pyarrow truncated it to 0 bytes when it opened it, then
    refused the option, and the empty file stayed (the old Parquet file gone, at either name).
    No caller passes one (they write a new temporary name, or a file they just created empty):
    a file that holds data is refused before anything opens it, and stays as it was."""
    path = tmp_path / os.fsdecode(name)
    writing.write_parquet(TABLE, path)
    before = path.read_bytes()
    with pytest.raises(FileExistsError, match="holds data") as info:
        writing.parquet_writer(path, TABLE.schema, **options)
    assert info.value.filename == path
    assert "\n" not in str(info.value)
    assert path.read_bytes() == before and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("name", [b"plain.parquet", b"empty\xff.parquet"])
def test_a_parquet_writer_writes_into_an_empty_file_made_first(tmp_path, name):
    # What `tokenize -o x.parquet` and a shard's second part do: the file is made empty first.
    path = tmp_path / os.fsdecode(name)
    writing.create_empty(path)
    with pytest.raises(Exception, match="nosuch"):
        writing.parquet_writer(path, TABLE.schema, compression="nosuch")
    assert path.stat().st_size == 0  # the caller's, left as it was
    with writing.parquet_writer(path, TABLE.schema) as w:
        w.write_table(TABLE)
    assert local.parquet_file(path).read().equals(TABLE)
