"""`hf://` outputs: built on this machine, published to the Hub in one commit.

No Hub can run here (no internet, and no open-source server speaks its commit API), so this is
the one place the project stands in for a client library: `huggingface_hub`'s `HfApi` (its
`repo_info` and `create_commit`) and its file system (an fsspec memory file system under the
`hf` protocol) are replaced by `StandInHub`, which keeps a repository's files and its head,
applies a commit's operations together and refuses one whose `parent_commit` is not the head,
as the Hub does. What is checked is packtool's side: one commit per run, what it holds, the
parent it names, and what a refused commit leaves.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from packtool.engines.local import run_pack
from packtool.errors import ConfigError
from packtool.storage import hub, remote
from tests.cli import one_error_line, run
from tests.packtool.storage.common import CORPUS, pack_config

pytest.importorskip("huggingface_hub")

URL = "hf://datasets/org/name/packed"


class HubFiles(MemoryFileSystem):
    """The stand-in Hub's files, read as `HfFileSystem` reads them (`hf://TYPE/ORG/NAME/PATH`)."""

    protocol = ("hf",)
    store: dict = {}  # noqa: RUF012 - fsspec's memory file system keeps its files per class
    pseudo_dirs = [""]  # noqa: RUF012

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        if path.startswith("hf://"):
            path = path[len("hf://") :]
        return super()._strip_protocol(path)


class Refused(Exception):
    """What `huggingface_hub` raises for a commit whose parent is not the head (HTTP 412)."""

    def __init__(self) -> None:
        super().__init__("412 Client Error: Precondition Failed")
        self.response = SimpleNamespace(status_code=412)


class StandInHub:
    """`HfApi` for one machine: `repo_info` gives the head, `create_commit` applies its
    operations at once, on top of `parent_commit` only."""

    def __init__(self) -> None:
        self.head = 1
        self.commits: list[list] = []
        self.meddle = False  # another writer commits just before the next commit

    def repo_info(self, repo_id, repo_type=None, revision=None):
        return SimpleNamespace(sha=str(self.head))

    def create_commit(self, repo_id, operations, *, commit_message, repo_type, revision,
                      parent_commit=None):  # fmt: skip
        if self.meddle:
            self.meddle = False
            self.head += 1
        if parent_commit is not None and parent_commit != str(self.head):
            raise Refused()
        fs = HubFiles()
        root = f"/{repo_type}s/{repo_id}"
        for op in operations:
            path = f"{root}/{op.path_in_repo}"
            if type(op).__name__ == "CommitOperationDelete":
                fs.rm(path.rstrip("/"), recursive=True)
            else:
                data = op.path_or_fileobj
                fs.pipe_file(path, data if isinstance(data, bytes) else Path(data).read_bytes())
        self.commits.append(list(operations))
        self.head += 1
        return SimpleNamespace(oid=str(self.head))


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    # Undone after the test: the other tests' hf:// URLs reach huggingface_hub's own again.
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "hf", HubFiles)
    HubFiles.store.clear()
    HubFiles.pseudo_dirs[:] = [""]
    remote._filesystem.cache_clear()
    monkeypatch.setenv("PACKTOOL_SCRATCH", str(tmp_path / "scratch"))
    fake = StandInHub()
    monkeypatch.setattr(hub, "api", lambda: fake)
    HubFiles().pipe_file("/datasets/org/name/README.md", b"a dataset card\n")  # the repo exists
    _upath_forgets()
    yield fake
    remote._filesystem.cache_clear()
    HubFiles.store.clear()
    _upath_forgets()


def _upath_forgets() -> None:
    """upath keeps each protocol's file system class for naming paths: with HubFiles' it wrote
    `hf:///datasets/...`, which the real HfFileSystem then read as the model `datasets/ORG` in
    the later tests of the process (tests/packtool/storage/test_hub_inputs.py)."""
    from upath._flavour import WrappedFileSystemFlavour

    WrappedFileSystemFlavour.from_protocol.cache_clear()


