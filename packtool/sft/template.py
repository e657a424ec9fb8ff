"""Chat templates rendered the way transformers renders them, with jinja2 and nothing else.

A chat template is a jinja2 program (from a tokenizer's `tokenizer_config.json` or
`chat_template.jinja`, or a file given with `--chat-template`) that turns a conversation into one
string. transformers' `apply_chat_template` renders it in a particular environment, and the text
(and so the token ids) only match when every detail of that environment matches; this module
builds the same one:

- `jinja2.sandbox.ImmutableSandboxedEnvironment` (templates are untrusted code: no attribute
  tricks, no mutation of lists or dicts), with `trim_blocks=True` and `lstrip_blocks=True`;
- the `loopcontrols` extension (`{% break %}`, `{% continue %}`) and a `{% generation %}` block
  that records the character span of what it renders (the assistant's text), measured, like
  transformers, as the length of the output yielded so far when the block closes;
- globals `raise_exception(msg)` (a template error), `strftime_now(fmt)`, a `dict` that only
  builds dicts, and a `namespace` that refuses underscore-prefixed names; a `tojson` filter that
  does not HTML-escape (`json.dumps` with `ensure_ascii=False` and the indent/separators/
  sort_keys options);
- the variables: `messages`, `tools=None`, `documents=None`, `add_generation_prompt`, and the
  tokenizer's named special tokens as strings (`bos_token`, `eos_token`, `unk_token`,
  `sep_token`, `pad_token`, `cls_token`, `mask_token`, those that are set);
- messages normalised as transformers does: keys whose value is None are dropped, and a
  reasoning text under `reasoning_content`, `thinking` or `reasoning` is given under
  `reasoning_content` and `thinking` too.

Any exception a template raises while rendering one conversation (its own `raise_exception`, an
undefined variable used wrongly, a type error) becomes `TemplateFailure` with a one-line message:
callers count it as a skip of that conversation, or stop with `--strict`. A template that does not
compile is a `ConfigError` at load time.

The tokenizer_config.json reader here is deliberately small (the template and the special-token
strings); packtool/tokenizer/tokenizers.py may grow a general one, and this one can then defer to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from packtool.errors import ConfigError, MissingDependencyError, json_value, one_line, option_choice
from packtool.storage import local as storage
from packtool.tokenizer.files import load_tokenizer_config

GENERATION_RE = re.compile(r"\{\%-?\s*generation\s*-?\%\}")
"""How transformers tells that a template has `{% generation %}` blocks."""
SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The named special tokens transformers passes to every template (its `special_tokens_map`)."""
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
TEMPLATE_FILE = "chat_template.jinja"
CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE = option_choice("--chat-template", "chat_template", "FILE")
"""`--chat-template FILE / chat_template=FILE`: the CLI's option, the `SFTConfig` field."""


class TemplateFailure(Exception):
    """A template failed on one conversation (`raise_exception`, an undefined, a type error)."""


def _jinja() -> Any:
    try:
        import jinja2
    except ImportError:  # pragma: no cover - a dependency of packtool
        raise MissingDependencyError("chat templates need jinja2: pip install jinja2") from None
    return jinja2


@dataclass
class _Tracking:
    """The state of one render with `{% generation %}` tracking on."""

    length: int = 0
    """Characters yielded by the template so far."""
    spans: list[tuple[int, int]] = field(default_factory=list)


_TRACKING: ContextVar[_Tracking | None] = ContextVar("packtool_generation", default=None)


def _environment(watched: bool = False) -> Any:
    """A fresh sandboxed environment configured as transformers configures its own.

    `watched`: its `namespace`, `cycler` and `joiner` report reads and writes (see
    `namespace_class`).
    """
    jinja2 = _jinja()
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationBlock(Extension):
        """`{% generation %}...{% endgeneration %}`: renders its body, recording its span."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            call = self.call_method("_record", [])
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _record(self, caller: Any) -> str:
            text = caller()
            tracking = _TRACKING.get()
            if tracking is not None:  # the start is what the template has yielded so far
                tracking.spans.append((tracking.length, tracking.length + len(text)))
            return text

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            _plain(x),
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    class TemplateDict:
        """`dict(...)` and `dict.fromkeys(...)`, nothing else of the type."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = namespace_class(watched)
    if watched:
        env.globals.update(_watched_helpers())
    return env


