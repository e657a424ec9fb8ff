"""Tokenize corpora into tokenized Parquet, and read tokenized Parquet back.

Tokenized schema (docs/CONTRACTS.md): `doc_id` int64, `source` string, `input_ids`
list<uint16|uint32>, `length` int32, then the extra fields as strings. The schema metadata key
`packtool` holds `{"format": "packtool.tokenized", "version": 1, "tokenizer": {...}}`.

`inputs_read` classifies the inputs once; `tokenized_batches` (the `tokenize` command; `stats`
calls `read_tables` with the inputs it listed and classified) yields tables of that schema from
any of them through the one dispatch, `tables.partition_tables`, which the engines' workers use
for their partitions.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from packtool.dataset import columns as shard_columns
from packtool.dataset import hub_record
from packtool.dataset.identity import TokenizerIdentity, token_dtype
from packtool.dataset.manifest import INDEX_FILE, dataset_folder
from packtool.dataset.names import is_part_name
from packtool.dataset.output import OutputPaths, remove_staging, transaction
from packtool.dataset.output_apart import check_apart
from packtool.dataset.output_versions import is_version, ours
from packtool.dataset.tokenized import (
    common_identity,
    common_optional,
    split_tokenized,
    tokenized_lengths,
    tokenized_schema,
)
from packtool.dataset.tokenized_writer import BackgroundWriter, PartWriter
from packtool.errors import OVERWRITE, ConfigError, DataError, option_choice
from packtool.progress import Progress
from packtool.read.corpus import expand_inputs
from packtool.read.documents import ReadConfig, SkipCounter, run_skips
from packtool.read.pretokenized import split_pretokenized
from packtool.read.sft_config import CHAT_KINDS
from packtool.sft.encode import note_template, template_record
from packtool.sft.inputs import file_record_kind, sft_kind
from packtool.storage import hub, writing
from packtool.storage import local as storage
from packtool.tokenize.recorded import (
    check_none_given,
    check_recorded_tokenizer,
    inputs_recorded,
    recorded_check,
)
from packtool.tokenize.summary import TokenizeSummary, summary_of
from packtool.tokenize.tables import (
    PRETOKENIZED,
    RAW,
    RECORDS,
    TOKENIZED,
    FilePiece,
    Source,
    partition_tables,
)
from packtool.tokenizer.by_name import tokenizer_by_name
from packtool.tokenizer.tokenizers import Tokenizer, load_tokenizer


def input_identity(inputs: Iterable[str | os.PathLike]) -> TokenizerIdentity | None:
    """The tokenizer recorded in tokenized Parquet inputs (None when the inputs are raw)."""
    recorded = inputs_recorded(inputs)
    return None if recorded is None else recorded[1]


def input_columns(
    inputs: Iterable[str | os.PathLike], read_config: ReadConfig | None = None
) -> tuple[str, ...]:
    """The optional shard columns the inputs' documents carry (`loss_mask`); () for text.

    Raises:
        DataError: some inputs carry a column that others do not (see `common_optional`).
    """
    return inputs_read(expand_inputs(inputs), read_config or ReadConfig()).columns


def unchanged_ids(
    identity: TokenizerIdentity, tokenizer: Tokenizer | None, eos_added: bool = False
) -> TokenizerIdentity:
    """The identity a dataset of pre-tokenized ids records: no EOS or BOS, since the ids are
    used unchanged (the summary and index.json said `eos 7, bos 9` for ids given none); with
    `eos_added` (`tokenize --to megatron` appends the EOS to each document) the EOS is kept and
    only the BOS goes (it recorded, and an explicit `--bos-id` widened the .bin's dtype for, a
    BOS it never wrote).

    Raises:
        ConfigError: an EOS / BOS id chosen, which would add nothing (`check_none_given`).
    """
    check_none_given(tokenizer, eos_added)
    return (
        replace(identity, bos_id=None) if eos_added else replace(identity, eos_id=None, bos_id=None)
    )


def names_kept(names: dict[str, str], identity: TokenizerIdentity) -> dict[str, str]:
    """Where the EOS / BOS came from (`Tokenizer.special_names`), for those `identity` still
    records: pre-tokenized ids get none added (`unchanged_ids`), so none is named (the summary
    and index.json named the tokenizer's EOS and BOS for ids given neither)."""
    return {k: v for k, v in names.items() if getattr(identity, f"{k}_id", None) is not None}


@dataclass(frozen=True)
class InputsRead:
    """What the inputs are, learnt once from their footers and first records (`inputs_read`) and
    handed on: `tokenized_batches`, `stats` and `pack`'s preflight (which saves it in the run's
    state for `--resume`) read the inputs by it and never classify them again."""

    columns: tuple[str, ...]
    """The optional shard columns (`input_columns`)."""
    pretokenized: list[Path]
    """All the files when they are token ids made elsewhere (packtool/read/pretokenized.py), else []."""
    mask_source: str | None
    """The pre-tokenized files' mask column (None: no mask)."""
    tokenized: list[tuple[Path, dict[str, Any]]]
    """`packtool tokenize` files with their metadata (all of the files, or [])."""
    mode: str = RAW
    """`RAW`, `TOKENIZED`, `PRETOKENIZED` or `RECORDS`."""
    sft_kind: str | None = None
    """Fine-tuning records (`RECORDS`): their kind (prompt-completion, messages, sharegpt)."""

    def identity(self) -> TokenizerIdentity | None:
        """The tokenizer recorded in tokenized inputs (`input_identity`)."""
        return common_identity(self.tokenized) if self.tokenized else None

    def special_names(self) -> dict[str, str]:
        """Where the recorded EOS / BOS defaults came from, as `packtool tokenize` wrote it
        (the same in every file, else nothing: files tokenized apart may say it otherwise)."""
        said = [meta.get("special_tokens") for _, meta in self.tokenized]
        if not said or not isinstance(said[0], dict) or any(s != said[0] for s in said):
            return {}
        return {k: v for k, v in said[0].items() if isinstance(v, str)}

    def chat_template(self) -> dict[str, Any] | None:
        """The chat template the tokenized inputs' conversations were rendered with, as
        `packtool tokenize` recorded it (the same in every file, else None)."""
        said = [meta.get("chat_template") for _, meta in self.tokenized]
        if not said or not isinstance(said[0], dict) or any(s != said[0] for s in said):
            return None
        return dict(said[0])


def inputs_read(paths: list[Path], config: ReadConfig) -> InputsRead:
    """What the inputs are (`InputsRead`), each footer and first record read once
    (`map_ordered`: several files at a time, the answers in input order).

    The answer is kept for the same files (same sizes and modification times) and options: the
    CLI asks before it builds a run (the default `--long-docs` depends on a loss mask) and the
    run's preflight asks again, and at 10^5 inputs the footers are most of preflight's time.

    Raises:
        ConfigError: inputs of two kinds, or a `--format` the inputs contradict.
        DataError: as `input_columns`, and fine-tuning files of different kinds.
    """
    found = inputs_kind(paths, config)
    _check_chat_options(found, config)
    template = config.sft.chat_template
    if template is not None and found.sft_kind not in CHAT_KINDS and _kinds_known(paths, config):
        what = f"{found.sft_kind} records" if found.sft_kind else "no chat records"
        raise _refused(
            "--chat-template", "chat_template", template,
            f"the inputs hold {what} (a template renders messages or conversations)",
        )  # fmt: skip
    train_on = config.sft.train_on
    if train_on != "assistant" and found.sft_kind is None and _kinds_known(paths, config):
        # it was ignored without a word: plain text has no loss mask to place
        raise _refused(
            "--train-on", "train_on", train_on,
            "the inputs hold plain text, which has no prompt or turns to leave out of the loss",
        )  # fmt: skip
    return found


def inputs_kind(paths: list[Path], config: ReadConfig) -> InputsRead:
    """What the inputs are, as `inputs_read` says, without refusing the options they cannot use
    (the CLI names those it was given first: packtool/cli/input_checks.py). Kept as
    `inputs_read` says.

    Raises:
        ConfigError, DataError: as `inputs_read`, but for the options it refuses.
    """
    try:
        key = storage.file_states(paths)
    except OSError:  # the readers name the file
        return _inputs_read_kind(paths, config)
    return _inputs_kind_cached(key, config)


@functools.lru_cache(maxsize=4)
def _inputs_kind_cached(files: tuple[tuple[Path, int, int], ...], config: ReadConfig) -> InputsRead:
    return _inputs_read_kind([p for p, _, _ in files], config)


TOKENIZED_INPUTS = (
    "the inputs hold tokenized documents (their ids and loss mask, if any, were made when they "
    "were tokenized)"
)
"""Why an option about reading records does nothing for tokenized or pre-tokenized Parquet."""


def _check_chat_options(found: InputsRead, config: ReadConfig) -> None:
    """Refuse `--chat-template` and `--train-on` for ids made earlier (tokenized or
    pre-tokenized Parquet): nothing is rendered, and the mask, if any, is the stored one."""
    if found.mode not in (TOKENIZED, PRETOKENIZED):
        return
    again = "tokenize the records again with it"
    if config.sft.chat_template is not None:
        template = config.sft.chat_template
        raise _refused("--chat-template", "chat_template", template, TOKENIZED_INPUTS, again)
    if config.sft.train_on != "assistant":
        raise _refused("--train-on", "train_on", config.sft.train_on, TOKENIZED_INPUTS, again)


def _refused(option: str, name: str, value: object, why: str, instead: str = "") -> ConfigError:
    """The one line refusing `option value` (the library's `name=value`) for inputs it would
    do nothing for: why, then "drop" it (or `instead`)."""
    given = option_choice(option, name, value)
    return ConfigError(f"{given}: {why}; drop it" + (f" (or {instead})" if instead else ""))


def _kinds_known(paths: list[Path], config: ReadConfig) -> bool:
    """Every input's first records say what it holds (an unreadable one is the reader's to
    report, with its own message)."""
    return all(file_record_kind(p, config) is not None for p in paths)


def _inputs_read_kind(paths: list[Path], config: ReadConfig) -> InputsRead:
    pre, mask_source = split_pretokenized(paths, config)
    if pre:
        sft_kind(pre, config, tokenized=True)  # refuses a --format of raw records
        columns = (shard_columns.LOSS_MASK,) if mask_source else ()
        # no packtool metadata: not `packtool tokenize` output
        return InputsRead(columns, pre, mask_source, [], PRETOKENIZED)
    tokenized, raw = split_tokenized(paths)
    kind = sft_kind(raw, config, tokenized=bool(tokenized))
    if kind is not None:  # prompt/completion, chat records
        return InputsRead((shard_columns.LOSS_MASK,), [], None, tokenized, RECORDS, kind)
    columns = common_optional(tokenized) if tokenized else ()
    return InputsRead(columns, [], None, tokenized, TOKENIZED if tokenized else RAW)


def tokenized_batches(
    inputs: Iterable[str | os.PathLike],
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str | None = "byte",
    workers: int | None = None,
    skips: SkipCounter | None = None,
    bos: int | str | None = "auto",
) -> Iterator[pa.Table]:
    """Yield tables of the tokenized schema, from raw corpora or from tokenized Parquet.

    Reading runs one batch ahead in a thread, overlapping the (GIL-free) tokenizer.

    Args:
        inputs: files, folders, globs: all raw corpus files, or all tokenized Parquet.
        read_config: how to read raw corpora (also which extra fields to carry).
        tokenizer: a `Tokenizer` or a spec for `load_tokenizer`. For tokenized Parquet it must
            match the recorded tokenizer (pass None to accept whatever is recorded).
        workers: encoding threads when `tokenizer` is a spec (default: all cores).
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).
        skips: counts skipped documents (a fresh one when None; pass one to read the counts).
            `read_config.strict` makes the run strict whatever counter is passed: one passed
            with strict=False is made strict (`packtool.read.documents.run_skips`).

    Raises:
        DataError: bad input (see `read_corpus`), or tokenized Parquet made with another
            tokenizer.
    """
    tokenizer = tokenizer_by_name(tokenizer, bos, workers=workers)
    for table, _ in _tokenized_batches(
        inputs, read_config=read_config, tokenizer=tokenizer, workers=workers, skips=skips, bos=bos
    ):
        yield table


def _tokenized_batches(
    inputs: Iterable[str | os.PathLike],
    *,
    read_config: ReadConfig | None,
    tokenizer: Tokenizer | str | None,
    workers: int | None,
    skips: SkipCounter | None,
    bos: int | str | None = "auto",
) -> Iterator[tuple[pa.Table, int]]:
    config = read_config or ReadConfig()
    inputs = storage.input_list(inputs)  # the first, as given, names them (recorded.py)
    paths = expand_inputs(inputs)
    read = inputs_read(paths, config)
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, workers=workers)
    tokenizer = recorded_check(read, tokenizer, bos, storage.input_text(inputs[0]))
    if read.mode == PRETOKENIZED:  # used unchanged: an EOS / BOS chosen adds nothing
        check_none_given(tokenizer)
    skips = run_skips(skips, config)
    yield from read_tables(paths, read, config, tokenizer, skips)


