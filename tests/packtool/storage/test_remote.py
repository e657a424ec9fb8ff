"""Inputs in object storage: `s3://` read from a real S3 API server on loopback (moto's server
mode, the `s3_server` fixture) through s3fs, as users read them; no client library is mocked.
Schemes whose servers cannot run here (gs://, az://, hf://) are covered by the dispatch and the
missing-extra error only."""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from packtool.dataset.manifest import read_manifest
from packtool.engines.local import run_pack
from packtool.engines.plan import check_unchanged, describe
from packtool.errors import ConfigError, DataError, MissingDependencyError
from packtool.storage import local as storage
from packtool.storage import remote, remote_read, s3_native
from tests.cli import one_error_line, run
from tests.packtool.storage.common import pack_config, requests_seen

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "sample_data"


@pytest.fixture(scope="module")
def bucket(s3_server, tmp_path_factory):
    """The same corpus in a local folder and under `s3://corpus/data/`: the sample JSONL (cut
    into byte ranges), its Parquet (row groups), a gzipped JSONL, and a hidden file (skipped)."""
    import boto3

    local = tmp_path_factory.mktemp("corpus")
    shutil.copy(SAMPLE / "corpus.jsonl", local / "a.jsonl")
    table = pq.read_table(SAMPLE / "corpus.parquet")
    pq.write_table(table, local / "b.parquet", row_group_size=500)
    with gzip.open(local / "c.jsonl.gz", "wt") as f:
        f.write('{"text": "one"}\n{"text": "two"}\n')
    (local / ".hidden.jsonl").write_text('{"text": "never read"}\n')
    client = boto3.client("s3")
    client.create_bucket(Bucket="corpus")
    for p in local.iterdir():
        client.upload_file(str(p), "corpus", f"data/{p.name}")
    return local


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


@pytest.fixture(scope="module")
def local_pack(bucket, tmp_path_factory) -> tuple[Any, dict[str, bytes]]:
    """The local folder of `bucket` packed (`pack_config`), what the packs of `s3://corpus/data/`
    are compared with: (its summary, its shards' bytes by name)."""
    out = tmp_path_factory.mktemp("local") / "ds"
    return run_pack(pack_config(out, [bucket])), _shards(out)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_pack_from_a_bucket_writes_the_shards_of_the_same_local_pack(
    local_pack, tmp_path, workers
):
    want, shards = local_pack
    got = run_pack(pack_config(tmp_path / "s3", ["s3://corpus/data/"], workers=workers))
    assert got.partitions == want.partitions >= 12  # byte ranges and row groups, as locally
    assert _shards(tmp_path / "s3") == shards
    assert got.counts == want.counts and got.skips == want.skips
    doc_ids = json.loads((tmp_path / "s3" / "index.json").read_text())["extra"]["doc_ids"]
    names = ["a.jsonl", "b.parquet", "c.jsonl.gz"]  # the hidden object skipped, as a hidden file
    assert doc_ids["files"] == [f"s3://corpus/data/{n}" for n in names]
    assert read_manifest(tmp_path / "s3").extra["partitions"] == got.partitions


def test_the_ray_engine_reads_a_bucket_from_its_own_workers(ray_session, local_pack, tmp_path):
    """Ray's workers were started before the S3 variables were set here: they read the bucket
    with what the driver hands them (`remote.forwarded_env` in the actors' runtime_env). One
    actor: where its variables come from is the point, not a pool of two (~3-5 s of CPU more)."""
    from packtool.engines.ray import RayConfig, run_pack_ray

    run_pack_ray(pack_config(tmp_path / "ray", ["s3://corpus/data/"]), RayConfig(actors=1))
    assert _shards(tmp_path / "ray") == local_pack[1]


def test_a_pack_rides_out_throttling_dropped_connections_and_cut_bodies(
    local_pack, s3_server, tmp_path, monkeypatch, s3_client
):
    """Through a proxy that answers every 4th object read with 503 SlowDown, drops every 9th
    connection unanswered and cuts every 11th body in half, at most twice each per object: the
    same shards, by retries, each kind of fault met on the JSONL object's byte ranges and on the
    Parquet object's row groups. (Not on every period: after a SlowDown, botocore's adaptive
    retry mode, which packtool sets for s3fs, paces every request of the client, ~2 a second
    while one in four was refused, and the s3fs run took 40 s waiting.)"""
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(s3_server, {"slowdown": 4, "drop": 9, "truncate": 11}, most=2)
    with proxy as url:
        monkeypatch.setenv("AWS_ENDPOINT_URL", url)
        remote._filesystem.cache_clear()
        run_pack(pack_config(tmp_path / "s3", ["s3://corpus/data/"], workers=1))
    remote._filesystem.cache_clear()
    assert _shards(tmp_path / "s3") == local_pack[1]
    for fault in ("slowdown", "drop", "truncate"):
        for name in ("a.jsonl", "b.parquet"):
            assert proxy.by_object.get((fault, f"/corpus/data/{name}"), 0) >= 1, proxy.by_object


