"""What every `packtool pack` run does before its first chunk, whichever engine runs it.

1. `check_inputs`: refuse an output inside an input folder (or an input inside the output),
   decide the tokenizer and check it against tokenized inputs, and check that BOS + EOS leave
   room within `max_len`, before the output folder is touched, so a mistake leaves nothing
   behind. What it reads of the inputs (`InputFacts`: Parquet footers, first records) is saved
   with the plan; `--resume` takes it from there when no input's size or modification time
   changed, so it opens no input that only finished partitions read.
2. `output_folder`: lock the output (one writer), check it, and build the new dataset in a
   staging folder beside it (or load the state of the run to resume there); swap it in only when
   complete, so a failure never harms the old dataset, and remove the staging folder of a fresh
   run that fails, so that the corrected command needs no `--overwrite` (`packtool/dataset/output.py`).
3. `fingerprint_of`: what a `--resume` must match (options, tokenizer, and the files
   `check_inputs` expanded the inputs to, with their sizes and modification times); the checks
   are packtool/engines/resume_checks.py. The run's state itself (plan, partition records) is
   packtool/engines/records.py: it stays in the staging folder until the switch.

The local and the Ray engine both go through here; neither repeats these checks.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packtool.dataset import hub_record
from packtool.dataset.columns import LOSS_MASK, written
from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.manifest import INDEX_FILE
from packtool.dataset.output import (
    OutputPaths,
    make_staging,
    output_paths,
    remove,
    remove_staging,
    staging_version,
    transaction,
)
from packtool.dataset.output_apart import check_apart
from packtool.engines import records
from packtool.engines.config import RunConfig
from packtool.engines.output_checks import OLD_STATE, check_replaceable, finish_switch
from packtool.engines.resume_checks import CHAT_TEMPLATE_KEY, MASK_RULE, MASK_RULE_KEY
from packtool.engines.resume_checks import check_complete as check_complete
from packtool.engines.resume_checks import check_fingerprint as check_fingerprint
from packtool.engines.resume_checks import fingerprint_digest as fingerprint_digest
from packtool.errors import AlreadyComplete, ConfigError, Detached, PacktoolError, WorkersLost
from packtool.pack.chunk import check_room_for_text
from packtool.pack.columns import check_policy
from packtool.prefetch import map_ordered
from packtool.read.corpus import expand_inputs
from packtool.read.formats import file_kind
from packtool.read.jsonl import json_array_file
from packtool.read.sft_config import CHAT_KINDS
from packtool.sft.encode import template_record
from packtool.storage import hub
from packtool.storage import local as storage
from packtool.tokenize.tables import PRETOKENIZED, RAW, RECORDS
from packtool.tokenize.tokenize import check_recorded_tokenizer, inputs_read, unchanged_ids
from packtool.tokenizer.tokenizers import Tokenizer

STATE_DIR = records.RUN_DIR
"""The run's state in its staging folder (packtool/engines/records.py)."""
UNITS = {"jsonl": "byte", "json_array": "item", "text": "file"}
"""The document-id offset unit per file kind (packtool/read/docids.py); Parquet kinds count rows.
Fine-tuning records take their file type's (`doc_id_units`)."""


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
    encoded by the reader, packtool/sft/encode.py)."""
    paths: list[Path]
    """Every file the inputs expand to (`corpus.expand_inputs`), in reading order."""
    columns: tuple[str, ...] = ()
    """The optional shard columns the inputs carry (`loss_mask`), which the dataset will have."""
    mode: str = RAW
    """`raw`, `tokenized` (packtool tokenize output), `pretokenized` (ids made elsewhere) or
    `records` (fine-tuning records: rendered, encoded and masked by the reader, packtool/sft/encode.py)."""
    mask_source: str | None = None
    """Pre-tokenized inputs: their `labels` or `loss_mask` column (None: no mask)."""
    records: bool = False
    """Fine-tuning records (prompt/completion, chat): read as tables, but encoded by the reader."""
    sft_kind: str | None = None
    """The records' kind (`sft_inputs.sft_kind`), for `records` mode."""

    facts: InputFacts | None = None
    """What was read of the inputs (or taken from the interrupted run's state on `--resume`)."""

    def kinds(self) -> list[str]:
        """How each input file is read (`plan.KINDS`), in reading order."""
        if self.facts is not None:
            return list(self.facts.kinds)
        return _file_kinds(self.paths, self.mode)


