"""How a command's failure reaches the user: one line on stderr, and an exit code.

`report(exc)` prints the line and returns the code for every failure a user can act on, and
None for anything else (a bug: its traceback is the report). Codes: 1 an error (a
`PacktoolError`, a bad option value, a failed write, a report stdout could not take: closed or
full), 2 a wrong option or argument, 130 Ctrl-C, 0 a closed pipe (`packtool stats ... | head`).
`pack` and `tokenize` commit their output before their report: its loss is a warning and 0
(`written`).
Where stderr is closed or full too, the exit code alone says it.

Records in: the exception `main()` caught. Out: a line on stderr, the exit code.
May import: click, `cli/interrupt.py` (the resume hint an interrupted run leaves) and
`storage/writing.py` (stdout pointed at the null device once its reader has gone).
"""

from __future__ import annotations

import contextlib
import errno
import sys

import click

from packtool.cli import interrupt
from packtool.errors import PacktoolError, joined_lines, open_file_limit

_NO_COMMAND = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""`packtool` with no command (click >= 8.2): its message is the whole help."""


def report(exc: BaseException, command: str = "packtool") -> int | None:
    """Print `exc` as one line (or nothing where nothing is owed); its exit code, or None.
    `command`: the command path a usage error points to when click's error carries none (an
    option missing its value is found before the subcommand's context exists)."""
    if _NO_COMMAND and isinstance(exc, _NO_COMMAND):
        echo(exc.format_message(), err=True)  # the help as click lays it out, not one line
        return exc.exit_code
    if isinstance(exc, PacktoolError):
        return _say(joined_lines(exc), 1)
    if isinstance(exc, (click.exceptions.Abort, KeyboardInterrupt, Interrupted)):
        # (Abort: click's word for a Ctrl-C while it parses; after it, `Commands` raises
        # `Interrupted`.) A terminal has echoed `^C`: that line is ended first.
        _tell(f"{_line_start()}interrupted{interrupt.note.get()()}")
        return 130
    if isinstance(exc, click.UsageError):
        # One line, as every other error. A bad value (`--chunk-docs 0`) exits 1 like the
        # values packtool checks itself (`--max-len 4k`); a wrong option or argument, 2.
        where = exc.ctx.command_path if exc.ctx else command
        bad_value = isinstance(exc, click.BadParameter) and not isinstance(
            exc, click.MissingParameter
        )
        message = f"{joined_lines(exc.format_message())} (see {where} --help)"
        return _say(message, 1 if bad_value else exc.exit_code)
    if isinstance(exc, click.ClickException):
        exc.show()
        return exc.exit_code
    if isinstance(exc, click.exceptions.Exit):
        return exc.exit_code
    if isinstance(exc, (ClosedPipe, BrokenPipeError)):
        return 0
    if isinstance(exc, LostOutput):
        return _say(str(exc), 1)
    if isinstance(exc, OSError):  # the disk filled up, a permission changed mid-run, ...
        where = f"{exc.filename}: " if exc.filename else ""
        why = joined_lines(exc.strerror or exc) + _open_file_limit(exc)
        return _say(f"{where}{why}{interrupt.note.get()()}", 1)
    return None


_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (9, 10)}
"""Control characters but tab and newline, as their escapes: a name a dataset, a corpus or a
file system hands us (a shard, an input file, a tokenizer's) could set the terminal's title,
clear the screen or move the cursor when printed raw."""


class Interrupted(BaseException):
    """Ctrl-C inside a command, on its way past click (`Commands`) to `report`."""


class UnexpectedEOF(Exception):
    """An `EOFError` out of a command, on its way past click, which turns every `EOFError`
    into its `Abort`: "interrupted" and exit code 130 for what no one interrupted (the local
    engine's fork server dying did; `engines/local.py` now says that as a lost worker). What
    is left is a bug, whose traceback (the `EOFError` its cause) is the report."""


class Commands(click.Group):
    """click's group, except that a Ctrl-C inside a command reaches `report` as `Interrupted`:
    click's own handler printed an empty line before it (to end a terminal's `^C` line; in a
    log, two lines where docs/pack.md says one). `report` ends that line on a terminal only.
    An `EOFError` reaches it as `UnexpectedEOF`, not as click's Ctrl-C."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            raise Interrupted from None
        except EOFError as exc:
            raise UnexpectedEOF(f"EOFError: {exc} (not a Ctrl-C)") from exc


class LostOutput(Exception):
    """What a command prints could not be written to stdout (closed, a full disk): an error,
    since the command's result is its report (exit code 1)."""


