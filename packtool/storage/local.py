"""The local (POSIX) file system, read side: finding inputs, stat, listing, and every read.

- **Finding inputs**: `expand` turns files, folders and globs into a file list (reading a corpus,
  `packtool.read.corpus.expand_inputs`; the loader's online packing). Nothing that looks like an
  input is passed over in silence: a dangling symlink, a pipe or a folder that cannot be listed
  is a one-line `DataError`.
- **Reading**: `open_input` (a byte stream), `read_bytes` / `read_text` (small files: manifests,
  records, tokenizer files), `memory_map` (random access shared through the page cache: shards),
  `parquet_file` / `parquet_schema` / `parquet_metadata` (Parquet, by path or opened source).
  A local path's is `local_files.py`'s (what pyarrow opens by name; a name that is not UTF-8
  is handed over as an open descriptor's), a URL's `remote_read.py`'s. No other module opens a
  file to read it (tests/test_architecture.py checks), so another backend plugs in here.
- **Stat and list** (`pyarrow.fs.get_file_info` / fsspec `info`, `ls`, `glob`): `stat`,
  `stat_all` / `file_states` (many paths at once, in parallel), `size`, `exists`, `lexists`,
  `is_file`, `is_dir`, `is_symlink`, `is_mount`, `list_dir`, `glob`.
- **Random access to a file that is still growing**: `open_random` (the shard writer's running
  hash reads what the Parquet writer appended and flushes it to the disk as it goes); the size
  now of a file under an open memory map is local_files.py's `open_size` (local_files.py: the
  files opened for random access, pyarrow's and packtool's own).

The write side (writing, replacing, removing, syncing, the writer's lock) is `writing.py`.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob as globbing
import os
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path
from stat import S_ISDIR, S_ISREG
from typing import Any, BinaryIO

from packtool.errors import ConfigError, DataError
from packtool.prefetch import map_ordered
from packtool.storage import local_files, remote
from packtool.storage.local_files import RandomFile
from packtool.storage.remote import is_remote


def input_list(inputs: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Any]:
    """`inputs` as a list: one `str` or `os.PathLike` (a file, folder, glob or URL) is one input,
    never the characters of its name; any other iterable gives its items.

    Raises:
        ConfigError: `inputs` is neither a path nor an iterable of paths (None, a number, bytes),
            or it is empty (it said "no documents in ", naming nothing).
    """
    if isinstance(inputs, (str, os.PathLike)):
        return [inputs]
    if isinstance(inputs, (bytes, bytearray)) or not isinstance(inputs, Iterable):
        raise ConfigError(f"inputs must be a path or a list of paths, got {type(inputs).__name__}")
    if not (out := list(inputs)):
        raise ConfigError("no inputs: give at least one file, folder, glob or URL")
    return out


def input_text(raw: str | os.PathLike) -> str:
    """One input as a string: a URL's text, a local path's `os.fspath` (`ConfigError` for what
    is no path at all)."""
    if isinstance(raw, str):
        return raw
    if is_remote(raw):
        return str(raw)
    if not isinstance(raw, os.PathLike):
        raise ConfigError(f"an input must be a str or os.PathLike path, got {raw!r}")
    return os.fspath(raw)


def named_input(text: str) -> str:
    """`text`, an input path as given; an empty one is refused (`Path("")` is the current
    folder: an unset variable in a script would read it). The CLI checks its arguments with
    this as they are parsed, `expand` every input.

    Raises:
        ConfigError: `text` is empty or white space.
    """
    if not text.strip():
        raise ConfigError(f"an input path is empty ({text!r}); name a file, folder or glob to read")
    return text


def expand(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    suffixes: tuple[str, ...],
    described: str,
    records: tuple[str, ...] = (),
) -> list[Path]:
    """Expand files, folders (recursively, names ending in `suffixes` only) and globs into a
    file list. Each input's matches are sorted by their paths' segments (a folder's and a
    glob's alike); the inputs keep their order; duplicates (the same file by resolved path) are
    dropped. `described` names the suffixes in errors. A folder whose walk finds files ending
    in `records` (record formats) passes over its dataset cards (`dataset_cards`).

    Raises:
        DataError: an input matches no file, or names something that is not a regular file.
        ConfigError: an input path is empty, or `inputs` is not a path or paths
            (`input_list`, `input_text`).
    """
    out: list[Any] = []
    seen: set[Any] = set()
    for raw in input_list(inputs):
        text = named_input(input_text(raw))
        if is_remote(text):  # s3://, gs://, hf://, https://, ...: packtool/storage/remote.py
            from packtool.storage import listing  # URLs only: `import loader` stays small

            for p in listing.expand(text, suffixes, described, records):
                if str(p) not in seen:
                    seen.add(str(p))
                    out.append(p)
            continue
        path = Path(text)
        if path.is_dir():
            matches = walk(path, suffixes)
            from packtool.storage.passed_over import dataset_cards  # `import loader`: not here

            cards = set(dataset_cards(list(map(str, matches)), records))
            matches = [p for p in matches if str(p) not in cards]
            if not matches:
                raise DataError(f"{text}: folder has no corpus files (looked for {described})")
        elif path.is_file():
            matches = [path]
        elif os.path.lexists(path):
            raise DataError(not_a_file(path))
        elif globbing.has_magic(text):
            from packtool.storage.local_glob import local_glob  # globs only: `import loader`

            matches, folders = [], []
            # Paths sort by their segments, as `walk`'s do (`d/a/x` before `d/a-b`, which a
            # string sort reverses): a folder and a glob of it give the same files one order,
            # so the same doc_ids.
            for p in sorted(map(Path, local_glob(text))):  # `**` enters no linked folder
                if p.is_file():
                    matches.append(p)
                elif p.is_dir():
                    folders.append(p)
                else:
                    raise DataError(not_a_file(p))
            if not matches:
                from packtool.storage.passed_over import no_files_globbed

                raise DataError(no_files_globbed(text, [str(p) for p in folders]))
        else:
            raise DataError(f"{text}: no such file or folder")
        for p, key in zip(matches, map_ordered(resolve, matches), strict=True):
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


def walk(folder: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """The files under `folder` whose names end in `suffixes`, sorted; hidden names and links
    to folders are skipped (`unread` names the links).

    Nothing that looks like a corpus file is passed over in silence: an entry with a corpus
    suffix that is not a readable regular file (a dangling symlink, a named pipe) and a sub-folder
    that cannot be listed are errors.
    """

    def cannot_list(exc: OSError) -> None:
        raise DataError(f"{exc.filename}: cannot list folder ({exc.strerror or exc})")

    found = []
    for top, files in _visible(folder, cannot_list):
        named = [Path(top) / name for name in files if name.lower().endswith(suffixes)]
        # A stat per file, in parallel (on a mount a stat waits on latency), taken in order.
        for p, regular in zip(named, map_ordered(Path.is_file, named), strict=True):
            if regular:
                found.append(p)
            elif not p.is_dir():
                raise DataError(not_a_file(p))
    return sorted(found)


def unread(
    folder: Path, suffixes: tuple[str, ...], examples: int, records: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """The files under `folder` that `expand` passes over (names ending in none of `suffixes`;
    hidden names and folders aside, as `walk` skips them; the dataset cards beside files ending
    in `records`, `dataset_cards`) and the links to folders it does not enter
    (`LINKED_FOLDER`): how many, the first `examples`."""
    from packtool.storage.passed_over import CARD_NAMES, CARD_NOTE, dataset_cards

    count, shown, read = 0, [], []
    for top, files in _visible(folder, None, links=True):  # unlistable: `walk` says so
        for name in files:
            if not name.lower().endswith(suffixes):
                count += 1
                if len(shown) < examples:
                    shown.append(os.path.join(top, name))
            elif records and (name.lower() in CARD_NAMES or name.lower().endswith(records)):
                read.append(os.path.join(top, name))  # only what `dataset_cards` looks at
    cards = dataset_cards(read, records)
    shown += [card + CARD_NOTE for card in cards[: max(0, examples - len(shown))]]
    return count + len(cards), shown


LINKED_FOLDER = " (a link to a folder, not followed)"
"""How `unread` names a symbolic link to a folder, which the walk does not enter (it may loop,
or lead out of the corpus); given as an input itself, it is read."""


def _visible(folder: Path, onerror: Any, links: bool = False) -> Iterator[tuple[str, list[str]]]:
    """(folder, file names) under `folder`, hidden names and folders left out: what `walk`
    and `unread` both go through (`links`: the links to folders among the names, marked)."""
    for top, dirs, files in os.walk(folder, onerror=onerror):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        names = [name for name in files if not name.startswith(".")]
        if links:  # os.walk lists a link to a folder among the folders, and never enters it
            names += [d + LINKED_FOLDER for d in dirs if os.path.islink(os.path.join(top, d))]
        yield top, names


_KINDS = (
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def what_is_at(path: str | os.PathLike) -> str | None:
    """None where `path` is a regular file (a link to one, an object); else what is there
    instead: `nothing`, `a folder`, `a pipe (FIFO)`, ... (a stat, never an open: opening a FIFO
    waits for its writer)."""
    if is_remote(path):
        return None if remote.is_file(path) else "a folder" if remote.is_dir(path) else "nothing"
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a dangling symbolic link" if os.path.islink(path) else "nothing"
    except OSError as exc:
        return f"not readable ({exc.strerror or exc})"
    if S_ISREG(mode):
        return None
    if S_ISDIR(mode):
        return "a folder"
    return next((what for test, what in _KINDS if test(mode)), "something else")


def not_a_file(path: Path) -> str:
    """Why `path`, which exists as a name, is not an input packtool can read."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return f"{path}: a symbolic link to {os.readlink(path)}, which does not exist"
    except OSError as exc:
        return f"{path}: cannot be followed ({exc.strerror or exc})"
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return (
        f"{path}: {kind}, not a regular file; packtool reads an input more than once (to check "
        "it, to read it, to resume), so save the stream to a file first"
    )


# --- reading -----------------------------------------------------------------------------------


def as_path(text: str | os.PathLike) -> Any:
    """An input path as the readers take it: a `Path`, or a `UPath` for a URL (a plan or a
    descriptor keeps inputs as strings)."""
    if is_remote(text):
        from packtool.storage import listing

        return listing.as_path(str(text))
    return Path(text)


def file_name(path: str | os.PathLike) -> str:
    """The name a file's format is told by (its suffixes): its last segment; a web URL's without
    its `?query` and `#fragment`, which name no part of the file (a presigned or CDN URL:
    `a.jsonl?X-Amz-Signature=...` is JSONL). A bucket's key keeps every character: `?` and `#`
    are part of a key (`q?.jsonl`), as of a local file's name."""
    text = os.fspath(path) if not is_remote(path) else str(path)
    if remote.scheme(text) in ("http", "https"):
        from urllib.parse import urlsplit

        return urlsplit(text).path.rsplit("/", 1)[-1]
    return text.rstrip("/").rsplit("/", 1)[-1] if is_remote(text) else Path(text).name


def _reads() -> Any:
    """`remote_read`, loaded at the first read of a URL (`import loader` does not load it)."""
    from packtool.storage import remote_read

    return remote_read


def open_input(path: str | os.PathLike, buffering: int = -1, end: int | None = None) -> BinaryIO:
    """`path` opened for reading bytes (the caller closes it); an object of a store opened
    for ranged reads that fetch the next block ahead, never one starting past `end` (where the
    caller stops reading: `remote_read.open_input`)."""
    if is_remote(path):
        return _reads().open_input(path, buffering, end)
    return open(path, "rb", buffering=buffering)  # noqa: SIM115 - the caller closes it


def prefetch(path: str | os.PathLike, start: int, end: int | None, size: int) -> None:
    """Begin fetching the start of the bytes `start`..`end` (None: to the end) of a file of
    `size` bytes this process reads next (an object of a store: `remote_read.prefetch`; a local
    file: nothing to do)."""
    if is_remote(path):
        _reads().prefetch(path, start, end, size)


def forget_prefetch(path: str | os.PathLike, start: int) -> None:
    """Drop what `prefetch(path, start, ...)` fetched if this process never read it (the
    partition failed or stopped first); nothing for a local file or a block already taken."""
    if is_remote(path):
        _reads().forget_prefetch(path, start)


SMALL_FILE_LIMIT = 4 << 30
"""The most bytes `read_bytes` / `read_text` read: manifests, records, tokenizer files."""


def read_bytes(path: str | os.PathLike) -> bytes:
    """The whole of a small regular file (`OSError` for anything else: a FIFO named
    `index.json` hung every reader of the dataset, `/dev/zero` grew it without bound)."""
    if is_remote(path):
        return _reads().read_bytes(path)
    st = os.stat(path)  # before the open, which waits for a FIFO's writer
    if not S_ISREG(st.st_mode):
        raise OSError(errno.EINVAL, "not a regular file", os.fspath(path))
    if st.st_size > SMALL_FILE_LIMIT:
        raise OSError(errno.EFBIG, f"{st.st_size:,} bytes, past {SMALL_FILE_LIMIT:,}")
    with open(path, "rb") as f:
        # Sized by the stat: `read(n)` allocates n bytes first, so `read(SMALL_FILE_LIMIT + 1)`
        # asked for 4 GiB of address space for every manifest and record, a MemoryError under
        # `ulimit -v` (as HPC jobs are often run) or with overcommit off.
        data = f.read(st.st_size + 1)
        if len(data) > st.st_size:  # it grew since the stat: the rest, up to the limit
            data += f.read()
    if len(data) > SMALL_FILE_LIMIT:
        raise OSError(errno.EFBIG, f"more than {SMALL_FILE_LIMIT:,} bytes")
    return data


@contextlib.contextmanager
def local_copy(path: str | os.PathLike, size: int) -> Iterator[Path | str]:
    """A local file holding `path`'s bytes: the file itself, or an object of a store downloaded
    once into the scratch folder (`remote_read.local_copy`, checked to be `size` bytes),
    removed on leaving. For a reader of every byte (`verify`): where ranged reads of each
    column chunk cost a request apiece, and a checksum read the object a second time."""
    if is_remote(path):
        with _reads().local_copy(path, size) as local:
            yield local
    else:
        yield path


def read_text(path: str | os.PathLike) -> str:
    """The whole of a small UTF-8 text file (`UnicodeDecodeError` for other bytes)."""
    return read_bytes(path).decode("utf-8")


def read_range(path: str | os.PathLike, start: int, end: int) -> bytes:
    """Bytes `start` to `end` of a file (of an object: one ranged GET)."""
    if is_remote(path):
        return _reads().read_range(path, start, end)
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def memory_map(path: str | os.PathLike) -> Any:
    """`path` memory-mapped read-only as a `pyarrow.NativeFile` (`local_files.memory_map`):
    random reads share the page cache across processes (the loader's workers). An object (a
    run's tail in a bucket) is read whole into memory."""
    if is_remote(path):
        import pyarrow as pa

        return pa.BufferReader(_reads().read_bytes(path))
    return local_files.memory_map(path)


def parquet_file(source: Any, **options: Any) -> Any:
    """`pyarrow.parquet.ParquetFile(source, **options)`; `source` a path or an opened file
    (`local_files.parquet_file`).

    An object in a store is read through a Python file object, whose reads come back as Python
    bytes that pyarrow holds on to (its `PyBuffer`). Decoded on pyarrow's thread pool (its
    default) or pre-buffered on its I/O pool, the last of them can be let go by a pool thread
    after the read returned; at the interpreter's exit that thread cannot take the GIL and the
    process aborts (`terminate called without an active exception`, exit 134, after `verify`
    printed OK). So such a file reads on the calling thread only (`_serial_parquet_file`)."""
    if is_remote(source):  # its footer, then each column chunk, by ranged reads
        with remote.naming(source):
            opened = _reads().open_random(source)  # every read inside `remote.naming`
            return _serial_parquet_file()(opened, **{**options, "pre_buffer": False})
    return local_files.parquet_file(source, **options)


@functools.cache
def _serial_parquet_file() -> type:
    """A `ParquetFile` whose reads never use pyarrow's thread pools (`parquet_file`)."""
    import pyarrow.parquet as pq

    class SerialParquetFile(pq.ParquetFile):
        def read_row_group(self, i, columns=None, use_threads=False, use_pandas_metadata=False):
            return super().read_row_group(i, columns, False, use_pandas_metadata)

        def read_row_groups(
            self, row_groups, columns=None, use_threads=False, use_pandas_metadata=False
        ):
            return super().read_row_groups(row_groups, columns, False, use_pandas_metadata)

        def iter_batches(
            self,
            batch_size=65536,
            row_groups=None,
            columns=None,
            use_threads=False,
            use_pandas_metadata=False,
        ):
            return super().iter_batches(batch_size, row_groups, columns, False, use_pandas_metadata)

        def read(self, columns=None, use_threads=False, use_pandas_metadata=False):
            return super().read(columns, False, use_pandas_metadata)

    return SerialParquetFile


def parquet_schema(path: str | os.PathLike) -> Any:
    """The Arrow schema of a Parquet file, from its footer."""
    if is_remote(path):
        return parquet_file(path).schema_arrow
    return local_files.parquet_schema(path)


def parquet_metadata(path: str | os.PathLike) -> Any:
    """The footer metadata of a Parquet file."""
    if is_remote(path):
        return parquet_file(path).metadata
    return local_files.parquet_metadata(path)


def open_random(path: str | os.PathLike) -> RandomFile:
    """`path` opened for reads at offsets (the caller closes it)."""
    return RandomFile(path)


# --- stat and list -----------------------------------------------------------------------------


def stat(path: str | os.PathLike, fresh: bool = False) -> Any:
    """`os.stat` (symlinks followed; `FileNotFoundError` when there is nothing); an object's
    size and modification time for a URL (`remote.RemoteStat`; `fresh`: asked of the store,
    not of what a listing in this process found)."""
    if is_remote(path):
        return remote.stat(path, fresh)
    return os.stat(path)


def stat_all(paths: Iterable[os.PathLike[str] | str]) -> list[Any]:
    """`stat` of every path, in order (`map_ordered`: a stat on a mount or of an object in a
    store waits on latency, so they run `prefetch.io_threads()` at a time)."""
    return list(map_ordered(stat, paths))


def file_states(paths: Iterable[os.PathLike[str] | str]) -> tuple[tuple[Any, int, int], ...]:
    """`(path, size, mtime_ns)` of every path, in order: the key under which an answer read
    from these files is kept (a changed file gives another key). Raises `OSError`."""
    paths = list(paths)
    return tuple(
        (p, st.st_size, st.st_mtime_ns) for p, st in zip(paths, stat_all(paths), strict=True)
    )


def size(path: str | os.PathLike) -> int:
    """The size of the file at `path`, in bytes."""
    return stat(path).st_size


def file_size(path: str | os.PathLike) -> int | None:
    """The size of the file (the object) at `path`, None where there is none (nothing, a
    folder, a prefix): on S3 one HEAD, where `stat` of nothing also lists the prefix."""
    if is_remote(path):
        return remote.file_size(path)
    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    return st.st_size if S_ISREG(st.st_mode) else None


def exists(path: str | os.PathLike) -> bool:
    """Something is at `path` (a symlink is followed: a dangling one is not there)."""
    if is_remote(path):
        return remote.exists(path)
    return os.path.exists(path)


def lexists(path: str | os.PathLike) -> bool:
    """A name is at `path`, even a dangling symlink."""
    if is_remote(path):
        return remote.exists(path)
    return os.path.lexists(path)


def is_file(path: str | os.PathLike) -> bool:
    """`path` is a regular file (or a symlink to one)."""
    if is_remote(path):
        return remote.is_file(path)
    return os.path.isfile(path)


def is_dir(path: str | os.PathLike) -> bool:
    """`path` is a folder (or a symlink to one); a prefix with objects under it, for a URL."""
    if is_remote(path):
        return remote.is_dir(path)
    return os.path.isdir(path)


def is_symlink(path: str | os.PathLike) -> bool:
    return False if is_remote(path) else os.path.islink(path)


def is_mount(path: str | os.PathLike) -> bool:
    """`path` is a mount point (it cannot be renamed away)."""
    return False if is_remote(path) else os.path.ismount(path)


def list_dir(folder: str | os.PathLike) -> list[Path]:
    """The entries of `folder` (hidden ones included), in the order the file system gives; the
    objects and sub-prefixes one level under a prefix."""
    if is_remote(folder):
        from packtool.storage import listing

        return listing.list_dir(folder)
    return list(Path(folder).iterdir())


def iter_names(folder: str | os.PathLike) -> Iterator[str]:
    """The names in `folder` one at a time: a caller that stops at what it looks for reads no
    more of a large folder (locally; under a prefix, `list_dir`'s one listing)."""
    if is_remote(folder):
        yield from (entry.name for entry in list_dir(folder))
        return
    with os.scandir(folder) as entries:
        yield from (entry.name for entry in entries)


def scan_dir(folder: str | os.PathLike) -> list[tuple[Path, bool]]:
    """`list_dir` with whether each entry is a regular file (not a link; under a prefix, an
    object), from the listing itself: no request (no stat) per entry."""
    if is_remote(folder):
        from packtool.storage import listing

        return listing.scan_dir(folder)
    with os.scandir(folder) as entries:
        return [(Path(e.path), e.is_file(follow_symlinks=False)) for e in entries]


def glob(folder: str | os.PathLike, pattern: str, recursive: bool = False) -> list[Path]:
    """The paths under `folder` matching `pattern` (`Path.glob`; `rglob` when `recursive`),
    sorted."""
    if is_remote(folder):
        from packtool.storage import listing

        return listing.glob(folder, pattern, recursive)
    folder = Path(folder)
    return sorted(folder.rglob(pattern) if recursive else folder.glob(pattern))


def resolve(path: str | os.PathLike) -> Any:
    """The absolute path with every symlink followed (`Path.resolve`: an lstat per part); a
    URL as it is."""
    if is_remote(path):
        return as_path(str(path))
    try:
        return Path(path).resolve()
    except RuntimeError:  # Python < 3.13 raises this for a loop (no OSError): a traceback
        raise DataError(f"{path}: cannot be followed (a loop of symbolic links)") from None


def cwd() -> Path:
    """The working folder, resolved."""
    return Path.cwd().resolve()


def which(program: str) -> str | None:
    """The path of `program` on PATH (`shutil.which`), or None."""
    import shutil

    return shutil.which(program)
