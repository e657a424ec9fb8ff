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


def _saved_llama(folder, vocab):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=4096, hidden_size=32,
                         intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("trainer", [[], ["--trainer"]], ids=["loop", "trainer"])
def test_a_model_with_a_smaller_vocabulary_than_the_data_is_one_line(
    example, packed, tmp_path, trainer
):
    # Was an IndexError deep in torch's embedding at the first id past the model's rows.
    small = _saved_llama(tmp_path / "small", 100)
    argv = ["--data", str(packed), "--steps", "1", "--model", str(small), "--out", str(tmp_path)]
    with pytest.raises(SystemExit) as exc:
        example.main(argv + trainer)
    assert str(exc.value) == (
        f"error: --model {small} has 100 token ids (embedding rows), the data's tokenizer "
        "(index.json) 512: pack the data with the model's tokenizer"
    )


def test_a_model_folder_that_is_not_there_or_no_model_is_one_line(example, packed, tmp_path):
    # Was transformers' OSError "Repo id must be in the form 'repo_name' ...".
    with pytest.raises(SystemExit, match=f"^error: --model {tmp_path}/nope: no such folder$"):
        example.main(["--data", str(packed), "--model", str(tmp_path / "nope")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=f"^error: --model {tmp_path}/empty: Unrecognized model"):
        example.main(["--data", str(packed), "--model", str(tmp_path / "empty")])


def test_a_model_with_the_datas_vocabulary_trains(example, packed, tmp_path):
    model = _saved_llama(tmp_path / "fits", 512)
    losses = example.main(["--data", str(packed), "--steps", "2", "--model", str(model)])
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)
