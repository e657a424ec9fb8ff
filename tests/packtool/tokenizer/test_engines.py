"""Tokenizer engines: every engine path gives the reference library's ids; the choice and its
fallback; forced engines; what is recorded.

Tokenizers are trained at test time (tests/packtool/tokenizer_shapes.py): GPT-2 ByteLevel,
Llama-3 / Qwen Split + ByteLevel(use_regex=False) (Qwen with NFC), a Lowercase normalizer, each
with a `single_word` added token (gigatoken's ids differ: its probe fails, fastokens encodes) and
without (`plain`: gigatoken encodes), and two shapes the fast engines refuse (Metaspace with no
byte fallback, BertNormalizer). Real text: a sample of the Python
standard library's sources; random text: hypothesis (unicode categories, whitespace and digit
runs, special-token look-alikes).
"""

from __future__ import annotations

import base64
import json
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import tiktoken
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError
from packtool.tokenizer import engines as tokenizer_engines
from packtool.tokenizer.choice import probe_texts
from packtool.tokenizer.engines import ENGINE_NAMES, Engine
from packtool.tokenizer.tokenizers import GPT2_PATTERN, load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import (
    FAST_SHAPES,
    GIGATOKEN_SHAPES,
    REFUSED_SHAPES,
    SPECIALS,
    build,
    byte_level_ranks,
    stdlib_sample,
)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("shapes")
    return {s: build(s, root / s) for s in (*FAST_SHAPES, *REFUSED_SHAPES)}


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> dict[str, Path]:
    """FAST_SHAPES without a `single_word` added token."""
    root = tmp_path_factory.mktemp("plain")
    return {s: build(s, root / s, single_word=False) for s in FAST_SHAPES}


@pytest.fixture(scope="module")
def ranks_file(shapes, tmp_path_factory) -> Path:
    """A GPT-2-style tiktoken ranks file (~1,200 ranks) made from the trained byte-level BPE."""
    return byte_level_ranks(shapes["gpt2"], tmp_path_factory.mktemp("ranks") / "bpe.tiktoken")


def split(flat: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]


