"""The attention kernels behind `varlen_attention`, one function per backend.

Every backend takes already-validated packed tensors and computes, for each document separately,
``softmax(q k^T * scale + mask) v`` where the mask keeps key ``j`` for query ``i`` of the same
document when ``i - left <= j <= i + right`` (``-1`` meaning unbounded) and, when causal,
``j <= i``. Documents never see each other. Shapes everywhere:

- ``q``: ``(total_tokens, n_heads, head_dim)``; ``k``, ``v``: ``(total_tokens, n_kv_heads, head_dim)``
- ``cu_seqlens``: int32 ``(n_docs + 1,)``, starting at 0 and ending at ``total_tokens``
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

import torch
import torch.nn.functional as F

Window = tuple[int, int]
"""(left, right) in flash-attn's convention: -1 means unbounded on that side."""


@dataclass(frozen=True, kw_only=True)
class BackendSpec:
    """What a backend can run, so `auto` and the error messages can reason about it."""

    name: str
    """The name passed as ``backend=``."""
    cuda_only: bool
    """Runs on CUDA tensors only."""
    dtypes: tuple[torch.dtype, ...]
    """Floating dtypes the kernel accepts."""
    available: Callable[[], str | None]
    """Returns None when usable in this process, else why not (missing package, old torch)."""
    supports_window: Callable[[], bool] = lambda: True
    """Whether a sliding window can be expressed."""
    kernel: Callable[..., torch.Tensor]
    """`kernel(q, k, v, cu_seqlens, *, max_seqlen, causal, scale, window)` -> output."""
    cuda_rank: int | None = None
    """Its place in `auto`'s CUDA order (lowest first: the first usable one runs); None: `auto`
    never picks it on CUDA."""
    max_head_dim: int | None = None
    """The largest head_dim the kernel takes; None: any."""
    head_dim_multiple: int = 1
    """head_dim must be a multiple of this (a kernel that does not pad it)."""
    min_capability: tuple[int, int] | None = None
    """The oldest CUDA compute capability the kernel runs on; None: any."""


# ---------------------------------------------------------------------------------------------
# Masks shared by the dense, sdpa and reference paths.


