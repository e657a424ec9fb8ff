"""The input options of `tokenize`, `stats` and `pack` (click, like packtool/cli/commands.py).

`@inputs_argument` (INPUT...), `@corpus_options` (reader and tokenizer: `CorpusOptions`) and `@sft_options` (fine-tuning
records: `packtool.read.sft_config.SFTConfig`). A second command-line module so that packtool/cli/commands.py
stays under the size every module keeps; like cli.py it only parses options into configs.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from packtool.cli.exits import echo
from packtool.cli.input_checks import TOKENIZER_OPTIONS, explicit
from packtool.errors import ConfigError
from packtool.read.sft_config import FORMATS, TRAIN_ON, SFTConfig
from packtool.storage import local as storage


def _engine_ignored() -> None:
    """The warning for `--tokenizer-engine` over tokenized Parquet, which nothing encodes."""
    from packtool.tokenize.recorded import ENGINE_IGNORED

    echo(ENGINE_IGNORED, err=True)


def _inputs_named(inputs: tuple[str, ...]) -> tuple[str, ...]:
    """INPUT...: an empty one would mean the current folder (an unset variable); say so."""
    return tuple(storage.named_input(text) for text in inputs)


inputs_argument = click.argument(
    "inputs",
    nargs=-1,
    required=True,
    metavar="INPUT...",
    callback=lambda ctx, param, value: _inputs_named(value),
)
"""The INPUT... argument of `tokenize`, `stats` and `pack`: files, folders, globs, URLs."""


# --- shared corpus/tokenizer options (tokenize, stats, pack): `@corpus_options` ---


@dataclass(frozen=True)
class CorpusOptions:
    """The parsed `@corpus_options`; build the library objects with the two methods."""

    text_field: str
    text_column: str
    tokenizer: str
    eos_id: str | None
    no_eos: bool
    bos_id: str | None
    strict: bool
    tokenizer_engine: str = "auto"
    no_bos: bool = False

    def read_config(self, **overrides: Any) -> Any:
        """A `packtool.read.corpus.ReadConfig` (overrides: e.g. `extra_fields=("lang",)`)."""
        from packtool.read.documents import ReadConfig

        fields = {"text_field": self.text_field, "text_column": self.text_column}
        return ReadConfig(**{**fields, "strict": self.strict, **overrides})

    def tokenizer_for(
        self, inputs: Any, workers: int | None = None, *, ctx: Any = None, **kw: Any
    ) -> Any:
        """`load_tokenizer(workers, **kw)`, or None for tokenized Parquet when `--tokenizer`
        was not given: it is read with the tokenizer it records (`pack`, `stats` and
        `tokenize` alike), and EOS / BOS options given are checked against the recorded ids
        (`tokenize.recorded.check_recorded_specials`; they were applied to `byte`, the default,
        and refused as another tokenizer even where they were the recorded ids). `ctx`: the
        command's click context, for a call from another thread (click's current context is
        the calling thread's). `--tokenizer-engine` given then encodes nothing: a `warning:`
        line, the same for the three commands (until 2026-12-07 only `stats` said so), and the
        same beside `--tokenizer` (only compared with the recorded one: until 2026-12-07 the
        engine was then dropped without a word)."""
        # --tokenizer-engine alone picks no tokenizer: it never changes ids (it loaded `byte`
        # for tokenized Parquet, refused as unlike the tokenizer the files record)
        given = explicit(ctx or click.get_current_context(), TOKENIZER_OPTIONS)
        engine = "tokenizer_engine" in given
        given = [n for n in given if n != "tokenizer_engine"]
        if "tokenizer" in given:
            # First thing, before any import it does not need (pyarrow's Parquet reader for
            # the inputs' footers): the engine's build is on pack's critical path. An engine
            # named beside it over tokenized Parquet is warned of where the tokenizer is
            # compared with the recorded one (`check_recorded_tokenizer`), not by reading
            # every input's footer here; named by the user, `auto` included.
            tokenizer = self.load_tokenizer(workers, **kw)
            if engine:
                tokenizer.engine_asked = self.tokenizer_engine
            return tokenizer
        from packtool.tokenize.recorded import check_recorded_specials, inputs_recorded

        recorded = inputs_recorded(inputs)
        if recorded is None:
            return self.load_tokenizer(workers, **kw)
        if given:
            where, identity = recorded
            check_recorded_specials(identity, self.special_options(), where)
        if engine:
            _engine_ignored()
        return None

    def special_options(self) -> dict[str, int | str | None]:
        """The EOS / BOS the options give, by `eos` / `bos`, as `load_tokenizer` takes them
        (an id, `default`, None for `--no-eos` / `--no-bos`), for those given only."""
        if self.no_eos and self.eos_id is not None:
            raise ConfigError("--eos-id and --no-eos contradict each other; pass one")
        if self.no_bos and self.bos_id is not None:
            raise ConfigError("--bos-id and --no-bos contradict each other; pass one")
        given: dict[str, int | str | None] = {}
        if self.no_eos or self.eos_id is not None:
            given["eos"] = None if self.no_eos else _special_id("--eos-id", self.eos_id)
        if self.no_bos or self.bos_id is not None:
            given["bos"] = None if self.no_bos else _special_id("--bos-id", self.bos_id)
        return given

    def load_tokenizer(self, workers: int | None = None, *, megatron: bool = False) -> Any:
        """A `packtool.tokenizer.tokenizers.Tokenizer` from --tokenizer and the special-token
        options (--eos-id / --no-eos, --bos-id / --no-bos). `megatron` (`--to megatron`): the
        default EOS is tokenizer_config.json's eos_token as it is (Megatron's end of document),
        and a note names the dtype of the `.bin`."""
        from packtool.tokenizer.specials import EOS_TOKEN
        from packtool.tokenizer.tokenizers import load_tokenizer

        given = self.special_options()
        eos = given.get("eos", "default")
        if megatron and eos == "default":
            eos = EOS_TOKEN
        bos = given.get("bos", "auto")
        tok = load_tokenizer(
            self.tokenizer, eos=eos, bos=bos, workers=workers, engine=self.tokenizer_engine
        )
        # Tokenized Parquet takes the EOS / BOS it records for those not given here
        # (packtool/tokenize/recorded.py); megatron's EOS_TOKEN is no choice of the user's
        tok.chosen_specials = tuple(given)
        # What the user named (an id or `default`: pre-tokenized ids refuse either, which
        # would add nothing; `default` got through silently). `--eos-id default` too, which
        # load_tokenizer cannot tell from its default
        tok.given_ids = {w: v for w, v in given.items() if v is not None}
        dtype = tok.dtype
        if megatron:  # the .bin's dtype is Megatron's, not tokenized Parquet's; an id past
            from packtool.dataset.megatron import megatron_dtype  # int32's: refused, before

            dtype = megatron_dtype(tok.identity.vocab_size)  # any note
        if tok.file_note:
            echo(f"note: {tok.file_note}", err=True)
        if tok.engine_note:
            echo(f"note: {tok.engine_note}; encoding with {tok.identity.engine}", err=True)
        for flag, value in (("--eos-id", eos), ("--bos-id", bos)):
            if isinstance(value, int) and value >= tok.base_vocab:  # a typo costs a model a
                echo(  # vocabulary (and embedding) of that size: said, not silent
                    f"note: {flag} {value} is past the tokenizer's {tok.base_vocab:,} ids: the "
                    f"dataset's vocabulary becomes {tok.identity.vocab_size:,} "
                    f"({dtype} ids)",
                    err=True,
                )
        return tok


def _special_id(flag: str, value: str) -> int | str:
    """`--eos-id` / `--bos-id` as `load_tokenizer` takes it: an id or `default`. Only what
    --help lists is accepted (`auto`, the library's word for the unset --bos-id, passed
    silently; for --eos-id it failed in the library's words, naming no flag)."""
    if value == "default":
        return value
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ConfigError(f"{flag} must be a token id >= 0 or 'default', got {value!r}")
    return number


STORAGE_OPTIONS = click.option(
    "--storage-options",
    default=None,
    metavar="JSON",
    help="Options for s3:// gs:// az:// hf:// https:// URLs (fsspec's: e.g. "
    '\'{"anon": true}\', or per scheme \'{"s3": {"endpoint_url": "..."}}\', which override '
    "those); credentials and AWS_ENDPOINT_URL come from the usual environment. docs/remote.md.",
)
"""`--storage-options`, of every command that reads or writes a URL (`corpus_options`'s;
`storage_options` for a command without those)."""


def storage_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add `--storage-options` (`STORAGE_OPTIONS`) to a command that takes no `corpus_options`
    (`verify`, `inspect`: until 2026-12-06 only `PACKTOOL_STORAGE_OPTIONS` reached them); it is
    checked and set before the command runs, as there."""

    @functools.wraps(fn)
    def wrapper(*args: Any, storage_options: str | None, **kwargs: Any) -> Any:
        if storage_options is not None:
            _set_storage_options(storage_options)
        return fn(*args, **kwargs)

    return STORAGE_OPTIONS(wrapper)


def corpus_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the input/reader/tokenizer options; the command receives `corpus: CorpusOptions`."""
    options = [
        click.option(
            "--text-field", default="text", show_default=True, help="JSONL key with the text."
        ),
        click.option(
            "--text-column", default="text", show_default=True, help="Parquet column with the text."
        ),
        click.option(
            "--tokenizer",
            default="byte",
            show_default=True,
            help="byte | PATH/tokenizer.json (or hf:PATH) | FOLDER with tokenizer.json | "
            "PATH/tokenizer.model (SentencePiece; or a FOLDER with only that) | org/model "
            "(Hugging Face cache, else downloaded) | PATH.tiktoken | tiktoken:NAME",
        ),
        click.option(
            "--tokenizer-engine",
            default="auto",
            show_default=True,
            metavar="auto|NAME[,NAME]",
            help="What encodes: auto = the fastest engine that loads this tokenizer and gives "
            "the reference library's ids on a probe text (fastokens or gigatoken, else "
            "tokenizers / tiktoken / sentencepiece); or engine names tried in order. Ids never "
            "depend on it.",
        ),
        click.option(
            "--eos-id",
            default=None,
            metavar="ID|default",
            help="EOS id appended to every document (chat records: only recorded, their "
            "template writes the end of each turn; docs/sft.md) [default: the tokenizer's own].",
        ),
        click.option("--no-eos", is_flag=True, help="Append no EOS."),
        click.option(
            "--bos-id",
            default=None,
            metavar="ID|default",
            help="BOS id put before every document; default = the tokenizer's BOS token always "
            "[default: the tokenizer's own rule: what its tokenizer.json post-processor puts "
            "first, as transformers' tokenizer(text) does (Llama, Mistral: their BOS); a "
            "SentencePiece .model: its BOS; none for byte and tiktoken].",
        ),
        click.option("--no-bos", is_flag=True, help="Put no BOS before documents."),
        click.option(
            "--strict", is_flag=True, help="Stop at the first bad document instead of skipping it."
        ),
        STORAGE_OPTIONS,
    ]

    @functools.wraps(fn)
    def wrapper(
        *args: Any,
        text_field: str,
        text_column: str,
        tokenizer: str,
        eos_id: str | None,
        no_eos: bool,
        bos_id: str | None,
        no_bos: bool,
        strict: bool,
        tokenizer_engine: str,
        storage_options: str | None,
        **kwargs: Any,
    ) -> Any:
        if storage_options is not None:
            _set_storage_options(storage_options)
        for flag, value in (("--text-field", text_field), ("--text-column", text_column)):
            if not value:  # (the library's check names its parameter: `text_field`)
                raise ConfigError(f"{flag} must name a field, got ''")
        corpus = CorpusOptions(
            text_field,
            text_column,
            tokenizer,
            eos_id,
            no_eos,
            bos_id,
            strict,
            tokenizer_engine,
            no_bos,
        )
        from packtool.read.corpus import listings_kept

        with listings_kept():  # the command lists its inputs once, whoever asks for them
            inputs = kwargs.get("inputs")
            if inputs:
                _note_passed_over(inputs)
            return fn(*args, corpus=corpus, **kwargs)

    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def _note_passed_over(inputs: Any) -> None:
    """A line on stderr naming the files that folder inputs hold but are not read (another
    suffix), and one naming the folders that glob inputs match (a glob reads files): never
    passed over in silence."""
    from packtool.read.corpus import globbed_folders, passed_over

    _note(
        *passed_over(inputs),
        "file(s) in the input folders are not read",
        "a folder is read for its corpus files only (docs/tokenize.md, Inputs); pass others by "
        "name",
    )
    _note(
        *globbed_folders(inputs),
        "folder(s) matched by the input globs are not read",
        "a glob reads the files it matches, not what a folder it matches holds; match their "
        "files too ('d/**/*.jsonl') or give the folders",
    )


class NamedPath(click.Path):
    """`click.Path` that refuses an empty value: `""` (an unset shell variable) was read as the
    current folder ("index.json: missing", "plot file '.'", ".: cannot read the mixture file")."""

    def convert(self, value: Any, param: Any, ctx: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            self.fail("the path is empty (an unset shell variable?)", param, ctx)
        return super().convert(value, param, ctx)


def _note(count: int, examples: list[str], what: str, why: str) -> None:
    """`note: COUNT WHAT (EXAMPLES and N more): WHY` on stderr, where COUNT is not 0."""
    if count:
        more = f" and {count - len(examples)} more" if count > len(examples) else ""
        echo(f"note: {count:,} {what} ({', '.join(examples)}{more}): {why}", err=True)


def _set_storage_options(text: str) -> None:
    """`--storage-options`: checked here, handed on in the environment, so the worker
    processes of the local engine see it too (packtool/storage/remote.py)."""
    from packtool.storage.remote import OPTIONS_ENV, parse_options

    parse_options(text)
    os.environ[OPTIONS_ENV] = text


# --- fine-tuning records: `@sft_options` ---

_OPTIONS = (
    click.option(
        "--format",
        "data_format",
        type=click.Choice(FORMATS),
        default="auto",
        show_default=True,
        help="What the records are; auto: from the first record's fields (messages / "
        "conversations, prompt + completion, text). docs/sft.md.",
    ),
    click.option(
        "--train-on",
        type=click.Choice(TRAIN_ON),
        default="assistant",
        show_default=True,
        help="Chat and prompt/completion data: the loss on every assistant turn (the "
        "completion), on the last assistant turn, or on every token.",
    ),
    click.option(
        "--chat-template",
        metavar="FILE",
        help="A .jinja chat template, or a .json with a chat_template entry [default: the "
        "tokenizer's chat_template.jinja or tokenizer_config.json, beside its tokenizer.json].",
    ),
    click.option(
        "--render-processes",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="Processes that render chat templates (0: the main process) [default: one per "
        "core for inputs of 8 MiB or more whose template needs turn masks]. The output is the "
        "same.",
    ),
    click.option(
        "--prompt-field", default="prompt", show_default=True, help="Prompt field / column."
    ),
    click.option(
        "--completion-field",
        default="completion",
        show_default=True,
        help="Completion field / column (the supervised part).",
    ),
    click.option(
        "--messages-field",
        metavar="NAME",
        help="Field / column of the conversation [default: messages or conversations].",
    ),
)


def sft_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add the fine-tuning input options; the command receives `sft: SFTConfig`."""

    @functools.wraps(fn)
    def wrapper(*args: Any, data_format: str, **kwargs: Any) -> Any:
        names = (
            "train_on", "chat_template", "render_processes", "prompt_field", "completion_field",
            "messages_field",
        )  # fmt: skip
        sft = SFTConfig(format=data_format, **{n: kwargs.pop(n) for n in names})
        return fn(*args, sft=sft, **kwargs)

    for option in reversed(_OPTIONS):
        wrapper = option(wrapper)
    return wrapper
