"""The names packtool writes in a dataset folder (packtool/dataset/names.py)."""

from __future__ import annotations

import pytest

from packtool.dataset import names
from packtool.dataset.output_versions import ours
from packtool.engines import records
from packtool.storage import writing


def test_is_shard_name_knows_both_shard_patterns_and_nothing_else():
    """`pack` writes `shard-PPPPPP-KKKKK.parquet`, `write_shards` (loader.testing, an older
    pack) `shard-NNNNN.parquet`: one test takes both."""
    assert records.shard_name(3, 7) == "shard-000003-00007.parquet"
    for name in (records.shard_name(0, 0), records.shard_name(1234567, 0)):
        assert names.is_shard_name(name), name
    assert names.is_shard_name(names.SHARD_PATTERN.format(12))
    for name in ("part-00000.parquet", "shard-00000.arrow", "myshard-00000.parquet"):
        assert not names.is_shard_name(name), name
    assert names.is_part_name(names.PART_PATTERN.format(0))
    assert not names.is_part_name(names.SHARD_PATTERN.format(0))


@pytest.mark.parametrize("parts", [False, True])
def test_written_entry_goes_by_name_and_kind(parts):
    for name in ("shard-000000-00000.parquet", "index.json", "sources.json", ".x.parquet.tmp"):
        assert names.written_entry(name, True, parts=parts), name
        assert not names.written_entry(name, False, parts=parts), name  # a folder of that name
    for name in (names.RUN_STATE, *names.OLD_STATE):  # a run's state: a folder or a file
        assert names.written_entry(name, True, parts=parts)
        assert names.written_entry(name, False, parts=parts)
    assert names.written_entry("part-00000.parquet", True, parts=parts) is parts
    for name in ("notes.txt", ".tmp", ".packtool-staging"):
        assert not names.written_entry(name, True, parts=parts), name


def test_a_run_writes_its_state_under_the_one_name():
    assert records.RUN_DIR == names.RUN_STATE
    assert writing.looks_temporary(writing.temporary_name("/x/" + names.RUN_STATE).name)


@pytest.mark.parametrize("name", ["index.json", "sources.json"])
def test_a_folder_named_like_the_manifest_is_not_packtools(tmp_path, name):
    """`ours` (what may be deleted or switched in) took a folder named index.json or sources.json
    for packtool's, where `pack --overwrite` told its files by kind: a user's folder of that name,
    holding their files, made the folder around it look packtool's own."""
    folder = tmp_path / "v"
    (folder / name).mkdir(parents=True)
    (folder / name / "notes.txt").write_text("mine")
    (folder / "shard-000000-00000.parquet").write_bytes(b"x")
    assert not ours(folder)
    (folder / name / "notes.txt").unlink()
    (folder / name).rmdir()
    (folder / name).write_text("{}")
    assert ours(folder)
