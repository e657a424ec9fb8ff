"""The local engine end to end: shards + manifest, determinism, resume, refusals, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import read_manifest
from packtool.dataset.shards import ShardConfig
from packtool.engines import local, records, worker
from packtool.engines.local import RunConfig, rechunk, run_pack
from packtool.engines.output_folder import STATE_DIR, staging_folder
from packtool.errors import AlreadyComplete, ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from packtool.tokenizer.tokenizers import load_tokenizer

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def run(out, inputs=(CORPUS,), tokenizer=None, **kw) -> local.PackSummary:
    pack = kw.pop("pack", PackConfig(max_len=kw.pop("max_len", 1024)))
    config = RunConfig(
        inputs=tuple(str(p) for p in inputs), out_dir=str(out), pack=pack, progress=False, **kw
    )
    return run_pack(config, tokenizer)


def interrupted(monkeypatch, out, **kw) -> None:
    """`run(out, **kw)` stopped by a Ctrl-C at its first chunk's write (its plan saved)."""

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(worker, "write_chunk", boom)
        with pytest.raises(KeyboardInterrupt):
            run(out, **kw)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def test_pack_sample_data_writes_a_dataset_that_verifies(tmp_path):
    summary = run(tmp_path / "out", max_len=2048, shards=ShardConfig(shard_rows=500))
    manifest = read_manifest(tmp_path / "out")
    c = manifest.counts
    # 4,030 documents: 6 empty (the reader skips and counts them), none unreadable
    assert (c["documents_in"], c["documents_packed"], c["documents_empty"]) == (4030, 4024, 6)
    assert c["documents_skipped"] == 0
    assert c["tokens_in"] == c["tokens_out"] + c["tokens_truncated"] + c["tokens_dropped"]
    assert manifest.num_tokens == c["tokens_out"] and manifest.num_rows == c["rows"]
    assert len(manifest.shards) == -(-c["rows"] // 500)
    assert manifest.lower_bound_rows <= c["rows"]
    assert summary.efficiency == pytest.approx(c["tokens_out"] / (c["rows"] * 2048))
    report = verify_dataset(tmp_path / "out", checksums=True)
    assert report.rows == c["rows"]
    assert not list((tmp_path / "out").glob(".*"))  # no state or temporary file left behind


def test_every_document_appears_and_matches_its_tokens(tmp_path):
    run(tmp_path / "out", max_len=512)
    table = pq.read_table(sorted(str(p) for p in (tmp_path / "out").glob("shard-*.parquet")))
    tok = load_tokenizer("byte")
    texts = [json.loads(line)["text"] for line in CORPUS.read_text(encoding="utf-8").splitlines()]
    pieces: dict[int, list[tuple[int, list[int]]]] = {}
    for r in table.to_pylist():
        offs = r["doc_offsets"]
        for i, (d, c) in enumerate(zip(r["doc_ids"], r["doc_chunks"], strict=True)):
            pieces.setdefault(d, []).append((c, r["input_ids"][offs[i] : offs[i + 1]]))
    non_empty = [t for t in texts if t]
    assert len(pieces) == len(non_empty)
    for doc_id, text in zip(sorted(pieces), non_empty, strict=True):
        flat, _ = tok.encode_batch([text])
        joined = [t for _, toks in sorted(pieces[doc_id]) for t in toks]
        assert joined == flat.tolist()


def test_same_inputs_and_seed_give_identical_bytes(tmp_path):
    run(tmp_path / "a", pack=PackConfig(max_len=1024, seed=7, rounds=3), chunk_docs=1000)
    run(tmp_path / "b", pack=PackConfig(max_len=1024, seed=7, rounds=3), chunk_docs=1000)
    assert shard_bytes(tmp_path / "a") == shard_bytes(tmp_path / "b")
    a = read_manifest(tmp_path / "a")
    assert [s.sha256 for s in a.shards] == [s.sha256 for s in read_manifest(tmp_path / "b").shards]


# 3.3 MB of sample_data in 600 KB partitions: 6 partitions, several chunks each.
PARTS = {"partition_size": 600_000, "workers": 1}


def _interrupt_in_the_third_partition(out: Path, monkeypatch, **kw) -> Path:
    """Ctrl-C once two partitions are recorded; the staging folder (kept for --resume)."""
    real = worker.write_chunk
    staging = staging_folder(out)

    def crash_in_the_third_partition(writer, packed):
        if len(records.finished(staging)) == 2:  # two partitions are recorded
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", crash_in_the_third_partition)
    with pytest.raises(KeyboardInterrupt):
        run(out, **kw)
    monkeypatch.setattr(worker, "write_chunk", real)
    return staging


def test_interrupted_run_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    kw = {"max_len": 1024, "chunk_docs": 300, "shards": ShardConfig(shard_rows=200), **PARTS}
    run(tmp_path / "whole", **kw)
    staging = _interrupt_in_the_third_partition(tmp_path / "cut", monkeypatch, **kw)
    assert not (tmp_path / "cut").exists()  # never looks complete: built beside it
    with pytest.raises(DataError, match="no such dataset folder"):
        read_manifest(tmp_path / "cut")
    assert records.finished(staging) == [0, 1]

    summary = run(tmp_path / "cut", resume=True, **kw)
    assert summary.resumed_partitions == 2 and summary.partitions == 6
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")
    whole, cut = read_manifest(tmp_path / "whole"), read_manifest(tmp_path / "cut")
    assert whole.to_dict() == cut.to_dict()


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_finished_partitions_tail_lost_from_the_staging_folder_is_an_error(
    tmp_path, monkeypatch, damage
):
    """Its pieces were dropped: --resume committed a dataset whose index.json counted tokens its
    shards lacked (verify refused it); a damaged tail was a pyarrow traceback."""
    kw = {"max_len": 1024, "chunk_docs": 300, "shards": ShardConfig(shard_rows=200), **PARTS}
    staging = _interrupt_in_the_third_partition(tmp_path / "cut", monkeypatch, **kw)
    tail = records.tail_path(staging, 1)
    assert records.read_record(staging, 1)["tail"]["pieces"] > 0
    if damage == "deleted":
        tail.unlink()
    else:
        tail.write_bytes(tail.read_bytes()[:100])
    with pytest.raises(
        DataError, match=r"tails/000001.arrow: .*start over with --overwrite / overwrite=True"
    ):
        run(tmp_path / "cut", resume=True, **kw)
    assert not (tmp_path / "cut").exists()


def test_resume_with_the_inputs_named_another_way_says_so(tmp_path, monkeypatch):
    """`corpus` then `$PWD/corpus`: the same files, which the message called 'added'."""
    import shutil

    shutil.copy(CORPUS, tmp_path / "c.jsonl")
    monkeypatch.chdir(tmp_path)

    def boom(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(worker, "write_chunk", boom)
    kw = {"max_len": 1024, "chunk_docs": 500}
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "out", inputs=("c.jsonl",), **kw)
    monkeypatch.undo()  # the real write_chunk (and the first cwd, set again)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ConfigError, match=r"name the interrupted run's files differently \(it read 'c.jsonl'\)"
    ):
        run(tmp_path / "out", inputs=(str(tmp_path / "c.jsonl"),), resume=True, **kw)
    assert run(tmp_path / "out", inputs=("c.jsonl",), resume=True, **kw).partitions >= 1


