"""Datasets written to object storage: `packtool pack -o s3://...` against a real S3 API server
on loopback (moto's server mode, the `s3_server` fixture), through s3fs as users write; no client
library is mocked. The commit protocol without a rename (packtool/dataset/output.py): versions
under the prefix, the link `index.json` written last, the lock object under a lease."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from packtool.dataset.manifest import read_manifest
from packtool.dataset.output import OutputLock, make_staging, output_paths
from packtool.dataset.shards import ShardConfig
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from packtool.storage import local as storage
from packtool.storage import remote, remote_write, s3_native
from tests.cli import one_error_line, run
from tests.packtool.storage import common
from tests.packtool.storage.common import (
    CORPUS,
    ROOT,
    linked,
    race_for_lock,
    requests_seen,
    same_but_inputs,
)

BUCKET = "datasets"

PARTITION_SIZE = common.FEW_PARTITIONS
"""This module's partitions (3 of the sample corpus): its tests are of the output's commit, not
of partitions; `local_pack` (conftest.py) is packed in them too."""


def pack_config(out, inputs=(CORPUS,), **kw) -> RunConfig:
    """`common.pack_config` in this module's partitions."""
    return common.pack_config(out, inputs, PARTITION_SIZE, **kw)


def _link(fs, prefix: str) -> str:
    return linked(fs, BUCKET, prefix)


def _version_files(fs, prefix: str) -> dict[str, bytes]:
    """The files of the version the link `index.json` under `prefix` names."""
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}/{_link(fs, prefix)}"
    return {k[len(root) + 1 :]: fs.cat_file(k) for k in sorted(fs.find(root))}


def _objects(fs, prefix: str) -> list[str]:
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}/"
    return sorted(k[len(root) :] for k in fs.find(root))


SMALL_DOCS = 500
"""`small_corpus`'s documents: the first 500 of the sample corpus (0.35 MB of its 3.1 MB)."""


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory) -> Path:
    """The first `SMALL_DOCS` lines of the sample corpus: what the tests of `tokenize`'s
    outputs in a bucket (the swap of a Megatron pair, a folder of parts, one object) write, in
    several parts or partitions still (6 of `MEGATRON`'s 60 kB), where they wrote the whole
    corpus (52 partitions a run, most of these tests' time) for checks of the output's commit
    that no size reaches."""
    path = tmp_path_factory.mktemp("small") / "corpus.jsonl"
    with CORPUS.open("rb") as f:
        path.write_bytes(b"".join(next(f) for _ in range(SMALL_DOCS)))
    return path


def test_a_pack_to_a_bucket_writes_the_bytes_of_a_local_pack(fs, local_pack):
    url = f"s3://{BUCKET}/a"
    run_pack(pack_config(url))
    version = _link(fs, "a")
    # The link and one version, byte for byte the local dataset (index.json included); no run
    # state, staging or lock object left.
    assert _objects(fs, "a") == ["index.json", *(f"{version}/{n}" for n in local_pack)]
    assert _version_files(fs, "a") == local_pack
    assert read_manifest(url).num_rows == read_manifest(f"{url}/index.json").num_rows > 0
    code, out, err = run("verify", url)
    assert code == 0 and out.startswith("OK ") and "sha256 verified" in out, err
    code, out, err = run("inspect", url)
    assert code == 0 and "shard-000000-00000.parquet" in out, err


def test_a_pack_from_a_bucket_to_a_bucket_writes_the_same_bytes(fs, local_pack, s3_client):
    fs.put_file(str(CORPUS), f"{BUCKET}/corpus/corpus.jsonl")
    out = f"b-{s3_client}"
    run_pack(pack_config(f"s3://{BUCKET}/{out}", inputs=(f"s3://{BUCKET}/corpus/corpus.jsonl",)))
    assert same_but_inputs(_version_files(fs, out), local_pack)


def test_the_ray_engine_writes_a_bucket_from_its_own_workers(ray_session, fs, local_pack):
    """Ray's actors upload their own shards, tails and records (with the variables the driver
    hands them): the bytes of a local pack. One actor: its uploads are the point, not a pool of
    two (~3-5 s of CPU more)."""
    from packtool.engines.ray import RayConfig, run_pack_ray

    run_pack_ray(pack_config(f"s3://{BUCKET}/ray"), RayConfig(actors=1))
    assert _version_files(fs, "ray") == local_pack


def test_the_slurm_engine_writes_a_bucket_from_its_tasks(
    slurm_cluster, fs, local_pack, tmp_path, monkeypatch
):
    from packtool.engines.slurm.driver import SlurmConfig, run_pack_slurm
    from packtool.engines.slurm.state import LOCAL_HOME, local_home

    # The tasks write the shards and records themselves (the AWS_* variables reach them through
    # sbatch's --export=ALL); the job scripts and logs go to .packtool-slurm/ here, not the bucket.
    monkeypatch.chdir(tmp_path)
    seen: list[bool] = []
    import packtool.engines.slurm.arrays as arrays

    submit = arrays.cli.submit_array

    def watched(options, tasks, script, record):  # the scripts are in the local folder
        seen.append(Path(script).is_relative_to(tmp_path / LOCAL_HOME))
        return submit(options, tasks, script, record)

    monkeypatch.setattr(arrays.cli, "submit_array", watched)
    summary = run_pack_slurm(pack_config(f"s3://{BUCKET}/slurm"), SlurmConfig(poll_seconds=0.3))
    assert summary.partitions > 1 and seen and all(seen)
    assert _version_files(fs, "slurm") == local_pack
    assert _objects(fs, "slurm") == [
        "index.json",
        *(f"{_link(fs, 'slurm')}/{n}" for n in local_pack),
    ]
    assert not (tmp_path / LOCAL_HOME).exists()  # a finished run's Slurm files are gone
    assert local_home("s3://x/a") != local_home("s3://x/b")


def test_slurm_pull_workers_detach_and_resume_into_a_bucket(
    slurm_cluster, fs, local_pack, tmp_path, monkeypatch
):
    from packtool.engines.slurm.driver import SlurmConfig, run_pack_slurm
    from packtool.engines.slurm.state import LOCAL_HOME
    from packtool.errors import Detached

    # Detached: the run state (records, shards) is in the bucket, the jobs' files here; the
    # driver that comes back from this folder re-attaches to the workers and finishes.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Detached) as gone:
        run_pack_slurm(pack_config(f"s3://{BUCKET}/pull"), SlurmConfig(workers=2, wait=False))
    assert gone.value.job_ids and any((tmp_path / LOCAL_HOME).iterdir())
    assert not fs.exists(f"{BUCKET}/pull/index.json")
    run_pack_slurm(
        pack_config(f"s3://{BUCKET}/pull", resume=True), SlurmConfig(workers=2, poll_seconds=0.3)
    )
    assert _version_files(fs, "pull") == local_pack
    assert not (tmp_path / LOCAL_HOME).exists()


