"""Datasets in Google Cloud Storage (`gs://`) and Azure Blob Storage (`az://`), each against a
real server on loopback started by the tests (gcp-storage-emulator; Azurite), through gcsfs
and adlfs as users write: the commit protocol and the loader are store-agnostic, and these
tests hold them to the bytes of a local run on each store. S3 has its own, longer suite
(test_remote_output.py, tests/loader/store/test_remote_store.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from loader import PackedDataset
from packtool.dataset.output import OutputLock, output_paths
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import ConfigError
from packtool.storage import remote_write
from packtool.tokenize.tokenize import tokenize_corpus
from tests.cli import one_error_line, run
from tests.packtool.storage import common
from tests.packtool.storage.common import CORPUS, packed_files, race_for_lock, same_but_inputs

BUCKET = "packtool-test"
PARTITION_SIZE = common.FEW_PARTITIONS
"""This module's partitions (3 of the sample corpus): its tests are of the stores' commit and
reads, not of partitions; `local_pack` is packed in them too."""


def pack_config(out, inputs=(CORPUS,), **kw) -> RunConfig:
    """`common.pack_config` in this module's partitions."""
    return common.pack_config(out, inputs, PARTITION_SIZE, **kw)


@dataclass
class Store:
    scheme: str
    fs: Any  # the fsspec file system, to look at what was written

    def url(self, key: str) -> str:
        return f"{self.scheme}://{BUCKET}/{key}"

    def files(self, key: str) -> dict[str, bytes]:
        """The files of the version the link `index.json` under `key` names."""
        self.fs.invalidate_cache()
        version = json.loads(self.fs.cat_file(f"{BUCKET}/{key}/index.json"))["packtool_dataset"]
        root = f"{BUCKET}/{key}/{version}"
        return {k[len(root) + 1 :]: self.fs.cat_file(k) for k in sorted(self.fs.find(root))}

    def objects(self, key: str) -> list[str]:
        self.fs.invalidate_cache()
        root = f"{BUCKET}/{key}/"
        return sorted(k[len(root) :] for k in self.fs.find(root))


@pytest.fixture(scope="module", params=["gs", "az"])
def store(request) -> Store:
    import fsspec

    if request.param == "gs":
        request.getfixturevalue("gcs_server")
        fs = fsspec.filesystem("gs", skip_instance_cache=True)
    else:
        request.getfixturevalue("azurite_server")
        fs = fsspec.filesystem("az", skip_instance_cache=True)
    fs.mkdir(BUCKET)
    return Store(request.param, fs)


@pytest.fixture(scope="module")
def local_pack(tmp_path_factory) -> dict[str, bytes]:
    return packed_files(tmp_path_factory.mktemp("local") / "ds", PARTITION_SIZE)


def test_a_pack_into_the_store_writes_the_bytes_of_a_local_pack(store, local_pack):
    run_pack(pack_config(store.url("a")))
    # The link and one version, byte for byte the local dataset; no state, staging or lock.
    assert store.files("a") == local_pack
    version = store.objects("a")[1].split("/")[0]
    assert store.objects("a") == ["index.json", *(f"{version}/{n}" for n in local_pack)]
    code, out, err = run("verify", store.url("a"))
    assert code == 0 and out.startswith("OK ") and "sha256 verified" in out, err

    # --overwrite: a new version; the old one is gone once the link names the new one.
    run_pack(pack_config(store.url("a"), overwrite=True))
    assert store.files("a") == local_pack
    new = store.objects("a")[1].split("/")[0]
    assert new != version
    assert store.objects("a") == ["index.json", *(f"{new}/{n}" for n in local_pack)]


def test_a_pack_from_the_store_reads_it_by_ranges_and_writes_the_same_shards(store, local_pack):
    store.fs.put_file(str(CORPUS), f"{BUCKET}/corpus/corpus.jsonl")
    run_pack(pack_config(store.url("b"), inputs=(store.url("corpus/corpus.jsonl"),)))
    assert same_but_inputs(store.files("b"), local_pack)


def test_listed_objects_keep_the_scheme_the_input_was_given_in(store):
    """`az://` folder inputs were listed (and named in notes, skips and the dataset's sources)
    as `abfs://`."""
    from packtool.storage.listing import expand, unread

    store.fs.put_file(str(CORPUS), f"{BUCKET}/named/a.jsonl")
    store.fs.pipe_file(f"{BUCKET}/named/readme.md", b"not a corpus file")
    folder = store.url("named")
    assert [str(p) for p in expand(folder, (".jsonl",), "corpus")] == [f"{folder}/a.jsonl"]
    assert unread(folder, (".jsonl",), 3) == (1, [f"{folder}/readme.md"])


