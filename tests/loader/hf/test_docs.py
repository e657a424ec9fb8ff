"""docs/integrations.md's snippets, run as written on the page's own `packtool pack` output
(the accelerate one runs under two processes in test_hf_accelerate.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from packtool.dataset.manifest import read_manifest
from packtool.dataset.megatron import read_megatron_index
from tests.loader.hf_helpers import (
    docs_workspace,
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    shell_commands,
    snippet,
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    return docs_workspace(tmp_path_factory.mktemp("integrations"))


def run(name: str, scope: dict | None = None) -> dict:
    scope = scope if scope is not None else {"__name__": "__main__"}
    exec(compile(snippet(name), f"docs/integrations.md:{name}", "exec"), scope)
    return scope


def test_the_page_packs_with_its_own_command(workspace):
    assert shell_commands() == [
        "packtool pack corpus.jsonl -o packed --max-len 256 --tokenizer tok/tokenizer.json",
        "packtool pack sft.parquet -o packed-sft --max-len 256 --tokenizer tok/tokenizer.json",
        "packtool tokenize corpus.jsonl --tokenizer tok/tokenizer.json --to megatron -o data/text",
    ]
    assert (workspace / "packed" / "index.json").exists()
    assert "loss_mask" in read_manifest(workspace / "packed-sft").columns
    index = read_megatron_index(workspace / "data" / "text.idx")  # the Megatron example ran
    assert len(index["lengths"]) == 40 and (workspace / "data" / "text.bin").stat().st_size > 0


def test_trainer_snippet_trains_and_resumes(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    scope = run("trainer")
    trainer, ds = scope["trainer"], scope["ds"]
    steps = len(ds)  # rows_per_batch rows a step
    assert steps >= 4 and trainer.state.global_step == 2 * steps and trainer.state.epoch == 2
    saved = sorted(
        int(p.name.split("-")[1]) for p in (workspace / "out/trainer").glob("checkpoint-*")
    )
    assert saved[-1] == 2 * steps and saved[0] == 4
    # What the last comment says: resume from the latest checkpoint (there, nothing is left).
    trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 2 * steps


def test_trl_snippets_train_on_load_dataset_and_on_masked_rows(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    scope = run("trl")
    assert scope["trainer"].state.global_step == 4
    # load_dataset as typed: the stored columns, seq_lengths among them, nothing added.
    assert scope["train"].column_names == list(read_manifest(workspace / "packed").columns)
    assert "seq_lengths" in scope["train"].column_names
    first = scope["trainer"]
    run("trl-mask", scope)  # "continuing the snippet above"
    assert scope["trainer"] is not first and scope["trainer"].state.global_step == 4
    train = scope["train"]
    assert {"loss_mask", "seq_lengths", "labels"} <= set(train.column_names)
    row = train[0]
    mask = np.frombuffer(row["loss_mask"], np.uint8)
    assert 0 < (np.asarray(row["labels"]) != -100).sum() <= mask.sum()


def test_plain_loop_snippet_trains_and_saves_the_loader_position(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    scope = run("loop")
    state = torch.load(workspace / "loop.pt", weights_only=True)["loader"]
    assert state["packed_dataset"]["epoch"] == 1 and state["packed_dataset"]["next_step"] == 3
    assert torch.isfinite(scope["loss"])
