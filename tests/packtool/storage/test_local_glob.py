"""packtool/storage/local_glob.py: a local input's glob, which enters no linked folder through
`**` (the rest of Python's glob: tests/packtool/storage/test_listing.py, tests/packtool/read/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from packtool.read.corpus import expand_inputs, read_corpus
from packtool.storage.local_glob import local_glob


def _tree(tmp_path):
    """d/x.jsonl, d/sub/y.jsonl, a link d/l1 to d itself (a loop) and d/out to a folder outside."""
    d = tmp_path / "d"
    (d / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    for path in (d / "x.jsonl", d / "sub" / "y.jsonl", tmp_path / "outside" / "z.jsonl"):
        path.write_text(json.dumps({"text": path.name}) + "\n")
    (d / "l1").symlink_to(".")
    (d / "out").symlink_to(tmp_path / "outside")
    return d


def test_a_recursive_glob_enters_no_linked_folder_as_the_walk_does(tmp_path):
    """Python's glob follows links to folders through `**`: with `ln -s . d/l1`, d/x.jsonl was
    read as d/l1/l1/.../x.jsonl (40 links deep), and d/out's file outside the folder was read,
    where the folder's walk enters neither."""
    d = _tree(tmp_path)
    want = [d / "sub" / "y.jsonl", d / "x.jsonl"]
    assert expand_inputs([d]) == want
    assert expand_inputs([f"{d}/**/*.jsonl"]) == want
    assert expand_inputs([f"{d}/**"]) == want
    sources = [s for b in read_corpus([f"{d}/**/*.jsonl"]) for s in b.sources]
    assert sources == [str(p) for p in want]
    # A link the pattern names is entered, as an input naming it is read; `**` below it enters
    # no link either. A glob without `**` is Python's, links and all.
    assert expand_inputs([f"{d}/out/**/*.jsonl"]) == [d / "out" / "z.jsonl"]
    assert expand_inputs([f"{d}/l1/**/*.jsonl"]) == [d / "l1" / p.relative_to(d) for p in want]
    assert sorted(local_glob(f"{d}/*/z.jsonl")) == [f"{d}/out/z.jsonl"]


def test_two_looping_links_do_not_hang_a_recursive_glob(tmp_path):
    """With two links to the folder itself, Python's glob listed some 2^40 paths: `packtool
    stats 'd/**/*.jsonl'` never ended."""
    d = _tree(tmp_path)
    (d / "l2").symlink_to(".")
    code = "from packtool.cli.commands import main; main()"
    args = [sys.executable, "-c", code, "stats", f"{d}/**/*.jsonl", "--json"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["documents"] == 2
