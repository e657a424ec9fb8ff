"""Memory-mapped torch loader over packtool shards: varlen batches, exactly once, resumable.

The folders follow a batch's way to the model (docs/architecture.md):

- `store/`: packtool shards memory-mapped, row groups decoded into flat arrays, row counts.
- `order/`: an epoch's row order and its global steps over ranks, computed a window at a time.
- `packed/`: `PackedDataset` and `PackedDataLoader` (workers, shared-memory transport, resume).
- `online/`: packing on the fly: `OnlinePacker`, `StreamingPackedDataset`, `RequestBatcher`.
- `mixture/`: `MixedDataset`, batches from several sources in exact proportions.
- `hf/`: the Hugging Face stack (`loader.hf`: a `datasets` view, `Trainer`).
- `record.py`, `config.py`, `collate.py`: the one record type, the settings, the batch dict;
  `context_parallel.py`: one context-parallel rank's share of a batch.

Imports only packtool's format side (`packtool.dataset`, `packtool.storage`, the pure
`packtool.pack` and `packtool.mixture` schedule, `packtool.errors`), never a tokenizer. The
online, mixture and serving classes are imported on first use (they load numba's kernels).
"""

from __future__ import annotations

import importlib
from typing import Any

from loader.collate import IGNORE_INDEX, collate
from loader.config import LoaderConfig, OnlineConfig
from loader.packed.dataloader import PackedDataLoader, make_dataloader
from loader.packed.dataset import PackedDataset
from loader.record import Documents
from loader.store.shards import ShardStore

_LAZY = {
    "MixedDataLoader": "loader.mixture.dataloader",
    "MixedDataset": "loader.mixture.dataset",
    "token_sources": "loader.mixture.batch",
    "OnlinePacker": "loader.online.packer",
    "PackedRows": "loader.online.rows",
    "RowBatcher": "loader.online.rows",
    "BatcherClosedError": "loader.online.serving",
    "BatcherTimeoutError": "loader.online.serving",
    "RequestBatcher": "loader.online.serving",
    "StreamingPackedDataset": "loader.online.streaming",
}


def __getattr__(name: str) -> Any:
    # PEP 562: the classes that need numba's kernels load with their module, on first use.
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'loader' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "BatcherClosedError",
    "BatcherTimeoutError",
    "Documents",
    "IGNORE_INDEX",
    "LoaderConfig",
    "MixedDataLoader",
    "MixedDataset",
    "OnlineConfig",
    "OnlinePacker",
    "PackedDataLoader",
    "PackedDataset",
    "PackedRows",
    "RowBatcher",
    "RequestBatcher",
    "ShardStore",
    "StreamingPackedDataset",
    "collate",
    "make_dataloader",
    "token_sources",
]
