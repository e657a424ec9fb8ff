"""What both engines check before writing, and how a run that fails before its first chunk is undone.

Every test runs on the local and on the Ray engine. The checks that come before the output folder
must also come before Ray starts: those tests make starting Ray fail, so they need no Ray. The
others share the one local Ray of conftest.py's `ray_session`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from packtool.audit.verify import verify_dataset
from packtool.engines import local, records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import STATE_DIR, staging_folder
from packtool.errors import AlreadyComplete, ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from packtool.tokenize.tokenize import tokenize_corpus
from packtool.tokenizer.tokenizers import load_tokenizer

ENGINES = ["local", "ray"]


def jsonl(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return path


def config(inputs: Path, out: Path, **kw) -> RunConfig:
    kw.setdefault("pack", PackConfig(max_len=64))
    return RunConfig(inputs=(str(inputs),), out_dir=str(out), progress=False, **kw)


@pytest.fixture
def pack_with(request, monkeypatch) -> Callable[..., Callable[..., local.PackSummary]]:
    """`pack_with(engine, ray_may_start=False)` -> a `run_pack(config, tokenizer=None)` for it.

    Unless `ray_may_start`, starting Ray fails the test: what is checked before the output folder
    is touched must not cost a Ray start-up either.
    """

    def make(engine: str, ray_may_start: bool = False) -> Callable[..., local.PackSummary]:
        if engine == "local":
            return run_pack
        pytest.importorskip("ray.data", reason="ray[data] is not installed")
        from packtool.engines import ray as ray_engine

        if ray_may_start:
            request.getfixturevalue("ray_session")
        else:

            def no_start(*args, **kwargs):
                raise AssertionError("Ray was started before the pre-flight checks failed")

            monkeypatch.setattr(ray_engine, "_connect", no_start)

        def run(cfg: RunConfig, tokenizer=None) -> local.PackSummary:
            return ray_engine.run_pack_ray(cfg, ray_engine.RayConfig(max_retries=0), tokenizer)

        return run

    return make


@pytest.mark.parametrize("engine", ENGINES)
def test_a_tokenizer_unlike_the_recorded_one_is_refused_before_any_output(
    tmp_path, pack_with, engine
):
    raw = jsonl(tmp_path / "c.jsonl", ["one document", "another"])
    tokenize_corpus([raw], tmp_path / "tok.parquet", progress=False)  # byte, EOS 256
    out = tmp_path / "out"
    with pytest.raises(DataError, match=r"tok\.parquet: tokenized with byte:byte.*eos None"):
        pack_with(engine)(config(tmp_path / "tok.parquet", out), load_tokenizer("byte", eos=None))
    assert not out.exists()


@pytest.mark.parametrize("inputs", ["raw", "tokenized"])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_max_len_that_bos_and_eos_fill_is_refused_before_any_output(
    tmp_path, pack_with, engine, inputs
):
    raw = jsonl(tmp_path / "c.jsonl", ["one document", "another"])
    tokenizer = load_tokenizer("byte", bos="default")
    if inputs == "tokenized":
        # The recorded tokenizer (BOS and EOS) is the one checked when none is given.
        tokenize_corpus([raw], tmp_path / "tok.parquet", tokenizer=tokenizer, progress=False)
        raw, tokenizer = tmp_path / "tok.parquet", None
    out = tmp_path / "out"
    cfg = config(raw, out, pack=PackConfig(max_len=2))
    with pytest.raises(
        ConfigError, match=r"^--max-len 2 / max_len=2 leaves no room for text: .* 2 tokens"
    ):
        pack_with(engine)(cfg, tokenizer)
    assert not out.exists()


FAILURES = {
    # No usable document: the run fails at the end, with no chunk at all.
    "empty corpus": ([""], ReadConfig(), "every document was empty or dropped"),
    # --strict stops at the empty document while the first chunk is read.
    "strict": (["fine", ""], ReadConfig(strict=True), "empty.*run without --strict / strict=True"),
}


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_that_fails_before_its_first_chunk_leaves_nothing_behind(
    tmp_path, pack_with, engine, failure
):
    texts, read, message = FAILURES[failure]
    bad, out = jsonl(tmp_path / "bad.jsonl", texts), tmp_path / "out"
    pack = pack_with(engine, ray_may_start=True)
    with pytest.raises(DataError, match=message):
        pack(config(bad, out, read=read))
    assert not out.exists()  # the state file is gone, and the folder this run made
    # A folder that was there before stays, empty.
    out.mkdir()
    with pytest.raises(DataError, match=message):
        pack(config(bad, out, read=read))
    assert list(out.iterdir()) == []
    # So the corrected command works without --overwrite.
    good = jsonl(tmp_path / "good.jsonl", ["fine", "also fine"])
    assert pack(config(good, out)).counts.documents_packed == 2
    assert verify_dataset(out).rows == 1


def test_a_failure_before_ray_runs_anything_leaves_nothing_behind(tmp_path, pack_with):
    """Not only packtool's own errors: a cluster that cannot be reached, say."""
    pack = pack_with("ray")  # starting Ray raises AssertionError
    good, out = jsonl(tmp_path / "good.jsonl", ["fine"]), tmp_path / "out"
    with pytest.raises(AssertionError, match="Ray was started"):
        pack(config(good, out))
    assert not out.exists()