def test_a_worker_reads_its_own_byte_ranges(bucket, tmp_path, monkeypatch):
    """Each partition of the 3 MB JSONL object reads its range and at most one block beyond
    it (64 KB here), read-ahead included: 11 partitions fetch about the object once, not 11
    times."""
    fetched: dict[str, int] = {}
    real = remote_read._fetch_range

    def counting(fs, path, start, end, url):
        data = real(fs, path, start, end, url)
        fetched[path] = fetched.get(path, 0) + len(data)
        return data

    monkeypatch.setattr(remote_read, "_fetch_range", counting)
    monkeypatch.setattr(remote_read, "READ_BYTES", 65536)
    monkeypatch.setattr("packtool.read.compressed.BUFFER_BYTES", 65536)
    monkeypatch.setattr("packtool.read.lines.BUFFER_BYTES", 65536)
    summary = run_pack(pack_config(tmp_path / "out", ["s3://corpus/data/a.jsonl"], workers=1))
    size = (bucket / "a.jsonl").stat().st_size
    assert summary.partitions == 11
    assert size <= fetched["corpus/data/a.jsonl"] <= size + 11 * 2 * 65536


def test_with_the_default_blocks_the_partitions_fetch_an_object_about_once(
    bucket, tmp_path, monkeypatch
):
    """With the real block sizes (256 KB, then 1 MB, then 16 MB) each ~282 KB partition fetched a
    1 MB block from just before its end: 13.3 MB served for the 3.1 MB object, 4.3 times (the
    stores audit). A block now stops `TAIL_BYTES` past its range; the kind probe (the first two
    GETs, before the pack) aside, the partitions fetch the object about once."""
    asked: list[tuple[int, int]] = []
    real = remote_read._fetch_range

    def counting(fs, path, start, end, url):
        asked.append((start, end))
        return real(fs, path, start, end, url)

    monkeypatch.setattr(remote_read, "_fetch_range", counting)
    summary = run_pack(pack_config(tmp_path / "out", ["s3://corpus/data/a.jsonl"], workers=1))
    size = (bucket / "a.jsonl").stat().st_size
    assert summary.partitions == 11
    # The probe reads the first partition's range as the partition does (it stops there too).
    probe, reads = asked[:2], asked[2:]
    assert probe[0] == (0, remote_read.FIRST_READ_BYTES)
    fetched = sum(e - s for s, e in reads)
    assert size <= fetched <= size + 11 * 2 * (64 << 10), (fetched, size)  # TAIL_BYTES


