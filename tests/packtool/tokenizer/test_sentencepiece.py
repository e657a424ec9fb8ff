"""`--tokenizer PATH.model`: SentencePiece models, ids identical to `sentencepiece` itself.

The models are trained at test time with sentencepiece's own trainer on the Python standard
library's sources (BPE with byte fallback, as Llama's and Mistral's; and unigram), so nothing
is downloaded or copied into the repository.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import stdlib_sample


@functools.cache
def trained(model_type: str, folder: str) -> Path:
    prefix = Path(folder) / "tokenizer"
    spm.SentencePieceTrainer.train(
        # one line a sentence: sentencepiece skips sentences over 4,192 bytes
        sentence_iterator=(
            line for text in stdlib_sample(every=60) for line in text.splitlines() if line.strip()
        ),
        model_prefix=str(prefix),
        vocab_size=1000,
        model_type=model_type,
        byte_fallback=model_type == "bpe",
        character_coverage=1.0,
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def model(request, tmp_path_factory) -> Path:
    return trained(request.param, str(tmp_path_factory.mktemp(request.param)))


def test_the_ids_are_sentencepieces_with_its_bos_and_eos_around_them(model):
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = load_tokenizer(str(model))
    assert (tok.identity.kind, tok.identity.engine) == ("sentencepiece", "sentencepiece")
    assert (tok.identity.bos_id, tok.identity.eos_id) == (sp.bos_id(), sp.eos_id())
    assert tok.identity.vocab_size == sp.get_piece_size()
    forced = load_tokenizer(str(model), bos="default")  # the model's own BOS piece, always
    assert forced.identity.bos_id == sp.bos_id()
    assert forced.special_names["bos"] == "<s> (the SentencePiece model's BOS)"
    texts = list(stdlib_sample(every=90))
    flat, lengths = tok.encode_batch(texts)
    start = 0
    for text, n in zip(texts, lengths.tolist(), strict=True):
        assert flat[start : start + n].tolist() == [sp.bos_id(), *sp.encode(text), sp.eos_id()]
        start += n


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=80), min_size=1, max_size=8))
def test_any_text_encodes_as_sentencepiece_does(tmp_path_factory, texts):
    model = trained("bpe", str(tmp_path_factory.mktemp("bpe")))
    sp = spm.SentencePieceProcessor(model_file=str(model))
    flat, lengths = load_tokenizer(str(model), bos=None, eos=None).encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in sp.encode(t)]
    assert lengths.tolist() == [len(sp.encode(t)) for t in texts]


def test_a_folder_with_tokenizer_model_and_no_tokenizer_json(model):
    tok = load_tokenizer(str(model.parent))
    assert tok.identity.kind == "sentencepiece" and tok.identity.name == str(model)
    # add_bos_token false in the folder's tokenizer_config.json turns the BOS off.
    (model.parent / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    try:
        assert load_tokenizer(str(model.parent)).identity.bos_id is None
    finally:
        (model.parent / "tokenizer_config.json").unlink()


def test_pack_and_verify_with_a_model_file(tmp_path, model):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_sample(every=200)))
    code, out, err = run("pack", corpus, "-o", tmp_path / "p", "--tokenizer", model)
    assert code == 0, err
    assert "(engine sentencepiece" in out and "bos 1 <s> (the SentencePiece model's BOS)" in out
    assert run("verify", tmp_path / "p")[0] == 0
    index = json.loads((tmp_path / "p" / "index.json").read_text())
    assert index["tokenizer"]["kind"] == "sentencepiece"


def test_bad_model_files_and_engines_are_one_line(tmp_path, model):
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a model")
    with pytest.raises(ConfigError, match="not a SentencePiece model"):
        load_tokenizer(str(bad))
    with pytest.raises(ConfigError, match="does not exist"):
        load_tokenizer(str(tmp_path / "missing.model"))
    with pytest.raises(ConfigError, match="does not load SentencePiece models"):
        load_tokenizer(str(model), engine="tokenizers")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "x"}\n')
    code, _, err = run("stats", corpus, "--tokenizer", bad)
    assert code == 1 and "bad.model: not a SentencePiece model" in one_error_line(err)
