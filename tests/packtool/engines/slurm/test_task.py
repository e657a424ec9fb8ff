"""One Slurm array task or pull-mode worker (packtool/engines/slurm/task.py), run in this
process with Slurm's environment faked: no cluster needed."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from packtool.engines.slurm import task


@pytest.mark.parametrize(
    "per_task,on_node,usable,threads",
    [
        ("32", None, {0}, 1),
        ("32", "2", set(range(4)), 2),
        (None, "4", {0, 1}, 2),
        ("3", None, set(range(8)), 3),
    ],
)
def test_the_tokenizer_threads_are_the_cpus_the_task_may_run_on(
    monkeypatch, per_task, on_node, usable, threads
):
    """A driver inside `salloc -c 32` exports SLURM_CPUS_PER_TASK=32 to tasks submitted without
    --cpus-per-task: each task ran 32 tokenizer threads on its one CPU."""
    for name, value in (("SLURM_CPUS_PER_TASK", per_task), ("SLURM_CPUS_ON_NODE", on_node)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    monkeypatch.setattr(task.os, "sched_getaffinity", lambda pid: usable, raising=False)
    assert task._cpus() == threads


def _pool(folder: Path, work: Path) -> None:
    """A pull-mode pool of no partition in `folder` (what `main` reads before it walks it)."""
    folder.mkdir()
    (folder / "pool.offsets").write_bytes(np.zeros(1, dtype=np.int64).tobytes())
    (folder / "pool.jsonl").write_bytes(b"")
    (folder / "pool.parts").write_bytes(np.zeros(0, dtype=np.int64).tobytes())
    ctx = SimpleNamespace(tokenizer=None, work=str(work))
    (folder / "context.pkl").write_bytes(pickle.dumps(ctx))
    (folder / "claims").mkdir()


def test_a_requeued_worker_passes_over_a_claim_removed_while_it_looked(tmp_path, monkeypatch):
    """A requeued worker reads every claim to take back its own; one the driver removed since
    the listing raised FileNotFoundError: a traceback, and one more attempt of the partition."""
    from packtool.engines import context
    from packtool.storage import local as storage

    slurm_dir = tmp_path / "slurm"
    _pool(slurm_dir, tmp_path / "work")
    (slurm_dir / "claims" / "000001").write_text("7_0")
    real = storage.list_dir
    removed = slurm_dir / "claims" / "000002"  # listed, then removed by the driver

    def listing(path):
        return [*real(path), removed] if Path(path) == slurm_dir / "claims" else real(path)

    monkeypatch.setattr(storage, "list_dir", listing)
    monkeypatch.setattr(context, "setup_process", lambda threads: None)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "0")
    assert task.main([str(slurm_dir), "pool", "pilot"]) == 0


@pytest.mark.parametrize(("setting", "seen"), [(None, "0"), ("1", "1")])
def test_a_task_skips_numbas_extensions_as_the_cli_does(setting, seen):
    """A task is packtool's own process, whoever started the run: numba's extension entry points
    (awkward's import, ~0.2 s of CPU a task) were run in every task of a run started from
    Python (`run_pack_slurm`), which only the CLI's own environment turned off. A value the
    driver's environment gives is kept."""
    import os
    import subprocess
    import sys

    code = (
        "import os, runpy, sys\n"
        "sys.argv = ['task', '/nonexistent/slurm', 'a0', '0']\n"
        "try:\n"
        "    runpy.run_module('packtool.engines.slurm.task', run_name='__main__')\n"
        "except SystemExit as exc:\n"
        "    print(exc.code, os.environ.get('PACKTOOL_NUMBA_EXTENSIONS'))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PACKTOOL_NUMBA_EXTENSIONS"}
    if setting is not None:
        env["PACKTOOL_NUMBA_EXTENSIONS"] = setting
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["3", seen], out.stderr  # 3: a folder it cannot see
