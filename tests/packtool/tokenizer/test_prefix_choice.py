"""A GLM-4-style tokenizer: its post-processor puts two special tokens before a text
(`[gMASK] <sop> $A`), which a dataset's one BOS id cannot record. The default is refused in a
line that says what the prefix is and what each choice gives, and every API function that loads
a tokenizer by name takes the choice (`bos=`), as the CLI takes `--bos-id` / `--no-bos`."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from packtool.engines.config import RunConfig
from packtool.engines.local import run_pack
from packtool.errors import ConfigError
from packtool.pack.chunk import PackConfig
from packtool.stats.lengths import compute_stats
from packtool.tokenize.tokenize import tokenize_corpus, tokenized_batches
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import build

GMASK, SOP = "[gMASK]", "<sop>"


def glm_like(folder: Path) -> tuple[Path, int, int]:
    """A tokenizer.json whose TemplateProcessing is GLM-4's: `[gMASK] <sop> $A`."""
    path = build("gpt2", folder)
    tok = HFTokenizer.from_file(str(path))
    tok.add_special_tokens([GMASK, SOP])
    ids = tok.token_to_id(GMASK), tok.token_to_id(SOP)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{GMASK} {SOP} $A", special_tokens=[(GMASK, ids[0]), (SOP, ids[1])]
    )
    tok.save(str(path))
    assert tok.encode("hi").ids[:2] == list(ids)  # what transformers' tokenizer(text) starts with
    return path, *ids


def expected_message(path: Path, g: int, s: int) -> str:
    return (
        f"{path}: its post-processor (TemplateProcessing) puts 2 special tokens ({GMASK} [{g}], "
        f"{SOP} [{s}]) before a text, so transformers' tokenizer(text) starts with [{g}, {s}]; "
        "a packtool dataset records one BOS id, and no choice gives that prefix: "
        f"--bos-id {g} puts {GMASK} alone before each document; --bos-id {s} puts {SOP} alone "
        "before each document; --no-bos puts none (in Python: bos=ID or bos=None, to "
        "load_tokenizer or to any function given the tokenizer by name)"
    )


def test_two_tokens_before_a_text_are_refused_saying_what_each_choice_gives(tmp_path):
    path, g, s = glm_like(tmp_path / "glm")
    with pytest.raises(ConfigError) as e:
        load_tokenizer(str(path))
    assert str(e.value) == expected_message(path, g, s)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hi there"}\n')
    code, _, err = run("tokenize", corpus, "-o", tmp_path / "o.parquet", "--tokenizer", path)
    assert code == 1 and one_error_line(err) == f"error: {expected_message(path, g, s)}"
    # Each choice gives what the message says: one of the two ids first, or the text's own.
    text = HFTokenizer.from_file(str(path)).encode("hi there", add_special_tokens=False).ids
    for bos, first in ((g, [g]), (s, [s]), (None, [])):
        tok = load_tokenizer(str(path), bos=bos)
        flat, lengths = tok.encode_batch(["hi there"])
        assert flat.tolist()[: len(first) + len(text)] == first + text


def test_the_api_functions_given_the_tokenizer_by_name_take_the_choice(tmp_path):
    path, g, s = glm_like(tmp_path / "glm")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"hi there {i}"}) + "\n" for i in range(5)))

    with pytest.raises(ConfigError, match=r"^.*no choice gives that prefix"):
        tokenize_corpus([corpus], tmp_path / "refused.parquet", tokenizer=str(path))
    tokenize_corpus([corpus], tmp_path / "t.parquet", tokenizer=str(path), bos=s)
    first = pq.read_table(tmp_path / "t.parquet").column("input_ids").to_pylist()[0]
    assert first[0] == s

    tables = list(tokenized_batches([corpus], tokenizer=str(path), bos=None))
    assert tables[0].column("input_ids").to_pylist()[0][0] not in (g, s)

    stats = compute_stats([corpus], tokenizer=str(path), bos=g)
    assert stats.inputs["tokenizer"]["bos_id"] == g

    config = RunConfig(
        inputs=(str(corpus),), out_dir=str(tmp_path / "packed"), pack=PackConfig(max_len=64)
    )
    with pytest.raises(ConfigError, match=r"no choice gives that prefix"):
        run_pack(config, str(path))
    run_pack(config, str(path), bos=g)
    index = json.loads((tmp_path / "packed" / "index.json").read_text())
    assert index["tokenizer"]["bos_id"] == g

    # A Tokenizer object carries its own choice: a `bos` beside it is refused, not ignored.
    with pytest.raises(ConfigError, match=r"^bos=None applies to a tokenizer given by name"):
        run_pack(config, load_tokenizer(str(path), bos=g), bos=None)