def check_inputs(
    config: RunConfig,
    tokenizer: Tokenizer | str | None,
    expanded: Callable[[list[Path]], None] | None = None,
    *,
    ends_added: bool = False,
) -> Checked:
    """Check the inputs, the tokenizer and `max_len` before anything is written.

    Args:
        config: the run.
        tokenizer: encodes raw corpora: a `Tokenizer`, or a `load_tokenizer` spec (`byte`, a
            path, `org/model`) loaded here as `tokenize_corpus` loads one. For tokenized Parquet
            inputs it must match the recorded tokenizer; None accepts the recorded one (and means
            `byte` for raw corpora).
        expanded: called with the input files as soon as they are known, before any is read
            (the local engine starts its worker processes' server then).
        ends_added: pre-tokenized ids get the tokenizer's EOS (`tokenize --to megatron`), and
            nothing else: the identity records no BOS and an explicit `--bos-id` is refused;
            otherwise they are used unchanged, so the identity records no EOS or BOS and an
            explicit `--eos-id` / `--bos-id` is refused (it would add nothing).

    Raises:
        DataError: a missing input, a tokenizer that differs from the recorded one, or inputs
            of which some carry a loss mask and others not.
        ConfigError: inputs of two kinds, a `max_len` that BOS + EOS fill, `long_docs="split"`
            for inputs with a loss mask, an output inside an input folder (or an input inside
            the output), or a `tokenizer` that is neither a `Tokenizer` nor a spec string.
    """
    if tokenizer is not None and not isinstance(tokenizer, (Tokenizer, str)):
        raise ConfigError(
            "tokenizer must be a Tokenizer or a tokenizer spec string (see load_tokenizer), got "
            f"{type(tokenizer).__name__}"
        )
    check_apart(config.out_dir, config.inputs)  # before anything is read
    paths = expand_inputs(config.inputs)
    check_apart(config.out_dir, config.inputs, paths)
    if expanded is not None:
        expanded(paths)
    seen = _saved_facts(config, paths) if config.resume else None
    facts = seen if seen is not None else _read_facts(config, paths)
    check_policy(facts.columns, config.pack.long_docs)
    recorded = None if facts.recorded is None else TokenizerIdentity.from_dict(facts.recorded)
    if isinstance(tokenizer, str) or (tokenizer is None and recorded is None):
        from packtool.tokenizer.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(tokenizer or "byte")
    if tokenizer is not None and recorded is not None:
        check_recorded_tokenizer(recorded, tokenizer, config.inputs[0])
    identity = (tokenizer.identity if tokenizer is not None else recorded).to_dict()
    if recorded is not None:  # the ids were encoded when tokenizing: record that engine
        identity["engine"] = recorded.engine
    if facts.mode == PRETOKENIZED:  # ids made elsewhere, used unchanged (but an added EOS)
        unchanged = unchanged_ids(TokenizerIdentity.from_dict(identity), tokenizer, ends_added)
        identity = unchanged.to_dict()
    check_room_for_text(config.pack.max_len, identity["eos_id"], identity["bos_id"])
    return Checked(
        tokenizer=tokenizer,
        identity=identity,
        tokenized=facts.mode != RAW,
        paths=paths,
        columns=facts.columns,
        mode=facts.mode,
        mask_source=facts.mask_source,
        records=facts.mode == RECORDS,
        sft_kind=facts.sft_kind,
        facts=facts,
    )