def hf_reference(path: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(str(path))
    return [lib.encode(t, add_special_tokens=False).ids for t in texts]


def tiktoken_reference(ranks: Path, texts: list[str]) -> list[list[int]]:
    from tiktoken.load import load_tiktoken_bpe

    r = load_tiktoken_bpe(str(ranks))
    enc = tiktoken.Encoding("t", pat_str=GPT2_PATTERN, mergeable_ranks=r, special_tokens={})
    return [enc.encode_ordinary(t) for t in texts]


def engines_for(kind: str) -> list[str]:
    return [e.name for e in tokenizer_engines.ENGINES if kind in e.kinds]


# --- ids: every engine path, real text --------------------------------------------------------


@pytest.mark.parametrize("shape", FAST_SHAPES)
def test_auto_picks_fastokens_unless_the_tokenizer_splits_with_a_pattern(shapes, plain, shape):
    # ByteLevel's own split (gpt2, lowercase): fastokens; a Split regex (llama3, qwen): gigatoken,
    # unless its ids differ (a single_word added token; qwen's NFC), then fastokens.
    split = shape in ("llama3", "qwen")
    tok = load_tokenizer(str(plain[shape]))
    if split and shape not in GIGATOKEN_SHAPES:
        assert tok.identity.engine == "fastokens"
        assert tok.engine_note.startswith("gigatoken ids differ from the reference on probe text")
    else:
        assert (tok.identity.engine, tok.engine_note) == (
            "gigatoken" if split else "fastokens",
            "",
        )
    tok = load_tokenizer(str(shapes[shape]))
    assert tok.identity.engine == "fastokens"
    if split:
        assert tok.engine_note.startswith("gigatoken ids differ from the reference on probe text")
    else:
        assert tok.engine_note == ""


def test_a_split_tokenizer_gigatoken_refuses_goes_to_fastokens(plain, tmp_path):
    spec = json.loads(plain["llama3"].read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    tok = load_tokenizer(str(path))
    assert tok.identity.engine == "fastokens"
    assert (
        tok.engine_note.startswith("gigatoken cannot load it (") and "Lowercase" in tok.engine_note
    )
    texts = list(stdlib_sample()[:20])
    assert split(*tok.encode_batch(texts)) == [
        ids + [tok.identity.eos_id] for ids in hf_reference(path, texts)
    ]


# Every engine that loads each shape (the fast engines refuse REFUSED_SHAPES: tested further down).
ENGINE_PATHS = (
    [(s, "gigatoken") for s in GIGATOKEN_SHAPES]
    + [(s, "fastokens") for s in FAST_SHAPES]
    + [(s, "tokenizers") for s in (*FAST_SHAPES, *REFUSED_SHAPES)]
)


def tokenizer_for(shapes, plain, shape: str, engine: str) -> Path:
    """The file `engine` encodes exactly: gigatoken gets the shapes without `single_word`."""
    return plain[shape] if engine == "gigatoken" else shapes[shape]


@pytest.mark.parametrize(("shape", "engine"), ENGINE_PATHS)
def test_every_engine_gives_the_reference_ids_on_stdlib_sources(shapes, plain, shape, engine):
    texts = [*stdlib_sample(), *probe_texts(SPECIALS[shape] + ["<sep>", "<word>", "def "])]
    path = tokenizer_for(shapes, plain, shape, engine)
    tok = load_tokenizer(str(path), engine=engine, eos=None)
    assert tok.identity.engine == engine
    flat, lengths = tok.encode_batch(texts)
    assert split(flat, lengths) == hf_reference(path, texts)


RANKS_ENGINES = ("gigatoken", "tiktoken")
"""The engines exact on a ranks file of GPT-2's pattern (fastokens splits it at U+180E, so its
probe fails: tested below)."""


@pytest.mark.parametrize("engine", RANKS_ENGINES)
def test_every_engine_gives_tiktokens_ids_on_stdlib_sources(ranks_file, engine):
    texts = [*stdlib_sample(), *probe_texts(["<|endoftext|>"])]
    tok = load_tokenizer(str(ranks_file), engine=engine, eos=None)  # by its suffix
    assert (tok.identity.kind, tok.identity.engine) == ("tiktoken", engine)
    flat, lengths = tok.encode_batch(texts)
    assert split(flat, lengths) == tiktoken_reference(ranks_file, texts)


# --- ids: hypothesis ---------------------------------------------------------------------------

RUN_CHARS = [" ", "\t", "\n", "\r\n", "0", "7", "\u3000", "\u00a0", "a", "日", "😀"]
LOOKALIKES = [
    "<|endoftext|>", "<|endoftext", "<| endoftext |>", "<|im_start|>", "<|im_end|>", "<sep>",
    " <sep>", "<word>", "x<word>y", "def ", "<|begin_of_text|>", "<|eot_id|>", "</s>", "[SEP]",
    "'s", "'LL", "<|", "|>",
]  # fmt: skip
PIECE = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=30),  # every unicode category
    st.tuples(st.sampled_from(RUN_CHARS), st.integers(1, 300)).map(lambda t: t[0] * t[1]),
    st.integers(0, 10**30).map(str),
    st.sampled_from(LOOKALIKES),
)
TEXTS = st.lists(st.lists(PIECE, max_size=8).map("".join), min_size=1, max_size=6)
SLOW = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.mark.parametrize("shape", ["gpt2", "llama3", "qwen", "metaspace"])
@SLOW
@given(texts=TEXTS)
def test_engines_match_tokenizers_on_random_text(shapes, plain, shape, texts):
    for engine in engines_for("hf"):
        if engine in ("gigatoken", "fastokens") and shape in REFUSED_SHAPES:
            continue
        if engine == "gigatoken" and shape not in GIGATOKEN_SHAPES:
            continue
        path = tokenizer_for(shapes, plain, shape, engine)
        want = [ids + [7] for ids in hf_reference(path, texts)]
        assert split(*_cached(path, engine).encode_batch(texts)) == want, engine


