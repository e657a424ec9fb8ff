"""`index.json`: the manifest that makes a folder of Parquet shards a packtool dataset.

The manifest is written last (atomically); a shard it does not list does not exist. Readers refuse
a `format_version` they do not know. The shard columns are declared in `packtool/dataset/columns.py`;
format 2 records the ones a dataset has (`columns`), format 1 had exactly the required ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from packtool.dataset import columns as shard_columns
from packtool.dataset.manifest_check import manifest_problem
from packtool.errors import ConfigError, DataError, PacktoolError, json_value
from packtool.storage import local as storage
from packtool.storage import remote, writing

FORMAT = "packtool.packed"
FORMAT_VERSION = 3
INDEX_FILE = "index.json"
SOURCES_FILE = "sources.json"
"""Beside `index.json` when a dataset has too many input files to list inside it
(`packtool.read.docids`)."""
GROUPS_FILE = "groups.json"
"""Beside `index.json` when a dataset has too many `--group-by` groups to list inside it
(packtool/dataset/groups.py)."""
SUPPORTED_VERSIONS = (1, 2, 3)
"""1: the four required columns; 2: adds the `columns` list (and optional columns such as
`loss_mask`); 3: every `doc_ids` value is `packtool.read.docids` (input file index, record offset),
raw corpora too, with the files in `extra.doc_ids` (or `sources.json` beside it), and shards
are named by partition (`shard-PPPPPP-KKKKK.parquet`). Readers read all three the same way:
only what the ids mean changed (a version 2 dataset of raw text numbers them 0, 1, 2, ...)."""


def packed_schema(
    token_type: pa.DataType | None = None, columns: tuple[str, ...] | None = None
) -> pa.Schema:
    """The Arrow schema of a packed shard with `columns` (None: the required ones).

    Derived from the declaration in `packtool/dataset/columns.py`.

    Args:
        token_type: `pa.uint16()` when the vocabulary has at most 65,536 ids (every id fits), else
            `pa.uint32()` (the default).
        columns: the dataset's column names (`Manifest.columns`).
    """
    return shard_columns.packed_schema(token_type, columns)


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """One shard as the manifest lists it."""

    file: str
    """File name relative to the dataset folder."""
    rows: int
    tokens: int
    bytes: int
    sha256: str


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The contents of `index.json`."""

    tokenizer: dict[str, Any]
    """Tokenizer identity: kind, name, vocab_size, eos_id, bos_id, sha256."""
    max_len: int
    algorithm: str
    seed: int
    rounds: int
    long_docs: str
    counts: dict[str, int]
    """documents_in/packed/split/truncated/dropped/empty, tokens_in/out/truncated/dropped, rows."""
    efficiency: float
    """Real tokens / (rows * max_len)."""
    lower_bound_rows: int
    shards: tuple[ShardInfo, ...]
    command: str = ""
    columns: tuple[str, ...] = field(
        default_factory=lambda: shard_columns.names(shard_columns.required())
    )
    """The shard columns this dataset has, in declaration order (format 2; format 1: the
    required ones)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Anything else worth recording (rows per round, per-group efficiency, timings)."""
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    @property
    def num_rows(self) -> int:
        return sum(s.rows for s in self.shards)

    @property
    def num_tokens(self) -> int:
        return sum(s.tokens for s in self.shards)

    @property
    def fingerprint(self) -> str:
        """A short hash that changes whenever the dataset's content changes."""
        h = hashlib.sha256()
        h.update(str(self.max_len).encode())
        for s in self.shards:
            h.update(s.sha256.encode())
        return h.hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["shards"] = [dataclasses.asdict(s) for s in self.shards]
        d["columns"] = list(self.columns)
        if self.format_version == 1:  # format 1 had no list: exactly the required columns
            del d["columns"]
        # Put the format first so a person reading the file sees it at once.
        return {"format": d.pop("format"), "format_version": d.pop("format_version"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, where: str = INDEX_FILE) -> Manifest:
        if d.get("format") != FORMAT:
            raise DataError(f"{where}: not a packtool dataset (format {d.get('format')!r})")
        version = d.get("format_version")
        if not _is_int(version) or version not in SUPPORTED_VERSIONS:  # True == 1, 3.0 == 3
            raise DataError(
                f"{where}: format_version {version!r} is not supported by this packtool "
                f"(supported: {list(SUPPORTED_VERSIONS)}); upgrade packtool or repack the data"
            )
        problem = _missing_field(cls, d) or _type_problem(d)
        if problem:
            raise DataError(f"{where}: malformed manifest: {problem}")
        columns = shard_columns.manifest_columns(d, version)
        if isinstance(columns, str):
            raise DataError(f"{where}: malformed manifest: {columns}")
        try:
            # Keys a later packtool adds to an entry are ignored, as unknown top-level keys are.
            known = {f.name for f in dataclasses.fields(ShardInfo)}
            shards = tuple(
                ShardInfo(**{k: v for k, v in s.items() if k in known}) for s in d["shards"]
            )
            names = {f.name for f in dataclasses.fields(cls)} - {"shards", "columns"}
            fields = {k: v for k, v in d.items() if k in names}
            return cls(shards=shards, columns=columns, **fields)
        except (KeyError, TypeError) as exc:
            raise DataError(f"{where}: malformed manifest ({exc})") from None


def _is_int(value: Any, minimum: int | None = None) -> bool:
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (minimum is None or value >= minimum)


def _missing_field(cls: type, d: dict[str, Any]) -> str | None:
    """The first field `cls` has no default for that `d` lacks, named."""
    for f in dataclasses.fields(cls):
        no_default = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if no_default and f.name not in d:
            return f"{f.name} is missing"
    return None


def _type_problem(d: dict[str, Any]) -> str | None:
    """The first field of a manifest dict with the wrong type, described; None when all are fine.

    Readers do arithmetic on these fields; a hand-edited or foreign `index.json` must fail here
    with a sentence, not deep inside as a TypeError.
    """
    tok = d.get("tokenizer")
    if not isinstance(tok, dict):
        return f"tokenizer must be an object, found {tok!r}"
    if not _is_int(tok.get("vocab_size"), 1):
        return f"tokenizer.vocab_size must be a positive integer, found {tok.get('vocab_size')!r}"
    for key in ("eos_id", "bos_id"):
        if tok.get(key) is not None and not _is_int(tok.get(key), 0):
            return f"tokenizer.{key} must be a token id or null, found {tok.get(key)!r}"
    if not _is_int(d.get("max_len"), 1):
        return f"max_len must be a positive integer, found {d.get('max_len')!r}"
    for key in ("seed", "rounds", "lower_bound_rows"):
        if key in d and not _is_int(d[key], 0):
            return f"{key} must be an integer >= 0, found {d[key]!r}"
    for key in ("algorithm", "long_docs", "command"):
        if key in d and not isinstance(d[key], str):
            return f"{key} must be a string, found {d[key]!r}"
    counts = d.get("counts")
    if not isinstance(counts, dict):
        return f"counts must be an object, found {counts!r}"
    for key, value in counts.items():
        if not _is_int(value, 0):
            return f"counts.{key} must be an integer >= 0, found {value!r}"
    eff = d.get("efficiency")
    if isinstance(eff, bool) or not isinstance(eff, (int, float)):
        return f"efficiency must be a number, found {eff!r}"
    if "extra" in d and not isinstance(d["extra"], dict):
        return f"extra must be an object, found {d['extra']!r}"
    shards = d.get("shards")
    if not isinstance(shards, list):
        return f"shards must be a list, found {shards!r}"
    for i, shard in enumerate(shards):
        if not isinstance(shard, dict):
            return f"shards[{i}] must be an object, found {shard!r}"
        for key in ("file", "sha256"):
            if not isinstance(shard.get(key), str):
                return f"shards[{i}].{key} must be a string, found {shard.get(key)!r}"
        for key in ("rows", "tokens", "bytes"):
            if not _is_int(shard.get(key), 0):
                return f"shards[{i}].{key} must be an integer >= 0, found {shard.get(key)!r}"
    return None


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with storage.open_input(path) as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def write_manifest(directory: str | os.PathLike, manifest: Manifest) -> Path:
    path = Path(directory) / INDEX_FILE
    text = json.dumps(manifest.to_dict(), indent=2, sort_keys=False) + "\n"
    writing.write_atomic(path, text.encode("utf-8"))
    return path


LINK_KEY = "packtool_dataset"
"""The one key of a link `index.json`: the version folder (beside it) that holds the dataset."""
LINK_BYTES = 4096
"""A link `index.json` is smaller than this; a manifest is larger (so a reader of a local dataset
reads nothing more than before to tell them apart)."""


def link_bytes(version: str) -> bytes:
    """A link `index.json` naming the version folder `version` (a remote output's commit,
    packtool/dataset/output.py)."""
    return (json.dumps({LINK_KEY: version}) + "\n").encode()


def linked_version(index: str | os.PathLike) -> str | None:
    """The version folder the link `index` names; None when `index` is a manifest (or absent)."""
    size = storage.file_size(index)  # one HEAD for an object, absent or not
    if size is None or size >= LINK_BYTES:
        return None
    try:
        data = json_value(storage.read_text(index))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None  # read_manifest says what is wrong with it
    return _link_target(data, index)


_MANIFEST_START = re.compile(rb'\A\s*\{\s*"format"\s*:\s*"' + re.escape(FORMAT.encode()) + rb'"')
"""How a manifest `write_manifest` wrote begins (its `format` key first)."""


def is_dataset_index(path: str | os.PathLike) -> bool:
    """Whether the file `path` is a packed dataset's `index.json` (its manifest, or a bucket's
    link): what a corpus reader refuses by name (read as records, its lines were malformed
    JSON skips and its one shard entry a document). Only a file of that name is looked at,
    and only its first `LINK_BYTES` (a corpus file of that name is not read twice whole)."""
    if storage.file_name(path) != INDEX_FILE:
        return False
    try:
        size = storage.file_size(path)
        head = storage.read_range(path, 0, min(size, LINK_BYTES)) if size else b""
    except (OSError, PacktoolError):
        return False
    if _MANIFEST_START.match(head):
        return True
    try:  # a link is smaller than LINK_BYTES: it is all there
        data = json_value(head) if size is not None and size < LINK_BYTES else None
    except ValueError:
        return False
    return isinstance(data, dict) and set(data) == {LINK_KEY}


def _link_target(data: Any, index: Any) -> str | None:
    """The version folder a parsed `index.json` links to; None when it is no link."""
    if not isinstance(data, dict) or set(data) != {LINK_KEY}:
        return None
    version = data[LINK_KEY]
    if not isinstance(version, str) or not version or "/" in version or version.startswith("."):
        raise DataError(f"{index}: a link to {version!r}, which is not a version folder beside it")
    return version


def dataset_folder(path: str | os.PathLike) -> Path:
    """The dataset folder `path` names: the folder itself, or the folder of its `index.json`;
    where that `index.json` is a link (a dataset written to object storage: docs/remote.md), the
    version folder it names.

    People point at the manifest as often as at its folder (`packtool verify out/index.json`);
    both mean the same dataset. Shard paths are relative to the folder this returns.
    """
    path = storage.as_path(path) if storage.is_remote(path) else Path(path)
    if path.name == INDEX_FILE and not storage.is_dir(path):
        path = path.parent
    version = linked_version(path / INDEX_FILE)
    return path / version if version is not None else path


def read_manifest(directory: str | os.PathLike) -> Manifest:
    """Read and check `index.json` in `directory` (a clear `DataError` on any problem).

    Checked: the format and version, every field's type, shard paths, and the manifest as a
    whole (`packtool.dataset.manifest_check`: enumerations, ranges, counting identities, totals).

    Args:
        directory: the dataset folder, or its `index.json` (see `dataset_folder`).
    """
    return open_dataset(directory)[1]


def open_dataset(path: str | os.PathLike) -> tuple[Path, Manifest]:
    """The dataset folder `path` names (`dataset_folder`) and its checked manifest
    (`read_manifest`), in the fewest reads: in a bucket one GET of `index.json`, and one more of
    the version's when it is a link (no HEAD first: a link is a few bytes, and a manifest read
    is kept).

    Raises:
        ConfigError: `path` is no path (None, a number, a list).
        DataError: no dataset there, or a damaged `index.json`.
    """
    if not isinstance(path, (str, os.PathLike)) and not storage.is_remote(path):
        raise ConfigError(f"path must be a dataset folder or URL, got {path!r}")
    if not storage.is_remote(path):
        folder = dataset_folder(path)
        if not storage.is_dir(folder):
            if storage.exists(folder):
                raise DataError(
                    f"{folder}: a file, not a dataset (a dataset is the folder `packtool pack "
                    "-o` wrote, or its index.json)"
                )
            text = os.fspath(path)
            if "://" in str(text):  # read as a local path (`s4:/b/ds`): say which stores are
                known = ", ".join(sorted(remote.SCHEMES))
                raise DataError(
                    f"{text}: no such dataset folder (read as a local path: "
                    f"{str(text).split('://')[0]}:// is no store packtool reads; it reads {known})"
                )
            raise DataError(f"{folder}: no such dataset folder")
        if not storage.is_file(folder / INDEX_FILE):
            raise DataError(_missing(folder / INDEX_FILE))
        manifest = _checked(_read_json(folder / INDEX_FILE), folder / INDEX_FILE)
        _check_links(folder, manifest)
        return folder, manifest
    folder = storage.as_path(path)
    if folder.name == INDEX_FILE and not storage.is_dir(folder):
        folder = folder.parent
    data = _read_json(folder / INDEX_FILE)
    version = _link_target(data, folder / INDEX_FILE)
    if version is not None:
        folder = folder / version
        data = _read_json(folder / INDEX_FILE)
    return folder, _checked(data, folder / INDEX_FILE)


def _check_links(folder: Path, manifest: Manifest) -> None:
    """A shard that is a symbolic link must stay inside the folder: the manifest's names are
    held inside it, but a link in it pointing at a file elsewhere was read as a shard."""
    root = storage.resolve(folder)
    for s in manifest.shards:
        path = folder / s.file
        if storage.is_symlink(path):
            real = storage.resolve(path)
            if not real.is_relative_to(root):
                raise DataError(
                    f"{path}: a link to {real}, outside the dataset folder; a reader never "
                    "opens a file elsewhere"
                )


def _missing(path: Path) -> str:
    if storage.exists(path) and not storage.is_file(path):  # a FIFO, a device, a folder
        return f"{path}: not a regular file; not a packtool dataset"
    return f"{path}: missing; not a packtool dataset or an unfinished `packtool pack`"


def _read_json(path: Path) -> Any:
    try:
        return json_value(storage.read_text(path))
    except FileNotFoundError:
        raise DataError(_missing(path)) from None
    except PacktoolError:  # the store's options or endpoint (a ConfigError is a ValueError)
        raise
    except (OSError, ValueError) as exc:  # UnicodeDecodeError, JSONDecodeError, too deep
        raise DataError(f"{path}: unreadable manifest ({exc})") from None


def _checked(data: Any, path: Path) -> Manifest:
    """The manifest `data` read from `path`, checked whole."""
    if not isinstance(data, dict):
        raise DataError(f"{path}: malformed manifest (not a JSON object)")
    manifest = Manifest.from_dict(data, where=str(path))
    # The whole manifest, not field by field: what verify refuses, every reader refuses.
    problem = _shard_files_problem(manifest) or manifest_problem(data)
    if problem:
        raise DataError(f"{path}: {problem}")
    return manifest


def _shard_files_problem(manifest: Manifest) -> str | None:
    """Shard paths every reader relies on: inside the folder (a reader must never open a file
    elsewhere) and each listed once (its rows would otherwise be read twice per epoch)."""
    seen: set[str] = set()
    for s in manifest.shards:
        # Also as a URL decodes it: over http(s) `%2e%2e/` is `../` (a shard outside the
        # dataset's prefix was read), and a backslash is a separator on some servers.
        decoded = unquote(s.file).replace("\\", "/")
        forms = (Path(s.file), Path(decoded))
        if not s.file or any(p.is_absolute() or ".." in p.parts for p in forms) or "://" in decoded:
            return f"shard file {s.file!r} must be a path inside the dataset folder"
        # One file however it is spelled: `./x`, `x` and `a//x` vs `a/x` name the same one (as
        # written, not decoded: `shard%2000.parquet` and `shard 00.parquet` are two files).
        key = str(PurePosixPath(s.file))
        if key in seen:
            return f"shard file {s.file!r} is listed more than once"
        seen.add(key)
    return None
