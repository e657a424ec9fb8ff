"""Varlen attention backends and a small Llama-style model that trains on packed batches."""
