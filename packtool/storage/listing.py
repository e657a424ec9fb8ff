"""What a URL names, listed: one object, the objects under a prefix, a glob's matches.

`expand` turns an input URL into the objects it names, as `storage.local.expand` does for
paths (an object named literally first, even with a glob character in its key; a trailing slash
names the prefix); `list_dir` and `glob` are the listings behind `storage.local`'s of a folder.
One listing per input (fsspec's `find` / `glob`: the store lists 1,000 keys a request), held by
the client's listings cache, so stats after it cost no request; within `finds_kept` (a command's
reading of its inputs) a prefix's listing is made once for `unread` and `expand` both.

`as_path` makes every URL's `UPath` (the listings' and `storage.local.as_path`'s), holding the
run's storage options (`remote.options_for`; http(s):// as `web.bounded_options` shapes them),
so that its own reads (`read_bytes`, `exists`: a library user's) reach the store packtool's do
(until 2026-12-07 a bare UPath: an endpoint named only in --storage-options was not reached).

Records in: a URL. Out: `UPath`s of objects, sorted.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from packtool.errors import DataError, MissingDependencyError
from packtool.storage.passed_over import CARD_NOTE, dataset_cards, passed_folders
from packtool.storage.remote import (
    check_bucket,
    filesystem,
    info_of,
    install_hint,
    is_web,
    naming,
    network_failure,
    options_for,
    scheme,
)


def as_path(text: str) -> Any:
    """A `UPath` for a URL (pathlib's naming methods on it), with the run's storage options."""
    try:
        from upath import UPath
    except ImportError:
        raise MissingDependencyError(install_hint(scheme(text) or "s3")) from None
    check_bucket(text)
    protocol = scheme(text) or ""
    options = options_for(protocol) if protocol else {}
    if protocol in ("http", "https"):  # as `remote.filesystem` gives them (no `retries`, ...)
        from packtool.storage import web

        options = web.bounded_options(options)
    return UPath(protocol + text[len(protocol) :], **options)  # `HF://x` as `hf://x`


_FOUND: ContextVar[dict[Any, tuple[Any, dict[str, Any]]] | None] = ContextVar(
    "found_prefixes", default=None
)


@contextmanager
def finds_kept() -> Iterator[None]:
    """Within it, a prefix is listed once (`_find`): `unread` (what a command passes over) and
    `expand` (what it reads) each walked every object under it, 1,000 keys a request, so a
    prefix of 10^6 objects was 2,000 requests, not 1,000. A failed listing is not kept."""
    token = _FOUND.set({})
    try:
        yield
    finally:
        _FOUND.reset(token)


def _find(fs: Any, p: str) -> dict[str, Any]:
    """`fs.find(p, withdirs=False, detail=True)`: every object under the prefix `p`, kept
    within `finds_kept` (for the same client object; another is listed anew)."""
    kept = _FOUND.get()
    if kept is not None:
        got = kept.get(p)
        if got is not None and got[0] is fs:
            return got[1]
    found = fs.find(p, withdirs=False, detail=True)
    if kept is not None:
        kept[p] = (fs, found)
    return found


def list_dir(folder: Any) -> list[Any]:
    """The objects and sub-prefixes one level under the prefix `folder` (none: an empty list):
    `scan_dir`'s entries (the same one listing; fsspec's names-only `ls` is made from it)."""
    return [path for path, _ in scan_dir(folder)]


def scan_dir(folder: Any) -> list[tuple[Any, bool]]:
    """`list_dir`, with whether each entry is an object (not only a sub-prefix), as the one
    listing says (a HEAD per entry cost a request each: 540 for a version of 270 shards)."""
    fs, p = filesystem(folder)
    with naming(folder):
        fs.invalidate_cache(p)
        try:
            found = fs.ls(p, detail=True)
        except FileNotFoundError:
            return []
    base, root = str(folder).rstrip("/"), p.rstrip("/")
    out = []
    for info in found:
        key = info["name"].rstrip("/")
        if key != root:
            out.append((as_path(f"{base}/{key.rsplit('/', 1)[-1]}"), info.get("type") == "file"))
    return out


def glob(folder: Any, pattern: str, recursive: bool = False) -> list[Any]:
    """The objects under the prefix `folder` whose names match `pattern` (at any depth when
    `recursive`), sorted."""
    import fnmatch

    fs, p = filesystem(folder)
    with naming(folder):
        fs.invalidate_cache(p)
        keys = fs.find(p, withdirs=False) if recursive else fs.ls(p, detail=False)
    base = str(folder).rstrip("/")
    root = p.rstrip("/")
    out = []
    for k in keys:
        rel = k[len(root) :].lstrip("/")
        if rel and fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pattern):
            out.append(as_path(f"{base}/{rel}"))
    return sorted(out, key=str)


def expand(
    text: str, suffixes: tuple[str, ...], described: str, records: tuple[str, ...] = ()
) -> list[Any]:
    """The objects a URL names: one object, every object under a prefix ("folder") whose name
    ends in `suffixes` (hidden names skipped; dataset cards beside objects ending in `records`
    too, `local.dataset_cards`), or a glob's matches; sorted. One listing per input (fsspec's
    `find` / `glob`: the store lists 1,000 keys a request)."""
    fs, p = filesystem(text)
    protocol = scheme(text) or ""
    with naming(text):
        # As for local paths: an object named literally is read as named even where its key
        # holds a glob character (`a*b.jsonl`, `x[1].jsonl`: they were globbed), and a trailing
        # slash names the prefix (fsspec's `info` strips it: an object of the same name was
        # read instead of the prefix's objects).
        info = None if text.endswith("/") else _found(fs, p)
        if info is not None and info.get("type") != "directory":
            folder = web_folder(text, info, suffixes)
            if folder is not None:  # its index page: read the folder, as on disk
                return expand(folder, suffixes, described, records)
            return [as_path(text)]
        if any(c in p for c in "*?[") and not text.endswith("/"):
            files, prefixes = _globbed(fs, p, protocol)
            if not files:
                from packtool.storage.passed_over import no_files_globbed

                shown = [_url(protocol, k, fs) for k in prefixes]
                raise DataError(no_files_globbed(text, shown, "objects", "prefix"))
            files.sort(key=lambda k: _plain(protocol, k).split("/"))  # as a prefix's, below
            return [as_path(_url(protocol, k, fs)) for k in files]
        if info is None and not text.endswith("/"):
            raise FileNotFoundError(p)  # neither object nor prefix: one line by `naming`
        keys = list(_find(fs, p))
        if not keys and protocol in ("http", "https", "hf") and _found(fs, p) is None:
            # fsspec's HTTP `find` lists a page that is not there (404) as empty, and
            # `HfFileSystem`'s a folder the repository does not hold: say so, not "holds no
            # corpus files", so a mistyped folder URL is not taken for an empty one (a Hub
            # repository's folders are git trees: one is there or not)
            raise FileNotFoundError(p)
        named = [
            k
            for k in keys
            if not any(hidden(part) for part in k[len(p) :].split("/"))
            and k.lower().endswith(suffixes)
        ]
        cards = set(dataset_cards(named, records))
        named = [k for k in named if k not in cards]
        if not named:
            raise DataError(f"{text}: prefix holds no corpus files (looked for {described})")
        # As a local folder's walk: by the names' segments (`sub/z` before `sub-x`, which a
        # string sort reverses), a web page's names decoded (`%C3%BC...` is `ü...`)
        named.sort(key=lambda k: _plain(protocol, k).split("/"))
        return [as_path(_url(protocol, k, fs)) for k in named]


def web_folder(text: str, info: dict[str, Any], suffixes: tuple[str, ...]) -> str | None:
    """For a web URL named without a trailing slash that `info` (fsspec's HTTP `info`, after
    redirects) says is a folder, the folder's URL (with its slash): a server redirects
    `http://host/text` to `http://host/text/`, the folder's HTML index page, which was read as
    one text document (until 2026-12-06). None for anything else.

    Raises:
        DataError: another HTML page named with no corpus suffix (it is no corpus file, as a
            folder's walk passes it over; read as one text document, its markup was packed).
    """
    from urllib.parse import urlsplit

    if scheme(text) not in ("http", "https") or text.endswith("/"):
        return None
    given, final = urlsplit(text), urlsplit(str(info.get("url") or text))
    if final.path.endswith("/") and not given.path.endswith("/"):
        plain = not (given.query or given.fragment)
        return text + "/" if plain else str(info["url"])
    html = str(info.get("mimetype") or "").lower() in ("text/html", "application/xhtml+xml")
    if html and not given.path.lower().endswith((*suffixes, ".json")):
        raise DataError(
            f"{text}: the server answers an HTML page ({info['mimetype']}), not a corpus file; "
            "a web folder is read by its URL with a trailing slash, and a page to read as "
            "text can be saved to a local file"
        )
    return None


def _globbed(fs: Any, p: str, protocol: str) -> tuple[list[str], list[str]]:
    """The keys of the objects the glob `p` matches (with the matched prefixes that are objects
    too, `_objects_too`) and of the prefixes it matches that are not, as Python's glob would
    match them (`_glob_shows`); one listing and a look at each matched prefix, kept within
    `finds_kept` as `_find`'s (the note on the prefixes a glob does not read and the files read
    share them)."""
    kept = _FOUND.get()
    got = kept.get(("glob", p)) if kept is not None else None
    if got is not None and got[0] is fs:
        files, prefixes = got[1]
        return list(files), list(prefixes)
    found = sorted(fs.glob(p, detail=True).items())
    shown = [(k, meta.get("type")) for k, meta in found if _glob_shows(p, k, protocol)]
    files = [k for k, kind in shown if kind != "directory"]
    prefixes = [k for k, kind in shown if kind == "directory"]
    # (Not on the web, whose folder's page is no file of it, nor on the Hub, whose git tree
    # cannot hold a file and a folder of one name.)
    if protocol not in ("http", "https", "hf"):
        objects = _objects_too(fs, prefixes)
        files += objects
        prefixes = [k for k in prefixes if k not in set(objects)]
    if kept is not None:
        kept[("glob", p)] = (fs, (files, prefixes))
    return list(files), list(prefixes)


def globbed_prefixes(text: str) -> list[str]:
    """The prefixes the glob `text` matches that are not objects too, as URLs, in the order
    `expand` sorts: `expand` reads none of them (a glob reads the objects it matches). Empty
    for anything but a glob, and for a glob matching no object (`expand`'s error names them)."""
    fs, p = filesystem(text)
    protocol = scheme(text) or ""
    if not any(c in p for c in "*?[") or text.endswith("/"):
        return []
    with naming(text):
        files, prefixes = _globbed(fs, p, protocol)
    if not files:
        return []  # `expand`'s error names them
    prefixes = passed_folders(prefixes, set(files))
    prefixes.sort(key=lambda k: _plain(protocol, k).split("/"))
    return [_url(protocol, k, fs) for k in prefixes]


def _objects_too(fs: Any, prefixes: list[str]) -> list[str]:
    """Those of the prefixes a glob matched that are objects too (`a.jsonl` beside
    `a.jsonl/b.jsonl`: a listing shows such a key as a folder only, so a glob passed the object
    over without a word, while the prefix read it); one look at the store each, side by side.
    A glob matches prefixes only where it names folders (`data/*`), as a local glob does."""
    if not prefixes:
        return []
    from concurrent.futures import ThreadPoolExecutor

    def an_object(key: str) -> bool:
        info = _found(fs, key)
        return info is not None and info.get("type") != "directory"

    with ThreadPoolExecutor(min(16, len(prefixes)), thread_name_prefix="packtool-glob") as pool:
        return [k for k, yes in zip(prefixes, pool.map(an_object, prefixes), strict=True) if yes]


def hidden(segment: str) -> bool:
    """A hidden name (`.x`), as a local walk or glob skips it. A `.` or `..` segment of a key
    (`dd/./e.jsonl`) is not one: no file on disk is named so (such a key under a prefix was
    dropped without a word, though read when named or globbed)."""
    return segment.startswith(".") and segment not in (".", "..")


def _glob_shows(pattern: str, key: str, protocol: str) -> bool:
    """Whether Python's glob (`glob.glob(recursive=True)`, what a local input's glob is) would
    match the key that the store's glob matched, as far as hidden names go: below the pattern's
    literal segments, a hidden name is matched only by a pattern segment that starts with a dot
    (`.hid`, `.*`), never by `*`, `?`, `[...]` or `**`. (fsspec checked none; packtool checked
    the last segment only, so `dir/*/c.jsonl` read `dir/.hid/c.jsonl`.)"""
    from glob import has_magic

    pat, parts = pattern.split("/"), key.split("/")
    first = next((i for i, seg in enumerate(pat) if has_magic(seg)), len(pat))
    if not any(hidden(part) for part in parts[first:]):
        return True  # the store's match stands (the common case: no hidden name at all)
    if protocol in ("http", "https"):  # a web page lists its names percent-encoded
        from urllib.parse import unquote

        parts = [unquote(part) for part in parts]
    return _segments_match(pat[first:], parts[first:])


def _segments_match(pat: list[str], parts: list[str]) -> bool:
    """`parts` matched by the glob segments `pat` as Python's glob matches them (hidden names
    by a segment that starts with a dot only; `**`: any number of visible segments)."""
    import fnmatch
    from glob import has_magic

    if not pat:
        return not parts
    head = pat[0]
    if head == "**":
        for i in range(len(parts) + 1):  # `**` takes parts[:i]
            if _segments_match(pat[1:], parts[i:]):
                return True
            if i < len(parts) and hidden(parts[i]):
                return False
        return False
    if not parts:
        return False
    if has_magic(head):
        shown = fnmatch.fnmatchcase(parts[0], head) and (
            head.startswith(".") or not hidden(parts[0])
        )
    else:
        shown = parts[0] == head
    return shown and _segments_match(pat[1:], parts[1:])


def _found(fs: Any, p: str) -> dict[str, Any] | None:
    """`p`'s info (an object's, or a prefix's: `type` "directory"), None for neither; asked of
    the store where a listing's cache calls it a directory (`remote.info_of`: a key can be an
    object and a prefix at once)."""
    try:
        return info_of(fs, p)
    except FileNotFoundError as exc:
        cause = exc.__cause__
        if cause is not None and network_failure(cause):
            raise  # fsspec's HTTP info calls a host it cannot reach "not found": `naming` says
        if getattr(cause, "status", 404) != 404:
            raise  # and a server's failed answer (503, 403): `naming` gives its status
        if cause is not None and is_web(fs) and getattr(cause, "status", None) is None:
            raise  # and a request the client refused (a bad option): `naming` gives the cause
        return None


def _url(protocol: str, key: str, fs: Any) -> str:
    """A listed key as a URL of the scheme the user wrote (`fs.unstrip_protocol` names the
    file system's first one: `az://` inputs came back as `abfs://`, `gcs://` as `gs://`); a
    web page's link by its decoded name where that names the same file (`_web_name`)."""
    if protocol in ("http", "https"):
        return _web_name(key)
    return f"{protocol}://{key.lstrip('/')}" if protocol else fs.unstrip_protocol(key)


def _plain(protocol: str, key: str) -> str:
    """A listed key as its names read: a web page's links are percent-encoded."""
    if protocol in ("http", "https"):
        from urllib.parse import unquote

        return unquote(key)
    return key


_KEEP_ENCODED = frozenset("%#?[]*/\\")
"""Characters a decoded web name may not hold and still be read back by its URL: a `%` would be
decoded again, `#` and `?` start a fragment and a query, `[`, `]` and `*` make a glob of an
input, `/` and `\\` split a path."""


def _web_name(url: str) -> str:
    """A web page's link (`.../%C3%BCn%C3%AF.jsonl`) with each segment of its path decoded
    (`.../ünï.jsonl`, as a local folder names the file) where the decoded segment reads the same
    file back (the client encodes it again on the way out); a segment whose decoding holds a
    character that would change what the URL means (`_KEEP_ENCODED`, a control character)
    keeps its encoding (`h%231.jsonl`, not `h#1.jsonl`)."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.query or parts.fragment:
        return url
    segments = []
    for segment in parts.path.split("/"):
        try:
            plain = unquote(segment, errors="strict")
        except UnicodeDecodeError:  # bytes that are no UTF-8: no name to decode to
            plain = "%"
        kept = _KEEP_ENCODED.intersection(plain) or any(ord(c) < 32 or ord(c) == 127 for c in plain)
        segments.append(segment if kept else plain)
    return urlunsplit(parts._replace(path="/".join(segments)))


def unread(
    text: str, suffixes: tuple[str, ...], examples: int, records: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """The objects under the prefix `text` that `expand` passes over (names ending in none of
    `suffixes`; hidden names and empty objects aside; dataset cards beside objects ending in
    `records`, `local.dataset_cards`): how many, the first `examples`.
    A listing of the prefix (1,000 keys a request; within `finds_kept` the one `expand` uses
    too): a prefix's other objects are never passed over in silence, as a local folder's files
    are not."""
    fs, p = filesystem(text)
    with naming(text):
        if any(c in p for c in "*?["):
            return 0, []  # a glob: nothing is passed over
        if not text.endswith("/"):  # a trailing slash names the prefix, as in `expand`
            info = _found(fs, p)
            folder = None if info is None else web_folder(text, info, suffixes)
            if folder is not None:  # a web folder named without its slash, as in `expand`
                return unread(folder, suffixes, examples, records)
            if info is None or info.get("type") != "directory":
                return 0, []  # an object or nothing: nothing is passed over
        try:
            found = _find(fs, p)
        except FileNotFoundError:
            return 0, []
    # A zero-byte object holds no text, so nothing is passed over: a folder marker (`w/sub/`,
    # what a console's "Create folder" writes) was named as an unread file.
    keys = sorted(k for k, info in found.items() if info.get("size", 1) != 0)
    protocol = scheme(text) or ""
    count, shown, read = 0, [], []
    for k in keys:
        rel = k[len(p) :]
        if any(hidden(part) for part in rel.split("/")):
            continue
        if not k.lower().endswith(suffixes):
            count += 1
            if len(shown) < examples:
                shown.append(_url(protocol, k, fs))
        elif records:
            read.append(k)
    cards = dataset_cards(read, records)
    shown += [_url(protocol, k, fs) + CARD_NOTE for k in cards[: max(0, examples - len(shown))]]
    count += len(cards)
    return count, shown
