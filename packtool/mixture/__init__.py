"""Mixtures: named sources with weights and caps, and the exact schedule that mixes them.

`spec.py` reads the mixture file (`MixtureSpec`, `SourceSpec`); `schedule.py` decides which
source each next row comes from (largest deficit, within one row of every target at every
prefix), incrementally and resumably; `plan.py` is `packtool mix`, the schedule run over the
sources' lengths before training. The loader's `MixedDataset` runs the same schedule.

Records in: a mixture file or `MixtureSpec`, per-source row lengths. Out: `Chunk`s of
(source, epoch, position) per row, and a small JSON state.
May import: packtool's top-level modules, `storage`, `dataset`, `pack`.

Modules:
- `spec.py`: the mixture file and its checks.
- `deficit.py`: the numba kernel of the schedule's rule.
- `schedule.py`, `schedule_state.py`: the schedule; its state's format and checks.
- `plan.py`: `packtool mix`.
"""