def _hub_files(prefix: str) -> dict[str, bytes]:
    fs = HubFiles()
    return {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}


def _version(files: dict[str, bytes]) -> str:
    return json.loads(files["index.json"])["packtool_dataset"]


MEGATRON_COMMIT = ["packed-mega.bin", ".packed-mega.idx.packtool.json", "packed-mega.idx"]
"""A Megatron pair's one commit: the pair and its run's record (engines/megatron/record.py)."""


def _hub_holds_a_local_megatron_pair(tmp_path: Path) -> None:
    """The Hub's `packed-mega.bin`/`.idx` are the bytes of the same run into a local prefix."""
    code, _, err = run("tokenize", CORPUS, "-o", tmp_path / "mega", "--to", "megatron")
    assert code == 0, err
    for suffix in (".bin", ".idx"):
        got = HubFiles().cat_file(f"/datasets/org/name/packed-mega{suffix}")
        assert got == (tmp_path / f"mega{suffix}").read_bytes()


def _a_plain_rerun_refuses(stand_in: StandInHub, *args) -> None:
    """`run(*args)` with a build waiting for its commit: one line naming --resume and
    --overwrite, and no commit."""
    code, _, err = run(*args)
    line = one_error_line(err)
    assert code != 0 and "waits in" in line and "--resume" in line and "--overwrite" in line
    assert not stand_in.commits


def run_while_down(
    stand_in: StandInHub, monkeypatch, *args, error: str = "503 Service Unavailable"
):
    """`run(*args)` while every commit fails with `ConnectionError(error)` (nothing applied)."""

    def down(*_args, **_kwargs):
        raise ConnectionError(error)

    with monkeypatch.context() as m:
        m.setattr(stand_in, "create_commit", down)
        return run(*args)


def _hub_holds_a_local_pack(tmp_path: Path, max_len: str) -> None:
    """The version the Hub's link names holds the shards of the same pack into a local folder."""
    code, _, err = run("pack", CORPUS, "-o", tmp_path / "local", "--max-len", max_len)
    assert code == 0, err
    files = _hub_files("/datasets/org/name/packed")
    version = _version(files)
    shards = list((tmp_path / "local").glob("shard-*.parquet"))
    assert shards
    for shard in shards:
        assert files[f"{version}/{shard.name}"] == shard.read_bytes()


def test_a_pack_to_the_hub_is_one_commit_of_the_local_packs_files(stand_in, tmp_path):
    run_pack(pack_config(tmp_path / "local"))
    run_pack(pack_config(URL))
    assert len(stand_in.commits) == 1  # shards, manifest and link together; no lock objects
    files = _hub_files("/datasets/org/name/packed")
    version = _version(files)
    local = {p.name: p.read_bytes() for p in (tmp_path / "local").iterdir()}
    assert {k.split("/", 1)[1]: v for k, v in files.items() if "/" in k} == local
    assert set(files) == {"index.json", *(f"{version}/{n}" for n in local)}
    assert not any((tmp_path / "scratch" / "hub").rglob("*.parquet"))  # staging removed


def test_overwrite_replaces_the_old_version_in_the_same_commit(stand_in, tmp_path):
    run_pack(pack_config(URL))
    first = _version(_hub_files("/datasets/org/name/packed"))
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--overwrite")
    assert code == 0, err
    files = _hub_files("/datasets/org/name/packed")
    second = _version(files)
    assert second != first and not any(k.startswith(first) for k in files)
    deletes = [op for op in stand_in.commits[-1] if type(op).__name__ == "CommitOperationDelete"]
    assert [op.path_in_repo for op in deletes] == [f"packed/{first}/"]
    assert HubFiles().cat_file("/datasets/org/name/README.md") == b"a dataset card\n"
    code, out, err = run("verify", URL)
    assert code == 0, err


def test_without_overwrite_a_dataset_on_the_hub_is_refused(stand_in):
    run_pack(pack_config(URL))
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert "not empty; pass --overwrite" in one_error_line(err) and code != 0
    assert len(stand_in.commits) == 1


