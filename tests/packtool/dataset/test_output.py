"""packtool/dataset/output.py: the lock, the swap and its recovery, and outputs kept apart from inputs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from packtool.audit.verify import verify_dataset
from packtool.dataset import output
from packtool.dataset.manifest import read_manifest
from packtool.dataset.output import OutputLock, output_paths, recover
from packtool.dataset.output_apart import check_apart
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import AlreadyComplete, ConfigError
from packtool.pack.chunk import PackConfig
from packtool.storage import writing

ROOT = Path(__file__).resolve().parents[3]


def corpus(path: Path, word: str, n: int = 40) -> Path:
    path.write_text("".join(json.dumps({"text": f"{word} {i} " * 5}) + "\n" for i in range(n)))
    return path


def pack(inputs: Path, out: Path, **kw) -> None:
    run_pack(
        RunConfig(
            inputs=(str(inputs),),
            out_dir=str(out),
            pack=PackConfig(max_len=64),
            progress=False,
            **kw,
        )
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_paths_sit_hidden_beside_the_output(tmp_path):
    paths = output_paths(tmp_path / "D")
    assert paths.target == (tmp_path / "D").resolve()
    names = [p.name for p in (paths.staging, paths.ready, paths.old, paths.lock)]
    assert names == [f".D.packtool-{s}" for s in ("staging", "ready", "old", "lock")]
    assert all(p.parent == paths.target.parent for p in (paths.staging, paths.lock))


def test_a_symlinked_output_is_replaced_where_it_points(tmp_path):
    real = tmp_path / "disk" / "D"
    real.parent.mkdir()
    (tmp_path / "link").symlink_to(real)
    pack(corpus(tmp_path / "a.jsonl", "a"), tmp_path / "link")
    pack(corpus(tmp_path / "b.jsonl", "b"), tmp_path / "link", overwrite=True)
    assert (tmp_path / "link").is_symlink() and verify_dataset(real).rows > 0
    assert read_manifest(tmp_path / "link").shards == read_manifest(real).shards


@pytest.mark.parametrize("killed_before", [1, 2, 3, 4])
def test_a_run_killed_between_the_renames_is_completed_by_the_next_run(
    tmp_path, monkeypatch, killed_before
):
    """commit: staging -> ready, D -> old, ready -> D, delete old. Stop before step k, as kill -9
    would (nothing is undone in the process); the next writer's `recover` finishes the swap."""
    out = tmp_path / "D"
    pack(corpus(tmp_path / "a.jsonl", "a"), out)
    old = snapshot(out)
    pack(corpus(tmp_path / "b.jsonl", "b"), tmp_path / "B")
    new = snapshot(tmp_path / "B")
    real_rename, real_remove, calls = output._rename, output.remove, []

    class Killed(BaseException):
        pass

    def step(*args):
        calls.append(args)
        if len(calls) == killed_before:
            raise Killed
        return real_rename(*args)

    def remove(path):
        if path == output_paths(out).old and killed_before == 4:
            raise Killed
        real_remove(path)

    monkeypatch.setattr(output, "_rename", step)
    monkeypatch.setattr(output, "remove", remove)
    with pytest.raises(Killed):
        pack(corpus(tmp_path / "b.jsonl", "b"), out, overwrite=True)
    monkeypatch.undo()
    # Whatever the step, the output is one whole dataset or absent, never a mixture...
    assert not out.exists() or snapshot(out) in (old, new)
    if killed_before == 1:
        # Not switched yet (no ready folder): a refused run leaves it be; --resume switches it.
        with pytest.raises(ConfigError, match="pass --resume / resume=True to switch it in"):
            pack(corpus(tmp_path / "c.jsonl", "c"), out)
        assert snapshot(out) == old
        with pytest.raises(AlreadyComplete):
            pack(corpus(tmp_path / "b.jsonl", "b"), out, resume=True)
    # ... and the next writer (here a command that then fails) completes the replacement.
    with pytest.raises(ConfigError, match="not empty"):
        pack(corpus(tmp_path / "c.jsonl", "c"), out)
    assert snapshot(out) == new
    assert sorted(p.name for p in tmp_path.glob(".D.packtool-*")) == []


