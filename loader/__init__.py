"""Memory-mapped torch loader over packtool shards: varlen batches, exactly once, resumable."""

from loader.collate import IGNORE_INDEX, collate
from loader.config import LoaderConfig, OnlineConfig
from loader.dataloader import PackedDataLoader, make_dataloader
from loader.dataset import PackedDataset
from loader.mixture import MixedDataset, token_sources
from loader.mixture_loader import MixedDataLoader
from loader.online import OnlinePacker
from loader.record import Documents
from loader.rows import PackedRows, RowBatcher
from loader.serving import BatcherClosedError, RequestBatcher
from loader.shards import ShardStore
from loader.streaming import StreamingPackedDataset

__all__ = [
    "BatcherClosedError",
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
