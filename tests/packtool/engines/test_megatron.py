"""`packtool tokenize --to megatron`: byte-identical to megatron-core's IndexedDatasetBuilder and
read by its IndexedDataset (megatron-core installed by the dev extras: a real reference)."""

from __future__ import annotations

import gzip
import json
import signal
import struct
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.dataset import megatron
from packtool.dataset.megatron import MegatronWriter, megatron_dtype, read_megatron_index
from packtool.engines import records
from packtool.engines.megatron.run import tokenize_megatron
from packtool.engines.output_folder import staging_folder
from packtool.errors import ConfigError, DataError
from packtool.tokenize.tokenize import tokenized_batches
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import build, stdlib_sample

with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset, IndexedDatasetBuilder


def _reference(prefix, docs, vocab_size):
    """What megatron-core writes for `docs` (preprocess_data.py's loop: one sequence each)."""
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=DType.optimal_dtype(vocab_size))
    for doc in docs:
        builder.add_document(torch.tensor(doc, dtype=torch.int64), [len(doc)])
    builder.finalize(f"{prefix}.idx")


def _table(docs, token_type):
    ids = pa.array(docs, type=pa.list_(token_type))
    return pa.table({"input_ids": ids})


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    docs=st.lists(st.lists(st.integers(0, 65_499), min_size=1, max_size=40), max_size=30),
    vocab=st.sampled_from([258, 50_257, 65_499, 65_500, 128_256]),
    per_table=st.integers(1, 9),
    block=st.integers(1, 7),
)
def test_writer_equals_megatron_builder(tmp_path_factory, docs, vocab, per_table, block):
    folder = tmp_path_factory.mktemp("mg")
    docs = [[t % vocab for t in d] for d in docs]
    dtype = megatron_dtype(vocab)
    assert dtype == np.dtype(DType.optimal_dtype(vocab))  # the dtype Megatron picks
    old, megatron.BLOCK = megatron.BLOCK, block  # index blocks of a few documents
    try:
        writer = MegatronWriter(folder / "a.bin", folder / "a.idx", dtype)
        token_type = pa.uint16() if vocab <= 65_536 else pa.uint32()
        for i in range(0, len(docs), per_table):
            writer.write(_table(docs[i : i + per_table], token_type))
        writer.close()
    finally:
        megatron.BLOCK = old
    _reference(folder / "ref", docs, vocab)
    assert (folder / "a.bin").read_bytes() == (folder / "ref.bin").read_bytes()
    assert (folder / "a.idx").read_bytes() == (folder / "ref.idx").read_bytes()
    assert sorted(p.name for p in folder.iterdir()) == ["a.bin", "a.idx", "ref.bin", "ref.idx"]
    index = read_megatron_index(folder / "a.idx")
    assert index["lengths"].tolist() == [len(d) for d in docs]
    assert writer.documents == len(docs) and writer.tokens == sum(map(len, docs))


def test_an_index_the_writer_cannot_finish_is_deleted(tmp_path, monkeypatch):
    """Before: a full disk while the `.idx` was written left its first bytes at its name, a
    valid header claiming every document (the CLI writes it under a temporary name; a library
    caller of MegatronWriter got the half file)."""
    import errno

    from packtool.storage import writing

    writer = MegatronWriter(tmp_path / "a.bin", tmp_path / "a.idx", np.dtype(np.uint16))
    writer.write(_table([[1, 2, 3], [4]], pa.uint16()))

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writing, "append_range", full)
    with pytest.raises(OSError, match="No space left on device"):
        writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.bin"]


def test_an_index_the_writer_cannot_open_is_left_as_it_was(tmp_path, monkeypatch):
    """The deletion above came with the open inside it: an `.idx` write_index could not even
    open (EACCES) was deleted, though nothing of it had been written (a reviewer's find)."""
    import errno

    from packtool.storage import writing

    (tmp_path / "a.idx").write_bytes(b"an older index")
    writer = MegatronWriter(tmp_path / "a.bin", tmp_path / "a.idx", np.dtype(np.uint16))
    writer.write(_table([[1, 2, 3]], pa.uint16()))
    opened = writing.open_output

    def refused(path, *args, **kwargs):
        if str(path).endswith("a.idx"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return opened(path, *args, **kwargs)

    monkeypatch.setattr(writing, "open_output", refused)
    with pytest.raises(OSError, match="Permission denied"):
        writer.close()
    assert (tmp_path / "a.idx").read_bytes() == b"an older index"


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
    return build("gpt2", tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("corpus") / "c.jsonl"
    paragraphs = [p for t in stdlib_sample() for p in t.split("\n\n") if p.strip()]
    texts = paragraphs[:400]
    assert len(texts) == 400
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts) + '{"text": ""}\n')
    return path