def window_mask(
    q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: Window
) -> torch.Tensor | None:
    """Boolean ``(len(q_pos), len(k_pos))`` mask (True = attend), or None when nothing is masked."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    diff = k_pos[None, :] - q_pos[:, None]  # key position minus query position
    keep = torch.ones_like(diff, dtype=torch.bool)
    if left >= 0:
        keep &= diff >= -left
    if right >= 0:
        keep &= diff <= right
    return keep


def _expand_kv(k: torch.Tensor, n_heads: int) -> torch.Tensor:
    # (T, n_kv_heads, D) -> (T, n_heads, D): query head h reads kv head h // group (GQA).
    group = n_heads // k.shape[1]
    return k if group == 1 else k.repeat_interleave(group, dim=1)


# ---------------------------------------------------------------------------------------------
# CPU-capable backends.


def dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    causal: bool,
    scale: float,
    window: Window,
) -> torch.Tensor:
    """One SDPA call over the whole packed sequence with a block-diagonal boolean mask.

    O(total_tokens^2) time and memory: the reference and the fastest path for tiny inputs.
    """
    total = q.shape[0]
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=q.device), lengths)
    pos = torch.arange(total, device=q.device)
    keep = doc[:, None] == doc[None, :]  # (T, T)
    wm = window_mask(pos, pos, causal, window)
    if wm is not None:
        keep &= wm
    # (1, H, T, D) layout for SDPA.
    qh = q.transpose(0, 1).unsqueeze(0)
    kh = _expand_kv(k, q.shape[1]).transpose(0, 1).unsqueeze(0)
    vh = _expand_kv(v, q.shape[1]).transpose(0, 1).unsqueeze(0)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=keep, scale=scale)
    return out.squeeze(0).transpose(0, 1)


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    causal: bool,
    scale: float,
    window: Window,
) -> torch.Tensor:
    """One SDPA call per document: exact, O(sum len^2), any device and dtype."""
    bounds = cu_seqlens.tolist()
    lengths = [end - start for start, end in pairwise(bounds)]
    kx = _expand_kv(k, q.shape[1])
    vx = _expand_kv(v, q.shape[1])
    outs = []
    # One split per tensor, not a slice per document: each slice's backward writes its gradient
    # into a zeroed tensor of all T tokens (O(documents x T): 47 % of a CPU training step with
    # 80 documents in 32k tokens), a split's backward concatenates the pieces once.
    for qd, kd, vd in zip(q.split(lengths), kx.split(lengths), vx.split(lengths), strict=True):
        n = qd.shape[0]
        if n == 0:
            continue
        qd, kd, vd = (t.transpose(0, 1).unsqueeze(0) for t in (qd, kd, vd))  # (1, H, L, D)
        # Only the left bound, or a right bound without causal, needs an explicit mask.
        if window[0] >= 0 or (window[1] >= 0 and not causal):
            pos = torch.arange(n, device=q.device)
            mask = window_mask(pos, pos, causal, window)
            od = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=mask, scale=scale)
        else:
            od = F.scaled_dot_product_attention(qd, kd, vd, is_causal=causal, scale=scale)
        outs.append(od.squeeze(0).transpose(0, 1))
    if not outs:
        return q.new_zeros(q.shape[0], q.shape[1], v.shape[2])
    return torch.cat(outs, dim=0)


# ---------------------------------------------------------------------------------------------
# Flex attention (document mask as a BlockMask; compiled on CUDA).


@functools.lru_cache(maxsize=1)
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


@functools.lru_cache(maxsize=1)
def _flex_available() -> str | None:
    try:
        # `from ... import`, not `import torch.nn...`: that would bind `torch` as a local name,
        # and the message below would then raise UnboundLocalError instead of returning.
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs >= 2.5)"
    return None


# One entry: every layer of a forward passes the same cu_seqlens tensor, so the BlockMask is
# built once per batch, not once per layer. The entry holds the tensor itself (not its id, which
# could be reused after it is freed) and its in-place version counter. A tensor made under
# `torch.inference_mode()` has no version counter: the entry then keeps a copy of its values and
# a hit compares them (one small comparison per layer, where a rebuild would cost far more).
_BLOCK_MASK_CACHE: list[tuple] = []


def _same_values(cu_seqlens: torch.Tensor, kept: torch.Tensor | None) -> bool:
    return kept is None or bool(torch.equal(cu_seqlens, kept))


def _document_block_mask(
    cu_seqlens: torch.Tensor, total: int, causal: bool, window: Window, compile: bool
):
    from torch.nn.attention.flex_attention import create_block_mask

    inference = cu_seqlens.is_inference()
    key = (None if inference else cu_seqlens._version, total, causal, window, compile)
    if (
        _BLOCK_MASK_CACHE
        and _BLOCK_MASK_CACHE[0][0] is cu_seqlens
        and _BLOCK_MASK_CACHE[0][1] == key
        and _same_values(cu_seqlens, _BLOCK_MASK_CACHE[0][3])
    ):
        return _BLOCK_MASK_CACHE[0][2]
    device = cu_seqlens.device
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    # output_size avoids a device sync to size the result.
    doc = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=device), lengths, output_size=total
    )
    left, right = window
    if causal:
        right = 0

    def mask_mod(b, h, q_idx, kv_idx):
        keep = doc[q_idx] == doc[kv_idx]
        if right >= 0:
            keep = keep & (kv_idx - q_idx <= right)
        if left >= 0:
            keep = keep & (q_idx - kv_idx <= left)
        return keep

    block_mask = create_block_mask(
        mask_mod, None, None, total, total, device=device, _compile=compile
    )
    kept = cu_seqlens.clone() if inference else None
    _BLOCK_MASK_CACHE[:] = [(cu_seqlens, key, block_mask, kept)]
    return block_mask


def flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    causal: bool,
    scale: float,
    window: Window,
    compile: bool = True,
) -> torch.Tensor:
    """Flex attention with a document (and causal/window) `mask_mod` built by `create_block_mask`.

    ``compile=False`` runs flex's unfused eager path: slow, but lets CPU tests check the mask.
    """
    from torch.nn.attention.flex_attention import flex_attention

    block_mask = _document_block_mask(cu_seqlens, q.shape[0], causal, window, compile)
    qh = q.transpose(0, 1).unsqueeze(0)  # (1, H, T, D)
    kh = k.transpose(0, 1).unsqueeze(0)
    vh = v.transpose(0, 1).unsqueeze(0)
    fn = _compiled_flex() if compile else flex_attention
    out = fn(qh, kh, vh, block_mask=block_mask, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return out.squeeze(0).transpose(0, 1)


# ---------------------------------------------------------------------------------------------
# torch.nn.attention.varlen.varlen_attn (torch >= 2.10, CUDA).


@functools.lru_cache(maxsize=1)
def _torch_varlen_params() -> frozenset[str] | None:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return frozenset(inspect.signature(varlen_attn).parameters)


def _torch_varlen_available() -> str | None:
    if _torch_varlen_params() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.varlen (needs >= 2.10)"
    return None


def _torch_varlen_window() -> bool:
    # torch 2.10 exposes only `is_causal`; later releases replace it with `window_size`.
    params = _torch_varlen_params()
    return params is not None and "window_size" in params


def torch_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    causal: bool,
    scale: float,
    window: Window,
) -> torch.Tensor:
    """`torch.nn.attention.varlen.varlen_attn`, adapted to the signature of the installed torch.

    Older releases lack ``scale`` (q is pre-scaled instead), ``enable_gqa`` (k/v are expanded)
    and ``window_size`` (only ``is_causal``; a window is then refused before we get here).
    """
    from torch.nn.attention.varlen import varlen_attn

    params = _torch_varlen_params() or frozenset()
    kwargs: dict[str, object] = {}
    if "scale" in params:
        kwargs["scale"] = scale
    else:
        q = q * (scale * math.sqrt(q.shape[-1]))  # the kernel applies 1/sqrt(head_dim) itself
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    if "window_size" in params:
        left, right = window
        kwargs["window_size"] = (left, 0 if causal else right)
    else:
        kwargs["is_causal"] = causal
    out = varlen_attn(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, **kwargs)
    return out[0] if isinstance(out, tuple) else out


# ---------------------------------------------------------------------------------------------
# flash-attn (optional extra: pip install packtool[flash]).


@functools.lru_cache(maxsize=1)
def _flash_attn_available() -> str | None:
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return "flash-attn is not installed (pip install packtool[flash])"
    except Exception as exc:  # a wheel built for another torch/CUDA fails with OSError etc.
        return f"flash-attn failed to import: {exc}"
    return None


def flash_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    *,
    max_seqlen: int,
    causal: bool,
    scale: float,
    window: Window,
) -> torch.Tensor:
    """`flash_attn.flash_attn_varlen_func` (GQA, scale and window are native)."""
    from flash_attn import flash_attn_varlen_func

    return flash_attn_varlen_func(
        q,
        k,
        v,
        cu_seqlens,
        cu_seqlens,
        max_seqlen,
        max_seqlen,
        softmax_scale=scale,
        causal=causal,
        window_size=window,
    )


# ---------------------------------------------------------------------------------------------

_HALF = (torch.float16, torch.bfloat16)
_ALL = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

SPECS: dict[str, BackendSpec] = {
    spec.name: spec
    for spec in (
        # FlashAttention-2 (flash-attn's and the copy in aten that torch_varlen calls) refuses
        # head_dim > 256 and GPUs before Ampere (sm80) with a RuntimeError; flash-attn's Python
        # wrapper pads head_dim to a multiple of 8, aten._flash_attention_forward does not.
        BackendSpec(
            name="flash_attn",
            cuda_only=True,
            dtypes=_HALF,
            available=_flash_attn_available,
            kernel=flash_attn,
            cuda_rank=0,
            max_head_dim=256,
            min_capability=(8, 0),
        ),
        BackendSpec(
            name="torch_varlen",
            cuda_only=True,
            dtypes=_HALF,
            available=_torch_varlen_available,
            supports_window=_torch_varlen_window,
            kernel=torch_varlen,
            cuda_rank=1,
            max_head_dim=256,
            head_dim_multiple=8,
            min_capability=(8, 0),
        ),
        # Not ranked: compiled flex did not finish a training run whose token count changes
        # each step (docs/attention.md, "Why auto ..."), and nothing there depends on the dtype;
        # sdpa, which always runs, would leave any rank after it unreachable.
        BackendSpec(
            name="flex",
            cuda_only=True,
            dtypes=(torch.float16, torch.bfloat16, torch.float32),
            available=_flex_available,
            kernel=flex,
        ),
        BackendSpec(
            name="sdpa",
            cuda_only=False,
            dtypes=_ALL,
            available=lambda: None,
            kernel=sdpa,
            cuda_rank=2,
        ),
        BackendSpec(
            name="dense", cuda_only=False, dtypes=_ALL, available=lambda: None, kernel=dense
        ),
    )
}
"""Every backend, once: what it can run, its kernel, and where `auto` ranks it on CUDA. Adding a
backend is one kernel function and one entry here (docs/CONTRACTS.md)."""