def read_tables(
    paths: list[Path],
    read: InputsRead,
    config: ReadConfig,
    tokenizer: Tokenizer | None,
    skips: SkipCounter,
) -> Iterator[tuple[pa.Table, int]]:
    """`tokenized_batches` of inputs already listed (`expand_inputs`) and classified
    (`inputs_read(paths, config)`), as `stats` has them: each table with the input bytes it
    stands for. Neither lists nor classifies the inputs again."""
    source = source_for(read, config, tokenizer)
    # Every input whole, numbered in reading order: the dispatch the engines' workers use too.
    pieces = [FilePiece(str(p), 0, 0, i) for i, p in enumerate(paths)]
    yield from partition_tables(source, tokenizer, pieces, skips, _no_check)


def _no_check(piece: FilePiece) -> None:
    """Nothing to compare a file with: no plan was made (the engines check theirs)."""


def source_for(read: InputsRead, config: ReadConfig, tokenizer: Tokenizer | None) -> Source:
    """How to read inputs of this kind (`tables.Source`): the mode, the tokenized schema and
    the tokenizer identity the tables carry.

    Raises:
        ConfigError: inputs that need a tokenizer and `tokenizer` is None.
        DataError: tokenized Parquet made with another tokenizer than `tokenizer`.
    """
    if read.mode == TOKENIZED:
        identity = common_identity(read.tokenized)
        if tokenizer is not None:
            check_recorded_tokenizer(identity, tokenizer, read.tokenized[0][0])  # or DataError
    elif tokenizer is None:
        what = (
            "pre-tokenized inputs need the tokenizer that made them"
            if read.mode == PRETOKENIZED
            else ("raw corpus inputs need a tokenizer")
        )
        raise ConfigError(f"{what} (e.g. --tokenizer byte / tokenizer='byte')")
    else:
        identity = tokenizer.identity
    return Source(
        mode=read.mode,
        read=config,
        schema=tokenized_schema(identity, config.extra_fields, optional=read.columns),
        identity=identity,
        mask_source=read.mask_source,
        sft_kind=read.sft_kind,
    )


