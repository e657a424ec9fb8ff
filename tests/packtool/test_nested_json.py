"""JSON nested past Python's recursion limit in a file a user or a crash can damage: read through
`packtool.errors.json_value`, it is a one-line error naming the file, or (a note that only
helps) read as none; never a RecursionError traceback."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import ConfigError, DataError
from tests.cli import one_error_line, run

DEEP = "[" * 100_000 + "]" * 100_000
"""json.loads raises RecursionError for it (so does PyYAML)."""
SAMPLE = Path(__file__).resolve().parents[2] / "sample_data" / "corpus.jsonl"


@pytest.mark.parametrize("suffix", [".json", ".yaml"])
def test_a_mixture_file_nested_too_deeply_is_one_line(tmp_path, suffix):
    if suffix == ".yaml":
        pytest.importorskip("yaml")
    path = tmp_path / f"mix{suffix}"
    path.write_text(DEEP)
    code, _, err = run("mix", path)
    assert code != 0
    kind = "JSON" if suffix == ".json" else "YAML"
    assert one_error_line(err) == f"error: {path}: not valid {kind} (nested too deeply)"


def test_a_yaml_mixture_file_nested_too_deeply_is_refused_at_once_under_a_raised_limit(tmp_path):
    """In a process that raised its recursion limit (torch's compiler sets 2,000 or more), a YAML
    mixture file nested too deeply is still the one-line error, at once: libyaml's parser
    refuses it past 1,000 levels, where PyYAML's own scanner went over every still-possible
    simple key for every token until the recursion limit stopped it (5 s at 3,000 levels;
    34 s in CI)."""
    from packtool.mixture.spec import read_mixture_file

    yaml = pytest.importorskip("yaml")
    if not yaml.__with_libyaml__:
        pytest.skip("PyYAML built without libyaml")
    path = tmp_path / "mix.yaml"
    path.write_text(DEEP)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)
    try:
        start = time.perf_counter()
        with pytest.raises(ConfigError) as info:
            read_mixture_file(path)
        elapsed = time.perf_counter() - start
    finally:
        sys.setrecursionlimit(limit)
    assert str(info.value) == f"{path}: not valid YAML (nested too deeply)"
    assert elapsed < 10, f"{elapsed:.1f} s to refuse a deeply nested YAML file"


def test_storage_options_nested_too_deeply_are_one_line(tmp_path):
    code, _, err = run("stats", SAMPLE, "--max-len", 64, "--storage-options", DEEP)
    assert code != 0
    assert (
        one_error_line(err)
        == "error: --storage-options / PACKTOOL_STORAGE_OPTIONS: not JSON (nested too deeply)"
    )


def test_tokenized_metadata_nested_too_deeply_is_one_line(tmp_path):
    path = tmp_path / "tok.parquet"
    table = pa.table({"input_ids": pa.array([[1, 2, 3]], pa.list_(pa.int32()))})
    pq.write_table(table.replace_schema_metadata({b"packtool": DEEP.encode()}), path)
    for command in ("stats", "pack"):
        args = ["-o", tmp_path / "out"] if command == "pack" else []
        code, _, err = run(command, path, "--max-len", 64, *args)
        assert code != 0
        assert one_error_line(err) == f"error: {path}: malformed packtool metadata"


def test_a_tokenizer_config_or_chat_template_nested_too_deeply_is_one_line(tmp_path):
    from packtool.sft.template import load_chat_template
    from packtool.tokenizer.files import load_tokenizer_config

    (tmp_path / "tokenizer_config.json").write_text(DEEP)
    message = f"{tmp_path / 'tokenizer_config.json'}: not a readable JSON file (nested too deeply)"
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}"):
        load_tokenizer_config(tmp_path)
    template = tmp_path / "template.json"
    template.write_text(DEEP)
    with pytest.raises(ConfigError, match=f"^{re.escape(f'{template}: not valid JSON')}"):
        load_chat_template(template)


def test_run_state_files_nested_too_deeply_name_the_file(tmp_path):
    from packtool.dataset import hub_record, output_versions
    from packtool.engines import records

    work = tmp_path / "staging"
    plan = records.run_dir(work) / records.PLAN_FILE
    plan.parent.mkdir(parents=True)
    plan.write_text(DEEP)
    with pytest.raises(DataError, match=f"^{re.escape(str(plan))}: unreadable"):
        records.read_plan(work)
    hub_record.path(work).write_text(DEEP)
    with pytest.raises(DataError, match=f"^{re.escape(str(hub_record.path(work)))}: damaged"):
        hub_record.check(work, "out", None)
    target = tmp_path / "remote"
    target.mkdir()
    (target / output_versions.REMOTE_STAGING).write_text(DEEP)
    with pytest.raises(ConfigError, match="packtool-staging: damaged"):
        output_versions.staging_record(target)


def test_slurm_job_files_nested_too_deeply_name_the_file(tmp_path):
    from packtool.engines.slurm import arrays, task
    from packtool.engines.slurm.config import ERRORS_DIR, JOBS_DIR

    driver = arrays.ArrayDriver.__new__(arrays.ArrayDriver)  # only its run-state folder
    driver.dir = tmp_path
    (tmp_path / JOBS_DIR).mkdir()
    (tmp_path / JOBS_DIR / "17.json").write_text(DEEP)
    with pytest.raises(DataError, match=r"17\.json: unreadable \(nested too deeply\)"):
        driver._load_jobs()
    (tmp_path / ERRORS_DIR).mkdir()
    (tmp_path / ERRORS_DIR / "000003-17_0.json").write_text(DEEP)
    assert task.task_error(tmp_path, 3, "17_0") is None  # as an unreadable record: an attempt


def test_notes_nested_too_deeply_tell_nothing(tmp_path, monkeypatch):
    """Records that only save work or describe a holder: damaged, they are read as none."""
    from packtool.dataset import output
    from packtool.engines.megatron import record, swap
    from packtool.storage import remote_write
    from packtool.tokenizer import engine_checks

    bin_path, idx_path = tmp_path / "a.bin", tmp_path / "a.idx"
    bin_path.write_bytes(b"x")
    idx_path.write_bytes(b"y")
    Path(record.record_path(idx_path)).write_text(DEEP)
    assert record.recorded(bin_path, idx_path) is None
    (tmp_path / "note.json").write_text(DEEP)
    assert swap._read_note(tmp_path / "note.json") == {}
    assert output._describe_holder(DEEP.encode()) == "a process that is starting up"
    assert remote_write._holder_gone(DEEP.encode(), None) is False
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    first = engine_checks.open_record("0" * 64, "numpy")
    assert first is not None
    first.path.parent.mkdir(parents=True)
    first.path.write_text(DEEP)
    again = engine_checks.open_record("0" * 64, "numpy")
    assert again is not None and again.values == {}
