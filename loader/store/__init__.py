"""The shard store: packtool shards memory-mapped, row groups decoded, row counts on demand.

`ShardStore` opens a dataset (its `index.json` checked against the shards), keeps a row-group
index and a bounded cache of decoded row groups (`RowGroupData`: flat arrays, validated once),
decoded ahead in a background thread; `RowIndex` reads per-row token and document counts one
row group at a time, when the epoch order needs them.

Records in: a dataset folder. Out: flat numpy views of rows (`Documents` parts).
May import: loader's top-level modules; `packtool.dataset`, `packtool.errors`.

Modules:
- `shards.py`: `ShardStore`, the cache and the decode thread.
- `shard_files.py`: the shard files a process keeps open (at most `OPEN_FILES`).
- `row_group.py`: one decoded row group.
- `row_index.py`: per-row counts, a row group at a time.
"""
