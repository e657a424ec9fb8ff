"""What every `packtool pack` run does before its first chunk, whichever engine runs it.

1. `check_inputs`: decide the tokenizer and check it against tokenized inputs, and check that BOS +
   EOS leave room within `max_len`, before the output folder is touched, so a mistake leaves
   nothing behind.
2. `output_folder`: create or check the output folder (or load the state of the run to resume),
   and, when a fresh run fails before any chunk is recorded, remove what it wrote, so that the
   corrected command needs no `--overwrite`.
3. `fingerprint_of` / `check_fingerprint`: what a `--resume` must match (options, tokenizer, and
   the files `check_inputs` expanded the inputs to).

The local and the Ray engine both go through here; neither repeats these checks.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtool.corpus import expand_inputs
from packtool.errors import ConfigError, DataError, make_output_folder
from packtool.manifest import INDEX_FILE, ShardInfo
from packtool.pack import check_room_for_text
from packtool.pack_columns import check_policy
from packtool.pretokenized import split_pretokenized
from packtool.tokenize import check_recorded_tokenizer, input_columns, input_identity
from packtool.tokenizers import Tokenizer

if TYPE_CHECKING:  # local.py imports this module; the config class lives there
    from packtool.engines.local import RunConfig

STATE_FILE = ".pack-state.json"
RAY_STAGING_DIR = ".ray-chunks"
"""Hidden folder where the Ray engine's workers write each chunk's shards before renumbering."""


@dataclass(frozen=True)
class Checked:
    """The outcome of `check_inputs`: what the run encodes with and what the manifest records."""

    tokenizer: Tokenizer | None
    """Encodes raw inputs; None when tokenized inputs are packed with their recorded tokenizer."""
    identity: dict[str, Any]
    """The tokenizer identity `index.json` records."""
    tokenized: bool
    """The inputs are read as tokenized tables (`tokenized_batches`): tokenized Parquet,
    packtool's or pre-tokenized ids (nothing is encoded), or fine-tuning records (rendered and
    encoded by the reader, packtool/sft_encode.py)."""
    paths: list[Path]
    """Every file the inputs expand to (`corpus.expand_inputs`), in reading order."""
    columns: tuple[str, ...] = ()
    """The optional shard columns the inputs carry (`loss_mask`), which the dataset will have."""
    records: bool = False
    """Fine-tuning records (prompt/completion, chat): read as tables, but encoded by the reader."""


def check_inputs(config: RunConfig, tokenizer: Tokenizer | None) -> Checked:
    """Check the inputs, the tokenizer and `max_len` before anything is written.

    Args:
        config: the run.
        tokenizer: encodes raw corpora. For tokenized Parquet inputs it must match the recorded
            tokenizer; None accepts the recorded one (and means `byte` for raw corpora).

    Raises:
        DataError: a missing input, a tokenizer that differs from the recorded one, or inputs
            of which some carry a loss mask and others not.
        ConfigError: inputs of two kinds, a `max_len` that BOS + EOS fill, or `long_docs="split"`
            for inputs with a loss mask.
    """
    paths = expand_inputs(config.inputs)
    columns = input_columns(paths, config.read)  # e.g. loss_mask; mixed inputs fail here
    check_policy(columns, config.pack.long_docs)
    recorded = input_identity(paths)
    if tokenizer is None and recorded is None:
        from packtool.tokenizers import load_tokenizer

        tokenizer = load_tokenizer("byte")
    if tokenizer is not None and recorded is not None:
        check_recorded_tokenizer(recorded, tokenizer, config.inputs[0])
    identity = (tokenizer.identity if tokenizer is not None else recorded).to_dict()
    check_room_for_text(config.pack.max_len, identity["eos_id"], identity["bos_id"])
    pretokenized = bool(split_pretokenized(paths, config.read)[0])
    sft_records = "loss_mask" in columns and recorded is None and not pretokenized
    return Checked(
        tokenizer=tokenizer,
        identity=identity,
        tokenized=recorded is not None or pretokenized or sft_records,
        paths=paths,
        columns=columns,
        records=sft_records,
    )


@contextmanager
def output_folder(config: RunConfig) -> Iterator[dict[str, Any] | None]:
    """Prepare `config.out_dir`; yield the saved state when resuming, else None.

    When the body fails (an error, not an interrupt: Ctrl-C keeps the state for `--resume`) in a
    fresh run whose state file records no finished chunk, what the run wrote is removed: the
    state file, unrecorded shards and staging folders, and the folder itself if the run made it.
    """
    out = Path(config.out_dir)
    created = not out.exists()
    state = _prepare(config)
    try:
        yield state
    except Exception:
        if state is None:
            _discard_unstarted(out, created)
        raise


def fingerprint_of(config: RunConfig, checked: Checked) -> dict[str, Any]:
    """Everything that determines the output bytes; a resume must match it exactly."""
    # Every file the inputs expand to, with its size and modification time: a file added to an
    # input folder, or edited, between the interrupted run and the resume changes the documents.
    inputs = [[str(p), st.st_size, st.st_mtime_ns] for p in checked.paths for st in (p.stat(),)]
    fingerprint = {
        "inputs": inputs,
        "pack": asdict(config.pack),
        "shards": asdict(config.shards),
        "read": asdict(config.read),
        "tokenizer": checked.identity,
        "chunk_docs": config.chunk_docs,
    }
    # Compare in the form the state file stores it (tuples become lists).
    return json.loads(json.dumps(fingerprint))


def check_fingerprint(state: dict[str, Any], fingerprint: dict[str, Any], out: Path) -> None:
    """Refuse to resume when the options or inputs differ from the interrupted run's."""
    old = state.get("fingerprint", {})
    if old != fingerprint:
        changed = [k for k in fingerprint if old.get(k) != fingerprint[k]]
        raise ConfigError(f"cannot resume {out}: options or inputs differ ({', '.join(changed)})")