def test_a_fresh_slurm_run_never_takes_a_discarded_run_s_job_files(
    slurm_cluster, fs, local_pack, tmp_path, monkeypatch
):
    from dataclasses import replace

    from packtool.engines.slurm.driver import SlurmConfig, run_pack_slurm
    from packtool.errors import Detached

    # A run of other options is left detached, its jobs cancelled; `--overwrite` then starts
    # over in the same staging version. Its tasks must load its own context, not the old one.
    monkeypatch.chdir(tmp_path)
    other = replace(pack_config(f"s3://{BUCKET}/fresh"), pack=PackConfig(max_len=512))
    with pytest.raises(Detached) as gone:
        run_pack_slurm(other, SlurmConfig(wait=False))
    subprocess.run(["scancel", *gone.value.job_ids], check=True)
    end = time.time() + 60
    while time.time() < end:
        queue = subprocess.run(
            ["squeue", "-h", "-j", ",".join(gone.value.job_ids)], capture_output=True, text=True
        )
        if not queue.stdout.strip():
            break
        time.sleep(0.3)
    run_pack_slurm(
        pack_config(f"s3://{BUCKET}/fresh", overwrite=True), SlurmConfig(poll_seconds=0.3)
    )
    assert _version_files(fs, "fresh") == local_pack


def test_an_output_inside_an_input_prefix_is_refused(fs):
    with pytest.raises(ConfigError, match="inside the input"):
        run_pack(pack_config(f"s3://{BUCKET}/corpus/out", inputs=(f"s3://{BUCKET}/corpus/",)))


def test_overwrite_builds_beside_the_old_dataset_and_switches(
    fs, local_pack, tmp_path, monkeypatch
):
    url = f"s3://{BUCKET}/c"
    run_pack(pack_config(url))
    first = _link(fs, "c")
    before = _version_files(fs, "c")
    with pytest.raises(ConfigError, match="not empty; pass --overwrite"):
        run_pack(pack_config(url))

    # A failed overwrite (a bad document in strict mode, met by a partition worker) leaves the
    # old dataset as it was: the same link, the same objects, nothing else under the prefix.
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(CORPUS.read_bytes() + b"{not json\n")
    with pytest.raises(DataError):
        run_pack(pack_config(url, inputs=(bad,), overwrite=True, read=ReadConfig(strict=True)))
    assert _link(fs, "c") == first and _version_files(fs, "c") == before
    assert _objects(fs, "c") == ["index.json", *(f"{first}/{n}" for n in local_pack)]

    # A good one: the old version is deleted only once the link names the new one.
    seen: list[tuple[str, str]] = []
    delete = remote_write.remove_tree

    def watching(u) -> None:
        seen.append((str(u).rstrip("/").rsplit("/", 1)[-1], _link(fs, "c")))
        delete(u)

    monkeypatch.setattr(remote_write, "remove_tree", watching)
    run_pack(pack_config(url, overwrite=True))
    second = _link(fs, "c")
    assert second != first and _version_files(fs, "c") == local_pack
    assert (first, second) in seen  # deleted after the switch
    assert _objects(fs, "c") == ["index.json", *(f"{second}/{n}" for n in local_pack)]


def test_overwrite_of_an_interrupted_run_builds_a_new_version(fs, local_pack):
    # A run left its staging (the object naming its version, and a shard in it). `--overwrite`
    # discards it and builds another version: a job of the discarded run still alive could
    # otherwise upload into the new run's version.
    url = f"s3://{BUCKET}/discarded"
    paths = output_paths(url)
    make_staging(paths)
    left = f"{BUCKET}/discarded/{paths.staging.name}/shard-000000-00000.parquet"
    fs.pipe_file(left, b"the discarded run's")
    with pytest.raises(
        ConfigError,
        match="pass --resume / resume=True to finish it or --overwrite / overwrite=True",
    ):
        run_pack(pack_config(url))
    run_pack(pack_config(url, overwrite=True))
    assert _link(fs, "discarded") != paths.staging.name
    assert _version_files(fs, "discarded") == local_pack
    assert _objects(fs, "discarded") == [
        "index.json",
        *(f"{_link(fs, 'discarded')}/{n}" for n in local_pack),
    ]


@pytest.mark.parametrize("left", ["nothing", "plan temporary"])
def test_a_run_killed_before_it_saved_its_plan_is_started_again_by_a_plain_run(
    fs, local_pack, left
):
    """A run killed after naming its version in `.packtool-staging` but before its plan was
    uploaded did nothing: a plain rerun discards it and builds the dataset, and --resume says
    there is nothing to resume, as for a local output."""
    prefix = f"noplan-{left.replace(' ', '-')}"
    url = f"s3://{BUCKET}/{prefix}"
    paths = output_paths(url)
    make_staging(paths)
    if left == "plan temporary":  # (an object store gets no temporaries; the rule is one)
        fs.pipe_file(f"{BUCKET}/{prefix}/{paths.staging.name}/.packtool-run/.plan.json."
                     "4242-0123abcd.tmp", b'{"fingerprint"')  # fmt: skip
    before = _objects(fs, prefix)
    with pytest.raises(
        ConfigError, match="stopped before it saved its plan.*without --resume / resume=True$"
    ):
        run_pack(pack_config(url, resume=True))
    assert _objects(fs, prefix) == before  # a refused --resume removes nothing
    run_pack(pack_config(url))
    assert _version_files(fs, prefix) == local_pack
    assert _objects(fs, prefix) == [
        "index.json",
        *(f"{_link(fs, prefix)}/{n}" for n in local_pack),
    ]


def test_a_run_killed_before_its_switch_is_discarded_by_an_overwrite_that_keeps_the_old_one(
    fs, local_pack, tmp_path
):
    # A run wrote its version whole, index.json last, and was killed before the link named it.
    # An --overwrite discards it and builds its own: one that fails leaves the old dataset as it
    # was (it switched the killed run's in first, then failed saying "nothing was committed",
    # with the old dataset replaced). --resume switches it in (test_remote_commit.py, "only by a
    # run that goes on").
    url = f"s3://{BUCKET}/unswitched"
    run_pack(pack_config(url))
    first = _link(fs, "unswitched")
    before = _objects(fs, "unswitched")
    paths = output_paths(url)
    make_staging(paths)
    for name, data in local_pack.items():
        fs.pipe_file(f"{BUCKET}/unswitched/{paths.staging.name}/{name}", data)
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(CORPUS.read_bytes() + b"{not json\n")
    with pytest.raises(DataError):
        run_pack(pack_config(url, inputs=(bad,), overwrite=True, read=ReadConfig(strict=True)))
    assert _link(fs, "unswitched") == first != paths.staging.name
    assert _objects(fs, "unswitched") == before  # the killed run's version discarded


def test_a_version_left_by_a_run_killed_after_its_switch_is_deleted_by_the_next(fs, local_pack):
    url = f"s3://{BUCKET}/d"
    run_pack(pack_config(url))
    orphan = f"{BUCKET}/d/v-20200101T000000-0123abcd/shard-000000-00000.parquet"
    fs.pipe_file(orphan, b"left by a killed run")
    run_pack(pack_config(url, overwrite=True))
    assert not fs.exists(orphan)
    assert _version_files(fs, "d") == local_pack