@pytest.mark.parametrize("resume", [False, True])
def test_files_made_at_the_output_during_a_run_are_never_swapped_away(
    tmp_path, monkeypatch, resume
):
    """The start's checks refuse an output holding files packtool did not write, but a file
    made there while the run ran (or before a --resume, which checks no such thing) was
    deleted by the swap. The swap refuses now, keeping the new dataset for --resume."""
    out = tmp_path / "D"
    src = corpus(tmp_path / "a.jsonl", "a")
    real = output.commit

    def late(paths, *args, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "notes.txt").write_text("mine")
        return real(paths, *args, **kwargs)

    class Killed(BaseException):
        pass

    def killed(paths, *args, **kwargs):
        raise Killed  # kill -9 after index.json, before the swap

    monkeypatch.setattr(output, "commit", killed if resume else late)
    with pytest.raises(Killed if resume else ConfigError) as info:
        pack(src, out)
    monkeypatch.undo()
    if resume:  # the user's file, made before the --resume that switches the dataset in
        out.mkdir()
        (out / "notes.txt").write_text("mine")
        with pytest.raises(ConfigError) as info:
            pack(src, out, resume=True)
    assert "holds files packtool did not write" in str(info.value)
    assert (out / "notes.txt").read_text() == "mine" and sorted(os.listdir(out)) == ["notes.txt"]
    (out / "notes.txt").unlink()
    with pytest.raises(AlreadyComplete):  # moved: --resume switches the dataset in
        pack(src, out, resume=True)
    assert verify_dataset(out).rows > 0


def test_a_failed_overwrite_leaves_the_old_dataset_even_beside_a_killed_runs_dataset(
    tmp_path, monkeypatch
):
    """A run killed after its index.json, before its swap, left a complete dataset; the next
    --overwrite switched it in first, then failed (a misspelt --group-by) saying "nothing was
    committed", with the old dataset gone. It discards the killed run's now."""
    out = tmp_path / "D"
    pack(corpus(tmp_path / "a.jsonl", "a"), out)
    old = snapshot(out)

    class Killed(BaseException):
        pass

    def killed(paths, *args, **kwargs):
        raise Killed

    monkeypatch.setattr(output, "commit", killed)
    with pytest.raises(Killed):
        pack(corpus(tmp_path / "b.jsonl", "b"), out, overwrite=True)
    monkeypatch.undo()
    misspelt = PackConfig(max_len=64, group_by="nosuchfield")
    config = RunConfig(
        inputs=(str(corpus(tmp_path / "c.jsonl", "c")),), out_dir=str(out), pack=misspelt,
        overwrite=True, progress=False,
    )  # fmt: skip
    with pytest.raises(Exception, match="nosuchfield"):
        run_pack(config)
    assert snapshot(out) == old
    pack(corpus(tmp_path / "c.jsonl", "c"), out, overwrite=True)  # and one that succeeds
    assert snapshot(out) != old and verify_dataset(out).rows > 0


def test_recover_puts_an_old_dataset_back_when_no_new_one_is_ready(tmp_path):
    paths = output_paths(tmp_path / "D")
    paths.old.mkdir()
    (paths.old / "index.json").write_text("{}")
    recover(paths)
    assert (tmp_path / "D" / "index.json").read_text() == "{}" and not paths.old.exists()


@pytest.mark.parametrize("stray", ["ready", "old"])
def test_a_stray_ready_or_old_folder_never_replaces_or_deletes_a_users_folder(tmp_path, stray):
    """A `.D.packtool-ready` (or `-old`) folder that packtool did not write made the next run
    move the user's D aside and delete it (and its files), with no --overwrite."""
    user = tmp_path / "D"
    user.mkdir()
    (user / "thesis.txt").write_text("precious")
    paths = output_paths(user)
    side = paths.ready if stray == "ready" else paths.old
    side.mkdir()
    if stray == "old":
        (side / "notes.txt").write_text("also precious")
    with pytest.raises(
        ConfigError, match="packtool did not write|not a (dataset|complete output) packtool wrote"
    ):
        pack(corpus(tmp_path / "c.jsonl", "c"), user)
    assert (user / "thesis.txt").read_text() == "precious"
    if stray == "old":
        assert (side / "notes.txt").read_text() == "also precious"


