"""Tokenizers: ids equal the libraries' own, BOS/EOS, dtype choice, identity, errors."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.dataset.identity import TokenizerIdentity, token_dtype
from packtool.errors import ConfigError
from packtool.tokenizer.tokenizers import (
    BYTE_BOS,
    BYTE_EOS,
    GPT2_PATTERN,
    Tokenizer,
    add_specials,
    load_tokenizer,
)
from tests.cli import run

ROOT = Path(__file__).resolve().parents[3]
SAMPLE_TEXTS = [
    json.loads(line)["text"]
    for line in (ROOT / "sample_data" / "corpus.jsonl")
    .read_text(encoding="utf-8")
    .splitlines()[:300]
]
TEXTS = [
    "hello world",
    "",
    "héllo wörld ✓ λόγος",
    "the theme, then them!\n\n  x",
    *SAMPLE_TEXTS[:40],
]


def split(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]


# --- dtype and the specials helper ------------------------------------------------------------


@pytest.mark.parametrize(
    ("vocab", "dtype"),
    [
        (1, np.uint16),
        (258, np.uint16),
        (65_536, np.uint16),
        (65_537, np.uint32),
        (200_000, np.uint32),
    ],
)
def test_token_dtype(vocab, dtype):
    assert token_dtype(vocab) == dtype


@pytest.mark.parametrize("vocab", [0, -3, 2**32 + 1])
def test_token_dtype_rejects(vocab):
    with pytest.raises(ConfigError, match="vocab_size"):
        token_dtype(vocab)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(st.lists(st.integers(0, 200), max_size=6), max_size=8),
    bos=st.sampled_from([None, 300]),
    eos=st.sampled_from([None, 301]),
)
def test_add_specials_matches_a_plain_reference(docs, bos, eos):
    flat = np.array([t for d in docs for t in d], dtype=np.uint32)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    out, out_lengths = add_specials(flat, lengths, bos, eos, np.dtype(np.uint16))
    want = [
        ([bos] if bos is not None else []) + d + ([eos] if eos is not None else []) for d in docs
    ]
    assert out.dtype == np.uint16
    assert split(out, out_lengths) == want


# --- byte ------------------------------------------------------------------------------------


def test_byte_ids_are_utf8_bytes_plus_eos():
    tok = load_tokenizer("byte")
    flat, lengths = tok.encode_batch(["hé", "", "a"])
    assert split(flat, lengths) == [[104, 195, 169, BYTE_EOS], [BYTE_EOS], [97, BYTE_EOS]]
    assert flat.dtype == np.uint16
    assert lengths.dtype == np.int64
    ident = tok.identity
    assert (ident.kind, ident.vocab_size, ident.eos_id, ident.bos_id) == ("byte", 258, 256, None)


def test_byte_bos_and_no_eos_and_custom_ids():
    assert load_tokenizer("byte", bos="default").encode("a").tolist() == [BYTE_BOS, 97, BYTE_EOS]
    assert load_tokenizer("byte", eos=None).encode("ab").tolist() == [97, 98]
    tok = load_tokenizer("byte", eos=0, bos=1)
    assert tok.encode("a").tolist() == [1, 97, 0]
    assert tok.vocab_size == 258
    big = load_tokenizer("byte", eos=70_000)
    assert big.vocab_size == 70_001
    assert big.dtype == np.uint32
    assert big.encode("a").tolist() == [97, 70_000]


def test_empty_batch():
    flat, lengths = load_tokenizer("byte").encode_batch([])
    assert flat.size == 0
    assert lengths.size == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"eos": "end"}, "eos must be 'default'"),
        ({"bos": True}, "bos must be 'default'"),
        ({"eos": -1}, "eos id must be in"),
        ({"workers": 0}, "workers must be >= 1"),
    ],
)
def test_load_tokenizer_rejects_bad_options(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        load_tokenizer("byte", **kwargs)


def test_unknown_tokenizer_names_the_options():
    with pytest.raises(ConfigError, match=r"unknown tokenizer 'bpe'; use 'byte', a tokenizer.json"):
        load_tokenizer("bpe")
    with pytest.raises(ConfigError, match="tokenizer file 'nope/tokenizer.json' does not exist"):
        load_tokenizer("nope/tokenizer.json")


def test_identity_round_trip_and_matching():
    a = load_tokenizer("byte").identity
    assert TokenizerIdentity.from_dict(json.loads(json.dumps(a.to_dict()))) == a
    renamed = TokenizerIdentity(**{**a.to_dict(), "name": "elsewhere"})
    assert a.matches(renamed)
    assert not a.matches(load_tokenizer("byte", eos=None).identity)


# --- Hugging Face tokenizer.json ---------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_json(tmp_path_factory) -> Path:
    """A small byte-level BPE trained on sample_data at test time (nothing downloaded)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(SAMPLE_TEXTS, trainer=trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_hf_ids_equal_the_library(hf_json):
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(str(hf_json))
    tok = load_tokenizer(str(hf_json))
    eos = lib.token_to_id("<|endoftext|>")
    assert tok.identity.eos_id == eos
    assert tok.identity.kind == "hf"
    assert tok.vocab_size == lib.get_vocab_size(with_added_tokens=True)
    flat, lengths = tok.encode_batch(TEXTS)
    want = [lib.encode(t, add_special_tokens=False).ids + [eos] for t in TEXTS]
    assert split(flat, lengths) == want
    assert flat.dtype == np.uint16


def test_hf_prefix_bos_default_and_folder(hf_json):
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(str(hf_json))
    tok = load_tokenizer(f"hf:{hf_json.parent}", bos="default", eos=None)
    assert tok.encode("the").tolist() == [lib.token_to_id("<s>"), *lib.encode("the").ids]


# Runs in a fresh interpreter: the Rust pools are process-wide and sized once, at the first encode.
POOL_PROBE = """
import os, sys
from packtool.tokenizer.tokenizers import load_tokenizer
workers = None if sys.argv[2] == "none" else int(sys.argv[2])
before = len(os.listdir("/proc/self/task"))
tok = load_tokenizer(sys.argv[1], workers=workers, engine=sys.argv[3])
tok.encode_batch(["some text to encode, " * 20] * 2000)
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
fast = sum(n.startswith("fastokens-") for n in names)
print(os.environ.get("RAYON_NUM_THREADS"), os.environ.get("FASTOKENS_BPE_THREADS"),
      len(names) - before - fast, fast)
"""


def pool_probe(hf_json: Path, workers: str, engine: str, env: dict[str, str]) -> list[str]:
    import os
    import subprocess
    import sys

    clean = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RAYON_NUM_THREADS", "FASTOKENS_BPE_THREADS")
    }
    return subprocess.run(
        [sys.executable, "-c", POOL_PROBE, str(hf_json), workers, engine],
        env={**clean, "TOKENIZERS_PARALLELISM": "true", **env},
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout.split()


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_workers_size_the_rust_thread_pools(hf_json):
    # tokenizers: the threads the first parallel encode starts are rayon's pool: N for --workers N.
    assert pool_probe(hf_json, "1", "tokenizers", {}) == ["1", "1", "1", "0"]
    assert pool_probe(hf_json, "2", "tokenizers", {}) == ["2", "2", "2", "0"]
    # An explicit variable wins over --workers.
    assert pool_probe(hf_json, "1", "tokenizers", {"RAYON_NUM_THREADS": "2"})[::2] == ["2", "2"]
    # Without --workers nothing is set and the libraries pick (all cores).
    assert pool_probe(hf_json, "none", "tokenizers", {})[:2] == ["None", "None"]
    # fastokens: the caller encodes too, so N participants are N - 1 "fastokens-i" threads (the
    # self-check at load also ran the reference library, which started rayon's pool).
    assert pool_probe(hf_json, "1", "fastokens", {})[1::2] == ["1", "0"]
    assert pool_probe(hf_json, "2", "fastokens", {})[1::2] == ["2", "1"]
    assert pool_probe(hf_json, "1", "fastokens", {"FASTOKENS_BPE_THREADS": "2"})[1::2] == ["2", "1"]


def test_hf_errors(hf_json, tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="not a Hugging Face tokenizer.json"):
        load_tokenizer(str(bad))
    # The trained tokenizer has <s> but no [CLS]-style BOS is needed; remove both to see the hint.
    data = json.loads(hf_json.read_text())
    data["added_tokens"] = []
    data["model"]["vocab"] = {
        k: v for k, v in data["model"]["vocab"].items() if not k.startswith("<")
    }
    stripped = tmp_path / "stripped.json"
    stripped.write_text(json.dumps(data))
    with pytest.raises(
        ConfigError,
        match=r"has no default EOS token .*pass --eos-id N / eos=N or --no-eos / eos=None$",
    ):
        load_tokenizer(str(stripped))
    assert load_tokenizer(str(stripped), eos=5).identity.eos_id == 5


# --- tiktoken ----------------------------------------------------------------------------------

MERGES = [b"th", b"he", b"the", b" t", b" the", b"en", b"ti"]


def ranks() -> dict[bytes, int]:
    r = {bytes([i]): i for i in range(256)}
    for m in MERGES:
        r[m] = len(r)
    return r


@pytest.fixture
def ranks_file(tmp_path) -> Path:
    path = tmp_path / "tiny.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for t, i in ranks().items()))
    return path


def test_tiktoken_file_ids_equal_the_library(ranks_file):
    lib = tiktoken.Encoding(
        name="tiny", pat_str=GPT2_PATTERN, mergeable_ranks=ranks(), special_tokens={}
    )
    tok = load_tokenizer(f"tiktoken:{ranks_file}", workers=2)
    eot = len(ranks())
    assert tok.identity.eos_id == eot
    assert tok.vocab_size == eot + 1
    flat, lengths = tok.encode_batch(TEXTS)
    assert split(flat, lengths) == [lib.encode_ordinary(t) + [eot] for t in TEXTS]
    assert tok.encode("the then").tolist()[:2] == [ranks()[b"the"], ranks()[b" the"]]
    # One thread gives the same ids.
    one = load_tokenizer(f"tiktoken:{ranks_file}", workers=1)
    assert np.array_equal(one.encode_batch(TEXTS)[0], flat)


def test_openai_ranks_files_are_known_by_tiktokens_own_hashes():
    from packtool.tokenizer.openai_ranks import known_files

    names = known_files()  # read from tiktoken's constructors, nothing downloaded
    assert {"r50k_base", "p50k_base", "cl100k_base", "o200k_base"} <= set(names.values())
    assert all(len(h) == 64 for h in names)


def test_a_ranks_file_of_an_openai_encoding_splits_with_its_pattern(tmp_path, monkeypatch):
    """`cl100k_base.tiktoken` was split with GPT-2's pattern and got <|endoftext|> after its
    last rank (100256, tiktoken's is 100257). Stand-in: a tiny file known as cl100k's, with
    merges across what the two patterns split differently (digit runs: 1-3 digits in cl100k)."""
    import hashlib

    from packtool.tokenizer import openai_ranks

    r = ranks()
    r |= {b"12": len(r), b"34": len(r) + 1}
    path = tmp_path / "cl100k_base.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {i}\n" for t, i in r.items()))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(openai_ranks, "known_files", lambda: {sha: "cl100k_base"})
    # tiktoken's own cl100k_base() with the tiny ranks in place of the download
    want = openai_ranks._with_loader(lambda *_a, **_k: r, "cl100k_base")
    tok = load_tokenizer(f"tiktoken:{path}", workers=1)
    assert tok.identity.eos_id == want["special_tokens"]["<|endoftext|>"] == 100257
    assert tok.file_note == ""
    lib = tiktoken.Encoding("c", pat_str=want["pat_str"], mergeable_ranks=r, special_tokens={})
    texts = ["the then 12345 DON'T", "  the\n\n the 1234", *TEXTS]
    flat, lengths = tok.encode_batch(texts)
    assert split(flat, lengths) == [lib.encode_ordinary(t) + [100257] for t in texts]
    gpt2 = tiktoken.Encoding("g", pat_str=GPT2_PATTERN, mergeable_ranks=r, special_tokens={})
    assert lib.encode_ordinary("12345") != gpt2.encode_ordinary("12345")  # the patterns differ