def test_a_rerun_after_an_interrupted_run_says_what_it_left(tmp_path, monkeypatch):
    """A run stopped before any partition finished was said to have left "its finished
    partitions"; one that finished some says how many."""

    interrupted(monkeypatch, tmp_path / "out", max_len=1024, chunk_docs=500)
    with pytest.raises(ConfigError, match=r"left its plan in .*; pass --resume / resume=True"):
        run(tmp_path / "out", max_len=1024, chunk_docs=500)
    records.write_record(staging_folder(tmp_path / "out"), {"partition": 0})
    with pytest.raises(ConfigError, match=r"left its 1 finished partition in "):
        run(tmp_path / "out", max_len=1024, chunk_docs=500)


def test_resume_refuses_changed_options_and_finished_runs(tmp_path, monkeypatch):
    interrupted(monkeypatch, tmp_path / "out", max_len=1024, chunk_docs=500)
    with pytest.raises(ConfigError, match="cannot resume.*pack"):
        run(tmp_path / "out", max_len=2048, chunk_docs=500, resume=True)
    run(tmp_path / "done", max_len=1024)
    with pytest.raises(AlreadyComplete, match="already complete") as done:
        run(tmp_path / "done", max_len=1024, resume=True)
    assert done.value.output == str(tmp_path / "done")
    assert not isinstance(done.value, ConfigError)  # not a mistake: the CLI exits 0