def _watched_helpers() -> dict[str, Any]:
    """jinja2's `cycler` and `joiner`, reporting their state (`pos`, `used`) to the watcher of
    `namespace_class(watched=True)` as attributes of a namespace: beside `namespace`, the only
    objects a template can change in one loop and read after it (packtool/sft/turns.py)."""
    jinja2 = _jinja()
    watch = namespace_class(watched=True).watch

    def watching(base: type, state: str) -> type:
        class Watched(base):  # type: ignore[valid-type, misc]
            def __setattr__(self, name: str, value: Any) -> None:
                object.__setattr__(self, name, value)
                watcher = watch.get()
                if name == state and watcher is not None:
                    watcher.wrote(self, name, value)

            def __getattribute__(self, name: str) -> Any:
                value = object.__getattribute__(self, name)
                watcher = watch.get() if name == state else None
                if watcher is not None:
                    watcher.read(self, name, value)
                return value

        Watched.__name__ = base.__name__
        return Watched

    return {
        "cycler": watching(jinja2.utils.Cycler, "pos"),
        "joiner": watching(jinja2.utils.Joiner, "used"),
    }


_NAMESPACES: dict[bool, Any] = {}


def namespace_class(watched: bool = False) -> Any:
    """The `namespace` of templates: jinja2's, refusing names that start with an underscore.

    `watched=True`: the same, also reporting each read and write to the watcher set in
    `WatchedNamespace.watch` (packtool/sft/turns.py follows what crosses a loop that way).
    """
    if watched in _NAMESPACES:
        return _NAMESPACES[watched]
    jinja2 = _jinja()
    base = jinja2.utils.Namespace

    def check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore-prefixed attributes on a namespace, "
                f"got {name!r}"
            )

    class TemplateNamespace(base):
        def __init__(*args: Any, **kwargs: Any) -> None:
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                check(name)
            base.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            check(name)
            base.__setitem__(self, name, value)

    class WatchedNamespace(TemplateNamespace):
        watch: ContextVar[Any] = ContextVar("packtool_namespace_watch", default=None)

        def __init__(*args: Any, **kwargs: Any) -> None:
            self = args[0]
            TemplateNamespace.__init__(*args, **kwargs)
            watcher = WatchedNamespace.watch.get()
            if watcher is not None:
                for name, value in dict(*args[1:], **kwargs).items():
                    watcher.wrote(self, name, value)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace.__setitem__(self, name, value)
            watcher = WatchedNamespace.watch.get()
            if watcher is not None:
                watcher.wrote(self, name, value)

        def __getattribute__(self, name: str) -> Any:
            value = base.__getattribute__(self, name)
            if not name.startswith("_"):  # not jinja2's own `_Namespace__attrs`
                watcher = WatchedNamespace.watch.get()
                if watcher is not None:
                    watcher.read(self, name, value)
            return value

    _NAMESPACES[False] = TemplateNamespace
    _NAMESPACES[True] = WatchedNamespace
    return _NAMESPACES[watched]


def _plain(x: Any) -> Any:
    """What `tojson` serialises: lists for any list-like packtool passes (see chat_turns)."""
    to_plain = getattr(x, "__packtool_plain__", None)
    return to_plain() if to_plain is not None else x


