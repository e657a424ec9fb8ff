"""The dataset: the on-disk contract every stage writes and the loader reads.

A packed dataset is a folder of Parquet shards (one row = one packed sequence, with per-row
document offsets) plus `index.json`, written last; tokenized Parquet is the same idea one row
per document. This folder holds both formats and the writers that keep them whole.

Records: pyarrow tables of the declared columns in, shard files and manifests out.
May import: packtool's top-level modules and `storage`. Imported by every stage above and by
the loader (which sees only this side of packtool).

Modules:
- `columns.py`: the packed-shard columns, declared once (schema, levels, derived columns).
- `identity.py`: the tokenizer identity a dataset records; the token dtype.
- `manifest.py`, `manifest_check.py`: `index.json`, read and written, and checked as a whole.
- `groups.py`: a `--group-by` dataset's groups, in `index.json` or past 1,000 in `groups.json`.
- `shards.py`, `stitch.py`: writing shards atomically (two threads joined into one file).
- `tokenized.py`, `tokenized_table.py`, `tokenized_writer.py`: the tokenized-Parquet format,
  its table builder and its background writer.
- `masks.py`: loss-mask arithmetic on flat arrays.
- `megatron.py`: Megatron's indexed dataset (`.bin` / `.idx`), streamed as megatron-core writes it.
- `output.py`: the output transaction (lock, staging, recovery, the switch to the new dataset);
  `output_apart.py`: an output kept apart from the inputs (never one, inside one, or holding one);
  `hub_record.py`: beside a Hub output's staging, what the run replaces and what it commits.
"""
