"""What every `packtool pack` run does before its first chunk, whichever engine runs it.

1. `check_inputs`: refuse an output inside an input folder (or an input inside the output),
   decide the tokenizer and check it against tokenized inputs, and check that BOS + EOS leave
   room within `max_len`, before the output folder is touched, so a mistake leaves nothing
   behind.
2. `output_folder`: lock the output (one writer), check it, and build the new dataset in a
   staging folder beside it (or load the state of the run to resume there); swap it in only when
   complete, so a failure never harms the old dataset, and remove the staging folder of a fresh
   run that fails, so that the corrected command needs no `--overwrite` (`packtool/output.py`).
3. `fingerprint_of` / `check_fingerprint`: what a `--resume` must match (options, tokenizer, and
   the files `check_inputs` expanded the inputs to).

The local and the Ray engine both go through here; neither repeats these checks.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from packtool import docids
from packtool.columns import written
from packtool.corpus import expand_inputs
from packtool.errors import ConfigError, DataError, PacktoolError
from packtool.manifest import INDEX_FILE, ShardInfo
from packtool.output import (
    OutputLock,
    OutputPaths,
    check_apart,
    commit,
    create_parent,
    output_paths,
    recover,
    remove,
    remove_empty_parents,
)
from packtool.pack import check_room_for_text
from packtool.pack_columns import check_policy
from packtool.pretokenized import split_pretokenized
from packtool.tokenize import check_recorded_tokenizer, input_columns, input_identity
from packtool.tokenizers import Tokenizer

if TYPE_CHECKING:  # local.py imports this module; the config class lives there
    from packtool.engines.local import RunConfig

STATE_FILE = ".pack-state.json"
RAY_STAGING_DIR = ".ray-chunks"
"""Hidden folder (in the run's staging folder) where the Ray engine's workers write each chunk's
shards before renumbering."""


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
        ConfigError: inputs of two kinds, a `max_len` that BOS + EOS fill, `long_docs="split"`
            for inputs with a loss mask, or an output inside an input folder (or an input
            inside the output).
    """
    check_apart(config.out_dir, config.inputs)  # before anything is read
    paths = expand_inputs(config.inputs)
    check_apart(config.out_dir, config.inputs, paths)
    columns = input_columns(paths, config.read)  # e.g. loss_mask; mixed inputs fail here
    check_policy(columns, config.pack.long_docs)
    recorded = input_identity(paths)
    if tokenizer is None and recorded is None:
        from packtool.tokenizers import load_tokenizer

        tokenizer = load_tokenizer("byte")
    if tokenizer is not None and recorded is not None:
        check_recorded_tokenizer(recorded, tokenizer, config.inputs[0])
    identity = (tokenizer.identity if tokenizer is not None else recorded).to_dict()
    if recorded is not None:  # the ids were encoded when tokenizing: record that engine
        identity["engine"] = recorded.engine
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


@dataclass(frozen=True)
class Output:
    """What `output_folder` yields: where the run writes, and the run it resumes."""

    work: Path
    """The staging folder beside the output: every file of this run goes here, and it becomes
    the output when the run completes (`packtool.output.commit`)."""
    state: dict[str, Any] | None
    """The saved state of the interrupted run to resume, or None for a fresh run."""


@contextmanager
def output_folder(config: RunConfig) -> Iterator[Output]:
    """Lock `config.out_dir`, prepare its staging folder, and swap it in when the body succeeds.

    The old output is untouched until the new one is complete (`index.json` written): then one
    `packtool.output.commit` replaces it. When the body fails, the staging folder of a fresh run
    is removed on a `PacktoolError` (a mistake: the corrected command is another run, which could
    not resume this one) and on any other error before a chunk was recorded; it is kept, for
    `--resume`, on Ctrl-C, on other errors after a finished chunk (a full disk, a lost worker),
    and always in a resumed run. Parent folders this run created are removed when empty.
    """
    paths = output_paths(config.out_dir)
    made = create_parent(paths)
    try:
        with OutputLock(paths, config.command or "packtool pack"):
            recover(paths)
            if (paths.staging / INDEX_FILE).is_file():
                # A run killed after writing index.json (written last) but before its swap:
                # complete, so it is swapped in now, as it would have been.
                (paths.staging / STATE_FILE).unlink(missing_ok=True)
                commit(paths)
            state = _prepare(config, paths)
            try:
                yield Output(work=paths.staging, state=state)
            except BaseException as exc:
                if _discard(exc, state, paths.staging):
                    remove(paths.staging)
                raise
            commit(paths)
    except BaseException:
        remove_empty_parents(paths, made)
        raise


def staging_folder(out_dir: str | os.PathLike) -> Path:
    """Where a run into `out_dir` builds its output (and keeps an interrupted run's state)."""
    return output_paths(out_dir).staging


def doc_id_record(checked: Checked) -> dict[str, Any]:
    """How the run numbers documents, for `index.json` (`extra.doc_ids`).

    Tokenized inputs: `packtool.docids` (input file index, row in the file), with the files, so
    a packed doc id leads back to its tokenized row. Raw inputs: 0, 1, 2, ... in reading order.
    """
    if checked.tokenized:
        return docids.record([str(p) for p in checked.paths])
    return {"scheme": "sequential"}


def fingerprint_of(config: RunConfig, checked: Checked) -> dict[str, Any]:
    """Everything that determines the output bytes; a resume must match it exactly."""
    # Every file the inputs expand to, with its size and modification time: a file added to an
    # input folder, or edited, between the interrupted run and the resume changes the documents.
    inputs = [[str(p), st.st_size, st.st_mtime_ns] for p in checked.paths for st in (p.stat(),)]
    read = asdict(config.read)
    read["sft"].pop("render_processes")  # where templates render never changes a byte
    fingerprint = {
        "inputs": inputs,
        "pack": asdict(config.pack),
        "shards": asdict(config.shards),
        "read": read,
        # Not the engine: every engine gives the same ids, so a resume may use another one.
        "tokenizer": {k: v for k, v in checked.identity.items() if k != "engine"},
        "chunk_docs": config.chunk_docs,
        # The shards' columns: a state from a packtool that wrote other columns (e.g. before
        # seq_lengths was declared) cannot be finished with shards of a different schema.
        "columns": list(written(checked.columns)),
    }
    # Compare in the form the state file stores it (tuples become lists).
    return json.loads(json.dumps(fingerprint))


def check_fingerprint(state: dict[str, Any], fingerprint: dict[str, Any], out: Path) -> None:
    """Refuse to resume when the options or inputs differ from the interrupted run's."""
    old = state.get("fingerprint", {})
    if old != fingerprint:
        changed = [k for k in fingerprint if old.get(k) != fingerprint[k]]
        raise ConfigError(f"cannot resume {out}: options or inputs differ ({', '.join(changed)})")


def _prepare(config: RunConfig, paths: OutputPaths) -> dict[str, Any] | None:
    """Check the output and its staging folder; return the saved state when resuming.

    Nothing is removed from the output itself: `--overwrite` only allows `commit` to replace it.
    """
    out, shown = paths.target, paths.shown
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output {shown} exists and is not a folder")
    if out.is_dir() and os.path.ismount(out):
        raise ConfigError(
            f"output {shown} is a mount point, which packtool cannot swap a new dataset into; "
            "write to a folder inside it"
        )
    if config.resume:
        return _load_state(paths)
    if paths.staging.exists():
        if not config.overwrite:
            raise ConfigError(
                f"an interrupted run into {shown} left its finished chunks in {paths.staging}; "
                "pass --resume to finish it or --overwrite to start over"
            )
        remove(paths.staging)
    present = list(out.iterdir()) if out.is_dir() else []
    if present and not config.overwrite:
        raise ConfigError(
            f"output folder {shown} is not empty; pass --overwrite to replace it "
            "or --resume to finish an interrupted run"
        )
    foreign = sorted(p.name for p in present if not _written_by_pack(p))
    if foreign:
        # --overwrite replaces a dataset; it never deletes files packtool did not write.
        shown_files = ", ".join(foreign[:3]) + (
            f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        )
        raise ConfigError(
            f"--overwrite: {shown} holds files packtool pack did not write ({shown_files}); "
            "choose an empty folder or remove them yourself"
        )
    paths.staging.mkdir()
    return None


def _load_state(paths: OutputPaths) -> dict[str, Any]:
    out, shown = paths.target, paths.shown
    state_path = paths.staging / STATE_FILE
    if not state_path.exists():
        if (out / INDEX_FILE).exists():
            raise ConfigError(
                f"{shown} is already complete ({INDEX_FILE} exists); nothing to resume"
            )
        if (out / STATE_FILE).exists():
            raise ConfigError(
                f"{shown} holds a run interrupted by an older packtool, which keeps its state "
                "elsewhere; start over with --overwrite"
            )
        if not out.exists() and not paths.staging.exists():
            raise ConfigError(f"{shown} does not exist: nothing to resume; drop --resume")
        raise ConfigError(f"{shown}: no interrupted run to resume; use --overwrite")
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


def _discard(exc: BaseException, state: dict[str, Any] | None, staging: Path) -> bool:
    """Whether a failed run's staging folder goes (see `output_folder`)."""
    if not isinstance(exc, Exception) or state is not None:
        return False  # Ctrl-C / SystemExit, or a resumed run: keep the work for --resume
    if isinstance(exc, PacktoolError):
        return True
    try:
        saved = json.loads((staging / STATE_FILE).read_text(encoding="utf-8"))
        return not saved.get("chunks")
    except (OSError, ValueError, AttributeError):
        return True
