"""What a URL names (packtool/storage/listing.py), against what the same path names on disk:
a bucket on a real S3 API server on loopback (moto, through each client) and a folder served by
a real web server on loopback; no client library is mocked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packtool.errors import DataError
from packtool.read.corpus import expand_inputs
from tests.cli import run
from tests.packtool.storage.common import RangeHandler, web_server

TREE = {
    "dir/a.jsonl": 2,
    "dir/.hidden.jsonl": 3,
    "dir/.hid/c.jsonl": 5,
    "dir/sub/b.jsonl": 7,
    "dir/sub/.h2/d.jsonl": 11,
    "dir/.hid/deep/e.jsonl": 13,
}
"""A corpus with hidden files and folders: documents per file."""


def _write(root: Path, tree: dict[str, int]) -> Path:
    for name, documents in tree.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(f'{{"text": "{name} {i}"}}\n' for i in range(documents)))
    return root


def _upload(root: Path, bucket: str) -> None:
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    for p in sorted(root.rglob("*")):
        if p.is_file():
            client.upload_file(str(p), bucket, p.relative_to(root).as_posix())


def _named(pattern: str, base: str) -> list[str] | str:
    """The files `base/pattern` names, relative to `base`; or the error, from its colon on."""
    try:
        return [str(p)[len(base) + 1 :] for p in expand_inputs(f"{base}/{pattern}")]
    except DataError as exc:
        return str(exc).split(": ", 1)[1].replace("objects", "files")


GLOBS = (
    "dir/*/c.jsonl",  # `*` matches no hidden folder: nothing
    "dir/**/*.jsonl",  # `**` enters none
    "dir/*/*/*.jsonl",
    "dir/.hid/*.jsonl",  # a hidden folder written out is entered
    "dir/.*/c.jsonl",  # as is one matched by a pattern that starts with a dot
    "dir/.hid/**/*.jsonl",
    "dir/.*",
)


@pytest.fixture(scope="module")
def hidden_tree(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("hidden"), TREE)


def test_a_bucket_glob_skips_hidden_folders_as_a_local_glob_does(hidden_tree, s3_server, s3_client):
    """'s3://bkt/lay/dir/*/c.jsonl' read .hid/c.jsonl, where the same glob on disk matches no
    file, and '**/*.jsonl' read 70 documents against 65 on disk: only a match's last segment was
    checked for a leading dot."""
    bucket = f"hidden-{s3_client}"
    _upload(hidden_tree, bucket)
    for pattern in GLOBS:
        want = _named(pattern, str(hidden_tree))
        assert _named(pattern, f"s3://{bucket}") == want, pattern
    assert _named("dir/*/c.jsonl", str(hidden_tree)) == "glob matches no files"
    assert _named("dir/**/*.jsonl", str(hidden_tree)) == ["dir/a.jsonl", "dir/sub/b.jsonl"]


def test_a_web_glob_skips_hidden_folders_as_a_local_glob_does(hidden_tree):
    with web_server(hidden_tree, RangeHandler) as base:
        for pattern in GLOBS:
            assert _named(pattern, base) == _named(pattern, str(hidden_tree)), pattern


def test_a_key_with_a_dot_segment_is_read_with_its_prefix(s3_server, s3_client):
    """`dd/./e.jsonl` under s3://bkt/dd/ was dropped as "hidden", with no note, though it is
    read when named or globbed: a `.` or `..` segment is no hidden name (no file on disk has
    one)."""
    import boto3

    bucket = f"dots-{s3_client}"
    client = boto3.client("s3")
    client.create_bucket(Bucket=bucket)
    for key, documents in (("dd/./e.jsonl", 2), ("dd/f.jsonl", 3), ("dd/../g.jsonl", 5)):
        body = "".join(f'{{"text": "{key} {i}"}}\n' for i in range(documents))
        client.put_object(Bucket=bucket, Key=key, Body=body.encode())
    client.put_object(Bucket=bucket, Key="dd/./notes.bin", Body=b"x")
    client.put_object(Bucket=bucket, Key="dd/.hidden.jsonl", Body=b'{"text": "never"}\n')
    code, out, err = run("stats", f"s3://{bucket}/dd/", "--json")
    assert code == 0, err
    assert json.loads(out)["documents"] == 2 + 3 + 5
    assert f"not read (s3://{bucket}/dd/./notes.bin)" in err
    assert _named("dd/*/e.jsonl", f"s3://{bucket}") == ["dd/./e.jsonl"]  # as the glob reads it


NAMES = ("b.jsonl", "ünï.jsonl", "a b.jsonl", "h#1.jsonl", "p%20c.jsonl", "x[1].jsonl")
NAMES += ("q?.jsonl", "pl+us.jsonl", "sub/z.jsonl", "sub-x.jsonl", "Z.jsonl")
"""Names that a web page lists percent-encoded, and two a string sort puts in another order
than a folder's walk (`sub-x.jsonl` before `sub/z.jsonl`: '-' sorts before '/')."""