@dataclass(frozen=True)
class InputFacts:
    """What `check_inputs` learns by reading the inputs (Parquet footers, first records).

    A fresh run saves it with its plan (`facts_key`); `--resume` takes it from there once the
    inputs' sizes and modification times match the saved ones, so a resume reads no byte of an
    input that only finished partitions read, whatever the number of files.
    """

    columns: tuple[str, ...]
    recorded: dict[str, Any] | None
    """The tokenizer identity recorded in tokenized inputs (None: they are not tokenized)."""
    mode: str
    mask_source: str | None
    sft_kind: str | None
    kinds: tuple[str, ...]
    """How each input file is read (`plan.KINDS`), in reading order."""
    special_names: dict[str, str] | None = None
    """Tokenized inputs: where their EOS / BOS came from (`InputsRead.special_names`)."""
    chat_template: dict[str, Any] | None = None
    """Tokenized inputs: the template their conversations were rendered with
    (`InputsRead.chat_template`)."""

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self)))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> InputFacts:
        return cls(
            columns=tuple(d["columns"]),
            recorded=d["recorded"],
            mode=d["mode"],
            mask_source=d["mask_source"],
            sft_kind=d["sft_kind"],
            kinds=tuple(d["kinds"]),
            special_names=d.get("special_names"),  # absent from runs saved before it
            chat_template=d.get("chat_template"),
        )


FACTS_KEY = "inputs_read"
"""Where the run state (`records.write_plan`) keeps the `InputFacts` of the run."""


def _read_facts(config: RunConfig, paths: list[Path]) -> InputFacts:
    """Read what the run needs to know of its inputs (every Parquet footer, first records).

    Each pass over the files (`tokenize.inputs_read`: the footers once for pre-tokenized ids,
    once for packtool metadata, a first record or footer once for the records' kind) reads
    `prefetch.io_threads()` files at a time and takes their answers in input order, so the
    outcome, and the file an error names, are those of reading them one after another.
    """
    read = inputs_read(paths, config.read)  # e.g. loss_mask; mixed inputs fail here
    check_policy(read.columns, config.pack.long_docs)
    recorded = read.identity()
    return InputFacts(
        columns=read.columns,
        recorded=None if recorded is None else recorded.to_dict(),
        mode=read.mode,
        mask_source=read.mask_source,
        sft_kind=read.sft_kind,
        kinds=tuple(_file_kinds(paths, read.mode)),
        special_names=read.special_names() or None,
        chat_template=read.chat_template(),
    )


def _saved_facts(config: RunConfig, paths: list[Path]) -> InputFacts | None:
    """The interrupted run's `InputFacts` when its inputs are these, unchanged; else None.

    Reads only the saved state (`records.read_plan`, no lock yet: `Run` compares the state it
    resumes, read under the lock, with what was taken from here) and stats the inputs. None
    sends the caller to read the inputs; a changed input is then refused by `check_fingerprint`
    naming the file, a missing or damaged state by `output_folder`.
    """
    try:
        state = records.read_plan(staging_folder(config.out_dir))
        saved = state["fingerprint"]["inputs"]
        current = [[str(p), st.st_size, st.st_mtime_ns] for p, st in _stats(paths)]
        if saved != current:
            return None
        return InputFacts.from_dict(state[FACTS_KEY])
    except (PacktoolError, OSError, KeyError, TypeError, ValueError):
        return None


def _file_kinds(paths: list[Path], mode: str) -> list[str]:
    if mode != RAW:
        return [mode] * len(paths)
    return list(map_ordered(raw_kind, paths))


def doc_id_units(paths: list[Path], kinds: list[str]) -> list[str]:
    """Each input's document-id offset unit (`UNITS`). A file of fine-tuning records numbers
    them as a corpus file of its type does (the byte of a JSON line, an array's item, a Parquet
    row: packtool/sft/inputs.py), so its type is read (the first bytes of a JSON file)."""
    records = [p for p, k in zip(paths, kinds, strict=True) if k == RECORDS]
    types = dict(zip(records, map_ordered(raw_kind, records), strict=True))
    return [UNITS.get(types.get(p, k), "row") for p, k in zip(paths, kinds, strict=True)]