@pytest.mark.parametrize("inside", ["nothing", "a damaged index.json"])
def test_a_ready_folder_that_holds_no_whole_output_never_replaces_a_dataset(tmp_path, inside):
    """An empty stray `.D.packtool-ready` (packtool's files only: none at all) still made `pack`
    replace the dataset D without --overwrite (the pack audit): a ready folder is renamed from a
    complete staging only, so it must hold a dataset that may be switched in, or parts."""
    out = tmp_path / "D"
    pack(corpus(tmp_path / "a.jsonl", "a"), out)
    old = snapshot(out)
    paths = output_paths(out)
    paths.ready.mkdir()
    if inside != "nothing":
        (paths.ready / "index.json").write_text('{"not": "a manifest"}')
    with pytest.raises(ConfigError, match="is not a complete output packtool wrote"):
        pack(corpus(tmp_path / "b.jsonl", "b"), out)
    assert snapshot(out) == old and paths.ready.exists()


def test_overwrite_never_deletes_a_staging_folder_holding_a_users_files(tmp_path):
    """`--overwrite` deleted a `.D.packtool-staging` folder holding notes.txt without a word."""
    out = tmp_path / "D"
    paths = output_paths(out)
    paths.staging.mkdir()
    (paths.staging / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not a dataset packtool wrote"):
        pack(corpus(tmp_path / "a.jsonl", "a"), out, overwrite=True)
    assert (paths.staging / "notes.txt").read_text() == "mine"


def test_a_symlink_at_the_locks_name_is_refused_never_written_through(tmp_path):
    """The lock was opened following symlinks and its holder's note written into it: a link
    planted at `.D.packtool-lock` overwrote whatever file it pointed to."""
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    paths = output_paths(tmp_path / "D")
    paths.lock.symlink_to(victim)
    with pytest.raises(ConfigError, match="is a symbolic link, not a lock file"):
        pack(corpus(tmp_path / "c.jsonl", "c"), tmp_path / "D")
    assert victim.read_text() == "mine"


def test_the_lock_refuses_a_second_writer_and_names_the_first(tmp_path):
    paths = output_paths(tmp_path / "D")
    with OutputLock(paths, "packtool pack x -o D"):
        info = json.loads(paths.lock.read_text())
        assert info["pid"] == os.getpid() and info["command"] == "packtool pack x -o D"
        with pytest.raises(ConfigError) as refused, OutputLock(paths):
            pass
        message = str(refused.value)
        assert message.startswith(f"{tmp_path / 'D'} is being written by another packtool (pid ")
        assert message.endswith(": packtool pack x -o D); wait for it to finish or stop it")
        with pytest.raises(ConfigError, match="being written by another packtool"):
            pack(corpus(tmp_path / "a.jsonl", "a"), tmp_path / "D")
    assert not paths.lock.exists()  # let go: the lock file goes with it
    pack(corpus(tmp_path / "a.jsonl", "a"), tmp_path / "D")


def test_a_lock_left_by_a_killed_process_is_stale(tmp_path):
    paths = output_paths(tmp_path / "D")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from packtool.dataset.output import OutputLock, output_paths\n"
            f"with OutputLock(output_paths({str(tmp_path / 'D')!r}), 'holder'):\n"
            "    print('held', flush=True); time.sleep(600)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(ConfigError, match=f"pid {holder.pid} on .*: holder"):
        OutputLock(paths).__enter__()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert paths.lock.exists()  # left behind, but no process holds it any more
    with OutputLock(paths):
        assert json.loads(paths.lock.read_text())["pid"] == os.getpid()


def test_the_lock_survives_a_holder_that_unlinks_as_it_lets_go(tmp_path, monkeypatch):
    """A waiter that opened the lock file just before its holder unlinked it must not keep a
    lock on the dead file: it sees the inode changed and starts again."""
    paths = output_paths(tmp_path / "D")
    real_flock, calls = writing.fcntl.flock, []

    def flock(fd, op):
        calls.append(fd)
        if len(calls) == 1:  # between our open and our flock, the holder unlinks and another
            paths.lock.unlink()  # process makes a new lock file
            paths.lock.write_text("")
        return real_flock(fd, op)

    monkeypatch.setattr(writing.fcntl, "flock", flock)
    with OutputLock(paths):
        assert len(calls) == 2  # it started again on the file now at the path...
        with pytest.raises(ConfigError, match="being written by another packtool"):
            OutputLock(paths).__enter__()  # ... so the lock it holds is the one others see


@pytest.mark.parametrize(
    ("out", "inputs", "message"),
    [
        ("src/packed", ["src"], "inside the input folder src"),
        ("src", ["src/a.jsonl"], "input src/a.jsonl is inside the output src"),
        ("src", ["src"], "is also an input"),
        ("src/../src/sub/p", ["./src"], "inside the input folder ./src"),
        ("data/p", ["data/**/*.parquet"], "inside the folder the input glob"),
        ("data/p", ["data/**"], "inside the folder the input glob"),
    ],
)
def test_outputs_and_inputs_are_kept_apart(tmp_path, monkeypatch, out, inputs, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src").mkdir()
    with pytest.raises(ConfigError, match=message):
        check_apart(out, inputs)


@pytest.mark.parametrize("out", [".", "..", "sub/.."])
def test_the_current_folder_cannot_be_the_output(tmp_path, monkeypatch, out):
    (tmp_path / "here" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "here")
    with pytest.raises(ConfigError, match="is the current folder or holds it"):
        check_apart(out, ["x.jsonl"])


def test_unrelated_paths_pass(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    check_apart("packed", ["src", "src/a.jsonl", "data/*.jsonl", "srcx"])
    check_apart("src2/p", ["src"])
    check_apart("data/p", ["data/**/*.jsonl"])  # cannot match what packtool writes in data/p
    with pytest.raises(ConfigError, match="inside the output"):
        check_apart("data", ["x"], [tmp_path / "data" / "y.jsonl"])


@pytest.mark.parametrize(
    ("out", "inputs", "message"),
    [
        ("abfs://rev1/corpus/packed", ["az://rev1/corpus/"], "inside the input az://rev1/corpus/"),
        ("abfss://rev1/corpus/packed", ["az://rev1/corpus"], "inside the input"),
        ("az://rev1/c/p", ["abfs://rev1@devstoreaccount1.blob.core.windows.net/c"], "inside"),
        (
            "az://rev1@acct.blob.core.windows.net/c/p",
            ["az://rev1/c/p/x.jsonl"],
            "inside the output",
        ),
        ("s3a://b/data/p", ["s3://b/data/*.jsonl"], "inside the input"),
        ("s3://b/d", ["s3a://b/d/"], "is also an input"),
        ("gcs://b/d/p", ["gs://b/d"], "inside the input"),
        ("gs://b/d", ["x.jsonl"], None),  # an input named only through `files`, below
    ],
)
def test_a_url_is_kept_apart_from_another_spelling_of_its_place(out, inputs, message):
    # The URLs' text was compared: `pack az://rev1/corpus/ -o abfs://rev1/corpus/packed` wrote
    # the dataset into the input's prefix (and each later run on it read its own output).
    with pytest.raises(ConfigError, match=message or "inside the output"):
        check_apart(out, inputs, [] if message else ["gcs://b/d/y.jsonl"])
    check_apart("s3a://b/other", ["s3://b/d/"])  # another place still passes
    check_apart("az://other/c/p", ["abfs://rev1@acct.blob.core.windows.net/c"])


def test_the_transaction_swaps_in_what_the_body_built(tmp_path):
    from packtool.dataset.output import transaction

    out = tmp_path / "new" / "deeper" / "out"

    def prepare(paths):
        paths.staging.mkdir()
        return "prepared"

    with transaction(out, "test", prepare, lambda exc, _: True) as (paths, prepared):
        assert prepared == "prepared"
        (paths.staging / "index.json").write_text("{}")
    assert (out / "index.json").read_text() == "{}"
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no staging, lock or old copy left


@pytest.mark.parametrize("keep", [False, True])
def test_a_failed_transaction_keeps_the_old_output_and_the_staging_only_when_asked(tmp_path, keep):
    from packtool.dataset.output import transaction

    out = tmp_path / "out"
    out.mkdir()
    (out / "index.json").write_text("old")
    seen = []

    def discard(exc, prepared):
        seen.append((type(exc), prepared))
        return not keep

    def prepare(paths):
        paths.staging.mkdir()
        return 7

    with pytest.raises(RuntimeError), transaction(out, "test", prepare, discard) as (paths, _):
        (paths.staging / "part").write_text("half")
        raise RuntimeError("the work failed")
    assert (out / "index.json").read_text() == "old"
    assert seen == [(RuntimeError, 7)]
    assert (tmp_path / ".out.packtool-staging").exists() == keep


def test_a_failed_transaction_whose_staging_a_writer_still_fills_ends_with_its_own_error(
    tmp_path, monkeypatch, capsys
):
    """A failed Ray run's actor still wrote into the staging folder as the driver removed it:
    the run ended with rmtree's 'Directory not empty' in place of its own error (1 in 3 runs
    of test_ray's failed-run test, 2026-12-07). The removal tries again while a writer fills
    the folder; where it cannot, it says so in a line and the run's own error is raised."""
    import errno
    import shutil

    from packtool.dataset.output import transaction

    real, calls = shutil.rmtree, []

    def racing(path, *args, **kwargs):  # a file lands after rmtree listed the folder
        calls.append(path)
        if len(calls) == 1:
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(writing.shutil, "rmtree", racing)

    def prepare(paths):
        paths.staging.mkdir()

    out = tmp_path / "out"
    failing = pytest.raises(RuntimeError, match="the work failed")
    with failing, transaction(out, "test", prepare, lambda exc, _: True) as (paths, _):
        (paths.staging / "part").write_text("half")
        raise RuntimeError("the work failed")
    assert len(calls) == 2 and not (tmp_path / ".out.packtool-staging").exists()
    assert capsys.readouterr().err == ""
    # A writer that never stops: tried REMOVE_TRIES times, said, and the run's error raised.
    monkeypatch.setattr(writing, "REMOVE_TRIES", 3)
    monkeypatch.setattr(writing, "REMOVE_PAUSE", 0)
    calls.clear()

    def never(path, *args, **kwargs):
        calls.append(path)
        raise OSError(errno.ENOTEMPTY, "Directory not empty", str(path))

    monkeypatch.setattr(writing.shutil, "rmtree", never)
    failing = pytest.raises(RuntimeError, match="the work failed")
    with failing, transaction(out, "test", prepare, lambda exc, _: True) as (paths, _):
        raise RuntimeError("the work failed")
    assert len(calls) == 3
    err = capsys.readouterr().err
    assert err.startswith("warning: ") and "packtool-staging: not removed" in err, err
    assert "Directory not empty" in err and err.count("\n") == 1


def test_a_transaction_that_fails_in_prepare_removes_the_folders_it_made(tmp_path):
    from packtool.dataset.output import transaction

    out = tmp_path / "a" / "b" / "out"

    def prepare(paths):
        raise ConfigError("refused")

    with (
        pytest.raises(ConfigError, match="refused"),
        transaction(out, "test", prepare, lambda exc, _: True),
    ):
        pytest.fail("the body never runs when prepare fails")
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("staged", ["not a manifest", "complete"])
def test_a_staged_index_json_is_never_swapped_in_by_a_refused_run(tmp_path, staged):
    # A staging folder beside the output holding an index.json: a plain `pack` (refused: the
    # output is not empty) swapped it in anyway, deleting the dataset, even one whose index.json
    # was `{"not": "a manifest"}`. Now it is swapped in only when it is a complete packtool
    # dataset and only by a run that goes on (--resume, --overwrite).
    src = corpus(tmp_path / "a.jsonl", "a")
    pack(src, tmp_path / "D")
    before = snapshot(tmp_path / "D")
    staging = tmp_path / ".D.packtool-staging"
    if staged == "complete":
        pack(corpus(tmp_path / "b.jsonl", "b"), tmp_path / "B")
        (tmp_path / "B").rename(staging)
    else:
        staging.mkdir()
        (staging / "index.json").write_text('{"not": "a manifest"}')
    staged_files = snapshot(staging)
    with pytest.raises(ConfigError) as refused:
        pack(src, tmp_path / "D")
    assert snapshot(tmp_path / "D") == before and snapshot(staging) == staged_files
    said = str(refused.value)
    if staged == "complete":
        assert "--resume" in said, said
        pack(src, tmp_path / "D", overwrite=True)  # switched in, then replaced: a new dataset
        assert not staging.exists() and verify_dataset(tmp_path / "D").rows > 0
    else:
        assert "not a manifest of a packtool dataset" in said, said
        with pytest.raises(ConfigError):
            pack(src, tmp_path / "D", resume=True)
        assert snapshot(tmp_path / "D") == before


@pytest.mark.parametrize("how", ["plain", "overwrite", "resume"])
def test_a_refused_run_deletes_nothing_in_a_local_output_it_did_not_write(tmp_path, how):
    # The local twin of a bucket's: a refused run leaves every file (a `v-*` folder included).
    out = tmp_path / "D"
    (out / "v-20200101T000000-deadbeef").mkdir(parents=True)
    (out / "v-20200101T000000-deadbeef" / "important.csv").write_text("the user's")
    (out / "notes.txt").write_text("the user's")
    with pytest.raises(ConfigError):
        pack(corpus(tmp_path / "a.jsonl", "a"), out, **({how: True} if how != "plain" else {}))
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == [
        "notes.txt",
        "v-20200101T000000-deadbeef",
        "v-20200101T000000-deadbeef/important.csv",
    ]


def test_resume_switches_in_a_built_dataset_only_for_the_same_options_and_inputs(
    tmp_path, monkeypatch
):
    """A run killed after its index.json, before its switch, and `--resume` with other options
    or inputs: it switched the killed run's dataset in and said "committed" (exit 0), though
    an unfinished run resumed so is refused. It is refused the same way, naming what differs."""
    out, a = tmp_path / "D", corpus(tmp_path / "a.jsonl", "a")

    class Killed(BaseException):
        pass

    def killed(*args, **kw):
        raise Killed

    monkeypatch.setattr(output, "commit", killed)
    with pytest.raises(Killed):
        pack(a, out)
    monkeypatch.undo()
    staging = output_paths(out).staging
    assert (staging / "index.json").is_file() and not out.exists()
    with pytest.raises(ConfigError) as e:
        run_pack(RunConfig(inputs=(str(a),), out_dir=str(out), pack=PackConfig(max_len=128),
                           progress=False, resume=True))  # fmt: skip
    assert str(e.value) == (
        f"cannot resume {out}: options or inputs differ (pack.max_len: 64 -> 128)"
    )
    with pytest.raises(ConfigError, match=r"options or inputs differ \(inputs: .*b.jsonl added"):
        pack(corpus(tmp_path / "b.jsonl", "b"), out, resume=True)
    assert not out.exists() and (staging / "index.json").is_file()
    plan = staging / ".packtool-run" / "plan.json"
    saved = plan.read_bytes()
    plan.unlink()  # a staging without its state: the digest index.json keeps still refuses it
    with pytest.raises(ConfigError, match="options or inputs differ .*cannot be told"):
        run_pack(RunConfig(inputs=(str(a),), out_dir=str(out), pack=PackConfig(max_len=128),
                           progress=False, resume=True))  # fmt: skip
    plan.write_bytes(saved)
    with pytest.raises(AlreadyComplete, match="committed the dataset the interrupted run"):
        pack(a, out, resume=True)
    assert read_manifest(out).extra["fingerprint"] and not staging.exists()
    assert not (out / ".packtool-run").exists()
