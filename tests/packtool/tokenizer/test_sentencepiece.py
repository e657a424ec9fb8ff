"""`--tokenizer PATH.model`: SentencePiece models, ids identical to `sentencepiece` itself.

The models are trained at test time with sentencepiece's own trainer on the Python standard
library's sources (BPE with byte fallback, as Llama's and Mistral's; and unigram), or are
Mistral's real ones read from the installed mistral-common package, so nothing is downloaded or
copied into the repository. gigatoken encodes the BPE models (its probe against sentencepiece
passed); sentencepiece itself the unigram ones (gigatoken refuses them).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sentencepiece as spm
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.tokenizer.choice import probe_texts
from packtool.tokenizer.sentencepiece_model import USER_DEFINED, pieces_of_type
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import (
    SENTENCEPIECE_FORMS,
    mistral_model,
    sentencepiece_json,
    stdlib_sample,
)


@functools.cache
def trained(
    model_type: str, folder: str, normalization: str = "identity", user_defined: str = ""
) -> Path:
    """A model trained here; BPE ones normalize as Llama's and Mistral's (`identity`, extra
    whitespace kept) unless told otherwise (sentencepiece's defaults: `nmt_nfkc`, extra
    whitespace removed)."""
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
        normalization_rule_name=normalization if model_type == "bpe" else "nmt_nfkc",
        remove_extra_whitespaces=model_type != "bpe" or normalization != "identity",
        user_defined_symbols=user_defined.split(",") if user_defined else [],
        minloglevel=2,
    )
    return prefix.with_suffix(".model")


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def model(request, tmp_path_factory) -> Path:
    return trained(request.param, str(tmp_path_factory.mktemp(request.param, numbered=False)))


ENGINE = {"bpe": "gigatoken", "unigram": "sentencepiece"}
"""The engine auto picks for each trained model (by its folder's name)."""


def test_the_ids_are_sentencepieces_with_its_bos_and_eos_around_them(model):
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = load_tokenizer(str(model))
    assert (tok.identity.kind, tok.identity.engine) == ("sentencepiece", ENGINE[model.parent.name])
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


@functools.cache
def _bpe_encoders(folder: str, engine: str) -> tuple[spm.SentencePieceProcessor, Any]:
    """sentencepiece and packtool (with `engine`) on the BPE model trained into `folder`: built
    once for all the examples of a test (each example trained a model of its own, 1.6 s)."""
    model = trained("bpe", folder)
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return sp, load_tokenizer(str(model), bos=None, eos=None, engine=engine)


@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("bpe"))


@pytest.mark.parametrize("engine", ["gigatoken", "sentencepiece"])
@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.text(max_size=80), min_size=1, max_size=8))
def test_any_text_encodes_as_sentencepiece_does(bpe_folder, engine, texts):
    sp, tok = _bpe_encoders(bpe_folder, engine)
    assert tok.identity.engine == engine
    flat, lengths = tok.encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in sp.encode(t)]
    assert lengths.tolist() == [len(sp.encode(t)) for t in texts]


def test_a_model_gigatoken_gets_wrong_is_encoded_by_sentencepiece(tmp_path):
    # Under nmt_nfkc normalization gigatoken 0.10 drops a U+0085 that starts a word, where
    # sentencepiece keeps it as byte pieces: the probe holds that case, so the self-check
    # refuses gigatoken and sentencepiece itself encodes (no id ever differs).
    model = trained("bpe", str(tmp_path), "nmt_nfkc")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    tok = load_tokenizer(str(model), bos=None, eos=None)
    assert tok.identity.engine == "sentencepiece"
    assert tok.engine_note.startswith("gigatoken ids differ from the reference on probe text")
    texts = ["\x85", "caf\x85 \x85word", "Latin-1 read of cp1252: \x85 \x93quoted\x94"]
    flat, lengths = tok.encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in sp.encode(t)]
    assert len(sp.encode("\x85")) > 0