def test_cli_writes_what_megatron_writes_and_reads(tmp_path, gpt2, corpus):
    code, out, err = run(
        "tokenize", corpus, "--tokenizer", gpt2, "--to", "megatron", "-o", tmp_path / "d"
    )
    assert code == 0, err
    assert "Wrote" in out and "d.bin and d.idx" in out
    tok = load_tokenizer(str(gpt2))
    docs = [
        r
        for t in tokenized_batches([corpus], tokenizer=tok)
        for r in t.column("input_ids").to_pylist()
    ]
    assert len(docs) == 400 and all(d[-1] == tok.identity.eos_id for d in docs)  # --append-eod
    _reference(tmp_path / "ref", docs, tok.identity.vocab_size)
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"d{suffix}").read_bytes() == (tmp_path / f"ref{suffix}").read_bytes()
    ds = IndexedDataset(str(tmp_path / "d"))
    assert len(ds) == 400
    assert [ds[i].tolist() for i in (0, 57, 399)] == [docs[i] for i in (0, 57, 399)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".d.idx.packtool.json",
        "d.bin",
        "d.idx",
        "ref.bin",
        "ref.idx",
    ]


def _word_level(folder, n):
    """A tokenizer.json of `n` word ids (w0 ... w{n-1}) and an end-of-text token."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(n - 2)} | {"[UNK]": n - 2, "<|endoftext|>": n - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_no_eos_and_a_vocabulary_that_needs_int32(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "w1 w65600 w7"}\n{"text": "w69000"}\n')
    tok = load_tokenizer(str(_word_level(tmp_path, 70_000)), eos=None)
    tokenize_megatron([path], tmp_path / "big.bin", tokenizer=tok, progress=False)
    index = read_megatron_index(tmp_path / "big.idx")
    assert index["dtype"] == np.int32  # 70,000 ids: Megatron's int32
    assert np.fromfile(tmp_path / "big.bin", dtype=np.int32).tolist() == [1, 65600, 7, 69000]
    assert index["lengths"].tolist() == [3, 1] and index["pointers"].tolist() == [0, 12]
    assert index["document_indices"].tolist() == [0, 1, 2]


def test_replacing_a_dataset_and_the_one_line_errors(tmp_path, corpus):
    prefix = tmp_path / "d"
    tokenize_megatron([corpus], prefix, progress=False)
    before = (tmp_path / "d.idx").read_bytes()
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", prefix)
    assert code != 0 and "d.bin exists; pass --overwrite" in one_error_line(err)
    # given as the .bin, it names the pair it replaces (it said "d.bin.bin/.idx")
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", f"{prefix}.bin")
    assert (
        f"pass --overwrite / overwrite=True to replace {prefix}.bin and {prefix}.idx"
        in one_error_line(err)
    )
    # A run that fails (no documents) leaves the old pair as it was and nothing beside it.
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="no documents"):
        tokenize_megatron([empty], prefix, overwrite=True, progress=False)
    assert (tmp_path / "d.idx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".d.idx.packtool.json",
        "d.bin",
        "d.idx",
        "empty.jsonl",
    ]
    tokenize_megatron(
        [corpus],
        prefix,
        overwrite=True,
        tokenizer=load_tokenizer("byte", eos=None),
        progress=False,
    )
    assert (tmp_path / "d.idx").read_bytes() != before
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", prefix, "--keep-field", "x")
    assert code != 0 and "drop --keep-field / extra_fields=('x',)" in one_error_line(err)


def test_inputs_with_a_loss_mask_are_refused(tmp_path):
    chat = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    chat.write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(ConfigError, match="cannot hold"):
        tokenize_megatron([chat], tmp_path / "d", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def test_the_library_s_refusals_name_the_python_argument_beside_the_flag(tmp_path):
    """Before: `tokenize_megatron(...)` raised "--to megatron: ... drop --keep-field", "--to
    megatron: the inputs carry loss_mask ... (--to parquet)", "... runs on --engine local" and
    "pass --overwrite": flags a Python caller cannot pass. Each line now names both forms."""
    from packtool.read.documents import ReadConfig

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "abc", "x": "1"}\n')
    chat = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    chat.write_text(json.dumps({"messages": messages}) + "\n")
    prefix = tmp_path / "d"
    kept = ReadConfig(extra_fields=("x",))
    with pytest.raises(ConfigError) as e:
        tokenize_megatron([corpus], prefix, read_config=kept, progress=False)
    assert str(e.value) == (
        "--to megatron / tokenize_megatron: a Megatron indexed dataset holds token ids only; "
        "drop --keep-field / extra_fields=('x',)"
    )
    with pytest.raises(ConfigError) as e:
        tokenize_megatron([chat], prefix, progress=False)
    assert str(e.value).startswith("--to megatron / tokenize_megatron: the inputs carry loss_mask")
    assert str(e.value).endswith(
        "write tokenized Parquet (--to parquet / tokenize_corpus) or pack them"
    )
    with pytest.raises(ConfigError) as e:
        tokenize_megatron([corpus], "s3://bucket/d", engine="ray", progress=False)
    assert "into a bucket runs on --engine local / engine='local' (" in str(e.value)
    tokenize_megatron([corpus], prefix, progress=False)
    with pytest.raises(ConfigError) as e:
        tokenize_megatron([corpus], prefix, progress=False)
    assert f"pass --overwrite / overwrite=True to replace {prefix}.bin" in str(e.value)
    with pytest.raises(ConfigError) as e:
        tokenize_megatron([corpus], tmp_path / "e", resume=True, progress=False)
    assert str(e.value).endswith("no interrupted run to resume; drop --resume / resume=True")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".d.idx.packtool.json",
        "c.jsonl",
        "chat.jsonl",
        "d.bin",
        "d.idx",
    ]


def test_one_path_is_one_input_not_its_characters(tmp_path, monkeypatch):
    """Before: `tokenize_megatron("c.jsonl", prefix)` took each character as an input."""
    monkeypatch.chdir(tmp_path)
    Path("c.jsonl").write_text('{"text": "abc"}\n{"text": "hello"}\n')
    summary = tokenize_megatron("c.jsonl", tmp_path / "d", progress=False)
    assert summary.documents == 2


@pytest.mark.parametrize("which", ["corpus.bin", "corpus.idx"])
def test_a_glob_that_reaches_the_output_pair_is_refused(tmp_path, which):
    """Before: `tokenize 'si/*' --to megatron -o si/corpus --overwrite` read its own earlier
    corpus.bin and corpus.idx as two more documents (no skip: uint16 ASCII is valid UTF-8), and
    `'b/*.bin' -o b/corpus` replaced its input corpus.bin; a path given as itself was refused."""
    folder = tmp_path / "si"
    folder.mkdir()
    (folder / "a.jsonl").write_text('{"text": "alpha beta"}\n')
    (folder / which).write_bytes(b"some text here\n")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    for pattern in ("*", f"*{Path(which).suffix}"):
        with pytest.raises(ConfigError, match=rf"output .*{which} is also an input"):
            tokenize_megatron([str(folder / pattern)], folder / "corpus", overwrite=True)
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_a_file_that_is_not_an_index_is_one_line(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"not an index at all, no")
    with pytest.raises(DataError, match="bad header"):
        read_megatron_index(tmp_path / "x.idx")
    head = megatron.INDEX_HEADER + struct.pack("<QBQQ", 1, 8, 5, 6)
    (tmp_path / "y.idx").write_bytes(head + b"\x00" * 30)  # 5 sequences need 126 bytes
    with pytest.raises(DataError, match="not what"):
        read_megatron_index(tmp_path / "y.idx")


# --- the partition engines: any partition size, worker count and engine; --resume ---

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """Raw inputs of four kinds: the sample JSONL (cut into byte ranges at 300 kB), a gzipped
    JSONL (one piece), text files and a Parquet text file of 8 row groups (cut between them)."""
    folder = tmp_path_factory.mktemp("mixed")
    paragraphs = [p for t in stdlib_sample() for p in t.split("\n\n") if p.strip()]
    with gzip.open(folder / "b.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"text": t}) + "\n" for t in paragraphs[:300])
    (folder / "text").mkdir()
    for i, t in enumerate(paragraphs[300:320]):
        (folder / "text" / f"t{i:02d}.txt").write_text(t)
    table = pa.table({"text": paragraphs[320:2320]})
    pq.write_table(table, folder / "c.parquet", row_group_size=250)
    return [SAMPLE, folder / "b.jsonl.gz", folder / "text", folder / "c.parquet"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory, mixed):
    """The pair one process writes reading the inputs one after another (one partition)."""
    prefix = tmp_path_factory.mktemp("whole") / "d"
    summary = tokenize_megatron(mixed, prefix, progress=False)
    assert summary.partitions == 1
    return prefix


PAIR = [".d.idx.packtool.json", "d.bin", "d.idx"]
"""What a finished run leaves beside prefix `d`: the pair and the record of its run."""


def _pair(prefix: Path) -> tuple[bytes, bytes]:
    return Path(f"{prefix}.bin").read_bytes(), Path(f"{prefix}.idx").read_bytes()


@pytest.mark.parametrize("workers", [1, 2])
def test_partitions_and_workers_write_the_bytes_of_one_process(tmp_path, mixed, whole, workers):
    prefix = tmp_path / "d"
    summary = tokenize_megatron(
        mixed, prefix, partition_size=300_000, workers=workers, progress=False
    )
    assert summary.partitions == 12 and summary.resumed_partitions == 0
    assert ("2 partition worker process(es)" in summary.engine) == (workers == 2)
    assert _pair(prefix) == _pair(whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == PAIR  # no staging left
    ds = IndexedDataset(str(prefix))
    assert len(ds) == summary.documents == len(IndexedDataset(str(whole))) > 4024 + 300 + 20
    assert summary.skips == {"empty": 6} and "partitions" in summary.format()


def _interrupt_after(prefix: Path, inputs, finished: int, monkeypatch, **kw) -> Path:
    """Run with one worker until `finished` parts have a record, then Ctrl-C; the staging
    folder (kept for --resume)."""
    from packtool.engines.megatron import part as megatron_part

    staging = staging_folder(Path(f"{prefix}.idx"))
    real = megatron_part.run_part

    def stop(ctx, descriptor):
        if len(records.finished(staging)) >= finished:
            raise KeyboardInterrupt
        return real(ctx, descriptor)

    monkeypatch.setattr(megatron_part, "run_part", stop)
    with pytest.raises(KeyboardInterrupt):
        kw = {"partition_size": 300_000, **kw}
        tokenize_megatron(inputs, prefix, workers=1, progress=False, **kw)
    monkeypatch.undo()
    assert len(records.finished(staging)) == finished
    return staging


def test_resume_after_an_interrupt_and_a_half_done_merge(tmp_path, mixed, whole, monkeypatch):
    prefix = tmp_path / "d"
    staging = _interrupt_after(prefix, mixed, 4, monkeypatch)
    assert not Path(f"{prefix}.idx").exists()  # no dataset until the index is in place
    # What a kill in the middle of the merge of part 4 leaves: its first bytes appended, and
    # the files of part 3, appended whole, not removed yet.
    from packtool.engines.megatron import run as run_module
    from packtool.engines.megatron.part import part_paths

    merged = staging / run_module.MERGED_BIN
    size = merged.stat().st_size
    with merged.open("ab") as f:
        f.write(b"\x01\x02\x03")
    ref_bin = Path(f"{whole}.bin").read_bytes()
    record = records.read_record(staging, 3)
    part_bin, part_lengths = part_paths(staging, 3)
    part_bin.write_bytes(ref_bin[size - record["bin_bytes"] : size])
    part_lengths.write_bytes(b"\0" * (4 * record["documents"]))
    code, out, err = run(
        "tokenize", *mixed, "--to", "megatron", "-o", prefix, "--partition-size", "300000",
        "--resume",
    )  # fmt: skip
    assert code == 0, err
    assert "4 kept from the interrupted run" in out
    assert _pair(prefix) == _pair(whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == PAIR
    code, out, _ = run(
        "tokenize", *mixed, "--to", "megatron", "-o", prefix, "--partition-size", "300000",
        "--resume",
    )  # fmt: skip
    assert code == 0 and "already complete" in out


@pytest.mark.parametrize("step", [1, 2, 3, 4, "deleting"])
def test_a_swap_cut_at_any_step_is_finished_by_the_next_run(
    tmp_path, mixed, whole, monkeypatch, step
):
    """A kill during the commit: after each rename of the swap (the staging folder aside, the
    .bin, the run's record, the .idx), or while the swapped folder is deleted. The last left a half-deleted run
    folder under the staging name, which every later command took for an interrupted run (and
    --resume then failed on its missing files)."""
    from packtool.engines.megatron import swap
    from packtool.storage import writing

    calls = []
    real_replace, real_remove = writing.replace, swap.remove

    def replace(source, target):
        real_replace(source, target)
        calls.append(target)
        if step != "deleting" and len(calls) == step:
            raise KeyboardInterrupt

    def remove(path):
        if step == "deleting" and str(path).endswith(".done") and path.exists():
            (path / ".packtool-run" / "plan.json").unlink()  # half deleted
            raise KeyboardInterrupt
        real_remove(path)

    monkeypatch.setattr(writing, "replace", replace)
    monkeypatch.setattr(swap, "remove", remove)
    prefix = tmp_path / "d"
    with pytest.raises(KeyboardInterrupt):
        tokenize_megatron(mixed, prefix, progress=False)
    monkeypatch.undo()
    code, out, err = run("tokenize", *mixed, "--to", "megatron", "-o", prefix, "--resume")
    assert code == 0, err
    assert _pair(prefix) == _pair(whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == PAIR


def test_kill_9_then_resume_writes_the_same_bytes(tmp_path, mixed, whole):
    prefix = tmp_path / "d"
    staging = staging_folder(Path(f"{prefix}.idx"))
    args = [str(a) for a in ("tokenize", *mixed, "--to", "megatron", "-o", prefix)]
    args += ["--partition-size", "300000", "--workers", "1"]
    # Each part takes at least 0.3 s, so the kill lands while the run goes on.
    script = (
        "import sys, time\n"
        "from packtool.engines.megatron import part as megatron_part\n"
        "real = megatron_part.run_part\n"
        "def slow(ctx, d):\n"
        "    time.sleep(0.3)\n"
        "    return real(ctx, d)\n"
        "megatron_part.run_part = slow\n"
        "from packtool.cli.commands import main\n"
        "main(sys.argv[1:])\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, *args], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(records.finished(staging)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait(30)
    done = len(records.finished(staging))
    assert 3 <= done < 12 and not Path(f"{prefix}.idx").exists()
    code, out, err = run(*args, "--resume")
    assert code == 0, err
    assert f"{done} kept from the interrupted run" in out or f"{done + 1} kept" in out
    assert _pair(prefix) == _pair(whole)


def test_a_killed_swap_is_finished_by_the_next_command(tmp_path, mixed, whole, monkeypatch):
    from packtool.engines.megatron import run as run_module

    prefix = tmp_path / "d"
    real, calls = run_module.finish_swap, []

    def killed(*args):  # the first call (before any work) finds nothing; the second is killed
        calls.append(args)
        if len(calls) == 2:
            raise OSError("killed")
        return real(*args)

    monkeypatch.setattr(run_module, "finish_swap", killed)
    with pytest.raises(OSError):
        tokenize_megatron(mixed, prefix, partition_size=300_000, progress=False)
    monkeypatch.undo()
    staging = staging_folder(Path(f"{prefix}.idx"))
    assert (staging / run_module.READY_IDX).is_file() and not Path(f"{prefix}.idx").exists()
    code, out, err = run(
        "tokenize", *mixed, "--to", "megatron", "-o", prefix, "--partition-size", "300000",
        "--resume",
    )  # fmt: skip
    assert code == 0 and "already complete" in out, err
    assert _pair(prefix) == _pair(whole)
    assert sorted(p.name for p in tmp_path.iterdir()) == PAIR


def test_the_resume_errors_are_one_line(tmp_path, mixed, monkeypatch):
    prefix = tmp_path / "d"
    base = ["tokenize", *mixed, "--to", "megatron", "-o", prefix, "--partition-size", "300000"]
    code, _, err = run(*base, "--resume")
    assert code != 0 and "no interrupted run to resume" in one_error_line(err)
    _interrupt_after(prefix, mixed, 2, monkeypatch)
    code, _, err = run(*base)
    assert code != 0 and "pass --resume / resume=True to finish it" in one_error_line(err)
    code, _, err = run(*base[:-1], "200000", "--resume")
    assert (
        code != 0
        and "options or inputs differ (partition_size: 300000 -> 200000)" in one_error_line(err)
    )
    code, _, err = run("tokenize", *mixed, "-o", tmp_path / "p", "--engine", "ray")
    assert code != 0 and "--engine needs --to megatron" in one_error_line(err)
    code, _, err = run("tokenize", *mixed, "-o", tmp_path / "p", "--resume")
    assert code != 0 and "--resume needs --to megatron" in one_error_line(err)
    code, out, err = run(*base, "--overwrite")  # starts over
    assert code == 0, err


def test_ray_writes_the_local_pair(ray_session, tmp_path, mixed, whole):
    from packtool.engines.ray import RayConfig

    prefix = tmp_path / "d"
    summary = tokenize_megatron(
        mixed,
        prefix,
        partition_size=300_000,
        engine="ray",
        engine_config=RayConfig(actors=1),  # the pair's bytes are the point, not two actors
        progress=False,
    )
    assert "Ray: 2 CPU(s) in the cluster, a Ray Data pool of up to 1 partition" in summary.engine
    assert _pair(prefix) == _pair(whole)


def test_a_document_of_no_token_is_a_counted_skip_not_a_zero_length_document(tmp_path):
    # Whitespace under a tokenizer that drops it, with --no-eos: Megatron took them as documents
    # of length 0 and the summary said "no skips" (pack counts them as empty). With the EOS they
    # were one-token [EOS] documents, where preprocess_data appends no EOD to a document of no
    # ids; and the skips' examples named no line
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {**{f"w{i}": i for i in range(10)}, "[UNK]": 10, "<|endoftext|>": 11}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tok").mkdir()
    tok.save(str(tmp_path / "tok" / "tokenizer.json"))
    texts = ["w1 w2", "   ", "\n\t", "w3"]
    corpus = tmp_path / "ws.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "ws"
    code, text, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", out, "--tokenizer", tmp_path / "tok",
        "--no-eos",
    )  # fmt: skip
    assert code == 0, err
    assert read_megatron_index(tmp_path / "ws.idx")["lengths"].tolist() == [2, 1]
    where = f"empty 2 (e.g. {corpus}:2 (no token after tokenizing), {corpus}:3 (no token"
    assert where in text
    code, text, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", out, "--tokenizer", tmp_path / "tok",
        "--overwrite",
    )  # fmt: skip
    assert code == 0, err
    index = read_megatron_index(tmp_path / "ws.idx")
    assert index["lengths"].tolist() == [3, 2] and where in text  # w1 w2 EOS, w3 EOS
    assert np.fromfile(tmp_path / "ws.bin", dtype=np.uint16).tolist() == [1, 2, 11, 3, 11]


# --- what tools/preprocess_data.py --append-eod writes, special tokens included ---


def _chat_tokenizer(folder: Path, bos: str | None, eos_token: str, text_end: str) -> Path:
    """A word-level tokenizer.json + tokenizer_config.json whose `eos_token` ends a chat turn
    (Qwen's `<|im_end|>`, Llama 3 Instruct's `<|eot_id|>`) beside an end-of-text token; with
    `bos`, a post-processor that puts it first (Llama 3: `<|begin_of_text|> $A`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    specials = [text_end, eos_token] + ([bos] if bos else [])
    vocab = {**{f"w{i}": i for i in range(20)}, "[UNK]": 20}
    vocab |= {s: 21 + i for i, s in enumerate(specials)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, vocab[bos])]
        )
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos_token}
    (folder / "tokenizer_config.json").write_text(json.dumps(config | {"bos_token": bos}))
    return folder


