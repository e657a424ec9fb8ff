"""One Slurm array task or pull-mode worker (packtool/engines/slurm/task.py), run in this
process with Slurm's environment faked: no cluster needed."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from packtool.engines.slurm import task


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
