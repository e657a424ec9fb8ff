"""Packed datasets: `PackedDataset` and `PackedDataLoader`, exactly once over ranks x workers.

`PackedDataset` is a torch `IterableDataset` of collated varlen batches (flat tokens, int32
`cu_seqlens`, per-document `position_ids`, labels) over a packed dataset; `PackedDataLoader` is
a torch DataLoader over it whose workers hand batches back through a shared-memory ring
(`transport.py`) and that keeps its own resumable state (`resume.py`), elastic over a changed
number of ranks.

Records in: a dataset folder and a `LoaderConfig`. Out: batch dicts (docs/CONTRACTS.md).
May import: loader's top-level modules, `store`, `order`; packtool's `dataset`, `pack`
(limits), `errors`.

Modules:
- `dataset.py`: `PackedDataset`.
- `dataloader.py`: `PackedDataLoader`, `make_dataloader`.
- `transport.py`: compact batches in a shared-memory ring.
- `workers.py`: the hand-off of a dataset to its loader's workers (ring, stale state).
- `resume.py`: the resume state: its format, its checks.
"""