@pytest.mark.parametrize(
    "bos, eos_token, text_end",
    [(None, "<|im_end|>", "<|endoftext|>"), ("<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")],
)
def test_the_bytes_are_preprocess_data_s_for_chat_and_bos_tokenizers(
    tmp_path, bos, eos_token, text_end
):
    # Megatron's end of document is the tokenizer's eos_token (HuggingFaceTokenizer.eod), an
    # end-of-turn token for instruct tokenizers; packtool appended the end-of-text token there
    folder = _chat_tokenizer(tmp_path / "tok", bos, eos_token, text_end)
    texts = ["w1 w2 w3", "w4", "w5 w19 w0 w7", "w9 w9"]
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    # The documented rule, computed with `tokenizers` alone: tokenizer(text) (the
    # post-processor's BOS; preprocess_data from megatron-core 0.17 on), then eos_token's id.
    from tokenizers import Tokenizer

    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    eod = ref.token_to_id(eos_token)
    expected = [ref.encode(t).ids + [eod] for t in texts]
    assert all(d[0] == ref.token_to_id(bos) for d in expected) if bos else True
    # ... which is what megatron-core's own HuggingFaceTokenizer gives (include_special_tokens:
    # the default from megatron-core 0.17; without it, megatron-core 0.15 / 0.16's, --no-bos)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
            HuggingFaceTokenizer,
        )

    for include, flags in ((True, ()), (False, ("--no-bos",))):
        mt = HuggingFaceTokenizer(str(folder), include_special_tokens=include)
        megatron_ids = [list(mt.text_to_ids(t)) + [mt.eod] for t in texts]
        assert megatron_ids == (expected if include else [d[1:] if bos else d for d in expected])
        out = tmp_path / f"d{int(include)}"
        code, text, err = run(
            "tokenize", corpus, "--to", "megatron", "-o", out, "--tokenizer", folder, *flags
        )
        assert code == 0, err
        assert f"eos {eod} {eos_token} (tokenizer_config.json's eos_token, Megatron's EOD)" in text
        _reference(tmp_path / f"ref{int(include)}", megatron_ids, ref.get_vocab_size())
        for suffix in (".bin", ".idx"):
            got = (tmp_path / f"d{int(include)}{suffix}").read_bytes()
            assert got == (tmp_path / f"ref{int(include)}{suffix}").read_bytes()
    # --eos-id still overrides it, and Parquet output keeps the end-of-text token for packing
    code, text, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", tmp_path / "e", "--tokenizer", folder,
        "--eos-id", str(ref.token_to_id(text_end)),
    )  # fmt: skip
    assert code == 0, err
    first = np.fromfile(tmp_path / "e.bin", dtype=np.uint16)[: len(expected[0])]
    assert first.tolist() == expected[0][:-1] + [ref.token_to_id(text_end)]
    code, text, err = run("tokenize", corpus, "-o", tmp_path / "p.parquet", "--tokenizer", folder)
    assert code == 0 and f"eos {ref.token_to_id(text_end)} {text_end} (end of text" in text


