"""The fine-tuning input options of `tokenize`, `stats` and `pack` (click, like packtool/cli.py).

A second command-line module so that packtool/cli.py stays under the size every module keeps;
like cli.py it only parses options into a config (`packtool.sft_config.SFTConfig`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import click

from packtool.sft_config import FORMATS, TRAIN_ON, SFTConfig

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
