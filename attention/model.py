"""A small Llama-style decoder that trains on packed batches.

RMSNorm, rotary embeddings indexed by the per-document ``position_ids``, SwiGLU feed-forward and
grouped-query attention through `varlen_attention`, so documents packed into one sequence never
see each other. ``model(batch)`` takes the loader's batch dict as it is (docs/CONTRACTS.md).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attention.varlen import (
    BACKENDS,
    check_cu_seqlens,
    check_max_seqlen,
    choose_backend,
    count_documents,
    normalize_window,
    varlen_attention,
)

log = logging.getLogger("attention.varlen")
"""`auto`'s choice is logged where `varlen_attention` logs it, whoever resolved it."""

IGNORE_INDEX = -100
"""Label value of tokens that have no target (a document's last token, padding)."""
LOSS_NORMALIZATIONS = ("token", "sequence")


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of the decoder. Validated on construction (ValueError names the bad value)."""

    vocab_size: int
    """Number of token ids (embedding and output rows)."""
    dim: int = 256
    """Hidden size."""
    n_layers: int = 4
    """Number of decoder blocks."""
    n_heads: int = 4
    """Query heads; ``dim`` must be a multiple."""
    n_kv_heads: int | None = None
    """Key/value heads (grouped-query attention); must divide ``n_heads``. None = ``n_heads``."""
    ffn_hidden: int | None = None
    """SwiGLU hidden size; None = 8/3 * dim rounded up to a multiple of 64 (Llama)."""
    max_seq_len: int = 2048
    """Longest document (rotary table size); longer position ids are refused."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    sliding_window: int | None = None
    """Attention window in keys (including the query itself); None = full causal attention."""
    attn_backend: str = "auto"
    """`varlen_attention` backend: auto, flash_attn, torch_varlen, flex, sdpa or dense."""
    tie_embeddings: bool = False
    """Share the input embedding with the output projection."""
    loss_normalization: str = "token"
    """What `loss` averages over: `token` (every target weighs the same: the batch's summed loss
    / its targets) or `sequence` (each sequence's mean loss, then the mean over the sequences
    that have a target: a short answer weighs as much as a long one). A sequence is a
    ``cu_seqlens`` entry, a document as packed: one that `packtool pack --long-docs split` (the
    default without a loss mask) cut into pieces weighs once per piece. Packing changes neither
    (docs/attention.md); both sums are always in the output for micro-batch accumulation."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            _check_int(name, getattr(self, name))
        for name in ("n_kv_heads", "ffn_hidden", "sliding_window"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name), " or None")
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(f"tie_embeddings must be True or False, got {self.tie_embeddings!r}")
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim {self.dim} must be a multiple of n_heads {self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim (dim / n_heads = {self.head_dim}) must be even for rotary")
        if self.kv_heads < 1 or self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_kv_heads {self.n_kv_heads} must be >= 1 and divide n_heads {self.n_heads}"
            )
        if not 0 < self.rope_theta < math.inf:
            raise ValueError(f"rope_theta must be a finite number > 0, got {self.rope_theta}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be a finite number > 0, got {self.norm_eps}")
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            raise ValueError(
                f"loss_normalization must be one of {LOSS_NORMALIZATIONS}, "
                f"got {self.loss_normalization!r}"
            )
        if self.attn_backend not in BACKENDS:
            raise ValueError(
                f"attn_backend {self.attn_backend!r} is unknown; choose from {', '.join(BACKENDS)}"
            )

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden_dim(self) -> int:
        if self.ffn_hidden is not None:
            return self.ffn_hidden
        return 64 * math.ceil(8 * self.dim / 3 / 64)


def _check_int(name: str, value: object, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int{alternative}, got {value!r}")


@dataclass
class CausalLMOutput:
    """What `Transformer.forward` returns."""

    logits: torch.Tensor
    """``(total_tokens, vocab_size)``, in the compute dtype."""
    loss: torch.Tensor | None = None
    """The loss `ModelConfig.loss_normalization` asks for: ``loss_sum / num_targets`` (token) or
    ``sequence_loss_sum / num_sequences`` (sequence); None without labels."""
    loss_sum: torch.Tensor | None = None
    """Summed cross-entropy (float32): combine micro-batches as sum(loss_sum) / sum(num_targets)."""
    num_targets: torch.Tensor | None = None
    """Number of real targets (int64 scalar)."""
    sequence_loss_sum: torch.Tensor | None = None
    """Sum over the batch's sequences (``cu_seqlens`` entries) of each one's mean cross-entropy
    (float32): combine micro-batches as sum(sequence_loss_sum) / sum(num_sequences). The pieces
    of a document split across rows (``--long-docs split``) are sequences of their own, in one
    batch or several; truncated or dropped long documents (SFT data) are one sequence each."""
    num_sequences: torch.Tensor | None = None
    """Sequences (``cu_seqlens`` entries) with at least one target (int64 scalar)."""
    backend: str = ""
    """The attention backend that ran."""


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 whatever the compute dtype (bf16 squares lose too much).
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return xf.type_as(x) * self.weight.type_as(x)


def rotary_tables(
    head_dim: int, max_seq_len: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, ``(max_seq_len, head_dim // 2)`` float32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``(T, H, D)`` by per-token angles; ``cos``/``sin``: ``(T, D // 2)``."""
    x1, x2 = x.float().chunk(2, dim=-1)  # half-split layout (Llama/NeoX)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
        backend: str,
    ) -> torch.Tensor:
        # x: (T, dim) -> q: (T, n_heads, head_dim), k/v: (T, n_kv_heads, head_dim)
        total = x.shape[0]
        q = self.wq(x).view(total, self.cfg.n_heads, self.cfg.head_dim)
        k = self.wk(x).view(total, self.cfg.kv_heads, self.cfg.head_dim)
        v = self.wv(x).view(total, self.cfg.kv_heads, self.cfg.head_dim)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        out = varlen_attention(
            q,
            k,
            v,
            cu_seqlens,
            max_seqlen,
            causal=True,
            window=self.cfg.sliding_window,
            backend=backend,
            validate=False,  # checked once per batch in Transformer.forward
        )
        return self.wo(out.reshape(total, self.cfg.n_heads * self.cfg.head_dim))


