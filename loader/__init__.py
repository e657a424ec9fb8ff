"""Memory-mapped torch loader over packtool shards: varlen batches, exactly once, resumable."""
