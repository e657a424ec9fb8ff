"""Engines: one partition worker, several drivers, the same bytes from each.

A run is planned into partitions of input bytes (`plan.py`), checked before any work
(`preflight.py`), run by partition workers (`worker.py`: read -> tokenize -> pack -> shards
-> completion record) on this machine's cores (`local.py`), a Ray cluster (`ray.py`) or Slurm
job arrays (`slurm/`), and
finished by the tail tree and `index.json`, written last (`merge.py`, `finish.py`). Completion
records (`records.py`) make `--resume` redo only unfinished partitions.

Records in: a `RunConfig` (`config.py`). Out: a dataset folder and a `RunSummary` (or a
Megatron `.bin`/`.idx` pair and a `TokenizeSummary`).
May import: every stage below it.

Modules:
- `config.py`, `context.py`, `plan.py`, `preflight.py`, `differences.py`: what a run is asked,
  is handed, reads, and checks first (and, for a refused `--resume`, which settings differ).
- `output_folder.py`: the run's output locked, its staging folder prepared, swapped in whole.
- `worker.py`, `merge.py`, `records.py`: the partition worker, the tail tree, the run's state.
- `base.py`, `local.py`, `ray.py`, `interrupts.py`: what the drivers share (the run, and
  `pack_with`, the sequence every engine's pack goes through); the local and Ray drivers;
  Ctrl-C held over a step that starts something and records it.
- `drivers.py`: the engines by name (`--engine`), each one's `Driver` after its own checks.
- `slurm/`: the Slurm driver, its calls to Slurm's commands, one array task.
- `finish.py`, `summary.py`: the end of a run; what it reports.
- `megatron/`: `packtool tokenize --to megatron` on the same plan, drivers and records: each
  partition a part `.bin` (the worker), joined in plan order as they finish (the driver), the
  `.idx` last, beside it the hidden record a `--resume` of the finished pair checks.
"""
