"""The commit protocol of an output in a bucket against writers that race, fail, lose their
lock or meet objects packtool did not write (packtool/dataset/output.py; docs/remote.md,
"Writing a dataset to object storage"), on moto's S3 server (the `s3_server` fixture)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import pytest

from packtool.dataset import output, output_versions
from packtool.dataset.names import RUN_STATE
from packtool.dataset.output import make_staging, output_paths
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import AlreadyComplete, ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.storage import remote_write, writing
from tests.packtool.storage import common
from tests.packtool.storage.common import CORPUS, linked, requests_seen

BUCKET = "commits"

PARTITION_SIZE = common.FEW_PARTITIONS
"""This module's partitions (3 of the sample corpus): its tests are of the output's commit, not
of partitions; `local_pack` (conftest.py) is packed in them too."""


def pack_config(out, inputs=(CORPUS,), **kw) -> RunConfig:
    """`common.pack_config` in this module's partitions."""
    return common.pack_config(out, inputs, PARTITION_SIZE, **kw)


def _link(fs, prefix: str) -> str:
    return linked(fs, BUCKET, prefix)


def _objects(fs, prefix: str) -> list[str]:
    fs.invalidate_cache()
    root = f"{BUCKET}/{prefix}/"
    return sorted(k[len(root) :] for k in fs.find(root))


def _staged_run(fs, url: str, files: dict[str, bytes]) -> str:
    """A run in progress into `url`: its `.packtool-staging` object and `files` in its version."""
    paths = output_paths(url)
    make_staging(paths)
    prefix = url.removeprefix("s3://")
    for name, data in files.items():
        fs.pipe_file(f"{prefix}/{paths.staging.name}/{name}", data)
    return paths.staging.name


def test_a_run_committed_while_tokenize_waits_for_the_lock_is_never_touched(
    fs, local_pack, tmp_path, monkeypatch
):
    # Run A builds its version (named by `.packtool-staging`); tokenize --overwrite reads the
    # output's state, and A commits before tokenize takes the lock. Tokenize took A's committed
    # version for its own staging, deleted it and built into it; failing, it lost the dataset.
    from packtool.tokenize.tokenize import tokenize_corpus

    url = f"s3://{BUCKET}/race"
    run_pack(pack_config(url))
    version = _staged_run(fs, url, local_pack)
    take = writing.take_lock

    def after_a_commits(path, note=b""):
        output.commit(output_paths(url))  # A's switch, while this writer waits for the lock
        return take(path, note)

    monkeypatch.setattr(writing, "take_lock", after_a_commits)
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(DataError, match="no documents"):
        tokenize_corpus([tmp_path / "empty.jsonl"], url, overwrite=True, progress=False)
    assert _link(fs, "race") == version
    assert _objects(fs, "race") == ["index.json", *(f"{version}/{n}" for n in local_pack)]


def test_tokenize_overwrite_of_a_killed_pack_builds_a_version_of_another_name(fs, tmp_path):
    # docs/remote.md: --overwrite of an unfinished run deletes its version and builds a new one,
    # never the same name (a job of that run still alive could upload into it). Tokenize's
    # prepare deleted the killed pack's version and rebuilt into its name.
    from packtool.read.documents import ReadConfig
    from packtool.tokenize.tokenize import tokenize_corpus

    url = f"s3://{BUCKET}/samename"
    killed = _staged_run(fs, url, {"shard-000000-00000.parquet": b"a killed pack's shard"})
    summary = tokenize_corpus(
        [CORPUS], url, overwrite=True, progress=False, read_config=ReadConfig(batch_docs=200)
    )
    assert all(f"/{killed}/" not in str(f) for f in summary.files), summary.files
    assert _link(fs, "samename") != killed
    assert not any(o.startswith(killed) for o in _objects(fs, "samename"))


def test_a_staged_version_that_is_no_dataset_is_never_switched_in(fs, local_pack):
    # `.packtool-staging` naming a version whose index.json is not a manifest: a plain `pack`
    # (then refused: not empty) switched the link to it and deleted the dataset.
    url = f"s3://{BUCKET}/bogus"
    run_pack(pack_config(url))
    first = _link(fs, "bogus")
    before = _objects(fs, "bogus")
    bogus = _staged_run(fs, url, {"index.json": b'{"not": "a manifest"}'})
    with pytest.raises(ConfigError, match="not a manifest of a packtool dataset"):
        run_pack(pack_config(url))
    assert _link(fs, "bogus") == first
    left = [o for o in _objects(fs, "bogus") if not o.startswith((bogus, ".packtool-staging"))]
    assert left == before
    run_pack(pack_config(url, overwrite=True))  # discards it, and replaces the dataset
    assert not any(o.startswith((bogus, first)) for o in _objects(fs, "bogus"))


