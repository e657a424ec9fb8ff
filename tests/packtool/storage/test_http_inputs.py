"""Inputs from web servers (`http://`): real servers on loopback (the standard library's, which
ignores range requests, and ones that misbehave on purpose); no client library is mocked."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from tests.cli import run
from tests.packtool.storage.common import RangeHandler, web_server

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data"


def _stats(where: object) -> tuple[int, int]:
    code, out, err = run("stats", where, "--json")
    assert code == 0, err
    got = json.loads(out)
    return got["documents"], got["tokens"]


def test_a_web_url_with_a_query_or_a_fragment_is_read_by_the_suffix_of_its_path(tmp_path):
    """A presigned or CDN URL (`a.jsonl?X-Amz-Signature=...`) was read as one text document
    (an audit: 1 document of 1,499,693 tokens, where the URL without its query gave 2,082
    documents): the suffix was matched on the name with its query (or #fragment) on it."""
    www = tmp_path / "www"
    www.mkdir()
    shutil.copy(SAMPLE / "corpus.jsonl", www / "a.jsonl")
    (www / "a.jsonl.gz").write_bytes(gzip.compress((www / "a.jsonl").read_bytes()))
    shutil.copy(SAMPLE / "corpus.parquet", www / "b.parquet")
    (www / "c.json").write_text(json.dumps([{"text": "one two"}, {"text": "three"}]))
    with web_server(www, RangeHandler) as base:
        for name in ("a.jsonl", "a.jsonl.gz", "b.parquet", "c.json"):
            want = _stats(www / name)
            assert want[0] > 1
            for tail in ("?X-Amz-Signature=abc&X-Amz-Expires=60", "?v=1.txt", "#part"):
                assert _stats(f"{base}/{name}{tail}") == want, (name, tail)
        # the URL is kept whole for reading, and named so in the dataset
        url = f"{base}/a.jsonl?X-Amz-Signature=abc"
        code, _, err = run("pack", url, "-o", tmp_path / "web", "--max-len", 512)
        assert code == 0, err
    index = json.loads((tmp_path / "web" / "index.json").read_text())
    assert index["extra"]["doc_ids"]["files"] == [url]
    code, _, err = run("pack", www / "a.jsonl", "-o", tmp_path / "local", "--max-len", 512)
    assert code == 0, err
    shards = lambda d: {p.name: p.read_bytes() for p in sorted(d.glob("shard-*"))}  # noqa: E731
    assert shards(tmp_path / "web") == shards(tmp_path / "local")


def test_a_key_holding_a_question_mark_or_a_hash_is_read_by_its_whole_name(s3_server, s3_client):
    """In a bucket `?` and `#` are characters of a key, not a query or a fragment: a key
    `x.jsonl?v=1` is a file of that name, read as text, as a local file of that name is."""
    import boto3

    client = boto3.client("s3")
    client.create_bucket(Bucket="keys")
    body = b'{"text": "a b"}\n{"text": "c"}\n{"text": "d e f"}\n'
    for key in ("q?.jsonl", "h#1.jsonl", "x.jsonl?v=1"):
        client.put_object(Bucket="keys", Key=f"{s3_client}/{key}", Body=body)
    assert _stats(f"s3://keys/{s3_client}/q?.jsonl")[0] == 3
    assert _stats(f"s3://keys/{s3_client}/h#1.jsonl")[0] == 3
    assert _stats(f"s3://keys/{s3_client}/x.jsonl?v=1")[0] == 1  # no corpus suffix: one text
