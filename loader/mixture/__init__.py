"""Mixtures in training: `MixedDataset`, batches from several sources in exact proportions.

Each source is a packed dataset or a stream of tokenized Parquet (`sources.py`); the schedule of
packtool/mixture/ picks the source of every next row; `steps.py` cuts the mixed row stream into
global steps as `PackedDataset` cuts one epoch; DataLoader workers each gather the rows they
own (`worker.py`) and `MixedDataLoader` splices them back (`dataloader.py`). Resumable, also
onto a changed mixture.

Records in: a mixture file or `MixtureSpec`, a `LoaderConfig`. Out: batch dicts with `source`.
May import: loader's top-level modules, `store`, `order`, `packed`, `online`; packtool's
`dataset`, `pack`, `mixture`, `errors`.

Modules:
- `dataset.py`: `MixedDataset`; `dataloader.py`: `MixedDataLoader`.
- `batch.py`: a batch's sources (`HFMixedBatch`, `batch_sources`, `token_sources`).
- `sources.py`: a source's rows in epoch order.
- `steps.py`: the row stream and its steps (and `MixtureView`, what they see of the dataset).
- `worker.py`: a worker's part of each step.
"""