def test_a_complete_staged_version_is_switched_in_only_by_a_run_that_goes_on(fs, local_pack):
    url = f"s3://{BUCKET}/pending"
    run_pack(pack_config(url))
    first = _link(fs, "pending")
    staged = _staged_run(fs, url, local_pack)
    with pytest.raises(ConfigError, match="--resume"):
        run_pack(pack_config(url))
    assert _link(fs, "pending") == first
    shard = f"{BUCKET}/pending/{staged}/shard-000000-00000.parquet"
    data = fs.cat_file(shard)
    fs.pipe_file(shard, data[:-10])  # not whole: never switched in, whatever is asked
    with pytest.raises(ConfigError, match="missing or not whole"):
        run_pack(pack_config(url, resume=True))
    assert _link(fs, "pending") == first
    fs.pipe_file(shard, data)
    with pytest.raises(AlreadyComplete):
        run_pack(pack_config(url, resume=True))
    assert _link(fs, "pending") == staged


def test_a_writer_that_lost_its_lock_never_names_its_run_and_its_leftovers_never_commit(
    fs, local_pack, monkeypatch
):
    # Writer A took the lock, then stalled (SIGSTOP) past its lease before it wrote
    # `.packtool-staging`; B --overwrite took the lock over and committed. A woke, wrote its
    # staging object over, finished, and refused to commit; the next plain `pack` then switched
    # the link to A's version and deleted B's dataset.
    monkeypatch.setenv("PACKTOOL_LOCK_LEASE_S", "1")
    url = f"s3://{BUCKET}/lost"
    run_pack(pack_config(url))
    first = _link(fs, "lost")
    paths_a = output_paths(url)
    lock_a = output.OutputLock(paths_a, "writer A").__enter__()
    lock_a._held._stop.set()  # A stalls: no renewal
    import time

    time.sleep(1.5)
    run_pack(pack_config(url, overwrite=True))  # B takes the stale lock over and commits
    second = _link(fs, "lost")
    assert second != first
    with pytest.raises(ConfigError, match="another writer took over"):
        make_staging(dataclasses.replace(paths_a, held=lock_a))  # A wakes
    assert ".packtool-staging" not in _objects(fs, "lost")
    lock_a.__exit__(None, None, None)

    # Had A written it before its check (a pause can fall after any check): its version,
    # complete, built to replace the first dataset, is never switched in over B's.
    prefix = f"{BUCKET}/lost"
    stale = "v-20200101T000000-0badf00d"
    for name, data in local_pack.items():
        fs.pipe_file(f"{prefix}/{stale}/{name}", data)
    record = {"version": stale, "replaces": first}
    fs.pipe_file(f"{prefix}/.packtool-staging", json.dumps(record).encode())
    with pytest.raises(ConfigError, match="not empty"):
        run_pack(pack_config(url))
    assert _link(fs, "lost") == second
    assert not any(o.startswith((stale, ".packtool-staging")) for o in _objects(fs, "lost"))


def test_a_run_that_fails_after_losing_its_lock_says_so(fs, monkeypatch):
    # Writer A stalled past its lease; B --overwrite took the lock over and deleted A's run.
    # A woke and failed on "...parts/000000.json: no such object", not saying why.
    monkeypatch.setenv("PACKTOOL_LOCK_LEASE_S", "1")
    url = f"s3://{BUCKET}/stalled"
    a_run = output.transaction(url, "writer A", lambda p: None, lambda e, s: False)
    with pytest.raises(ConfigError) as failed, a_run as (paths, _):
        paths.held._held._stop.set()  # A stalls: no renewal
        time.sleep(1.5)
        run_pack(pack_config(url, overwrite=True))  # B takes the stale lock over, commits
        raise FileNotFoundError(f"{paths.staging}/.packtool-run/parts/000000.json")
    said = str(failed.value)
    assert said.startswith(f"{url}: another writer took over this run's lock"), said
    assert "(FileNotFoundError: " in said and said.endswith("nothing was committed")
    assert _link(fs, "stalled")  # B's dataset stands


