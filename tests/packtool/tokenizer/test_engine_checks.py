"""Recorded engine self-checks (packtool/tokenizer/engine_checks.py): a second load of the same tokenizer
skips the reference library and the probe, gives the same ids and identity, and any damaged,
stale or unwritable record only means the check runs again."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from packtool.tokenizer import engine_checks
from packtool.tokenizer import tokenizers as tokenizers_module
from packtool.tokenizer.engine_checks import cache_dir
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.tokenizer_shapes import build, stdlib_sample


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory) -> Path:
    """A Llama-3-shaped tokenizer (a Split regex: gigatoken first, and it passes the probe)."""
    return build("llama3", tmp_path_factory.mktemp("gpt2") / "gpt2", single_word=False)


@pytest.fixture(scope="module")
def single_word(tmp_path_factory) -> Path:
    """A Llama-3 shape with a `single_word` added token: gigatoken fails the probe on it."""
    return build("llama3", tmp_path_factory.mktemp("single") / "llama3")


@pytest.fixture
def records(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(folder))
    return folder / "engine-checks"


@pytest.fixture
def reference_loads(monkeypatch) -> list[str]:
    """Names of the reference libraries `load_tokenizer` opens."""
    opened: list[str] = []
    real = tokenizers_module.engine_open

    def counting(name, source, workers):
        opened.append(name)
        return real(name, source, workers)

    monkeypatch.setattr(tokenizers_module, "engine_open", counting)
    return opened


def ids_and_identity(tok) -> tuple[list[list[int]], dict]:
    texts = [*stdlib_sample()[:10], "<|endoftext|> x<sep>y <word> def f", "  \n\t 123 😀"]
    flat, lengths = tok.encode_batch(texts)
    ends = np.cumsum(lengths)
    docs = [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]
    return docs, tok.identity.to_dict()


def test_the_second_load_uses_the_record_and_gives_the_same_ids(gpt2, records, reference_loads):
    first = load_tokenizer(str(gpt2))
    assert (first.identity.engine, first.engine_check) == ("gigatoken", "probe")
    assert reference_loads == ["tokenizers"]
    [path] = records.iterdir()
    stored = json.loads(path.read_text())
    assert stored["base_vocab"] == first.identity.vocab_size
    assert stored["names"]["<|end_of_text|>"] == first.identity.eos_id
    assert list(stored["proven"]) == ["gigatoken"]

    second = load_tokenizer(str(gpt2))
    assert (second.identity.engine, second.engine_check) == ("gigatoken", "record")
    assert reference_loads == ["tokenizers"]  # not loaded again
    assert ids_and_identity(second) == ids_and_identity(first)
    # Another path to the same bytes is the same tokenizer: the record is by content.
    copy = gpt2.parent.parent / "copy.json"
    copy.write_bytes(gpt2.read_bytes())
    assert load_tokenizer(str(copy)).engine_check == "record"


def test_a_failed_probe_is_recorded_and_the_engine_skipped_next_time(
    single_word, records, reference_loads, monkeypatch
):
    from packtool.tokenizer import engines as tokenizer_engines

    first = load_tokenizer(str(single_word))
    assert (first.identity.engine, first.engine_check) == ("fastokens", "probe")
    assert "gigatoken ids differ from the reference" in first.engine_note
    [path] = records.iterdir()
    stored = json.loads(path.read_text())
    assert (list(stored["proven"]), list(stored["failed"])) == (["fastokens"], ["gigatoken"])
    built: list[str] = []
    engines = tuple(
        replace(e, open=(lambda f, n: lambda s, w: built.append(n) or f(s, w))(e.open, e.name))
        for e in tokenizer_engines.ENGINES
    )
    monkeypatch.setattr(tokenizer_engines, "ENGINES", engines)
    second = load_tokenizer(str(single_word))
    assert (second.identity.engine, second.engine_check) == ("fastokens", "record")
    assert built == ["fastokens"]  # gigatoken not even built
    assert reference_loads == ["tokenizers"]  # nor the reference loaded to fail it again
    assert second.engine_note.startswith("gigatoken ids differ from the reference on probe text")
    assert second.engine_note.endswith("(recorded)")
    assert ids_and_identity(second) == ids_and_identity(first)
    # Under a new gigatoken version the probe runs again (it may pass now).
    real = engine_checks.library_version
    monkeypatch.setattr(
        engine_checks,
        "library_version",
        lambda m: real(m) + "-next" if m == "gigatoken" else real(m),
    )
    built.clear()
    third = load_tokenizer(str(single_word))
    assert built[0] == "gigatoken" and third.identity.engine == "fastokens"


def test_a_refusal_is_recorded_so_the_next_engine_builds_first(records, reference_loads, tmp_path):
    """The Metaspace form: fastokens refuses it, gigatoken encodes it. Once recorded, a load
    builds gigatoken straight away and loads no reference library."""
    from tests.packtool.tokenizer_shapes import mistral_model, sentencepiece_json

    path = sentencepiece_json(mistral_model("v1"), "metaspace", tmp_path / "m" / "tokenizer.json")
    first = load_tokenizer(str(path))
    assert (first.identity.engine, first.engine_check) == ("gigatoken", "probe")
    assert first.engine_note.startswith("fastokens cannot load it (")
    [record] = records.iterdir()
    stored = json.loads(record.read_text())
    assert list(stored["failed"]) == ["fastokens"] and "Metaspace" in stored["why"]["fastokens"]
    second = load_tokenizer(str(path))
    assert (second.identity.engine, second.engine_check) == ("gigatoken", "record")
    assert second.engine_note == first.engine_note + " (recorded)"  # the same reason, kept
    assert reference_loads == ["tokenizers"]  # only the first load needed it
    assert ids_and_identity(second) == ids_and_identity(first)


@pytest.mark.parametrize(
    "damage",
    [
        b"",
        b"\x00\xff garbage",
        b"[1, 2]",
        b'{"key": "wrong"}',
        "names-are-strings",
        "proven-is-a-list",
        "base-vocab-missing",
    ],
)
def test_a_damaged_record_only_means_the_check_runs_again(gpt2, records, reference_loads, damage):
    want = ids_and_identity(load_tokenizer(str(gpt2)))
    [path] = records.iterdir()
    stored = json.loads(path.read_text())
    if damage == "names-are-strings":
        stored["names"] = {k: "50256" for k in stored["names"]}
    elif damage == "proven-is-a-list":
        stored["proven"] = ["gigatoken"]
    elif damage == "base-vocab-missing":
        del stored["base_vocab"]
        stored["proven"] = {}
    path.write_bytes(damage if isinstance(damage, bytes) else json.dumps(stored).encode())
    again = load_tokenizer(str(gpt2))
    assert again.engine_check == "probe"
    assert reference_loads == ["tokenizers", "tokenizers"]
    assert ids_and_identity(again) == want
    assert load_tokenizer(str(gpt2)).engine_check == "record"  # rewritten whole


def test_another_engine_version_runs_the_probe_again(gpt2, records, monkeypatch):
    assert load_tokenizer(str(gpt2)).engine_check == "probe"
    real = engine_checks.library_version
    monkeypatch.setattr(
        engine_checks,
        "library_version",
        lambda m: real(m) + "-rebuilt" if m == "gigatoken" else real(m),
    )
    assert load_tokenizer(str(gpt2)).engine_check == "probe"
    assert load_tokenizer(str(gpt2)).engine_check == "record"


def test_another_reference_version_is_another_record(gpt2, records, monkeypatch):
    load_tokenizer(str(gpt2))
    real = engine_checks.library_version
    monkeypatch.setattr(
        engine_checks,
        "library_version",
        lambda m: real(m) + "-next" if m == "tokenizers" else real(m),
    )
    assert load_tokenizer(str(gpt2)).engine_check == "probe"
    assert len(list(records.iterdir())) == 2


def test_a_stale_record_never_keeps_an_engine_that_now_fails(gpt2, records, monkeypatch):
    """An engine whose ids became wrong under a new version is caught by the probe again."""
    from packtool.tokenizer import engines as tokenizer_engines
    from tests.packtool.tokenizer.test_engines import _WrongIds

    assert load_tokenizer(str(gpt2)).engine_check == "probe"
    giga = tokenizer_engines.engine("gigatoken")
    wrong = replace(giga, open=lambda s, w: _WrongIds(giga.open(s, w)))
    monkeypatch.setattr(
        tokenizer_engines,
        "ENGINES",
        tuple(wrong if e is giga else e for e in tokenizer_engines.ENGINES),
    )
    real = engine_checks.library_version
    monkeypatch.setattr(engine_checks, "library_version", lambda m: real(m) + "-new")
    tok = load_tokenizer(str(gpt2))
    assert tok.identity.engine == "fastokens"
    assert "gigatoken ids differ from the reference" in tok.engine_note


def test_an_unwritable_cache_folder_is_ignored(gpt2, tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", str(blocker))
    for _ in range(2):
        tok = load_tokenizer(str(gpt2))
        assert (tok.identity.engine, tok.engine_check) == ("gigatoken", "probe")
    assert blocker.read_text() == "a file where the cache folder would go"


def test_a_config_token_not_yet_looked_up_loads_the_reference(
    gpt2, tmp_path, records, reference_loads
):
    load_tokenizer(str(gpt2))
    folder = tmp_path / "with-config"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(gpt2.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<sep>"}))
    tok = load_tokenizer(str(folder))
    assert reference_loads == ["tokenizers", "tokenizers"]
    assert tok.engine_check == "record"  # the probe's verdict still holds
    vocab = json.loads(gpt2.read_text())["added_tokens"]
    assert tok.identity.eos_id == next(t["id"] for t in vocab if t["content"] == "<sep>")
    again = load_tokenizer(str(folder))
    assert reference_loads == ["tokenizers", "tokenizers"]
    assert again.identity == tok.identity


def test_the_cache_folder(monkeypatch, tmp_path):
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", "")
    assert cache_dir() is None
    monkeypatch.delenv("PACKTOOL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "packtool"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path("~/.cache/packtool").expanduser()
    assert engine_checks.library_version("no_such_module_here") is None
    assert engine_checks.library_version("fastokens").startswith("0.")


def test_off_writes_nothing_and_skips_no_reference(gpt2, tmp_path, reference_loads, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    for _ in range(2):
        assert load_tokenizer(str(gpt2)).engine_check == "probe"
    assert reference_loads == ["tokenizers", "tokenizers"]
    assert not (tmp_path / "xdg").exists()
    assert "tokenizers" in sys.modules
