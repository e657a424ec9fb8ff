"""`packtool tokenize --to megatron`: a Megatron indexed dataset (`PREFIX.bin` / `PREFIX.idx`)
made on the partition engines, byte for byte megatron-core's `IndexedDatasetBuilder`.

The run is planned, checked and driven as `packtool pack` is (packtool/engines/base.py, the
local, Ray and Slurm drivers), with `--resume` from the same completion records; only what a
partition writes and how the run ends differ.

Records in: a `RunConfig` and a tokenizer. Out: the `.bin` / `.idx` pair, its hidden run record
beside it, and a `TokenizeSummary`.
May import: the rest of `engines` and every stage below it.

Modules:
- `run.py`: `tokenize_megatron` and `MegatronRun`, the driver's side: plan, merge as parts
  arrive, the `.idx` last, then the swap.
- `part.py`: one partition, in the worker: read -> tokenize -> a part `.bin` + its lengths.
- `merge.py`: parts appended in plan order while the run goes on; resumed after a kill at any
  of its steps.
- `record.py`: the record beside a finished pair that a `--resume` of it checks.
- `swap.py`: the finished pair put in place; a swap cut short finished, or dropped when stale.
"""