def test_a_staging_object_that_appears_and_goes_is_another_run_s(fs, monkeypatch):
    # The conditional put refused (another run's object there), which was gone by the read:
    # the read of a missing object raised "no such object" (a DataError, not the
    # FileNotFoundError `_read_or_none` caught) instead of naming the other writer.
    url = f"s3://{BUCKET}/vanished"
    monkeypatch.setattr(writing, "create_exclusive", lambda path, data: False)
    with pytest.raises(ConfigError, match=r"another run's \.packtool-staging appeared"):
        run_pack(pack_config(url))


def test_a_ctrl_c_or_a_detached_run_asks_the_store_nothing_more(fs, monkeypatch):
    # After a failure the lock's holder was asked again (a conditional PUT: up to 8 attempts
    # against a store out of reach) on a Ctrl-C too, and a detached run's Detached became
    # "this run stopped" when the lock had been lost.
    from packtool.errors import Detached

    asked = []
    holds = output.OutputLock.holds
    monkeypatch.setattr(output.OutputLock, "holds", lambda self: asked.append(1) or holds(self))
    for exc in (KeyboardInterrupt(), Detached("jobs 1-4 go on", ["1", "4"])):
        a_run = output.transaction(f"s3://{BUCKET}/asked", "x", lambda p: None, lambda e, s: False)
        with pytest.raises(type(exc)), a_run:
            raise exc
    assert asked == []


def test_a_megatron_run_that_lost_its_lock_swaps_nothing_in(fs, tmp_path, monkeypatch):
    # `tokenize --to megatron -o s3://...` stalled past its lease once its parts were merged
    # (a SIGSTOP, or the store out of reach: no refused renewal had set `lost` yet) and B took
    # the lock over. A looked only at the `lost` flag, never renewed conditionally as `pack`
    # does (`OutputLock.confirm`), and swapped its pair in under B's lock.
    import time

    from packtool.engines import local
    from packtool.engines.megatron.run import tokenize_megatron

    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch"))
    monkeypatch.setenv("PACKTOOL_LOCK_LEASE_S", "1")
    url = f"s3://{BUCKET}/mega-lost/corpus"
    held, taken = [], []
    take, drive = writing.take_lock, local.drive_local

    def keep(path, note=b""):
        held.append(take(path, note))
        return held[-1]

    def stall(run, workers):
        used = drive(run, workers)
        held[0]._stop.set()  # A stalls: no renewal
        time.sleep(1.5)
        taken.append(remote_write.take_lock(held[0].url, b"writer B"))  # B takes it over
        return used

    monkeypatch.setattr(writing, "take_lock", keep)
    monkeypatch.setattr(local, "drive_local", stall)
    try:
        with pytest.raises(ConfigError, match="another writer took over"):
            tokenize_megatron([CORPUS], url, partition_size=60_000, progress=False)
    finally:
        for lock in taken:
            lock.release()
    fs.invalidate_cache()
    assert not fs.exists(f"{url}.idx") and not fs.exists(f"{url}.bin")
    # Nor does a finished index wait in the staging folder for the next run to swap it in.
    assert not list((tmp_path / "scratch").rglob("ready.idx"))


@pytest.mark.parametrize("how", ["plain", "overwrite", "resume"])
def test_a_refused_run_deletes_nothing_packtool_did_not_write(fs, how):
    # notes.txt and v-20200101T000000-deadbeef/important.csv under the prefix: every run is
    # refused, and `recover` had deleted the v-*-shaped folder (a version by its name alone).
    prefix = f"{BUCKET}/hostile-{how}"
    mine = ["notes.txt", "v-20200101T000000-deadbeef/important.csv"]
    if how == "resume":
        mine = mine[1:]
    for name in mine:
        fs.pipe_file(f"{prefix}/{name}", b"the user's")
    with pytest.raises(ConfigError):
        run_pack(pack_config(f"s3://{prefix}", **({how: True} if how != "plain" else {})))
    assert _objects(fs, prefix.split("/", 1)[1]) == sorted(mine)


