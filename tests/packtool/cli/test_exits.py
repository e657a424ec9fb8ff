"""What the CLI prints reaches its reader, or the exit code says it did not
(packtool/cli/exits.py: `echo`, `report`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli import run

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def packtool(*args: object, env: dict[str, str] | None = None, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", "from packtool.cli.commands import main; main()", *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PACKTOOL_NO_PROGRESS": "1", **(env or {})},
        capture_output=True,
        timeout=300,
        **kw,
    )


LATIN1 = {"PYTHONIOENCODING": "iso-8859-1"}
"""stdout and stderr as a non-UTF-8 locale has them (en_US.ISO-8859-1): strict Latin-1."""


def test_stats_histogram_in_a_latin1_locale(tmp_path):
    # Seen: the histogram's bars (U+2581..U+2588) raised UnicodeEncodeError after the whole pass.
    done = packtool("stats", CORPUS, "--max-len", "512", env=LATIN1)
    assert done.returncode == 0, done.stderr.decode("latin-1")
    assert b"Traceback" not in done.stderr
    out = done.stdout.decode("latin-1")
    assert "#" in out  # the bars, in ASCII
    assert "documents" in out


@pytest.fixture
def chinese_dataset(tmp_path) -> Path:
    corpus = tmp_path / "zh.jsonl"
    corpus.write_text(
        "".join(json.dumps({"text": "中文文本 " * (i + 3)}) + "\n" for i in range(20)),
        encoding="utf-8",
    )
    code, _, err = run("pack", corpus, "-o", tmp_path / "zhp", "--max-len", "256")
    assert code == 0, err
    return tmp_path / "zhp"


def test_inspect_row_of_non_latin_text_in_a_latin1_locale(chinese_dataset):
    done = packtool("inspect", chinese_dataset, "--row", "0", env=LATIN1)
    assert done.returncode == 0, done.stderr.decode("latin-1")
    assert b"Traceback" not in done.stderr
    out = done.stdout.decode("latin-1")
    assert "row 0" in out
    assert "\\u4e2d\\u6587" in out  # the preview's characters, escaped rather than lost


# --- a report that cannot reach its reader -----------------------------------------------------

ENTRY = "import sys; from packtool.cli.entry import main; sys.exit(main())"


def _closing(*fds: int):
    return lambda: [os.close(fd) for fd in fds]


@pytest.fixture
def tiny(tmp_path) -> Path:
    path = tmp_path / "tiny.jsonl"
    path.write_text("".join(json.dumps({"text": f"doc {i} " * i}) + "\n" for i in range(1, 30)))
    return path


def _entry(*args: object, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PACKTOOL_NO_PROGRESS": "1"},
        timeout=300,
        **kw,
    )


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors")
def test_a_closed_stdout_is_an_error_exit_naming_it(tiny):
    # Seen: `packtool stats small.jsonl >&-` printed nothing and exited 0.
    done = _entry("stats", tiny, stderr=subprocess.PIPE, preexec_fn=_closing(1))
    assert done.returncode == 1
    assert done.stderr.decode() == "error: stdout is closed: the report was not printed\n"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors")
def test_closed_stdout_and_stderr_leave_the_exit_code(tiny, tmp_path):
    # Nothing can be said; the exit code says it. And no file the run opens takes the closed
    # descriptors' numbers (a library's warning to fd 2 would land in it).
    probe = tmp_path / "fd"
    code = (
        "import atexit, os, sys\n"
        f"atexit.register(lambda: open({str(probe)!r}, 'w').write(str(open(os.devnull).fileno())))\n"
        f"{ENTRY}\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "stats", tiny],
        cwd=ROOT,
        preexec_fn=_closing(1, 2),
        timeout=300,
    )
    assert done.returncode == 1
    assert int(probe.read_text()) > 2


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_stdout_is_an_error_naming_stdout(tiny):
    with open("/dev/full", "w") as full:
        done = _entry("stats", tiny, stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 1
    assert done.stderr.decode() == (
        "error: stdout: No space left on device (the report was not printed)\n"
    )


WRITING = {
    "pack": lambda tiny, out: ("pack", tiny, "-o", out, "--max-len", "64"),
    "tokenize": lambda tiny, out: ("tokenize", tiny, "-o", out),
}
"""Commands whose result is the output they commit before they print their summary."""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors")
@pytest.mark.parametrize("command", sorted(WRITING))
@pytest.mark.parametrize("stdout", ["closed", "full"])
def test_a_writing_command_whose_stdout_fails_after_the_commit_warns_and_exits_0(
    tiny, tmp_path, command, stdout
):
    # Seen: `packtool pack ... >&-` (or `>/dev/full`) exited 1 after the dataset was committed;
    # a wrapper that retries on failure was then refused, since the output exists.
    if stdout == "full" and not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    out = tmp_path / ("out.parquet" if command == "tokenize" else "out")
    args = WRITING[command](tiny, out)
    if stdout == "closed":
        done = _entry(*args, stderr=subprocess.PIPE, preexec_fn=_closing(1))
    else:
        with open("/dev/full", "w") as full:
            done = _entry(*args, stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 0, done.stderr.decode()
    (line,) = done.stderr.decode().splitlines()
    assert line.startswith("warning: stdout") and line.endswith("; the command succeeded")
    assert out.exists()
    if command == "pack":
        from packtool.audit.verify import verify_dataset

        assert verify_dataset(out).rows > 0


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors")
@pytest.mark.parametrize("args", [("--help",), ("pack", "--help"), ("--version",)])
def test_help_to_a_closed_stdout_is_no_traceback(args):
    done = _entry(*args, stderr=subprocess.PIPE, preexec_fn=_closing(1))
    assert b"Traceback" not in done.stderr and done.returncode in (0, 1), done.stderr


# --- Ctrl-C: one line --------------------------------------------------------------------------


def test_ctrl_c_in_a_command_is_one_line_without_a_blank_one_before(monkeypatch, tiny):
    # click's own handler printed an empty line first (to end a terminal's `^C` line): two
    # lines in a log, where docs/pack.md says one.
    import packtool.stats.lengths as lengths

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lengths, "compute_stats", interrupted)
    code, out, err = run("stats", tiny)
    assert code == 130
    assert err == "interrupted\n"


@pytest.mark.skipif(sys.platform == "win32", reason="a terminal")
def test_ctrl_c_on_a_terminal_starts_a_line_of_its_own(tiny):
    # On a terminal the `^C` the tty echoed is ended first, as click did.
    import pty

    code = (
        "import packtool.stats.lengths as lengths\n"
        "def interrupted(*a, **k): raise KeyboardInterrupt\n"
        "lengths.compute_stats = interrupted\n"
        f"{ENTRY}\n"
    )
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, "stats", tiny],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=follower,
            timeout=300,
        )
        os.close(follower)
        said = b""
        while True:
            try:
                chunk = os.read(leader, 1024)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            said += chunk
    finally:
        os.close(leader)
    assert done.returncode == 130
    assert said.replace(b"\r\n", b"\n") == b"\ninterrupted\n"


def test_an_eof_error_in_a_command_is_not_reported_as_a_ctrl_c(monkeypatch, tiny):
    # click turns any EOFError into its Abort: the local engine's fork server killed mid-run
    # ended the run "interrupted", exit 130, though no one pressed Ctrl-C.
    import packtool.stats.lengths as lengths
    from packtool.cli import exits

    def ends_early(*args, **kwargs):
        raise EOFError("unexpected EOF")

    monkeypatch.setattr(lengths, "compute_stats", ends_early)
    with pytest.raises(exits.UnexpectedEOF) as caught:
        run("stats", tiny)
    assert isinstance(caught.value.__cause__, EOFError)