def test_whitespace_under_a_bos_tokenizer_is_bos_and_eod_as_in_megatron(tmp_path):
    # docs/integrations.md said a text of no ids (whitespace) is skipped "EOS or not"; under a
    # BOS-adding tokenizer its ids are [BOS], which Megatron's Encoder.encode writes with its EOD
    # (and pack keeps): so does packtool. Without the BOS it is a counted skip.
    folder = _chat_tokenizer(tmp_path / "tok", "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["w1 w2", "   ", "w3"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.tokenizers.text.libraries.huggingface_tokenizer import (
            HuggingFaceTokenizer,
        )

    mt = HuggingFaceTokenizer(str(folder), include_special_tokens=True)
    bos, eod = 23, 22
    assert (list(mt.text_to_ids("   ")), mt.eod) == ([bos], eod)
    for flags, ids, skipped in (
        ((), [bos, 1, 2, eod, bos, eod, bos, 3, eod], False),
        (("--no-eos",), [bos, 1, 2, bos, bos, 3], False),
        (("--no-bos",), [1, 2, eod, 3, eod], True),
    ):
        out = tmp_path / f"d{len(flags)}{''.join(flags)}"
        code, text, err = run(
            "tokenize", corpus, "--to", "megatron", "-o", out, "--tokenizer", folder, *flags
        )
        assert code == 0, err
        assert np.fromfile(f"{out}.bin", dtype=np.uint16).tolist() == ids
        assert (f"empty 1 (e.g. {corpus}:2" in text) == skipped, text


