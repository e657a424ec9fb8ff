"""Tokenizer names: `.tiktoken` by suffix, folders, hub ids from a cache folder made here (no
network), tokenizer_config.json defaults, and one-line errors for bad files."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from packtool.errors import ConfigError
from packtool.tokenizer import files as tokenizer_files
from packtool.tokenizer.files import hub_cache, load_tokenizer_config, resolve
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import build


@pytest.fixture(scope="module")
def llama_json(tmp_path_factory) -> Path:
    """Vocabulary with both <|endoftext|>-style names: the config, not the guess, must decide."""
    from tokenizers import Tokenizer

    path = build("llama3", tmp_path_factory.mktemp("llama"))
    tok = Tokenizer.from_file(str(path))
    tok.add_special_tokens(["<|endoftext|>"])  # first in EOS_NAMES: what a guess would pick
    tok.save(str(path))
    return path


def ids(path: Path) -> dict[str, int]:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)


CONFIG = {
    "eos_token": {"content": "<|eot_id|>", "lstrip": False, "special": True},
    "bos_token": "<|begin_of_text|>",
    "added_tokens_decoder": {},
    "chat_template": "{{ messages }}",
}


def make_snapshot(cache: Path, repo: str, tokenizer_json: Path, ref: str = "main",
                  commit: str = "0123abcd", config: dict | None = CONFIG) -> Path:  # fmt: skip
    """The Hugging Face hub cache layout: models--org--name/refs/<ref> + snapshots/<commit>/."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snapshot = repo_dir / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo_dir / "refs").mkdir(exist_ok=True)
    (repo_dir / "refs" / ref).write_text(commit)
    (snapshot / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    if config is not None:
        (snapshot / "tokenizer_config.json").write_text(json.dumps(config))
    return snapshot


@pytest.fixture
def no_download(monkeypatch):
    def refuse(repo_id, revision):
        raise AssertionError("must not download")

    monkeypatch.setattr(tokenizer_files, "download_snapshot", refuse)
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)


def test_hub_id_resolves_from_the_cache_offline(tmp_path, llama_json, no_download, monkeypatch):
    cache = tmp_path / "hub"
    make_snapshot(cache, "acme/llama-mini", llama_json)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    tok = load_tokenizer("acme/llama-mini", bos="default")
    vocab = ids(llama_json)
    assert tok.identity.name == "acme/llama-mini"
    assert tok.identity.engine == "fastokens"
    # Read from tokenizer_config.json, not guessed from the first name in the vocab: its
    # eos_token <|eot_id|> ends a chat turn, so a document ends with the end-of-text token.
    assert tok.identity.eos_id == vocab["<|end_of_text|>"] != vocab["<|endoftext|>"]
    assert tok.identity.bos_id == vocab["<|begin_of_text|>"]
    assert tok.special_names["eos"] == (
        "<|end_of_text|> (end of text; tokenizer_config.json's eos_token <|eot_id|> ends a chat turn)"
    )


def test_hub_cache_locations_and_revisions(tmp_path, llama_json, no_download, monkeypatch):
    home = tmp_path / "hfhome"
    make_snapshot(home / "hub", "acme/m", llama_json, ref="v1", commit="feed")
    monkeypatch.setenv("HF_HOME", str(home))
    assert hub_cache() == home / "hub"
    assert load_tokenizer("acme/m@v1").identity.name == "acme/m@v1"
    assert (
        load_tokenizer("acme/m@feed").identity.sha256 == load_tokenizer("acme/m@v1").identity.sha256
    )
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache() == tmp_path / "xdg" / "huggingface" / "hub"


def test_hub_id_not_cached_offline_names_both_ways(tmp_path, no_download, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as e:
        load_tokenizer("acme/absent")
    msg = str(e.value)
    assert "not in the Hugging Face cache" in msg and str(tmp_path / "empty") in msg
    assert "HF_HUB_OFFLINE is set" in msg
    assert "`hf download acme/absent" in msg and "folder holding tokenizer.json" in msg
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "x"}\n')
    code, _, err = run("stats", corpus, "--tokenizer", "acme/absent")
    assert code == 1 and "not in the Hugging Face cache" in one_error_line(err)