def test_non_empty_output_needs_overwrite(tmp_path):
    run(tmp_path / "out", max_len=512)
    with pytest.raises(ConfigError, match="not empty.*--overwrite"):
        run(tmp_path / "out")
    (tmp_path / "out" / ".shard-00007.parquet.tmp").write_bytes(b"left by a crash")
    run(tmp_path / "out", overwrite=True)  # replaces a dataset, temporaries included
    assert read_manifest(tmp_path / "out").max_len == 1024
    assert not list((tmp_path / "out").glob(".*"))


def test_overwrite_never_deletes_files_packtool_did_not_write(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"did not write \(notes.txt\)"):
        run(tmp_path / "out", overwrite=True)
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    with pytest.raises(ConfigError, match="exclude each other"):
        run(tmp_path / "x", overwrite=True, resume=True)


def test_overwrite_tells_packtools_files_by_kind_not_name_alone(tmp_path):
    """A folder named like a shard (holding notes) and a temporary-looking folder were deleted
    by --overwrite: only regular files with packtool's names are its own."""
    out = tmp_path / "out"
    (out / "shard-2024-backup.parquet").mkdir(parents=True)
    (out / "shard-2024-backup.parquet" / "notes.txt").write_text("mine")
    (out / ".notes.tmp").mkdir()
    with pytest.raises(ConfigError, match=r"did not write \(.notes.tmp, shard-2024-backup"):
        run(out, overwrite=True)
    assert (out / "shard-2024-backup.parquet" / "notes.txt").read_text() == "mine"


def test_overwrite_keeps_a_users_file_named_dot_tmp(tmp_path):
    """`--overwrite` took a file named `.tmp` for a temporary (`.X.tmp`) and deleted it."""
    out = tmp_path / "out"
    out.mkdir()
    (out / ".tmp").write_text("mine")
    with pytest.raises(ConfigError, match=r"did not write \(.tmp\)"):
        run(out, overwrite=True)
    assert (out / ".tmp").read_text() == "mine"


def test_chunking_costs_almost_no_efficiency(tmp_path):
    one = run(tmp_path / "one", max_len=2048)
    many = run(tmp_path / "many", max_len=2048, chunk_docs=1000)
    assert many.counts.tokens_out == one.counts.tokens_out
    assert one.efficiency - many.efficiency < 0.01


def test_tokenized_parquet_input_gives_the_same_rows(tmp_path):
    from packtool.read import docids
    from packtool.read.documents import ReadConfig
    from packtool.tokenize.tokenize import tokenize_corpus

    tokenize_corpus([str(CORPUS)], str(tmp_path / "tok.parquet"), read_config=ReadConfig())
    run(tmp_path / "raw", max_len=1024)
    run(tmp_path / "tok", inputs=[tmp_path / "tok.parquet"], max_len=1024)
    raw, tok = (
        pq.read_table(sorted((tmp_path / d).glob("shard-*.parquet"))) for d in ("raw", "tok")
    )
    for name in ("input_ids", "doc_offsets", "doc_chunks"):
        assert raw.column(name).equals(tok.column(name))
    # The same documents, numbered by where each was read: the line's byte offset in the JSONL,
    # the row in the tokenized file.
    starts = [0]
    for line in CORPUS.read_bytes().splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    non_empty = [
        o
        for o, line in zip(starts, CORPUS.read_bytes().splitlines(), strict=False)
        if json.loads(line)["text"]
    ]
    row_of = {o: r for r, o in enumerate(non_empty)}
    raw_ids = np.concatenate(raw.column("doc_ids").to_numpy(zero_copy_only=False))
    tok_ids = np.concatenate(tok.column("doc_ids").to_numpy(zero_copy_only=False))
    assert [row_of[int(o)] for o in docids.decode(raw_ids)[1]] == docids.decode(tok_ids)[1].tolist()


