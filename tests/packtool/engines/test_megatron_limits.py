"""`tokenize --to megatron` at the edges of the format: ids past int32, prefixes that name no
file, and a full disk during the merge, each one line naming what is wrong."""

from __future__ import annotations

import errno
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.megatron import MegatronWriter, megatron_dtype, megatron_paths
from packtool.engines.megatron.run import tokenize_megatron
from packtool.engines.output_folder import staging_folder
from packtool.errors import ConfigError, DataError
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run

INT32_MAX = 2**31 - 1


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("hi", "there")))
    return path


@pytest.mark.parametrize("flag", ["--eos-id", "--bos-id"])
@pytest.mark.parametrize("value", [2**31, 3_000_000_000, 2**32 - 1])
def test_a_special_id_past_int32_is_refused_in_one_line(tmp_path, corpus, flag, value):
    """Before: `--eos-id 3000000000 --to megatron` was taken, the note said "vocabulary becomes
    3,000,000,001 (int32 ids)", and megatron-core read the end token as -1294967296."""
    out = tmp_path / "d"
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", out, flag, str(value))
    line = one_error_line(err)  # no note before it: the refusal comes first
    assert code != 0 and f"{value + 1:,} ids" in line and "int32" in line, line
    assert f"{INT32_MAX:,}" in line and "--to parquet" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_the_largest_int32_id_is_written_as_it_is(tmp_path, corpus):
    out = tmp_path / "d"
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", out, "--eos-id", INT32_MAX)
    assert code == 0, err
    assert "vocabulary becomes 2,147,483,648 (int32 ids)" in err
    ids = np.fromfile(f"{out}.bin", np.int32).tolist()
    assert ids == [*b"hi", INT32_MAX, *b"there", INT32_MAX]


def test_tokenized_parquet_keeps_uint32_ids_past_int32(tmp_path, corpus):
    """The refusal is Megatron's: tokenized Parquet stores uint32 ids, and takes them."""
    out = tmp_path / "t.parquet"
    code, _, err = run("tokenize", corpus, "-o", out, "--eos-id", "3000000000")
    assert code == 0, err
    ids = pq.read_table(out).column("input_ids").to_pylist()
    assert ids == [[*b"hi", 3_000_000_000], [*b"there", 3_000_000_000]]
    # ... and those ids, read back with their recorded tokenizer, are refused for Megatron
    code, _, err = run("tokenize", out, "--to", "megatron", "-o", tmp_path / "d")
    line = one_error_line(err)
    assert code != 0 and "3,000,000,001 ids" in line and "int32" in line, line
    assert not (tmp_path / "d.bin").exists()


def test_pre_tokenized_ids_past_int32_are_refused(tmp_path):
    """The auditor's second repro: pre-tokenized ids of 2.5e9 under --eos-id 2999999999 were
    written as -1794967296."""
    ids = tmp_path / "pre.parquet"
    pq.write_table(
        pa.table({"input_ids": pa.array([[5, 2_500_000_000, 3]], pa.list_(pa.int64()))}), ids
    )
    code, _, err = run(
        "tokenize", ids, "--to", "megatron", "-o", tmp_path / "d", "--eos-id", "2999999999"
    )
    assert code != 0 and "3,000,000,000 ids" in one_error_line(err)
    assert not (tmp_path / "d.bin").exists()


def test_the_library_refuses_a_vocabulary_past_int32(tmp_path, corpus):
    tok = load_tokenizer("byte", eos=3_000_000_000)
    with pytest.raises(ConfigError, match="int32"):
        tokenize_megatron([corpus], tmp_path / "d", tokenizer=tok, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]
    with pytest.raises(ConfigError, match="int32") as e:
        megatron_dtype(2**31 + 1)
    assert megatron_dtype(2**31) == np.int32
    # Both callers' forms of each choice: `tokenize_megatron(tokenizer=load_tokenizer(eos=))`
    # reaches it as well as the CLI.
    for choice in ("--eos-id N / eos=N", "--bos-id N / bos=N", "--to parquet / tokenize_corpus"):
        assert choice in str(e.value)
    assert str(e.value).startswith("--to megatron / tokenize_megatron: ")


