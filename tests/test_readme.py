"""The README stays a short user guide whose layout cannot drift from the tree.

`python -m tests.test_readme` rewrites the README's layout block from the packages' overviews
(the first line of each folder's `__init__.py`); the test fails when the two differ.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

from tests.test_architecture import LOADER_LAYERS, PACKTOOL_LAYERS

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
START, END = "<!-- layout:start -->", "<!-- layout:end -->"
PACKAGES = ("packtool", "loader", "attention")


def _summary(init: Path) -> str:
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    return doc.splitlines()[0].rstrip(".") if doc else ""


def layout() -> str:
    """The layout block: each package and its stage folders, lowest layer first, each with its
    overview's first line."""
    order = {"packtool": PACKTOOL_LAYERS, "loader": LOADER_LAYERS}
    lines = ["```"]
    for package in PACKAGES:
        lines.append(f"{package + '/':<20}{_summary(ROOT / package / '__init__.py')}")
        stages = [  # "" is the package's own top level: its line is the one above
            n
            for n in order.get(package, ())
            if n and (ROOT / package / n / "__init__.py").is_file()
        ]
        for name in stages:
            lines.append(f"  {name + '/':<18}{_summary(ROOT / package / name / '__init__.py')}")
    lines += [f"{'tests/':<20}mirrors the packages: tests/packtool/read/ tests packtool/read/"]
    lines += [f"{'benchmarks/':<20}prints tables and writes docs/benchmarks.md", "```"]
    return "\n".join(lines)


def _block(text: str) -> str:
    match = re.search(re.escape(START) + r"\n(.*?)\n" + re.escape(END), text, re.S)
    assert match, f"README.md has no {START} ... {END} block"
    return match.group(1)


def test_the_layout_block_is_the_tree():
    assert _block(README.read_text(encoding="utf-8")) == layout(), (
        "README.md's layout is stale: run `python -m tests.test_readme`"
    )


def test_the_readme_is_a_short_guide():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "<!-- bench:" not in text  # figures live in docs/benchmarks.md
    headline = text.split("## Headline figures", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in headline.splitlines() if line.startswith("| ") and "---" not in line]
    assert 1 <= len(rows) - 1 <= 12  # the header row, then at most 12 figures
    assert all("docs/benchmarks.md#" in row for row in rows[1:])


def test_every_docs_page_the_readme_links_exists():
    text = README.read_text(encoding="utf-8")
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).is_file(), link


def test_the_headline_anchors_exist():
    headings = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    anchors = {_anchor(h) for h in re.findall(r"^## (.+)$", headings, re.M)}
    for anchor in re.findall(r"docs/benchmarks\.md#([\w-]+)", README.read_text(encoding="utf-8")):
        assert anchor in anchors, anchor


def _anchor(heading: str) -> str:
    # GitHub's rule: lower case, punctuation dropped, spaces to hyphens.
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


if __name__ == "__main__":
    text = README.read_text(encoding="utf-8")
    whole = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    README.write_text(whole.sub(lambda _: f"{START}\n{layout()}\n{END}", text), encoding="utf-8")
    sys.exit(0)