def test_only_versions_holding_packtool_s_names_are_collected(fs, local_pack):
    url = f"s3://{BUCKET}/collect"
    prefix = f"{BUCKET}/collect"
    run_pack(pack_config(url))
    fs.pipe_file(f"{prefix}/v-20200101T000000-deadbeef/important.csv", b"the user's")
    fs.pipe_file(f"{prefix}/v-20200101T000000-0123abcd/shard-000000-00000.parquet", b"a run's")
    fs.pipe_file(f"{prefix}/v-2020010xT000000-0123abcd/part-00000.parquet", b"not a version")
    with pytest.raises(ConfigError, match="did not write"):
        run_pack(pack_config(url, overwrite=True))
    fs.rm(f"{prefix}/v-2020010xT000000-0123abcd", recursive=True)
    with pytest.raises(ConfigError, match="did not write.*v-20200101T000000-deadbeef"):
        run_pack(pack_config(url, overwrite=True))
    objects = _objects(fs, "collect")
    assert "v-20200101T000000-deadbeef/important.csv" in objects
    assert not any(o.startswith("v-20200101T000000-0123abcd") for o in objects)


def test_tokenize_overwrite_refuses_a_version_shaped_folder_of_the_user_s(fs, tmp_path):
    from packtool.tokenize.tokenize import tokenize_corpus

    prefix = f"{BUCKET}/hostile-tokenize"
    fs.pipe_file(f"{prefix}/v-20200101T000000-deadbeef/important.csv", b"the user's")
    with pytest.raises(ConfigError, match="not a tokenize output"):
        tokenize_corpus([CORPUS], f"s3://{prefix}", overwrite=True, progress=False)
    assert _objects(fs, "hostile-tokenize") == ["v-20200101T000000-deadbeef/important.csv"]


def test_a_failure_after_the_switch_is_a_warning_and_the_next_run_cleans_up(
    fs, local_pack, monkeypatch, capsys
):
    # The delete of `.packtool-staging` after the link was written failed: the run exited 1
    # "error: ..." while the new dataset was committed and the old version left orphaned.
    url = f"s3://{BUCKET}/after"
    run_pack(pack_config(url))
    first = _link(fs, "after")
    remove_file = writing.remove_file

    def failing(path, missing_ok=True):
        if str(path).endswith(".packtool-staging"):
            raise OSError(5, "Input/output error", str(path))
        return remove_file(path, missing_ok)

    monkeypatch.setattr(writing, "remove_file", failing)
    run_pack(pack_config(url, overwrite=True))  # succeeds: the dataset is committed
    second = _link(fs, "after")
    assert second != first
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]
    assert len(warned) == 1 and "next run" in warned[0] and second in warned[0], warned
    monkeypatch.undo()
    run_pack(pack_config(url, overwrite=True))
    third = _link(fs, "after")
    assert _objects(fs, "after") == ["index.json", *(f"{third}/{n}" for n in local_pack)]


def test_a_commit_never_removes_another_run_s_staging(fs, local_pack):
    # A writer paused after its last check commits while another run builds (docs/remote.md,
    # "One writer"): its cleanup removed `.packtool-staging` whatever run it named, so that
    # run's version, then named by nothing, was deleted as an orphan under it.
    url = f"s3://{BUCKET}/theirs"
    paths_a = output_paths(url)
    for name, data in local_pack.items():
        fs.pipe_file(f"{BUCKET}/theirs/{paths_a.staging.name}/{name}", data)
    output._NEW_VERSIONS.pop(str(paths_a.target))
    theirs = _staged_run(fs, url, {"shard-000000-00000.parquet": b"the other run's"})
    output.commit(paths_a)
    assert _link(fs, "theirs") == paths_a.staging.name
    assert f"{theirs}/shard-000000-00000.parquet" in _objects(fs, "theirs")
    assert json.loads(fs.cat_file(f"{BUCKET}/theirs/.packtool-staging"))["version"] == theirs