def test_tokenizer_mismatch_is_an_error(tmp_path):
    from packtool.read.documents import ReadConfig
    from packtool.tokenize.tokenize import tokenize_corpus

    tokenize_corpus([str(CORPUS)], str(tmp_path / "tok.parquet"), read_config=ReadConfig())
    config = RunConfig(
        inputs=(str(tmp_path / "tok.parquet"),),
        out_dir=str(tmp_path / "out"),
        pack=PackConfig(max_len=1024),
        progress=False,
    )
    with pytest.raises(DataError, match="the options give"):
        run_pack(config, load_tokenizer("byte", eos=None))


def test_group_by_reports_each_group(tmp_path):
    from packtool.read.documents import ReadConfig

    run(
        tmp_path / "out",
        pack=PackConfig(max_len=2048, group_by="lang"),
        read=ReadConfig(extra_fields=("lang",)),
    )
    groups = read_manifest(tmp_path / "out").extra["groups"]
    assert sorted(groups) == ["de", "en", "fr", "ja"]
    assert sum(g["rows"] for g in groups.values()) == read_manifest(tmp_path / "out").num_rows
    assert all(0 < g["efficiency"] <= 1 for g in groups.values())


def test_truncate_and_drop_account_for_every_token(tmp_path):
    for policy in ("truncate", "drop"):
        summary = run(tmp_path / policy, pack=PackConfig(max_len=512, long_docs=policy))
        c = summary.counts
        assert c.tokens_in == c.tokens_out + c.tokens_truncated + c.tokens_dropped
        assert (c.tokens_truncated if policy == "truncate" else c.tokens_dropped) > 0


def test_empty_corpus_is_an_error(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="nothing to pack|no documents"):
        run(tmp_path / "out", inputs=[empty])


def test_output_loads_with_plain_pyarrow_and_hf_datasets(tmp_path):
    run(tmp_path / "out", max_len=1024)
    files = sorted(str(p) for p in (tmp_path / "out").glob("shard-*.parquet"))
    table = pq.read_table(files)
    assert table.column_names == [
        "input_ids",
        "doc_offsets",
        "doc_ids",
        "doc_chunks",
        "seq_lengths",
    ]
    import datasets  # the dev extra installs it; the test must not skip silently

    ds = datasets.load_dataset(
        "parquet", data_files=files, split="train", cache_dir=str(tmp_path / "c")
    )
    assert len(ds) == table.num_rows
    row = ds[0]
    assert row["doc_offsets"][0] == 0 and row["doc_offsets"][-1] == len(row["input_ids"])
    assert row["seq_lengths"] == np.diff(row["doc_offsets"]).tolist()


def test_rechunk_gives_exact_chunk_sizes():  # inside a partition
    tables = [pa.table({"x": np.arange(n)}) for n in (3, 10, 1, 7)]
    sizes = [t.num_rows for t in rechunk(tables, 4)]
    assert sizes == [4, 4, 4, 4, 4, 1]
    values = np.concatenate([t.column("x").to_numpy() for t in rechunk(tables, 4)])
    assert values.tolist() == np.concatenate([np.arange(n) for n in (3, 10, 1, 7)]).tolist()


def test_chunk_docs_must_be_positive(tmp_path):
    with pytest.raises(ConfigError, match="chunk_docs"):
        run(tmp_path / "out", chunk_docs=0)


