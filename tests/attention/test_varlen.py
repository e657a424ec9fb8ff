"""varlen_attention on CPU: every backend equals attention run on each document alone."""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import types
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attention
from attention import backends
from attention.varlen import normalize_window
from tests.attention.helpers import cu_from_lengths, reference_attention

CPU_BACKENDS = [name for name, spec in backends.SPECS.items() if not spec.cuda_only]
"""Every backend that runs on CPU (the registry, so a new one is tested here the day it lands)."""

# flex_attention arrived in torch 2.5; the package supports older torch without that backend.
needs_flex = pytest.mark.skipif(
    backends._flex_available() is not None, reason=str(backends._flex_available())
)


def _flex_eager(q, k, v, cu, **kw):
    # flex's unfused eager path on CPU: checks the document mask_mod without a compiler.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return backends.flex(q, k, v, cu, compile=False, **kw)


def _inputs(lengths, n_heads, n_kv, head_dim, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, n_heads, head_dim, generator=g, dtype=dtype)
    k = torch.randn(total, n_kv, head_dim, generator=g, dtype=dtype)
    v = torch.randn(total, n_kv, head_dim, generator=g, dtype=dtype)
    return q, k, v


# ---------------------------------------------------------------------------------------------
# Hand-checkable.


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_uniform_scores_give_running_means_per_document(backend):
    # q = 0 makes every score equal, so causal attention at position i is the mean of v over
    # the document's tokens 0..i: a value from another document would show up at once.
    v = torch.tensor([1.0, 3.0, 5.0, 100.0, 200.0], dtype=torch.float64).reshape(5, 1, 1)
    q = torch.zeros(5, 1, 1, dtype=torch.float64)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    out = attention.varlen_attention(q, q, v, cu, backend=backend)
    assert out.flatten().tolist() == pytest.approx([1.0, 2.0, 3.0, 100.0, 150.0])
    out = attention.varlen_attention(q, q, v, cu, causal=False, backend=backend)
    assert out.flatten().tolist() == pytest.approx([3.0, 3.0, 3.0, 150.0, 150.0])
    # window=2: the query and one key before it.
    out = attention.varlen_attention(q, q, v, cu, window=2, backend=backend)
    assert out.flatten().tolist() == pytest.approx([1.0, 2.0, 4.0, 100.0, 150.0])


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_non_finite_value_stays_in_its_document_only_where_documented(backend):
    # docs/attention.md: isolation is of finite values. One masked product over the row
    # (dense; flex alike) makes 0 * inf = NaN in the other documents; a call per document
    # (sdpa, and the varlen kernels by cu_seqlens) keeps it in its own.
    v = torch.tensor([1.0, 3.0, 5.0, math.inf, 200.0], dtype=torch.float64).reshape(5, 1, 1)
    q = torch.zeros(5, 1, 1, dtype=torch.float64)
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    out = attention.varlen_attention(q, q, v, cu, causal=False, backend=backend).flatten()
    assert not torch.isfinite(out[3:]).any()
    assert bool(torch.isfinite(out[:3]).all()) == (backend == "sdpa")


def test_normalize_window():
    assert normalize_window(None, True) == (-1, 0)
    assert normalize_window(None, False) == (-1, -1)
    assert normalize_window(4, True) == (3, 0)
    assert normalize_window(4, False) == (3, 3)
    assert normalize_window((2, 5), True) == (2, 0)
    assert normalize_window((2, -1), False) == (2, -1)


# ---------------------------------------------------------------------------------------------
# Properties: every CPU backend equals the per-document reference, outputs and gradients.

lengths_st = st.lists(st.integers(0, 13), min_size=1, max_size=5).filter(lambda x: sum(x) > 0)
window_st = st.one_of(
    st.none(),
    st.integers(1, 6),
    st.tuples(st.integers(-1, 5), st.integers(-1, 5)),
)