def test_a_commit_cleans_up_with_its_requests_side_by_side(fs, local_pack, monkeypatch, capsys):
    # After the switch the run's state, unfinished uploads and the old version went one
    # request after another (0.15-0.20 s on a loopback store): each waits here for the others,
    # so one after another never gets past the first.
    url = f"s3://{BUCKET}/sidebyside"
    run_pack(pack_config(url))
    first = _link(fs, "sidebyside")
    met = threading.Barrier(3, timeout=10)
    remove, abort = output_versions.remove, remote_write.abort_uploads
    seen = []

    def meeting(fn, what):
        def call(*args, **kwargs):
            if what not in seen:  # the first call of each kind waits for the other two kinds
                seen.append(what)
                met.wait()
            return fn(*args, **kwargs)

        return call

    monkeypatch.setattr(
        output_versions,
        "remove",
        lambda path: meeting(remove, "state" if path.name == RUN_STATE else "old")(path),
    )
    monkeypatch.setattr(remote_write, "abort_uploads", meeting(abort, "uploads"))
    run_pack(pack_config(url, overwrite=True))
    assert "warning" not in capsys.readouterr().err
    assert sorted(seen) == ["old", "state", "uploads"]
    second = _link(fs, "sidebyside")
    assert second != first
    assert _objects(fs, "sidebyside") == ["index.json", *(f"{second}/{n}" for n in local_pack)]


def test_a_commit_deletes_its_staging_object_only_after_its_run_state(fs, monkeypatch):
    # The clean-up deleted the run state (many objects) and `.packtool-staging` (one) side by
    # side: a kill after the latter left the state inside the committed version for good, as
    # `recover` deletes a linked version's state only while a staging object names it.
    url = f"s3://{BUCKET}/order"
    remove, remove_file = output_versions.remove, writing.remove_file
    state_gone = []

    def slow_remove(path):
        if path.name == RUN_STATE:
            time.sleep(0.5)
            remove(path)
            state_gone.append(path)
        else:
            remove(path)

    def checked_remove_file(path, missing_ok=True):
        if str(path).endswith(".packtool-staging"):
            assert state_gone, "the staging object went before the run state"
        return remove_file(path, missing_ok)

    monkeypatch.setattr(output_versions, "remove", slow_remove)
    monkeypatch.setattr(writing, "remove_file", checked_remove_file)
    run_pack(pack_config(url))
    assert state_gone
    version = _link(fs, "order")
    assert not [o for o in _objects(fs, "order") if RUN_STATE in o or "staging" in o]
    assert f"{version}/index.json" in _objects(fs, "order")


def test_a_lost_answer_to_the_staging_object_s_put_is_this_run_s_own(fs, local_pack, monkeypatch):
    # The store applied the conditional put of `.packtool-staging`, its answer was lost and the
    # client's retry was refused (412): the run stopped, blaming "another writer".
    url = f"s3://{BUCKET}/lostanswer"
    create = writing.create_exclusive

    def answer_lost(path, data):
        if str(path).endswith(".packtool-staging"):
            assert create(path, data)  # applied ...
            return create(path, data)  # ... and the retry refused: False
        return create(path, data)

    monkeypatch.setattr(writing, "create_exclusive", answer_lost)
    run_pack(pack_config(url))
    version = _link(fs, "lostanswer")
    assert _objects(fs, "lostanswer") == ["index.json", *(f"{version}/{n}" for n in local_pack)]


def test_resume_of_other_options_never_switches_in_a_run_killed_at_its_link(fs, monkeypatch):
    # A run killed while it wrote its link (its version whole, index.json in it), then `--resume`
    # with another max_len: it switched the killed run's version in and said "committed" (exit
    # 0). It is refused as an unfinished run's resume is, naming what differs; nothing changes.
    url = f"s3://{BUCKET}/killed-at-link"
    write = writing.write_atomic

    class Killed(BaseException):
        pass

    def link(path, data, **kw):
        if str(path).endswith("killed-at-link/index.json"):
            raise Killed
        return write(path, data, **kw)

    monkeypatch.setattr(writing, "write_atomic", link)
    with pytest.raises(Killed):
        run_pack(pack_config(url))
    monkeypatch.undo()
    before = _objects(fs, "killed-at-link")
    built = [o for o in before if o.endswith("/index.json")]
    assert len(built) == 1 and any("/.packtool-run/" in o for o in before)
    other = dataclasses.replace(pack_config(url, resume=True), pack=PackConfig(max_len=512))
    with pytest.raises(ConfigError) as e:
        run_pack(other)
    assert (
        str(e.value) == f"cannot resume {url}: options or inputs differ (pack.max_len: 1024 -> 512)"
    )
    assert [o for o in _objects(fs, "killed-at-link") if o != ".packtool-lock"] == before
    with pytest.raises(AlreadyComplete, match="committed the dataset the interrupted run"):
        run_pack(pack_config(url, resume=True))
    version = built[0].split("/")[0]
    assert _link(fs, "killed-at-link") == version
    assert not any(".packtool" in o for o in _objects(fs, "killed-at-link"))