def read_lengths(inputs: Iterable[str | os.PathLike]) -> np.ndarray:
    """Document lengths (int32, BOS/EOS included) from tokenized Parquet, reading only `length`
    (`dataset.tokenized.tokenized_lengths`).

    Raises:
        DataError: an input is not tokenized Parquet, the files used different tokenizers, or
            a damaged `length` column.
    """
    tokenized, raw = split_tokenized(expand_inputs(inputs))
    if raw:
        raise DataError(f"{raw[0]}: not tokenized Parquet; run `packtool tokenize` first")
    common_identity(tokenized)
    return tokenized_lengths(tokenized)


def tokenize_corpus(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    out: str | os.PathLike,
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str | None = "byte",
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    part_tokens: int = 200_000_000,
    command: str = "",
    bos: int | str | None = "auto",
) -> TokenizeSummary:
    """Tokenize `inputs` into tokenized Parquet at `out`.

    Args:
        inputs: files, folders, globs of raw corpus files (one str or `os.PathLike` is one input).
        out: a `.parquet` file, or a folder that gets `part-00000.parquet`, ... (a new part after
            `part_tokens` tokens). Built beside it (`.NAME.packtool-staging`) and swapped in at
            the end (`packtool/dataset/output.py`): a failure leaves an existing `out` as it was.
        read_config: how to read the inputs.
        tokenizer: a `Tokenizer` or a `load_tokenizer` spec; for tokenized Parquet it must
            match the recorded tokenizer, and None takes the recorded one (`byte` for other
            inputs), as `pack` does.
        workers: encoding threads (default: all cores).
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).
        overwrite: replace an existing `out` (a folder only if it holds nothing but part files).
        progress: draw a progress bar (default: when stderr is a terminal).
        part_tokens: tokens per part file when `out` is a folder.
        command: the command line, shown to a second writer that the output's lock refuses.

    Raises:
        ConfigError: `out` exists without `overwrite`, another process is writing it, it is
            inside an input folder (or holds an input), or bad options.
        DataError: bad input (see `read_corpus`), or no document at all (the skips are named;
            nothing is written and an existing `out` is kept).
    """
    if part_tokens < 1:
        raise ConfigError(f"part_tokens must be >= 1, got {part_tokens}")
    inputs = storage.input_list(inputs)
    config = read_config or ReadConfig()
    out = storage.as_path(out) if storage.is_remote(out) else Path(out)
    check_apart(out, [storage.input_text(i) for i in inputs])  # before anything is read
    tokenizer = tokenizer_by_name(tokenizer, bos, workers=workers)
    single = out.name.lower().endswith(".parquet")
    skips = SkipCounter(strict=config.strict)
    read = inputs_read(expand_inputs(inputs), config)
    if tokenizer is None and read.mode != TOKENIZED:  # only tokenized Parquet records one
        tokenizer = load_tokenizer("byte", workers=workers, bos=bos)
    # None: read with the recorded tokenizer (an EOS / BOS option refused unless the file's)
    tokenizer = recorded_check(read, tokenizer, bos, storage.input_text(inputs[0]))
    optional = read.columns  # e.g. loss_mask from labels: passed through
    recorded = read.identity() if tokenizer is None else None
    identity = recorded or tokenizer.identity
    if read.mode == TOKENIZED and recorded is None:  # ids passed through, none encoded here:
        identity = replace(identity, engine=read.identity().engine)  # the engine that made them
    special_names = read.special_names() if tokenizer is None else tokenizer.special_names
    if read.mode == PRETOKENIZED:  # no EOS or BOS added: none named (the summary named them)
        identity = unchanged_ids(identity, tokenizer)
        special_names = names_kept(special_names, identity)
    if read.sft_kind in CHAT_KINDS:
        note_template(config.sft, tokenizer)
    schema = tokenized_schema(
        identity,
        config.extra_fields,
        optional=optional,
        special_names=special_names,
        # Conversations rendered here, or by the `packtool tokenize` that wrote these inputs.
        chat_template=template_record(config.sft, tokenizer)
        if read.sft_kind in CHAT_KINDS
        else read.chat_template(),
    )

    def prepare(paths: OutputPaths) -> None:
        if paths.hub or paths.remote and not paths.whole_object:  # a link and versions
            _check_remote_out(paths.target, overwrite, shown=str(out))
        else:
            _check_out(paths.target, single, overwrite, shown=str(out))
        if paths.hub and hub_record.build_waits(paths.staging) and not overwrite:
            # This machine's staging for the URL is shared with `pack`: never discard its build
            # (waiting for `pack --resume`) unasked.
            raise ConfigError(
                f"{out}: a dataset `packtool pack` built waits in {paths.staging} (its commit "
                f"to the Hub did not happen); pass {OVERWRITE} to discard it"
            )
        # A killed run's leftovers (tokenize has nothing to resume): a local folder only if
        # packtool's; the Hub's with pack's record of what it replaces; a bucket's version and
        # the object naming it, this run building a version of another name (a job of that run
        # still alive could upload into that one).
        paths = remove_staging(paths, leftover=True)
        try:  # the first write, up front: a failure names the user's path
            if single:
                writing.create_empty(paths.staging)
            else:
                writing.make_dir(paths.staging)
        except OSError as exc:
            raise ConfigError(f"cannot write {out} ({exc.strerror or exc})") from None

    # Any failure of the work discards the staging output; the old output is replaced only
    # when everything is written, in one swap (packtool/dataset/output.py).
    with transaction(
        out, command or "packtool tokenize", prepare, lambda exc, _: True, resumable=False
    ) as (
        paths,
        _,
    ):
        start = time.perf_counter()
        writer = PartWriter(paths.staging, schema, single=single, part_tokens=part_tokens)
        try:
            bar, supervised = write_all(
                inputs, config, tokenizer, workers, skips, writer, progress, optional
            )
            files = writer.close()
        except BaseException:
            writer.abort()
            raise
    seconds = time.perf_counter() - start
    if single:
        files = [out]
    elif hub.is_hub(out):  # built on this machine, committed into the version the link names
        folder = dataset_folder(out)
        files = [folder / f.name for f in files]
    elif not storage.is_remote(out):
        files = [out / f.name for f in files]  # a bucket's: in the version folder, as written
    dtype = str(tokenizer.dtype if tokenizer is not None else token_dtype(identity.vocab_size))
    return summary_of(bar, skips, files, special_names, seconds, dtype, supervised, identity)