def test_a_commit_refused_for_another_writers_is_one_line_and_resume_commits_it(stand_in, tmp_path):
    """Someone commits to the repository while the run builds: the Hub refuses the run's
    commit (its parent is no longer the head). Nothing is committed, the built dataset stays
    in the scratch folder, and `--resume` commits it on top of the new head."""
    stand_in.meddle = True
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    line = one_error_line(err)
    assert code != 0 and "the repository changed since this run started" in line
    assert "--resume" in line and not stand_in.commits
    assert not _hub_files("/datasets/org/name/packed")
    code, out, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code == 0, err
    assert len(stand_in.commits) == 1
    # It said "hf:///datasets/... is already complete: nothing to resume, nothing done".
    assert out.strip() == (
        f"{URL}: committed the dataset the interrupted run had built (its index.json was "
        "written before the switch): nothing else to resume"
    )
    _hub_holds_a_local_pack(tmp_path, "512")
    code, out, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code == 0, err  # named as written, not `hf:///datasets/...`
    assert (
        out.strip()
        == f"{URL} is already complete (index.json exists): nothing to resume, nothing done"
    )


def test_engines_on_other_machines_refuse_a_hub_output():
    from packtool.engines.ray import run_pack_ray
    from packtool.engines.slurm.driver import run_pack_slurm

    for engine, call in (("ray", run_pack_ray), ("slurm", run_pack_slurm)):
        with pytest.raises(ConfigError, match=f"the {engine} engine builds on other machines"):
            call(pack_config(URL))


def test_parse_names_the_repository_its_type_revision_and_path():
    got = hub.parse("hf://datasets/org/name@refs%2Fpr%2F1/a/b")
    assert got == hub.HubPath("org/name", "dataset", "refs/pr/1", "a/b")
    assert hub.parse("hf://org/model") == hub.HubPath("org/model", "model", None, "")
    with pytest.raises(ConfigError, match="names no repository|must be 'namespace/name'"):
        hub.parse("hf://datasets/org")
    # As HfFileSystem reads them (huggingface_hub's own grammar): a revision with slashes, and
    # a storage bucket, which is no repository to commit to.
    got = hub.parse("hf://datasets/org/name@refs/pr/1/packed")
    assert got == hub.HubPath("org/name", "dataset", "refs/pr/1", "packed")
    with pytest.raises(ConfigError, match="a bucket is not a repository"):
        hub.parse("hf://buckets/org/b/x")


def test_tokenize_to_the_hub_is_one_commit_per_output_and_writes_no_lock_object(stand_in, tmp_path):
    """A folder of parts is one commit (link and version), as `pack`'s; one object is one
    commit; a Megatron pair is one commit holding both files (no reader sees a .bin without its
    .idx); none leaves a lock object on the Hub (each would be a commit, its renewals more)."""
    code, _, err = run("tokenize", CORPUS, "-o", f"{URL}-parts")
    assert code == 0, err
    code, _, err = run("tokenize", CORPUS, "-o", tmp_path / "parts")
    assert code == 0, err
    files = _hub_files("/datasets/org/name/packed-parts")
    version = _version(files)
    assert len(stand_in.commits) == 1
    for part in (tmp_path / "parts").glob("part-*.parquet"):
        assert files[f"{version}/{part.name}"] == part.read_bytes()
    code, _, err = run("tokenize", CORPUS, "-o", f"{URL}-one.parquet")
    assert code == 0, err
    assert [op.path_in_repo for op in stand_in.commits[1]] == ["packed-one.parquet"]
    code, _, err = run("tokenize", CORPUS, "-o", f"{URL}-mega", "--to", "megatron")
    assert code == 0, err
    assert [op.path_in_repo for op in stand_in.commits[2]] == MEGATRON_COMMIT
    _hub_holds_a_local_megatron_pair(tmp_path)
    names = sorted(HubFiles().find("/datasets/org/name"))
    left = [n for n in names if "lock" in n or ".packtool" in n]
    assert left == [f"/datasets/org/name/{MEGATRON_COMMIT[1]}"], names  # only the run's record
    assert len(stand_in.commits) == 3


