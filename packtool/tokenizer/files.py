"""Tokenizer names as people write them, resolved to files; `tokenizer_config.json` read once.

`resolve(spec)` turns what a user passes to `--tokenizer` into a `TokenizerFiles`:

- `tiktoken:NAME` / `tiktoken:PATH` / `PATH.tiktoken`: a tiktoken encoding or ranks file;
- `PATH/tokenizer.json` (or any existing file, or `hf:PATH`): a Hugging Face tokenizer file,
  with the `tokenizer_config.json` beside it when there is one;
- a folder holding `tokenizer.json` (+ `tokenizer_config.json`);
- `PATH.model` (or Mistral's `PATH.model.vN`), or a folder holding `tokenizer.model` and no
  `tokenizer.json`: a SentencePiece model, encoded by `sentencepiece` itself;
- `org/model` (optionally `org/model@REVISION`): a Hugging Face Hub repository, found the way
  `transformers` finds it: in the local cache first (`HF_HUB_CACHE`, else `HF_HOME/hub`, else
  `~/.cache/huggingface/hub`, layout `models--org--model/{refs/REV, snapshots/<commit>/}`), so it
  works offline; otherwise downloaded with `huggingface_hub` (imported only then) unless
  `HF_HUB_OFFLINE` is set. When neither works the error names both ways.

`load_tokenizer_config(folder)` reads `tokenizer_config.json` (and the legacy
`special_tokens_map.json`) as `transformers` does; it is the one place that file is parsed, so
whatever else needs it (EOS/BOS defaults now, chat templates later) calls this.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.errors import ConfigError, json_value, one_line, option_choice
from packtool.storage import hub
from packtool.storage import local as storage

CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
_VERSIONED_MODEL = re.compile(r"\.model\.v\d+(?:m\d+)?$")
"""A SentencePiece model under Mistral's versioned names (`tokenizer.model.v3`,
`mistral_instruct_tokenizer_240216.model.v2`, `tokenizer.model.v7m1`), as its Hub repositories
and mistral-common ship them: read as a tokenizer.json, they were "cannot read the tokenizer
file ('utf-8' codec can't decode ...)", which reads as a damaged file."""


def _sentencepiece_name(path: Any) -> bool:
    """A name that says SentencePiece model: `.model`, or Mistral's `.model.vN`."""
    return path.suffix == ".model" or _VERSIONED_MODEL.search(path.name) is not None


CHAT_TEMPLATE_FILE = "chat_template.jinja"
HUB_FILES = (TOKENIZER_FILE, CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE, CHAT_TEMPLATE_FILE)
"""What a hub download fetches: the tokenizer and its chat template, nothing of the model."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*(@[\w./-]+)?$")
_FORMS = (
    "use 'byte', a tokenizer.json path or URL (or hf:PATH), a folder holding tokenizer.json, a "
    "SentencePiece PATH.model (or a folder holding tokenizer.model), a Hugging Face repository "
    "id (org/model), 'tiktoken:NAME' (e.g. tiktoken:gpt2) or PATH.tiktoken"
)


@dataclass(frozen=True)
class TokenizerConfig:
    """`tokenizer_config.json` (merged with `special_tokens_map.json` as transformers does)."""

    path: Path
    """The file read (`tokenizer_config.json`, or `special_tokens_map.json` when alone)."""
    data: dict[str, Any] = field(default_factory=dict)
    from_map: frozenset[str] = frozenset()
    """Keys whose value is `special_tokens_map.json`'s (it overrode or added them)."""

    def file_of(self, key: str) -> str:
        """The file `key`'s value was read from, for summaries."""
        return SPECIAL_TOKENS_MAP_FILE if key in self.from_map else CONFIG_FILE

    def token(self, key: str) -> str | None:
        """The content of a special token entry (`eos_token`, `bos_token`, ...), or None.

        Entries are strings or serialized `AddedToken`s (`{"content": "</s>", ...}`).
        """
        value = self.data.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        return value if isinstance(value, str) and value else None

    @property
    def eos_token(self) -> str | None:
        return self.token("eos_token")

    @property
    def bos_token(self) -> str | None:
        return self.token("bos_token")

    @property
    def chat_template(self) -> Any:
        """The chat template(s) as stored: a string, a list of named templates, or None."""
        return self.data.get("chat_template")


@dataclass(frozen=True)
class TokenizerFiles:
    """What a `--tokenizer` spec names, on disk."""

    kind: str
    """`hf` (a tokenizer.json), `tiktoken` or `sentencepiece` (a `.model` file)."""
    path: Path | None
    """The tokenizer.json or ranks file; None for a tiktoken encoding name."""
    name: str
    """The name recorded in the tokenizer identity (what the user passed, or the file)."""
    config: TokenizerConfig | None = None
    encoding: str | None = None
    """`tiktoken:NAME`: the encoding name (tiktoken's own cache)."""


def _read_json(path: Path) -> Any:
    try:
        return json_value(storage.read_text(path))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise ConfigError(
            f"{path}: not a readable JSON file ({one_line(why, 200)}); fix or remove it"
        ) from None


def load_tokenizer_config(folder: str | os.PathLike) -> TokenizerConfig | None:
    """Read `folder/tokenizer_config.json` the way `transformers` (v4 and v5) does.

    A config that lists `added_tokens_decoder` (every config `transformers` has written since
    v4.34) is used as it is; an older one is overridden by `special_tokens_map.json`, key by
    key, as transformers' legacy path does. None when neither file is there.

    Raises:
        ConfigError: a file that is there but is not a JSON object.
    """
    folder = storage.as_path(folder)
    cfg_path, map_path = folder / CONFIG_FILE, folder / SPECIAL_TOKENS_MAP_FILE
    data: dict[str, Any] = {}
    path = None
    from_map: frozenset[str] = frozenset()
    if storage.is_file(cfg_path):
        data = _read_json(cfg_path)
        if not isinstance(data, dict):
            raise ConfigError(f"{cfg_path}: expected a JSON object, found {type(data).__name__}")
        path = cfg_path
    if storage.is_file(map_path) and "added_tokens_decoder" not in data:
        extra = _read_json(map_path)
        if not isinstance(extra, dict):
            raise ConfigError(f"{map_path}: expected a JSON object, found {type(extra).__name__}")
        data = {**data, **extra}
        from_map = frozenset(extra)
        path = path or map_path
    return TokenizerConfig(path=path, data=data, from_map=from_map) if path is not None else None


def hub_cache() -> Path:
    """The Hugging Face Hub cache folder, chosen as `huggingface_hub` chooses it."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var]).expanduser()
    home = os.environ.get("HF_HOME")
    if not home:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
        home = os.path.join(xdg, "huggingface")
    return Path(home).expanduser() / "hub"


def _offline() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def cached_snapshot(repo_id: str, revision: str = "main", cache: Path | None = None) -> Path | None:
    """The cached snapshot folder of `repo_id` at `revision` holding tokenizer.json, or None.

    `revision` is a branch or tag (`refs/<revision>` holds the commit) or a commit hash.
    """
    repo = (cache or hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    ref = repo / "refs" / revision
    try:
        commit = storage.read_text(ref).strip() if storage.is_file(ref) else revision
    except OSError:
        return None
    snapshot = repo / "snapshots" / commit
    return snapshot if storage.is_file(snapshot / TOKENIZER_FILE) else None


def download_snapshot(repo_id: str, revision: str) -> Path:
    """Download the tokenizer files of `repo_id` into the cache; their snapshot folder.

    Raises:
        OSError, ImportError, or huggingface_hub's errors: the caller words them.
    """
    from huggingface_hub import snapshot_download  # a transformers/datasets dependency

    return Path(snapshot_download(repo_id, revision=revision, allow_patterns=list(HUB_FILES)))


def _hub_files(spec: str, repo_id: str, revision: str) -> TokenizerFiles:
    cache = hub_cache()
    snapshot = cached_snapshot(repo_id, revision, cache)
    if snapshot is None:
        why = ""
        if _offline():
            why = "HF_HUB_OFFLINE is set"
        else:
            try:
                snapshot = download_snapshot(repo_id, revision)
            except ImportError:
                why = "huggingface_hub is not installed (pip install huggingface_hub)"
            except Exception as exc:  # network, authentication, unknown repository
                why = f"{type(exc).__name__}: {one_line(exc, 160)}"
        if snapshot is not None and not storage.is_file(snapshot / TOKENIZER_FILE):
            raise ConfigError(
                f"tokenizer {spec!r}: the repository has no {TOKENIZER_FILE}, the file packtool "
                "reads from a Hub id; for a SentencePiece-only repository download its "
                "tokenizer.model and pass that file (or its folder) as the tokenizer: "
                + option_choice("--tokenizer", "tokenizer", "PATH")
            )
        if snapshot is None:
            raise ConfigError(
                f"tokenizer {spec!r}: not in the Hugging Face cache ({cache}) and not downloaded "
                f"({why}); either run `hf download {repo_id} {' '.join(HUB_FILES)}` (huggingface_hub "
                "before 0.34: `huggingface-cli download`) where there is network (then copy the cache here, or set HF_HUB_CACHE), or pass "
                "the path of a folder holding tokenizer.json"
            )
    return TokenizerFiles(
        kind="hf",
        path=snapshot / TOKENIZER_FILE,
        name=spec,
        config=load_tokenizer_config(snapshot),
    )


def _remote(url: str) -> TokenizerFiles:
    """A tokenizer.json in a bucket (`s3://.../tokenizer.json`, or the folder holding it): read
    through the storage seam, its text shipped to the workers with the tokenizer, as a local
    one's. A `.model` or `.tiktoken` file there is refused: their engines open a local file."""
    path = storage.as_path(url.rstrip("/"))
    if storage.is_dir(path):
        path = path / TOKENIZER_FILE
    if path.suffix == ".tiktoken" or _sentencepiece_name(path):
        kind = "SentencePiece model" if _sentencepiece_name(path) else ".tiktoken file"
        raise ConfigError(
            f"tokenizer {url!r}: a {kind} is read from local disk only; copy it "
            "here first (a tokenizer.json can be read from a bucket)"
        )
    if not storage.is_file(path):
        raise ConfigError(f"tokenizer file {url!r} does not exist")
    return TokenizerFiles(
        kind="hf", path=path, name=str(path), config=load_tokenizer_config(path.parent)
    )


def resolve(spec: str) -> TokenizerFiles:
    """Where the tokenizer named `spec` is (see the module docstring); `byte` is not handled.

    Raises:
        ConfigError: a missing file, a folder without tokenizer.json, a hub id that is neither
            cached nor downloadable, or a spec of no known form.
    """
    if spec.startswith("tiktoken:"):
        target = spec.removeprefix("tiktoken:")
        path = Path(target)
        if path.suffix == ".tiktoken" or storage.is_file(path):
            if not storage.is_file(path):
                raise ConfigError(f"tiktoken ranks file {target!r} does not exist")
            return TokenizerFiles(kind="tiktoken", path=path, name=str(path))
        return TokenizerFiles(kind="tiktoken", path=None, name=target, encoding=target)
    if hub.is_hub(spec):  # an hf:// URL (any case): the Hub's file, not `hf:` + a path
        return _remote(spec)
    explicit_hf = spec.startswith("hf:")
    target = spec.removeprefix("hf:")
    if storage.is_remote(target) and not hub.is_hub(target):  # `hf:hf://...`: a local path
        return _remote(target)
    path = Path(target)
    if storage.is_dir(path):
        file = path / TOKENIZER_FILE
        model = path / SENTENCEPIECE_FILE
        if not storage.is_file(file) and storage.is_file(model) and not explicit_hf:
            return TokenizerFiles(
                kind="sentencepiece",
                path=model,
                name=str(model),
                config=load_tokenizer_config(path),
            )
        if not storage.is_file(file) and storage.is_file(model):  # `hf:` asked for the json
            raise ConfigError(
                f"tokenizer folder {str(path)!r} has no {TOKENIZER_FILE}, only a SentencePiece "
                f"{SENTENCEPIECE_FILE}: drop the 'hf:' to load it"
            )
        if not storage.is_file(file):
            raise ConfigError(
                f"tokenizer folder {str(path)!r} has no {TOKENIZER_FILE} (nor {SENTENCEPIECE_FILE}); "
                "pass a folder that holds one (as transformers' save_pretrained writes it) or the "
                "file itself"
            )
        return TokenizerFiles(
            kind="hf", path=file, name=str(file), config=load_tokenizer_config(path)
        )
    if storage.is_file(path):
        if path.suffix == ".tiktoken" and not explicit_hf:
            return TokenizerFiles(kind="tiktoken", path=path, name=str(path))
        if _sentencepiece_name(path) and not explicit_hf:
            return TokenizerFiles(
                kind="sentencepiece",
                path=path,
                name=str(path),
                config=load_tokenizer_config(path.parent),
            )
        return TokenizerFiles(
            kind="hf", path=path, name=str(path), config=load_tokenizer_config(path.parent)
        )
    if path.suffix == ".tiktoken":
        raise ConfigError(f"tiktoken ranks file {target!r} does not exist")
    if _sentencepiece_name(path):
        raise ConfigError(f"SentencePiece model {target!r} does not exist")
    if path.suffix == ".json" or explicit_hf:  # `hf:` forces a local path (never the Hub)
        raise ConfigError(f"tokenizer file {target!r} does not exist")
    if _HUB_ID.match(target):
        repo_id, _, revision = target.partition("@")
        return _hub_files(target, repo_id, revision or "main")
    raise ConfigError(f"unknown tokenizer {spec!r}; {_FORMS}")