@SLOW
@given(texts=TEXTS)
def test_engines_match_tiktoken_on_random_text(ranks_file, texts):
    want = [ids + [7] for ids in tiktoken_reference(ranks_file, texts)]
    for engine in RANKS_ENGINES:
        assert split(*_cached(ranks_file, engine).encode_batch(texts)) == want, engine


_LOADED: dict[tuple[str, str], object] = {}


def _cached(path: Path, engine: str):
    key = (str(path), engine)
    if key not in _LOADED:
        _LOADED[key] = load_tokenizer(str(path), engine=engine, eos=7)
    return _LOADED[key]


# --- the choice, the fallback, forced engines --------------------------------------------------


@pytest.mark.parametrize("shape", REFUSED_SHAPES)
def test_a_refused_tokenizer_falls_back_to_tokenizers(shapes, shape):
    tok = load_tokenizer(str(shapes[shape]), eos=None)
    assert tok.identity.engine == "tokenizers"
    assert "fastokens cannot load it (" in tok.engine_note
    texts = list(stdlib_sample()[:20])
    assert split(*tok.encode_batch(texts)) == hf_reference(shapes[shape], texts)


def test_a_forced_engine_that_cannot_load_is_a_one_line_error(shapes, tmp_path):
    path = shapes["metaspace"]
    with pytest.raises(ConfigError, match=rf"{path}: no tokenizer engine of 'fastokens' can") as e:
        load_tokenizer(str(path), engine="fastokens")
    # Both callers' forms: the line reaches `load_tokenizer(engine=)` as well as the CLI.
    assert "Metaspace" in str(e.value)
    assert str(e.value).endswith("; use --tokenizer-engine auto / engine='auto'")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello"}\n')
    for command in ("tokenize", "stats", "pack"):
        out = ["-o", tmp_path / f"o-{command}.parquet"] if command != "stats" else []
        if command == "pack":
            out = ["-o", tmp_path / "packed"]
        code, _, err = run(command, corpus, *out, "--tokenizer", path, "--tokenizer-engine", "fastokens")  # fmt: skip
        assert code == 1
        assert "no tokenizer engine of 'fastokens'" in one_error_line(err)


def test_engine_names_are_checked(shapes, ranks_file):
    with pytest.raises(
        ConfigError, match=r"unknown tokenizer engine 'fast'; choose auto or one of"
    ):
        load_tokenizer(str(shapes["gpt2"]), engine="fast")
    with pytest.raises(ConfigError, match="engine 'tiktoken' does not load tokenizer.json files"):
        load_tokenizer(str(shapes["gpt2"]), engine="tiktoken")
    with pytest.raises(ConfigError, match="engine 'tokenizers' does not load tiktoken"):
        load_tokenizer(str(ranks_file), engine="tokenizers")
    with pytest.raises(ConfigError, match="does not apply to 'byte'"):
        load_tokenizer("byte", engine="fastokens")
    # A list is tried in order; the reference library may close it.
    assert load_tokenizer(str(shapes["bert"]), engine="fastokens,tokenizers").identity.engine == (
        "tokenizers"
    )
    assert set(ENGINE_NAMES) == {
        "gigatoken",
        "fastokens",
        "tokenizers",
        "tiktoken",
        "sentencepiece",
    }


class _WrongIds:
    """An engine whose ids are off by one: it loads, then fails the probe."""

    def __init__(self, inner):
        self.inner = inner

    def encode(self, texts):
        return self.inner.encode(texts)

    def flat(self, raw):
        flat, lengths = self.inner.flat(raw)
        return flat + np.uint32(1), lengths


def _replaced(name: str, engine: Engine) -> tuple[Engine, ...]:
    return tuple(engine if e.name == name else e for e in tokenizer_engines.ENGINES)