class ClosedPipe(Exception):
    """The reader of stdout has gone (`packtool pack ... | true`, `... | head -1`): not a
    failure. Not an `OSError`, so click's own EPIPE handler, which exits 1, never sees it."""


def echo(message: object, err: bool = False) -> None:
    """`click.echo` of what packtool prints, control characters shown as escapes (`\\x1b`),
    and what the stream's encoding cannot hold too (`_encodable`).

    Raises:
        ClosedPipe: stdout's reader has gone (stdout then writes to /dev/null, so nothing
            buffered fails again at exit).
        LostOutput: stdout is closed (`>&-`) or its write failed (`>/dev/full`); a message
            for a closed stderr is dropped (the exit code says what happened).
    """
    stream = sys.stderr if err else sys.stdout
    if stream is None:  # closed when the process started (`>&-`): click.echo printed nothing
        if err:
            return  # nothing can say it; the exit code does
        raise LostOutput("stdout is closed: the report was not printed")
    text = _encodable(str(message).translate(_CONTROL), stream)
    try:
        click.echo(text, err=err)
    except BrokenPipeError:
        if err:
            raise
        _discard_stdout()
        raise ClosedPipe from None
    except OSError as exc:  # `>/dev/full`: said "No space left on device", naming no file
        if err:
            raise
        _discard_stdout()
        why = joined_lines(exc.strerror or exc)
        raise LostOutput(f"stdout: {why} (the report was not printed)") from None


def written(message: object) -> None:
    """`echo` of a writing command's last report (`pack`, `tokenize`: their output committed
    by then, or their jobs submitted: `--no-wait`): a stdout that cannot take it (closed, full) is a warning on stderr and exit code
    0. It was an error, exit 1, after the commit: a wrapper that retries a failed command was
    then refused, the output being there. (A report-only command's report is its result, and
    its loss an error: `LostOutput`.)"""
    try:
        echo(message)
    except LostOutput as lost:
        _tell(f"warning: {lost}; the command succeeded")


def _discard_stdout() -> None:
    """stdout pointed at the null device: what is still buffered for it goes nowhere, instead
    of failing again at exit."""
    from packtool.storage import writing  # rarely needed: not on every command's import

    with contextlib.suppress(OSError, ValueError):
        writing.discard_output(sys.stdout.fileno())


_ASCII_BARS = str.maketrans("▁▂▃▄▅▆▇█", "_.:-=+*#")
"""The histogram's bars (`stats`) for a terminal that cannot show them."""


def _encodable(text: str, stream: object) -> str:
    """`text` as `stream` can encode it: a non-UTF-8 locale (en_US.ISO-8859-1) raised
    UnicodeEncodeError after a whole pass over the corpus (`stats`' bars, `inspect --row` of
    Chinese text). There, bars become ASCII and other characters their escapes (`\\u4e2d`)."""
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding, getattr(stream, "errors", None) or "strict")
    except UnicodeEncodeError:
        return text.translate(_ASCII_BARS).encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding Python does not know: leave it to the stream
        pass
    return text


def _open_file_limit(exc: OSError) -> str:
    """For "Too many open files" (EMFILE), the limit it ran into: the message alone reads as a
    problem of the file it names."""
    if exc.errno != errno.EMFILE:
        return ""
    return f" (the limit on open files, `ulimit -n`, is {open_file_limit()})"


def _say(message: str, code: int) -> int:
    _tell(f"error: {message}")
    return code


def _line_start() -> str:
    """A newline where stderr is a terminal, which has echoed `^C` on the line the message
    would continue; nothing elsewhere (a log: one line)."""
    try:
        return "\n" if sys.stderr is not None and sys.stderr.isatty() else ""
    except (OSError, ValueError):  # closed
        return ""


def _tell(line: str) -> None:
    """`line` on stderr, if it can take it (not `2>/dev/full`): the exit code says it anyway."""
    with contextlib.suppress(OSError):
        echo(line, err=True)