def test_another_ranks_file_says_gpt2s_pattern_is_assumed(ranks_file, tmp_path):
    tok = load_tokenizer(f"tiktoken:{ranks_file}", workers=1)
    assert tok.file_note.startswith("tiny.tiktoken is not the ranks file of an OpenAI encoding")
    assert f"<|endoftext|> is id {len(ranks())}" in tok.file_note
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "the then"}\n')
    code, _, err = run("stats", corpus, "--tokenizer", f"tiktoken:{ranks_file}")
    assert code == 0 and f"note: {tok.file_note}" in err


def test_tiktoken_errors(tmp_path, ranks_file):
    with pytest.raises(ConfigError, match=r"unknown tiktoken encoding 'nope'; known: .*gpt2"):
        load_tokenizer("tiktoken:nope")
    with pytest.raises(ConfigError, match="ranks file .*missing.tiktoken' does not exist"):
        load_tokenizer(f"tiktoken:{tmp_path / 'missing.tiktoken'}")
    bad = tmp_path / "bad.tiktoken"
    bad.write_text("this is not base64 ranks\n")
    with pytest.raises(ConfigError, match="not a tiktoken ranks file"):
        load_tokenizer(f"tiktoken:{bad}")
    with pytest.raises(ConfigError, match="has no default BOS token"):
        load_tokenizer(f"tiktoken:{ranks_file}", bos="default")