def write_all(
    inputs: list,
    config: ReadConfig,
    tokenizer: Tokenizer | None,
    workers: int | None,
    skips: SkipCounter,
    writer: PartWriter,
    progress: bool | None,
    optional: Iterable[str],
) -> tuple[Progress, int | None]:
    """Read, encode and write every input; the closed progress bar (its totals) and the
    supervised tokens (None without a loss mask)."""
    supervised: int | None = 0 if shard_columns.LOSS_MASK in optional else None
    with Progress("tokenize", enabled=progress) as bar:
        tables = _tokenized_batches(
            inputs, read_config=config, tokenizer=tokenizer, workers=workers, skips=skips
        )
        write_q = BackgroundWriter(writer)
        # Kept fields no document has had a value for yet (a JSONL record without the field
        # gives a null; Parquet and tokenized inputs refuse a missing column up front).
        unseen = list(config.extra_fields)
        try:
            for table, nbytes in tables:
                if unseen:
                    unseen = [f for f in unseen if table.column(f).null_count == table.num_rows]
                write_q.put(table)
                tokens = int(pc.sum(table.column("length")).as_py() or 0)
                if supervised is not None:
                    mask = shard_columns.flat_parts(table.column(shard_columns.LOSS_MASK))
                    supervised += int(mask[1].sum(dtype=np.int64))
                bar.update(docs=table.num_rows, tokens=tokens, nbytes=nbytes)
        finally:
            write_q.close()
    if bar.docs == 0:
        # As `stats` and `pack` do: an output without a document is a mistake, not a result.
        raise DataError(f"no documents in {', '.join(map(str, inputs))}{skips.note()}")
    if unseen:  # an all-null column is a misspelt name, not a result (as pack's --group-by)
        raise DataError(
            f"kept field {unseen[0]!r} (--keep-field / extra_fields): none of the "
            f"{bar.docs:,} documents has a value for "
            "it (missing or null in every record: check the name); nothing was written"
        )
    return bar, supervised