@pytest.mark.parametrize(
    ("dtype", "ids", "bad"),
    [
        (np.int32, pa.array([[1, 2], [3, 3_000_000_000, 4]], pa.list_(pa.uint32())), 3_000_000_000),
        (np.uint16, pa.array([[1], [2], [70_000]], pa.list_(pa.uint32())), 70_000),
        (np.uint16, pa.array([[1], [-1]], pa.list_(pa.int64())), -1),
    ],
)
def test_the_writer_never_narrows_an_id_that_does_not_fit(tmp_path, dtype, ids, bad):
    """Before: `flat.astype(dtype)` wrapped it (3000000000 -> -1294967296) without a word."""
    writer = MegatronWriter(tmp_path / "a.bin", tmp_path / "a.idx", np.dtype(dtype))
    writer.write(pa.table({"input_ids": pa.array([[7]], pa.list_(pa.uint32()))}))
    with pytest.raises(DataError) as caught:
        writer.write(pa.table({"input_ids": ids}))
    document = len(ids) + 1  # the last document of the second table, counting from 1
    message = str(caught.value)
    assert f"document {document}" in message and f"token id {bad}" in message, message
    assert np.dtype(dtype).name in message and "\n" not in message
    writer.abort()


def test_an_id_past_the_bin_dtype_in_a_run_names_its_input_line(tmp_path, corpus, monkeypatch):
    """Should an id still reach the writer past the `.bin`'s dtype (here a dtype made too narrow
    for the byte tokenizer's EOS, 256), the error names the document as the readers do."""
    from packtool.engines.megatron import run as run_module

    monkeypatch.setattr(run_module, "megatron_dtype", lambda vocab: np.dtype(np.int8))
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", tmp_path / "d", "--workers", 1)
    line = one_error_line(err)
    assert code != 0 and f"{corpus}:1" in line and "token id 256" in line, line
    assert "int8" in line, line


@pytest.mark.parametrize("output", [".", "..", "sub/.", "sub/.."])
def test_a_prefix_that_names_a_folder_is_one_line(tmp_path, corpus, monkeypatch, output):
    """Before: `-o .` gave a traceback (ValueError: PosixPath('.') has an empty name)."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub" if output.startswith(".") else tmp_path)
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", output)
    line = one_error_line(err)
    assert code != 0 and "names a file prefix, not a folder" in line, line
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.idx"))


@pytest.mark.parametrize(
    "url", ["s3://mega-bucket", "s3://mega-bucket/.", "gs://b", "hf://datasets/org/name"]
)
def test_a_bucket_or_repository_root_is_no_prefix(url):
    """Before: `-o s3://mega-bucket` wrote objects named `.bin` and `.idx` at the bucket root."""
    with pytest.raises(ConfigError, match="names a file prefix, not a folder"):
        megatron_paths(url)
    bin_path, idx_path = megatron_paths(f"{url.rstrip('.').rstrip('/')}/corpus")
    assert str(bin_path).endswith("/corpus.bin") and str(idx_path).endswith("/corpus.idx")


def test_a_full_disk_in_the_merge_names_the_merged_file(tmp_path, monkeypatch):
    """Before: a disk that filled while a part was appended to the merged `.bin` printed
    `error: No space left on device; finished partitions are kept ...`, naming no file."""
    from packtool.storage import writing

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"doc {i} " * 300}) + "\n" for i in range(60)))

    def full(source, offset, count, out):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writing, "append_range", full)
    code, _, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", tmp_path / "d", "--workers", 1,
        "--partition-size", "30000",
    )  # fmt: skip
    line = one_error_line(err)
    merged = staging_folder(tmp_path / "d.idx") / "merged.bin"
    assert code != 0 and f"{merged}: No space left on device" in line, line


def test_a_failed_read_of_a_part_in_the_merge_names_the_part(tmp_path, monkeypatch):
    """Before: an EIO reading a part while it was appended named the merged `.bin`, the file
    being written, not the one that could not be read."""
    import os

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"doc {i} " * 300}) + "\n" for i in range(60)))

    def unreadable(*args):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "copy_file_range", unreadable, raising=False)
    code, _, err = run(
        "tokenize", corpus, "--to", "megatron", "-o", tmp_path / "d", "--workers", 1,
        "--partition-size", "30000",
    )  # fmt: skip
    line = one_error_line(err)
    assert code != 0 and "Input/output error" in line, line
    assert "part-000001.bin: Input/output error" in line and "merged.bin" not in line, line


def test_a_part_shorter_than_its_record_names_the_part_on_one_line(tmp_path):
    """Before: `[Errno None] .../part-000001.bin: shorter than its footer says: '.../merged.bin'`
    (the error named no file, so the merge's `naming` blamed the merged file)."""
    from packtool.engines.megatron.merge import Merge
    from packtool.engines.megatron.part import part_paths

    for p, size in ((0, 8), (1, 3)):  # part 1 holds 3 of the 8 bytes its record says
        part_bin, part_lengths = part_paths(tmp_path, p)
        part_bin.parent.mkdir(parents=True, exist_ok=True)
        part_bin.write_bytes(b"\0" * size)
        part_lengths.write_bytes(np.array([4], dtype=np.int32).tobytes())
    merge = Merge(tmp_path)
    merge.add({"partition": 0, "bin_bytes": 8, "documents": 1})
    with pytest.raises(OSError) as info:
        merge.add({"partition": 1, "bin_bytes": 8, "documents": 1})
    merge.close()
    assert info.value.filename == str(part_paths(tmp_path, 1)[0])
    assert info.value.errno == errno.EIO
    assert info.value.strerror == "shorter than its footer says"
    assert "merged" not in str(info.value) and "\n" not in str(info.value)


def test_closing_the_merge_closes_both_files_when_the_first_sync_fails(tmp_path, monkeypatch):
    """Before: a failed fsync of the merged `.bin` (a full disk) left `.lengths` open."""
    from packtool.engines.megatron.merge import Merge
    from packtool.engines.megatron.part import part_paths
    from packtool.storage import writing

    part_bin, part_lengths = part_paths(tmp_path, 0)
    part_bin.parent.mkdir(parents=True)
    part_bin.write_bytes(b"\0" * 8)
    part_lengths.write_bytes(np.array([4], dtype=np.int32).tobytes())
    opened = []
    real_open = writing.open_append

    def recording(path, size):
        opened.append(real_open(path, size))
        return opened[-1]

    monkeypatch.setattr(writing, "open_append", recording)
    merge = Merge(tmp_path)
    merge.add({"partition": 0, "bin_bytes": 8, "documents": 1})
    assert len(opened) == 2

    def full(f):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writing, "sync_stream", full)
    with pytest.raises(OSError) as info:
        merge.close()
    assert info.value.filename == str(tmp_path / "merged.bin")
    assert all(f.closed for f in opened)


