"""The timing tools in benchmarks/ still run against today's code.

`benchmarks/e2e_timeline.py` wraps packtool's functions by name; when one is renamed or moved
(`pack_table` became `pack_cut`), the tool fails before the run, or leaves the stage out of its
table (`read_piece` is no longer on the pipeline's path). This runs it on the sample
corpus, which takes a few seconds.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_e2e_timeline_runs_and_times_every_stage(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks.e2e_timeline", "sample_data/corpus.jsonl"]
    cmd += ["-o", str(tmp_path / "out"), "--max-len", "256"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = proc.stderr  # the pack's summary is on stdout, the timeline on stderr
    for stage in (
        "read + parse JSON",
        "pack_cut (pack a chunk)",
        "write rows",
        "Parquet encode (row group)",
        "load numba kernels",
        "whole run",
    ):
        assert stage in table, f"{stage!r} missing from the timeline:\n{table[-3000:]}"
    assert (tmp_path / "out" / "index.json").exists()