def _check_out(out: Path, single: bool, overwrite: bool, *, shown: str) -> None:
    if not storage.exists(out):
        return
    # What --overwrite cannot replace first: it was suggested, then refused (`-o /dev/null`).
    if single and storage.is_dir(out):
        raise ConfigError(
            f"{shown} is a folder; give a .parquet file name or a folder without .parquet"
        )
    if not single:
        if not storage.is_dir(out):
            raise ConfigError(f"{shown} exists and is not a folder")
        others = [p.name for p in storage.list_dir(out) if not _is_part(p)]
        if others:
            raise ConfigError(
                f"{shown} holds files that are not tokenize parts "
                f"({', '.join(sorted(others)[:3])}); refusing to replace it, choose another output"
            )
        if storage.is_mount(out):
            raise ConfigError(f"{shown} is a mount point; write to a folder inside it")
    if not overwrite:
        raise ConfigError(f"{shown} already exists; pass {OVERWRITE} to replace it")


def _check_remote_out(out: Path, overwrite: bool, *, shown: str) -> None:
    """A bucket prefix for a folder of parts: its link `index.json` and versions (what an
    earlier run committed) are replaced only with `overwrite`; other objects never."""
    present = [p for p in storage.list_dir(out) if not p.name.startswith(".packtool-")]
    if present and not overwrite:
        raise ConfigError(f"{shown} already exists; pass {OVERWRITE} to replace it")
    foreign = sorted(
        p.name for p in present if p.name != INDEX_FILE and not (is_version(p.name) and ours(p))
    )
    if foreign:
        raise ConfigError(
            f"{shown} holds objects that are not a tokenize output ({', '.join(foreign[:3])}); "
            "refusing to replace it, choose another prefix"
        )


def _is_part(p: Path) -> bool:
    return storage.is_file(p) and is_part_name(p.name)