def _check_against_reference(
    kernel, lengths, n_kv, group, head_dim, causal, window, scale, grads=True
):
    q, k, v = _inputs(lengths, n_kv * group, n_kv, head_dim, seed=sum(lengths) * 31 + n_kv)
    left, right = normalize_window(window, causal)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
    if grads:
        q, k, v = (t.requires_grad_() for t in (q, k, v))
    cu = cu_from_lengths(lengths)
    out = kernel(q, k, v, cu, scale, window)
    ref_scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    ref = reference_attention(
        qr, kr, vr, lengths, causal=causal, scale=ref_scale, left=left, right=right
    )
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    if not grads:
        return
    grad_out = torch.randn_like(ref)
    out.backward(grad_out)
    ref.backward(grad_out)
    for a, b in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=lengths_st,
    n_kv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 3]),
    head_dim=st.sampled_from([4, 8]),
    causal=st.booleans(),
    window=window_st,
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
)
def test_backend_equals_per_document_reference(
    backend, lengths, n_kv, group, head_dim, causal, window, scale
):
    def kernel(q, k, v, cu, scale, window):
        return attention.varlen_attention(
            q, k, v, cu, causal=causal, softmax_scale=scale, window=window, backend=backend
        )

    _check_against_reference(kernel, lengths, n_kv, group, head_dim, causal, window, scale)


@needs_flex
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=lengths_st,
    n_kv=st.integers(1, 2),
    group=st.sampled_from([1, 2]),
    causal=st.booleans(),
    window=window_st,
)
def test_flex_mask_mod_equals_reference_eager(lengths, n_kv, group, causal, window):
    """Flex runs compiled on CUDA; its document mask_mod is the same code here (forward only:
    flex has no CPU backward; the GPU tests check its gradients)."""

    def kernel(q, k, v, cu, scale, window):
        return _flex_eager(
            q,
            k,
            v,
            cu,
            max_seqlen=max(lengths),
            causal=causal,
            scale=1 / math.sqrt(8),
            window=normalize_window(window, causal),
        )

    _check_against_reference(kernel, lengths, n_kv, group, 8, causal, window, None, grads=False)


@needs_flex
@pytest.mark.slow
def test_flex_compiled_path_equals_reference_on_cpu():
    """The exact code the CUDA backend runs (a compiled `create_block_mask` and a compiled
    `flex_attention`), here through inductor's CPU code generator: up to ~45 s on a cold compile cache, covering
    documents, causal, a left window and GQA at once."""
    lengths = [5, 40, 3, 100, 16]
    q, k, v = _inputs(lengths, 4, 2, 32, dtype=torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = backends.flex(
            q,
            k,
            v,
            cu_from_lengths(lengths),
            max_seqlen=100,
            causal=True,
            scale=0.2,
            window=(8, 0),
            compile=True,
        )
    ref = reference_attention(
        q.double(), k.double(), v.double(), lengths, causal=True, scale=0.2, left=8
    )
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_float32_and_bfloat16_run(backend):
    lengths = [5, 1, 9]
    for dtype, tol in ((torch.float32, 1e-5), (torch.bfloat16, 2e-2)):
        q, k, v = _inputs(lengths, 4, 2, 8, dtype=dtype)
        out = attention.varlen_attention(q, k, v, cu_from_lengths(lengths), backend=backend)
        ref = reference_attention(
            q.double(), k.double(), v.double(), lengths, causal=True, scale=1 / math.sqrt(8)
        )
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)


# ---------------------------------------------------------------------------------------------
# torch_varlen adapts to the installed torch's signature (checked on CPU with stand-ins).


def _fake_varlen(signature_kind):
    def impl(
        query,
        key,
        value,
        cu_seq_q,
        cu_seq_k,
        max_q,
        max_k,
        scale=None,
        window=(-1, -1),
        is_causal=False,
    ):
        if key.shape[1] != query.shape[1]:
            raise AssertionError("GQA must have been expanded or flagged")
        lengths = (cu_seq_q[1:] - cu_seq_q[:-1]).tolist()
        s = scale if scale is not None else 1 / math.sqrt(query.shape[-1])
        left, right = window
        if is_causal:
            right = 0
        return reference_attention(
            query, key, value, lengths, causal=False, scale=s, left=left, right=right
        )

    # The keyword parameters below are copied from each release's torch/nn/attention/varlen.py.
    if signature_kind == "2.10":

        def varlen_attn(
            query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None
        ):
            return impl(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=is_causal)

    elif signature_kind == "2.11":
        # scale and window_size, but no enable_gqa (the device image's release).

        def varlen_attn(
            query,
            key,
            value,
            cu_seq_q,
            cu_seq_k,
            max_q,
            max_k,
            *,
            return_aux=None,
            scale=None,
            window_size=(-1, -1),
        ):
            return impl(
                query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window=window_size
            )

    else:

        def varlen_attn(
            query,
            key,
            value,
            cu_seq_q,
            cu_seq_k,
            max_q,
            max_k,
            *,
            return_aux=None,
            scale=None,
            window_size=(-1, -1),
            enable_gqa=False,
            seqused_k=None,
            block_table=None,
            num_splits=None,
        ):
            if enable_gqa:
                group = query.shape[1] // key.shape[1]
                key, value = (t.repeat_interleave(group, dim=1) for t in (key, value))
            return impl(
                query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, scale=scale, window=window_size
            )

    return varlen_attn


