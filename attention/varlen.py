"""`varlen_attention`: attention over packed documents, and the `auto` backend choice.

Packed tensors hold several documents back to back; ``cu_seqlens`` (int32, ``(n_docs + 1,)``)
marks where each starts. A query only ever sees keys of its own document.
"""

from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from itertools import pairwise

import torch

from attention.backends import SPECS, Window

log = logging.getLogger(__name__)

BACKENDS = ("auto", *SPECS)
"""Names accepted by ``backend=``."""

CUDA_ORDER = tuple(
    sorted(
        (n for n, s in SPECS.items() if s.cuda_rank is not None), key=lambda n: SPECS[n].cuda_rank
    )
)
"""Preference on CUDA: the first usable one wins."""

DENSE_K = 4096
"""On CPU, `auto` uses `dense` while ``total_tokens**2 <= DENSE_K * n_docs``, else `sdpa`.

One masked SDPA call costs ~T^2; one call per document costs a fixed overhead per document plus
sum(len^2). Fitted with ``python -m benchmarks.bench_train --crossover`` (docs/attention.md):
dense won up to 128 tokens with 4 documents, 256 with 16 and 512 with 64, i.e. T^2 / n = 4096.
"""


@dataclass(frozen=True, kw_only=True)
class BackendChoice:
    """What `choose_backend` picked and why."""

    name: str
    """The backend that will run."""
    reason: str
    """One line: why this one (and why the preferred ones were passed over)."""


def normalize_window(window: int | tuple[int, int] | None, causal: bool) -> Window:
    """Turn the user's ``window`` into flash-attn's ``(left, right)``, -1 meaning unbounded.

    An int ``w`` is a window of ``w`` keys including the query itself: ``(w - 1, 0)`` when
    causal, ``(w - 1, w - 1)`` otherwise. With ``causal=True`` the right bound is always 0.
    """
    if window is None:
        return (-1, 0) if causal else (-1, -1)
    if isinstance(window, bool) or not isinstance(window, (int, tuple, list)):
        raise ValueError(
            f"window must be None, an int >= 1 or a (left, right) pair, got {window!r}"
        )
    if isinstance(window, int):
        if window < 1:
            raise ValueError(f"window must be >= 1 (the query itself counts), got {window}")
        return (window - 1, 0 if causal else window - 1)
    if len(window) != 2 or not all(
        isinstance(w, int) and not isinstance(w, bool) and w >= -1 for w in window
    ):
        raise ValueError(
            f"window pair must be two ints >= -1 (-1 = unbounded), got {tuple(window)!r}"
        )
    left, right = window
    return (left, 0 if causal else right)


def check_cu_seqlens(cu_seqlens: torch.Tensor, total_tokens: int) -> list[int]:
    """Validate ``cu_seqlens`` against the token count and return it as a list.

    Raises:
        ValueError: not int32, not 1-D, empty, not starting at 0, decreasing, or not ending at
            ``total_tokens``; the message names the offending value.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise ValueError(f"cu_seqlens must be a torch.Tensor, got {type(cu_seqlens).__name__}")
    if cu_seqlens.dtype != torch.int32:
        raise ValueError(
            f"cu_seqlens must be int32 (flash kernels require it), got {cu_seqlens.dtype}"
        )
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 2:
        raise ValueError(
            f"cu_seqlens must be 1-D with n_docs + 1 >= 2 entries, got shape {tuple(cu_seqlens.shape)}"
        )
    bounds = cu_seqlens.tolist()  # one device sync on CUDA
    if bounds[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {bounds[0]}")
    for i in range(1, len(bounds)):
        if bounds[i] < bounds[i - 1]:
            raise ValueError(
                f"cu_seqlens must be non-decreasing, got {bounds[i - 1]} then {bounds[i]} "
                f"at index {i}"
            )
    if bounds[-1] != total_tokens:
        raise ValueError(f"cu_seqlens must end at the token count {total_tokens}, got {bounds[-1]}")
    return bounds


def count_documents(bounds: list[int]) -> int:
    """The non-empty documents of ``cu_seqlens`` given as a list: static-shape padding repeats
    the token count (empty entries), which are no documents for `choose_backend`'s cost rule."""
    return sum(b > a for a, b in pairwise(bounds))


