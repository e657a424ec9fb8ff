"""`bos=` with `tokenizer=None` over tokenized Parquet: no tokenizer is loaded to apply it (the
ids are read as the file records them), and `tokenize_corpus`, `tokenized_batches`,
`compute_stats` and `run_pack` accepted `bos=7` and recorded bos_id None (/tmp/review-b/bt).
The CLI refuses `--bos-id 7` there; the API now does too, with the same line, and accepts a
`bos` that agrees with the file (`None` here)."""

from __future__ import annotations

import json

import pytest

from packtool.engines.config import RunConfig
from packtool.engines.local import run_pack
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.stats.lengths import compute_stats
from packtool.tokenize.tokenize import tokenize_corpus, tokenized_batches


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    d = tmp_path_factory.mktemp("bos")
    corpus = d / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"hi there {i}"}) + "\n" for i in range(5)))
    out = d / "t.parquet"
    tokenize_corpus([str(corpus)], str(out), tokenizer="byte", progress=False)
    return out


CALLS = {
    "tokenize_corpus": lambda t, out, bos: tokenize_corpus(
        [str(t)], str(out / "t2.parquet"), tokenizer=None, bos=bos, progress=False
    ),
    "tokenized_batches": lambda t, out, bos: list(
        tokenized_batches([str(t)], tokenizer=None, bos=bos)
    ),
    "compute_stats": lambda t, out, bos: compute_stats([str(t)], tokenizer=None, bos=bos),
    "run_pack": lambda t, out, bos: run_pack(
        RunConfig(inputs=(str(t),), out_dir=str(out / "p"), pack=PackConfig(max_len=64)),
        None,
        bos=bos,
    ),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_bos_no_tokenizer_applies_is_refused(tokenized, tmp_path, call):
    with pytest.raises((ConfigError, DataError)) as caught:
        CALLS[call](tokenized, tmp_path, 7)
    message = str(caught.value)
    assert "\n" not in message
    assert "bos 7" in message and "bos None" in message, message
    with pytest.raises(ConfigError, match="default"):
        CALLS[call](tokenized, tmp_path, "default")


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_bos_that_agrees_with_the_file_is_accepted(tokenized, tmp_path, call):
    assert CALLS[call](tokenized, tmp_path, None) is not None


@pytest.mark.parametrize("call", sorted(CALLS))
def test_the_refusal_names_the_python_argument_beside_the_flag(tokenized, tmp_path, call):
    # Seen: `bos=7` from Python was told "pass --no-bos (what the file records)", a flag the
    # caller has no way to pass; the line names both forms, as the CLI's line does.
    with pytest.raises(DataError) as caught:
        CALLS[call](tokenized, tmp_path, 7)
    assert "pass --no-bos / bos=None (what the file records)" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        CALLS[call](tokenized, tmp_path, "default")
    message = str(caught.value)
    assert message.startswith("--bos-id default / bos='default': ")
    assert "without a tokenizer (--tokenizer / tokenizer=)" in message
    assert "pass --no-bos / bos=None or leave it out" in message


def test_a_tokenizer_unlike_the_file_s_is_told_to_pass_none(tokenized, tmp_path):
    from tests.packtool.tokenizer_shapes import build

    other = str(build("gpt2", tmp_path / "tok"))
    with pytest.raises(DataError) as caught:
        list(tokenized_batches([str(tokenized)], tokenizer=other))
    assert "leave --tokenizer out / pass tokenizer=None (the file is read" in str(caught.value)


def test_raw_inputs_without_a_tokenizer_name_the_argument(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hi"}\n')
    with pytest.raises(ConfigError, match=r"\(e\.g\. --tokenizer byte / tokenizer='byte'\)$"):
        list(tokenized_batches([str(corpus)], tokenizer=None))
