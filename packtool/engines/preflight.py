"""What every `packtool pack` run checks before its first chunk, whichever engine runs it.

1. `check_inputs`: refuse an output inside an input folder (or an input inside the output),
   decide the tokenizer and check it against tokenized inputs, decide `long_docs` when it was
   left out (`truncate` for inputs with a loss mask, else `split`: `Checked.config`), and check
   that BOS + EOS leave room within `max_len`, before the output folder is touched, so a mistake
   leaves nothing behind. What it reads of the inputs (`InputFacts`: Parquet footers, first
   records) is saved with the plan; `--resume` takes it from there when no input's size or
   modification time changed, so it opens no input that only finished partitions read.
2. `fingerprint_of`: what a `--resume` must match (options, tokenizer, and the files
   `check_inputs` expanded the inputs to, with their sizes and modification times); the checks
   are packtool/engines/resume_checks.py.

Then the run locks and prepares its output folder (packtool/engines/output_folder.py). The
local and the Ray engine both go through here; neither repeats these checks.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from packtool.dataset.columns import LOSS_MASK, written
from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.output_apart import check_apart
from packtool.engines import records
from packtool.engines.config import RunConfig
from packtool.engines.output_folder import staging_folder
from packtool.engines.resume_checks import CHAT_TEMPLATE_KEY, MASK_RULE, MASK_RULE_KEY
from packtool.errors import OVERWRITE, ConfigError, PacktoolError
from packtool.pack.chunk import check_room_for_text
from packtool.pack.columns import check_policy, policy_for
from packtool.prefetch import map_ordered
from packtool.read.corpus import expand_inputs
from packtool.read.formats import OFFSET_UNITS, raw_kind
from packtool.read.sft_config import CHAT_KINDS
from packtool.sft.encode import note_template, template_record
from packtool.storage import local as storage
from packtool.tokenize.recorded import (
    check_recorded_specials,
    check_recorded_tokenizer,
    warn_engine_unused,
)
from packtool.tokenize.tables import PRETOKENIZED, RAW, RECORDS
from packtool.tokenize.tokenize import inputs_read, unchanged_ids
from packtool.tokenizer.by_name import tokenizer_by_name
from packtool.tokenizer.tokenizers import Tokenizer


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
    config: RunConfig
    """The run as checked, `pack.long_docs` decided (`columns.policy_for`) where it was None:
    what the run goes on with (fingerprint, workers, index.json)."""
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
    bos: int | str | None = "auto",
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
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).

    Raises:
        DataError: a missing input, a tokenizer that differs from the recorded one, or inputs
            of which some carry a loss mask and others not.
        ConfigError: inputs of two kinds, a `max_len` that BOS + EOS fill, `long_docs="split"`
            for inputs with a loss mask (in the CLI's words, `--long-docs split`, when
            `config.command` is set), an output inside an input folder (or an input inside the
            output), or a `tokenizer` that is neither a `Tokenizer` nor a spec string.
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
    long_docs = policy_for(facts.columns, config.pack.long_docs)
    config = replace(config, pack=replace(config.pack, long_docs=long_docs))
    check_policy(facts.columns, long_docs, api=not config.command)
    recorded = None if facts.recorded is None else TokenizerIdentity.from_dict(facts.recorded)
    if isinstance(tokenizer, str) or (tokenizer is None and recorded is None):
        tokenizer = tokenizer_by_name(tokenizer or "byte", bos)
    else:
        tokenizer_by_name(tokenizer, bos)  # a Tokenizer with a `bos` too: refused
    if tokenizer is None and recorded is not None:  # read as recorded: no tokenizer applies
        check_recorded_specials(recorded, {} if bos == "auto" else {"bos": bos}, config.inputs[0])
    if tokenizer is not None and recorded is not None:
        # None where it is the recorded one once the EOS / BOS not chosen are the file's
        warn_engine_unused(tokenizer)
        tokenizer = check_recorded_tokenizer(recorded, tokenizer, config.inputs[0])
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
        config=config,
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
    """Each input's document-id offset unit (`OFFSET_UNITS`). A file of fine-tuning records numbers
    them as a corpus file of its type does (the byte of a JSON line, an array's item, a Parquet
    row: packtool/sft/inputs.py), so its type is read (the first bytes of a JSON file)."""
    records = [p for p, k in zip(paths, kinds, strict=True) if k == RECORDS]
    types = dict(zip(records, map_ordered(raw_kind, records), strict=True))
    return [OFFSET_UNITS.get(types.get(p, k), "row") for p, k in zip(paths, kinds, strict=True)]


def _stats(paths: list[Path]) -> zip[tuple[Path, os.stat_result]]:
    return zip(paths, storage.stat_all(paths), strict=True)


def fingerprint_of(config: RunConfig, checked: Checked) -> dict[str, Any]:
    """Everything that determines the output bytes; a resume must match it exactly. `config` is
    the run as `check_inputs` returned it (`Checked.config`, `long_docs` decided)."""
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
        note_template(config.read.sft, checked.tokenizer)
    elif checked.facts is not None and checked.facts.chat_template:  # tokenized conversations
        fingerprint[CHAT_TEMPLATE_KEY] = checked.facts.chat_template
    # Compare in the form the state file stores it (tuples become lists).
    return json.loads(json.dumps(fingerprint))


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
        f"start over with {OVERWRITE}"
    )