def test_one_writer_per_output(fs):
    url = f"s3://{BUCKET}/e"
    with (
        OutputLock(output_paths(url), "packtool pack (the first)"),
        pytest.raises(
            ConfigError, match=r"being written by another packtool \(pid \d+ on .*the first"
        ),
    ):
        run_pack(pack_config(url))
    assert not fs.exists(f"{BUCKET}/e/index.json")
    # Released: the next writer goes ahead.
    run_pack(pack_config(url))
    assert fs.exists(f"{BUCKET}/e/index.json")


def test_of_writers_racing_for_a_lock_object_exactly_one_wins(fs, s3_client):
    url = f"s3://{BUCKET}/locks/race"
    won, refused = race_for_lock(url)
    assert len(won) == 1 and len(refused) == 7
    won[0].release()
    assert not fs.exists(f"{BUCKET}/locks/race")


def test_a_lock_whose_holder_is_gone_is_taken_over(fs, monkeypatch, s3_client):
    url = f"s3://{BUCKET}/locks/stale"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    # A dead pid on this host: taken at once.
    fs.pipe_file(url, json.dumps({"pid": dead.pid, "host": socket.gethostname()}).encode())
    remote_write.take_lock(url, b'{"pid": 1}').release()
    # Another host's holder: refused while its lease runs, taken once it has run out. The
    # lease is 3 s, not 1: LastModified has whole seconds, so a lock written at 10.9 s reads as
    # written at 10 s, and a 1 s lease could run out before the check on a loaded machine. The
    # clock the lease is read against moves on by hand (as test_stores.py's), not by a sleep.
    monkeypatch.setenv(remote_write.LEASE_ENV, "3")
    later = [0.0]
    clock = SimpleNamespace(time=lambda: time.time() + later[0], sleep=time.sleep)
    monkeypatch.setattr(remote_write, "time", clock)
    fs.pipe_file(url, json.dumps({"pid": 1, "host": "elsewhere"}).encode())
    with pytest.raises(remote_write.RemoteLockBusy):
        remote_write.take_lock(url)
    later[0] = 4.2  # the lease, plus the second LastModified may have lost
    held = remote_write.take_lock(url, b"me")
    # A live holder renews its lease; one whose lock was taken over knows it has lost it.
    time.sleep(1.5)
    assert not held.lost and fs.cat_file(url) == b"me"
    fs.pipe_file(url, b"someone else")
    deadline = time.monotonic() + 5
    while not held.lost and time.monotonic() < deadline:
        time.sleep(0.1)
    assert held.lost
    held.release()  # not ours any more: left alone
    assert fs.cat_file(url) == b"someone else"


KILLED_PARTITIONS = common.PARTITION_SIZE
"""The kill -9 test's partitions: 11 of the corpus, so that the kill lands mid-run (3 recorded,
8 to do, each a few tenths of a second of the killed run's one worker: the test looks every
0.05 s) and the resume has several left (60 kB, 52 partitions, doubled both runs' cost; 120 kB,
26, took a fifth more CPU than 11 and nearly twice the time)."""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, bytes]:
    """The kill -9 test's run, uninterrupted, into a local folder: every file's bytes by name."""
    out = tmp_path_factory.mktemp("uninterrupted") / "ds"
    return common.packed_files(out, partition_size=KILLED_PARTITIONS)


def test_kill_9_during_a_pack_then_resume_gives_the_same_bytes(fs, uninterrupted, s3_client):
    k = f"k-{s3_client}"
    url = f"s3://{BUCKET}/{k}"
    options = ["--max-len", "1024", "--partition-size", str(KILLED_PARTITIONS)]
    cmd = [sys.executable, "-c", "from packtool.cli.commands import main; main()", "pack",
           str(CORPUS), "-o", url, *options, "--workers", "1"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if len(fs.glob(f"{BUCKET}/{k}/v-*/.packtool-run/parts/*.json")) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)  # mid-run: some partitions recorded, some uploading
    proc.wait()
    assert not fs.exists(f"{BUCKET}/{k}/index.json")  # nothing partial is ever a dataset

    code, _, err = run("pack", CORPUS, "-o", url, *options, "--resume")
    assert code == 0, err
    assert remote_write.uploads_in_progress(f"s3://{BUCKET}/{k}/") == []
    assert [o for o in _objects(fs, k) if ".packtool" in o] == []  # no state, no lock
    local = dict(uninterrupted)  # the same run, uninterrupted, into a local folder
    got = _version_files(fs, k)
    a, b = (json.loads(files.pop("index.json")) for files in (got, local))
    assert got == local
    assert {**a, "command": ""} == b  # the one difference: the command line of the CLI run


def test_resume_of_a_finished_dataset_in_a_bucket_is_nothing_to_do(fs):
    """A requeued job that always passes --resume, after its run finished: exit 0 and one line,
    as for a local dataset (before, the finished dataset's URL was read as a local path:
    "no such dataset folder", exit 1)."""
    url = f"s3://{BUCKET}/done"
    options = ["--max-len", "1024"]
    code, _, err = run("pack", CORPUS, "-o", url, *options)
    assert code == 0, err
    before = _objects(fs, "done")
    code, out, err = run("pack", CORPUS, "-o", url, *options, "--resume")
    assert code == 0, err
    assert "already complete" in out and "nothing to resume" in out and url in out
    assert _objects(fs, "done") == before
    code, _, err = run("pack", CORPUS, "-o", url, "--max-len", "512", "--resume")
    assert code != 0 and "finished dataset of other options" in one_error_line(err)


