"""The Slurm engine: the partitions of a `pack` run as Slurm job arrays, the local engine's bytes.

The driver (`driver.py`, `run_pack_slurm`) plans the run as the other engines do
(packtool/engines/base.py), checks before any work that Slurm takes the run's options and that
the nodes see its folder (a probe job), submits the partitions without a record as job arrays,
waits (resubmitting what a task that left the queue did not record), then runs the tail tree
and the root itself and writes `index.json`. Each array task (`task.py`, `python -m
packtool.engines.slurm.task`) runs `worker.run_partition` for its partitions with the run's
pickled context. `commands.py` is every call to Slurm's commands (sbatch, squeue, scancel,
scontrol), their output parsed and a refusal turned into one line.

Records in: a `RunConfig` and a `SlurmConfig`. Out: the dataset folder, a `PackSummary` (or
`errors.Detached` with `--no-wait`); on the shared file system, the run's state, task
descriptors and completion records in the staging folder, task logs beside the output.
May import: the rest of `engines` and every stage below it.

Modules:
- `driver.py`: `SlurmConfig`, `run_pack_slurm`, the submit / wait / resubmit loop.
- `commands.py`: sbatch, squeue, scancel, scontrol.
- `task.py`: one array task.
"""