@pytest.mark.parametrize("kind", ["2.10", "2.11", "2.13"])
def test_torch_varlen_adapts_to_signature(monkeypatch, kind):
    fake = _fake_varlen(kind)
    try:
        import torch.nn.attention.varlen as tv
    except ImportError:  # torch < 2.10: stand in the whole module
        tv = types.ModuleType("torch.nn.attention.varlen")
        monkeypatch.setitem(sys.modules, tv.__name__, tv)
    monkeypatch.setattr(tv, "varlen_attn", fake, raising=False)
    backends._torch_varlen_params.cache_clear()
    try:
        assert backends._torch_varlen_params() == frozenset(inspect.signature(fake).parameters)
        assert backends._torch_varlen_window() is (kind != "2.10")
        lengths = [4, 7, 2]
        q, k, v = _inputs(lengths, 4, 2, 8)
        cu = cu_from_lengths(lengths)
        windows = [(-1, 0)] if kind == "2.10" else [(-1, 0), (2, 0)]
        for win in windows:
            out = backends.torch_varlen(
                q, k, v, cu, max_seqlen=7, causal=True, scale=0.3, window=win
            )
            ref = reference_attention(q, k, v, lengths, causal=True, scale=0.3, left=win[0])
            torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    finally:
        backends._torch_varlen_params.cache_clear()


def test_installed_torch_varlen_signature_is_one_we_adapt_to():
    """The installed torch's varlen_attn takes causality in one of the two ways we handle."""
    params = backends._torch_varlen_params()
    if params is None:
        pytest.skip(f"torch {torch.__version__} has no torch.nn.attention.varlen")
    assert {"query", "key", "value", "cu_seq_q", "cu_seq_k", "max_q", "max_k"} <= params
    assert "window_size" in params or "is_causal" in params, sorted(params)


# ---------------------------------------------------------------------------------------------
# auto, and errors a person can act on.


def test_auto_on_cpu_uses_dense_while_tokens_squared_fit_k_per_document():
    def pick(total, n_docs):
        return attention.choose_backend(
            device="cpu", dtype=torch.float32, total_tokens=total, n_docs=n_docs
        )

    assert pick(64, 1).name == "dense"  # 64^2 == 4096 * 1
    assert pick(65, 1).name == "sdpa"
    assert pick(512, 64).name == "dense"
    assert pick(513, 64).name == "sdpa"
    assert "<= 4096 * 64 documents" in pick(512, 64).reason
    q, k, v = _inputs([3, 4], 2, 2, 4, dtype=torch.float32)
    _, name = attention.varlen_attention(q, k, v, cu_from_lengths([3, 4]), return_backend=True)
    assert name == "dense"
    q, k, v = _inputs([100], 2, 2, 4, dtype=torch.float32)
    _, name = attention.varlen_attention(q, k, v, cu_from_lengths([100]), return_backend=True)
    assert name == "sdpa"


@pytest.mark.parametrize("validate", [True, False])
def test_auto_counts_only_non_empty_documents(validate):
    # Static-shape padding repeats the token count in cu_seqlens (empty documents). Counted as
    # documents they tipped auto to dense: 1024 tokens in 4 documents padded to 256 entries ran
    # dense in 18.75 ms where sdpa took 6.50 ms. 256 tokens in 4: 256^2 > 4096 * 4, sdpa.
    lengths = [64, 64, 64, 64]
    q, k, v = _inputs(lengths, 2, 2, 4, dtype=torch.float32)
    for padded in (lengths, lengths + [0] * 16, [0, 64, 0, 64, 64, 0, 64] + [0] * 12):
        cu = cu_from_lengths(padded)
        _, name = attention.varlen_attention(
            q, k, v, cu, backend="auto", validate=validate, return_backend=True
        )
        assert name == "sdpa", padded