def _reads_back(name: str) -> bool:
    """Whether a web URL can name `name` as it is: decoded, it would mean another file."""
    return not any(c in name for c in "%#?[]*")


def test_a_web_folder_and_a_prefix_list_in_the_order_of_the_local_folder(tmp_path, s3_server):
    """A web folder's objects were sorted by their percent-encoded URLs: `ünï.jsonl` (%C3...)
    came first, so the shards differed from the local folder's (same documents and tokens), and
    index.json and skip messages showed the encoded names. They are now sorted, as a bucket
    prefix's are, by their names' segments, as a local folder's walk; and named by the decoded
    name where that reads the same file back."""
    from urllib.parse import quote

    local = _write(tmp_path / "www" / "f", {name: 3 + i for i, name in enumerate(NAMES)})
    want = _named("f", str(tmp_path / "www"))
    assert want[0] == "f/Z.jsonl" and want.index("f/sub/z.jsonl") < want.index("f/sub-x.jsonl")
    _upload(tmp_path / "www", "order")
    assert _named("f", "s3://order") == want
    options = ("--max-len", "64", "--workers", "1")
    code, _, err = run("pack", local, "-o", tmp_path / "local", *options)
    assert code == 0, err
    with web_server(tmp_path / "www", RangeHandler) as base:
        shown = [n if _reads_back(n) else "f/" + quote(n[2:]) for n in want]
        assert _named("f/", base) == shown
        code, _, err = run("pack", f"{base}/f/", "-o", tmp_path / "web", *options)
        assert code == 0, err
    shards = lambda d: {p.name: p.read_bytes() for p in sorted(d.glob("shard-*"))}  # noqa: E731
    assert shards(tmp_path / "web") == shards(tmp_path / "local")
    index = json.loads((tmp_path / "web" / "index.json").read_text())
    assert index["extra"]["doc_ids"]["files"] == [f"{base}/{n}" for n in shown]


def test_a_glob_lists_in_the_order_of_the_folder_walk(tmp_path, s3_server, s3_client):
    """A local glob sorted its matches as strings, `d/a-b.jsonl` before `d/a/x.jsonl` ('-'
    sorts before '/'), where the folder's walk sorts by segments: `tokenize d` and
    `tokenize 'd/**/*.jsonl'` gave the same documents other doc_ids. A bucket's or a web
    folder's glob sorted so too; each now lists in the walk's order."""
    _write(tmp_path / "www", {"d/a-b.jsonl": 2, "d/a/x.jsonl": 3, "d/a/y/z.jsonl": 1})
    base = str(tmp_path / "www")
    want = ["d/a/x.jsonl", "d/a/y/z.jsonl", "d/a-b.jsonl"]
    assert _named("d", base) == want
    assert _named("d/**/*.jsonl", base) == want
    bucket = f"order-{s3_client}"
    _upload(tmp_path / "www", bucket)
    assert _named("d/", f"s3://{bucket}") == want
    assert _named("d/**/*.jsonl", f"s3://{bucket}") == want
    with web_server(tmp_path / "www", RangeHandler) as url:
        assert _named("d/**/*.jsonl", url) == want