def raw_kind(path: Path) -> str:
    """How a corpus file reads: `file_kind`, with a JSON array told from JSON Lines (`UNITS`)."""
    kind = file_kind(path)
    if kind == "jsonl" and json_array_file(path):  # reads the file's first bytes
        kind = "json_array"
    return kind


def _stats(paths: list[Path]) -> zip[tuple[Path, os.stat_result]]:
    return zip(paths, storage.stat_all(paths), strict=True)


@dataclass(frozen=True)
class Output:
    """What `output_folder` yields: where the run writes, and the run it resumes."""

    work: Path
    """The staging folder beside the output: every file of this run goes here, and it becomes
    the output when the run completes (`packtool.dataset.output.commit`)."""
    state: dict[str, Any] | None
    """The saved plan and fingerprint of the interrupted run to resume (`records.read_plan`),
    or None for a fresh run."""
    fingerprint: dict[str, Any] | None = None
    """The run's fingerprint (`fingerprint_of`), as `output_folder` checked a resume with it."""


@contextmanager
def output_folder(config: RunConfig, fingerprint: dict[str, Any]) -> Iterator[Output]:
    """Lock `config.out_dir`, prepare its staging folder, and swap it in when the body succeeds.
    `fingerprint`: the run's (`fingerprint_of`), which a resumed run's must match.

    The old output is untouched until the new one is complete (`index.json` written): then one
    `packtool.dataset.output.commit` replaces it. When the body fails, the staging folder of a fresh run
    is removed on a `PacktoolError` (a mistake: the corrected command is another run, which could
    not resume this one) and on any other error before a partition was recorded; it is kept, for
    `--resume`, on Ctrl-C, on other errors after a finished partition (a full disk, a lost
    worker), and always in a resumed run. Parent folders this run created are removed when
    empty.
    """

    def prepare(paths: OutputPaths) -> dict[str, Any] | None:
        if paths.whole_object:
            raise ConfigError(
                f"{paths.shown}: a packed dataset is a folder (a prefix in a bucket), not one "
                ".parquet object; drop the .parquet"
            )
        if paths.hub and storage.is_file(paths.staging / INDEX_FILE):
            landed = hub_record.landed(paths.staging, paths.target)  # its answer was lost
            if landed is not None:
                remove_staging(paths)  # the build and its record: committed
                if config.resume:
                    raise AlreadyComplete(
                        f"{paths.shown}: the earlier run's commit reached the Hub after all "
                        f"({landed}): nothing to resume, nothing done",
                        paths.shown,
                    )
        if paths.hub and storage.is_file(paths.staging / INDEX_FILE) and not config.resume:
            # A Hub commit refused (or a run killed just before it): published only when asked.
            if not config.overwrite:
                raise ConfigError(
                    f"{paths.shown}: a dataset an earlier run built waits in {paths.staging} "
                    "(its commit to the Hub did not happen); pass --resume to commit it or "
                    "--overwrite to start over"
                )
            remove(paths.staging)
        if storage.is_file(paths.staging / INDEX_FILE):
            # A run killed after writing index.json (written last) but before its swap.
            paths = finish_switch(config, paths, fingerprint)
            if config.resume:  # it said "already complete ... nothing done" for a commit it made
                raise AlreadyComplete(
                    f"{paths.shown}: committed the dataset the interrupted run had built (its "
                    f"{INDEX_FILE} was written before the switch): nothing else to resume",
                    paths.shown,
                )
        return _prepare(config, paths)

    def discard(exc: BaseException, state: dict[str, Any] | None) -> bool:
        return discard_staging(exc, state, output_paths(config.out_dir).staging)

    command = config.command or "packtool pack"
    with transaction(config.out_dir, command, prepare, discard) as (paths, state):
        # The run's state stays in the staging until `commit` (`output_versions.RUN_STATE`).
        yield Output(work=paths.staging, state=state, fingerprint=fingerprint)


