"""Shared by the storage tests: what they pack (the sample corpus in small partitions: several
workers' worth), how they compare a dataset from a store with the local one, writers racing
for one lock object, and the requests a block of code makes (`requests_seen`)."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from packtool.engines.local import RunConfig, run_pack
from packtool.pack.chunk import PackConfig
from packtool.storage import remote, remote_write

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


PARTITION_SIZE = 300_000
"""`pack_config`'s partitions: 11 of the sample corpus."""
FEW_PARTITIONS = 1_100_000
"""Partitions of 1.1 MB: 3 of the sample corpus, still several workers' worth, for tests of
what a run does with its output (a bucket's commit, its lock) rather than of its partitions:
each partition of a run into a bucket is a dozen requests more (records, shards, tails) and, on
Slurm, a task of its own (a fresh interpreter)."""


def pack_config(out, inputs=(CORPUS,), partition_size=PARTITION_SIZE, **kw) -> RunConfig:
    """A pack of `inputs` into `out` at max_len 1024 in partitions of 300 kB (or
    `partition_size`), no progress bar."""
    return RunConfig(
        inputs=tuple(str(i) for i in inputs),
        out_dir=str(out),
        pack=PackConfig(max_len=1024),
        partition_size=partition_size,
        progress=False,
        **kw,
    )


def packed_files(out: Path, partition_size: int = PARTITION_SIZE) -> dict[str, bytes]:
    """A local pack of the corpus into `out`: every file's bytes by name."""
    run_pack(pack_config(out, partition_size=partition_size))
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def same_but_inputs(got: dict[str, bytes], want: dict[str, bytes]) -> bool:
    """The same shards, and manifests that differ only where they name the input (the doc-id
    file list, the fingerprint)."""
    if {k: v for k, v in got.items() if k != "index.json"} != {
        k: v for k, v in want.items() if k != "index.json"
    }:
        return False
    a, b = json.loads(got["index.json"]), json.loads(want["index.json"])
    for m in (a, b):
        m["extra"].pop("fingerprint"), m["extra"]["doc_ids"].pop("files")
    return a == b


def race_for_lock(url: str, writers: int = 8) -> tuple[list[Any], list[bytes]]:
    """`writers` threads released at once to take the lock object `url`, each with a note naming
    it (`{"writer": i}`): (the locks taken, the holders' notes the others were refused with)."""
    won: list[Any] = []
    refused: list[bytes] = []
    start = threading.Barrier(writers)

    def take(i: int) -> None:
        start.wait()
        try:
            won.append(remote_write.take_lock(url, json.dumps({"writer": i}).encode()))
        except remote_write.RemoteLockBusy as busy:
            refused.append(busy.holder)

    threads = [threading.Thread(target=take, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def bucket_fs(s3_server: str, bucket: str) -> Any:
    """Create `bucket` on the loopback server; an s3fs client (no instance cache) to look."""
    import boto3
    import s3fs

    boto3.client("s3").create_bucket(Bucket=bucket)
    return s3fs.S3FileSystem(endpoint_url=s3_server, skip_instance_cache=True)


def linked(fs: Any, bucket: str, prefix: str) -> str:
    """The version the link `index.json` of `bucket/prefix` names (listings cache dropped)."""
    fs.invalidate_cache()
    return json.loads(fs.cat_file(f"{bucket}/{prefix}/index.json"))["packtool_dataset"]


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """The standard library's file server (it ignores range requests: every GET gets the whole
    file), without its line per request on the stderr the CLI tests read."""

    def log_message(self, *args: Any) -> None:
        pass


class RangeHandler(QuietHandler):
    """A file server that answers a range request (`bytes=A-B`, `bytes=A-`) with those bytes
    (206), as nginx, Apache and object stores do."""

    def send_head(self) -> Any:
        import io
        import os
        import re

        path = self.translate_path(self.path)
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if wanted is None or not os.path.isfile(path):
            return super().send_head()
        data = Path(path).read_bytes()
        start = int(wanted.group(1))
        end = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
        if start >= len(data):
            self.send_error(416)
            return None
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.send_header("Content-Length", str(end + 1 - start))
        self.end_headers()
        return io.BytesIO(data[start : end + 1])


@contextlib.contextmanager
def web_server(folder: Path, handler: type = QuietHandler) -> Iterator[str]:
    """A web server on loopback serving `folder` (`handler`'s class) while the block runs: its
    base URL (`http://127.0.0.1:PORT`)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(folder))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def requests_seen(s3_server: str, monkeypatch: Any) -> Iterator[list[tuple[str, str]]]:
    """The requests the block makes to the S3 server, as `(method, path)`, in order: the tests'
    proxy (tests/packtool/storage/faulty_proxy.py, no faults) in front of it, and the clients
    made anew on entry and exit (they keep their endpoint)."""
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(s3_server, {})
    with proxy as proxy_url, monkeypatch.context() as through:
        through.setenv("AWS_ENDPOINT_URL", proxy_url)
        remote._filesystem.cache_clear()
        try:
            yield proxy.seen
        finally:
            remote._filesystem.cache_clear()