def test_overwrite_checks_the_old_version_with_its_listing_not_a_head_per_shard(
    fs, s3_server, monkeypatch, s3_client
):
    # `--overwrite` asked whether each object of the old version was a file: two HEADs a shard
    # (540 for 270 shards), one after another, though the listing says which keys are objects.
    # (Shards of 80 rows: ~36 of the corpus, where 20 made ~140, each a PUT and a record line.)
    from packtool.dataset.shards import ShardConfig

    url = f"s3://{BUCKET}/many-shards-{s3_client}"
    shards = ShardConfig(shard_rows=80, row_group_rows=20)
    run_pack(pack_config(url, shards=shards))
    old = _link(fs, f"many-shards-{s3_client}")
    n = sum(o.startswith(f"{old}/shard-") for o in _objects(fs, f"many-shards-{s3_client}"))
    assert n >= 30
    with requests_seen(s3_server, monkeypatch) as seen:
        run_pack(pack_config(url, shards=shards, overwrite=True, workers=1))
    heads = [p for m, p in seen if m == "HEAD" and f"/{old}/" in p]
    assert heads == [], f"{len(heads)} HEADs of the old version's {n} shards"
    assert not any(o.startswith(old) for o in _objects(fs, f"many-shards-{s3_client}"))


USERS = ("shard-000000-00000.parquet/notes.txt", "sources.json/keep.txt")
"""A user's objects under prefixes of the names packtool gives a shard and the sources list."""


def test_overwrite_refuses_a_prefix_named_as_a_shard_and_deletes_none_of_it(fs, s3_client):
    # docs/remote.md: --overwrite never deletes objects packtool did not write. Every entry of
    # the prefix's listing was taken for an object, so `shard-...parquet/` passed for a shard,
    # and the commit deleted everything under it and under `sources.json/`.
    key = f"users-{s3_client}"
    for name in USERS:
        fs.pipe_file(f"{BUCKET}/{key}/{name}", b"mine")
    url = f"s3://{BUCKET}/{key}"
    with pytest.raises(ConfigError, match="not empty; pass --overwrite"):
        run_pack(pack_config(url))
    with pytest.raises(ConfigError) as refused:
        run_pack(pack_config(url, overwrite=True))
    assert str(refused.value) == (
        f"--overwrite / overwrite=True: {url} holds files packtool pack did not write "
        "(shard-000000-00000.parquet, sources.json); choose an empty folder or remove them "
        "yourself"
    )
    assert [o for o in _objects(fs, key) if not o.startswith(".packtool")] == sorted(USERS)


def test_a_commit_deletes_an_unversioned_dataset_s_objects_never_a_prefix_of_their_names(
    fs, s3_client
):
    # The commit's clean-up deleted an unversioned dataset's files by name, whole trees: a
    # prefix `shard-x.parquet/` went with everything under it.
    from packtool.storage.local import as_path

    key = f"cleanup-{s3_client}"
    url = f"s3://{BUCKET}/{key}"
    run_pack(pack_config(url))
    version = _link(fs, key)
    for name in (*USERS, "shard-000001-00000.parquet", "sources.json"):  # the last two: a copy's
        fs.pipe_file(f"{BUCKET}/{key}/{name}", b"x")
    output_versions.clean_after_switch(as_path(url), version)
    left = [o for o in _objects(fs, key) if not o.startswith(f"{version}/")]
    assert left == ["index.json", *sorted(USERS)]


def _tag_in_another_pid_namespace() -> str:
    """`host_tag` as a process in a pid namespace of its own sees it (`unshare`, as root), else
    a tag standing in for one."""
    import os
    import subprocess
    import sys

    from tests.packtool.storage.common import ROOT

    code = "from packtool.storage.remote_write import host_tag; print(host_tag())"
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", sys.executable, "-c", code],
            capture_output=True, text=True, timeout=60,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    except OSError:
        return "0badc0de"
    return done.stdout.strip() if done.returncode == 0 else "0badc0de"