@pytest.mark.parametrize("record", ['{"partition": 0, "shards": 3}', '"shard-00000.parquet"'])
@pytest.mark.parametrize("engine", ENGINES)
def test_a_damaged_partition_record_is_refused_before_ray_starts(
    tmp_path, pack_with, engine, record, monkeypatch
):
    good = jsonl(tmp_path / "good.jsonl", [f"document {i} " * 20 for i in range(40)])
    out = tmp_path / "out"
    kw = {"partition_size": 400, "workers": 1}  # 4 partitions
    real = worker.write_chunk

    def stop_in_the_second_partition(writer, packed):
        if records.finished(staging_folder(out)):
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", stop_in_the_second_partition)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(good, out, **kw))
    monkeypatch.undo()
    path = records.record_path(staging_folder(out), 0)
    path.write_text(record)
    with pytest.raises(
        DataError,
        match=r"parts/000000\.json: malformed partition record.*--overwrite / overwrite=True$",
    ):
        pack_with(engine)(config(good, out, resume=True, **kw))
    assert path.read_text() == record


def test_an_interrupt_keeps_the_state_for_resume(tmp_path, monkeypatch):
    good, out = jsonl(tmp_path / "good.jsonl", ["fine"]), tmp_path / "out"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "write_chunk", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(good, out))
    assert not out.exists()  # the run is built beside the output, which it never reached
    assert [p.name for p in staging_folder(out).iterdir()] == [STATE_DIR]
    monkeypatch.undo()
    assert run_pack(config(good, out, resume=True)).counts.documents_packed == 1


PLAN_TEMPORARY = ".plan.json.4242-0123abcd.tmp"
"""What `records.write_plan` leaves when killed mid-write: the plan's temporary, never renamed."""


def _left_before_the_plan(staging: Path, left: str) -> None:
    """The staging folder as a run killed before it saved its plan leaves it."""
    (staging / STATE_DIR if left != "empty" else staging).mkdir(parents=True)
    if left == "plan temporary":
        (staging / STATE_DIR / PLAN_TEMPORARY).write_text('{"fingerprint": {"inp')


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.mark.parametrize("left", ["empty", "state folder", "plan temporary"])
def test_a_run_killed_before_it_saved_its_plan_is_started_again_by_a_plain_run(tmp_path, left):
    """kill -9 while it checked or planned (0.1 s at 3,000 inputs) left a staging folder with no
    plan: a plain rerun said 'pass --resume', and --resume said 'no interrupted run'. Killed
    while the plan was being written, it left the plan's temporary file: --resume said
    'plan.json: unreadable ... use --overwrite' and a plain rerun 'left its finished
    partitions ... pass --resume', though no partition had run."""
    good, out = jsonl(tmp_path / "good.jsonl", ["fine", "also fine"]), tmp_path / "out"
    run_pack(config(good, tmp_path / "reference"))
    staging = staging_folder(out)
    _left_before_the_plan(staging, left)
    with pytest.raises(
        ConfigError, match="stopped before it saved its plan.*without --resume / resume=True$"
    ):
        run_pack(config(good, out, resume=True))
    assert staging.is_dir()  # a refused --resume removes nothing
    assert run_pack(config(good, out)).counts.documents_packed == 2
    assert not staging.exists()
    assert _files(out) == _files(tmp_path / "reference")


