"""A local input's glob: Python's `glob.glob(pattern, recursive=True)`, except that a recursive
pattern (a `**` segment) enters no symbolic link to a folder, as a folder's walk
(`local.walk`) does not.

Python's glob follows such links: `ln -s . d/l1` made `d/**/*.jsonl` read `d/x.jsonl` as
`d/l1/l1/.../x.jsonl` (40 links deep, where the kernel stops resolving), and two such links
made it list some 2^40 paths, a run that never ended. Here, in a pattern with `**`, no wildcard
segment (`**`, `*`, `?`, `[...]`) goes through a link to a folder; a link is entered only where
the pattern names it literally (`d/l1/**/*.jsonl`), as an input naming it is read. So such a
glob finds the files the walk of its folder finds (those its pattern matches), each once, under
the walk's path (no link in it). The rest is Python's glob: hidden names only for a segment that starts with a
dot, `**` any number of visible folders (none too), a folder that cannot be listed matches
nothing, the matches unsorted. Other patterns are Python's glob itself.
"""

from __future__ import annotations

import fnmatch
import glob
import os
from collections.abc import Iterator

RECURSIVE = "**"


def local_glob(pattern: str) -> list[str]:
    """The paths `pattern` matches, each once, as the module docstring says."""
    segments = pattern.split("/")
    if RECURSIVE not in segments:
        return glob.glob(pattern, recursive=True)
    first = next(i for i, segment in enumerate(segments) if glob.has_magic(segment))
    base = "/".join(segments[:first]) or ("/" if first else "")  # `/**/x`: from the root
    # `a//b` is `a/b`, as in glob; a trailing slash stays (it matches folders only).
    pattern_left = [s for s in segments[first:-1] if s] + segments[-1:]
    return [path for path in dict.fromkeys(_matches(base, pattern_left)) if path]


def _matches(base: str, pattern: list[str]) -> Iterator[str]:
    """The paths under `base` (a path, or "" for the current folder) that the segments
    `pattern` match; a path may come more than once (`**/**`)."""
    if not pattern:
        yield base
        return
    head, rest = pattern[0], pattern[1:]
    if head == RECURSIVE:
        yield from _matches(base, rest)  # no folder
        for name, folder in _entries(base, hidden=False):
            if folder:
                yield from _matches(_join(base, name), pattern)
            elif not rest:
                yield _join(base, name)  # a trailing `**` matches files too
    elif glob.has_magic(head):
        for name, folder in _entries(base, hidden=head.startswith(".")):
            if (folder or not rest) and fnmatch.fnmatchcase(name, head):
                yield from _matches(_join(base, name), rest)
    else:  # named: a link to a folder is entered, as an input naming it is read
        path = _join(base, head)
        if os.path.isdir(path) if rest else os.path.lexists(path):
            yield from _matches(path, rest)


def _entries(folder: str, hidden: bool) -> list[tuple[str, bool]]:
    """(name, whether it is a folder and no link) for each entry of `folder`; names that start
    with a dot only with `hidden`. A folder that cannot be listed has none (as in `glob`)."""
    try:
        with os.scandir(folder or ".") as entries:
            return [
                (e.name, e.is_dir(follow_symlinks=False))
                for e in entries
                if hidden or not e.name.startswith(".")
            ]
    except OSError:
        return []


def _join(base: str, name: str) -> str:
    return os.path.join(base, name) if base else name