def test_an_engine_that_fails_the_self_check_is_not_used(plain, monkeypatch):
    giga = tokenizer_engines.engine("gigatoken")
    wrong = replace(giga, open=lambda s, w: _WrongIds(giga.open(s, w)))
    monkeypatch.setattr(tokenizer_engines, "ENGINES", _replaced("gigatoken", wrong))
    tok = load_tokenizer(str(plain["llama3"]))  # a Split regex: gigatoken first
    assert tok.identity.engine == "fastokens"
    assert "gigatoken ids differ from the reference on probe text" in tok.engine_note
    with pytest.raises(ConfigError, match="gigatoken ids differ from the reference"):
        load_tokenizer(str(plain["llama3"]), engine="gigatoken")


def test_a_missing_engine_is_skipped(plain, monkeypatch):
    giga = tokenizer_engines.engine("gigatoken")
    gone = replace(giga, module="gigatoken_not_installed")
    monkeypatch.setattr(tokenizer_engines, "ENGINES", _replaced("gigatoken", gone))
    tok = load_tokenizer(str(plain["llama3"]))
    assert tok.identity.engine == "fastokens"
    assert "gigatoken is not installed (pip install gigatoken_not_installed)" in tok.engine_note


NEWER_UNICODE = [
    "x\u0344\u08d1",  # a mark tokenizers' NFC tables give class 0 (gigatoken's reorder it)
    "\u0628\u08d3\u0650 x",
    "\U000113c2\U000113b8",  # a Unicode 16 composition (Tulu-Tigalari)
    " and  \u180e1",  # U+180E: whitespace only before Unicode 6.3 (fastokens' \\s takes it)
    "  \u180e",
]


@pytest.mark.parametrize("which", ["shapes", "plain"])
@pytest.mark.parametrize("shape", FAST_SHAPES)
def test_the_engine_chosen_gives_the_reference_ids_on_newer_unicode(request, which, shape):
    """Before: a Qwen-shaped file (NFC) went to gigatoken, whose NFC follows newer Unicode than
    tokenizers' (x\u0344\u08d1: [160,121,238,159,...] against [160,121,238,139,...]), and a
    Split-regex file gigatoken cannot take went to fastokens, whose \\s matches U+180E; both
    passed the probe and wrote other ids than tokenizers, silently."""
    path = request.getfixturevalue(which)[shape]
    tok = load_tokenizer(str(path), eos=None)
    assert split(*tok.encode_batch(NEWER_UNICODE)) == hf_reference(path, NEWER_UNICODE), (
        tok.identity.engine
    )


@pytest.mark.parametrize("engine", ["auto", "gigatoken", "fastokens", "tiktoken"])
def test_a_ranks_file_engine_gives_tiktokens_ids_on_newer_unicode_or_is_refused(ranks_file, engine):
    # Before: fastokens, forced or chosen where gigatoken cannot take the file, passed the
    # probe and encoded " and  \u180e1" as [..., 220, 220, 157, ...] against tiktoken's 28053.
    try:
        tok = load_tokenizer(str(ranks_file), eos=None, engine=engine)
    except ConfigError as exc:
        assert engine != "auto" and "ids differ from the reference on probe text" in str(exc)
        return
    want = tiktoken_reference(ranks_file, NEWER_UNICODE)
    assert split(*tok.encode_batch(NEWER_UNICODE)) == want, tok.identity.engine


def test_the_probe_holds_the_hard_cases():
    texts = probe_texts(["<|im_start|>"])
    joined = "".join(texts)
    for needle in (
        " " * 300,
        "\n" * 17,
        "0" * 5000,
        "日本語",
        "🤗",
        "<|im_start|>",
        "x<|im_start|>y",
    ):
        assert needle in joined
    assert probe_texts(["<|im_start|>"]) == texts  # deterministic


def test_a_ranks_file_fastokens_refuses_falls_back_to_tiktoken(ranks_file, tmp_path):
    # tiktoken accepts a rank no merge can reach (here one for the text "<|endoftext|>");
    # fastokens refuses it at load.
    path = tmp_path / "odd.tiktoken"
    odd = base64.b64encode(b"<|endoftext|>").decode()
    n = len(ranks_file.read_text().splitlines())
    path.write_text(ranks_file.read_text() + f"{odd} {n}\n")
    tok = load_tokenizer(str(path), eos=None)
    assert tok.identity.engine == "tiktoken"
    assert "fastokens cannot load it (" in tok.engine_note
    texts = ["a <|endoftext|> b", *stdlib_sample()[:10]]
    assert split(*tok.encode_batch(texts)) == tiktoken_reference(path, texts)