def test_a_commit_that_fails_otherwise_is_one_line_and_keeps_the_dataset_for_resume(
    stand_in, monkeypatch
):
    code, _, err = run_while_down(
        stand_in, monkeypatch, "pack", CORPUS, "-o", URL, "--max-len", "512",
        error="Server disconnected\nsecond line",
    )  # fmt: skip
    line = one_error_line(err)
    assert code != 0 and line.startswith(f"error: {URL}") and "Server disconnected" in line
    assert (
        "rerun with --resume / resume=True, which commits it unless" in line
        and not stand_in.commits
    )
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code == 0, err
    assert len(stand_in.commits) == 1


def test_a_megatron_pair_whose_commit_fails_is_kept_and_committed_by_resume(
    stand_in, monkeypatch, tmp_path
):
    """The finished pair of a failed commit stays in the staging folder (never discarded with
    the run's other errors): a plain rerun refuses in one line, --resume commits it as it was
    built, --overwrite discards it."""
    out = f"{URL}-mega"

    code, _, err = run_while_down(
        stand_in, monkeypatch, "tokenize", CORPUS, "-o", out, "--to", "megatron"
    )
    line = one_error_line(err)
    assert code != 0 and line.startswith(f"error: {out}: cannot be committed to the Hub"), line
    assert "503" in line and not stand_in.commits
    waiting = list((tmp_path / "scratch").rglob("ready.idx"))
    assert len(waiting) == 1  # the finished pair is kept
    _a_plain_rerun_refuses(stand_in, "tokenize", CORPUS, "-o", out, "--to", "megatron")
    code, _, err = run("tokenize", CORPUS, "-o", out, "--to", "megatron", "--resume")
    assert code == 0, err
    assert [op.path_in_repo for op in stand_in.commits[0]] == MEGATRON_COMMIT
    _hub_holds_a_local_megatron_pair(tmp_path)
    assert not list((tmp_path / "scratch").rglob("ready.idx"))
    # --overwrite discards a waiting pair and builds its own
    args = ("tokenize", CORPUS, "-o", out, "--to", "megatron", "--overwrite")
    code, _, _ = run_while_down(stand_in, monkeypatch, *args)
    assert code != 0 and len(list((tmp_path / "scratch").rglob("ready.idx"))) == 1
    code, _, err = run(*args)
    assert code == 0, err
    assert len(stand_in.commits) == 2 and len(list((tmp_path / "scratch").rglob("ready.idx"))) == 0


def test_a_commit_that_landed_though_its_answer_was_lost_is_found_by_the_next_run(
    stand_in, monkeypatch, tmp_path
):
    """The Hub applied the commit, then the answer was lost (a timeout): the run fails, but the
    version it was committing is recorded first, so the next run sees the link names it:
    --resume says there is nothing left to do (exit 0, no second version), a plain rerun finds
    a dataset there, and the dataset-sized build is gone from the scratch folder."""
    real = stand_in.create_commit

    def lost(*args, **kwargs):
        real(*args, **kwargs)
        raise TimeoutError("Read timed out")

    with monkeypatch.context() as m:
        m.setattr(stand_in, "create_commit", lost)
        code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0 and "Read timed out" in one_error_line(err)
    assert len(stand_in.commits) == 1
    code, out, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code == 0, err
    assert "reached the Hub after all" in out and len(stand_in.commits) == 1
    assert not list((tmp_path / "scratch" / "hub").rglob("*.parquet"))
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0 and "not empty; pass --overwrite" in one_error_line(err)
    _hub_holds_a_local_pack(tmp_path, "512")