def test_sigkill_mid_run_then_resume_gives_the_same_bytes(tmp_path):
    """A real `packtool pack` process killed with SIGKILL mid-run, then `--resume` (a second
    process). The uninterrupted run it is compared with runs in this process (`main()`, as the
    console script calls it): its bytes are what is compared, not its process."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.cli import run as cli_run

    corpus = tmp_path / "x4.jsonl"
    corpus.write_bytes(CORPUS.read_bytes() * 4)
    args = ["--max-len", "1024", "--chunk-docs", "400", "--shard-rows", "100"]
    args += ["--partition-size", "1MB", "--workers", "1"]  # 12 partitions, one at a time
    cmd = [sys.executable, "-m", "packtool.cli.commands", "pack", str(corpus), *args]
    env = {**os.environ, "PACKTOOL_NO_PROGRESS": "1"}
    code, _, err = cli_run("pack", corpus, *args, "-o", tmp_path / "whole")
    assert code == 0, err

    cut = tmp_path / "cut"
    staging = staging_folder(cut)
    proc = subprocess.Popen([*cmd, "-o", str(cut)], env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    # Killed once two partitions are recorded and a third is being written.
    while len(records.finished(staging)) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if cut.exists():
        pytest.fail("the run finished before it could be killed; make the corpus larger")
    assert list(staging.glob("shard-*.parquet"))  # it was killed mid-run, with shards written
    # Its lock file stays behind, but the lock died with the process: --resume takes it.
    assert list(tmp_path.glob(".cut.packtool-lock"))

    done = subprocess.run(
        [*cmd, "-o", str(cut), "--resume"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert "resumed: kept" in done.stdout and "of 12 (their inputs were not read" in done.stdout
    assert shard_bytes(cut) == shard_bytes(tmp_path / "whole")
    assert verify_dataset(cut).rows == read_manifest(tmp_path / "whole").num_rows


def test_resume_refuses_a_changed_input_folder(tmp_path, monkeypatch):
    folder = tmp_path / "data"
    folder.mkdir()
    for i in range(3):
        (folder / f"{i}.jsonl").write_text(
            "".join(json.dumps({"text": f"doc {i}.{j} " * 5}) + "\n" for j in range(200))
        )
    kw = {"max_len": 256, "chunk_docs": 100}

    interrupted(monkeypatch, tmp_path / "out", inputs=(folder,), **kw)
    # A file added to the folder would shift every chunk after the finished ones.
    (folder / "3.jsonl").write_text(json.dumps({"text": "late"}) + "\n")
    with pytest.raises(ConfigError, match=r"options or inputs differ \(inputs: .*3\.jsonl added"):
        run(tmp_path / "out", inputs=(folder,), resume=True, **kw)
    (folder / "3.jsonl").unlink()
    # So would an edit that keeps the size.
    first = folder / "0.jsonl"
    first.write_text(first.read_text().replace("doc 0.1 ", "DOC 0.1 "))
    with pytest.raises(ConfigError, match=r"differ \(inputs: .*0\.jsonl changed\)$"):
        run(tmp_path / "out", inputs=(folder,), resume=True, **kw)


def test_a_refused_resume_names_the_settings_that_differ(tmp_path, monkeypatch):
    """It named the section of the run's options ("(pack)" for --seed 3, "(shards)" for
    --compression, "(read)" for --text-field, "(tokenizer)" for --no-eos), not the option."""
    from packtool.dataset.shards import ShardConfig
    from packtool.read.documents import ReadConfig

    pack = PackConfig(max_len=256)
    monkeypatch.setattr(
        worker, "write_chunk", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt)
    )
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path / "out", pack=pack, chunk_docs=100)
    monkeypatch.undo()

    def refused(tokenizer=None, **kw) -> str:
        kw = {"pack": pack, "chunk_docs": 100, **kw}
        config = RunConfig(
            inputs=(str(CORPUS),), out_dir=str(tmp_path / "out"), resume=True, progress=False, **kw
        )
        with pytest.raises(ConfigError) as err:
            run_pack(config, tokenizer)
        return str(err.value).split("options or inputs differ ", 1)[-1]

    assert refused(pack=PackConfig(max_len=256, seed=3)) == "(pack.seed: 0 -> 3)"
    assert refused(pack=PackConfig(max_len=128, long_docs="drop", rounds=2)) == (
        '(pack.max_len: 256 -> 128, pack.long_docs: "split" -> "drop", pack.rounds: 1 -> 2)'
    )
    assert (
        refused(shards=ShardConfig(compression="zstd")) == '(shards.compression: "lz4" -> "zstd")'
    )
    assert refused(read=ReadConfig(text_field="body")) == '(read.text_field: "text" -> "body")'
    assert refused(load_tokenizer("byte", eos=None)) == "(tokenizer.eos_id: 256 -> none)"
    # At most four named, then how many more; a long value cut short.
    many = PackConfig(max_len=100, algorithm="bfd", long_docs="drop", rounds=2, seed=9)
    assert refused(pack=many).endswith(", pack.rounds: 1 -> 2 and 1 more)")
    long_field = "f" * 60
    assert f'"text" -> "{"f" * 36}...' in refused(read=ReadConfig(text_field=long_field))
    # A finished dataset keeps a digest of its run's options and inputs, not them: said so.
    run(tmp_path / "out", pack=pack, chunk_docs=100, resume=True)
    assert refused(pack=PackConfig(max_len=256, seed=3)).endswith(
        "a finished dataset of other options or inputs (its index.json keeps their digest, "
        "extra.fingerprint, not them, so which ones differ cannot be told); use --overwrite / overwrite=True "
        "to replace it"
    )


def test_a_resumed_runs_summary_times_and_rates_its_own_work(tmp_path, monkeypatch):
    """With 66 of 95 partitions kept, the summary said 8,220,211 tokens/s against a full run's
    4,850,853: every token over this run's time, and stage times that added the kept
    partitions' recorded ones (summing past the total)."""
    out, kw = tmp_path / "out", {"max_len": 1024, "partition_size": 300_000, "workers": 1}
    real, calls = local.run_partition, []

    def stop(ctx, descriptor):
        if len(calls) == 4:
            raise KeyboardInterrupt
        calls.append(descriptor)
        return real(ctx, descriptor)

    monkeypatch.setattr(local, "run_partition", stop)
    with pytest.raises(KeyboardInterrupt):
        run(out, **kw)
    monkeypatch.undo()
    staging, kept_tokens = staging_folder(out), 0
    for p in records.finished(staging):  # as if each kept partition had taken 1000 s a stage
        path = records.record_path(staging, p)
        record = json.loads(path.read_text())
        record["seconds"] = {k: 1000.0 for k in record["seconds"]}
        path.write_text(json.dumps(record))
        kept_tokens += record["counts"]["tokens_in"]
    summary = run(out, resume=True, **kw)
    c, total = summary.counts, summary.seconds["total"]
    assert summary.resumed_partitions == 4 and summary.partitions == 11
    assert all(v < 1000 for v in summary.seconds.values()), summary.seconds
    own = c.tokens_in - kept_tokens
    assert summary.to_dict()["tokens_in_this_run"] == own > 0
    assert summary.to_dict()["counts"]["tokens_in"] == c.tokens_in  # the keys kept
    line = next(t for t in summary.format(1024).splitlines() if t.startswith("time "))
    assert f"; {own / total:,.0f} tokens/s ({own:,} of {c.tokens_in:,} tokens in this run);" in line
    fresh = run(tmp_path / "fresh", **kw)
    assert "in this run" not in fresh.format(1024) and fresh.to_dict()["tokens_in_this_run"] == (
        fresh.counts.tokens_in
    )