def test_tiktoken_name_offline_is_a_clear_error(monkeypatch):
    def fail(name):
        raise ConnectionError("no network")

    monkeypatch.setattr(tiktoken, "get_encoding", fail)
    with pytest.raises(ConfigError, match="not in tiktoken's cache .*tiktoken:PATH.tiktoken"):
        load_tokenizer("tiktoken:gpt2")


@settings(max_examples=60, deadline=None)
@given(
    texts=st.lists(st.text(max_size=8), max_size=6),
    bos=st.sampled_from([None, "default", 0]),
    eos=st.sampled_from([None, "default", 7]),
)
def test_byte_fast_path_matches_the_generic_path(texts, bos, eos):
    tok = load_tokenizer("byte", bos=bos, eos=eos)
    flat, lengths = tok.encode_batch(texts)
    # The generic path: per-document id lists, then the shared finish (flatten + specials).
    ref = Tokenizer.finish_batch(tok, tok._library_encode(texts) if texts else None)
    assert flat.dtype == ref[0].dtype
    assert flat.tolist() == ref[0].tolist()
    assert lengths.tolist() == ref[1].tolist()


def test_tokenizers_pickle(ranks_file):
    import pickle

    for tok in (load_tokenizer("byte"), load_tokenizer(f"tiktoken:{ranks_file}", workers=2)):
        tok.encode_batch(TEXTS)  # starts the tiktoken thread pool
        again = pickle.loads(pickle.dumps(tok))
        assert np.array_equal(again.encode_batch(TEXTS)[0], tok.encode_batch(TEXTS)[0])
