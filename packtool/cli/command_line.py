"""The command line as a run records it, with what may be a secret hidden.

`pack` writes its command into `index.json` ("command": uploaded with the dataset, left in a
bucket) and every writing command into its output's lock record, which a second writer is
shown. `--storage-options` carries credentials (`{"hf": {"token": ...}}`): they were written
there verbatim. `recorded()` replaces with `REDACTED`:

- the value of `--storage-options` (`--storage-options X` and `--storage-options=X`);
- in any argument, a URL's user and password (`https://user:pw@host/...`) and the value of a
  query parameter that signs or authorises (`?sig=`, `X-Amz-Signature=`, `access_token=`);
- in any argument, the value of `NAME=VALUE` (and of a URL's `?NAME=`) where NAME contains a
  secret's word (`HF_TOKEN=...` in `--slurm-setup`, `PGPASSWORD=`, `APITOKEN=`,
  `AWS_SECRET_ACCESS_KEY=...` in `--sbatch-arg=--export=...`, `?authtoken=`; `donkey=` too),
  except a plural count (`MAX_TOKENS=`, `NUM_KEYS=`) and a path's folder
  `s3://b/t/partition_key=3/`;
- in any argument, a bare Hugging Face token (`hf_` and 20 or more letters or digits) and
  the value after `Bearer `.

A command with a secret hidden cannot be rerun as recorded: `engines.config.resume_command`
then says "the same command with --resume" in words.

Records in: argv. Out: the command line as one shell-quoted string.
May import: nothing of packtool.
"""

from __future__ import annotations

import contextvars
import re
import shlex
import sys
from collections.abc import Sequence

REDACTED = "<redacted>"
"""As `engines.config.REDACTED`, which a resume line looks for (kept equal by a test)."""
SECRET_OPTIONS = ("--storage-options",)
"""Options whose whole value is hidden."""
_SECRET_WORD = (
    r"(?:token|secret|passw(?:or)?d|pass|pwd|key|credential|auth|sig(?:nature)?|bearer|cookie"
    r"|private|(?<![a-z])pat(?![a-z]))"
)
"""A secret's word, any case, anywhere in a NAME: `HF_TOKEN`, `PGPASSWORD`, `APITOKEN`,
`SECRETKEY`, `GITHUB_PAT` (not `PATH`); `donkey` is hidden too (missing a secret costs more
than hiding a harmless value), `TOKENIZERS_PARALLELISM` and `AUTHOR` are not (`_HARMLESS`)."""
_PLURAL_COUNT = re.compile(r"(?:\w*_)?(?:tokens|keys)", re.IGNORECASE)
"""A harmless shape: a plural count (`MAX_TOKENS`, `MAX_NEW_TOKENS`, `NUM_KEYS`), kept where
what comes before the plural names no secret (`API_KEYS`, `SECRET_KEYS` are hidden)."""
_SECRET_BEFORE = re.compile(rf"{_SECRET_WORD}|api|access", re.IGNORECASE)
_SECRET_WORD_RE = re.compile(_SECRET_WORD, re.IGNORECASE)
_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s?#]+@")
"""`scheme://user:password@`: a revision (`hf://datasets/org/name@main`) has a `/` before it."""
_QUERY = re.compile(rf"([?&]([\w.-]*{_SECRET_WORD}[\w.-]*)=)[^&#\s]*", re.IGNORECASE)
_ASSIGNED = re.compile(
    rf"((?<![\w/-])(\w*{_SECRET_WORD}\w*)=)(?:\"[^\"]*\"|'[^']*'|[^\s,;&])*",
    re.IGNORECASE,
)
"""`NAME=VALUE` with a secret's NAME; an option (`--tokenizer=x`) is preceded by `-`, a
folder of a path (`s3://b/t/partition_key=3/`, Hive's partitions) by `/`: neither is hidden."""
_BARE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|(?<=\bBearer )[^\s'\"]+", re.IGNORECASE)
"""A Hugging Face token anywhere (`huggingface-cli login --token hf_...`), `Bearer VALUE`."""


_HARMLESS = re.compile(r"tokeniz(?:ers?|ation|ed)?|author|passes|passage|design", re.IGNORECASE)
"""Words that hold a secret's word and name none (`TOKENIZERS_PARALLELISM`, HF's common
setting: hiding it cost a Slurm run its copyable --resume line)."""


def _count(name: str) -> bool:
    """Whether NAME names no secret: a plural count (`_PLURAL_COUNT`), or a secret's word only
    inside a harmless word (`_HARMLESS`)."""
    if _SECRET_WORD_RE.search(_HARMLESS.sub("", name)) is None:
        return True
    if not _PLURAL_COUNT.fullmatch(name):
        return False
    before = name[: -len("tokens")] if name.lower().endswith("tokens") else name[: -len("keys")]
    return _SECRET_BEFORE.search(before) is None


def _hide(match: re.Match[str]) -> str:
    return match[0] if _count(match[2]) else f"{match[1]}{REDACTED}"


ARGS: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("args", default=None)
"""The arguments `main` was given, per thread (two runs at once record their own)."""


def recorded() -> str:
    """`packtool ARGS` as `main` was given them (`ARGS`), not the argv of a program that called
    it, secrets hidden (`redacted`)."""
    given = ARGS.get()
    return shlex.join(["packtool", *redacted(sys.argv[1:] if given is None else given)])


def redacted(args: Sequence[str]) -> list[str]:
    """`args` with each secret replaced by `REDACTED` (see the module's docstring)."""
    out: list[str] = []
    hide = False
    for arg in args:
        if hide:
            out.append(REDACTED)
            hide = False
            continue
        name, joined, _ = arg.partition("=")
        if name in SECRET_OPTIONS:
            out.append(f"{name}={REDACTED}" if joined else arg)
            hide = not joined
            continue
        out.append(_hidden(arg))
    return out


def _hidden(arg: str) -> str:
    arg = _USERINFO.sub(rf"\g<1>{REDACTED}@", arg)
    arg = _QUERY.sub(_hide, arg)
    arg = _ASSIGNED.sub(_hide, arg)
    return _BARE.sub(REDACTED, arg)