def test_tokenize_never_discards_a_pack_build_waiting_for_resume(stand_in, monkeypatch):
    """pack and tokenize share this machine's staging folder for a URL: tokenize refuses to
    discard pack's build unasked, and with --overwrite it also drops pack's record of what it
    replaced (a stale one refused tokenize's commits for good)."""
    stand_in.meddle = True  # pack's commit is refused: its build waits for --resume
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0
    code, _, err = run("tokenize", CORPUS, "-o", URL)
    line = one_error_line(err)
    assert code != 0 and "`packtool pack` built waits in" in line and "--overwrite" in line
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code == 0, err  # the build was kept
    assert len(stand_in.commits) == 1
    stand_in.meddle = True
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "1024", "--overwrite")
    assert code != 0
    code, _, err = run("tokenize", CORPUS, "-o", URL, "--overwrite")
    assert code == 0, err
    assert len(stand_in.commits) == 2  # pack --resume's, then tokenize's (meddle records none)


def test_the_commit_is_on_the_head_read_when_the_run_began(stand_in, monkeypatch):
    """Another writer commits while this run builds (after it read the head, under its lock):
    the commit names the head the run began on, so the Hub refuses it. (Reading the head again
    just before committing would pass this commit over the other writer's.)"""
    from packtool.engines import output_folder

    real = output_folder.make_staging

    def then_another_writer_commits(paths):
        real(paths)
        stand_in.head += 1

    monkeypatch.setattr(output_folder, "make_staging", then_another_writer_commits)
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    line = one_error_line(err)
    assert code != 0 and "the repository changed since this run started" in line, line
    assert not stand_in.commits


def test_after_a_refused_commit_a_rerun_asks_and_overwrite_starts_over(stand_in, tmp_path):
    """The built dataset of a refused commit is published only by --resume: a plain rerun says
    so in one line, and --overwrite discards it and commits its own build (on the head it read,
    not the one before the discarded build)."""
    stand_in.meddle = True
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0 and "--overwrite / overwrite=True to start over" in one_error_line(err)
    _a_plain_rerun_refuses(stand_in, "pack", CORPUS, "-o", URL, "--max-len", "1024")
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "1024", "--overwrite")
    assert code == 0, err
    assert len(stand_in.commits) == 1
    _hub_holds_a_local_pack(tmp_path, "1024")
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--overwrite")
    assert code == 0, err  # and a later --overwrite replaces it in its own commit
    assert len(stand_in.commits) == 2


def test_a_refused_tokenize_commit_says_to_rerun(stand_in, tmp_path, monkeypatch):
    """tokenize has no --resume: its message says to run it again, which builds anew."""
    stand_in.meddle = True
    code, _, err = run("tokenize", CORPUS, "-o", f"{URL}-parts")
    line = one_error_line(err)
    assert code != 0 and "rerun to build and commit it again" in line and "--resume" not in line
    assert not list((tmp_path / "scratch").rglob("*.parquet"))  # a rerun builds it anew
    code, _, err = run("tokenize", CORPUS, "-o", f"{URL}-parts")
    assert code == 0, err
    assert len(stand_in.commits) == 1

    # One object: its local copy is not left behind either.
    code, _, err = run_while_down(
        stand_in, monkeypatch, "tokenize", CORPUS, "-o", f"{URL}-one.parquet"
    )
    assert code != 0 and "cannot be committed to the Hub (503" in one_error_line(err)
    assert [p for p in (tmp_path / "scratch").rglob("*") if p.is_file() and p.name != "lock"] == []


def test_resume_never_replaces_a_dataset_another_writer_committed_meanwhile(stand_in):
    """The run's commit is refused because another writer committed a dataset to the same
    prefix; `--resume` would publish over it: refused in one line, the other dataset kept;
    `--overwrite` replaces it on purpose."""
    stand_in.meddle = True
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0, err
    other = b'{"packtool_dataset": "v-20261204T000000-0123abcd"}\n'
    HubFiles().pipe_file("/datasets/org/name/packed/index.json", other)
    # (a dataset's names: --overwrite never deletes a version holding files packtool did not
    # write, docs/remote.md)
    HubFiles().pipe_file(
        "/datasets/org/name/packed/v-20261204T000000-0123abcd/shard-000000-00000.parquet",
        b"theirs",
    )
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    line = one_error_line(err)
    assert code != 0 and "another writer committed a dataset there" in line
    assert "--overwrite" in line and not stand_in.commits
    assert HubFiles().cat_file("/datasets/org/name/packed/index.json") == other
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--overwrite")
    assert code == 0, err
    files = _hub_files("/datasets/org/name/packed")
    assert len(stand_in.commits) == 1 and _version(files) != "v-20261204T000000-0123abcd"
    assert not any(k.startswith("v-20261204T000000-0123abcd") for k in files)  # replaced