def test_tokenize_writes_one_object_into_the_store(store, tmp_path):
    local = tmp_path / "t.parquet"
    tokenize_corpus([CORPUS], local, progress=False)
    tokenize_corpus([CORPUS], store.url("t.parquet"), progress=False)
    store.fs.invalidate_cache()
    assert store.fs.cat_file(f"{BUCKET}/t.parquet") == local.read_bytes()
    assert not store.fs.exists(f"{BUCKET}/.t.parquet.packtool-lock")


def test_the_loader_reads_the_store_as_it_reads_the_local_dataset(store, tmp_path):
    local = tmp_path / "ds"
    for out in (local, store.url("train")):
        run_pack(pack_config(out, overwrite=True))

    def batches(path: Any) -> list[list[int]]:
        ds = PackedDataset(path, tokens_per_batch=4096, seed=3, cache_dir=str(tmp_path / "c"))
        return [b["input_ids"].tolist() for b in ds]

    want = batches(local)
    assert len(want) > 10 and batches(store.url("train")) == want


def test_one_writer_per_output_and_a_stale_lock_is_taken_over(store, monkeypatch):
    url = store.url("locked")
    with (
        OutputLock(output_paths(url), "packtool pack (the first)"),
        pytest.raises(ConfigError, match=r"being written by another packtool \(pid \d+"),
    ):
        run_pack(pack_config(url))
    assert not store.fs.exists(f"{BUCKET}/locked/index.json")

    # Another host's holder: refused while its lease runs, taken once it has run out (the
    # store's own modification time of the lock object says when it was last renewed). The
    # clock the lease is read against moves on by hand: with a 1 s lease and a real sleep,
    # Azure's whole-second modification times let a lock written at x.95 s look a second old
    # at once (taken, not refused: 2 of 80 tries).
    lock = store.url("locks/stale")
    monkeypatch.setenv(remote_write.LEASE_ENV, "30")
    later = [0.0]
    clock = SimpleNamespace(time=lambda: time.time() + later[0], sleep=time.sleep)
    monkeypatch.setattr(remote_write, "time", clock)
    store.fs.pipe_file(
        f"{BUCKET}/locks/stale", json.dumps({"pid": 1, "host": "elsewhere"}).encode()
    )
    with pytest.raises(remote_write.RemoteLockBusy):
        remote_write.take_lock(lock)
    later[0] = 32.0  # the lease, and the second a modification time may have lost
    held = remote_write.take_lock(lock, json.dumps({"host": socket.gethostname()}).encode())
    held.release()
    store.fs.invalidate_cache()
    assert not store.fs.exists(f"{BUCKET}/locks/stale")


def test_overwrite_never_deletes_a_user_s_objects_under_a_shard_s_name(store):
    # Every entry of a prefix's listing was taken for an object: `shard-...parquet/` and
    # `sources.json/` passed for a dataset's files, and --overwrite deleted what they held.
    mine = ("shard-000000-00000.parquet/notes.txt", "sources.json/keep.txt")
    for name in mine:
        store.fs.pipe_file(f"{BUCKET}/users/{name}", b"mine")
    url = store.url("users")
    code, _, err = run("pack", CORPUS, "-o", url, "--max-len", "512", "--overwrite")
    assert code != 0 and "did not write (shard-000000-00000.parquet, sources.json)" in (
        one_error_line(err)
    )
    assert [o for o in store.objects("users") if not o.startswith(".packtool")] == list(mine)


def test_an_output_under_another_spelling_of_the_input_prefix_is_refused(azurite_server):
    # The URLs' text was compared: the dataset went into the input's prefix, and every later
    # run on az://apart/corpus/ read (or failed on) its own output.
    import fsspec

    fs = fsspec.filesystem("az", skip_instance_cache=True)
    fs.mkdir("apart")
    fs.pipe_file("apart/corpus/c.jsonl", CORPUS.read_bytes())
    for out in (
        "abfs://apart/corpus/packed",
        "az://apart@devstoreaccount1.blob.core.windows.net/corpus/p",
    ):
        code, _, err = run("pack", "az://apart/corpus/", "-o", out, "--max-len", "512")
        assert code != 0 and "inside the input az://apart/corpus/" in one_error_line(err), err
    fs.invalidate_cache()
    assert fs.find("apart/corpus") == ["apart/corpus/c.jsonl"]