def test_tiktoken_encoding_names_use_gigatoken_through_a_ranks_file(ranks_file, monkeypatch):
    # fastokens, which encoded them before, splits GPT-2's pattern at U+180E (the probe says so)
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(ranks_file))
    enc = tiktoken.Encoding(
        "mine", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={"<|endoftext|>": len(ranks)}
    )  # fmt: skip
    monkeypatch.setattr(tiktoken, "list_encoding_names", lambda: ["mine"])
    monkeypatch.setattr(tiktoken, "get_encoding", lambda name: enc)
    tok = load_tokenizer("tiktoken:mine")
    assert (tok.identity.engine, tok.identity.eos_id) == ("gigatoken", len(ranks))
    texts = ["a<|endoftext|>b", *stdlib_sample()[:10], *NEWER_UNICODE]
    assert split(*tok.encode_batch(texts)) == [enc.encode_ordinary(t) + [len(ranks)] for t in texts]


# --- pickling (the Ray engine ships tokenizers to actors) --------------------------------------


@pytest.mark.parametrize("which", ["gpt2", "bert", "ranks"])
def test_engine_tokenizers_pickle(shapes, ranks_file, which):
    path = ranks_file if which == "ranks" else shapes[which]
    tok = load_tokenizer(str(path), workers=2)
    again = pickle.loads(pickle.dumps(tok))
    assert again.identity == tok.identity
    texts = list(stdlib_sample()[:5])
    assert np.array_equal(again.encode_batch(texts)[0], tok.encode_batch(texts)[0])


# --- what is recorded ----------------------------------------------------------------------------


