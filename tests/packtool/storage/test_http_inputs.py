"""Inputs from web servers (`http://`): real servers on loopback (the standard library's, which
ignores range requests, and ones that misbehave on purpose); no client library is mocked."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import shutil
import threading
from pathlib import Path

import pyarrow.parquet as pq

from packtool.storage import web
from tests.cli import one_error_line, run
from tests.packtool.storage.common import QuietHandler, RangeHandler, web_server

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


def test_top_level_storage_options_reach_a_store_beside_another_scheme_s_options(tmp_path):
    # `{"s3": {...}, "headers": {...}}`: a key of a scheme dropped every top-level option in
    # silence; the top-level ones go to every store, a scheme's override them.
    seen: list[str | None] = []

    class Recording(RangeHandler):
        def send_head(self):
            seen.append(self.headers.get("X-Packtool-Test"))
            return super().send_head()

    shutil.copy(SAMPLE / "corpus.jsonl", tmp_path / "c.jsonl")
    for options, want in [
        ({"s3": {"anon": True}, "headers": {"X-Packtool-Test": "every"}}, "every"),
        ({"headers": {"X-Packtool-Test": "every"}, "http": {"headers": {"X-Packtool-Test": "web"}}}, "web"),
    ]:  # fmt: skip
        seen.clear()
        with web_server(tmp_path, Recording) as base:
            code, _, err = run("stats", f"{base}/c.jsonl", "--storage-options", json.dumps(options))
        assert code == 0, err
        assert seen and set(seen) == {want}, (options, seen)


def test_verify_and_inspect_take_storage_options(tmp_path):
    # Only PACKTOOL_STORAGE_OPTIONS reached them: `--storage-options` was "no such option".
    class Keyed(RangeHandler):
        def send_head(self):
            if self.headers.get("X-Packtool-Key") != "k":
                self.send_error(403)
                return None
            return super().send_head()

    code, _, err = run("pack", SAMPLE / "corpus.jsonl", "-o", tmp_path / "ds", "--max-len", 512)
    assert code == 0, err
    key = json.dumps({"http": {"headers": {"X-Packtool-Key": "k"}}})
    with web_server(tmp_path, Keyed) as base:
        code, out, err = run("verify", f"{base}/ds", "--storage-options", key)
        assert code == 0 and out.startswith("OK "), err
        code, out, err = run("inspect", f"{base}/ds", "--json", "--storage-options", key)
        assert code == 0 and json.loads(out), err
        code, _, err = run("verify", f"{base}/ds")
        assert code != 0 and "403" in one_error_line(err)
        code, _, err = run("inspect", f"{base}/ds", "--storage-options", "{not json")
        assert (
            code != 0
            and "--storage-options / PACKTOOL_STORAGE_OPTIONS: not JSON" in one_error_line(err)
        )


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


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def _parquet_corpus(folder: Path) -> Path:
    """Text Parquet under 64 KB (pyarrow's first read of the footer gets it all), a larger one
    of several row groups, and what `packtool tokenize` writes of the larger: a local folder."""
    folder.mkdir()
    table = pq.read_table(SAMPLE / "corpus.parquet")
    pq.write_table(table.slice(0, 40), folder / "small.parquet")
    pq.write_table(table, folder / "big.parquet", row_group_size=500)
    code, _, err = run("tokenize", folder / "big.parquet", "-o", folder / "tok.parquet")
    assert code == 0, err
    assert (folder / "small.parquet").stat().st_size < 64 << 10
    assert pq.ParquetFile(folder / "big.parquet").num_row_groups > 4
    return folder


def test_parquet_from_a_server_that_ignores_ranges_reads_as_the_local_file(tmp_path):
    """The standard library's server answers every ranged GET with the whole file: Parquet from
    it was a ValueError traceback ("The HTTP server doesn't appear to support range requests
    ... Open with block_size=0"), text or tokenized, big or small (stats of a 10 KB tokenized
    file too; `verify` of a dataset there). The whole file is now downloaded once per open and
    read from memory, with a note, as JSONL's blocks are cut out of such answers."""
    www = _parquet_corpus(tmp_path / "www")
    options = ["--max-len", "512", "--workers", "2", "--partition-size", "100KB"]
    with web_server(www) as base:
        for name in ("small.parquet", "big.parquet", "tok.parquet"):
            code, out, err = run("stats", f"{base}/{name}", "--json")
            assert code == 0, err
            assert name == "small.parquet" or "ignores range requests" in err  # one read
            code, want, err = run("stats", www / name, "--json")
            assert code == 0, err
            got, want = json.loads(out), json.loads(want)
            for stats in (got, want):  # it names the rows skipped by where they are
                stats["inputs"].pop("skipped_summary", None)
            assert got == want, name
            code, _, err = run("pack", f"{base}/{name}", "-o", tmp_path / "web" / name, *options)
            assert code == 0, err
            code, _, err = run("pack", www / name, "-o", tmp_path / "local" / name, *options)
            assert code == 0, err
            shards = _shards(tmp_path / "local" / name)
            assert shards and _shards(tmp_path / "web" / name) == shards, name
        # a dataset's shards are Parquet too: verify and inspect read them the same way
        shutil.copytree(tmp_path / "local" / "big.parquet", www / "ds")
        code, out, err = run("verify", f"{base}/ds")
        assert code == 0 and out.startswith(f"OK {base}/ds: "), err
        code, out, err = run("inspect", f"{base}/ds", "--row", 3)
        assert code == 0 and "from " in out, err


class CutHandler(RangeHandler):
    """A server whose connection drops halfway through any body over 100,000 bytes (its
    Content-Length says the whole): the footers read, the larger column chunks do not."""

    def copyfile(self, source, outputfile) -> None:
        data = source.read()
        outputfile.write(data[: len(data) // 2] if len(data) > 100_000 else data)


def test_a_parquet_read_that_fails_partway_is_one_line_naming_the_url(tmp_path):
    """A body cut short in a row group's read was a 115-line traceback ending in aiohttp's
    ClientPayloadError: the row groups were read outside `remote.naming`. (Each such read is
    tried twice here, not 5 times with their waits: every try is cut.)"""
    www = _parquet_corpus(tmp_path / "www")
    twice = ("--storage-options", json.dumps({"http": {"retries": {"max_attempts": 2}}}))
    with web_server(www, CutHandler) as base:
        for command, name in (("stats", "big"), ("pack", "big"), ("pack", "tok")):
            url = f"{base}/{name}.parquet"
            out = ("-o", tmp_path / command / name) if command == "pack" else ()
            code, _, err = run(command, url, *out, *twice)
            assert code == 1, err
            assert one_error_line(err).startswith(f"error: {url}: ClientPayloadError: "), err


class Unsized(RangeHandler):
    """A server that sends no Content-Length (the body ends with the connection, as HTTP/1.0
    allows), but answers a range request with its `Content-Range` (`bytes A-B/TOTAL`)."""

    def handle(self) -> None:
        # (a reader that had what it asked for closes the connection)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()

    def send_header(self, keyword: str, value: str) -> None:
        if keyword.lower() != "content-length":
            super().send_header(keyword, value)


class UnsizedWhole(Unsized):
    """`Unsized`, ignoring range requests too: every answer is the whole file."""

    def send_head(self):
        return QuietHandler.send_head(self)


def test_a_web_file_of_no_stated_size_is_planned_and_packed_as_the_local_file(tmp_path):
    # No Content-Length: its size was taken for 0, so the plan made one partition where the
    # local file makes several (other shards than a local pack). Its size is now learned: from a
    # range answer's total, or by counting the whole answer of a server that ignores ranges.
    # (A third of the corpus in partitions of 300 KB: 4, as the whole made of 1 MB; each
    # partition of the server that ignores ranges downloads the whole file.)
    lines = (SAMPLE / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "c.jsonl").write_bytes(b"".join(lines[: len(lines) // 3]))
    options = ["--max-len", "512", "--partition-size", "300KB", "--workers", "2"]
    code, _, err = run("pack", tmp_path / "c.jsonl", "-o", tmp_path / "local", *options)
    assert code == 0, err
    want = _shards(tmp_path / "local")
    assert len(want) > 2 and len(list((tmp_path / "local").glob("shard-*-00000.parquet"))) > 2
    for handler in (Unsized, UnsizedWhole):
        out = tmp_path / handler.__name__
        with web_server(tmp_path, handler) as base:
            code, _, err = run("pack", f"{base}/c.jsonl", "-o", out, *options)
        assert code == 0, err
        assert _shards(out) == want, handler.__name__


def test_a_web_folder_named_without_its_slash_is_read_as_the_folder(tmp_path):
    """`http://host/text` (no trailing slash) is redirected to `http://host/text/`, the folder's
    HTML index page: that page was read as one text document, exit 0. The folder is read, as
    the local folder named without a slash is; an HTML page named with no corpus suffix is
    refused, not read as text."""
    shutil.copytree(SAMPLE / "text", tmp_path / "text")
    (tmp_path / "page.html").write_text("<html><body><a href='a.txt'>a.txt</a></body></html>")
    want = _stats(tmp_path / "text")
    with web_server(tmp_path) as base:
        assert _stats(f"{base}/text") == want
        assert _stats(f"{base}/text/") == want
        for page in (f"{base}/page.html", f"{base}/page.html?v=1"):
            code, _, err = run("stats", page)
            assert code == 1
            line = one_error_line(err)
            assert line.startswith(f"error: {page}: the server answers an HTML page"), line


class Faulty(RangeHandler):
    """A server that answers every 4th request 503, drops every 9th connection unanswered and
    cuts every 11th body in half (its Content-Length the whole), as the S3 tests' proxy does."""

    count = 0
    lock = threading.Lock()

    def handle_one_request(self) -> None:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle_one_request()

    def send_head(self):
        with Faulty.lock:
            Faulty.count += 1
            n = Faulty.count
        if n % 4 == 0:
            self.send_error(503)
            return None
        if n % 9 == 0:
            self.close_connection = True
            self.requestline = ""  # nothing is answered
            raise ConnectionResetError
        source = super().send_head()
        if n % 11 == 0 and source is not None:
            data = source.read()
            self.close_connection = True
            return io.BytesIO(data[: len(data) // 2])
        return source


def test_a_web_server_s_transient_failures_are_retried(tmp_path, monkeypatch):
    """One 503, dropped connection or cut body among a run's requests failed it
    (`ClientResponseError: 503`): http(s) reads were never retried."""
    monkeypatch.setattr(web, "BACKOFF", 0.01)  # the workers are threads of this process
    monkeypatch.setenv("PACKTOOL_WORKER_POOL", "thread")
    lines = (SAMPLE / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "c.jsonl").write_bytes(b"".join(lines[:400]))
    pq.write_table(
        pq.read_table(SAMPLE / "corpus.parquet").slice(0, 300),
        tmp_path / "d.parquet",
        row_group_size=50,
    )
    options = ["--max-len", "512", "--partition-size", "100KB", "--workers", "2"]
    for name in ("c.jsonl", "d.parquet"):
        code, _, err = run("pack", tmp_path / name, "-o", tmp_path / "local" / name, *options)
        assert code == 0, err
        Faulty.count = 0
        with web_server(tmp_path, Faulty) as base:
            code, _, err = run("pack", f"{base}/{name}", "-o", tmp_path / "web" / name, *options)
        assert code == 0, err
        assert Faulty.count > 11, Faulty.count  # every fault was met
        assert _shards(tmp_path / "web" / name) == _shards(tmp_path / "local" / name), name


class ShortRanges(RangeHandler):
    """A server whose range answers (206) hold fewer bytes than asked for: none at all
    (`EMPTY`), or half (their Content-Length and Content-Range say so)."""

    EMPTY = True

    def send_head(self):
        import os
        import re

        path = self.translate_path(self.path)
        wanted = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if wanted is None or not os.path.isfile(path):
            return super().send_head()
        data = Path(path).read_bytes()
        start, end = int(wanted.group(1)), min(int(wanted.group(2)), len(data) - 1)
        body = b"" if self.EMPTY else data[start : start + (end + 1 - start) // 2]
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)


class HalfRanges(ShortRanges):
    EMPTY = False


def test_a_range_answered_short_is_an_error_not_the_end_of_the_file(tmp_path, monkeypatch):
    """A 206 with an empty body was taken for the end of the file: the data after it was lost
    without a word ("packed 4,024 of 4,030 documents", exit 0)."""
    monkeypatch.setattr(web, "BACKOFF", 0.01)
    monkeypatch.setenv("PACKTOOL_WORKER_POOL", "thread")
    lines = (SAMPLE / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "c.jsonl").write_bytes(b"".join(lines[:400]))
    pq.write_table(pq.read_table(SAMPLE / "corpus.parquet").slice(0, 300), tmp_path / "d.parquet")
    for handler in (ShortRanges, HalfRanges):
        with web_server(tmp_path, handler) as base:
            for command, url in (
                ("stats", f"{base}/c.jsonl"),
                ("pack", f"{base}/c.jsonl"),
                ("stats", f"{base}/d.parquet"),
            ):
                out = ("-o", tmp_path / command / handler.__name__) if command == "pack" else ()
                code, _, err = run(command, url, *out, "--max-len", "512")
                assert code == 1, (handler.__name__, command, err)
                line = one_error_line(err)
                assert line.startswith(f"error: {url}: bytes "), line
                assert "came back" in line, line


class GzipEncoded(RangeHandler):
    """A server that labels every answer `Content-Encoding: gzip` (an object stored with that
    metadata: `aws s3 cp --content-encoding gzip`, Apache's `AddEncoding`), whatever is asked,
    its ranges ranges of the stored bytes."""

    def end_headers(self) -> None:
        self.send_header("Content-Encoding", "gzip")
        super().end_headers()

    def handle(self) -> None:  # (a reader that had what it asked for closes the connection)
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            super().handle()


def test_a_file_the_server_labels_gzip_encoded_is_read_as_stored(tmp_path):
    """aiohttp decompressed each ranged body of such a file on its own: a `.jsonl.gz` was
    taken for a server that ignores ranges and then refused ("the file is not compressed: drop
    the .gz"), and a `.jsonl` stored compressed failed as "ClientPayloadError: 400, message:",
    its cause cut off. The stored bytes are read now (their size is what the server states);
    a file whose name does not say it is compressed is one line saying what the server does."""
    lines = (SAMPLE / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    text = b"".join(lines[:400])
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(text))
    (tmp_path / "b.jsonl").write_bytes(gzip.compress(text))
    want = _stats(tmp_path / "a.jsonl.gz")
    with web_server(tmp_path, GzipEncoded) as base:
        code, out, err = run("stats", f"{base}/a.jsonl.gz", "--json")
        assert code == 0, err
        assert "range" not in err, err
        got = json.loads(out)
        assert (got["documents"], got["tokens"]) == want
        code, _, err = run("stats", f"{base}/b.jsonl")
        assert code == 1
        line = one_error_line(err)
        assert line.startswith(f"error: {base}/b.jsonl: the server sends it gzip-encoded"), line
