"""The command line as a run records it, with what may be a secret hidden.

`pack` writes its command into `index.json` ("command": uploaded with the dataset, left in a
bucket) and every writing command into its output's lock record, which a second writer is
shown. `--storage-options` carries credentials (`{"hf": {"token": ...}}`): they were written
there verbatim. `recorded()` replaces with `REDACTED`:

- the value of `--storage-options` (`--storage-options X` and `--storage-options=X`);
- in any argument, a URL's user and password (`https://user:pw@host/...`) and the value of a
  query parameter that signs or authorises (`?sig=`, `X-Amz-Signature=`, `access_token=`);
- in any argument, the value of `NAME=VALUE` (and of a URL's `?NAME=`) where NAME (letters,
  digits, `_`, `-`) contains a secret's word (`HF_TOKEN=...` in `--slurm-setup`, `PGPASSWORD=`,
  `APITOKEN=`, `HF-TOKEN=`, `--hf-token=`, `AWS_SECRET_ACCESS_KEY=...` in
  `--sbatch-arg=--export=...`, `?authtoken=`; `donkey=` too), a comma-separated list whole
  (`GITHUB_TOKENS=a,b`) up to the next `NAME=` (`--export=ALL,HF_TOKEN=x,PATH=/bin`), except a
  count and a path's folder `s3://b/t/partition_key=3/`;
- the value after an option whose name contains a secret's word, as the next argument
  (`--password VALUE`) or inside one argument (`--slurm-setup "x --token VALUE"`), unless that
  value is itself a long option (starts with `--`: `--no-auth --resume`, a flag) or the option
  is a count; a value that starts with one `-` (`--password -hunter2`, and so `--no-auth -v`
  too) is hidden: a secret may start with `-`, a short option after a flag costs only the
  copyable resume line;
- a value's backslash-escaped characters are part of it (`HF_TOKEN=a\\ b`), as in a shell;
- in any argument, a bare Hugging Face token (`hf_` and 20 or more letters or digits) and
  the value after `Bearer `.

A count is a plural (`tokens`, `keys`) whose value is a number (`4096`, `-1`, `2_000`, `1e9`,
`2.5M`, `10B`) and where nothing else in the name names a secret: `MAX_TOKENS=4096`,
`--max-tokens 4096`, `NUM_KEYS=3`, `--tokens 10B` are kept; `GITHUB_TOKENS=ghp_x,ghp_y`,
`API_KEYS=3`, `SESSION_TOKENS=12ab` are hidden. The value decides, not a list of prefixes
(max, num, total, ...): a count is a number under any name (`TOKENS_PER_BATCH`), a plural
credential is a list of tokens, never a bare number; a name no list foresaw is still hidden.

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
_PLURAL = re.compile(r"tokens|keys", re.IGNORECASE)
"""The words of a count's name (`MAX_TOKENS`, `NUM_KEYS`), a count only with a `_NUMBER`."""
_NUMBER = re.compile(r"-?\d[\d_]*(?:\.\d+)?(?:e\d+)?[kmbgt]?", re.IGNORECASE)
"""A count's value: `4096`, `-1`, `2_000`, `1e9`, `2.5M`, `10B` (`plan --tokens`)."""
_SECRET_ELSE = re.compile(rf"{_SECRET_WORD}|api|access", re.IGNORECASE)
"""What, left in a count's name, makes it a secret's (`API_KEYS`, `ACCESS_KEYS`)."""
_SECRET_WORD_RE = re.compile(_SECRET_WORD, re.IGNORECASE)
_USERINFO = re.compile(r"((?<![A-Za-z0-9+.-])[A-Za-z0-9+.-]*://)[^/@\s?#]+@")
"""`scheme://user:password@`: a revision (`hf://datasets/org/name@main`) has a `/` before it.

Each pattern here starts only where a run of a name's characters starts (a lookbehind) and
finds a secret's word in that run by one look ahead (`(?=NAME*?WORD)`): a word boundary
started at each word of `a-b-c-...` and `NAME*WORD NAME*=` retried each `WORD` of the run,
each rescanning the run's rest (time as the square of its length: 15 s on 40,000 characters)."""
_QUERY = re.compile(rf"([?&](?=[\w.-]*?{_SECRET_WORD})([\w.-]*)=)[^&#\s]*", re.IGNORECASE)
_VALUE = r"\"(?:\\[\s\S]|[^\"\\])*\"|'[^']*'|\\[\s\S]"
"""The pieces of a shell word a value holds beyond plain characters: a double-quoted string
(its `\\"` escapes inside), a single-quoted one, an escaped character (`a\\ b`: one word)."""
_PIECE = rf"(?:{_VALUE}|[^\s,;&\\])*"
_ASSIGNED = re.compile(
    rf"((?<![\w/-])(?=[\w-]*?{_SECRET_WORD})([\w-]*)=){_PIECE}(?:,(?![\w-]+=(?![=,\s;&]|$)){_PIECE})*",
    re.IGNORECASE,
)
"""`NAME=VALUE` with a secret's NAME (`HF-TOKEN=`, `--hf-token=`), a list's every item (up to
an item `NAME=VALUE`; one ending in `=`, base64's padding, is an item of the list); a
folder of a path (`s3://b/t/partition_key=3/`, Hive's partitions) is preceded by `/`: kept."""
_SPACED = re.compile(
    rf"((?<![\w/-])(?=--?[\w-]*?{_SECRET_WORD})(--?[\w-]*)\s+)"
    rf"(?!--)(?:{_VALUE}|[^\s;&|\\])+",
    re.IGNORECASE,
)
"""`--NAME VALUE` inside one argument (a `--slurm-setup` line), NAME a secret's."""
_OPTION = re.compile(r"--?[a-z]", re.IGNORECASE)
"""How an option starts."""
_BARE = re.compile(r"\bhf_[A-Za-z0-9]{20,}|(?<=\bBearer )(?:\\[\s\S]|[^\s'\"\\])+", re.IGNORECASE)
"""A Hugging Face token anywhere (`huggingface-cli login --token hf_...`), `Bearer VALUE`."""