def test_the_engine_is_recorded_and_ignored_when_matching(shapes, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_sample()[:30]))
    path = shapes["gpt2"]
    code, out, err = run("tokenize", corpus, "-o", tmp_path / "t.parquet", "--tokenizer", path)
    assert code == 0, err
    assert "(engine fastokens, vocab" in out
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"packtool"])
    assert meta["tokenizer"]["engine"] == "fastokens"
    # Packed with another engine: the identities match (same ids); index.json records the engine
    # that encoded them.
    code, out, err = run(
        "pack", tmp_path / "t.parquet", "-o", tmp_path / "p", "--tokenizer", path,
        "--tokenizer-engine", "tokenizers", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["tokenizer"]["engine"] == "fastokens"
    index = json.loads((tmp_path / "p" / "index.json").read_text())
    assert index["tokenizer"]["engine"] == "fastokens"
    # Raw input with a forced engine: summary, --json and index.json say which.
    code, out, err = run(
        "pack", corpus, "-o", tmp_path / "q", "--tokenizer", path, "--tokenizer-engine", "tokenizers"
    )  # fmt: skip
    assert code == 0, err
    assert "tokenizer hf:" in out and "(engine tokenizers, vocab" in out
    assert json.loads((tmp_path / "q" / "index.json").read_text())["tokenizer"]["engine"] == (
        "tokenizers"
    )
    code, out, _ = run("stats", corpus, "--tokenizer", path, "--json")
    assert json.loads(out)["inputs"]["tokenizer"]["engine"] == "fastokens"


def test_a_fallback_is_noted_on_stderr(shapes, tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello world"}\n')
    code, out, err = run("stats", corpus, "--tokenizer", shapes["metaspace"])
    assert code == 0
    assert err.startswith("note: fastokens cannot load it (") and "encoding with tokenizers" in err
    assert "gigatoken cannot load it (" in err


def test_split_patterns_are_told_from_token_texts_that_look_like_them():
    from packtool.tokenizer.engines import Source, _splits_with_a_pattern

    def hf(text: str) -> Source:
        return Source(kind="hf", where="t.json", json=text)

    split = {"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}]}}
    assert _splits_with_a_pattern(hf(json.dumps(split)))
    assert _splits_with_a_pattern(hf(json.dumps(split, indent=2)))
    assert not _splits_with_a_pattern(hf(json.dumps({"pre_tokenizer": {"type": "ByteLevel"}})))
    # A token whose text is `"type": "Split"` is stored with its quotes escaped.
    assert not _splits_with_a_pattern(hf(json.dumps({"model": {"vocab": {'"type": "Split"': 7}}})))
    assert _splits_with_a_pattern(Source(kind="tiktoken", where="r.tiktoken"))


@pytest.mark.parametrize("engine", ["auto", "tokenizers"])
def test_a_files_truncation_padding_and_dropout_are_not_applied(plain, tmp_path, engine):
    """A tokenizer.json with a `truncation` block (8 ids) and `padding` (to 16) cut every
    document to 8 ids and filled short ones with pad ids (transformers' tokenizer(text) applies
    neither unless asked), and the truncating reference rejected the fast engines that were
    right; a BPE `dropout` gave other ids each run."""
    from tokenizers import Tokenizer

    base = plain["gpt2"]
    lib = Tokenizer.from_file(str(base))
    lib.enable_truncation(8)
    lib.enable_padding(length=16, pad_id=0, pad_token="<|endoftext|>")
    spec = json.loads(lib.to_str())
    spec["model"]["dropout"] = 0.5
    path = tmp_path / "tokenizer.json"
    path.write_text(json.dumps(spec))
    texts = [*stdlib_sample(every=400), "hi", "x" * 100]
    tok = load_tokenizer(str(path), engine=engine, eos=None)
    if engine == "auto":
        assert tok.identity.engine == "fastokens"  # the probe passes: the reference is whole
    want = hf_reference(base, texts)
    assert max(len(w) for w in want) > 16
    for _ in range(2):  # the same ids each time
        assert split(*tok.encode_batch(texts)) == want
    assert tok.file_note.startswith(
        "tokenizer.json's truncation (max_length 8) and padding and BPE dropout 0.5"
    )
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello world"}\n')
    code, _, err = run("stats", corpus, "--tokenizer", path, "--tokenizer-engine", engine)
    assert code == 0 and err.startswith(f"note: {tok.file_note}\n")
    assert load_tokenizer(str(base), eos=None).file_note == ""  # a file without them


def _depth(value: object) -> int:
    """The plain reference: how deeply a parsed JSON value nests."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


_JSON_TEXT = st.text(alphabet='ab\\"[]{}\n\u0120', max_size=6)
_JSON_VALUE = st.recursive(
    st.none() | st.integers() | _JSON_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_JSON_TEXT, inner, max_size=3),
    max_leaves=30,
)


@given(value=_JSON_VALUE, indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_nesting_depth_equals_the_parsed_depth(value, indent, ascii_only):
    """Strings full of brackets, quotes and backslashes (escaped quotes, escaped backslashes
    before a closing quote) do not count; only the structure does."""
    from packtool.tokenizer.json_settings import nesting_depth

    text = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    assert nesting_depth(text.encode()) == _depth(value)


def test_a_tokenizer_json_nested_too_deep_is_one_line(plain, tmp_path):
    """A tokenizer.json nested 100,000 deep (inside a field the libraries ignore) killed `pack`
    with a segmentation fault in gigatoken's parser: no error, no message. Now no engine is
    handed it. Run in a process of its own, so the old crash fails this test alone."""
    import subprocess
    import sys

    spec = json.loads(Path(plain["gpt2"]).read_text())
    spec["extra"] = json.loads("[" * 100 + "]" * 100)  # parseable here; deepened as text below
    text = json.dumps(spec).replace("[" * 100 + "]" * 100, "[" * 100_000 + "]" * 100_000)
    path = tmp_path / "tokenizer.json"
    path.write_text(text)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello world"}\n')
    for engine in ("auto", "gigatoken"):
        args = ("pack", corpus, "-o", tmp_path / "out", "--tokenizer", path)
        args += ("--tokenizer-engine", engine)
        cmd = [sys.executable, "-m", "packtool.cli.commands", *map(str, args)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert out.returncode == 1, (out.returncode, out.stderr[-500:])
        assert one_error_line(out.stderr) == (
            f"error: {path}: not a usable tokenizer.json (nested deeper than 128 levels, which "
            "the tokenizers library refuses too); check the file (re-download it)"
        )
    # 128 levels is still handed on (the reference library's own limit decides).
    spec["extra"] = json.loads("[" * 126 + "]" * 126)
    path.write_text(json.dumps(spec))
    from packtool.tokenizer.json_settings import nesting_depth

    assert nesting_depth(path.read_bytes()) == 127


def test_encode_checked_blames_the_tokenizer_only_for_a_failure_one_text_reproduces():
    """A batch's failure that no single document reproduces (a thread pool that cannot start a
    thread) was also turned into "this tokenizer cannot encode every text", a ConfigError, so
    `pack` deleted its finished partitions; it is raised as it came now."""
    from packtool.errors import ConfigError
    from packtool.tokenizer.engines import Source, encode_checked

    class Flaky:
        def encode(self, texts):
            if len(texts) > 1:
                raise RuntimeError("can't start new thread")
            if texts[0].startswith("bad"):
                raise Exception("Missing [UNK] token from the vocabulary")
            return [[1] for _ in texts]

    source = Source(kind="hf", where="tok.json")
    with pytest.raises(RuntimeError, match="can't start new thread"):
        encode_checked(Flaky(), ["good", "fine"], source, "tokenizers")
    with pytest.raises(ConfigError, match=r"^tok.json: the tokenizers engine could not encode "
                       r"the text beginning 'bad text' \(Exception: Missing \[UNK\]"):  # fmt: skip
        encode_checked(Flaky(), ["good", "bad text"], source, "tokenizers")


def _panicking_files(tmp_path: Path) -> dict[str, Path]:
    """Tokenizer files on which the reference library panics in Rust while loading: a BPE
    tokenizer.json with a `continuing_subword_prefix` its merges do not carry, and a ranks file
    with a rank given twice."""
    bpe = {
        "version": "1.0", "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True},
        "post_processor": None, "decoder": None,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "##",
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"],
        },
    }  # fmt: skip
    (tmp_path / "prefix.json").write_text(json.dumps(bpe))
    ranks = [bytes([i]) for i in range(256)] + [b"zz"]
    lines = [base64.b64encode(t) + b" %d\n" % i for i, t in enumerate(ranks)]
    lines.append(base64.b64encode(b"yy") + b" 5\n")  # rank 5 again
    (tmp_path / "dup.tiktoken").write_bytes(b"".join(lines))
    return {"tokenizers": tmp_path / "prefix.json", "tiktoken": tmp_path / "dup.tiktoken"}


@pytest.mark.parametrize("engine", ["tokenizers", "tiktoken"])
def test_a_file_the_reference_library_panics_on_is_one_line(tmp_path, engine):
    # pyo3's PanicException is a BaseException: the tokenizers opener caught Exception and the
    # tiktoken one ValueError, so a Rust panic at load was a 120+ line traceback.
    path = _panicking_files(tmp_path)[engine]
    what = "Hugging Face tokenizer.json" if engine == "tokenizers" else "tiktoken ranks file"
    with pytest.raises(ConfigError, match=rf"^{path}: not a {what} \(PanicException: "):
        load_tokenizer(str(path), engine=engine)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "ab"}\n')
    code, _, err = run("tokenize", corpus, "-o", tmp_path / "o.parquet", "--tokenizer", path)
    *notes, line = err.strip().splitlines()
    assert "Traceback" not in err and all(n.startswith("note: ") for n in notes), err
    assert code == 1 and line.startswith(f"error: {path}: not a {what} (PanicException: ")
    assert not (tmp_path / "o.parquet").exists()
