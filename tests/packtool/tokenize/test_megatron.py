"""`packtool tokenize --to megatron`: byte-identical to megatron-core's IndexedDatasetBuilder and
read by its IndexedDataset (megatron-core installed by the dev extras: a real reference)."""

from __future__ import annotations

import json
import struct
import warnings

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.dataset import megatron
from packtool.dataset.megatron import MegatronWriter, megatron_dtype, read_megatron_index
from packtool.errors import ConfigError, DataError
from packtool.tokenize.megatron import tokenize_megatron
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx", "ref.bin", "ref.idx"]


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
    # A run that fails (no documents) leaves the old pair as it was and nothing beside it.
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": ""}\n')
    with pytest.raises(DataError, match="no documents"):
        tokenize_megatron([empty], prefix, overwrite=True, progress=False)
    assert (tmp_path / "d.idx").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.bin", "d.idx", "empty.jsonl"]
    tokenize_megatron(
        [corpus],
        prefix,
        overwrite=True,
        tokenizer=load_tokenizer("byte", eos=None),
        progress=False,
    )
    assert (tmp_path / "d.idx").read_bytes() != before
    code, _, err = run("tokenize", corpus, "--to", "megatron", "-o", prefix, "--keep-field", "x")
    assert code != 0 and "drop --keep-field" in one_error_line(err)


def test_inputs_with_a_loss_mask_are_refused(tmp_path):
    chat = tmp_path / "chat.jsonl"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    chat.write_text(json.dumps({"messages": messages}) + "\n")
    with pytest.raises(ConfigError, match="cannot hold"):
        tokenize_megatron([chat], tmp_path / "d", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.jsonl"]


def test_a_file_that_is_not_an_index_is_one_line(tmp_path):
    (tmp_path / "x.idx").write_bytes(b"not an index at all, no")
    with pytest.raises(DataError, match="bad header"):
        read_megatron_index(tmp_path / "x.idx")
    head = megatron.INDEX_HEADER + struct.pack("<QBQQ", 1, 8, 5, 6)
    (tmp_path / "y.idx").write_bytes(head + b"\x00" * 30)  # 5 sequences need 126 bytes
    with pytest.raises(DataError, match="not what"):
        read_megatron_index(tmp_path / "y.idx")