def test_uploads_take_under_10000_parts_and_ride_out_faults(
    fs, s3_server, tmp_path, monkeypatch, s3_client
):
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    for size in (0, 1 << 20, 100 << 30, 5 << 40):
        part = remote_write.part_size(size)
        assert part >= remote_write.MIN_PART and -(-size // part) < remote_write.MAX_PARTS
    assert remote_write.part_size(5 << 40) <= 5 << 30  # S3's largest part

    data = os.urandom(12 << 20)
    local = tmp_path / "big.bin"
    local.write_bytes(data)
    monkeypatch.setattr(remote_write, "PART_BYTES", 5 << 20)  # 3 parts
    proxy = FaultyProxy(s3_server, {"slowdown": 2, "drop": 5}, requests="writes")
    with proxy as endpoint, monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", endpoint)
        remote._filesystem.cache_clear()
        remote_write.upload(local, f"s3://{BUCKET}/up/big.bin")
    remote._filesystem.cache_clear()
    assert proxy.counts["slowdown"] >= 1 and proxy.counts["drop"] >= 1, proxy.counts
    assert fs.cat_file(f"{BUCKET}/up/big.bin") == data


@pytest.mark.parametrize("parts", [2, 2.5])
def test_an_object_of_up_to_two_parts_is_one_put_through_each_client(
    fs, tmp_path, monkeypatch, s3_client, parts
):
    # docs/remote.md: up to two parts is one PUT. Exactly two parts was a multipart upload
    # through s3fs (its rule: one PUT below 2 x chunksize) and one PUT through obstore.
    monkeypatch.setattr(remote_write, "PART_BYTES", 5 << 20)
    local = tmp_path / "two.bin"
    local.write_bytes(os.urandom(int(parts * (5 << 20))))
    url = f"s3://{BUCKET}/two-parts/{s3_client}-{parts}.bin"
    remote_write.upload(local, url)
    fs.invalidate_cache()
    etag = fs.info(url)["ETag"].strip('"')
    assert ("-" in etag) == (parts > 2), etag
    assert fs.cat_file(url) == local.read_bytes()


def test_a_failed_multipart_upload_is_aborted(fs, s3_server, tmp_path, monkeypatch, s3_client):
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    local = tmp_path / "big.bin"
    local.write_bytes(os.urandom(12 << 20))
    monkeypatch.setattr(remote_write, "PART_BYTES", 5 << 20)
    proxy = FaultyProxy(s3_server, {"deny": 2}, requests="writes")  # the second part refused
    with proxy as endpoint, monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", endpoint)
        remote._filesystem.cache_clear()
        with pytest.raises(DataError, match=f"s3://{BUCKET}/up/denied.bin"):
            remote_write.upload(local, f"s3://{BUCKET}/up/denied.bin")
    remote._filesystem.cache_clear()
    assert proxy.counts["deny"] >= 1
    assert not fs.exists(f"{BUCKET}/up/denied.bin")
    assert remote_write.uploads_in_progress(f"s3://{BUCKET}/up/") == []  # aborted, not left


def test_the_one_line_errors_of_an_output(fs, tmp_path):
    code, _, err = run("pack", CORPUS, "-o", "s3://no-such-bucket/ds")
    assert code != 0 and "s3://no-such-bucket/ds" in one_error_line(err)
    code, _, err = run("pack", CORPUS, "-o", f"s3://{BUCKET}/packed.parquet")
    assert code != 0 and "drop the .parquet" in one_error_line(err)
    code, _, err = run("pack", CORPUS, "-o", f"s3://{BUCKET}/never", "--resume")
    assert code != 0 and "nothing to resume" in one_error_line(err)


def test_bad_credentials_are_one_line_naming_the_url(fs, monkeypatch, s3_client):
    """The server checks signatures here (moto with IAM authentication on): the test's keys
    are no user's, as a wrong key pair is."""
    import moto.settings

    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    remote._filesystem.cache_clear()
    t0 = time.monotonic()
    code, _, err = run("pack", CORPUS, "-o", f"s3://{BUCKET}/denied")
    line = one_error_line(err)
    assert code != 0 and f"s3://{BUCKET}/denied" in line, line
    assert "denied" in line.lower() or "InvalidAccessKeyId" in line or "credentials" in line
    code, _, err = run("verify", f"s3://{BUCKET}/a")
    assert code != 0 and f"s3://{BUCKET}/a" in one_error_line(err)
    assert time.monotonic() - t0 < 60
    monkeypatch.undo()
    remote._filesystem.cache_clear()
    assert not fs.exists(f"{BUCKET}/denied/.packtool-lock")


def test_a_pack_into_a_bucket_rides_out_faulty_uploads(fs, s3_server, local_pack, monkeypatch):
    """Through a proxy that answers every 5th upload (PUT: objects, parts, the lock's renewals)
    with 503 SlowDown and drops every 13th connection unanswered: the same dataset."""
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    proxy = FaultyProxy(s3_server, {"slowdown": 5, "drop": 13}, requests="writes")
    with proxy as endpoint, monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", endpoint)
        remote._filesystem.cache_clear()
        run_pack(pack_config(f"s3://{BUCKET}/faulty"))
    remote._filesystem.cache_clear()
    assert proxy.counts["slowdown"] >= 1 and proxy.counts["drop"] >= 1, proxy.counts
    assert _version_files(fs, "faulty") == local_pack


def test_tokenize_writes_one_object_to_a_bucket(fs, small_corpus, tmp_path):
    """`tokenize -o s3://.../OUT.parquet`: built in local scratch, uploaded whole at the end
    (nothing there until then), the bytes of the same local output; pack reads it back."""
    url = f"s3://{BUCKET}/tok/corpus.parquet"
    code, _, err = run("tokenize", small_corpus, "-o", tmp_path / "local.parquet")
    assert code == 0, err
    code, _, err = run("tokenize", small_corpus, "-o", url)
    assert code == 0, err
    assert fs.cat_file(url) == (tmp_path / "local.parquet").read_bytes()
    assert sorted(fs.find(f"{BUCKET}/tok/")) == [f"{BUCKET}/tok/corpus.parquet"]  # no lock left
    code, _, err = run("tokenize", small_corpus, "-o", url)
    assert code != 0 and "--overwrite" in one_error_line(err)
    code, _, err = run("pack", url, "-o", tmp_path / "packed", "--max-len", 1024)
    assert code == 0, err


def test_a_writer_aborts_only_its_own_prefix_s_unfinished_uploads(fs, s3_client):
    """`s3://b/ds` collects what a killed run left under `ds/`, never `ds2/`'s live uploads."""
    import boto3

    client = boto3.client("s3")
    mine = client.create_multipart_upload(Bucket=BUCKET, Key="sib/ds/v-x/shard.parquet")
    theirs = client.create_multipart_upload(Bucket=BUCKET, Key="sib/ds2/v-y/shard.parquet")
    assert remote_write.abort_uploads(f"s3://{BUCKET}/sib/ds") == 1
    left = client.list_multipart_uploads(Bucket=BUCKET, Prefix="sib/").get("Uploads") or []
    assert [u["UploadId"] for u in left] == [theirs["UploadId"]]
    assert mine["UploadId"] not in [u["UploadId"] for u in left]
    client.abort_multipart_upload(
        Bucket=BUCKET, Key="sib/ds2/v-y/shard.parquet", UploadId=theirs["UploadId"]
    )


def test_a_commit_aborts_no_upload_of_another_output_under_its_prefix(fs):
    """`-o s3://b/nest` aborted every unfinished upload under `nest/`, a live one of another
    output written to `nest/inner` (with a lock of its own) included; only its versions'."""
    import boto3

    client = boto3.client("s3")
    theirs = "nest/inner/v-19700101T000000-00000000/shard-000000-00000.parquet"
    mine = "nest/v-19700101T000000-00000000/shard-000000-00000.parquet"
    kept = client.create_multipart_upload(Bucket=BUCKET, Key=theirs)["UploadId"]
    client.create_multipart_upload(Bucket=BUCKET, Key=mine)  # a dead worker's, say
    run_pack(pack_config(f"s3://{BUCKET}/nest"))
    left = client.list_multipart_uploads(Bucket=BUCKET, Prefix="nest/").get("Uploads") or []
    assert [u["UploadId"] for u in left] == [kept]
    client.abort_multipart_upload(Bucket=BUCKET, Key=theirs, UploadId=kept)


def test_unfinished_uploads_are_aborted_at_every_commit_and_where_a_run_left_work(fs, monkeypatch):
    """A writer aborts the unfinished multipart uploads under the output at its commit (a worker
    that died mid-upload, its partition retried, leaves its parts in a run that succeeds), and
    before its run only where a run did not finish (a staging object or a stray version); a
    failure's discard aborts its own version's."""
    import boto3

    from packtool.dataset import output

    listed: list[str] = []
    real = remote_write.abort_uploads
    monkeypatch.setattr(
        remote_write,
        "abort_uploads",
        lambda url, exact=False, only=None: listed.append(str(url)) or real(url, exact, only),
    )
    url = f"s3://{BUCKET}/aborts"
    client = boto3.client("s3")
    run_pack(pack_config(url))  # nothing under the prefix: one listing, at the commit
    assert listed == [url]
    orphan = "aborts/v-19700101T000000-00000000/shard-000000-00000.parquet"
    client.create_multipart_upload(Bucket=BUCKET, Key=orphan)  # a dead worker's, say
    run_pack(pack_config(url, overwrite=True))  # a finished dataset: at its commit only
    assert listed == [url, url]
    assert not client.list_multipart_uploads(Bucket=BUCKET, Prefix="aborts/").get("Uploads")
    paths = output_paths(url)
    make_staging(paths)  # a run that did not finish
    key = f"aborts/{paths.staging.name}/shard-000000-00000.parquet"
    client.create_multipart_upload(Bucket=BUCKET, Key=key)
    output.remove_staging(paths)  # its discard
    assert listed[2:] == [f"{url}/{paths.staging.name}"]
    assert not client.list_multipart_uploads(Bucket=BUCKET, Prefix="aborts/").get("Uploads")
    left = output_paths(url)
    make_staging(left)  # killed, this time: the next writer's recover lists too
    client.create_multipart_upload(Bucket=BUCKET, Key=key)
    run_pack(pack_config(url, overwrite=True))
    # (its version holds nothing yet: the run discards it, its uploads with it, as --overwrite
    # discards any unfinished run's, and builds a version of another name)
    assert listed[3:] == [url, f"{url}/{left.staging.name}", url]
    assert not client.list_multipart_uploads(Bucket=BUCKET, Prefix="aborts/").get("Uploads")


MEGATRON = ["--to", "megatron", "--partition-size", "60000", "--workers", "2"]


def test_tokenize_to_megatron_writes_the_pair_to_a_bucket(fs, small_corpus, tmp_path, monkeypatch):
    """`tokenize --to megatron -o s3://.../PREFIX`: the parts merged in local scratch, then
    PREFIX.bin uploaded and PREFIX.idx last; the bytes of the same local run, and nothing else
    left in the bucket or the scratch folder."""
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch"))
    url = f"s3://{BUCKET}/mega/corpus"
    code, _, err = run("tokenize", small_corpus, "-o", tmp_path / "local", *MEGATRON)
    assert code == 0, err
    code, out, err = run("tokenize", small_corpus, "-o", url, *MEGATRON)
    assert code == 0, err
    assert f"{url}.bin" in out
    for suffix in (".bin", ".idx"):
        assert fs.cat_file(f"{url}{suffix}") == (tmp_path / f"local{suffix}").read_bytes()
    fs.invalidate_cache()
    assert sorted(fs.find(f"{BUCKET}/mega/")) == [
        f"{BUCKET}/mega/.corpus.idx.packtool.json",  # the run's record (--resume checks it)
        f"{BUCKET}/mega/corpus.bin",
        f"{BUCKET}/mega/corpus.idx",
    ]
    assert list((tmp_path / "scratch").iterdir()) == []  # the staging folder went with the swap

    code, _, err = run("tokenize", small_corpus, "-o", url, *MEGATRON)
    assert code != 0 and "--overwrite" in one_error_line(err)
    code, out, err = run("tokenize", small_corpus, "-o", url, *MEGATRON, "--resume")
    assert code == 0 and "nothing to resume" in out and "not checked" not in out, (out, err)
    code, _, err = run("tokenize", small_corpus, "-o", url, *MEGATRON, "--resume", "--no-eos")
    assert code != 0 and "cannot resume" in one_error_line(err)  # other options: refused
    code, _, err = run("tokenize", small_corpus, "-o", f"{url}.idx", *MEGATRON, "--engine", "ray")
    assert code != 0 and "--engine local" in one_error_line(err)

    other = tmp_path / "other.jsonl"  # --overwrite: the pair of the new corpus, whole
    other.write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(50)))
    code, _, err = run("tokenize", other, "-o", tmp_path / "local2", *MEGATRON)
    assert code == 0, err
    code, _, err = run("tokenize", other, "-o", url, *MEGATRON, "--overwrite")
    assert code == 0, err
    for suffix in (".bin", ".idx"):
        assert fs.cat_file(f"{url}{suffix}") == (tmp_path / f"local2{suffix}").read_bytes()