@pytest.mark.parametrize("version", ["v1", "v3", "v7"])
def test_mistrals_own_models_encode_as_sentencepiece_does(version, tmp_path):
    """v3 and v7 hold user-defined pieces (`[REF]`, `[REFERENCE_DOC_3]`: always one piece in
    the text), which gigatoken's conversion splits; the probe held no such piece, so gigatoken
    passed and encoded them wrong. v1 has none: gigatoken encodes it."""
    path = tmp_path / "tokenizer.model"
    path.write_bytes(mistral_model(version).read_bytes())
    sp = spm.SentencePieceProcessor(model_file=str(path))
    user = pieces_of_type(sp.serialized_model_proto(), USER_DEFINED)
    assert len(user) == {"v1": 0, "v3": 20, "v7": 22}[version]
    texts = [*stdlib_sample(every=40), *probe_texts(user), "See [REF] and [REFERENCE_DOC_3]."]
    tok = load_tokenizer(str(path), bos=None, eos=None)
    assert tok.identity.engine == ("gigatoken" if version == "v1" else "sentencepiece")
    flat, lengths = tok.encode_batch(texts)
    assert [d.tolist() for d in np.split(flat, np.cumsum(lengths)[:-1])] == sp.encode(texts)


@pytest.mark.parametrize("version", ["v1", "v3"])
def test_mistrals_versioned_file_names_load_as_sentencepiece(version):
    """`tokenizer.model.v1` / `*.model.v3` (the names Mistral's Hub repositories and
    mistral-common ship) were read as a tokenizer.json: "cannot read the tokenizer file ('utf-8'
    codec can't decode ...)", as if damaged. Read in place, under their own names."""
    path = mistral_model(version)
    assert path.name.endswith(f".model.{version}")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    tok = load_tokenizer(str(path), bos=None, eos=None)
    assert tok.identity.kind == "sentencepiece"
    texts = ["Hello world", "See [REF] here.", *stdlib_sample(every=400)]
    flat, _ = tok.encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in sp.encode(t)]
    with pytest.raises(ConfigError, match="SentencePiece model .* does not exist"):
        load_tokenizer(str(path.with_name("gone.model.v3")))


def test_user_defined_pieces_are_read_from_the_model_and_keep_gigatoken_out(tmp_path):
    model = trained("bpe", str(tmp_path), user_defined="<tool>,foo")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    proto = sp.serialized_model_proto()
    assert pieces_of_type(proto, USER_DEFINED) == ["<tool>", "foo"]
    n = sp.get_piece_size()  # the other types, as sentencepiece's own API tells them
    assert pieces_of_type(proto, 3) == [sp.id_to_piece(i) for i in range(n) if sp.IsControl(i)]
    assert pieces_of_type(proto, 6) == [sp.id_to_piece(i) for i in range(n) if sp.IsByte(i)]
    assert pieces_of_type(proto, 2) == [sp.id_to_piece(sp.unk_id())]
    tok = load_tokenizer(str(model), bos=None, eos=None)
    assert tok.identity.engine == "sentencepiece"  # gigatoken encodes "food" as f, oo, d
    assert tok.engine_note.startswith("gigatoken ids differ from the reference on probe text")
    texts = ["food <tool> foo", *stdlib_sample(every=200)]
    flat, _ = tok.encode_batch(texts)
    assert flat.tolist() == [i for t in texts for i in sp.encode(t)]


@pytest.mark.parametrize("form", SENTENCEPIECE_FORMS)
def test_both_tokenizer_json_forms_of_a_real_model_give_sentencepieces_ids(tmp_path, form):
    from tokenizers import Tokenizer

    model = mistral_model("v1")
    sp = spm.SentencePieceProcessor(model_file=str(model))
    path = sentencepiece_json(model, form, tmp_path / form / "tokenizer.json")
    texts = list(stdlib_sample(every=40))
    want = [sp.encode(t) for t in texts]
    hf = Tokenizer.from_file(str(path))  # the file is a faithful conversion ...
    assert [e.ids for e in hf.encode_batch(texts, add_special_tokens=False)] == want
    tok = load_tokenizer(str(path))  # ... which a fast engine encodes, BOS by the post-processor
    # fastokens loads the normalizer form, not the Metaspace one: gigatoken encodes that.
    assert tok.identity.engine == {"normalizer": "fastokens", "metaspace": "gigatoken"}[form]
    assert (tok.identity.bos_id, tok.identity.eos_id) == (sp.bos_id(), sp.eos_id())
    flat, lengths = tok.encode_batch(texts)
    assert [d.tolist() for d in np.split(flat, np.cumsum(lengths)[:-1])] == [
        [1, *w, 2] for w in want
    ]


