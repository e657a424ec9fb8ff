"""The console script's entry point (packtool/cli/entry.py): Ctrl-C while the CLI is still
importing is one line and exit code 130, not a KeyboardInterrupt traceback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

# The terminal's Ctrl-C lands while the commands are imported (the first ~0.6 s of every
# command): sent by the process to itself when `click` is about to be imported.
CTRL_C_DURING_IMPORT = """
import os, signal, sys

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv[1:] = ["stats", "sample_data/corpus.jsonl"]
from packtool.cli.entry import main
main()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_while_the_cli_imports_is_one_line():
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_DURING_IMPORT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, done.stderr
    assert done.stderr == "interrupted\n"
    assert done.stdout == ""


def test_the_console_script_is_the_entry_module():
    text = (ROOT / "pyproject.toml").read_text()
    scripts = text.split("[project.scripts]\n", 1)[1].split("\n[", 1)[0]  # (no tomllib on 3.10)
    assert re.findall(r'^packtool = "(.*)"$', scripts, re.MULTILINE) == ["packtool.cli.entry:main"]


def test_the_entry_module_imports_nothing_heavy():
    code = (
        "import sys; import packtool.cli.entry; "
        "print(sorted(m for m in ('click', 'pyarrow', 'numpy', 'packtool.cli.commands') "
        "if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_python_m_packtool_cli_is_the_console_script_for_an_early_ctrl_c():
    # The benchmarks ran `python -m packtool.cli.commands`, which skipped the entry module:
    # a Ctrl-C while it imported was a KeyboardInterrupt traceback. `python -m packtool.cli`
    # (what they run now) goes through it, as the console script does.
    code = CTRL_C_DURING_IMPORT.replace(
        "from packtool.cli.entry import main\nmain()",
        "import runpy\nrunpy.run_module('packtool.cli', run_name='__main__', alter_sys=True)",
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (done.returncode, done.stderr, done.stdout) == (130, "interrupted\n", "")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX file descriptors")
@pytest.mark.parametrize("module", ["packtool.cli", "packtool.cli.commands"])
def test_python_m_holds_the_closed_standard_descriptors_as_the_console_script(tmp_path, module):
    # `python -m packtool.cli.commands` did not open the null device on a closed stdout and
    # stderr: the first file the run opened took descriptor 1 (a library's print went into it).
    import os

    probe = tmp_path / "fd"
    tiny = tmp_path / "tiny.jsonl"
    tiny.write_text('{"text": "a b c"}\n')
    code = (
        "import atexit, os, runpy, sys\n"
        f"atexit.register(lambda: open({str(probe)!r}, 'w').write(str(open(os.devnull).fileno())))\n"
        f"sys.argv[1:] = ['stats', {str(tiny)!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        preexec_fn=lambda: [os.close(fd) for fd in (1, 2)],
        timeout=300,
    )
    assert done.returncode == 1  # the report could not be printed
    assert int(probe.read_text()) > 2


def test_the_benchmarks_run_the_cli_through_the_entry_module():
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert scripts
    assert [p.name for p in scripts if '"-m", "packtool.cli.commands"' in p.read_text()] == []
    assert [p.name for p in scripts if '"packtool.cli.commands",' in p.read_text()] == []