def test_a_partition_of_several_objects_fetches_the_next_ones_first_blocks_ahead_each_once(
    bucket, tmp_path, monkeypatch
):
    """One partition over 8 objects (the sample cut in 8): while one object is read, the first
    blocks of the next are already on their way (`remote_read.prefetch`), and the reader takes them:
    every byte of every object is fetched exactly once, and the shards are a local pack's."""
    import boto3

    data = (SAMPLE / "corpus.jsonl").read_bytes()
    cuts = [0] + [data.index(b"\n", len(data) * i // 8) + 1 for i in range(1, 8)] + [len(data)]
    local = tmp_path / "parts"
    local.mkdir()
    client = boto3.client("s3")
    for i in range(8):
        (local / f"p{i}.jsonl").write_bytes(data[cuts[i] : cuts[i + 1]])
        client.upload_file(str(local / f"p{i}.jsonl"), "corpus", f"eight/p{i}.jsonl")
    asked: list[tuple[str, int, int, str]] = []
    real = remote_read._fetch_range

    def counting(fs, path, start, end, url):
        asked.append((path, start, end, threading.current_thread().name))
        return real(fs, path, start, end, url)

    monkeypatch.setattr(remote_read, "_fetch_range", counting)
    monkeypatch.setattr(remote_read, "FIRST_READ_BYTES", 4096)
    monkeypatch.setattr(remote_read, "READ_BYTES", 65536)
    whole = {"workers": 1, "partition_size": 64 << 20}  # one partition of 8 pieces
    got = run_pack(replace(pack_config(tmp_path / "s3", ["s3://corpus/eight/"]), **whole))
    want = run_pack(replace(pack_config(tmp_path / "local", [local]), **whole))
    assert got.partitions == want.partitions == 1
    assert _shards(tmp_path / "s3") == _shards(tmp_path / "local")
    for i in range(8):
        gets = [(s, e) for p, s, e, _ in asked if p == f"corpus/eight/p{i}.jsonl"]
        # The probe of the object's first record (is it SFT data?) comes first, before the
        # pack: its first block alone. Then the partition's reading, which fetches the whole
        # object, each byte once.
        assert gets[:1] == [(0, 4096)]
        ranges = sorted(gets[1:])
        assert ranges[0][0] == 0 and ranges[-1][1] == cuts[i + 1] - cuts[i]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    # The reading opened no object after the first with a GET on its own thread: that first
    # block had been fetched ahead, on a read-ahead thread, while the object before was read.
    for i in range(1, 8):
        reading = [a for a in asked if a[0] == f"corpus/eight/p{i}.jsonl"][1:]
        (thread,) = [t for _, start, _, t in reading if start == 0]
        assert thread.startswith("packtool-readahead"), (i, thread)


def test_probing_the_kind_of_an_object_downloads_its_first_blocks_not_the_object(
    bucket, monkeypatch
):
    """The first record of every input is read before anything else (is it SFT data?). Of the
    3 MB JSONL object that probe asks for the first block alone, 256 KB; until 2026-12-06 also
    the block fetched ahead (1 MB, a second GET), and before that a full 16 MB one, the rest of
    the object here, so a probe of a corpus downloaded all of it once more."""
    from packtool.read.documents import ReadConfig
    from packtool.sft.inputs import dataset_kind

    asked: list[tuple[str, int, int]] = []
    real = remote_read._fetch_range

    def counting(fs, path, start, end, url):
        asked.append((path, start, end - start))
        return real(fs, path, start, end, url)

    monkeypatch.setattr(remote_read, "_fetch_range", counting)
    assert dataset_kind([storage.as_path("s3://corpus/data/a.jsonl")], ReadConfig()) == "text"
    time.sleep(0.5)  # a fetch ahead would be on its thread by now
    first = remote_read.FIRST_READ_BYTES
    assert (bucket / "a.jsonl").stat().st_size > (1 + remote_read.GROWTH) * first
    assert asked == [("corpus/data/a.jsonl", 0, first)]


def test_stats_and_tokenize_read_a_glob_of_objects(bucket, tmp_path):
    code, out, err = run("stats", "s3://corpus/data/*.jsonl", "--json")
    assert code == 0, err
    code, want, err = run("stats", bucket / "a.jsonl", "--json")
    assert code == 0, err
    got, expected = json.loads(out), json.loads(want)
    assert got["documents"] == expected["documents"] and got["tokens"] == expected["tokens"]
    code, _, err = run("tokenize", "s3://corpus/data/b.parquet", "-o", tmp_path / "t.parquet")
    assert code == 0, err
    code, _, err = run("tokenize", bucket / "b.parquet", "-o", tmp_path / "l.parquet")
    assert code == 0, err
    a, b = pq.read_table(tmp_path / "t.parquet"), pq.read_table(tmp_path / "l.parquet")
    assert a.column("input_ids") == b.column("input_ids") and a.column("doc_id") == b.column(
        "doc_id"
    )


def test_mixed_local_and_remote_inputs_and_a_megatron_output(bucket, tmp_path):
    from packtool.engines.megatron.run import tokenize_megatron

    both = [bucket / "a.jsonl", "s3://corpus/data/c.jsonl.gz"]
    tokenize_megatron(both, tmp_path / "mixed", progress=False)
    tokenize_megatron(
        [bucket / "a.jsonl", bucket / "c.jsonl.gz"], tmp_path / "local", progress=False
    )
    for suffix in (".bin", ".idx"):
        got = (tmp_path / f"mixed{suffix}").read_bytes()
        assert got == (tmp_path / f"local{suffix}").read_bytes()


def test_an_object_changed_after_planning_is_refused(bucket, s3_server, s3_client):
    import boto3

    client = boto3.client("s3")
    client.put_object(Bucket="corpus", Key="moving/x.jsonl", Body=b'{"text": "aaaa"}\n')
    url = "s3://corpus/moving/x.jsonl"
    planned = describe(storage.as_path(url), "jsonl", 1 << 20)
    check_unchanged(url, planned.size, planned.mtime_ns)  # unchanged: passes
    client.put_object(Bucket="corpus", Key="moving/x.jsonl", Body=b'{"text": "bbbb"}\n')
    with pytest.raises(DataError, match="changed since the run was planned"):
        check_unchanged(url, planned.size, planned.mtime_ns)  # same size, other ETag


def test_the_one_line_errors(bucket, tmp_path, monkeypatch, s3_client):
    code, _, err = run("stats", "s3://corpus/data/nope.jsonl")
    assert code != 0 and "s3://corpus/data/nope.jsonl" in one_error_line(err)
    code, _, err = run("stats", "s3://no-such-bucket/x.jsonl")
    assert code != 0 and "s3://no-such-bucket/x.jsonl" in one_error_line(err)
    code, _, err = run("stats", "s3://corpus/data/*.txt")
    assert code != 0 and "glob matches no objects" in one_error_line(err)
    code, _, err = run("stats", "s3://corpus/data/", "--storage-options", "{not json")
    assert code != 0 and "--storage-options / PACKTOOL_STORAGE_OPTIONS: not JSON" in one_error_line(
        err
    )
    # A scheme whose library is not installed (gcsfs, hidden from this process's imports, and
    # from fsspec's registry of the classes it imported already: an earlier test's gs://).
    monkeypatch.setitem(sys.modules, "gcsfs", None)
    for name in ("gs", "gcs"):
        monkeypatch.delitem(sys.modules["fsspec.registry"]._registry, name, raising=False)
    remote._filesystem.cache_clear()
    with pytest.raises(MissingDependencyError, match=r"packtool\[gcs\]"):
        storage.expand(["gs://bucket/x.jsonl"], (".jsonl",), ".jsonl")
    remote._filesystem.cache_clear()


def test_a_short_answer_names_the_object_with_its_scheme(bucket, s3_client):
    """A range answered short named the client's path, `corpus/data/a.jsonl: bytes ...`, no
    s3:// (audit remote, swap9.log): the URL as given now."""
    url = "s3://corpus/data/a.jsonl"
    size = storage.size(url)
    with pytest.raises(DataError) as got:
        remote_read.read_range(url, size - 10, size + 10)  # past the end: 10 bytes come back
    assert str(got.value).startswith(f"{url}: bytes {size - 10:,}-{size + 10:,} came back 10 long")


WRONG_S3_OPTIONS = [
    ({"config_kwargs": 5}, "'config_kwargs' must be a JSON object"),
    ({"config_kwargs": {"retries": 3}}, "'config_kwargs.retries' must be a JSON object"),
    ({"retries": 3}, "'retries' goes in config_kwargs"),
    ({"retries": {"max_attempts": "x"}}, "'retries' goes in config_kwargs"),
    ({"bogus_option": 1}, "'bogus_option' is no s3 option"),
    ({"config_kwargs": {"retries": {"max_attempts": "x"}}},
     "'config_kwargs.retries.max_attempts' must be a whole number of at least 1, got \"x\""),
    ({"config_kwargs": {"retries": {"tries": 2}}}, "'config_kwargs.retries.tries' is no s3 option"),
    ({"config_kwargs": {"read_timeout": "x"}}, "'config_kwargs.read_timeout' must be seconds"),
    ({"config_kwargs": {"bogus": 1}}, "'config_kwargs.bogus' is no s3 option"),
    ({"client_kwargs": 5}, "'client_kwargs' must be a JSON object"),
    ({"client_kwargs": {"bogus": 1}}, "'client_kwargs.bogus' is no s3 option"),
    ({"key": 5}, "'key' must be a string"),
    ({"anon": "yes"}, "'anon' must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize("client", ["auto", "obstore", "s3fs"])
def test_a_wrong_s3_option_is_one_line_naming_it(bucket, tmp_path, monkeypatch, client):
    """Each was a TypeError traceback (`{"config_kwargs": 5}`: 45 lines), or one line that did
    not name the option (`AttributeError: 'int' object has no attribute 'get'`, `invalid literal
    for int()`, `AioSession.__init__() got an unexpected keyword argument`), through either
    client: now one line naming the option and what it must be, before any request."""
    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    url = "s3://corpus/data/a.jsonl"
    try:
        for options, said in WRONG_S3_OPTIONS:
            remote._filesystem.cache_clear()
            code, _, err = run("stats", url, "--storage-options", json.dumps(options))
            line = one_error_line(err)
            assert code == 1 and line.startswith(
                f"error: {url}: --storage-options / PACKTOOL_STORAGE_OPTIONS: "
            ), line
            assert said in line, (options, line)
            assert "credentials" not in line  # the option is wrong, not the credentials
        for options, said in WRONG_S3_OPTIONS[:3]:
            remote._filesystem.cache_clear()
            out = tmp_path / f"ds-{client}"
            code, _, err = run("pack", url, "-o", out, "--storage-options", json.dumps(options))
            assert code == 1 and said in one_error_line(err), err
        remote._filesystem.cache_clear()  # and a right one still reads
        good = {"config_kwargs": {"connect_timeout": 5, "retries": {"max_attempts": 3}}}
        code, out, err = run("stats", url, "--storage-options", json.dumps(good))
        assert code == 0, err
    finally:
        remote._filesystem.cache_clear()


def test_an_unreachable_endpoint_is_one_line_in_bounded_time(bucket, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens (discard)
    options = {"config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 2}}}
    remote._filesystem.cache_clear()
    t0 = time.monotonic()
    code, _, err = run(
        "stats", "s3://corpus/data/a.jsonl", "--storage-options", json.dumps(options)
    )
    assert code != 0 and "s3://corpus/data/a.jsonl" in one_error_line(err)
    assert time.monotonic() - t0 < 60
    # No credentials anywhere (and no instance metadata to ask): s3fs then tries anonymous
    # access, and the failure is one line naming the URL, quickly (moto serves anonymous
    # requests, so this is asked of the endpoint where nothing listens).
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    remote._filesystem.cache_clear()
    code, _, err = run("stats", "s3://corpus/data/a.jsonl")
    assert code != 0 and "s3://corpus/data/a.jsonl" in one_error_line(err)
    assert time.monotonic() - t0 < 120
    remote._filesystem.cache_clear()


def test_an_endpoint_that_never_answers_is_one_line_in_bounded_time_through_s3fs(monkeypatch):
    """s3fs wrapped botocore's attempts in 5 tries of its own: an endpoint that accepts
    connections and never answers hung a run over 10 minutes (5 x 8 attempts of 60 s). With
    2 attempts of 1 s asked for, it made 15 requests in 22 s; now 2, one line."""
    import socket

    accepted: list[socket.socket] = []
    server = socket.create_server(("127.0.0.1", 0))

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])  # held open, never answered
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    monkeypatch.setenv("PACKTOOL_S3_CLIENT", "s3fs")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "packtool-test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{server.getsockname()[1]}")
    options = {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 2}}
    remote._filesystem.cache_clear()
    try:
        t0 = time.monotonic()
        code, _, err = run(
            "stats",
            "s3://hang/x.jsonl",
            "--storage-options",
            json.dumps({"config_kwargs": options}),
        )
        elapsed = time.monotonic() - t0
    finally:
        server.close()
        for c in accepted:
            c.close()
        remote._filesystem.cache_clear()
    assert code == 1 and "s3://hang/x.jsonl: cannot be read (" in one_error_line(err)
    assert len(accepted) == 2 and elapsed < 8, (len(accepted), elapsed)
    # The defaults: 8 attempts in all (s3fs's 2 tries of botocore's 4) of 20 s each at most
    # (a client built from no options: the process's --storage-options are other tests' too).
    from packtool.storage import s3_requests

    fs = s3_requests.bounded_s3fs({})
    config = fs.config_kwargs
    assert (fs.retries, config["retries"]["total_max_attempts"], config["read_timeout"]) == (
        2,
        4,
        20,
    )


def _documents(url: str) -> int:
    code, out, err = run("stats", url, "--json")
    assert code == 0, err
    return json.loads(out)["documents"]


def _put(key: str, documents: int) -> None:
    import boto3

    body = "".join(f'{{"text": "doc {i}"}}\n' for i in range(documents))
    boto3.client("s3").put_object(Bucket="corpus", Key=key, Body=body.encode())


def test_a_glob_reads_an_object_whose_key_is_also_a_prefix(bucket, s3_client):
    # `e/two.jsonl` beside `e/two.jsonl/z.jsonl`: the listing shows it as a folder only, so
    # 's3://corpus/e/*.jsonl' read `plain.jsonl` alone (the prefix read all three), and
    # 's3://corpus/g/*' "matches no objects" where `g/dual` is an object and a prefix.
    _put("e/plain.jsonl", 2)
    _put("e/two.jsonl", 3)
    _put("e/two.jsonl/z.jsonl", 5)
    _put("e/sub/q.jsonl", 7)  # a prefix only: as a local glob's folder, not read
    _put("g/dual", 11)
    _put("g/dual/x.jsonl", 13)
    assert _documents("s3://corpus/e/*.jsonl") == 2 + 3
    assert _documents("s3://corpus/e/*") == 2 + 3
    assert _documents("s3://corpus/e/") == 2 + 3 + 5 + 7
    assert _documents("s3://corpus/g/*") == 1  # no suffix: the object is one text


def test_urls_name_the_objects_they_say(bucket, s3_client):
    # Each read another object, or fewer, without a word (an audit, on moto):
    # a trailing slash named the object beside the prefix, not the prefix's objects;
    _put("dual", 9)
    _put("dual/inner.jsonl", 10)
    assert _documents("s3://corpus/dual/") == 10
    assert _documents("s3://corpus/dual") == 1  # the object, as named (no suffix: one text)
    # a key holding a glob character was globbed (3 + 5 documents) or matched nothing;
    _put("lit/a*b.jsonl", 3)
    _put("lit/aXYb.jsonl", 5)
    _put("lit/x[1].jsonl", 7)
    assert _documents("s3://corpus/lit/a*b.jsonl") == 3
    assert _documents("s3://corpus/lit/x[1].jsonl") == 7
    assert _documents("s3://corpus/lit/a?Yb.jsonl") == 5  # a real glob still globs
    # a leading-slash key ("/lead/x.jsonl") was read as "lead/x.jsonl" through obstore.
    _put("/lead/x.jsonl", 3)
    _put("lead/x.jsonl", 5)
    assert _documents("s3://corpus//lead/x.jsonl") == 3
    assert _documents("s3://corpus/lead/x.jsonl") == 5


def test_an_output_key_with_an_empty_segment_is_refused(bucket, tmp_path):
    # obstore wrote under "ds/" what s3fs looks for under "/ds/" (and left the lock behind)
    for url in ("s3://corpus//ds", "s3://corpus/a//ds"):
        code, _, err = run("pack", bucket / "a.jsonl", "-o", url, "--max-len", 64)
        assert code == 1 and "the key has an empty segment ('//')" in one_error_line(err)


def test_inspect_names_the_line_of_a_document_read_from_a_bucket(bucket, tmp_path):
    # `from s3://...:byte B` only: the line number was counted with Path(url), no file
    out = tmp_path / "p"
    code, _, err = run("pack", "s3://corpus/data/a.jsonl", "-o", out, "--max-len", 512)
    assert code == 0, err
    code, text, err = run("inspect", out, "--row", 3)
    assert code == 0, err
    where = [line.split(" from ", 1)[1] for line in text.splitlines() if " from " in line]
    lines = (bucket / "a.jsonl").read_bytes().split(b"\n")
    assert where
    for w in where:
        name, rest = w.split(":line ")
        number, byte = int(rest.split()[0]), int(rest.split("(byte ")[1].rstrip(")"))
        assert name == "s3://corpus/data/a.jsonl"
        assert sum(len(x) + 1 for x in lines[: number - 1]) == byte  # line N starts at byte B


def test_a_tokenizer_json_in_a_bucket_tokenizes_as_the_local_file(bucket, tmp_path):
    # "tokenizer file 's3://...' does not exist": the URL was taken for a local path
    import boto3

    from tests.packtool.tokenizer_shapes import build

    tok = build("gpt2", tmp_path / "tok")
    boto3.client("s3").upload_file(str(tok), "corpus", "tok/tokenizer.json")
    runs = {"local": tok, "file": "s3://corpus/tok/tokenizer.json", "folder": "s3://corpus/tok/"}
    lines = (bucket / "a.jsonl").read_bytes().splitlines(keepends=True)
    (tmp_path / "a.jsonl").write_bytes(b"".join(lines[:400]))  # (BPE: 3 MB three times is slow)
    for name, where in runs.items():
        code, _, err = run(
            "pack", tmp_path / "a.jsonl", "-o", tmp_path / name, "--tokenizer", where
        )
        assert code == 0, err
    local = _shards(tmp_path / "local")
    assert local and _shards(tmp_path / "file") == local == _shards(tmp_path / "folder")
    code, _, err = run("stats", bucket / "a.jsonl", "--tokenizer", "s3://corpus/tok/x.model")
    assert code == 1 and "is read from local disk only" in one_error_line(err)


def test_a_prefix_input_notes_the_objects_it_does_not_read(bucket):
    # a local folder's other files get a note; a prefix's were passed over in silence
    import boto3

    client = boto3.client("s3")
    client.put_object(Bucket="corpus", Key="noted/a.jsonl", Body=b'{"text": "read"}\n')
    client.put_object(Bucket="corpus", Key="noted/notes.bin", Body=b"x")
    client.put_object(Bucket="corpus", Key="noted/.hidden.bin", Body=b"x")  # hidden: skipped
    # folder markers (a console's "Create folder"): were named as unread files
    for marker in ("noted/", "noted/sub/", "noted/empty/"):
        client.put_object(Bucket="corpus", Key=marker, Body=b"")
    client.put_object(Bucket="corpus", Key="noted/sub/b.jsonl", Body=b'{"text": "read too"}\n')
    code, out, err = run("stats", "s3://corpus/noted/", "--json")
    assert code == 0, err
    assert json.loads(out)["documents"] == 2
    assert "note: 1 file(s) in the input folders are not read (s3://corpus/noted/notes.bin)" in err
    code, _, err = run("stats", "s3://corpus/noted/a.jsonl")  # an object named: no note
    assert code == 0 and "note:" not in err, err


def test_a_dataset_card_beside_records_in_a_prefix_is_named_not_read(bucket):
    """As a local folder's: a prefix's README.md beside its records was read as a document."""
    import boto3

    client = boto3.client("s3")
    client.put_object(Bucket="corpus", Key="carded/README.md", Body=b"---\nlicense: mit\n---\n")
    client.put_object(Bucket="corpus", Key="carded/d/t.jsonl", Body=b'{"text": "a record"}\n')
    code, out, err = run("stats", "s3://corpus/carded/", "--json")
    assert code == 0 and json.loads(out)["documents"] == 1, err
    assert (
        "note: 1 file(s) in the input folders are not read (s3://corpus/carded/README.md "
        "(a dataset card beside record files))" in err
    )


def test_prefixes_a_glob_matches_are_named_not_passed_over(bucket):
    """As a local glob's folders: `s3://corpus/globbed/*` over top.jsonl, a/ and b/ there read
    top.jsonl alone and said nothing of the prefixes; over the prefixes alone, "glob matches
    no objects". A note names them; the error says what the glob matched."""
    import boto3

    client = boto3.client("s3")
    for key in ("globbed/a/x.jsonl", "globbed/b/y.jsonl"):
        client.put_object(Bucket="corpus", Key=key, Body=b'{"text": "in a prefix"}\n')
    code, _, err = run("stats", "s3://corpus/globbed/*")
    assert code == 1 and one_error_line(err) == (
        "error: s3://corpus/globbed/*: glob matches no objects, only 2 prefix(s) (s3://corpus/globbed/a, "
        "s3://corpus/globbed/b): a glob reads the objects it matches; give a prefix itself to read "
        "its corpus files, or match objects ('d/*/*.jsonl', 'd/**/*.jsonl')"
    )
    client.put_object(Bucket="corpus", Key="globbed/top.jsonl", Body=b'{"text": "at the top"}\n')
    code, out, err = run("stats", "s3://corpus/globbed/*", "--json")
    assert code == 0 and json.loads(out)["documents"] == 1, err
    assert (
        "note: 2 folder(s) matched by the input globs are not read (s3://corpus/globbed/a, "
        "s3://corpus/globbed/b): a glob reads the files it matches" in err
    )
    code, out, err = run("stats", "s3://corpus/globbed/**", "--json")  # reads a/ and b/
    assert code == 0 and json.loads(out)["documents"] == 3 and "note:" not in err, err
    code, out, err = run("stats", "s3://corpus/globbed/**/*.jsonl", "--json")
    assert code == 0 and json.loads(out)["documents"] == 3 and "note:" not in err, err


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_a_prefix_input_is_listed_once_for_the_note_and_the_files(
    bucket, s3_server, monkeypatch, client
):
    """`pack` listed a prefix input twice: for the note on what it passes over, then for the
    files it reads (1,000 keys a request: 2,000 requests for 10^6 objects where 1,000 do)."""
    from urllib.parse import parse_qs, urlsplit

    import boto3

    from packtool.storage import s3_native

    client_ = boto3.client("s3")
    for key, body in (
        ("a.jsonl", b'{"text": "read"}\n'),
        ("n.bin", b"x"),
        ("s/b.jsonl", b'{"text": "b"}\n'),
    ):
        client_.put_object(Bucket="corpus", Key=f"once-{client}/{key}", Body=body)
    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    with requests_seen(s3_server, monkeypatch) as seen:
        code, out, err = run("stats", f"s3://corpus/once-{client}/", "--json")
    assert code == 0, err
    assert json.loads(out)["documents"] == 2
    assert f"(s3://corpus/once-{client}/n.bin)" in err  # the note is still made
    listed = [
        parse_qs(urlsplit(path).query)
        for method, path in seen
        if method == "GET" and "list-type=2" in path
    ]
    whole = [q for q in listed if q.get("prefix") == [f"once-{client}/"] and "delimiter" not in q]
    assert len(whole) == 1, listed


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_a_linked_prefix_is_read_and_noted_as_its_version(bucket, s3_server, monkeypatch, client):
    """A prefix `tokenize -o s3://...` wrote (a link index.json, a version beside it): the note
    named its own link as a file not read, and listed the prefix whole beside the version the
    files were read from (found by a reviewer). Both are the version's now, in one listing."""
    from urllib.parse import parse_qs, urlsplit

    from packtool.storage import s3_native

    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    url = f"s3://corpus/linked-{client}"
    code, _, err = run("tokenize", SAMPLE / "corpus.jsonl", "-o", url)
    assert code == 0, err
    with requests_seen(s3_server, monkeypatch) as seen:
        code, out, err = run("stats", f"{url}/", "--json")
    assert code == 0 and "note:" not in err, err
    assert json.loads(out)["inputs"]["kind"] == "tokenized"
    asked = [parse_qs(urlsplit(path).query) for method, path in seen if method == "GET"]
    flat = [  # whole listings: no delimiter (s3fs sends an empty one), not a first key's check
        q["prefix"][0]
        for q in asked
        if "list-type" in q and "delimiter" not in q and q.get("max-keys") != ["1"]
    ]
    version = [p for p in flat if p.startswith(f"linked-{client}/v-")]
    assert len(version) == 1 and f"linked-{client}/" not in flat, flat


def test_a_damaged_parquet_object_is_named_as_a_local_file_is(bucket, tmp_path):
    # it was "URL: ArrowInvalid: ..." where a local file gets "not a readable Parquet file"
    import boto3

    boto3.client("s3").put_object(Bucket="corpus", Key="bad/x.parquet", Body=b"PAR1garbage!PAR1")
    (tmp_path / "x.parquet").write_bytes(b"PAR1garbage!PAR1")
    for where in ("s3://corpus/bad/x.parquet", tmp_path / "x.parquet"):
        code, _, err = run("stats", where)
        assert code == 1 and f"{where}: not a readable Parquet file (" in one_error_line(err)


def test_an_http_url_reads_as_the_local_file(tmp_path):
    # a real web server on loopback (the standard library's): one object, ranged reads
    import functools
    import http.server

    shutil.copy(SAMPLE / "corpus.jsonl", tmp_path / "c.jsonl")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/c.jsonl"
        code, got, err = run("stats", url, "--json")
        assert code == 0, err
        code, want, err = run("stats", tmp_path / "c.jsonl", "--json")
        assert json.loads(got)["tokens"] == json.loads(want)["tokens"] > 0
    finally:
        server.shutdown()


def test_http_urls_that_are_not_there_say_404_and_a_failing_server_says_its_status(
    tmp_path, monkeypatch
):
    """A mistyped folder URL said the folder 'holds no corpus files' (fsspec lists a 404 page
    as empty), and a missing page was 'no such object (or its bucket does not exist)'. (The
    503 is asked again, after short waits here: the check runs in this process.)"""
    import functools
    import http.server

    from packtool.storage import web

    monkeypatch.setattr(web, "BACKOFF", 0.01)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802 (the standard library's name)
            if "broken" in self.path:
                return self.send_error(503)
            return super().do_HEAD()

        def do_GET(self):  # noqa: N802
            if "broken" in self.path:
                return self.send_error(503)
            return super().do_GET()

        def log_message(self, *args):  # its lines would go to the stderr the test reads
            pass

    (tmp_path / "sub").mkdir()
    shutil.copy(SAMPLE / "corpus.jsonl", tmp_path / "sub" / "c.jsonl")
    handler = functools.partial(Handler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        code, _, err = run("stats", f"{base}/sub/")
        assert code == 0, err  # the folder that is there still lists
        for missing in (f"{base}/nothere/", f"{base}/nothere.jsonl"):
            code, _, err = run("stats", missing)
            assert code == 1
            assert one_error_line(err) == f"error: {missing}: not found (the server answered 404)"
        code, _, err = run("stats", f"{base}/broken.jsonl")
        assert code == 1
        assert one_error_line(err).startswith(
            f"error: {base}/broken.jsonl: the server answered 503"
        )
    finally:
        server.shutdown()


def test_a_server_that_ignores_ranges_gives_the_local_bytes_and_a_closed_port_is_unreachable(
    tmp_path,
):
    """The standard library's server answers every ranged read with the whole file: each
    partition after the first was handed it from its start (4,120 of 4,132 documents, skips
    doubled, exit 0). A port nobody listens on was 'no such object'."""
    import functools
    import http.server
    import socket

    shutil.copy(SAMPLE / "corpus.jsonl", tmp_path / "c.jsonl")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = ["--max-len", "512", "--workers", "2", "--partition-size", "1MB"]
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/c.jsonl"
        code, _, err = run("pack", url, "-o", tmp_path / "web", *options)
        assert code == 0, err
        assert "ignores range requests" in err
    finally:
        server.shutdown()
    code, _, err = run("pack", tmp_path / "c.jsonl", "-o", tmp_path / "local", *options)
    assert code == 0, err
    assert _shards(tmp_path / "web") == _shards(tmp_path / "local")
    with socket.socket() as s:  # a free port, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run("stats", f"http://127.0.0.1:{port}/c.jsonl")
    assert code == 1 and f"127.0.0.1:{port}/c.jsonl: cannot be reached (" in one_error_line(err)


def test_gs_and_http_reads_are_bounded_in_time():
    """An endpoint that accepts a connection and never answers hung gs:// and http:// reads
    (S3 had bounded timeouts, they had none)."""
    import aiohttp

    assert remote.options_for("gs")["requests_timeout"] == remote.GCS_DEFAULTS["requests_timeout"]
    fs, _ = remote.filesystem("http://127.0.0.1:9/x.jsonl")
    timeout = fs.client_kwargs["timeout"]
    assert isinstance(timeout, aiohttp.ClientTimeout)
    assert (timeout.sock_connect, timeout.sock_read) == (10, 60)


def test_a_small_object_written_by_another_process_after_a_listing_is_read(s3_server, s3_client):
    """s3fs sized a whole-object read from its listings cache: a run's record that a worker
    wrote after the driver listed `parts/` read as 'no such object' (a resumed pack into a
    bucket failed in its tail tree)."""
    import boto3

    client = boto3.client("s3")
    bucket = f"listed-{s3_client}"
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="run/parts/000000.json", Body=b"{}")
    assert [e.name for e in storage.list_dir(f"s3://{bucket}/run/parts")] == ["000000.json"]
    client.put_object(Bucket=bucket, Key="run/parts/000001.json", Body=b'{"late": 1}')
    assert storage.read_bytes(f"s3://{bucket}/run/parts/000001.json") == b'{"late": 1}'


def test_per_scheme_options_reach_every_spelling_and_bad_ones_are_one_line(monkeypatch):
    """From the stores audit: `{"az": {...}}` never reached `abfs://` (nor `gs` `gcs://`), a
    scheme's options that were not an object were a TypeError traceback, and adlfs with no
    account or connection string a ValueError traceback."""
    monkeypatch.setenv(
        remote.OPTIONS_ENV, json.dumps({"az": {"a": 1, "b": 1}, "abfs": {"b": 2}, "gs": {"c": 3}})
    )
    assert remote.options_for("abfs") == {"a": 1, "b": 2}
    assert remote.options_for("az") == {"a": 1, "b": 1}  # the URL's own spelling last
    assert remote.options_for("gcs")["c"] == 3
    assert remote.options_for("s3").get("c") is None
    monkeypatch.setenv(remote.OPTIONS_ENV, json.dumps({"gs": 5}))
    with pytest.raises(ConfigError, match=r"the options for 'gs' must be a JSON object .*got 5"):
        remote.options_for("gcs")
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(remote.OPTIONS_ENV, "{}")
    code, _, err = run("stats", "az://ctr/in/")
    assert code == 1
    line = one_error_line(err)  # (its link index.json is the first object a prefix asks)
    assert line.startswith("error: az://ctr/in/") and ": cannot open the az:// client (" in line


def test_the_chat_template_beside_a_tokenizer_in_a_bucket_is_used(bucket, tmp_path):
    # The tokenizer's own chat_template.jinja was looked up as a local path ("s3:/corpus/tok")
    import boto3

    from tests.packtool.tokenizer_shapes import build

    tok = build("gpt2", tmp_path / "tok")
    template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
    (tmp_path / "tok" / "chat_template.jinja").write_text(template)
    client = boto3.client("s3")
    client.upload_file(str(tok), "corpus", "chatok/tokenizer.json")
    client.upload_file(str(tmp_path / "tok" / "chat_template.jinja"), "corpus", "chatok/chat_template.jinja")  # fmt: skip
    chat = tmp_path / "chat.jsonl"  # a quarter of the sample's (BPE: 0.9 MB three times is slow)
    lines = (ROOT / "sample_data" / "chat.jsonl").read_bytes().splitlines(keepends=True)
    chat.write_bytes(b"".join(lines[: len(lines) // 4]))
    runs = {
        "local": (tok,),
        "bucket": ("s3://corpus/chatok/tokenizer.json",),
        "template": (tok, "--chat-template", "s3://corpus/chatok/chat_template.jinja"),
    }
    for name, (where, *more) in runs.items():
        args = ("pack", chat, "-o", tmp_path / name, "--tokenizer", where, "--train-on", "all")
        code, _, err = run(*args, *more)
        assert code == 0, err
    local = _shards(tmp_path / "local")
    assert local and _shards(tmp_path / "bucket") == local == _shards(tmp_path / "template")
    index = json.loads((tmp_path / "bucket" / "index.json").read_text())
    assert (
        index["extra"]["chat_template"]["sha256"]
        == json.loads((tmp_path / "local" / "index.json").read_text())["extra"]["chat_template"][
            "sha256"
        ]
    )


def test_a_url_s_upath_holds_the_run_s_storage_options(s3_server, monkeypatch):
    # Seen: `as_path` built a bare UPath: the endpoint named only in --storage-options
    # (PACKTOOL_STORAGE_OPTIONS) was not in it, so its own reads and listings (a library
    # user's `path.read_bytes()`, `path.exists()`) went to AWS itself, not the MinIO/moto server.
    import boto3

    boto3.client("s3").create_bucket(Bucket="upath-options")
    boto3.client("s3").put_object(Bucket="upath-options", Key="d/a.txt", Body=b"hello")
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # the endpoint from the options alone
    monkeypatch.setenv(remote.OPTIONS_ENV, json.dumps({"s3": {"endpoint_url": s3_server}}))
    path = storage.as_path("s3://upath-options/d/a.txt")
    assert path.storage_options["endpoint_url"] == s3_server
    assert path.read_bytes() == b"hello"
    assert (path.parent / "a.txt").exists() and not (path.parent / "b.txt").exists()
    listed = storage.glob("s3://upath-options/d", "*.txt")  # listings' UPaths too
    assert [p.read_bytes() for p in listed] == [b"hello"]