def check_max_seqlen(max_seqlen: object) -> int | None:
    """Return ``max_seqlen`` if it is None or a Python int >= 0 (the loader's batch holds an
    int), else raise ``ValueError`` naming it: a float would be truncated, a string or tensor is
    not a length."""
    if max_seqlen is not None and (
        isinstance(max_seqlen, bool) or not isinstance(max_seqlen, int) or max_seqlen < 0
    ):
        raise ValueError(f"max_seqlen must be an int >= 0 or None, got {max_seqlen!r}")
    return max_seqlen


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3:
            raise ValueError(
                f"{name} must be (total_tokens, heads, head_dim), got shape {tuple(t.shape)}"
            )
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} must agree on total_tokens and head_dim"
        )
    if q.shape[2] == 0:
        raise ValueError(f"head_dim must be >= 1, got q of shape {tuple(q.shape)}")
    if k.shape[1] == 0 or q.shape[1] == 0 or q.shape[1] % k.shape[1] != 0:
        raise ValueError(
            f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]}) "
            "for grouped-query attention"
        )
    if not (q.dtype == k.dtype == v.dtype) or not q.dtype.is_floating_point:
        raise ValueError(
            f"q, k, v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def cuda_capability(device: torch.device) -> tuple[int, int] | None:
    """The compute capability of a CUDA ``device``; None where this process has no CUDA (a
    question about "cuda" asked on a CPU machine: no kernel is refused for it)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return _capability(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=16)
def _capability(index: int) -> tuple[int, int]:
    # Asked by every layer that names its backend: once per device, not once per call.
    return torch.cuda.get_device_capability(index)


def why_not(
    name: str,
    device: torch.device,
    dtype: torch.dtype,
    window: Window,
    causal: bool = True,
    *,
    head_dim: int | None = None,
    capability: tuple[int, int] | None = None,
) -> str | None:
    """Why backend ``name`` cannot run these inputs, or None when it can.

    ``head_dim`` None is not checked; ``capability`` (major, minor) None is read from a CUDA
    ``device`` (`cuda_capability`). Both are arguments so the rule can be tested without a GPU.
    """
    spec = SPECS[name]
    missing = spec.available()
    if missing is not None:
        return missing
    if spec.cuda_only and device.type != "cuda":
        return f"{name} needs CUDA tensors, got {device.type}"
    if dtype not in spec.dtypes:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in spec.dtypes)
        return f"{name} takes {allowed}, got {str(dtype).removeprefix('torch.')}"
    if head_dim is not None:
        if spec.max_head_dim is not None and head_dim > spec.max_head_dim:
            return f"{name} takes head_dim <= {spec.max_head_dim}, got {head_dim}"
        if head_dim % spec.head_dim_multiple:
            return f"{name} takes a head_dim that is a multiple of {spec.head_dim_multiple}, got {head_dim}"
    if spec.min_capability is not None and device.type == "cuda":
        cap = capability if capability is not None else cuda_capability(device)
        if cap is not None and tuple(cap) < spec.min_capability:
            need = ".".join(map(str, spec.min_capability))
            return f"{name} needs a GPU of compute capability >= {need}, got {cap[0]}.{cap[1]}"
    has_window = window[0] >= 0 or (window[1] >= 0 and not causal)
    if has_window and not spec.supports_window():
        return f"{name} cannot apply a sliding window with torch {torch.__version__}"
    return None


def usable_backends(
    device: torch.device,
    dtype: torch.dtype,
    window: Window,
    causal: bool = True,
    *,
    head_dim: int | None = None,
    capability: tuple[int, int] | None = None,
) -> list[str]:
    """Backends that can run inputs of this device, dtype, window and head_dim."""
    return [
        name
        for name in SPECS
        if why_not(name, device, dtype, window, causal, head_dim=head_dim, capability=capability)
        is None
    ]


def choose_backend(
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    total_tokens: int,
    n_docs: int = 1,
    window: int | tuple[int, int] | None = None,
    causal: bool = True,
    head_dim: int | None = None,
    capability: tuple[int, int] | None = None,
) -> BackendChoice:
    """The backend `auto` runs for these inputs, with the reason. ``window`` takes the forms
    `varlen_attention` takes; ``head_dim`` (None: not checked) and ``capability`` (None: the
    device's) rule out the kernels that cannot run them (`why_not`).

    CPU: ``dense`` while ``total_tokens**2 <= DENSE_K * n_docs`` (one masked call beats a Python
    loop over many short documents; ``n_docs`` counts non-empty documents, `count_documents`), ``sdpa`` otherwise. CUDA: the first usable of
    flash_attn > torch_varlen > sdpa (`CUDA_ORDER`; flex only when named: docs/attention.md).
    """
    device = torch.device(device)
    window = normalize_window(window, causal)
    if device.type != "cuda":
        rule = f"{total_tokens}^2 {{}} {DENSE_K} * {n_docs} documents"
        if total_tokens * total_tokens <= DENSE_K * max(n_docs, 1):
            return BackendChoice(
                name="dense", reason=f"{device.type}: {rule.format('<=')}, one masked call"
            )
        return BackendChoice(
            name="sdpa", reason=f"{device.type}: {rule.format('>')}, one call per document"
        )
    skipped = []
    for name in CUDA_ORDER:
        reason = why_not(
            name, device, dtype, window, causal, head_dim=head_dim, capability=capability
        )
        if reason is None:
            why = f"cuda: first usable of {' > '.join(CUDA_ORDER)}"
            return BackendChoice(
                name=name, reason=why + (f" ({'; '.join(skipped)})" if skipped else "")
            )
        skipped.append(reason)
    raise AssertionError("sdpa always runs")  # pragma: no cover


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    causal: bool = True,
    softmax_scale: float | None = None,
    window: int | tuple[int, int] | None = None,
    backend: str = "auto",
    *,
    validate: bool = True,
    return_backend: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, str]:
    """Attention over packed documents: each document attends only to itself.

    Args:
        q: ``(total_tokens, n_heads, head_dim)``.
        k: ``(total_tokens, n_kv_heads, head_dim)``; ``n_heads`` must be a multiple of
            ``n_kv_heads`` (grouped-query attention).
        v: same shape as ``k``.
        cu_seqlens: int32 ``(n_docs + 1,)`` document boundaries, 0 first, ``total_tokens`` last.
        max_seqlen: longest document; computed from ``cu_seqlens`` when None.
        causal: a query sees only keys at or before its position.
        softmax_scale: multiplies ``q k^T``; default ``1 / sqrt(head_dim)``.
        window: None (no window), an int ``w`` (``w`` keys including the query itself), or a
            ``(left, right)`` pair as in flash-attn (-1 = unbounded; right is 0 when causal).
        backend: ``auto`` or one of ``flash_attn``, ``torch_varlen``, ``flex``, ``sdpa``,
            ``dense``.
        validate: check ``cu_seqlens`` values (one device sync on CUDA). A caller that checked
            them once per batch (the model) passes False for each layer.
        return_backend: also return the name of the backend that ran.

    Returns:
        ``(total_tokens, n_heads, head_dim)`` output, plus the backend name when
        ``return_backend``.

    Raises:
        ValueError: bad shapes, dtypes, ``cu_seqlens``, ``window``, ``softmax_scale``, an
            unknown backend, or a backend that cannot run these inputs (the message names the
            backends that can).
    """
    _check_qkv(q, k, v)
    if not isinstance(cu_seqlens, torch.Tensor) or cu_seqlens.device != q.device:
        where = cu_seqlens.device if isinstance(cu_seqlens, torch.Tensor) else type(cu_seqlens)
        raise ValueError(f"cu_seqlens must be a tensor on {q.device} like q, got {where}")
    bounds = check_cu_seqlens(cu_seqlens, q.shape[0]) if validate else None
    if check_max_seqlen(max_seqlen) is None:
        bounds = bounds or cu_seqlens.tolist()
        max_seqlen = max((b - a for a, b in pairwise(bounds)), default=0)
    elif bounds is not None:
        longest = max((b - a for a, b in pairwise(bounds)), default=0)
        if max_seqlen < longest:
            raise ValueError(f"max_seqlen {max_seqlen} is below the longest document ({longest})")
    if not isinstance(causal, bool):  # None or "no" read as a truth value: a mask unasked for
        raise ValueError(f"causal must be True or False, got {causal!r}")
    win = normalize_window(window, causal)
    if softmax_scale is None:
        softmax_scale = 1.0 / math.sqrt(q.shape[-1])
    elif (
        isinstance(softmax_scale, bool)
        or not isinstance(softmax_scale, (int, float))
        or not (softmax_scale > 0 and math.isfinite(softmax_scale))
    ):
        raise ValueError(f"softmax_scale must be a positive finite number, got {softmax_scale!r}")

    if not isinstance(backend, str):
        raise ValueError(f"backend must be a name, one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        if bounds is not None:
            n_docs = count_documents(bounds)
        elif q.device.type == "cuda":  # the CUDA rule ignores n_docs; counting would sync
            n_docs = cu_seqlens.numel() - 1
        else:
            n_docs = int((cu_seqlens[1:] > cu_seqlens[:-1]).sum())
        choice = choose_backend(
            device=q.device,
            dtype=q.dtype,
            total_tokens=q.shape[0],
            n_docs=n_docs,
            window=win,
            causal=causal,
            head_dim=q.shape[-1],
        )
        log.debug("varlen_attention auto -> %s (%s)", choice.name, choice.reason)
        name = choice.name
    elif backend in SPECS:
        reason = why_not(backend, q.device, q.dtype, win, causal, head_dim=q.shape[-1])
        if reason is not None:
            ok = usable_backends(q.device, q.dtype, win, causal, head_dim=q.shape[-1])
            raise ValueError(
                f"backend {backend!r} cannot run: {reason}; usable here: {', '.join(ok)}"
            )
        name = backend
    else:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")

    if q.shape[0] == 0:
        out = q.new_zeros(q.shape)
    else:
        out = SPECS[name].kernel(
            q,
            k,
            v,
            cu_seqlens,
            max_seqlen=max_seqlen,
            causal=causal,
            scale=softmax_scale,
            window=win,
        )
    return (out, name) if return_backend else out