def test_pretokenized_ids_get_the_eos(tmp_path):
    # The summary said "eos 0" and the docs "the ids then the EOS", but none was written:
    # documents ran into each other in Megatron's GPT dataset
    tok = _word_level(tmp_path, 50)
    pq.write_table(pa.table({"input_ids": [[5, 6, 7], [8], [9]]}), tmp_path / "ids.parquet")
    for flags, ids, lengths in (
        (("--eos-id", "0"), [5, 6, 7, 0, 8, 0, 9, 0], [4, 2, 2]),
        ((), [5, 6, 7, 49, 8, 49, 9, 49], [4, 2, 2]),  # the tokenizer's default EOS
        (("--no-eos",), [5, 6, 7, 8, 9], [3, 1, 1]),
    ):
        out = tmp_path / f"d{len(flags)}"
        code, text, err = run(
            "tokenize", tmp_path / "ids.parquet", "--to", "megatron", "-o", out,
            "--tokenizer", tok, *flags,
        )  # fmt: skip
        assert code == 0, err
        assert ("eos none" if flags == ("--no-eos",) else f"eos {ids[3]}") in text
        assert np.fromfile(f"{out}.bin", dtype=np.uint16).tolist() == ids
        assert read_megatron_index(f"{out}.idx")["lengths"].tolist() == lengths


