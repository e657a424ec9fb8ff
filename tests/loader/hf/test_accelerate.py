"""accelerate with 2 processes on CPU (gloo): every row once per epoch across the two ranks;
docs/integrations.md's accelerate snippet runs in the same two processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from loader.testing import write_dataset
from packtool.dataset.manifest import read_manifest
from tests.loader.hf_helpers import docs_workspace, random_rows

ROOT = Path(__file__).resolve().parents[3]


# What every rank imports (~9 CPU-s a process, transformers' own import most of it), imported
# once by torchrun's launcher before it forks the two ranks.
PRELOAD = (
    "import accelerate, loader, loader.hf, tests.loader.hf_helpers; "
    "from transformers import LlamaConfig, LlamaForCausalLM"
)


def run_distributed(script: Path, *args: str, cwd: Path, timeout: int = 240) -> None:
    """torchrun (`torch.distributed.run`, what `accelerate launch --num_processes 2` runs) with
    `--nproc_per_node 2 script args`; fails the test with both ranks' output. Its launcher
    imports what the ranks import first, then starts them with `--start-method fork
    --run-path` (its options to fork each rank and run the script in it with runpy): two
    processes all the same, minus two imports of torch and transformers and the launcher's."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launcher = f"{PRELOAD}; from torch.distributed.run import main; main()"
    cmd = [sys.executable, "-c", launcher, "--nproc_per_node", "2", "--standalone"]
    cmd += ["--start-method", "fork", "--run-path", str(script), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


@pytest.mark.slow
def test_two_ranks_train_on_every_document_once_per_epoch(tmp_path):
    path = tmp_path / "ds"
    write_dataset(path, random_rows(13, seed=8), max_len=48, rows_per_shard=5, row_group_rows=2)
    m = read_manifest(path)
    stored = pa.concat_tables(pq.read_table(path / s.file) for s in m.shards).to_pylist()
    want = Counter(
        tuple(r["input_ids"][a:b])
        for r in stored
        for a, b in zip(r["doc_offsets"], r["doc_offsets"][1:], strict=False)
    )
    out = tmp_path / "seen"
    docs = docs_workspace(tmp_path / "docs")  # and the page's accelerate snippet, after it
    script = ROOT / "tests/loader/accelerate_run.py"
    run_distributed(script, str(path), str(out), "1", str(docs), cwd=tmp_path)
    ranks = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 2 * 4  # ceil(13 rows / (2 ranks x 2 rows)) a epoch
    for epoch in range(2):
        got = Counter(
            tuple(doc) for seen in ranks for b in seen if b["epoch"] == epoch for doc in b["docs"]
        )
        assert got == want, epoch
    orders = [[b["docs"] for b in ranks[0] if b["epoch"] == e] for e in range(2)]
    assert orders[0] != orders[1]  # a new permutation in epoch 1