class FeedForward(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.ffn = FeedForward(cfg)

    def forward(self, x, cos, sin, cu_seqlens, max_seqlen, backend):
        x = x + self.attn(self.attn_norm(x), cos, sin, cu_seqlens, max_seqlen, backend)
        return x + self.ffn(self.ffn_norm(x))


class Transformer(nn.Module):
    """The decoder. ``model(batch)`` -> `CausalLMOutput` (logits, and loss when labels exist)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rotary_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # GPT-2/Llama style: N(0, 0.02), residual output projections scaled by 1/sqrt(2 * layers).
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            scale = (
                1 / math.sqrt(2 * self.cfg.n_layers)
                if name.endswith(("wo.weight", "w2.weight"))
                else 1
            )
            nn.init.normal_(p, mean=0.0, std=std * scale)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def forward(self, batch: dict) -> CausalLMOutput:
        """Run a loader batch (docs/CONTRACTS.md "Loader batch").

        Args:
            batch: ``input_ids`` int64 ``(T,)``, ``cu_seqlens`` int32 ``(n_docs + 1,)``,
                ``position_ids`` int64 ``(T,)`` restarting at 0 per document, optional
                ``max_seqlen`` (an int >= the longest document, or None) and ``labels`` int64 ``(T,)`` (-100 = no target). Tensors
                are moved to the model's device.

        Raises:
            ValueError: a batch that is not a dict, a missing key, a key that is not a 1-D
                integer tensor of the token count, bad ``cu_seqlens`` or ``max_seqlen``,
                ``position_ids`` that do not count from each document's start (docs/attention.md;
                only the last document may wrap, as static-shape padding does), or (checked on host
                tensors) a position id outside ``max_seq_len``, an input id or label outside
                the vocabulary; a label other than -100 at a document's last token (checked on
                host labels, and on GPU labels with the positions, in the same read).
        """
        _check_batch(batch, self.cfg)
        device = self.embed.weight.device
        input_ids = batch["input_ids"].to(device, non_blocking=True)
        position_ids = batch["position_ids"].to(device, non_blocking=True)
        cu_src, pos_src, total = batch["cu_seqlens"], batch["position_ids"], input_ids.shape[0]
        labels_src = batch.get("labels")
        # Validate boundaries once per batch (the layers then skip the check): on the loader's
        # host copy at no sync; on a GPU, reading cu_seqlens is one sync, and the position and
        # label checks (tensor ops queued before it) come back in the same read.
        fault = label_fault = None
        if total and pos_src.device.type != "cpu" and _int32_vector_on(cu_src, pos_src.device):
            parts = [cu_src.long(), _position_fault(pos_src, cu_src, _may_wrap(batch))]
            gpu_labels = labels_src is not None and labels_src.device == pos_src.device
            if gpu_labels:
                parts.append(_label_fault(labels_src, cu_src))
            fetched, n = torch.cat(parts).tolist(), cu_src.numel()
            fault = tuple(fetched[n : n + 4])
            label_fault = tuple(fetched[n + 4 :]) if gpu_labels else None
            bounds = check_cu_seqlens(torch.tensor(fetched[:n], dtype=torch.int32), total)
        else:
            bounds = check_cu_seqlens(cu_src, total)
        cu_host = cu_src if cu_src.device.type == "cpu" else torch.tensor(bounds).int()
        longest = max((b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)), default=0)
        max_seqlen = check_max_seqlen(batch.get("max_seqlen"))  # an int, as collate gives
        if max_seqlen is None:
            max_seqlen = longest
        if max_seqlen < longest:
            raise ValueError(
                f"batch max_seqlen {max_seqlen} is below its longest document ({longest})"
            )
        # Rotary tables end at max_seq_len. A static-shape padding pseudo-document may be longer
        # than that (the loader wraps its positions), so check positions, not lengths; on the
        # host copy only (a device tensor would cost a sync; out-of-range indexing asserts there).
        if pos_src.device.type == "cpu" and total:
            top, low = int(pos_src.max()), int(pos_src.min())
            if low < 0:
                raise ValueError(f"position id {low} is negative")
            if top >= self.cfg.max_seq_len:
                raise ValueError(
                    f"position id {top} is outside ModelConfig.max_seq_len {self.cfg.max_seq_len} "
                    "(a document longer than the model's context?)"
                )
            fault = tuple(_position_fault(pos_src, cu_host, _may_wrap(batch)).tolist())
        if fault is not None and fault[0] >= 0:
            t, doc, got, want = fault
            raise ValueError(
                f"position_ids[{t}] is {got} where document {doc} (from cu_seqlens[{doc}] = "
                f"{bounds[doc]}) expects {want}: positions count 0, 1, 2, ... from each "
                "document's start (only static-shape padding, the last document with doc_ids "
                "-1, may wrap to 0, at one period)"
            )
        if labels_src is not None and labels_src.device.type == "cpu" and total:
            label_fault = tuple(_label_fault(labels_src, cu_host).tolist())
        if label_fault is not None and label_fault[0] >= 0:
            t, doc, got = label_fault
            raise ValueError(
                f"labels[{t}] is {got} at the last token of document {doc} (cu_seqlens[{doc + 1}]"
                f" = {t + 1}): nothing of its document follows it, so its label must be "
                f"{IGNORE_INDEX} (a label taken across a document boundary, or labels not shifted?)"
            )
        cu_seqlens = cu_src.to(device, non_blocking=True)

        h = self.embed(input_ids)  # (T, dim)
        backend = self.cfg.attn_backend
        if backend == "auto":
            dtype = (
                torch.get_autocast_dtype(device.type)
                if torch.is_autocast_enabled(device.type)
                else h.dtype
            )
            choice = choose_backend(
                device=device,
                dtype=dtype,
                total_tokens=input_ids.shape[0],
                n_docs=count_documents(bounds),  # not static-shape padding's empty entries
                window=normalize_window(self.cfg.sliding_window, True),
                head_dim=self.cfg.head_dim,
            )
            # The layers get the name, so their varlen_attention never sees auto: log it here,
            # on varlen's logger, as a direct auto call does (docs/attention.md).
            log.debug("Transformer auto -> %s (%s)", choice.name, choice.reason)
            backend = choice.name
        cos, sin = self.rope_cos[position_ids], self.rope_sin[position_ids]  # (T, head_dim // 2)
        for layer in self.layers:
            h = layer(h, cos, sin, cu_seqlens, max_seqlen, backend)
        logits = self.lm_head(self.norm(h))  # (T, vocab)

        out = CausalLMOutput(logits=logits, backend=backend)
        labels = batch.get("labels")
        if labels is not None:
            labels = labels.to(device, torch.int64, non_blocking=True)
            self._loss(out, logits, labels, cu_seqlens)
        return out

    def _loss(
        self,
        out: CausalLMOutput,
        logits: torch.Tensor,
        labels: torch.Tensor,
        cu_seqlens: torch.Tensor,
    ) -> None:
        """Both normalisations, from per-token losses; neither depends on how rows were packed."""
        # per_token: (T,) float32, 0 where there is no target
        per_token = F.cross_entropy(
            logits.float(), labels, ignore_index=IGNORE_INDEX, reduction="none"
        )
        has = labels != IGNORE_INDEX
        out.loss_sum = per_token.sum()
        out.num_targets = has.sum()
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()  # (n_docs,), padding entries too
        doc_of = torch.repeat_interleave(
            torch.arange(len(lengths), device=labels.device), lengths, output_size=len(labels)
        )  # (T,): each token's document
        # Counted from the labels, never taken from the batch's `doc_targets`: labels masked
        # after collate (a document left out of the loss) must change the weights with them.
        counts = torch.zeros(len(lengths), dtype=torch.int64, device=labels.device)
        counts.index_add_(0, doc_of, has.long())
        weight = 1.0 / counts.clamp_min(1).to(per_token.dtype)
        out.sequence_loss_sum = (per_token * weight[doc_of]).sum()
        out.num_sequences = (counts > 0).sum()
        if self.cfg.loss_normalization == "sequence":
            out.loss = out.sequence_loss_sum / out.num_sequences.clamp_min(1)
        else:
            out.loss = out.loss_sum / out.num_targets.clamp_min(1)


def _int32_vector_on(cu_seqlens: Any, device: torch.device) -> bool:
    """Whether ``cu_seqlens`` is shaped as `check_cu_seqlens` wants, on ``device``."""
    return (
        isinstance(cu_seqlens, torch.Tensor)
        and cu_seqlens.device == device
        and cu_seqlens.dtype == torch.int32
        and cu_seqlens.dim() == 1
        and cu_seqlens.numel() >= 2
    )


def _may_wrap(batch: Any) -> bool:
    """Whether the batch's last non-empty document may be collate's static-shape padding, whose
    positions wrap: not where the batch's host `doc_ids` name a document for that entry (the
    padding pseudo-document's is -1; so are the empty entries static shapes add after it, so
    only the last non-empty document's entry counts, where host `cu_seqlens` say which it is).
    Without host `doc_ids` (a batch of another source, or moved to the GPU, where reading them
    would sync) it may."""
    doc_ids = batch.get("doc_ids")
    if not isinstance(doc_ids, torch.Tensor) or doc_ids.device.type != "cpu" or not doc_ids.numel():
        return True
    cu = batch.get("cu_seqlens")
    if isinstance(cu, torch.Tensor) and cu.device.type == "cpu" and cu.numel() == len(doc_ids) + 1:
        filled = torch.nonzero(torch.diff(cu.long()) > 0)
        if len(filled):
            return bool(doc_ids[int(filled[-1])] < 0)
    return bool((doc_ids < 0).any())


def _position_fault(
    position_ids: torch.Tensor, cu_seqlens: torch.Tensor, may_wrap: bool = True
) -> torch.Tensor:
    """``[t, doc, got, expected]`` (int64, on position_ids' device) for the first token whose
    position id breaks the rule, ``t = -1`` when none does.

    The rule: a token's position id is its offset from its document's start in ``cu_seqlens``,
    except, where `may_wrap` (`_may_wrap`), in the last non-empty document, where it is that
    offset modulo the document's largest position id + 1 (collate's static-shape padding wraps
    at ``position_limit``; a document that does not wrap reads the same). Without the padding,
    the last document's positions count on as any other's: a lost boundary between the last
    documents of a row ([0, 1, 2, 0, 1, 2] as one document) is refused like any other. Tensor
    ops only, ``position_ids`` non-empty:
    no host sync, no loop over documents, and no device assert on ``cu_seqlens`` not yet
    validated (indices are clamped; the result is then read only once it passed).
    """
    pos = position_ids.long()
    total = pos.shape[0]
    t = torch.arange(total, device=pos.device)
    cu = cu_seqlens.to(pos.device, torch.int64)
    # Each token's document: the last entry <= t (an empty one shares its start with the next).
    doc = (torch.searchsorted(cu, t, right=True) - 1).clamp(0, cu.numel() - 2)
    offset = t - cu[doc]
    tail = t >= cu[doc[-1:]]  # the last non-empty document
    if not may_wrap:
        tail = torch.zeros_like(tail)
    period = torch.where(tail, pos, -1).amax().clamp_min(0) + 1
    expected = torch.where(tail, offset % period, offset)
    first = torch.where(pos != expected, t, total).amin()
    at = first.clamp_max(total - 1).view(1)
    found = torch.where(first < total, first, -1).view(1)
    return torch.cat([found, doc[at], pos[at], expected[at]])


def _label_fault(labels: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """``[t, doc, label]`` (int64, on labels' device) for the first non-empty document whose
    last token ``t`` has a label other than -100, ``t = -1`` when none has: such a label is the
    next document's first token, and trained silently (attention kept the documents apart, the
    loss did not). A few tensor ops over the documents' ends, not the tokens, ``labels``
    non-empty: no host sync, and indices clamped for ``cu_seqlens`` not yet validated."""
    cu = cu_seqlens.to(labels.device, torch.int64)
    if cu.numel() < 2:  # no document (a bad cu_seqlens, refused after): amin() of nothing raised
        return torch.tensor([-1, 0, 0], device=labels.device)
    ends = (cu[1:] - 1).clamp(0, labels.numel() - 1)
    got = labels[ends].long()
    bad = (cu[1:] > cu[:-1]) & (got != IGNORE_INDEX)
    n = bad.numel()
    first = torch.where(bad, torch.arange(n, device=labels.device), n).amin()
    doc = first.clamp_max(n - 1).view(1)
    return torch.cat([torch.where(first < n, ends[doc], -1), doc, got[doc]])


_INDEX_DTYPES = (torch.int64, torch.int32)
_LABEL_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8)


def _check_batch(batch: Any, cfg: ModelConfig) -> None:
    """Refuse, as one ValueError naming the key, a batch the layers would fail on with a raw
    torch error: keys missing, a key that is not a 1-D integer tensor of the token count, and (on
    the host copies, where the check costs no device sync) ids and labels outside the
    vocabulary."""
    if not isinstance(batch, Mapping):
        raise ValueError(
            f"batch must be a dict of tensors (the loader's batch), got {type(batch).__name__}"
        )
    missing = [key for key in ("input_ids", "cu_seqlens", "position_ids") if key not in batch]
    if missing:
        raise ValueError(f"batch lacks {', '.join(missing)}; it has {', '.join(map(str, batch))}")
    total = None
    for key in ("input_ids", "position_ids", "labels"):
        value = batch.get(key)
        if value is None and key == "labels":
            continue
        # bool passes `not is_floating_point()` but is no id, position or label (embedding,
        # rotary lookup and loss fail on it or take True as 1): refused like floats. Ids and
        # positions index tables (int32/int64 only: uint8 indexes as a boolean mask); labels
        # hold -100, so any signed integer type.
        allowed = _LABEL_DTYPES if key == "labels" else _INDEX_DTYPES
        if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype not in allowed:
            got = (
                f"{tuple(value.shape)} {value.dtype}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            kinds = "signed integer" if key == "labels" else "int64 or int32"
            raise ValueError(f"batch[{key!r}] must be a 1-D {kinds} tensor (T,), got {got}")
        total = value.shape[0] if total is None else total
        if value.shape[0] != total:
            raise ValueError(f"batch[{key!r}] has {value.shape[0]} entries for {total} input_ids")
    ids, labels = batch["input_ids"], batch.get("labels")
    if ids.device.type == "cpu" and ids.numel():
        low, top = int(ids.min()), int(ids.max())
        if low < 0 or top >= cfg.vocab_size:
            bad = low if low < 0 else top
            raise ValueError(f"input id {bad} is outside ModelConfig.vocab_size {cfg.vocab_size}")
    if labels is not None and labels.device.type == "cpu" and labels.numel():
        bad = labels[(labels != IGNORE_INDEX) & ((labels < 0) | (labels >= cfg.vocab_size))]
        if bad.numel():
            raise ValueError(
                f"label {int(bad[0])} is neither {IGNORE_INDEX} (no target) nor an id below "
                f"ModelConfig.vocab_size {cfg.vocab_size}"
            )