def test_a_bucket_root_is_no_megatron_prefix(fs, tmp_path, monkeypatch):
    """Before: `-o s3://BUCKET` wrote objects named `.bin`, `.idx` and `..idx.packtool.json` at
    the bucket's root, which Megatron's `--data-path s3://BUCKET` never finds."""
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch"))
    for url in (f"s3://{BUCKET}", f"s3://{BUCKET}/."):
        code, _, err = run("tokenize", CORPUS, "-o", url, *MEGATRON)
        assert code != 0 and "names a file prefix, not a folder" in one_error_line(err), err
    fs.invalidate_cache()
    assert not [p for p in fs.ls(BUCKET, detail=False) if p.rsplit("/", 1)[-1].startswith(".")]


@pytest.mark.parametrize("error", [OSError, DataError])
def test_a_megatron_swap_into_a_bucket_cut_short_is_finished_by_the_next_run(
    fs, small_corpus, tmp_path, monkeypatch, error
):
    """The upload of PREFIX.idx fails after PREFIX.bin is up: no .idx, so no dataset (a reader
    of the pair never sees the new .bin with an index); the next run on the prefix finishes the
    swap from the local staging folder, with the bytes of a run never interrupted. Also when
    the failure is packtool's one-line error (a store's failure as `remote.naming` turns it),
    which a run's other errors discard the staging folder for: never a finished pair."""
    from packtool.engines.megatron.run import tokenize_megatron
    from packtool.errors import AlreadyComplete
    from packtool.storage import writing

    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch"))
    url = f"s3://{BUCKET}/cut-{error.__name__}/corpus"
    tokenize_megatron([small_corpus], tmp_path / "local", partition_size=60_000, progress=False)
    real = writing.replace

    def failing(source, target):
        if str(target) == f"{url}.idx":
            raise error("connection reset by peer")
        real(source, target)

    with monkeypatch.context() as m:
        m.setattr(writing, "replace", failing)
        with pytest.raises(error, match="reset"):
            tokenize_megatron([small_corpus], url, partition_size=60_000, progress=False)
    fs.invalidate_cache()
    assert not fs.exists(f"{url}.idx") and fs.exists(f"{url}.bin")
    assert list((tmp_path / "scratch").iterdir())  # the finished index waits there

    with pytest.raises(AlreadyComplete):  # the swap finished first, under the lock
        tokenize_megatron([small_corpus], url, partition_size=60_000, progress=False, resume=True)
    for suffix in (".bin", ".idx"):
        assert fs.cat_file(f"{url}{suffix}") == (tmp_path / f"local{suffix}").read_bytes()
    fs.invalidate_cache()
    left = [k for k in fs.find(f"{BUCKET}/cut-{error.__name__}/") if ".packtool" in k]
    assert left == [f"{BUCKET}/cut-{error.__name__}/.corpus.idx.packtool.json"]  # the record