@pytest.mark.parametrize("state", ["[]", '{"fingerprint": {}, "plan": 3}', "not json"])
def test_a_damaged_state_file_is_a_one_line_error(tmp_path, state):
    (staging_folder(tmp_path / "out") / STATE_DIR).mkdir(parents=True)
    (staging_folder(tmp_path / "out") / STATE_DIR / "plan.json").write_text(state)
    with pytest.raises(DataError, match=r"plan\.json: (malformed|unreadable).*--overwrite"):
        run(tmp_path / "out", resume=True)


def test_an_older_packtools_interrupted_run_is_named(tmp_path):
    staging_folder(tmp_path / "out").mkdir()
    (staging_folder(tmp_path / "out") / ".pack-state.json").write_text("{}")
    with pytest.raises(ConfigError, match="interrupted by an older packtool.*--overwrite"):
        run(tmp_path / "out", resume=True)


def _write_later(folder: Path) -> None:
    (folder / "started").touch()
    import time

    time.sleep(2)
    (folder / "late").touch()  # what a worker the stop left running would write


def test_a_stopped_pool_s_running_workers_are_gone_before_the_stop_returns(tmp_path):
    """A failed run stops its pool before it discards the staging output: no worker of it may
    write there afterwards (on Python 3.11-3.13 `shutdown` forgets its processes, and the kill
    that followed it killed none)."""
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import connection

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork"))
    pool.submit(_write_later, tmp_path)
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    procs = list(pool._processes.values())
    local._stop(pool)
    # Ended: each one's sentinel is ready (`is_alive` may still say True for a moment, when the
    # pool's own thread reaps the process while this one asks).
    assert procs and len(connection.wait([p.sentinel for p in procs], timeout=0)) == len(procs)
    time.sleep(2.5)
    assert not (tmp_path / "late").exists()


