"""Corpus readers: plain text, JSONL and Parquet (text and JSONL also .gz / .zst), from files,
folders and globs.

`read_corpus` streams the documents of every input in order, in `DocumentBatch`es of bounded
size (packtool/read/documents.py), each file read by its format's reader
(packtool/read/formats.py: text.py, jsonl.py, parquet.py).

Which bad input is an error and which is a skip (see docs/tokenize.md):

- error: a path that matches nothing, an unreadable, truncated or corrupt file, a Parquet file
  without the text column (or an extra field), a JSONL file in which no line has the text field;
- skip (reason): a line that is not a JSON object (`malformed_json`), a line without the text
  field or with a null/non-string value (`missing_field`), bytes that are not UTF-8
  (`invalid_utf8`), a document with no text (`empty`).

A UTF-8 byte order mark at the start of a text or JSONL file is not part of the data and is
dropped. A `.json` file that holds one JSON array (rather than JSON Lines) is read as the
objects in it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from glob import has_magic
from pathlib import Path

from packtool.dataset.manifest import INDEX_FILE, linked_version
from packtool.errors import ConfigError, DataError
from packtool.read.documents import (
    BatchBuilder,
    DocumentBatch,
    ReadConfig,
    SkipCounter,
    run_skips,
)
from packtool.read.formats import KNOWN_SHORT, KNOWN_SUFFIXES, RECORD_SUFFIXES, read_file
from packtool.storage.local import as_path, expand, input_list, is_dir, is_remote, unread


def expand_inputs(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Expand files, folders (recursively, the corpus suffixes only) and globs into a file list
    (`packtool.storage.local.expand`: each input's matches sorted, the inputs in their order,
    duplicates dropped). One str or `os.PathLike` is one input (`storage.local.input_list`), as
    everywhere packtool takes `inputs`.

    A bucket prefix whose `index.json` is a link (what `packtool tokenize -o s3://bucket/prefix`
    commits, docs/remote.md) stands for the version folder the link names: never for the
    versions a run in progress or a killed one left beside it.

    Raises:
        DataError: an input matches no file, or names something that is not a regular file.
        ConfigError: an input path is empty, or `inputs` is not a path or paths.
    """
    inputs = input_list(inputs)  # once: a generator given here is used up by reading it
    kept = _KEPT.get()
    if kept is None:
        return _expand(inputs)
    key = tuple(str(i) for i in inputs)
    with kept.lock:  # a thread listing the same inputs waits for this listing, not its own
        if key not in kept.files:
            kept.files[key] = _expand(inputs)
        return list(kept.files[key])


