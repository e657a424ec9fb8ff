"""s3:// through obstore (packtool/storage/s3_native.py), checked against its reference, s3fs,
on the same objects of the loopback S3 server: what each call answers, and the errors it raises;
which client a process picks; and that a process forked after obstore started never uses it."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.storage import remote, remote_read, remote_write, s3_native

BUCKET = "native"
ROOT = Path(__file__).resolve().parents[3]
OBJECTS = {
    "a/b/c.txt": b"c" * 300,
    "a/d.txt": b"0123456789" * 100,
    "a/.hidden.txt": b"h",
    "e.jsonl": b'{"text": "e"}\n',
    "f/g/h/i.bin": os.urandom(5000),
}


@pytest.fixture(scope="module")
def both(s3_server):
    """(obstore's file system, s3fs's) over a bucket holding `OBJECTS`."""
    import boto3
    import s3fs

    client = boto3.client("s3")
    client.create_bucket(Bucket=BUCKET)
    for key, data in OBJECTS.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    return s3_native.NativeS3(), s3fs.S3FileSystem(skip_instance_cache=True)


def _answer(call):
    try:
        return call()
    except Exception as exc:  # the error's kind is the answer
        return type(exc)


PATHS = [f"{BUCKET}/{p}" for p in ("a/b/c.txt", "a/d.txt", "a", "a/b", "f/g", "e.jsonl",
                                   "nope", "a/nope.txt", "a/b/c")] + [BUCKET]  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_info_exists_and_kind_answer_as_s3fs(both, path):
    native, ref = both
    ref.invalidate_cache()
    got, want = _answer(lambda: native.info(path)), _answer(lambda: ref.info(path))
    if isinstance(want, dict):
        assert {k: got[k] for k in ("name", "size", "type")} == {
            k: want[k] for k in ("name", "size", "type")
        }
        if want["type"] == "file":
            assert got["ETag"].strip('"') == want["ETag"].strip('"')
            assert int(remote.modified_at(got)) == int(remote.modified_at(want))
    else:
        assert got == want
    for name in ("exists", "isfile", "isdir"):
        ref.invalidate_cache()
        assert getattr(native, name)(path) == getattr(ref, name)(path), name


@pytest.mark.parametrize(
    "call",
    [
        lambda fs: fs.ls(f"{BUCKET}/a", detail=False),
        lambda fs: fs.ls(BUCKET, detail=False),
        lambda fs: fs.ls(f"{BUCKET}/a/d.txt", detail=False),
        lambda fs: fs.ls(f"{BUCKET}/nope", detail=False),
        lambda fs: fs.find(f"{BUCKET}/a"),
        lambda fs: fs.find(BUCKET),
        lambda fs: fs.find(f"{BUCKET}/a/d.txt"),
        lambda fs: fs.find(f"{BUCKET}/nope"),
        lambda fs: fs.find(f"{BUCKET}/f", withdirs=True),
        lambda fs: fs.find(f"{BUCKET}/a", maxdepth=1),
        lambda fs: sorted(fs.glob(f"{BUCKET}/a/*.txt")),
        lambda fs: sorted(fs.glob(f"{BUCKET}/**/*.txt")),
        lambda fs: sorted(fs.glob(f"{BUCKET}/*/d.*")),
        lambda fs: sorted(fs.glob(f"{BUCKET}/nope/*")),
    ],
)
def test_listings_answer_as_s3fs(both, call):
    native, ref = both
    ref.invalidate_cache()
    want = _answer(lambda: call(ref))
    assert _answer(lambda: call(native)) == want


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), key=st.sampled_from(["a/d.txt", "f/g/h/i.bin", "e.jsonl"]))
def test_reads_of_any_range_answer_as_s3fs(both, data, key):
    """The ranges packtool asks for: a start inside the object, an end after it (past the
    object's end too: the bytes there are)."""
    native, ref = both
    path, size = f"{BUCKET}/{key}", len(OBJECTS[key])
    start = data.draw(st.integers(0, size - 1))
    end = data.draw(st.integers(start + 1, size + 100))
    want = ref.cat_file(path, start=start, end=end)
    assert native.cat_file(path, start=start, end=end) == want == OBJECTS[key][start:end]
    with native.open(path, "rb") as a, ref.open(path, "rb", cache_type="none") as b:
        a.seek(start), b.seek(start)
        assert a.read(end - start) == b.read(end - start)


def test_a_listing_answers_for_its_objects_until_invalidated_as_s3fs_does(both):
    """What a listing said of an object stands until `invalidate_cache` (no HEAD per `info`:
    the plan's stats of a listed prefix cost no request), as in s3fs's listings cache, whose
    rule packtool's callers follow."""
    import s3fs

    native, writer = both
    other = s3fs.S3FileSystem(skip_instance_cache=True)  # a reader with a cache of its own
    writer.pipe_file(f"{BUCKET}/l/x", b"old")
    for fs in (native, other):
        fs.find(f"{BUCKET}/l")
    writer.pipe_file(f"{BUCKET}/l/x", b"newer")  # another writer, after the listings
    for fs in (native, other):
        assert fs.info(f"{BUCKET}/l/x")["size"] == 3
        fs.invalidate_cache(f"{BUCKET}/l")
        assert fs.info(f"{BUCKET}/l/x")["size"] == 5


def test_writes_and_deletes_answer_as_s3fs(both, tmp_path):
    native, ref = both
    for name, fs in (("native", native), ("s3fs", ref)):
        path = f"{BUCKET}/w/{name}"
        fs.pipe_file(path, b"one")
        with pytest.raises(FileExistsError):
            fs.pipe_file(path, b"two", mode="create")
        local = tmp_path / "up.bin"
        local.write_bytes(os.urandom(12 << 20))
        fs.put_file(str(local), f"{path}.up", chunksize=5 << 20)  # a multipart upload
        assert ref.cat_file(f"{path}.up") == local.read_bytes()
        fs.rm([f"{path}.up"])
        fs.rm_file(path)
        ref.invalidate_cache()
        assert not ref.exists(path) and not ref.exists(f"{path}.up")
    assert _answer(lambda: native.rm_file(f"{BUCKET}/w/never")) == _answer(
        lambda: ref.rm_file(f"{BUCKET}/w/never")
    )


def test_a_released_lock_deletes_only_the_version_it_wrote(s3_server, both, s3_client):
    _, ref = both
    url = f"s3://{BUCKET}/locks/{s3_client}"
    lock = remote_write.take_lock(url, b"mine")
    ref.pipe_file(url[5:], b"another writer's")  # before the holder's renewal could notice
    lock.release()  # a DELETE with If-Match on the version it wrote: refused
    assert ref.cat_file(url[5:]) == b"another writer's"
    ref.rm_file(url[5:])
    lock = remote_write.take_lock(url, b"mine")
    lock.release()
    ref.invalidate_cache()
    assert not ref.exists(url[5:])


def test_a_lock_knows_its_version_from_its_put_not_a_head_after(
    s3_server, both, s3_client, monkeypatch
):
    """The lock's ETag (what its renewals and its release are conditional on) came from a HEAD
    after the put: one more request before every run, and one that could even see a later
    writer's object. The put's own answer names it now (obstore's and boto3's)."""
    from tests.packtool.storage.common import requests_seen

    _, ref = both
    key = f"locks/tagged-{s3_client}"
    with requests_seen(s3_server, monkeypatch) as seen:
        lock = remote_write.take_lock(f"s3://{BUCKET}/{key}", b"mine")
        asked = [m for m, path in seen if path.split("?")[0] == f"/{BUCKET}/{key}"]
        assert asked == ["HEAD", "PUT"]  # the check that none is there, the put
        assert lock.confirm()  # a renewal conditional on that version: accepted
        ref.pipe_file(f"{BUCKET}/{key}", b"another writer's")
        assert not lock.confirm() and lock.lost  # on another version: refused
        lock.release()
    assert ref.cat_file(f"{BUCKET}/{key}") == b"another writer's"


@pytest.mark.parametrize(
    ("env", "options", "native"),
    [
        ({}, {}, True),  # the tests' endpoint and keys
        ({"PACKTOOL_S3_CLIENT": "s3fs"}, {}, False),
        ({"AWS_ENDPOINT_URL": None}, {}, False),  # AWS itself: s3fs follows a bucket's region
        ({"AWS_ENDPOINT_URL": None, "PACKTOOL_S3_CLIENT": "obstore"}, {}, True),
        ({"AWS_ENDPOINT_URL": None}, {"endpoint_url": "http://127.0.0.1:1"}, True),
        ({"AWS_ACCESS_KEY_ID": None}, {}, False),  # botocore's chain finds the credentials
        ({"AWS_ACCESS_KEY_ID": None}, {"key": "k", "secret": "s"}, True),
        ({"AWS_ACCESS_KEY_ID": None}, {"anon": True}, True),
        ({"AWS_PROFILE": "work"}, {}, False),
        ({"AWS_CA_BUNDLE": "/etc/ssl/ca.pem"}, {}, True),  # the endpoint is http://
        ({"AWS_CA_BUNDLE": "/etc/ssl/ca.pem", "AWS_ENDPOINT_URL": "https://s3.lan"}, {}, False),
        ({"AWS_SESSION_TOKEN": "t"}, {"key": "k", "secret": "s"}, False),  # not the keys' token
        ({}, {"requester_pays": True}, False),  # no obstore equivalent here
        ({}, {"client_kwargs": {"verify": False}}, False),
        ({}, {"config_kwargs": {"retries": {"max_attempts": 2}}}, True),
    ],
)
def test_which_client_a_process_picks(s3_server, monkeypatch, env, options, native):
    for name, value in env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert s3_native.usable(options) is native


def test_a_forced_client_that_cannot_take_the_options_is_one_line(s3_server, monkeypatch):
    monkeypatch.setenv(s3_native.CLIENT_ENV, "obstore")
    with pytest.raises(ConfigError, match="requester_pays"):
        s3_native.usable({"requester_pays": True})
    monkeypatch.setenv(s3_native.CLIENT_ENV, "boto")
    with pytest.raises(ConfigError, match="expected s3fs, obstore or auto"):
        s3_native.usable({})


def _read_in_child(url, queue):
    fs, _ = remote.filesystem(url)
    queue.put((type(fs).__name__, remote_read.read_bytes(url)))


FORKED = """
import os, sys
from packtool.storage import remote, remote_read
url = sys.argv[1]
assert type(remote.filesystem(url)[0]).__name__ == "NativeS3"
want = remote_read.read_bytes(url)  # obstore's runtime runs in this process now
assert "s3fs" not in sys.modules
pid = os.fork()
if pid == 0:  # the child: s3fs imported by the parent before the fork, read through it
    ok = "s3fs" in sys.modules and remote_read.read_bytes(url) == want
    ok = ok and type(remote.filesystem(url)[0]).__name__ == "S3FileSystem"
    os._exit(0 if ok else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_process_forked_after_obstore_started_reads_through_s3fs(both):
    """obstore's runtime does not survive a fork (its first request in the child hangs): the
    loader's forked workers, children of the process that opened the dataset, read through
    s3fs, which the parent imports before it forks (once, not in every child)."""
    done = subprocess.run(
        [sys.executable, "-c", FORKED, f"s3://{BUCKET}/a/d.txt"], timeout=120, cwd=ROOT
    )
    assert done.returncode == 0


def test_a_process_started_afresh_uses_obstore(both):
    """A process started afresh (spawned; the local engine's workers are forked from a
    forkserver that only imported obstore) uses obstore, though the one that started it did."""
    url = f"s3://{BUCKET}/a/d.txt"
    remote._filesystem.cache_clear()
    assert remote_read.read_bytes(url) == OBJECTS["a/d.txt"]  # obstore's runtime runs here now
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(url, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == ("NativeS3", OBJECTS["a/d.txt"])


@pytest.fixture
def checking_server(s3_server):
    """The tests' S3 server checking every request's SigV4 signature while the test runs (moto's
    `reset-auth`: its requests then need an IAM user's keys, made first): the requests packtool
    signs itself (`s3_requests`) are checked as AWS would check them."""
    import urllib.request

    import boto3

    def auth(count: str) -> None:
        request = urllib.request.Request(
            f"{s3_server}/moto-api/reset-auth",
            data=count.encode(),
            headers={"Content-Type": "text/plain"},  # not a form: moto reads the raw body
        )
        urllib.request.urlopen(request, timeout=10).close()

    auth("1000")  # unchecked: the IAM user and its keys
    try:
        iam = boto3.client("iam", endpoint_url=s3_server)
        iam.create_user(UserName="packer")
        keys = iam.create_access_key(UserName="packer")["AccessKey"]
        policy = '{"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}'
        iam.put_user_policy(UserName="packer", PolicyName="all", PolicyDocument=policy)
        auth("0")  # checked from here on
        yield s3_server, keys["AccessKeyId"], keys["SecretAccessKey"]
    finally:
        auth("inf")


def test_the_requests_packtool_signs_itself_pass_the_server_s_signature_check(checking_server):
    import boto3

    from packtool.storage.s3_requests import S3Requests

    url, key, secret = checking_server
    s3 = boto3.client(
        "s3", endpoint_url=url, aws_access_key_id=key, aws_secret_access_key=secret,
        region_name="us-east-1",
    )  # fmt: skip
    s3.create_bucket(Bucket="signed")
    names = ["a/b.parquet", "a/with space+plus.parquet"]
    uploads = {n: s3.create_multipart_upload(Bucket="signed", Key=n)["UploadId"] for n in names}
    signed = S3Requests({"key": key, "secret": secret, "endpoint_url": url})
    assert sorted(signed.list_multipart_uploads("signed", "a/")) == sorted(uploads.items())
    for name, upload in uploads.items():
        signed.abort_multipart_upload("signed", name, upload)
    assert signed.list_multipart_uploads("signed", "a/") == []
    etag = s3.put_object(Bucket="signed", Key="lock", Body=b"mine")["ETag"]
    with pytest.raises(OSError, match="412"):
        signed.delete_if_match("signed", "lock", '"0123456789abcdef0123456789abcdef"')
    signed.delete_if_match("signed", "lock", etag)
    assert "Contents" not in s3.list_objects_v2(Bucket="signed")
    wrong = S3Requests({"key": key, "secret": "not-the-secret", "endpoint_url": url})
    with pytest.raises(OSError, match="403"):
        wrong.list_multipart_uploads("signed", "a/")


def test_keys_obstore_cannot_hold_are_read_through_s3fs(both):
    """`a//b`, a `.` segment: obstore refuses such paths (and any listing that meets one); those
    calls go to s3fs, with s3fs's answers."""
    import boto3

    native, ref = both
    odd = {"odd//y.jsonl": b"y" * 10, "odd/./z.jsonl": b"z" * 20}
    client = boto3.client("s3")
    for key, data in odd.items():
        client.put_object(Bucket=BUCKET, Key=key, Body=data)
    ref.invalidate_cache()
    for call in (
        lambda fs: fs.find(f"{BUCKET}/odd"),
        lambda fs: fs.ls(f"{BUCKET}/odd", detail=False),
        lambda fs: sorted(fs.glob(f"{BUCKET}/odd/*.jsonl")),
    ):
        assert _answer(lambda c=call: c(native)) == _answer(lambda c=call: c(ref))
    for key, data in odd.items():
        assert native.cat_file(f"{BUCKET}/{key}") == data
        assert native.info(f"{BUCKET}/{key}")["size"] == len(data)
    assert native._fallback is not None  # s3fs answered those
    native.rm([f"{BUCKET}/{key}" for key in odd])
    ref.invalidate_cache()
    assert ref.find(f"{BUCKET}/odd") == []


def test_a_store_that_cannot_be_reached_is_an_error_not_a_missing_folder():
    """`isdir` / `isfile` raise what the store says (fsspec's own would answer False, and
    `remove_tree` would then delete nothing, silently)."""
    fs = s3_native.NativeS3(
        endpoint_url="http://127.0.0.1:9", key="k", secret="s",
        config_kwargs={"connect_timeout": 1, "retries": {"max_attempts": 1}},
    )  # fmt: skip
    for call in (fs.isdir, fs.isfile, fs.exists):
        with pytest.raises(OSError):
            call(f"{BUCKET}/somewhere")


def test_the_default_profile_of_the_aws_config_file_is_read_as_botocore_reads_it(
    s3_server, monkeypatch, tmp_path
):
    """botocore reads `~/.aws/config`'s default profile with no variable naming it: its region
    signs obstore's requests too; a setting obstore does not read (a CA bundle, an endpoint,
    S3's addressing style) keeps s3fs."""
    from packtool.storage import s3_requests

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / ".aws").mkdir()
    config = tmp_path / ".aws" / "config"
    config.write_text("[default]\nregion = eu-west-3\n")
    assert s3_native.usable({}) and s3_requests.region({}) == "eu-west-3"
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # AWS itself: its endpoint in that region
    assert s3_requests.S3Requests({}).endpoint == "https://s3.eu-west-3.amazonaws.com"
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server)
    for setting in ("ca_bundle = /etc/ca.pem", "s3 =\n  addressing_style = virtual"):
        config.write_text(f"[default]\nregion = eu-west-3\n{setting}\n")
        assert not s3_native.usable({})
    config.write_text("[default\nregion")  # damaged: botocore refuses it, s3fs says so
    assert not s3_native.usable({})


