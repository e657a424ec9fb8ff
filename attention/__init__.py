"""Varlen attention backends and a small Llama-style model that trains on packed batches."""

from attention.model import CausalLMOutput, ModelConfig, Transformer
from attention.varlen import (
    BACKENDS,
    BackendChoice,
    check_cu_seqlens,
    choose_backend,
    normalize_window,
    usable_backends,
    varlen_attention,
)

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "CausalLMOutput",
    "ModelConfig",
    "Transformer",
    "check_cu_seqlens",
    "choose_backend",
    "normalize_window",
    "usable_backends",
    "varlen_attention",
]
