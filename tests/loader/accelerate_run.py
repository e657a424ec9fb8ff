"""Run by tests/loader/hf/test_accelerate.py under `torch.distributed.run --nproc_per_node 2`:
trains a tiny model with accelerate (gloo, CPU) on a PackedDataset and writes, per rank, the
documents of every batch it trained on; first, in the same processes, it runs
docs/integrations.md's accelerate snippet in the folder given (one launch for both: start-up is
most of the cost)."""

from __future__ import annotations

import json
import math
import os
import sys
import warnings

import torch
from accelerate import Accelerator

from loader import PackedDataLoader, PackedDataset
from loader.hf import check_packed_model
from packtool.errors import ConfigError
from tests.loader.hf_helpers import documents, snippet, tiny_model


def main(path: str, out: str, workers: int) -> None:
    accelerator = Accelerator(cpu=True)
    # world_size=1 under 2 processes (what Accelerator() says on CPU) is warned about.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PackedDataset(path, rows_per_batch=2, rank=0, world_size=1)
    said = [str(w.message) for w in caught]
    assert any("world_size=1 while torch.distributed runs 2 processes" in m for m in said), said
    # context_parallel with torch.distributed's global rank and world: each rank of the group
    # read other rows (its share of another batch), silently; refused now
    try:
        PackedDataset(path, rows_per_batch=2, context_parallel=(2, accelerator.process_index))
    except ConfigError as exc:
        assert "pass rank= and world_size=, the data-parallel rank" in str(exc), exc
    else:
        raise AssertionError("context_parallel without the data-parallel rank and world taken")
    cp = PackedDataset(path, rows_per_batch=2, context_parallel=(2, accelerator.process_index),
                       rank=0, world_size=1)  # fmt: skip
    assert (cp.rank, cp.world_size) == (0, 1)
    ds = PackedDataset(
        path,
        rows_per_batch=2,
        layout="hf",
        seed=3,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
    )
    loader = PackedDataLoader(ds, num_workers=workers)
    model = tiny_model("llama")
    model.config.use_cache = False
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = accelerator.prepare(model, opt)
    seen = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        for batch in loader:
            check_packed_model(model, batch)
            targets = accelerator.reduce((batch["labels"] != -100).sum(), "sum")
            loss = model(**batch, num_items_in_batch=targets).loss * accelerator.num_processes
            assert math.isfinite(loss.item())  # a filler batch (no targets) adds 0, not NaN
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            real = bool((batch["labels"] != -100).any())
            seen.append(
                {"epoch": epoch, "docs": [d.tolist() for d in documents(batch)] if real else []}
            )
    with open(f"{out}.{accelerator.process_index}.json", "w") as f:
        json.dump(seen, f)


def run_snippet(folder: str) -> None:
    """The page's snippet, first in the process: accelerate's state is one per process, so run
    after `main` it would inherit that Accelerator's processes instead of finding its own."""
    here = os.getcwd()
    os.chdir(folder)
    scope: dict = {}
    exec(compile(snippet("accelerate"), "docs/integrations.md:accelerate", "exec"), scope)
    world = int(os.environ["WORLD_SIZE"])
    assert scope["accelerator"].num_processes == scope["ds"].world_size == world, world
    os.chdir(here)


if __name__ == "__main__":
    run_snippet(sys.argv[4])
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
