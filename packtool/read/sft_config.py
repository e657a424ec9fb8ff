"""How fine-tuning inputs are read: the kind of dataset, its field names, where the loss goes.

A light module (no jinja2, no pyarrow) so that `packtool.read.corpus.ReadConfig` can carry an
`SFTConfig` and every engine, the resume fingerprint and the Ray workers get it with the rest of
the reading options. What the kinds mean is in packtool/sft/inputs.py and docs/sft.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from packtool.errors import ConfigError

TEXT = "text"
PROMPT_COMPLETION = "prompt-completion"
MESSAGES = "messages"
SHAREGPT = "sharegpt"
TOKENIZED = "tokenized"
FORMATS = ("auto", TEXT, PROMPT_COMPLETION, MESSAGES, SHAREGPT, TOKENIZED)
"""`--format`: `auto` detects the kind from the first record's fields."""
SFT_KINDS = (PROMPT_COMPLETION, MESSAGES, SHAREGPT)
"""The kinds that packtool turns into token ids with a loss mask."""
CHAT_KINDS = (MESSAGES, SHAREGPT)
TRAIN_ON = ("assistant", "last", "all")
"""`--train-on`: every assistant turn (the completion), the last one, or every token."""


def check_train_on(train_on: object) -> None:
    """Raise ConfigError unless `train_on` is one of `TRAIN_ON` (the one check every entry point
    uses: `SFTConfig`, `Renderer`, hence `encode_chat`)."""
    if not isinstance(train_on, str) or train_on not in TRAIN_ON:
        raise ConfigError(f"train_on {train_on!r} is unknown; choose one of {', '.join(TRAIN_ON)}")


@dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """The fine-tuning part of `ReadConfig`."""

    format: str = "auto"
    """One of `FORMATS`."""
    prompt_field: str = "prompt"
    """prompt-completion: the field (JSONL) / column (Parquet) of the prompt."""
    completion_field: str = "completion"
    """prompt-completion: the field of the completion (the supervised part)."""
    messages_field: str | None = None
    """messages / sharegpt: the field holding the conversation (None: `messages` or
    `conversations`, whichever a record has)."""
    train_on: str = "assistant"
    """One of `TRAIN_ON`."""
    chat_template: str | None = None
    """A chat template file (`.jinja`, or a `.json` with a `chat_template` entry); None: the
    tokenizer's own (`chat_template.jinja` or `tokenizer_config.json` beside its
    tokenizer.json)."""
    render_processes: int | None = None
    """Worker processes that render chat templates (packtool/sft/render.py): None: one per core
    when there are two or more, the input holds at least `chat_render.POOL_MIN_BYTES` and the
    template needs turn masks (`chat_render.pool_pays`), else the main process; 0: the main
    process. The output is the same either way."""

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ConfigError(
                f"format {self.format!r} is unknown; choose one of {', '.join(FORMATS)}"
            )
        check_train_on(self.train_on)
        for name in ("prompt_field", "completion_field"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ConfigError(f"{name} must be a non-empty string, got {getattr(self, name)!r}")
        if self.prompt_field == self.completion_field:
            raise ConfigError(f"prompt_field and completion_field are both {self.prompt_field!r}")
        if self.messages_field is not None and not self.messages_field:
            raise ConfigError("messages_field must be a non-empty string or None")
        if self.render_processes is not None and (
            isinstance(self.render_processes, bool)
            or not isinstance(self.render_processes, int)
            or self.render_processes < 0
        ):
            raise ConfigError(
                f"render_processes must be None or an integer >= 0, got {self.render_processes!r}"
            )
        if self.chat_template is not None and not self.chat_template:
            raise ConfigError("chat_template must be a file name or None")

    def conversation_fields(self, kind: str | None = None) -> tuple[str, ...]:
        """The field names a conversation may be under, for `kind` (None: any chat kind)."""
        if self.messages_field is not None:
            return (self.messages_field,)
        if kind == SHAREGPT:
            return ("conversations", "messages")
        return ("messages", "conversations")