@pytest.mark.parametrize("cut", [".bin", ".idx"])
def test_a_megatron_swap_cut_short_is_dropped_once_another_run_wrote_the_pair(
    fs, small_corpus, tmp_path, monkeypatch, capsys, s3_client, cut
):
    """Machine A's swap into a bucket is cut short (its `.bin` upload fails, or its `.idx`
    upload after it); its leftover waits in A's scratch. Nobody else writes: A's next run
    finishes it. Machine B (another scratch folder) overwrites the pair: A's next run found
    its leftover and uploaded it over B's pair, B's `.bin` under A's `.idx` (cut at the `.idx`)
    or A's older pair back over B's (cut at the `.bin`). Now it is dropped with a warning."""
    from packtool.engines.megatron.run import tokenize_megatron
    from packtool.errors import AlreadyComplete

    url = f"s3://{BUCKET}/stale-{s3_client}{cut}/corpus"
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"text": f"document {i} " * 40}) + "\n" for i in range(50)))
    kw = {"partition_size": 60_000, "progress": False}
    tokenize_megatron([small_corpus], tmp_path / "a", **kw)
    tokenize_megatron([other], tmp_path / "b", **kw)
    local = {n: [(tmp_path / f"{n}{s}").read_bytes() for s in (".bin", ".idx")] for n in "ab"}
    in_bucket = lambda: [fs.cat_file(f"{url}{s}") for s in (".bin", ".idx")]  # noqa: E731
    real = remote_write.upload

    def cut_short(**more):  # on machine A
        def failing(source, target):
            if str(target) == f"{url}{cut}":
                raise OSError("connection reset by peer")
            real(source, target)

        monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch-a"))
        with monkeypatch.context() as m:
            m.setattr(remote_write, "upload", failing)
            with pytest.raises(OSError, match="reset"):
                tokenize_megatron([small_corpus], url, **kw, **more)
        fs.invalidate_cache()
        assert not fs.exists(f"{url}.idx")
        assert list((tmp_path / "scratch-a").iterdir())  # the leftover

    cut_short()
    with pytest.raises(AlreadyComplete):  # nobody wrote since: finished
        tokenize_megatron([small_corpus], url, **kw, resume=True)
    assert in_bucket() == local["a"]

    cut_short(overwrite=True)
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch-b"))
    tokenize_megatron([other], url, **kw, overwrite=True)  # machine B
    assert in_bucket() == local["b"]
    capsys.readouterr()
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch-a"))
    with pytest.raises(AlreadyComplete):  # B's pair, which this run's inputs made
        tokenize_megatron([other], url, **kw, resume=True)
    assert in_bucket() == local["b"]  # B's, whole
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"warning: {url}: the swap a run on this")
    assert "another run has written the pair since; dropped, nothing uploaded" in err
    assert list((tmp_path / "scratch-a").iterdir()) == []


def test_tokenize_writes_a_folder_of_parts_to_a_bucket(fs, small_corpus, tmp_path, monkeypatch):
    """`tokenize -o s3://bucket/prefix`: the parts in a fresh version folder, the link
    `index.json` written last (as `pack`'s commit); readers of the prefix read the linked
    version only, never one a run in progress or a killed run left beside it; the parts are the
    bytes of the same local output."""
    from packtool.tokenize.tokenize import tokenize_corpus

    url = f"s3://{BUCKET}/parts"
    kw = {"read_config": ReadConfig(batch_docs=200), "part_tokens": 100_000, "progress": False}
    tokenize_corpus([small_corpus], tmp_path / "local", **kw)
    local = {p.name: p.read_bytes() for p in sorted((tmp_path / "local").iterdir())}
    assert len(local) > 1
    summary = tokenize_corpus([small_corpus], url, **kw)
    assert _version_files(fs, "parts") == local
    assert [o for o in _objects(fs, "parts") if ".packtool" in o] == []  # no lock, no staging
    assert all(f"{url}/v-" in str(f) for f in summary.files), summary.files
    code, _, err = run("tokenize", small_corpus, "-o", url)
    assert code != 0 and "--overwrite" in one_error_line(err)

    # A version nobody links (a run in progress, or killed) is never read from the prefix.
    fs.pipe(
        f"{BUCKET}/parts/v-20000101T000000-deadbeef/part-00000.parquet", local["part-00000.parquet"]
    )
    for out in ("a", "b"):
        src = url if out == "a" else tmp_path / "local"
        code, _, err = run("pack", src, "-o", tmp_path / out, "--max-len", 1024)
        assert code == 0, err
    shards = lambda d: {p.name: p.read_bytes() for p in sorted(d.glob("shard-*"))}  # noqa: E731
    assert shards(tmp_path / "a") == shards(tmp_path / "b")

    other = tmp_path / "other.jsonl"  # --overwrite: switches to the new version, the old ones go
    other.write_text("".join(json.dumps({"text": f"doc {i} " * 30}) + "\n" for i in range(40)))
    code, _, err = run("tokenize", other, "-o", url, "--overwrite")
    assert code == 0, err
    objects = _objects(fs, "parts")
    assert len({o.split("/")[0] for o in objects if o.startswith("v-")}) == 1, objects
    code, out, err = run("stats", url)
    assert code == 0 and "40" in out, (out, err)


def _writer_rows(n_chunks: int = 4):
    from tests.packtool.dataset.test_stitch import chunk

    return [chunk(60, seed=i, index=i) for i in range(n_chunks)]


def test_shards_upload_on_a_thread_while_the_next_is_written(fs, tmp_path, monkeypatch):
    """A writer into a bucket writes the bytes of a local writer; each shard's upload runs
    beside the next shard's writing, at most one at a time, and `close` returns once the last
    is in the bucket."""
    from packtool.dataset.shards import ShardConfig, ShardWriter
    from packtool.storage import writing

    monkeypatch.setenv(writing.SCRATCH_ENV, str(tmp_path / "scratch"))
    config = ShardConfig(shard_rows=40, row_group_rows=8)
    chunks = _writer_rows()
    local = ShardWriter(tmp_path / "local", lambda k: f"shard-{k:05d}.parquet", config)
    (tmp_path / "local").mkdir()
    for rows in chunks:
        local.add_rows(rows)
    want = local.close()
    uploading, most, real = [0], [0], writing.replace
    lock = threading.Lock()

    def watched(source, target):
        with lock:
            uploading[0] += 1
            most[0] = max(most[0], uploading[0])
        assert threading.current_thread().name.startswith("packtool-upload")
        time.sleep(0.05)  # the writer goes on with the next shard meanwhile
        try:
            real(source, target)
        finally:
            with lock:
                uploading[0] -= 1

    monkeypatch.setattr(writing, "replace", watched)
    url = f"s3://{BUCKET}/writer"
    remote_writer = ShardWriter(storage.as_path(url), lambda k: f"shard-{k:05d}.parquet", config)
    for rows in chunks:
        remote_writer.add_rows(rows)
    got = remote_writer.close()
    assert len(want) >= 3 and got == want
    assert most[0] == 1
    fs.invalidate_cache()
    for info in want:
        assert (
            fs.cat_file(f"{BUCKET}/writer/{info.file}")
            == (tmp_path / "local" / info.file).read_bytes()
        )
    assert list((tmp_path / "scratch").iterdir()) == []