def built_here(out_dir: str | os.PathLike, engine: str) -> None:
    """Refuse an `hf://` output to an engine whose workers run on other machines: it is built
    in this machine's scratch folder and committed to the Hub once (packtool/storage/hub.py)."""
    if hub.is_hub(out_dir):
        raise ConfigError(
            f"{out_dir}: an hf:// output is built on this machine and committed to the Hub in "
            f"one commit, and --engine {engine} builds on other machines; use --engine local, "
            "or pack to a bucket or a shared folder and upload that"
        )


def staging_folder(out_dir: str | os.PathLike) -> Path:
    """Where a run into `out_dir` builds its output (and keeps an interrupted run's state)."""
    return output_paths(out_dir).staging


def fingerprint_of(config: RunConfig, checked: Checked) -> dict[str, Any]:
    """Everything that determines the output bytes; a resume must match it exactly."""
    # Every file the inputs expand to, with its size and modification time: a file added to an
    # input folder, or edited, between the interrupted run and the resume changes the documents.
    inputs = [[str(p), st.st_size, st.st_mtime_ns] for p, st in _stats(checked.paths)]
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
        "partition_size": config.partition_size,
        # The shards' columns: a state from a packtool that wrote other columns (e.g. before
        # seq_lengths was declared) cannot be finished with shards of a different schema.
        "columns": list(written(checked.columns)),
    }
    if LOSS_MASK in checked.columns:
        fingerprint[MASK_RULE_KEY] = MASK_RULE
    if checked.records and checked.sft_kind in CHAT_KINDS:
        # The template's text, not the --chat-template path (edited in place, or the
        # tokenizer's own one, it changes every conversation).
        fingerprint[CHAT_TEMPLATE_KEY] = template_record(config.read.sft, checked.tokenizer)
    elif checked.facts is not None and checked.facts.chat_template:  # tokenized conversations
        fingerprint[CHAT_TEMPLATE_KEY] = checked.facts.chat_template
    # Compare in the form the state file stores it (tuples become lists).
    return json.loads(json.dumps(fingerprint))


COMPLETE = "complete"
"""The state `output_folder` yields for `--resume` of a dataset whose run finished."""


def check_facts(state: dict[str, Any], checked: Checked, out: Path) -> None:
    """Refuse to resume a state whose `InputFacts` differ from those the run was checked with
    (a state replaced between `check_inputs` and the lock); an older state has none."""
    saved = state.get(FACTS_KEY)
    if saved is None or checked.facts is None:
        return
    now = checked.facts.to_dict()
    # As this packtool reads it: a state saved before a field was added lacks its key (a
    # damaged one is compared as it is, and refused below).
    with contextlib.suppress(KeyError, TypeError, ValueError, AttributeError):
        saved = InputFacts.from_dict(saved).to_dict()
    if saved == now:
        return
    if not isinstance(saved, dict):
        saved = {}
    differ = [k for k in now if saved.get(k) != now[k]] or sorted(set(saved) - set(now))
    what = ", ".join(differ)
    was = saved.get("kinds")
    if "kinds" in differ and isinstance(was, list) and len(was) == len(now["kinds"]):
        i = next(i for i, (a, b) in enumerate(zip(was, now["kinds"], strict=True)) if a != b)
        what = what.replace("kinds", f"{checked.paths[i]} read as {now['kinds'][i]}, not {was[i]}")
    raise ConfigError(
        f"cannot resume {out}: the inputs read differently from the saved run ({what}); "
        "start over with --overwrite"
    )


