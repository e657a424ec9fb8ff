"""Real transformers models on packtool's layout="hf" batches: equal to each document alone, and
`check_packed_model` refuses every configuration that lets documents see each other."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from loader import PackedDataset
from loader.hf import check_packed_model
from loader.testing import write_dataset
from packtool.errors import ConfigError
from tests.loader.hf_helpers import (
    LEAKING_ARCHS,
    VOCAB,
    documents,
    logit_gap,
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    per_document_loss,
    tiny_model,
)

ARCHS = ["llama", "gpt2"]
IMPLS = ["sdpa", "eager"]
LEAKING = [(a, i) for a in LEAKING_ARCHS for i in IMPLS if (a, i) != ("xglm", "sdpa")]


@pytest.fixture(scope="module")
def batch(tmp_path_factory):
    path = tmp_path_factory.mktemp("hfm") / "ds"
    rng = np.random.default_rng(1)
    lens = [[7, 1, 12], [20, 3], [5, 5, 9, 2]]  # a one-token document too
    rows = [[rng.integers(2, VOCAB, n).tolist() for n in row] for row in lens]
    write_dataset(path, rows, max_len=48)
    b = next(iter(PackedDataset(path, rows_per_batch=3, layout="hf", shuffle=False)))
    assert [len(d) for d in documents(b)] == [n for row in lens for n in row]
    return b


def grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_loss_and_gradients_equal_each_document_alone(arch, impl, batch):
    model = tiny_model(arch, impl)
    model.config.use_cache = False
    assert check_packed_model(model, batch) == "position_ids"
    packed = model(**batch).loss
    packed.backward()
    g_packed = grads(model)
    model.zero_grad()
    ref = per_document_loss(model, documents(batch))
    ref.backward()
    g_ref = grads(model)
    assert abs(packed.item() - ref.item()) <= 1e-5
    assert g_packed.keys() == g_ref.keys() and len(g_ref) > 4
    for name, g in g_ref.items():
        assert torch.allclose(g_packed[name], g, atol=1e-5, rtol=0), name


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("arch", ARCHS)
def test_the_check_fires_where_documents_really_leak(arch, impl, batch):
    model = tiny_model(arch, impl)
    assert model.config.use_cache  # the transformers default, in training too
    masked = {**batch, "attention_mask": torch.ones_like(batch["input_ids"])}
    # The cache on (the default) or an all-ones mask: the row is read as one sequence.
    assert logit_gap(model, batch) > 1e-3
    assert logit_gap(model, masked, use_cache=False) > 1e-3
    assert logit_gap(model, batch, use_cache=False) < 1e-5
    with pytest.raises(ConfigError, match=r"use_cache is on.*model.config.use_cache = False"):
        check_packed_model(model, batch)
    with pytest.raises(ConfigError, match="attention_mask.*drop it"):
        check_packed_model(model, {**masked, "use_cache": False})
    model.config.use_cache = False
    with pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(model, {**batch, "use_cache": True})
    assert check_packed_model(model, batch) == "position_ids"


def test_gradient_checkpointing_turns_the_cache_off(batch):
    model = tiny_model("llama")
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5.x name
    (enable or model.gradient_checkpointing_enable)()
    model.train()
    assert check_packed_model(model, batch) == "position_ids"
    loss = model(**batch).loss
    assert abs(loss.item() - per_document_loss(model, documents(batch)).item()) <= 1e-5
    with torch.no_grad(), pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(model, batch)  # transformers keeps the cache without gradients
    model.eval()
    with pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(model, batch)


def test_implementations_and_batches_the_check_refuses(batch):
    model = tiny_model("llama")
    model.config.use_cache = False
    no_positions = {k: v for k, v in batch.items() if k != "position_ids"}
    with pytest.raises(ConfigError, match="batch has none"):
        check_packed_model(model, no_positions)
    model.config._attn_implementation = "paged|eager"
    with pytest.raises(ConfigError, match="neither cu_seq_lens nor packed position_ids.*sdpa"):
        check_packed_model(model)
    # flash attention's varlen kernels read cu_seq_lens: the cache does not matter, a mask does.
    model.config._attn_implementation = "flash_attention_2"
    model.config.use_cache = True
    assert check_packed_model(model, batch) == "cu_seq_lens"
    with pytest.raises(ConfigError, match="attention_mask"):
        check_packed_model(model, {**batch, "attention_mask": torch.ones(1)})
    with pytest.raises(ConfigError, match="not a transformers model"):
        check_packed_model(torch.nn.Linear(2, 2))
    # packtool's own layout passed the check, then failed inside the model (IndexError).
    own = {"input_ids": torch.arange(6), "cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32)}
    with pytest.raises(ConfigError, match="packtool's own layout .* layout='hf'"):
        check_packed_model(model, {**own, "position_ids": torch.tensor([0, 1, 0, 1, 2, 3])})


def test_the_check_unwraps_a_ddp_style_wrapper(batch):
    class Wrapper(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

    model = tiny_model("gpt2")
    with pytest.raises(ConfigError, match="use_cache"):
        check_packed_model(Wrapper(model), batch)


@pytest.mark.parametrize(("arch", "impl"), LEAKING)
def test_the_check_refuses_an_architecture_that_builds_no_mask_from_positions(arch, impl, batch):
    """OPT, BioGPT and XGLM take position_ids but call create_causal_mask without them: with
    the cache off, no attention mask and restarting positions, documents still see each other."""
    model = tiny_model(arch, impl)
    model.config.use_cache = False
    model.train()
    assert logit_gap(model, batch) > 1e-3  # measured: OPT 0.1 and more
    name = type(model).__name__
    with pytest.raises(ConfigError, match=rf"^{name} with attn_implementation='{impl}' lets a "):
        check_packed_model(model, batch)
    with pytest.raises(ConfigError, match=r"documents attend to each other.*Llama"):
        check_packed_model(model)  # refused again (the verdict is kept), without a batch too
    assert model.training  # the probe ran in eval mode and put the model back
    assert all(p.grad is None for p in model.parameters())


def test_the_probe_runs_once_per_model_and_implementation(batch):
    model = tiny_model("llama")
    model.config.use_cache = False
    model.train()
    model.model.layers[0].eval()  # a module its owner left in eval mode stays so
    calls = []
    model.register_forward_pre_hook(lambda *args: calls.append(1))
    assert check_packed_model(model, batch) == "position_ids"
    probes = len(calls)
    assert probes > 0
    for _ in range(3):  # as a loop that checks every batch does
        assert check_packed_model(model, batch) == "position_ids"
    assert len(calls) == probes
    assert model.training and not model.model.layers[0].training
    model.config._attn_implementation = "eager"
    assert check_packed_model(model, batch) == "position_ids"
    assert len(calls) == 2 * probes


def test_a_model_the_probe_cannot_run_is_one_warning_line_and_probe_false_skips_it(batch):
    # A warning, not a refusal: ZeRO-3 / FSDP parameters are gathered only inside their
    # engine's forward, so PackedTrainer's check at init cannot run them.
    with torch.device("meta"):
        model = tiny_model("llama")
    model.config.use_cache = False
    with pytest.warns(RuntimeWarning, match=r"could not run LlamaForCausalLM .*probe=False") as got:
        assert check_packed_model(model, batch) == "position_ids"
    assert "\n" not in str(got[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert check_packed_model(model, batch, probe=False) == "position_ids"
    broken = tiny_model("llama")  # NaN logits compare as "no change": not a pass
    broken.config.use_cache = False
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.warns(RuntimeWarning, match=r"could not run .*logits are not finite"):
        check_packed_model(broken, batch)
    # The configuration checks still refuse.
    broken.config.use_cache = True
    with pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(broken, batch)


class EngineStyle(torch.nn.Module):
    """A DeepSpeedEngine-style wrapper: forward(*inputs, **kwargs), the module's attributes
    (its config too) read through."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, *inputs, **kwargs):
        return self.module(*inputs, **kwargs)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def test_the_check_unwraps_compiled_and_engine_style_wrappers(batch):
    """torch.compile's OptimizedModule reads .config through, so it was not unwrapped and its
    forward(*args, **kwargs) was refused as taking no position_ids."""
    model = tiny_model("llama")
    model.config.use_cache = False
    compiled = torch.compile(model)  # nothing is compiled: the check never calls it
    assert compiled.config is model.config
    for wrapped in (
        compiled,
        EngineStyle(model),
        EngineStyle(compiled),
        torch.compile(EngineStyle(model)),
    ):
        assert check_packed_model(wrapped, batch) == "position_ids"
    with pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(torch.compile(tiny_model("gpt2")), batch)


