"""Input options the inputs cannot use, checked where it is known which options were given.

The rule (docs/sft.md, "Options the inputs cannot use"), for options given on the command line
(a default is nobody's mistake):

- an option that says what is read from the records (`--prompt-field`, `--completion-field`,
  `--messages-field`; the library refuses `--chat-template` and `--train-on` the same way) is a
  one-line error where the inputs are not read by it: a field no first record has, records read
  as another kind, or tokenized Parquet. Going on would hand back other data than the option
  asks for (plain text with no loss mask, or the ids stored earlier);
- an option that cannot change what comes out of these inputs (`--text-field` and
  `--text-column` for tokenized Parquet, `--text-field` where no input is JSONL and
  `--text-column` where none is Parquet or the records are fine-tuning records,
  `--render-processes` where nothing is rendered) is one `warning:` line on stderr, and the run
  goes on.

The library's configs are untouched (and with them the fingerprint `--resume` compares); the
inputs' kind is the one the run uses (`packtool.tokenize.tokenize.inputs_kind`, kept).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from packtool.cli.exits import echo
from packtool.errors import ConfigError, DataError

TOKENIZER_OPTIONS = ("tokenizer", "tokenizer_engine", "eos_id", "no_eos", "bos_id", "no_bos")
_RECORD_FIELDS = ("prompt_field", "completion_field", "messages_field")
_FOR_RAW_TEXT = ("text_field", "text_column", "strict")


def explicit(ctx: click.Context, names: tuple[str, ...]) -> list[str]:
    """The options among `names` the user gave (not left at their defaults)."""
    return [n for n in names if ctx.get_parameter_source(n) != click.core.ParameterSource.DEFAULT]


def flag_of(name: str) -> str:
    """The command-line flag of a click parameter name (`eos_id` -> `--eos-id`)."""
    return "--" + name.replace("_", "-")


def check_input_options(inputs: tuple[str, ...], corpus: Any, sft: Any) -> None:
    """Refuse, or warn about, the given input options these inputs cannot use (the module's
    rule). `--strict` counts for tokenized inputs too: a row of no id is an `empty` skip
    (packtool/read/tokenized.py, read/pretokenized.py), and `tokenize --to megatron` skips
    documents of an EOS alone.

    Raises:
        ConfigError: a record field option the inputs are not read by.
    """
    names = (*_RECORD_FIELDS, *_FOR_RAW_TEXT, "render_processes")
    given = explicit(click.get_current_context(), names)
    if not given:
        return
    from packtool.read.corpus import expand_inputs
    from packtool.read.sft_config import CHAT_KINDS
    from packtool.tokenize.tables import PRETOKENIZED, TOKENIZED
    from packtool.tokenize.tokenize import TOKENIZED_INPUTS, inputs_kind

    paths = expand_inputs(inputs)
    fields = [n for n in _RECORD_FIELDS if n in given]
    try:
        found = inputs_kind(paths, corpus.read_config(sft=sft))
    except DataError:  # a --format the first records contradict: a misspelt field says why
        if fields:
            _check_fields(fields, paths, None, sft, kind_known=False)
        raise
    values = {
        **{n: getattr(sft, n) for n in (*_RECORD_FIELDS, "render_processes")},
        **{n: getattr(corpus, n) for n in _FOR_RAW_TEXT},
    }
    tokenized = found.mode in (TOKENIZED, PRETOKENIZED)
    if fields and tokenized:
        flag = flag_of(fields[0])
        raise ConfigError(
            f"{flag} {values[fields[0]]}: {TOKENIZED_INPUTS}; drop {flag} (or tokenize the "
            "records again with it)"
        )
    if fields:
        _check_fields(fields, paths, found.sft_kind, sft)
    if tokenized:  # rows can be skipped (no id): --strict counts there
        unused = [
            f"{flag_of(n)} {values[n]}" for n in _FOR_RAW_TEXT if n in given and n != "strict"
        ]
        if unused:
            echo(
                f"warning: {', '.join(unused)} ignored: the inputs are tokenized Parquet, read "
                "as their stored ids (and loss mask)",
                err=True,
            )
    if not tokenized:
        _warn_unread_text_options(given, paths, found.sft_kind, values)
    if "render_processes" in given and found.sft_kind not in CHAT_KINDS:
        echo(
            f"warning: --render-processes {sft.render_processes} ignored: the inputs hold no "
            "chat records, so nothing is rendered",
            err=True,
        )


def _warn_unread_text_options(
    given: list[str], paths: list[Path], kind: str | None, values: dict[str, Any]
) -> None:
    """One `warning:` line for `--text-field` where no input is JSONL (or the records are read
    as fine-tuning records), and for `--text-column` where no input is Parquet (or likewise)."""
    from packtool.read.formats import file_kind

    for name, fmt, what in (
        ("text_field", "jsonl", "JSONL"),
        ("text_column", "parquet", "Parquet"),
    ):
        if name not in given:
            continue
        if kind is not None:
            why = f"the inputs are read as {kind} records"
        elif not any(file_kind(p) == fmt for p in paths):
            why = f"no input is {what}"
        else:
            continue
        echo(f"warning: {flag_of(name)} {values[name]} ignored: {why}", err=True)


def _check_fields(
    fields: list[str], paths: list[Path], kind: str | None, sft: Any, *, kind_known: bool = True
) -> None:
    """The record field options given for raw inputs: each names a field of the first records,
    and the inputs are read as the kind it is for, `kind` (else one line, naming the option).
    `kind_known` False: only the first."""
    from packtool.read.sft_config import CHAT_KINDS, PROMPT_COMPLETION
    from packtool.sft.inputs import first_fields

    names: list[str] | None = None
    for group, read_as, what in (
        (("prompt_field", "completion_field"), kind == PROMPT_COMPLETION, "prompt/completion"),
        (("messages_field",), kind in CHAT_KINDS, "chat"),
    ):
        mine = [n for n in fields if n in group]
        # Read as its kind with --format auto: a first record had the fields; else look.
        if not mine or kind_known and read_as and sft.format == "auto":
            continue
        names = first_fields(paths) if names is None else names
        flag, value = flag_of(mine[0]), getattr(sft, mine[0])
        found = f"(fields found: {', '.join(names) or 'none'})"
        for n in (*mine, *(n for n in group if n not in mine)):
            field = getattr(sft, n)
            if field in names:
                continue
            if n in mine:
                raise ConfigError(
                    f"{flag_of(n)} {field}: no field {field!r} in the inputs' first records {found}"
                )
            raise ConfigError(
                f"{flag} {value}: no field {field!r} in the inputs' first records to go with it "
                f"{found}; name the {n.split('_')[0]} with {flag_of(n)}"
            )
        if kind_known and not read_as:  # (--format cannot help: the first record decides)
            other = f"{kind} records" if kind else "plain text"
            raise ConfigError(
                f"{flag} {value}: the inputs are read as {other} (by their first records), "
                f"not {what} records; drop {flag}"
            )
