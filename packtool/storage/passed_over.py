"""What a folder's (or bucket prefix's) walk and a glob read and what they pass over, the same
for local paths (packtool/storage/local.py) and buckets (packtool/storage/listing.py): the
dataset cards a walk passes over, the folders a glob matches and reads nothing of, and the error
for a glob that matches no file."""

from __future__ import annotations

import glob
import os

CARD_NAMES = ("readme.md", "readme.txt", "readme.text")
"""A dataset's card (`README.md`: what the Hugging Face Hub shows, YAML front matter and prose),
by its name in any case: `dataset_cards`."""
CARD_NOTE = " (a dataset card beside record files)"
"""How `unread` names a dataset card it passes over."""


def dataset_cards(paths: list[str], records: tuple[str, ...]) -> list[str]:
    """Of the files a folder's (or prefix's) walk reads, the dataset cards to pass over: those
    named `README.md` (`CARD_NAMES`) when the walk also finds files ending in `records` (JSONL,
    Parquet: a dataset's records, which its card describes). A folder downloaded from the Hub
    (`huggingface-cli download`, an `hf://` prefix) read its card as one more document; a folder
    of text files alone reads its README as the text it is. Named by itself, a card is read."""
    if not records or not any(p.lower().endswith(records) for p in paths):
        return []
    return [p for p in paths if p.rsplit("/", 1)[-1].lower() in CARD_NAMES]


def passed_folders(folders: list[str], files: set[str]) -> list[str]:
    """Of the folders (prefixes) a glob matched, those no file it matched lies under: `'d/**'`
    matches `d/a` and `d/a/x.jsonl`, and reads what `d/a` holds that way (a note named it as
    not read)."""
    holding = set()
    for f in files:
        parent = f.rpartition("/")[0]
        while parent and parent not in holding:
            holding.add(parent)
            parent = parent.rpartition("/")[0]
    return [d for d in folders if d.rstrip("/") not in holding]


def no_files_globbed(
    text: str, folders: list[str], files: str = "files", folder: str = "folder"
) -> str:
    """The error for a glob that matches no file: where it matches folders, which (a glob
    reads the files it matches, never what a folder it matches holds). A bucket's glob
    (packtool/storage/listing.py) says "objects" and "prefix"."""
    if not folders:
        return f"{text}: glob matches no {files}"
    some = ", ".join(folders[:3]) + (f" and {len(folders) - 3} more" if len(folders) > 3 else "")
    return (
        f"{text}: glob matches no {files}, only {len(folders):,} {folder}(s) ({some}): a glob "
        f"reads the {files} it matches; give a {folder} itself to read its corpus files, or "
        f"match {files} ('d/*/*.jsonl', 'd/**/*.jsonl')"
    )


def globbed_folders(text: str) -> list[str]:
    """The folders a local glob input matches and reads nothing of (a glob reads the files it
    matches: no matched file lies under them, and they are not empty), sorted by segments.
    Empty for anything but a glob matching no file by its name, and for a glob that matches no
    file (`local.expand`'s error names its folders)."""
    if not glob.has_magic(text) or os.path.lexists(text):
        return []
    from packtool.storage.local_glob import local_glob

    matched = local_glob(text)
    folders = [p for p in matched if os.path.isdir(p)]
    if len(folders) == len(matched):
        return []
    files = set(matched).difference(folders)
    passed = [d for d in passed_folders(folders, files) if _holds_something(d)]
    return sorted(passed, key=lambda p: p.split("/"))


def _holds_something(folder: str) -> bool:
    """Whether `folder` holds any entry (an empty folder passed over loses nothing)."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return True  # unlistable: say so rather than nothing