def _prepare(config: RunConfig) -> dict[str, Any] | None:
    """Create or check the output folder; return the saved state when resuming."""
    out = Path(config.out_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {out} exists and is not a folder")
    if config.resume:
        return _load_state(out)
    make_output_folder(out)
    present = list(out.iterdir())
    if present and not config.overwrite:
        raise ConfigError(
            f"output folder {out} is not empty; pass --overwrite to replace it "
            "or --resume to finish an interrupted run"
        )
    foreign = sorted(p.name for p in present if not _written_by_pack(p))
    if foreign:
        # --overwrite replaces a dataset; it never deletes files packtool did not write.
        shown = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ConfigError(
            f"--overwrite: {out} holds files packtool pack did not write ({shown}); "
            "choose an empty folder or remove them yourself"
        )
    _remove(present)
    return None


def _load_state(out: Path) -> dict[str, Any]:
    state_path = out / STATE_FILE
    if not state_path.exists():
        if (out / INDEX_FILE).exists():
            raise ConfigError(f"{out} is already complete ({INDEX_FILE} exists); nothing to resume")
        if not out.exists():
            raise ConfigError(f"{out} does not exist: nothing to resume; drop --resume")
        raise ConfigError(f"{out} has no {STATE_FILE}: nothing to resume; use --overwrite")
    try:
        state = json.loads(state_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DataError(f"{state_path}: unreadable ({exc}); use --overwrite") from None
    if not (
        isinstance(state, dict)
        and isinstance(state.get("fingerprint"), dict)
        and isinstance(state.get("chunks"), list)
        and all(isinstance(c, dict) and isinstance(c.get("shards"), list) for c in state["chunks"])
    ):
        raise DataError(f"{state_path}: malformed state; use --overwrite")
    try:
        for chunk in state["chunks"]:
            for shard in chunk["shards"]:
                ShardInfo(**shard)
    except TypeError as exc:
        raise DataError(f"{state_path}: malformed state ({exc}); use --overwrite") from None
    return state


def _written_by_pack(path: Path) -> bool:
    """Shards, the manifest, the state file, temporaries and the Ray engine's staging folder."""
    name = path.name
    return (
        (name.startswith("shard-") and name.endswith(".parquet"))
        or name in (INDEX_FILE, STATE_FILE, RAY_STAGING_DIR)
        or (name.startswith(".") and name.endswith(".tmp"))
    )


def _remove(paths: list[Path]) -> None:
    for p in paths:
        if p.is_dir():
            shutil.rmtree(p, ignore_errors=True)
        else:
            p.unlink(missing_ok=True)


def _discard_unstarted(out: Path, created: bool) -> None:
    state_path = out / STATE_FILE
    try:
        chunks = json.loads(state_path.read_text(encoding="utf-8")).get("chunks")
    except (OSError, ValueError, AttributeError):
        return
    if chunks != []:
        return
    # The folder was empty (or emptied by --overwrite) when this run began and no chunk was
    # recorded since, so every file packtool writes that is here now is this run's litter: a
    # shard written before the failure, a Ray worker's staged chunk, a temporary.
    _remove([p for p in out.iterdir() if _written_by_pack(p)])
    if created and not any(out.iterdir()):
        out.rmdir()