@pytest.mark.parametrize("output", [".idx", ".bin", "sub/.idx", "sub/.bin"])
def test_a_prefix_with_an_empty_name_once_its_suffix_is_off_is_one_line(
    tmp_path, corpus, monkeypatch, output
):
    """Before: `-o d/.idx` wrote `d/.idx.bin` and `d/.idx.idx`."""
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", output)
    line = one_error_line(err)
    assert code != 0 and "the prefix's name is empty once" in line, line
    assert not list(tmp_path.rglob("*.bin")) and not list(tmp_path.rglob("*.idx"))


def test_a_prefix_given_as_either_file_of_the_pair_names_the_pair(tmp_path):
    for given in ("corpus", "corpus.bin", "corpus.idx", ".hidden.idx"):
        bin_path, idx_path = megatron_paths(tmp_path / given)
        stem = given.removesuffix(".bin").removesuffix(".idx")
        assert (bin_path, idx_path) == (tmp_path / f"{stem}.bin", tmp_path / f"{stem}.idx")


def test_a_bos_unlike_the_recorded_one_is_refused_for_tokenized_parquet(tmp_path, corpus):
    # Before: `tokenize_megatron(tok, prefix, tokenizer=None, bos=5)` wrote the pair with the
    # file's BOS (none), `bos` dropped without a word; `run_pack` and `tokenize_corpus` refuse it.
    from packtool.tokenize.tokenize import tokenize_corpus

    tok = tmp_path / "tok.parquet"
    tokenize_corpus([corpus], tok, progress=False)  # byte: eos 256, bos None
    with pytest.raises(DataError, match=r"but the options give bos 5; pass --no-bos / bos=None"):
        tokenize_megatron([tok], tmp_path / "d", tokenizer=None, bos=5, progress=False)
    assert not (tmp_path / "d.bin").exists() and not (tmp_path / "d.idx").exists()
    summary = tokenize_megatron([tok], tmp_path / "d", tokenizer=None, bos=None, progress=False)
    assert summary.tokenizer["bos_id"] is None  # the file's own choice is accepted