def _prepare(config: RunConfig, paths: OutputPaths) -> dict[str, Any] | None:
    """Check the output and its staging folder; return the saved state when resuming.

    Nothing is removed from the output itself: `--overwrite` only allows `commit` to replace it.
    """
    out, shown = paths.target, paths.shown
    if storage.exists(out) and not storage.is_dir(out):
        raise ConfigError(f"output {shown} exists and is not a folder")
    if storage.is_dir(out) and storage.is_mount(out):
        raise ConfigError(
            f"output {shown} is a mount point, which packtool cannot swap a new dataset into; "
            "write to a folder inside it"
        )
    if config.resume:
        return _load_state(paths)
    abandoned = _abandoned(paths)
    if abandoned or storage.exists(paths.staging):
        if not abandoned and not config.overwrite:
            raise ConfigError(
                f"an interrupted run into {shown} left its finished partitions in "
                f"{paths.staging}; pass --resume to finish it or --overwrite to start over"
            )
        # (Without a saved plan it was killed while it checked or planned: nothing to keep.)
        from packtool.engines.slurm.state import stop_jobs

        stop_jobs(paths.staging, config.out_dir)  # a detached Slurm run's: gone first
        paths = remove_staging(paths, leftover=True)
    check_replaceable(paths, config.overwrite)
    make_staging(paths)
    return None


def _abandoned(paths: OutputPaths) -> bool:
    """Whether the staging folder is what a run killed before it saved its plan leaves
    (`records.never_planned`: nothing, or the plan's temporary). Asked under the output's lock,
    so never of a live run's folder. A remote output's staging is the version its
    `.packtool-staging` object names (else a fresh run's new version: not abandoned)."""
    if paths.remote:
        named = staging_version(paths.target) == paths.staging.name
        return named and records.never_planned(paths.staging)
    return storage.is_dir(paths.staging) and records.never_planned(paths.staging)


def _load_state(paths: OutputPaths) -> dict[str, Any]:
    out, shown = paths.target, paths.shown
    if _abandoned(paths):
        if storage.exists(out / INDEX_FILE):  # an --overwrite killed early: the old dataset
            return {COMPLETE: True}  # `check_complete` decides, once the options are known
        raise ConfigError(
            f"{shown}: the interrupted run stopped before it saved its plan, so there is "
            "nothing to resume; run again without --resume"
        )
    if not storage.is_dir(paths.staging / STATE_DIR):
        if storage.exists(out / INDEX_FILE):
            return {COMPLETE: True}  # `check_complete` decides, once the options are known
        if any(storage.exists(where / old) for where in (out, paths.staging) for old in OLD_STATE):
            raise ConfigError(
                f"{shown} holds a run interrupted by an older packtool, which this one cannot "
                "finish; start over with --overwrite"
            )
        if not _holds_anything(paths) and not storage.exists(paths.staging):
            raise ConfigError(f"{shown} does not exist: nothing to resume; drop --resume")
        raise ConfigError(f"{shown}: no interrupted run to resume; use --overwrite")
    return records.read_plan(paths.staging)


def _holds_anything(paths: OutputPaths) -> bool:
    """The output exists (a remote one: holds more than this run's own lock object)."""
    if not paths.remote:
        return storage.exists(paths.target)
    return any(not p.name.startswith(".packtool-") for p in storage.list_dir(paths.target))


def discard_staging(exc: BaseException, state: dict[str, Any] | None, staging: Path) -> bool:
    """Whether a failed run's staging folder goes (see `output_folder`; `tokenize --to
    megatron` keeps its staging folder by the same rule)."""
    if isinstance(exc, Detached):
        return False  # the run goes on in a scheduler's jobs: they write into the staging folder
    if not isinstance(exc, Exception) or state is not None:
        return False  # Ctrl-C / SystemExit, or a resumed run: keep the work for --resume
    if isinstance(exc, PacktoolError) and not isinstance(exc, WorkersLost):
        return True
    return not records.finished(staging)
