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