def test_a_lock_and_a_pack_under_a_key_obstore_cannot_hold_go_through_s3fs(both, monkeypatch):
    """A `.` or `..` segment in an output's key: the lock's conditional renewal went to obstore
    (`call_s3("put_object", IfMatch=...)`) without the s3fs fallback of the other calls, so
    `pack -o s3://bkt/dd/../ee` stopped with obstore's raw ValueError ("Could not parse path").
    Like every call on such a key, it goes through s3fs."""
    from packtool.engines.local import run_pack
    from tests.packtool.storage.common import pack_config

    monkeypatch.setenv(s3_native.CLIENT_ENV, "obstore")
    remote._filesystem.cache_clear()
    native, ref = both
    for odd in ("dd/../locks/x", "dd/./locks/y"):
        lock = remote_write.take_lock(f"s3://{BUCKET}/{odd}", b"mine")
        assert lock.confirm()  # renewed: a put conditional on its ETag
        assert ref.cat_file(f"{BUCKET}/{odd}") == b"mine"
        lock.release()
        ref.invalidate_cache()
        assert not ref.exists(f"{BUCKET}/{odd}")
    run_pack(pack_config(f"s3://{BUCKET}/dd/../ee"))
    ref.invalidate_cache()
    assert ref.exists(f"{BUCKET}/dd/../ee/index.json")
    assert remote_write.uploads_in_progress(f"s3://{BUCKET}/dd/../ee/") == []
    remote._filesystem.cache_clear()


@pytest.mark.parametrize(
    "url", ["not a url", "http://", "ftp://h:1", "http://h:abc", "http://h:1 x", "minio:9000"]
)
def test_an_endpoint_that_is_no_http_url_is_one_line_not_a_panic(monkeypatch, url):
    # Before: obstore panicked in Rust at the first request ("request valid: InvalidUri", a
    # 50-line backtrace and a PanicException, no Exception to catch).
    monkeypatch.setenv("AWS_ENDPOINT_URL", url)
    with pytest.raises(
        ConfigError, match=rf"^AWS_ENDPOINT_URL '{re.escape(url)}' is not an endpoint URL"
    ):
        s3_native.NativeS3(key="k", secret="s").cat_file(f"{BUCKET}/x")
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    with pytest.raises(ConfigError, match=r"endpoint_url .* is not an endpoint URL"):
        s3_native.NativeS3(endpoint_url=url, key="k", secret="s").cat_file(f"{BUCKET}/x")