def test_hub_id_download_failure_and_success(tmp_path, llama_json, no_download, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))

    def offline(repo_id, revision):
        raise ConnectionError("no route to host")

    monkeypatch.setattr(tokenizer_files, "download_snapshot", offline)
    with pytest.raises(ConfigError, match=r"not downloaded \(ConnectionError: no route to host\)"):
        load_tokenizer("acme/remote")

    def download(repo_id, revision):  # what huggingface_hub leaves behind: a cached snapshot
        return make_snapshot(cache, repo_id, llama_json, ref=revision)

    monkeypatch.setattr(tokenizer_files, "download_snapshot", download)
    assert load_tokenizer("acme/remote").identity.eos_id == ids(llama_json)["<|end_of_text|>"]
    # Now cached: found without downloading again.
    monkeypatch.setattr(tokenizer_files, "download_snapshot", offline)
    assert load_tokenizer("acme/remote").identity.name == "acme/remote"


def test_a_hub_repository_without_tokenizer_json_says_what_to_pass(tmp_path, monkeypatch):
    """Its line said a SentencePiece-only repository "needs converting with transformers first",
    false since .model files load: it says to pass the downloaded tokenizer.model."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    (snapshot / "tokenizer_config.json").write_text("{}")
    monkeypatch.setattr(tokenizer_files, "download_snapshot", lambda repo_id, revision: snapshot)
    with pytest.raises(ConfigError) as caught:
        load_tokenizer("acme/sp")
    assert "has no tokenizer.json" in str(caught.value)
    # Both callers' forms: `load_tokenizer` / `tokenizer=` reach it as well as the CLI.
    assert str(caught.value).endswith(
        "pass that file (or its folder) as the tokenizer: --tokenizer PATH / tokenizer=PATH"
    )


def test_a_folder_with_tokenizer_json_and_config(tmp_path, llama_json):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes(llama_json.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    tok = load_tokenizer(str(folder))
    assert tok.identity.eos_id == ids(llama_json)["<|end_of_text|>"]
    assert tok.identity.name == str(folder / "tokenizer.json")
    # The file itself picks up the config beside it too.
    assert load_tokenizer(str(folder / "tokenizer.json")).identity.eos_id == tok.identity.eos_id
    code, out, err = run("stats", _corpus(tmp_path), "--tokenizer", folder)
    assert code == 0, err
    assert "eos" in out and "(engine fastokens" in out
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match="tokenizer folder .*empty' has no tokenizer.json"):
        load_tokenizer(str(empty))


def _corpus(tmp_path: Path) -> Path:
    path = tmp_path / "c.jsonl"
    path.write_text('{"text": "hello world"}\n{"text": "again"}\n')
    return path


def test_pack_summary_prints_the_ids_used(tmp_path, llama_json, no_download, monkeypatch):
    cache = tmp_path / "hub"
    make_snapshot(cache, "acme/llama-mini", llama_json)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    code, out, err = run("pack", _corpus(tmp_path), "-o", tmp_path / "p", "--tokenizer", "acme/llama-mini")  # fmt: skip
    assert code == 0, err
    eot = ids(llama_json)["<|end_of_text|>"]
    assert (
        f"tokenizer hf:acme/llama-mini (engine fastokens, vocab {max(ids(llama_json).values()) + 1:,}, "
        f"eos {eot} <|end_of_text|> (end of text; tokenizer_config.json's eos_token <|eot_id|> "
        "ends a chat turn), bos none (the tokenizer adds none))"
    ) in out


def test_tokenizer_config_merging_and_errors(tmp_path):
    (tmp_path / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</s>"}))
    # A legacy config (no added_tokens_decoder) is overridden by special_tokens_map.json ...
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "x": 1}))
    cfg = load_tokenizer_config(tmp_path)
    assert (cfg.eos_token, cfg.data["x"], cfg.chat_template) == ("</s>", 1, None)
    # ... a modern one is not (transformers v4.34+ and v5 read only the config then).
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(CONFIG))
    cfg = load_tokenizer_config(tmp_path)
    assert (cfg.eos_token, cfg.bos_token, cfg.chat_template) == ("<|eot_id|>", "<|begin_of_text|>", "{{ messages }}")  # fmt: skip
    assert load_tokenizer_config(tmp_path / "nothing-here") is None
    (tmp_path / "tokenizer_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"tokenizer_config.json: not a readable JSON file"):
        load_tokenizer_config(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="expected a JSON object, found list"):
        load_tokenizer_config(tmp_path)


def test_a_config_eos_missing_from_the_vocabulary(tmp_path, llama_json):
    (tmp_path / "tokenizer.json").write_bytes(llama_json.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<nope>"}))
    with pytest.raises(ConfigError, match=r"eos_token '<nope>' is not in the tokenizer's vocab.*--eos-id N / eos=N or --no-eos / eos=None$"):  # fmt: skip
        load_tokenizer(str(tmp_path))
    assert load_tokenizer(str(tmp_path), eos=3).identity.eos_id == 3


def test_tiktoken_files_by_suffix(tmp_path):
    ranks = {bytes([i]): i for i in range(256)} | {b"ab": 256}
    path = tmp_path / "mini.tiktoken"
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    for spec in (str(path), f"tiktoken:{path}"):
        files = resolve(spec)
        assert (files.kind, files.path) == ("tiktoken", path)
        tok = load_tokenizer(spec)
        assert (tok.identity.kind, tok.identity.eos_id) == ("tiktoken", 257)
        assert tok.encode("ab").tolist() == [256, 257]
    with pytest.raises(ConfigError, match="tiktoken ranks file .*gone.tiktoken' does not exist"):
        load_tokenizer(str(tmp_path / "gone.tiktoken"))


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ('{"model": {"type": "BPE", "vocab": {', r"tok.json: not a Hugging Face tokenizer.json \("),
        ("{}", r"tok.json: not a Hugging Face tokenizer.json \("),
        (b"\xff\xfe", r"tok.json: cannot read the tokenizer file"),
    ],
)
def test_corrupt_tokenizer_files_are_one_line_errors(tmp_path, content, match):
    path = tmp_path / "tok.json"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError, match=match) as e:
        load_tokenizer(str(path))
    assert "\n" not in str(e.value)
    code, _, err = run("stats", _corpus(tmp_path), "--tokenizer", path)
    assert code == 1 and "tok.json" in one_error_line(err)


def test_a_vocabulary_beyond_the_id_dtype(tmp_path):
    path = tmp_path / "huge.tiktoken"
    ranks = {bytes([i]): i for i in range(256)} | {b"ab": 2**32}
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    with pytest.raises(ConfigError, match=r"huge.tiktoken: the vocabulary has 4,294,967,298 ids, more than the uint32"):  # fmt: skip
        load_tokenizer(str(path))
    with pytest.raises(ConfigError, match=r"eos id must be in \[0, 2\*\*32\)"):
        load_tokenizer("byte", eos=2**32)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("gpt9", "unknown tokenizer 'gpt9'; use 'byte', a tokenizer.json path"),
        ("nope/tokenizer.json", "tokenizer file 'nope/tokenizer.json' does not exist"),
        ("hf:nope", "tokenizer file 'nope' does not exist"),
        # hf: forces a local path: a mistyped folder shaped like a hub id was looked up (and,
        # with network, downloaded) from the Hub
        ("hf:acme/model", "tokenizer file 'acme/model' does not exist"),
    ],
)
def test_unknown_forms(spec, match, no_download):
    with pytest.raises(ConfigError, match=match):
        load_tokenizer(spec)


def test_a_config_nested_too_deep_is_one_line(tmp_path):
    """A tokenizer_config.json nested 100,000 deep was a RecursionError traceback."""
    from packtool.tokenizer.files import load_tokenizer_config

    (tmp_path / "tokenizer_config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="tokenizer_config.json: not a readable JSON file"):
        load_tokenizer_config(tmp_path)