def _expand(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    links = [_linked(i) for i in input_list(inputs)]
    return expand(links, KNOWN_SUFFIXES, KNOWN_SHORT, RECORD_SUFFIXES)


@dataclass
class _Listings:
    files: dict[tuple[str, ...], list[Path]] = field(default_factory=dict)
    links: dict[str, str | os.PathLike] = field(default_factory=dict)
    """Each remote input's `_linked` answer (a HEAD, a GET where a link is there): asked once
    for the note on what is not read and for the files read."""
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Reentrant: a listing (`expand_inputs`, holding it) resolves its links (`_linked`)."""


_KEPT: ContextVar[_Listings | None] = ContextVar("kept_listings", default=None)


@contextmanager
def listings_kept() -> Iterator[None]:
    """Within it, `expand_inputs` lists each set of inputs once: a command's later calls with
    the same inputs get the files of the first listing (`pack` listed them three times: for
    the tokenizer's check of their kind, for their columns and for the plan, each a walk of
    every folder and, for a bucket prefix, 1,000 keys a request). A failed listing is not kept.
    Threads run in a copy of this context (`contextvars.copy_context().run`) share it. A bucket
    prefix is listed once for `passed_over` and the files too (`listing.finds_kept`)."""
    from packtool.storage import listing

    token = _KEPT.set(_Listings())
    try:
        with listing.finds_kept():
            yield
    finally:
        _KEPT.reset(token)


def passed_over(inputs: Iterable[str | os.PathLike], examples: int = 3) -> tuple[int, list[str]]:
    """The files that folder inputs (and bucket prefixes) hold but `expand_inputs` does not
    read (names ending in no corpus suffix; hidden ones aside): how many, and the first
    `examples`. One more walk of each folder; a prefix's listing is the one `expand_inputs`
    then uses, within `listings_kept`.
    """
    count, shown = 0, []
    for raw in input_list(inputs):
        if is_remote(str(raw)):
            if str(raw).lower().startswith(("http://", "https://")):
                continue  # a web server has no listing: a URL there is one file
            from packtool.storage import listing

            # A linked prefix (tokenize's output) is read as the version its link names: its
            # other objects are not the corpus's (its own index.json was noted as not read)
            linked = str(_linked(raw))
            n, names = listing.unread(
                linked, KNOWN_SUFFIXES, examples - len(shown), RECORD_SUFFIXES
            )
        elif is_dir(raw):
            n, names = unread(Path(raw), KNOWN_SUFFIXES, examples - len(shown), RECORD_SUFFIXES)
        else:
            continue
        count += n
        shown += names
    return count, shown


def globbed_folders(
    inputs: Iterable[str | os.PathLike], examples: int = 3
) -> tuple[int, list[str]]:
    """The folders (bucket prefixes) that glob inputs match but `expand_inputs` does not read
    (a glob reads the files it matches, never what a folder it matches holds): how many, and
    the first `examples`. One more glob of each local glob input; a bucket glob's listing is
    the one `expand_inputs` then uses, within `listings_kept`. A glob matching no file is
    `expand_inputs`'s error, which names them."""
    count, shown = 0, []
    for raw in input_list(inputs):
        text = str(raw)
        if is_remote(text):
            if text.lower().startswith(("http://", "https://")):
                continue  # a web server has no listing to glob
            from packtool.storage import listing

            folders = listing.globbed_prefixes(text)
        else:
            from packtool.storage.passed_over import globbed_folders as local_folders

            folders = local_folders(text)
        count += len(folders)
        shown += folders[: max(0, examples - len(shown))]
    return count, shown


def _linked(raw: str | os.PathLike) -> str | os.PathLike:
    """A remote prefix with a link `index.json`: the version folder it names (one HEAD; once a
    command within `listings_kept`)."""
    kept = _KEPT.get()
    if kept is None:
        return _link_of(raw)
    with kept.lock:
        if str(raw) not in kept.links:
            kept.links[str(raw)] = _link_of(raw)
        return kept.links[str(raw)]


def _link_of(raw: str | os.PathLike) -> str | os.PathLike:
    text = str(raw)
    if not is_remote(text) or has_magic(text) or text.lower().endswith(KNOWN_SUFFIXES):
        return raw
    if text.lower().startswith(("http://", "https://")):  # no prefixes there: a URL is a file
        return raw
    prefix = text.rstrip("/")
    named = f"{prefix}/{INDEX_FILE}"
    try:
        index = as_path(named)  # (refuses a URL without a bucket)
        named = str(index)
        version = linked_version(index)
    except (DataError, ConfigError) as exc:
        # The look for a link fails as the input's own reading would: its error names the
        # input, not an `index.json` the user never gave (`.../text/index.json: ConnectError`,
        # `s3:///x/index.json: no bucket in the URL`)
        why = str(exc).removeprefix(f"{named}: ")
        raise type(exc)(f"{raw}: {why}") from None
    # With its trailing slash: a prefix, so no look at what the name is (`listing.expand`)
    return f"{prefix}/{version}/" if version else raw


def read_corpus(
    inputs: Iterable[str | os.PathLike],
    config: ReadConfig | None = None,
    skips: SkipCounter | None = None,
) -> Iterator[DocumentBatch]:
    """Stream the documents of `inputs` as batches, in input order.

    Files are opened lazily, one at a time: the first batch arrives before later files are read.

    Args:
        inputs: files, folders and globs (see `expand_inputs`).
        config: reading options; defaults to `ReadConfig()`.
        skips: where skipped documents are counted; a fresh counter (strict as `config.strict`)
            when None. `config.strict` makes the read strict whatever counter is passed: one
            passed with strict=False is made strict (`documents.run_skips`).

    Raises:
        DataError: a missing path, an unreadable file, a missing Parquet column, or any skip in
            strict mode.
        ConfigError: an input path is empty, or `inputs` is not a path or paths.
    """
    config = config or ReadConfig()
    skips = run_skips(skips, config)
    paths = expand_inputs(inputs)
    builder = BatchBuilder(config)
    for path in paths:
        source = str(path)  # once a file (a URL's is ~8 us)
        for text, extras, nbytes, _ in read_file(path, config, skips):
            builder.add(text, source, extras, nbytes)
            if builder.full:
                yield builder.flush()
    if builder.texts:
        yield builder.flush()