_HARMLESS = re.compile(r"tokeniz(?:ers?|ation|ed)?|author|passes|passage|design", re.IGNORECASE)
"""Words that hold a secret's word and name none (`TOKENIZERS_PARALLELISM`, HF's common
setting: hiding it cost a Slurm run its copyable --resume line)."""


def _kept(name: str, value: str) -> bool:
    """Whether NAME=VALUE holds no secret: a secret's word only inside a harmless word
    (`_HARMLESS`), or a count (`_PLURAL` words, nothing else of a secret, a `_NUMBER` value)."""
    words = _HARMLESS.sub("", name)
    if _SECRET_WORD_RE.search(words) is None:
        return True
    if _SECRET_ELSE.search(_PLURAL.sub("/", words)) is not None:
        return False
    return _NUMBER.fullmatch(value.strip("\"'")) is not None


def _hide(match: re.Match[str]) -> str:
    value = match[0][len(match[1]) :]
    return match[0] if _kept(match[2], value) else f"{match[1]}{REDACTED}"


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
    for at, arg in enumerate(args):
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
        after = args[at + 1] if at + 1 < len(args) else None
        hide = after is not None and not joined and _secret_option(arg, after)
    return out


def _secret_option(arg: str, after: str) -> bool:
    """Whether `arg` is an option whose name holds a secret and `after` its value
    (`--password VALUE`, `--password -hunter2`), not a flag followed by a long option
    (`--no-auth --resume`, `--token --`) nor a count (`--max-tokens 4096`)."""
    if not _OPTION.match(arg) or after.startswith("--") or any(c.isspace() for c in arg):
        return False
    return _SECRET_WORD_RE.search(arg) is not None and not _kept(arg, after)


def _hidden(arg: str) -> str:
    arg = _USERINFO.sub(rf"\g<1>{REDACTED}@", arg)
    arg = _QUERY.sub(_hide, arg)
    arg = _ASSIGNED.sub(_hide, arg)
    arg = _SPACED.sub(_hide, arg)
    return _BARE.sub(REDACTED, arg)