def test_auto_on_cuda_prefers_flash_then_torch_varlen(monkeypatch):
    monkeypatch.setitem(
        backends.SPECS,
        "flash_attn",
        dataclasses.replace(
            backends.SPECS["flash_attn"],
            dtypes=(torch.bfloat16,),
            available=lambda: "not installed",
        ),
    )
    monkeypatch.setitem(  # present whatever the installed torch, so its dtype rule is what skips it
        backends.SPECS,
        "torch_varlen",
        dataclasses.replace(backends.SPECS["torch_varlen"], available=lambda: None),
    )
    choice = attention.choose_backend(device="cuda", dtype=torch.float32, total_tokens=10)
    # float32: flash_attn (missing) and torch_varlen (half only) are passed over, and sdpa runs,
    # not compiled flex (it was flex, which did not finish a training run whose token count
    # changes each step: docs/attention.md).
    assert choice.name == "sdpa"
    assert "not installed" in choice.reason and "torch_varlen takes" in choice.reason
    assert "flash_attn > torch_varlen > sdpa" in choice.reason
    cuda = torch.device("cuda")
    assert "flex" not in attention.varlen.CUDA_ORDER  # but runs where it is named:
    assert "flex" in attention.usable_backends(cuda, torch.float32, (-1, 0)) or (
        backends._flex_available() is not None
    )


def _valid():
    q, k, v = _inputs([3, 4], 4, 2, 8, dtype=torch.float32)
    return q, k, v, cu_from_lengths([3, 4])


@pytest.mark.parametrize(
    ("cu", "match"),
    [
        (torch.tensor([0, 3, 7], dtype=torch.int64), "int32"),
        (torch.tensor([1, 3, 7], dtype=torch.int32), "start at 0, got 1"),
        (torch.tensor([0, 5, 3, 7], dtype=torch.int32), "non-decreasing, got 5 then 3"),
        (torch.tensor([0, 3, 6], dtype=torch.int32), "end at the token count 7, got 6"),
        (torch.tensor([0], dtype=torch.int32), "n_docs \\+ 1"),
    ],
)
def test_bad_cu_seqlens(cu, match):
    q, k, v, _ = _valid()
    with pytest.raises(ValueError, match=match):
        attention.varlen_attention(q, k, v, cu)


def test_bad_shapes_heads_dtypes_and_options():
    q, k, v, cu = _valid()
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        attention.varlen_attention(q, k.repeat(1, 2, 1)[:, :3], v.repeat(1, 2, 1)[:, :3], cu)
    with pytest.raises(ValueError, match="total_tokens and head_dim"):
        attention.varlen_attention(q, k[:6], v[:6], cu)
    with pytest.raises(ValueError, match="total_tokens and head_dim"):
        attention.varlen_attention(q, k[..., :4], v[..., :4], cu)
    with pytest.raises(ValueError, match=r"\(total_tokens, heads, head_dim\)"):
        attention.varlen_attention(q[None], k, v, cu)
    with pytest.raises(ValueError, match="same shape"):
        attention.varlen_attention(q, k, v[:, :1], cu)
    with pytest.raises(ValueError, match="one floating dtype"):
        attention.varlen_attention(q, k.double(), v, cu)
    with pytest.raises(ValueError, match="unknown backend 'fast'; choose from auto, flash_attn"):
        attention.varlen_attention(q, k, v, cu, backend="fast")
    with pytest.raises(ValueError, match=r"backend must be a name, one of auto, .* got \['sdpa'\]"):
        attention.varlen_attention(q, k, v, cu, backend=["sdpa"])  # was TypeError: unhashable
    with pytest.raises(ValueError, match="window must be >= 1"):
        attention.varlen_attention(q, k, v, cu, window=0)
    with pytest.raises(ValueError, match="window pair"):
        attention.varlen_attention(q, k, v, cu, window=(3, -2))
    with pytest.raises(ValueError, match="softmax_scale"):
        attention.varlen_attention(q, k, v, cu, softmax_scale=-1.0)
    with pytest.raises(ValueError, match="max_seqlen 3 is below the longest document \\(4\\)"):
        attention.varlen_attention(q, k, v, cu, max_seqlen=3)
    # Each of these was a TypeError or ZeroDivisionError, or was taken.
    with pytest.raises(ValueError, match="head_dim must be >= 1"):
        attention.varlen_attention(q[..., :0], k[..., :0], v[..., :0], cu)
    with pytest.raises(ValueError, match=r"q heads \(0\) must be a multiple"):
        attention.varlen_attention(q[:, :0], k, v, cu)
    with pytest.raises(ValueError, match="softmax_scale must be a positive finite number, got 'a'"):
        attention.varlen_attention(q, k, v, cu, softmax_scale="a")
    with pytest.raises(ValueError, match=r"window pair must be two ints >= -1 .*\(True, 0\)"):
        attention.varlen_attention(q, k, v, cu, window=(True, 0))
    with pytest.raises(ValueError, match="max_seqlen must be an int >= 0 or None, got 4.5"):
        attention.varlen_attention(q, k, v, cu, max_seqlen=4.5)
    # causal=None read as False (no mask), "no" as True: refused (found by a second reader)
    for causal in (None, "no", 1):
        with pytest.raises(ValueError, match=f"causal must be True or False, got {causal!r}"):
            attention.varlen_attention(q, k, v, cu, causal=causal)