def test_of_writers_racing_for_a_lock_object_on_azure_exactly_one_wins(azurite_server):
    # A conditional create (adlfs's `mode="create"`: If-None-Match *). GCS makes it with
    # ifGenerationMatch=0, which the emulator does not enforce, so the race is run on Azure here
    # (and on S3 in test_remote_output.py).
    import fsspec

    fs = fsspec.filesystem("az", skip_instance_cache=True)
    fs.mkdir("race")
    url = "az://race/lock"
    won, refused = race_for_lock(url)
    assert len(won) == 1 and len(refused) == 7
    assert json.loads(refused[0])["writer"] == json.loads(fs.cat_file("race/lock"))["writer"]
    won[0].release()
    fs.invalidate_cache()
    assert not fs.exists("race/lock")


def test_an_azure_lock_is_renewed_and_taken_over_by_one_writer_only(azurite_server, monkeypatch):
    # Azure replaces a blob only if it is the version named (adlfs: etag + IfNotModified), as
    # S3's If-Match: a live holder renews its lease, one whose lock was taken over knows it has
    # lost it, and of writers taking over one stale lock exactly one wins.
    import fsspec

    fs = fsspec.filesystem("az", skip_instance_cache=True)
    fs.mkdir("stale")
    url = "az://stale/lock"
    monkeypatch.setenv(remote_write.LEASE_ENV, "1")
    held = remote_write.take_lock(url, b"me")
    time.sleep(1.5)  # renewed every lease / 4
    assert not held.lost and fs.cat_file("stale/lock") == b"me"
    fs.pipe_file("stale/lock", b"someone else")
    deadline = time.monotonic() + 5
    while not held.lost and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held.lost
    held.release()
    assert fs.cat_file("stale/lock") == b"someone else"  # a lost lock is not deleted

    # A holder that is gone (a dead pid on this host), the lease back to its default so that
    # the winner's lock is live: 8 writers take it over at once.
    monkeypatch.delenv(remote_write.LEASE_ENV)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fs.pipe_file("stale/lock", json.dumps({"pid": dead.pid, "host": socket.gethostname()}).encode())
    won, refused = race_for_lock(url)
    assert len(won) == 1 and len(refused) == 7
    assert json.loads(fs.cat_file("stale/lock")) == json.loads(refused[0])
    won[0].release()


def test_azure_s_failed_credentials_are_not_logged_before_the_error():
    # An account name and no credentials: azure.identity logged each failed try of its chain
    # (49 lines of warnings before packtool's one-line error). Its tries here are kept to the
    # environment's (no network), through the options a user passes to adlfs.
    import os

    pytest.importorskip("adlfs")
    from tests.packtool.storage.common import ROOT

    skip = ("workload_identity", "managed_identity", "shared_token_cache", "cli",
            "visual_studio_code", "powershell", "developer_cli")  # fmt: skip
    options = {"az": {f"exclude_{name}_credential": True for name in skip}}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AZURE_", "PACKTOOL_"))}
    env.update(
        AZURE_STORAGE_ACCOUNT_NAME="devstoreaccount1",
        PACKTOOL_STORAGE_OPTIONS=json.dumps(options),
        PYTHONPATH=str(ROOT),
    )
    code = (
        "from packtool.storage import remote\n"
        "fs, _ = remote.filesystem('az://rev1/corpus/p1.jsonl')\n"
        "try:\n"
        "    fs.sync_credential.get_token('https://storage.azure.com/.default')\n"
        "except Exception as exc:\n"
        "    print(type(exc).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.strip() == "ClientAuthenticationError", done.stderr
    assert done.stderr == ""


def test_a_missing_bucket_or_object_is_one_line_naming_the_url(store):
    code, _, err = run("pack", CORPUS, "-o", f"{store.scheme}://no-such-bucket-x/ds")
    assert code != 0 and f"{store.scheme}://no-such-bucket-x/ds" in one_error_line(err), err
    code, _, err = run("stats", store.url("nothing/here.jsonl"))
    assert code != 0 and store.url("nothing/here.jsonl") in one_error_line(err), err
    code, _, err = run("verify", store.url("nothing"))
    assert code != 0 and store.url("nothing") in one_error_line(err), err