def test_a_failed_shard_upload_fails_the_writer_and_leaves_no_scratch_file(
    fs, tmp_path, monkeypatch
):
    from packtool.dataset.shards import ShardConfig, ShardWriter
    from packtool.storage import writing

    monkeypatch.setenv(writing.SCRATCH_ENV, str(tmp_path / "scratch"))
    real, calls = writing.replace, [0]

    def second_fails(source, target):
        calls[0] += 1
        if calls[0] == 2:
            raise DataError(f"{target}: cannot be written (injected)")
        real(source, target)

    monkeypatch.setattr(writing, "replace", second_fails)
    config = ShardConfig(shard_rows=40, row_group_rows=8)
    url = f"s3://{BUCKET}/failing"
    writer = ShardWriter(storage.as_path(url), lambda k: f"shard-{k:05d}.parquet", config)
    with pytest.raises(DataError, match="injected"):
        for rows in _writer_rows():
            writer.add_rows(rows)
        writer.close()
    writer.abort()  # what a worker does with a failed partition
    assert list((tmp_path / "scratch").iterdir()) == []


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_the_workers_server_imports_the_store_client_and_pandas_ahead(monkeypatch, client):
    """The local engine's forkserver preloads what every worker imports anyway: its own module,
    the client library of the stores the run reads or writes (the one `s3_native.usable`
    picks), and pandas (pyarrow imports it at a process's first array when it is installed)."""
    import importlib.util

    from packtool.engines import local

    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    assert remote.client_modules(["/data/a.jsonl", "b.jsonl"]) == []
    assert client in remote.client_modules(["/data/a.jsonl", f"s3://{BUCKET}/x.jsonl"])
    modules = local._preload(("s3://b/in/", "/tmp/out"))
    # pool_server first: the server's children ignore Ctrl-C (packtool/engines/pool_server.py)
    assert modules[:2] == ["packtool.engines.pool_server", "packtool.engines.local"]
    assert client in modules
    assert ({"s3fs", "obstore"} - {client}).isdisjoint(modules)
    assert ("pandas" in modules) == (importlib.util.find_spec("pandas") is not None)
    assert client not in local._preload(("/data/in", "/tmp/out"))
    # a pack's server loads the packer's kernels too, last but for pool_ready, which ends the
    # driver watch pool_server started (test_pool_server.py: once for all; the watch)
    assert "packtool.engines.pool_kernels" not in modules
    assert modules[-1] == "packtool.engines.pool_ready"
    assert local._preload(("/data/in", "/tmp/out"), kernels=True)[-2:] == [
        "packtool.engines.pool_kernels",
        "packtool.engines.pool_ready",
    ]


@pytest.mark.parametrize("client", ["s3fs", "obstore"])
def test_a_refused_or_conflicting_conditional_put_means_the_lock_changed(
    fs, s3_server, monkeypatch, client
):
    """412 (the object is another version: moto's own answer) and 409 ConditionalRequestConflict
    (AWS's to a conditional put racing another: the proxy's) both mean the lock changed hands,
    through either S3 client."""
    from tests.packtool.storage.faulty_proxy import FaultyProxy

    url = f"s3://{BUCKET}/locks/{client}"
    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    remote._filesystem.cache_clear()
    remote_write.write_bytes(url, b"first")
    etag = remote_write._etag_of(url)
    remote_write._put_if_match(url, b"second", etag)  # ours: accepted, a new version
    with pytest.raises(remote_write._Changed):
        remote_write._put_if_match(url, b"third", etag)  # no longer that version: 412
    proxy = FaultyProxy(s3_server, {"conflict": 1}, requests="writes")
    with proxy as endpoint, monkeypatch.context() as m:
        m.setenv("AWS_ENDPOINT_URL", endpoint)
        remote._filesystem.cache_clear()
        with pytest.raises(remote_write._Changed):
            remote_write._put_if_match(url, b"fourth", remote_write._etag_of(url))
    remote._filesystem.cache_clear()
    assert proxy.counts["conflict"] >= 1
    assert fs.cat_file(f"{BUCKET}/locks/{client}") == b"second"


def test_overwrite_of_a_dataset_copied_into_a_prefix_replaces_all_of_it(fs, tmp_path):
    # A dataset copied into a prefix file by file (`aws s3 sync packed/ s3://b/synced/`) has its
    # shards at the top: an --overwrite left them there for good, beside the new version.
    old = tmp_path / "old"
    run_pack(pack_config(old, shards=ShardConfig(shard_rows=1000)))
    for p in old.iterdir():
        fs.put_file(str(p), f"{BUCKET}/synced/{p.name}")
    assert any(name.startswith("shard-") for name in _objects(fs, "synced"))
    url = f"s3://{BUCKET}/synced"
    run_pack(pack_config(url, overwrite=True))
    version = _link(fs, "synced")
    assert [n for n in _objects(fs, "synced") if not n.startswith(f"{version}/")] == ["index.json"]
    code, out, err = run("verify", url)
    assert code == 0 and out.startswith("OK "), err


@pytest.fixture(scope="module")
def many_shards(fs) -> str:
    """A dataset in the bucket of many small shards of several row groups each (36 of 100 rows
    in row groups of 20), packed once: the URL the tests of reading a bucket's shards (verify,
    `parquet_file`) read, and copy where they change it (`copy_of`)."""
    url = f"s3://{BUCKET}/many-shards"
    run_pack(pack_config(url, shards=ShardConfig(shard_rows=100, row_group_rows=20)))
    return url


def copy_of(fs, dataset: str, prefix: str) -> str:
    """The dataset `dataset` (a URL in the bucket) copied object by object (server side) to
    `prefix`, its link included: the URL of the copy, a dataset of its own."""
    source = dataset.removeprefix("s3://")
    fs.invalidate_cache()
    for key in fs.find(source):
        fs.copy(key, f"{BUCKET}/{prefix}/{key[len(source) + 1 :]}")
    fs.invalidate_cache()
    return f"s3://{BUCKET}/{prefix}"


def test_verify_of_a_bucket_dataset_exits_0_every_time(many_shards, monkeypatch):
    # `packtool verify s3://...` printed OK, then often died of SIGABRT (exit 134, "terminate
    # called without an active exception"; 6 of 12 runs through obstore): row groups decoded on
    # pyarrow's thread pool over a Python file object left buffers of it for a pool thread to
    # release while the interpreter exited.
    url = many_shards
    monkeypatch.setenv(s3_native.CLIENT_ENV, "obstore")
    cmd = [sys.executable, "-c", "from packtool.cli.commands import main; main()", "verify", url]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for _ in range(4):  # 6 of 12 failed before; the cause is checked at every read just below
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert (done.returncode, done.stdout[:3]) == (0, "OK "), done.stderr[-2000:]


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_a_bucket_shard_is_read_on_the_calling_thread_only(fs, many_shards, monkeypatch, client):
    """The cause of the aborts above: a pool thread of pyarrow's (decoding, or pre-buffering)
    reading a bucket's Python file object held its bytes past the read. Every read of every
    `ParquetFile` method, even one asking for threads, runs on the calling thread."""
    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    url = many_shards
    shard = next(o for o in _objects(fs, url.rsplit("/", 1)[-1]) if "/shard-" in o)
    reads = storage._reads()
    opened, seen = reads.open_random, set()

    def open_random(source):
        file = opened(source)
        read = file.read

        def recorded(*args):
            seen.add(threading.get_ident())
            return read(*args)

        monkeypatch.setattr(file, "read", recorded, raising=False)
        return file

    monkeypatch.setattr(reads, "open_random", open_random)
    pf = storage.parquet_file(f"{url}/{shard}")
    assert pf.metadata.num_row_groups > 1 and pf.metadata.num_columns > 1
    whole = pf.read(use_threads=True)
    assert pf.read_row_groups([0, 1], use_threads=True) == whole.slice(0, 40)
    assert pf.read_row_group(1, use_threads=True) == whole.slice(20, 20)
    assert sum(b.num_rows for b in pf.iter_batches(7, use_threads=True)) == whole.num_rows
    assert seen == {threading.get_ident()}