def test_a_lock_held_in_another_pid_namespace_of_this_host_name_is_not_taken_over(fs):
    # A container of the same host name (host networking) holds the lock: its pid is its own
    # namespace's, which need not exist here. It was asked about here, found dead, and the
    # live writer's lock was taken over at once.
    import socket
    import subprocess
    import sys

    from packtool.storage.remote_write import host_tag

    theirs = _tag_in_another_pid_namespace()
    assert theirs != host_tag()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # a pid that is no process here
    url = f"s3://{BUCKET}/namespaces/.packtool-lock"
    holder = {"pid": dead.pid, "host": socket.gethostname(), "command": "packtool pack"}
    fs.pipe_file(f"{BUCKET}/namespaces/.packtool-lock", json.dumps({**holder, "tag": theirs}))
    with pytest.raises(remote_write.RemoteLockBusy):
        remote_write.take_lock(url, b"me")
    # This namespace's dead holder, and one an older packtool recorded (no tag): taken over.
    for note in ({**holder, "tag": host_tag()}, holder):
        fs.pipe_file(f"{BUCKET}/namespaces/.packtool-lock", json.dumps(note))
        remote_write.take_lock(url, b"me").release()
    # What a run's lock records: its namespace's tag.
    with output.OutputLock(output_paths(f"s3://{BUCKET}/namespaces"), "packtool pack"):
        fs.invalidate_cache()
        assert json.loads(fs.cat_file(f"{BUCKET}/namespaces/.packtool-lock"))["tag"] == host_tag()


@pytest.mark.parametrize("overwrite", [False, True], ids=["new", "overwrite"])
def test_a_run_reads_its_staging_object_once_and_lists_no_link(
    fs, s3_client, s3_server, monkeypatch, overwrite
):
    # Before its plan a run into a bucket read `.packtool-staging` five times (a HEAD each, a
    # GET too after its own put) and listed `index.json/` after each 404 of the link (twice;
    # once more for a folder input): ~10 serial requests of 10-50 ms on a real store. Under
    # the lock only this run writes that object: it is read once, and the link is one HEAD.
    url = f"s3://{BUCKET}/once-{s3_client}-{overwrite}"
    if overwrite:
        run_pack(pack_config(url))
    with requests_seen(s3_server, monkeypatch) as seen:
        run_pack(pack_config(url, overwrite=overwrite, workers=1))
    staging = [m for m, p in seen if p.split("?")[0].endswith("/.packtool-staging")]
    # collect's HEAD, the conditional create's check and put (its deletion: a DELETE, or one
    # key of a batch)
    assert staging[:3] == ["HEAD", "HEAD", "PUT"] and staging[3:] in ([], ["DELETE"]), staging
    listed = [p for _, p in seen if "index.json%2F" in p or "index.json/" in p]
    assert listed == []
    link = f"/once-{s3_client}-{overwrite}/index.json"
    links = [m for m, p in seen if p.split("?")[0].endswith(link)]
    # recover's and the staging object's reads of the link (where it is there, a GET each; s3fs
    # asks a HEAD before a GET), the commit's put
    assert links.count("GET") == (2 if overwrite else 0) and links[-1:] == ["PUT"], links
    assert links == ["HEAD", "HEAD", "PUT"] or overwrite, links


def test_a_writer_that_lost_its_lock_never_deletes_the_new_holder_s_staging_object(
    fs, local_pack, monkeypatch
):
    # Found by a reviewer of b2a1ceb: A (--overwrite of an interrupted run's leftover) knew
    # `.packtool-staging` from when it took the lock; it stalled (here: while it stopped the
    # leftover's jobs), B took the lock over and named its run; A woke, deleted the leftover and
    # then B's record, which it took for the leftover's (a killed B then lost its version).
    from packtool.engines.slurm import state

    url = f"s3://{BUCKET}/stale-known"
    prefix = url.removeprefix("s3://")
    _staged_run(fs, url, dict(local_pack))  # the interrupted run's leftover
    b_record = json.dumps({"version": "v-20991231T000000-0b0b0b0b", "replaces": None}).encode()

    def taken_over(staging, out):  # B takes the lock over and names its run meanwhile
        fs.pipe_file(f"{prefix}/.packtool-lock", b'{"pid": 1, "host": "b"}')
        fs.pipe_file(f"{prefix}/.packtool-staging", b_record)

    monkeypatch.setattr(state, "stop_jobs", taken_over)
    with pytest.raises(ConfigError, match="another writer took over"):
        run_pack(pack_config(url, overwrite=True))
    fs.invalidate_cache()
    assert fs.cat_file(f"{prefix}/.packtool-staging") == b_record