def test_ctrl_c_during_a_submit_is_raised_after_it():
    # A Ctrl-C inside a submit that was starting a worker left that worker out of the pool's
    # list (never killed; its traceback came after the prompt): it waits for the submit now.
    import os
    import signal

    from packtool.engines.interrupts import ctrl_c_after

    reached = []
    with pytest.raises(KeyboardInterrupt), ctrl_c_after():
        os.kill(os.getpid(), signal.SIGINT)
        reached.append("the rest of the block")
    assert reached == ["the rest of the block"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_ctrl_c_during_a_submit_is_held_while_other_threads_run():
    """The kernel hands a process's SIGINT to any thread not blocking it: a signal mask on the
    main thread held nothing while a tokenizer or prefetch thread ran (it failed in the full
    suite, where threads of earlier tests were alive)."""
    import os
    import signal
    import threading

    from packtool.engines.interrupts import ctrl_c_after

    stop = threading.Event()

    def busy() -> None:  # a running thread (a waiting one is not where the kernel sends it)
        while not stop.is_set():
            sum(range(1000))

    other = threading.Thread(target=busy, daemon=True)
    other.start()
    reached = []
    try:
        for _ in range(20):  # whichever thread the kernel picks
            with pytest.raises(KeyboardInterrupt), ctrl_c_after():
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(100_000))  # bytecode where a pending signal would be raised
                reached.append(1)
    finally:
        stop.set()
    assert len(reached) == 20


def test_one_path_is_one_input_not_its_characters(tmp_path, monkeypatch):
    """Before: `RunConfig(inputs="c.jsonl", ...)` made each character an input, and run_pack
    refused the output as inside the input folder "."; a Path failed on `list(inputs)`."""
    monkeypatch.chdir(tmp_path)
    Path("c.jsonl").write_text('{"text": "abc"}\n{"text": "hello"}\n')
    for n, one in enumerate(["c.jsonl", Path("c.jsonl")]):
        config = RunConfig(
            inputs=one,
            out_dir=str(tmp_path / f"out{n}"),
            pack=PackConfig(max_len=64),
            progress=False,
        )
        assert config.inputs == ("c.jsonl",)
        run_pack(config)
        assert read_manifest(tmp_path / f"out{n}").counts["documents_packed"] == 2
    assert RunConfig(inputs=[Path("a"), "b"], out_dir="o", pack=PackConfig(max_len=64)).inputs == (
        "a",
        "b",
    )


def test_a_tokenizer_spec_is_loaded_as_tokenize_corpus_loads_it(tmp_path):
    # Before: run_pack(config, tokenizer="byte") failed with AttributeError ('str' object has no
    # attribute 'identity'); tokenize_corpus, tokenized_batches and compute_stats take a spec.
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "abc"}\n{"text": "hello"}\n')
    run(tmp_path / "spec", inputs=[src], max_len=64, tokenizer="byte")
    run(tmp_path / "object", inputs=[src], max_len=64, tokenizer=load_tokenizer("byte"))
    assert shard_bytes(tmp_path / "spec") == shard_bytes(tmp_path / "object")
    with pytest.raises(ConfigError, match="^tokenizer must be a Tokenizer or a tokenizer spec"):
        run(tmp_path / "bad", inputs=[src], max_len=64, tokenizer=3)
    assert not (tmp_path / "bad").exists()


def test_a_thread_pool_run_that_fails_says_why_and_leaves_nothing(tmp_path, monkeypatch):
    """PACKTOOL_WORKER_POOL=thread: a partition's error stopped the pool without waiting for
    the other threads, which wrote on into the staging folder the failed run then removed:
    "parts: Directory not empty" in the place of the real error, a half-deleted staging folder
    that --resume could not read and a plain run refused (found by a second reader)."""
    monkeypatch.setenv(local.POOL_ENV, "thread")
    inputs = []
    for i in range(3):
        lines = [json.dumps({"text": f"document {i} {j} " * 20}) for j in range(400)]
        if i == 1:
            lines[30] = "{not json"
        (tmp_path / f"{i}.jsonl").write_text("\n".join(lines) + "\n")
        inputs.append(str(tmp_path / f"{i}.jsonl"))
    out = tmp_path / "out"
    config = RunConfig(
        inputs=tuple(inputs), out_dir=str(out), pack=PackConfig(max_len=256), workers=2,
        partition_size=20_000, progress=False, read=ReadConfig(strict=True),
    )  # fmt: skip
    with pytest.raises(DataError, match=r"1\.jsonl:31: malformed"):
        run_pack(config)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0.jsonl", "1.jsonl", "2.jsonl"]
