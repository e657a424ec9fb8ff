"""packtool data in the Hugging Face stack: a model check, a `datasets` view, a row collator.

Imported only when used (`import loader` does not import it, nor transformers, datasets or TRL);
the Trainer pieces (`PackedTrainer`, `PackedTrainerMixin`, `CheckPackedModel`) live in
loader/hf/trainer.py and are imported on first use. See docs/integrations.md.

- `check_packed_model(model, batch)`: refuses, in one line that names the fix, a model or
  configuration under which a packed batch's documents would attend to each other.
- `hf_dataset(path)`: the shards as a `datasets.Dataset` whose rows carry TRL's per-row
  document lengths (`seq_lengths`, stored by `pack` since it was declared, computed for older
  datasets) and, with a loss mask, TRL's `labels`, so `trl.SFTTrainer(padding_free=True)` takes
  them as packed and trains on the supervised tokens only.
- `RowCollator`: rows of `hf_dataset` -> one `layout="hf"` batch (for a plain `Trainer`).

Modules: `datasets.py` (the view, the collator, the model check; torch and numpy only until a
function needs `datasets`), `trainer.py` (transformers' `Trainer` on a `PackedDataset` or a
`MixedDataset`), `resume.py` (the loader position each checkpoint holds, and the checks and
arithmetic of a resume). May import `loader`'s packed/ and top-level modules (mixture/ only where a
`MixedDataset` is given), `packtool.dataset` and `packtool.errors`.
"""

from __future__ import annotations

from typing import Any

from loader.hf.datasets import (
    LABELS,
    MASK_FROM_POSITIONS,
    RowCollator,
    check_packed_model,
    hf_dataset,
    labels_table,
    seq_lengths_table,
)
from packtool.errors import MissingDependencyError

__all__ = [
    "LABELS",
    "MASK_FROM_POSITIONS",
    "RowCollator",
    "check_packed_model",
    "hf_dataset",
    "labels_table",
    "seq_lengths_table",
]

_TRAINER_NAMES = ("PackedTrainer", "PackedTrainerMixin", "CheckPackedModel", "TrainerLoader")


def __getattr__(name: str) -> Any:
    # The Trainer pieces subclass transformers' classes: import them on first use only.
    if name in _TRAINER_NAMES:
        try:
            import loader.hf.trainer as hf_trainer
        except ImportError as exc:
            if exc.name not in ("transformers", "accelerate"):
                raise
            raise MissingDependencyError(
                f"loader.hf.{name} needs transformers and accelerate; install them with "
                "`pip install packtool[hf]`"
            ) from None
        return getattr(hf_trainer, name)
    raise AttributeError(f"module 'loader.hf' has no attribute {name!r}")
