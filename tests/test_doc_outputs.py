"""The outputs the docs show as real are what the commands print today (a docs audit found
stats.md's "real output" a tokenizer line behind the command)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli import run

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def _block_after(doc: Path, marker: str) -> list[str]:
    """The lines of the first fenced block after the line holding `marker`."""
    text = doc.read_text(encoding="utf-8")
    at = text.index(marker)
    match = re.search(r"```\n(.*?)```", text[at:], re.S)
    assert match, f"{doc.name}: no block after {marker!r}"
    return match.group(1).splitlines()


def test_stats_md_shows_what_stats_prints(monkeypatch):
    monkeypatch.chdir(ROOT)  # the output names the corpus as given
    code, out, err = run("stats", "sample_data/corpus.jsonl", "--max-len", "4096")
    assert code == 0, err
    shown = _block_after(ROOT / "docs" / "stats.md", "real output")
    assert out.splitlines() == shown


def test_readme_shows_what_pack_prints(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    out_dir = tmp_path / "packed"
    code, out, err = run("pack", "sample_data/corpus.jsonl", "-o", out_dir, "--max-len", "4096")
    assert code == 0, err
    shown = _block_after(ROOT / "README.md", "the sample corpus and prints")
    printed = out.replace(str(out_dir), "packed").splitlines()
    assert len(printed) == len(shown)
    for got, want in zip(printed, shown, strict=True):
        if want.startswith("time "):  # seconds, rates and cores differ from box to box
            assert re.match(r"time [0-9.]+s \(read\+tokenize ", got) and "; cores used: " in got
        else:
            assert got == want