@pytest.mark.parametrize("window", [None, 4, (3, 0), [3, 0]])
def test_choose_backend_takes_the_window_forms_varlen_attention_takes(window):
    """It normalised nothing: an int or None failed with TypeError on CUDA (and was ignored on
    CPU, hiding the mistake)."""
    expected = attention.varlen.normalize_window(window, True)
    seen = []
    real = attention.varlen.why_not

    def spy(name, device, dtype, win, causal=True, **kw):
        seen.append(win)
        return real(name, device, dtype, win, causal, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention.varlen, "why_not", spy)
        choice = attention.choose_backend(
            device="cuda", dtype=torch.bfloat16, total_tokens=8, window=window
        )
    assert choice.name in backends.SPECS and seen and set(seen) == {expected}
    with pytest.raises(ValueError, match="window must be >= 1"):
        attention.choose_backend(device="cpu", dtype=torch.float32, total_tokens=8, window=0)


@pytest.mark.parametrize("backend", ["flash_attn", "torch_varlen", "flex"])
def test_cuda_backend_on_cpu_names_the_usable_ones(backend):
    q, k, v, cu = _valid()
    with pytest.raises(
        ValueError, match=f"backend '{backend}' cannot run: .*usable here: sdpa, dense"
    ):
        attention.varlen_attention(q, k, v, cu, backend=backend)


def test_flash_attn_refuses_float32_by_dtype_reason(monkeypatch):
    monkeypatch.setitem(
        backends.SPECS,
        "flash_attn",
        dataclasses.replace(
            backends.SPECS["flash_attn"],
            cuda_only=False,
            dtypes=(torch.float16, torch.bfloat16),
            available=lambda: None,
        ),
    )
    q, k, v, cu = _valid()
    with pytest.raises(ValueError, match="flash_attn takes float16, bfloat16, got float32"):
        attention.varlen_attention(q, k, v, cu, backend="flash_attn")


def _installed(monkeypatch, *names):
    """The named CUDA kernels as if installed (the installed torch and packages vary)."""
    for name in names:
        spec = dataclasses.replace(backends.SPECS[name], available=lambda: None)
        monkeypatch.setitem(backends.SPECS, name, spec)


@pytest.mark.parametrize(
    ("head_dim", "capability", "expected", "skipped"),
    [
        (64, (9, 0), "flash_attn", []),
        (256, (8, 0), "flash_attn", []),
        # was flash_attn: a raw RuntimeError "only supports head dimension at most 256"
        (
            512,
            (9, 0),
            "sdpa",
            ["flash_attn takes head_dim <= 256, got 512", "torch_varlen takes head_dim <= 256"],
        ),
        # was flash_attn on a T4 (sm75) or V100 (sm70): "only supports Ampere GPUs or newer"
        (
            64,
            (7, 5),
            "sdpa",
            ["flash_attn needs a GPU of compute capability >= 8.0, got 7.5", "torch_varlen needs"],
        ),
        (64, (7, 0), "sdpa", ["compute capability >= 8.0, got 7.0"]),
    ],
)
def test_auto_on_cuda_passes_over_kernels_that_cannot_take_the_head_dim_or_the_gpu(
    monkeypatch, head_dim, capability, expected, skipped
):
    _installed(monkeypatch, "flash_attn", "torch_varlen")
    choice = attention.choose_backend(
        device="cuda",
        dtype=torch.bfloat16,
        total_tokens=64,
        head_dim=head_dim,
        capability=capability,
    )
    assert choice.name == expected
    for reason in skipped:
        assert reason in choice.reason