def test_a_folder_with_tokenizer_model_and_no_tokenizer_json(model):
    tok = load_tokenizer(str(model.parent))
    assert tok.identity.kind == "sentencepiece" and tok.identity.name == str(model)
    # add_bos_token false in the folder's tokenizer_config.json turns the BOS off.
    (model.parent / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    try:
        assert load_tokenizer(str(model.parent)).identity.bos_id is None
    finally:
        (model.parent / "tokenizer_config.json").unlink()
    # `hf:` asks for its tokenizer.json: the refusal said "no tokenizer.json (nor
    # tokenizer.model)" of a folder holding one.
    with pytest.raises(ConfigError, match=r"only a SentencePiece tokenizer.model: drop the 'hf:'"):
        load_tokenizer(f"hf:{model.parent}")


def test_pack_and_verify_with_a_model_file(tmp_path, model):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_sample(every=200)))
    code, out, err = run("pack", corpus, "-o", tmp_path / "p", "--tokenizer", model)
    assert code == 0, err
    assert f"(engine {ENGINE[model.parent.name]}" in out
    assert "bos 1 <s> (the SentencePiece model's BOS)" in out
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
    assert one_error_line(err).count("not a SentencePiece model") == 1  # it was said twice


def test_the_conversion_for_gigatoken_is_kept_and_a_damaged_copy_redone(tmp_path, monkeypatch):
    from gigatoken._load import sentencepiece as conversion

    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(tmp_path / "cache"))
    model = trained("bpe", str(tmp_path))
    sp = spm.SentencePieceProcessor(model_file=str(model))
    texts = list(stdlib_sample(every=150))
    want = [i for t in texts for i in sp.encode(t)]

    def ids() -> list[int]:
        tok = load_tokenizer(str(model), bos=None, eos=None)
        assert tok.identity.engine == "gigatoken"
        return tok.encode_batch(texts)[0].tolist()

    assert ids() == want
    [kept] = (tmp_path / "cache" / "converted").iterdir()
    calls: list[int] = []
    real = conversion.sentencepiece_to_tokenizer_json
    monkeypatch.setattr(
        conversion, "sentencepiece_to_tokenizer_json", lambda d: calls.append(1) or real(d)
    )
    assert ids() == want and calls == []  # read back, not converted
    kept.write_text("{not json")
    assert ids() == want and calls == [1]  # damaged: converted again, and kept again
    assert json.loads(kept.read_text())["model"]["type"] == "BPE"


def test_prompt_completion_records_with_a_model_file(tmp_path):
    # "chat inputs do not support tokenizer kind 'sentencepiece' yet", for prompt-completion too
    model = tmp_path / "tokenizer.model"  # the package's file, under the name packtool knows
    model.symlink_to(mistral_model("v1"))
    pairs = [
        ("Q: 2+2?", " 4"),
        ("Héllo wörld", " ok 🤗"),
        ("", " only a completion"),
        ("The answer is 4", "2"),  # was "4 2": the completion alone began with a dummy "▁"
        ("Say: cat", "s"),
    ]
    corpus = tmp_path / "pc.jsonl"
    corpus.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    code, _, err = run("tokenize", corpus, "-o", tmp_path / "o.parquet", "--tokenizer", model)
    assert code == 0, err
    import pyarrow.parquet as pq

    sp = spm.SentencePieceProcessor(model_file=str(model))
    for row, (p, c) in zip(pq.read_table(tmp_path / "o.parquet").to_pylist(), pairs, strict=True):
        # The completion as it follows its prompt: the joined text's ids after the prompt's (a
        # SentencePiece model prefixes every text it encodes with "▁", so a completion encoded
        # alone read "The answer is 4 2"); where a token crosses the boundary ("cat" + "s":
        # "▁cats") the prompt's own tokens stay, and the completion is encoded alone.
        prompt, joined = sp.encode(p), sp.encode(p + c)
        crossed = joined[: len(prompt)] != prompt
        completion = sp.encode(c) if crossed else joined[len(prompt) :]
        assert crossed == (c == "s")
        assert row["input_ids"] == [sp.bos_id(), *prompt, *completion, sp.eos_id()]
        assert list(row["loss_mask"]) == [0] * (1 + len(prompt)) + [1] * (len(completion) + 1)
        assert crossed or sp.decode(row["input_ids"][1:-1]) == p + c


def test_chat_records_with_a_model_file_say_what_to_pass(tmp_path):
    corpus = tmp_path / "chat.jsonl"
    corpus.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    model = tmp_path / "tokenizer.model"
    model.symlink_to(mistral_model("v1"))
    code, _, err = run("stats", corpus, "--tokenizer", model, "--chat-template", template)
    assert code == 1 and "chat templates need a tokenizer.json" in one_error_line(err)
