"""The early fastokens build: started before the tokenizer modules load, taken by fastokens'
opener only for the very text it read; everything else (choice, ids, errors) unchanged."""

from __future__ import annotations

import threading
from pathlib import Path

import fastokens
import pytest

from packtool import engine_prebuild
from packtool.cli_sft import CorpusOptions
from packtool.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import REFUSED_SHAPES, build, stdlib_sample


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    return build("gpt2", tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(autouse=True)
def nothing_held():
    engine_prebuild._held.clear()
    yield
    engine_prebuild._held.clear()


def _counting(monkeypatch) -> list[str]:
    """Record the thread of every fastokens build from a tokenizer.json text."""
    threads: list[str] = []
    real = fastokens.Tokenizer.from_json_str

    def counted(text, *args, **kw):
        threads.append(threading.current_thread().name)
        return real(text, *args, **kw)

    monkeypatch.setattr(fastokens.Tokenizer, "from_json_str", staticmethod(counted))
    return threads


def test_the_command_builds_once_early_and_the_ids_are_the_same(gpt2, monkeypatch):
    texts = list(stdlib_sample(every=400, max_chars=5_000))
    plain = load_tokenizer(str(gpt2))  # no early build: the opener builds
    threads = _counting(monkeypatch)
    options = CorpusOptions("text", None, str(gpt2), None, False, None, False, "auto")
    early = options.load_tokenizer()
    assert len(threads) == 1 and threads[0].startswith("packtool-prebuild")
    assert early.identity.engine == plain.identity.engine == "fastokens"
    for a, b in zip(early.encode_batch(texts), plain.encode_batch(texts), strict=True):
        assert a.tolist() == b.tolist()
    assert engine_prebuild._held == []  # taken


def test_another_text_is_built_as_before_and_the_early_one_stays(gpt2, tmp_path, monkeypatch):
    assert engine_prebuild.start(str(gpt2))
    other = tmp_path / "tokenizer.json"
    other.write_text(gpt2.read_text().replace('"<sep>"', '"<sep2>"'))
    threads = _counting(monkeypatch)
    load_tokenizer(str(other))  # its own text: the opener builds it
    assert threads and not any(t.startswith("packtool-prebuild") for t in threads)
    assert engine_prebuild.take(gpt2.read_text()) is not None


@pytest.mark.parametrize(
    "spec, engine",
    [
        ("byte", "auto"),
        ("missing.json", "auto"),
        ("GPT2", "auto"),  # a folder or a hub id: resolved by load_tokenizer
        ("TOK", "tokenizers"),
        ("TOK", "tokenizers,fastokens"),
        ("RANKS", "auto"),
    ],
)
def test_what_is_not_built_early(gpt2, tmp_path, spec, engine):
    ranks = tmp_path / "gpt2.tiktoken"
    ranks.write_text("IQ== 0\n")
    spec = {"GPT2": str(gpt2.parent), "TOK": str(gpt2), "RANKS": str(ranks)}.get(spec, spec)
    assert not engine_prebuild.start(spec, engine)
    assert engine_prebuild._held == []


def test_fastokens_named_first_is_built_early(gpt2):
    assert engine_prebuild.start(str(gpt2), " fastokens , tokenizers")
    assert engine_prebuild.take(gpt2.read_text()) is not None
    assert engine_prebuild.take(gpt2.read_text()) is None  # handed over once


@pytest.mark.parametrize("shape", REFUSED_SHAPES)
def test_a_refused_tokenizer_falls_back_with_the_same_note(shape, tmp_path):
    path = build(shape, tmp_path / shape)
    before = load_tokenizer(str(path))
    assert engine_prebuild.start(str(path))
    after = load_tokenizer(str(path))
    assert before.identity.engine == after.identity.engine == "tokenizers"
    assert before.engine_note == after.engine_note and "fastokens" in after.engine_note


def test_a_corrupt_tokenizer_json_gives_the_same_one_line_error(tmp_path, monkeypatch):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": ')
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello"}\n')
    args = ("pack", corpus, "-o", tmp_path / "out", "--max-len", "64", "--tokenizer", bad)
    code, _, early = run(*args)
    assert code == 1 and str(bad) in one_error_line(early)
    monkeypatch.setattr(engine_prebuild, "start", lambda *a: False)
    code, _, late = run(*args)
    assert code == 1 and one_error_line(late) == one_error_line(early)