def normalize_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as transformers hands them to a template (None values dropped, reasoning aliased).

    Raises:
        TemplateFailure: a message is not a JSON object.
    """
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise TemplateFailure(f"a message is a {type(message).__name__}, not an object")
        m = {k: v for k, v in message.items() if v is not None}
        reasoning = next((m[k] for k in REASONING_FIELDS if m.get(k) is not None), None)
        if reasoning is not None:
            m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
        out.append(m)
    return out


@dataclass(frozen=True)
class Rendered:
    """One rendered conversation."""

    text: str
    spans: tuple[tuple[int, int], ...] = ()
    """Character spans of the `{% generation %}` blocks, in the order they closed."""


class ChatTemplate:
    """A compiled chat template and the variables it is rendered with.

    Args:
        source: the jinja2 source.
        special_tokens: the tokenizer's named special tokens as strings (`bos_token`, ...);
            others are refused (they are not what transformers passes).
        name: where the template came from, for messages.

    Raises:
        ConfigError: the source does not compile, or an unknown special-token name.
    """

    def __init__(
        self, source: str, *, special_tokens: Mapping[str, str] | None = None, name: str = ""
    ) -> None:
        jinja2 = _jinja()
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"chat template {name or '(given)'} is empty")
        special = dict(special_tokens or {})
        unknown = sorted(set(special) - set(SPECIAL_TOKEN_NAMES))
        if unknown:
            raise ConfigError(
                f"unknown special token name {unknown[0]!r} (known: {', '.join(SPECIAL_TOKEN_NAMES)})"
            )
        self.source = source
        self.name = name or "chat template"
        self.special_tokens = {k: str(v) for k, v in special.items() if v is not None}
        self.environment = _environment()
        try:
            self.template = self.environment.from_string(source)
        except jinja2.exceptions.TemplateSyntaxError as exc:
            raise ConfigError(
                f"{self.name}: not a valid jinja2 template (line {exc.lineno}: {exc.message})"
            ) from None
        self.has_generation = GENERATION_RE.search(source) is not None
        self.sha256 = hashlib.sha256(source.encode("utf-8")).hexdigest()
        self._watched: Any = None
        self._globals = {id(self.template): dict(self.template.globals)}

    @property
    def watched(self) -> Any:
        """The same template compiled with a watched `namespace` (packtool/sft/turns.py)."""
        if self._watched is None:
            self._watched = _environment(watched=True).from_string(self.source)
            self._globals[id(self._watched)] = dict(self._watched.globals)
        return self._watched

    def blocks(self, compiled: Any, variables: dict[str, Any]) -> Iterator[str]:
        """What `compiled.generate(variables)` yields (`compiled`: `template` or `watched`).

        The same context jinja2 builds, without copying the template's globals out of their
        `ChainMap` at every render (an eighth of a render's time); exceptions come as raised.
        """
        from jinja2.runtime import new_context

        globals_ = self._globals[id(compiled)]
        ctx = new_context(
            compiled.environment, compiled.name, compiled.blocks, {**globals_, **variables}, True,
            globals_,
        )  # fmt: skip
        return compiled.root_render_func(ctx)

    def variables(self, messages: Any, add_generation_prompt: bool) -> dict[str, Any]:
        return {
            "messages": messages,
            "tools": None,
            "documents": None,
            "add_generation_prompt": add_generation_prompt,
            **self.special_tokens,
        }

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        add_generation_prompt: bool = False,
        track: bool = False,
    ) -> Rendered:
        """Render one conversation (already normalised, see `normalize_messages`).

        Args:
            messages: the conversation.
            add_generation_prompt: end with the header that opens an assistant turn.
            track: record the `{% generation %}` spans (as `return_assistant_tokens_mask`).

        Raises:
            TemplateFailure: the template failed on this conversation.
        """
        variables = self.variables(messages, add_generation_prompt)
        if not track:
            try:
                return Rendered("".join(self.blocks(self.template, variables)))
            except Exception as exc:  # the template is user code: any failure is its failure
                raise TemplateFailure(failure_message(exc)) from None
        tracking = _Tracking()
        token = _TRACKING.set(tracking)
        blocks: list[str] = []
        try:
            for block in self.blocks(self.template, variables):
                blocks.append(block)
                tracking.length += len(block)
        except Exception as exc:
            raise TemplateFailure(failure_message(exc)) from None
        finally:
            _TRACKING.reset(token)
        return Rendered("".join(blocks), tuple(tracking.spans))


def failure_message(exc: BaseException) -> str:
    """One line naming what a template raised."""
    text = one_line(exc) or type(exc).__name__
    kind = type(exc).__name__
    return text if kind == "TemplateError" else f"{kind}: {text}"


# --- where a template comes from -----------------------------------------------------------


def _token_string(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string, an AddedToken dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def special_tokens_of(config: Mapping[str, Any] | None) -> dict[str, str]:
    """The named special tokens a tokenizer_config.json sets (strings)."""
    out = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = _token_string((config or {}).get(name))
        if value is not None:
            out[name] = value
    return out


def _pick(value: Any, where: str) -> str:
    """A config's `chat_template`: a string, or a list of `{name, template}` (the "default")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        if isinstance(named.get("default"), str):
            return named["default"]
        raise ConfigError(
            f"{where}: chat_template lists {', '.join(map(str, named)) or 'nothing'} but no "
            f"'default' template; pass {CHAT_TEMPLATE}"
        )
    raise ConfigError(f"{where}: chat_template is a {type(value).__name__}, not a template")


def load_chat_template(
    template: str | os.PathLike | None = None,
    *,
    tokenizer_dir: str | os.PathLike | None = None,
    special_tokens: Mapping[str, str] | None = None,
) -> ChatTemplate:
    """The chat template to render with, and the special tokens it sees.

    Args:
        template: a `.jinja` (or any text) file holding the template, or a `.json` file with a
            `chat_template` entry (a tokenizer_config.json: its special tokens too, merged with
            a `special_tokens_map.json` beside it). None: the tokenizer's own.
        tokenizer_dir: the folder of the tokenizer's `tokenizer.json`: its `chat_template.jinja`,
            else the `chat_template` of its `tokenizer_config.json`; its special tokens come from
            that `tokenizer_config.json` in either case, merged with `special_tokens_map.json`
            as transformers merges them (`packtool.tokenizer.files.load_tokenizer_config`).
        special_tokens: special-token strings that override the config's (`bos_token`, ...).

    Raises:
        ConfigError: no template anywhere (the message says where it looked), or a bad one.
    """
    # tokenizer_config.json merged with special_tokens_map.json as transformers merges them:
    # the one reader of both files, for the ids and for what templates see
    config = load_tokenizer_config(tokenizer_dir) if tokenizer_dir is not None else None
    settings = config.data if config is not None else None
    tokens = {**special_tokens_of(settings), **(special_tokens or {})}
    if template is not None:
        path = storage.as_path(template)
        if storage.is_dir(path):
            raise ConfigError(
                f"chat template {str(path)!r} is a folder; pass the template file (a .jinja, or "
                "the tokenizer_config.json or chat_template.json holding it)"
            )
        if not storage.is_file(path):
            raise ConfigError(f"chat template file {str(path)!r} does not exist")
        try:
            text = storage.read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read the chat template ({exc})") from None
        if path.suffix.lower() == ".json":
            try:
                data = json_value(text)
            except ValueError as exc:
                raise ConfigError(f"{path}: not valid JSON ({exc})") from None
            if not isinstance(data, dict) or "chat_template" not in data:
                raise ConfigError(f"{path}: has no chat_template entry")
            beside = load_tokenizer_config(path.parent) if path.name == CONFIG_FILE else None
            tokens = {**special_tokens_of(beside.data if beside else data), **tokens}
            text = _pick(data["chat_template"], str(path))
        return ChatTemplate(text, special_tokens=tokens, name=str(path))
    if tokenizer_dir is None:
        raise ConfigError(
            f"chat inputs need a chat template: pass {CHAT_TEMPLATE}, or a tokenizer "
            f"({option_choice('--tokenizer', 'tokenizer', 'PATH')}) whose folder has "
            "tokenizer_config.json with a chat_template"
        )
    folder = storage.as_path(tokenizer_dir)
    jinja_file = folder / TEMPLATE_FILE
    if storage.is_file(jinja_file):
        return ChatTemplate(
            storage.read_text(jinja_file), special_tokens=tokens, name=str(jinja_file)
        )
    if config is not None and config.chat_template is not None:
        where = str(config.path)
        return ChatTemplate(_pick(config.chat_template, where), special_tokens=tokens, name=where)
    raise ConfigError(
        f"no chat template for the tokenizer in {folder} (looked for {TEMPLATE_FILE} and a "
        f"chat_template in {CONFIG_FILE}); pass {CHAT_TEMPLATE}"
    )