def test_use_cache_none_in_the_batch_means_the_configs(batch):
    """transformers reads use_cache=None as config.use_cache: with it on, documents leak."""
    model = tiny_model("llama")
    assert model.config.use_cache
    none = {**batch, "use_cache": None}
    assert logit_gap(model, none) > 1e-3
    with pytest.raises(ConfigError, match="use_cache is on"):
        check_packed_model(model, none)
    model.config.use_cache = False
    assert logit_gap(model, none) < 1e-5
    assert check_packed_model(model, none) == "position_ids"


def test_a_probe_that_could_not_run_is_tried_again_once_the_model_can(batch):
    # A failed probe was kept: the warning said to check again where the model runs, and that
    # check passed OPT (documents attending to each other) without a word.
    loaded = tiny_model("opt")
    with torch.device("meta"):
        model = tiny_model("opt")
    model.config.use_cache = False
    with pytest.warns(RuntimeWarning, match="could not run OPTForCausalLM"):
        check_packed_model(model, batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once: not again
        check_packed_model(model, batch)
    model.to_empty(device="cpu")
    model.load_state_dict(loaded.state_dict())
    with pytest.raises(ConfigError, match=r"^OPTForCausalLM with attn_implementation='sdpa' lets"):
        check_packed_model(model, batch)
