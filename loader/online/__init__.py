"""Online packing: documents packed into rows as they arrive, for training and serving.

`OnlinePacker` packs a stream of tokenized documents into rows with the same kernels as
`packtool pack` (a buffer of segments, greedy or bucketed); `StreamingPackedDataset` feeds it
from tokenized Parquet, exactly once over ranks x workers and resumable (`state.py`);
`RequestBatcher` groups requests arriving over time into packed varlen batches for serving.

Records in: tokenized documents (arrays, or tokenized Parquet). Out: `PackedRows` and batch
dicts.
May import: loader's top-level modules, `store`, `order`, `packed`; packtool's `dataset`,
`pack`, `storage`, `errors`.

Modules:
- `inputs.py`, `packer.py`, `bucketed.py`, `segments.py`, `rows.py`: the documents it is given
  (checked one by one), the packer, its strategies, its buffer, its rows.
- `state.py`: checkpoints of the packer.
- `streaming.py`: `StreamingPackedDataset`.
- `serving.py`: `RequestBatcher`.
"""
