"""examples/train_hf.py: a transformers model on packed data, checked before it trains."""

from __future__ import annotations

import importlib.util
import math

import pytest

from tests.loader.hf_helpers import (
    ROOT,
    docs_workspace,
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
)


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("train_hf", ROOT / "examples" / "train_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return docs_workspace(tmp_path_factory.mktemp("example")) / "packed"


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_the_loop_trains_over_epochs(example, packed, arch):
    steps = 7  # more than one epoch of 22 rows, 4 a batch
    losses = example.main(["--data", str(packed), "--steps", str(steps), "--arch", arch])
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)


def test_the_trainer_path_trains(example, packed, tmp_path):
    losses = example.main(
        ["--data", str(packed), "--steps", "4", "--trainer", "--out", str(tmp_path)]
    )
    assert losses == [] and (tmp_path / "checkpoint-4").is_dir()  # logs every 10 steps


@pytest.mark.parametrize("trainer", [[], ["--trainer"]], ids=["loop", "trainer"])
def test_a_leaking_configuration_stops_with_one_line(example, packed, tmp_path, trainer):
    argv = ["--data", str(packed), "--steps", "2", "--use-cache", "--out", str(tmp_path)]
    with pytest.raises(SystemExit, match=r"^error: attn_implementation='sdpa' .*use_cache is on"):
        example.main(argv + trainer)


def test_a_missing_data_folder_is_one_line(example, tmp_path):
    with pytest.raises(SystemExit, match="^error: .*nope: no such dataset folder"):
        example.main(["--data", str(tmp_path / "nope")])