def test_the_note_on_an_eos_past_the_vocabulary_names_the_bin_dtype(tmp_path):
    # It said "(uint16 ids)", tokenized Parquet's dtype, over a .bin of int32
    tok = _word_level(tmp_path, 50)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "w1 w2"}\n')
    code, _, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", tmp_path / "d", "--tokenizer", tok,
        "--eos-id", "65535",
    )  # fmt: skip
    assert code == 0, err
    assert "the dataset's vocabulary becomes 65,536 (int32 ids)" in err
    assert read_megatron_index(tmp_path / "d.idx")["dtype"] == np.int32
    code, _, err = run(
        "tokenize", corpus, "-o", tmp_path / "d.parquet", "--tokenizer", tok, "--eos-id", "65535"
    )
    assert code == 0 and "the dataset's vocabulary becomes 65,536 (uint16 ids)" in err


def test_pre_tokenized_ids_get_the_eos_and_never_a_bos(tmp_path):
    # With --to megatron the ids got the EOS and were otherwise unchanged, yet a BOS tokenizer's
    # BOS was recorded (`bos 0` in the summary and the record; a --resume --no-bos was refused
    # over it), and --bos-id 70000 was taken without a word: written nowhere, recorded, and
    # the .bin widened to int32 for it. --to parquet refused that flag.
    folder = _chat_tokenizer(tmp_path / "tok", "<|begin_of_text|>", "<|eot_id|>", "<|end_of_text|>")
    eot = json.loads((folder / "tokenizer.json").read_text())["model"]["vocab"]["<|eot_id|>"]
    ids = tmp_path / "pre.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([[5, 6, 7], [9, 10]], pa.list_(pa.int32()))}), ids
    )
    out = tmp_path / "a"
    code, text, err = run("tokenize", ids, "--to", "megatron", "-o", out, "--tokenizer", folder)
    assert code == 0, err
    assert "bos none)" in text, text
    index = read_megatron_index(tmp_path / "a.idx")
    assert index["lengths"].tolist() == [4, 3] and index["dtype"] == np.uint16
    assert np.fromfile(tmp_path / "a.bin", np.uint16).tolist() == [5, 6, 7, eot, 9, 10, eot]
    code, text, err = run(
        "tokenize",
        ids,
        "--to",
        "megatron",
        "-o",
        out,
        "--tokenizer",
        folder,
        "--no-bos",
        "--resume",
    )
    assert code == 0 and "nothing to resume" in text + err, err  # the same settings
    code, _, err = run(
        "tokenize", ids, "--to", "megatron", "-o", tmp_path / "b", "--tokenizer", folder,
        "--bos-id", "70000",
    )  # fmt: skip
    last = err.strip().splitlines()[-1]  # (after the notes on the engine and the id's room)
    assert code != 0 and last.startswith(
        "error: --bos-id 70000 / bos=70000 adds nothing to pre-tok"
    ), err
    assert "which get only the EOS with --to megatron" in last and "put it in the ids" in last
    assert not (tmp_path / "b.bin").exists()