def test_torch_varlen_needs_a_head_dim_multiple_of_8_flash_attn_pads_it(monkeypatch):
    # aten._flash_attention_forward checks "head_size must be a multiple of 8" (SDPA pads
    # before calling it, varlen_attn does not); flash-attn's Python wrapper pads itself.
    _installed(monkeypatch, "flash_attn", "torch_varlen")
    cuda = torch.device("cuda")
    assert backends.SPECS["torch_varlen"].head_dim_multiple == 8
    kw = {"head_dim": 20, "capability": (8, 0)}
    assert attention.varlen.why_not("flash_attn", cuda, torch.bfloat16, (-1, 0), **kw) is None
    assert attention.varlen.why_not("torch_varlen", cuda, torch.bfloat16, (-1, 0), **kw) == (
        "torch_varlen takes a head_dim that is a multiple of 8, got 20"
    )
    assert attention.usable_backends(cuda, torch.bfloat16, (-1, 0), **kw) == [
        "flash_attn",
        "flex",
        "sdpa",
        "dense",
    ]


def test_a_named_kernel_that_cannot_take_the_head_dim_is_one_value_error(monkeypatch):
    # The CUDA kernel as a CPU one, so the check varlen_attention makes runs here.
    spec = dataclasses.replace(
        backends.SPECS["torch_varlen"], cuda_only=False, available=lambda: None
    )
    monkeypatch.setitem(backends.SPECS, "torch_varlen", spec)
    q, k, v = _inputs([3, 4], 2, 1, 264, dtype=torch.bfloat16)
    with pytest.raises(
        ValueError,
        match=r"^backend 'torch_varlen' cannot run: torch_varlen takes head_dim <= 256, got 264; "
        r"usable here: sdpa, dense$",
    ):
        attention.varlen_attention(q, k, v, cu_from_lengths([3, 4]), backend="torch_varlen")


def test_empty_documents_and_zero_tokens():
    q, k, v = _inputs([0, 3, 0, 2, 0], 2, 1, 4)
    cu = cu_from_lengths([0, 3, 0, 2, 0])
    for backend in CPU_BACKENDS:
        out = attention.varlen_attention(q, k, v, cu, backend=backend)
        ref = reference_attention(q, k, v, [0, 3, 0, 2, 0], causal=True, scale=0.5)
        torch.testing.assert_close(out, ref)
    empty = torch.zeros(0, 2, 4, dtype=torch.float64)
    out = attention.varlen_attention(empty, empty[:, :1], empty[:, :1], cu_from_lengths([0]))
    assert out.shape == (0, 2, 4)


@needs_flex
def test_flex_block_mask_is_built_once_per_cu_seqlens():
    cu = cu_from_lengths([3, 5])
    first = backends._document_block_mask(cu, 8, True, (-1, 0), False)
    assert backends._document_block_mask(cu, 8, True, (-1, 0), False) is first  # next layer
    assert backends._document_block_mask(cu, 8, True, (2, 0), False) is not first
    other = cu_from_lengths([3, 5])
    assert backends._document_block_mask(other, 8, True, (-1, 0), False) is not first
    again = backends._document_block_mask(other, 8, True, (-1, 0), False)
    other[1] = 4  # in-place change: the version counter invalidates the entry
    assert backends._document_block_mask(other, 8, True, (-1, 0), False) is not again


@needs_flex
def test_flex_runs_under_inference_mode_and_sees_in_place_changes_there():
    """Tensors made under `torch.inference_mode()` (a batch moved to the GPU in an eval loop)
    have no version counter; the BlockMask cache must neither fail on them nor serve a mask for
    values changed in place."""
    q, k, v = (torch.randn(10, 2, 8, dtype=torch.float64) for _ in range(3))
    kw = {"max_seqlen": 6, "causal": True, "scale": 0.35, "window": (-1, 0)}
    with torch.inference_mode():
        cu = cu_from_lengths([4, 6])
        out = _flex_eager(q, k, v, cu, **kw)
        assert torch.allclose(out, reference_attention(q, k, v, [4, 6], causal=True, scale=0.35))
        cached = backends._document_block_mask(cu, 10, True, (-1, 0), False)
        assert backends._document_block_mask(cu, 10, True, (-1, 0), False) is cached
        cu[1] = 7  # in place, inside inference mode: no version counter moves
        assert backends._document_block_mask(cu, 10, True, (-1, 0), False) is not cached
        out = _flex_eager(q, k, v, cu, **kw)
        assert torch.allclose(out, reference_attention(q, k, v, [7, 3], causal=True, scale=0.35))
