"""loader/config.py: the rank and world size a loader runs as (`dist_rank_world`)."""

from __future__ import annotations

import pytest

from loader import MixedDataset, PackedDataset
from packtool.errors import ConfigError
from packtool.mixture.spec import MixtureSpec, SourceSpec


def test_a_dataset_made_under_a_launcher_before_torch_distributed_is_refused(
    hand_dataset, monkeypatch
):
    # Before: under torchrun (WORLD_SIZE=2, RANK=1) a dataset made before init_process_group
    # was rank 0 of 1 in every process: each read every row, in the same order, silently.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    spec = MixtureSpec(sources=(SourceSpec(name="a", path=hand_dataset, weight=1),), total_steps=2)
    for make in (
        lambda **kw: PackedDataset(hand_dataset, rows_per_batch=1, **kw),
        lambda **kw: MixedDataset(spec, rows_per_batch=1, **kw),
    ):
        for kw in ({}, {"world_size": 2}):
            with pytest.raises(ConfigError, match=r"^WORLD_SIZE=2 \(a launcher started 2 "):
                make(**kw)
        # Given whole, the rank and world size are the caller's: one process reading all rows
        # (world_size=1), or its own share.
        assert (make(world_size=1).rank, make(world_size=1).world_size) == (0, 1)
        assert (make(rank=1, world_size=2).rank, make(rank=1, world_size=2).world_size) == (1, 2)
    monkeypatch.setenv("WORLD_SIZE", "1")  # one process: the defaults, as before
    assert (PackedDataset(hand_dataset, rows_per_batch=1).world_size) == 1
