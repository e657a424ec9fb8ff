"""The command line as a run records it, with what may be a secret hidden.

`pack` writes its command into `index.json` ("command": uploaded with the dataset, left in a
bucket) and every writing command into its output's lock record, which a second writer is
shown. `--storage-options` carries credentials (`{"hf": {"token": ...}}`): they were written
there verbatim. `recorded()` replaces with `REDACTED`:

- the value of `--storage-options` (`--storage-options X` and `--storage-options=X`);
- in any argument, a URL's user and password (`https://user:pw@host/...`) and the value of a
  query parameter that signs or authorises (`?sig=`, `X-Amz-Signature=`, `access_token=`);
- in any argument, the value of `NAME=VALUE` where a whole word of NAME names a secret
  (`HF_TOKEN=...` in `--slurm-setup`, `AWS_SECRET_ACCESS_KEY=...` in
  `--sbatch-arg=--export=...`; not `MAX_TOKENS=`, `donkey=`, nor a path's folder
  `s3://b/t/partition_key=3/`).

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
    r"(?i:token|secret|passw(?:or)?d|pass(?:phrase)?|pwd|(?:api)?key|credentials?|auth"
    r"|sig(?:nature)?)"
)
"""A word of a secret's NAME, any case: a whole word of it (`HF_TOKEN`, `aws_secret_access_key`,
`KEY`, `apiKey`), not inside another (`donkey`, `MAX_TOKENS`, `PASSAGE`, `AUTHOR`, which were
hidden)."""


def _secret_name(separators: str) -> str:
    """A NAME (its characters: `\\w` and `separators`) with `_SECRET_WORD` as one of its words:
    words split at a separator or a camelCase step (`accessToken`), a digit may follow."""
    before = rf"(?:[\w{separators}]*[{separators}]|[\w{separators}]*[a-z0-9](?=[A-Z]))?"
    after = rf"(?:\d*(?=[{separators}=])|(?<=[a-z])(?=[A-Z]))[\w{separators}]*"
    return rf"{before}{_SECRET_WORD}{after}"


_USERINFO = re.compile(r"(\b[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s?#]+@")
"""`scheme://user:password@`: a revision (`hf://datasets/org/name@main`) has a `/` before it."""
_QUERY = re.compile(rf"([?&]{_secret_name('_.-')}=)[^&#\s]*")
_ASSIGNED = re.compile(
    rf"((?<![\w/-]){_secret_name('_')}=)(?:\"[^\"]*\"|'[^']*'|[^\s,;&])*",
)
"""`NAME=VALUE` with a secret's NAME; an option (`--tokenizer=x`) is preceded by `-`, a
folder of a path (`s3://b/t/partition_key=3/`, Hive's partitions) by `/`."""

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
    arg = _QUERY.sub(rf"\g<1>{REDACTED}", arg)
    return _ASSIGNED.sub(rf"\g<1>{REDACTED}", arg)