def test_verify_of_a_bucket_dataset_downloads_each_shard_once(
    fs, many_shards, s3_server, tmp_path, monkeypatch
):
    # It read each shard twice (the checksum, then the row groups) and a row group by a ranged
    # GET per column chunk: 751 GETs and 144 HEADs for 36 shards of 4 row groups (3.6 s).

    url = copy_of(fs, many_shards, "counted")  # a shard of it is damaged below
    version = _link(fs, "counted")
    shards = sorted(o for o in _objects(fs, "counted") if o.startswith(f"{version}/shard-"))
    assert len(shards) >= 10
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(scratch))
    with requests_seen(s3_server, monkeypatch) as seen:
        code, out, err = run("verify", url)
        assert code == 0 and out.startswith("OK "), err
        gets = [p for m, p in seen if m == "GET" and "/shard-" in p]
    assert sorted(p.split("?")[0].rsplit("/", 1)[-1] for p in gets) == [
        s.rsplit("/", 1)[-1] for s in shards
    ]
    assert list(scratch.iterdir()) == []  # each copy removed once checked
    # A byte changed in a shard (same size) is still found, in the copy, named by its URL.
    key = f"{BUCKET}/counted/{shards[3]}"
    data = bytearray(fs.cat_file(key))
    data[len(data) // 3] ^= 0xFF
    fs.pipe_file(key, bytes(data))
    for flags, found in (((), "sha256 mismatch"), (("--no-checksums",), "")):
        code, _, err = run("verify", url, *flags)
        line = one_error_line(err)
        assert code != 0 and f"s3://{key}" in line and found in line, line
    assert list(scratch.iterdir()) == []


def test_verify_of_a_bucket_dataset_that_cannot_copy_a_shard_names_the_copy(many_shards, tmp_path):
    # A full scratch disk was `error: No space left on device`, naming nothing: verify had not
    # written before, and the line did not say where or why it writes. (A file size limit
    # stands in for the full disk: the same OSError naming no file, from the same write.)
    url = many_shards
    scratch = tmp_path / "scratch"
    limited = (
        "import resource, signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN); "
        "resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512)); "
        "from packtool.cli.commands import main; main()"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PACKTOOL_SCRATCH": str(scratch)}
    done = subprocess.run(
        [sys.executable, "-B", "-c", limited, "verify", url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    line = one_error_line(done.stderr)
    assert done.returncode == 1 and line.startswith(f"error: {scratch}/.shard-"), line
    assert "File too large (a local copy of s3://" in line and "PACKTOOL_SCRATCH" in line, line
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_a_file_check_is_one_head_never_a_listing_too(fs, s3_server, monkeypatch, client):
    """A check of an object packtool writes (`.packtool-lock`, `.packtool-staging`, a tail) was
    `exists` / `isfile`: a HEAD, then after its 404 a listing of `KEY/` (is it a folder?), whose
    answer a file check never needs. 128 requests for a pack into a bucket of 12 files became
    108 (on a real store ~10-50 ms each, most before the workers start)."""
    from urllib.parse import parse_qs, urlsplit

    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    url = f"s3://{BUCKET}/headed-{client}"
    with requests_seen(s3_server, monkeypatch) as seen:
        run_pack(pack_config(url))
        run_pack(pack_config(url, overwrite=True))  # the lock, the link, the old version
    prefixes = [
        parse_qs(urlsplit(path).query).get("prefix", [""])[0]
        for method, path in seen
        if method == "GET" and "list-type=2" in path
    ]
    assert prefixes, seen  # (the listings packtool needs are there)
    asked = [p for p in prefixes if p.rstrip("/").rsplit("/", 1)[-1].startswith(".packtool-")]
    assert not [p for p in asked if not p.endswith(".packtool-run/")], asked
    assert not [p for p in prefixes if p.endswith(".arrow/")], prefixes


@pytest.mark.parametrize("where", ["local", "s3"])
def test_an_output_that_is_a_file_or_an_object_is_refused_in_one_line(fs, tmp_path, where):
    # (Untested before; on a store now one HEAD, where it was a HEAD and a listing, twice.)
    if where == "s3":
        fs.pipe_file(f"{BUCKET}/plainfile", b"notes")
        out = f"s3://{BUCKET}/plainfile"
    else:
        out = tmp_path / "plainfile"
        out.write_bytes(b"notes")
    with pytest.raises(ConfigError, match="plainfile exists and is not a folder"):
        run_pack(pack_config(out))
    if where == "s3":
        assert fs.cat_file(f"{BUCKET}/plainfile") == b"notes"
        fs.invalidate_cache()
        under = [k for k in fs.find(BUCKET) if k.startswith(f"{BUCKET}/plainfile")]
        assert under == [f"{BUCKET}/plainfile"]  # (nothing written beside or under it)
    else:
        assert out.read_bytes() == b"notes"


@pytest.mark.parametrize("client", ["obstore", "s3fs"])
def test_remove_tree_deletes_what_is_there_in_two_requests(fs, s3_server, monkeypatch, client):
    """A prefix's objects, an object that is also the prefix, a lone object, nothing: each gone
    after one listing and one HEAD (before: a HEAD and a listing for `isdir`, the listing again,
    a HEAD for `isfile`: four round trips a folder of the commit's clean-up)."""

    monkeypatch.setenv(s3_native.CLIENT_ENV, client)
    root = f"{BUCKET}/rt-{client}"
    cases = {
        "prefix": ["prefix/a", "prefix/sub/b"],
        "dual": ["dual", "dual/a"],
        "lone": ["lone"],
        "nothing": [],
        "near": ["nearby"],  # a key that only starts like one
    }
    for keys in cases.values():
        for k in keys:
            fs.pipe_file(f"{root}/{k}", b"x")
    with requests_seen(s3_server, monkeypatch) as seen:
        for name in ("prefix", "dual", "lone", "nothing", "near"):
            before = len(seen)
            remote_write.remove_tree(f"s3://{root}/{name}")
            asked = [m for m, _ in seen[before:] if m in ("GET", "HEAD")]
            # (s3fs's find asks `isfile` of a prefix with nothing under it: 3 there)
            empty = client == "s3fs" and name in ("nothing", "near")
            assert len(asked) <= (3 if empty else 2), (name, seen[before:])
    fs.invalidate_cache()
    assert sorted(k[len(root) + 1 :] for k in fs.find(root)) == ["nearby"]