def test_overwrite_of_a_link_to_a_missing_version_commits(stand_in):
    """A link naming a version that is not there (deleted by hand): the commit deletes
    nothing (the Hub refuses a commit that deletes a missing folder) and writes the new one."""
    HubFiles().pipe_file(
        "/datasets/org/name/packed/index.json",
        b'{"packtool_dataset": "v-20261204T000000-00000000"}',
    )
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--overwrite")
    assert code == 0, err
    assert not [o for o in stand_in.commits[0] if type(o).__name__ == "CommitOperationDelete"]


def test_a_missing_repository_is_one_line_naming_the_url(stand_in, monkeypatch):
    def missing(*args, **kwargs):
        raise OSError("404 Client Error: Repository Not Found for url: https://huggingface.co/...")

    monkeypatch.setattr(stand_in, "repo_info", missing)
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    line = one_error_line(err)
    assert code != 0 and URL in line and "Repository Not Found" in line
    assert not stand_in.commits


def test_a_repository_root_is_refused_up_front(stand_in):
    """The root holds the card and .gitattributes: it could never be committed to (the run
    failed at the end, 'not empty', then '--overwrite: holds files packtool did not write')."""
    for command in ("pack", "tokenize"):
        code, _, err = run(command, CORPUS, "-o", "hf://datasets/org/name", "--overwrite")
        line = one_error_line(err)
        assert code != 0 and "name a folder inside the repository" in line, line
    assert not stand_in.commits


def test_a_damaged_record_of_what_a_run_replaces_is_one_line_not_skipped(stand_in, tmp_path):
    """Read as absent, it would let --resume commit over another writer's dataset unchecked."""
    stand_in.meddle = True
    code, _, _ = run("pack", CORPUS, "-o", URL, "--max-len", "512")
    assert code != 0
    (record,) = (tmp_path / "scratch").rglob("replaces.json")
    record.write_text("{not json")
    code, _, err = run("pack", CORPUS, "-o", URL, "--max-len", "512", "--resume")
    assert code != 0 and "replaces.json: damaged" in one_error_line(err)
    assert not stand_in.commits


def test_a_hub_input_s_state_names_its_version_not_only_its_size():
    # `HfFileSystem.info` fills no key `modified_at` / `object_etag` read: a Hub input was
    # compared by size alone, so a same-size new revision went unseen mid-run and on --resume.
    # Its git blob id (an LFS file's pointer's, holding its sha256) names the version.
    from datetime import datetime, timezone

    from huggingface_hub import hf_file_system
    from huggingface_hub.hf_api import LastCommitInfo, RepoFile

    from packtool.storage import remote

    def info(oid: str, **more) -> dict:
        return hf_file_system._cache_info_from_path_info(
            RepoFile(path="c.jsonl", size=10, oid=oid, **more), "datasets/o/n/c.jsonl"
        )

    one, other = info("a" * 40), info("b" * 40)
    assert remote._mtime_ns(one) != remote._mtime_ns(other)
    assert remote._mtime_ns(one) == remote._mtime_ns(info("a" * 40))
    date = datetime(2026, 12, 1, tzinfo=timezone.utc)
    when = "2026-12-01T00:00:00.000Z"  # as the Hub writes it
    expanded = info("a" * 40, lastCommit={"id": "c" * 40, "title": "t", "date": when})
    assert isinstance(expanded["last_commit"], LastCommitInfo)
    assert remote.modified_at(expanded) == date.timestamp()