def test_a_finished_dataset_beside_a_run_killed_before_its_plan_is_complete(tmp_path):
    """An --overwrite killed before it saved its plan left the old dataset whole: --resume of
    it is the finished dataset's answer, not the missing plan's error."""
    good, out = jsonl(tmp_path / "good.jsonl", ["fine"]), tmp_path / "out"
    run_pack(config(good, out))
    before = _files(out)
    _left_before_the_plan(staging_folder(out), "plan temporary")
    with pytest.raises(AlreadyComplete, match="already complete.*nothing to resume"):
        run_pack(config(good, out, resume=True))  # (the CLI's exit 0)
    assert _files(out) == before
    assert run_pack(config(good, out, overwrite=True)).counts.documents_packed == 1
    assert not staging_folder(out).exists() and _files(out) == before


def test_a_plan_temporary_beside_other_files_is_work_to_keep(tmp_path):
    """Only a staging folder holding nothing but the plan's temporaries is abandoned: a shard
    beside them (however it got there) is refused without --overwrite, and kept."""
    good, out = jsonl(tmp_path / "good.jsonl", ["fine"]), tmp_path / "out"
    staging = staging_folder(out)
    _left_before_the_plan(staging, "plan temporary")
    (staging / records.shard_name(0, 0)).write_bytes(b"a shard")
    with pytest.raises(
        ConfigError,
        match="pass --resume / resume=True to finish it or --overwrite / overwrite=True",
    ):
        run_pack(config(good, out))
    assert (staging / records.shard_name(0, 0)).read_bytes() == b"a shard"


def test_a_live_run_writing_its_plan_is_never_taken_for_an_abandoned_one(tmp_path):
    """The lock is checked first: a run that holds it while it writes its plan (its staging
    folder then looks like a killed one's) keeps its folder, and the second run is refused."""
    from packtool.dataset.output import OutputLock, output_paths

    good, out = jsonl(tmp_path / "good.jsonl", ["fine"]), tmp_path / "out"
    staging = staging_folder(out)
    with OutputLock(output_paths(out), "packtool pack (the first)"):
        _left_before_the_plan(staging, "plan temporary")
        for resume in (False, True):
            with pytest.raises(ConfigError, match="the first"):
                run_pack(config(good, out, resume=resume))
        assert (staging / STATE_DIR / PLAN_TEMPORARY).is_file()


def test_shards_of_a_chunk_not_yet_recorded_are_removed_too(tmp_path):
    # Chunk 0 is packed and written while chunk 1 is read; the read fails (strict, empty
    # document) before chunk 0 is recorded, so its shard is litter of a run that never started.
    bad = jsonl(tmp_path / "bad.jsonl", ["a", "b", "c", ""])
    read = ReadConfig(strict=True, batch_docs=2)
    out = tmp_path / "out"
    with pytest.raises(DataError, match="empty"):
        run_pack(config(bad, out, read=read, chunk_docs=2))
    assert not out.exists()


@pytest.mark.parametrize("finished", [0, 1])
def test_workers_lost_keeps_a_fresh_runs_finished_partitions(tmp_path, finished):
    """`WorkersLost` (workers died too often) is not a mistake in the command: the staging
    folder of a fresh run stays when a partition finished, for `--resume`; any other
    `PacktoolError` removes it; with nothing finished there is nothing to keep."""
    from packtool.engines.output_folder import output_folder
    from packtool.errors import WorkersLost

    corpus = jsonl(tmp_path / "c.jsonl", ["a b c"] * 3)
    for error, kept in [(WorkersLost("died"), bool(finished)), (DataError("bad"), False)]:
        cfg = config(corpus, tmp_path / "out", overwrite=True)
        with pytest.raises(type(error)), output_folder(cfg, {}) as output:
            records.write_plan(output.work, {"fingerprint": {}, "plan": {}})
            if finished:
                records.write_record(output.work, {"partition": 0})
            raise error
        assert staging_folder(tmp_path / "out").is_dir() is kept
        assert not (tmp_path / "out").exists()


def test_the_default_long_docs_of_unmasked_inputs_is_split_to_the_byte(tmp_path):
    """`PackConfig(long_docs=None)` decides by the inputs (`check_inputs`); without a loss mask
    it is `split`, with the same shards, index.json and recorded fingerprint as `split` given."""
    corpus = jsonl(tmp_path / "c.jsonl", ["word " * n for n in range(1, 120, 7)])
    run_pack(config(corpus, tmp_path / "default", pack=PackConfig(max_len=64)))
    run_pack(config(corpus, tmp_path / "split", pack=PackConfig(max_len=64, long_docs="split")))
    a, b = (_files(tmp_path / o) for o in ("default", "split"))
    index = json.loads(a.pop("index.json"))
    assert index["long_docs"] == "split" and index["counts"]["documents_split"] > 0
    assert index == json.loads(b.pop("index.json"))
    assert a == b
