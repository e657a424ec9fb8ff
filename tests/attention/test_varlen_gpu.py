"""CUDA backends (flash_attn, torch_varlen, flex) against float32 per-document SDPA, in bf16.

Skipped without CUDA (tests/conftest.py). A backend this machine cannot run (flash-attn not
installed, torch without varlen_attn, no window support) is skipped with the reason.
"""

from __future__ import annotations

import pytest
import torch

import attention
from attention.backends import SPECS
from attention.varlen import normalize_window, why_not
from tests.attention.helpers import cu_from_lengths

pytestmark = pytest.mark.gpu

CUDA_BACKENDS = [name for name, spec in SPECS.items() if spec.cuda_only]
"""Every CUDA-only backend of the registry."""
LENGTHS = [1, 17, 128, 300, 64, 5, 511, 2]


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def _skip_unless_usable(backend, dtype, window, causal, head_dim=64):
    window = normalize_window(window, causal)
    reason = why_not(backend, torch.device("cuda"), dtype, window, causal, head_dim=head_dim)
    if reason is not None:
        pytest.skip(reason)


@pytest.mark.parametrize("backend", CUDA_BACKENDS)
@pytest.mark.parametrize(
    ("n_heads", "n_kv", "causal", "window"),
    [
        (8, 8, True, None),
        (8, 2, True, None),
        (8, 2, False, None),
        (4, 1, True, 64),
        (4, 2, False, (16, 8)),
    ],
)
def test_cuda_backend_matches_sdpa(backend, n_heads, n_kv, causal, window):
    _skip_unless_usable(backend, torch.bfloat16, window, causal)
    torch.manual_seed(0)
    total, head_dim = sum(LENGTHS), 64
    cu = cu_from_lengths(LENGTHS, device="cuda")
    q32 = torch.randn(total, n_heads, head_dim, device="cuda")
    k32 = torch.randn(total, n_kv, head_dim, device="cuda")
    v32 = torch.randn(total, n_kv, head_dim, device="cuda")
    grad = torch.randn(total, n_heads, head_dim, device="cuda")

    def run(name, dtype):
        # detach: a leaf per run (``.to`` of the same dtype returns the tensor itself, so
        # requires_grad_ on it would make the next run's ``.to`` a non-leaf with no .grad).
        q, k, v = (t.detach().to(dtype).requires_grad_() for t in (q32, k32, v32))
        out = attention.varlen_attention(
            q, k, v, cu, max(LENGTHS), causal=causal, window=window, backend=name
        )
        out.backward(grad.to(dtype))
        return out, q.grad, k.grad, v.grad

    ref = run("sdpa", torch.float32)
    base = run("sdpa", torch.bfloat16)
    got = run(backend, torch.bfloat16)
    for name, r, b, g in zip(("out", "dq", "dk", "dv"), ref, base, got, strict=True):
        err, base_err = _rel_err(g, r), _rel_err(b, r)
        # bf16 keeps ~3 significant digits; a leak across documents would be O(1).
        assert err < max(3 * base_err, 2e-2), (
            f"{backend} {name}: rel err {err:.3g} vs sdpa-bf16 {base_err:.3g}"
        )


def test_auto_on_cuda_reports_a_cuda_kernel():
    q = torch.randn(40, 4, 64, device="cuda", dtype=torch.bfloat16)
    cu = cu_from_lengths([10, 30], device="cuda")
    out, name = attention.varlen_attention(q, q, q, cu, return_backend=True)
    choice = attention.choose_backend(device="cuda", dtype=torch.bfloat16, total_tokens=40)
    assert name == choice.name
    assert out.shape == q.shape


@pytest.mark.parametrize("backend", [*CUDA_BACKENDS, "sdpa"])
def test_model_packed_equals_documents_alone_on_cuda(backend):
    from attention.model import ModelConfig, Transformer
    from tests.attention.helpers import make_batch

    _skip_unless_usable(backend, torch.bfloat16, None, True, head_dim=32)
    torch.manual_seed(0)
    cfg = ModelConfig(
        vocab_size=64,
        dim=128,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=512,
        attn_backend=backend,
    )
    model = Transformer(cfg).to("cuda", torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    docs = [torch.randint(0, 64, (n,), generator=g).tolist() for n in (3, 200, 1, 77, 300)]
    with torch.no_grad():
        packed = model(make_batch(docs))
        alone = [model(make_batch([d])) for d in docs]
    assert packed.backend == backend
    logits = torch.cat([a.logits for a in alone])
    assert _rel_err(packed.logits, logits) < 2e-2
    loss = sum(a.loss_sum for a in alone) / sum(int(a.num_targets) for a in alone)
    assert abs(packed.loss.item() - loss.item()) < 2e-2 * loss.item()


def test_model_checks_position_ids_of_a_batch_already_on_cuda():
    # The check runs on the device and comes back with cu_seqlens' values, in the one read the
    # model makes anyway; collate's wrapping static-shape padding passes, a wrong restart not.
    from attention.model import ModelConfig, Transformer
    from tests.attention.helpers import make_batch

    model = Transformer(ModelConfig(vocab_size=16, dim=32, n_layers=1, max_seq_len=8)).cuda()
    batch = make_batch([[1, 2], [3, 4, 5, 6], [0] * 20])
    batch["position_ids"][6:] = torch.arange(20) % 8  # padding wrapping at position_limit 8
    on_gpu = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    assert model(on_gpu).logits.shape == (26, 16)
    on_gpu["position_ids"] = on_gpu["position_ids"].clone()
    on_gpu["position_ids"][2:6] = torch.tensor([2, 0, 1, 2], device="cuda")
    with pytest.raises(ValueError, match=r"^position_ids\[2\] is 2 where document 1 "):
        model(on_gpu)
