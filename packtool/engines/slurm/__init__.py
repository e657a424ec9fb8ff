"""The Slurm engine: the partitions of a run as Slurm job arrays, the local engine's bytes.

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

Two ways to hand out the partitions: fixed shares of `--tasks-per-job` partitions per array task
(`arrays.py`), or pull mode (`--slurm-workers N`, `pilots.py`): N long-lived tasks claiming the
next partition until none is left, each task's start paid once.

Modules:
- `config.py`: `SlurmConfig`, the names of the engine's files in the run state.
- `driver.py`: `run_pack_slurm`, `slurm_options`, `drive_slurm` (the entry points).
- `arrays.py`: `ArrayDriver`, the submit / wait / resubmit loop of fixed shares.
- `pilots.py`: `PilotDriver`, pull mode's workers, claims and their release.
- `state.py`: where a run's Slurm files and logs go, its recorded jobs (cancelled and waited
  out before `--overwrite` discards the run).
- `commands.py`: sbatch, squeue, scancel, scontrol.
- `task.py`: one array task, or one pull-mode worker.
"""
