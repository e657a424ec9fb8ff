"""The tokenizer's own special-token rule (packtool/tokenizer/specials.py), against transformers.

By default packtool puts before each document what the tokenizer.json post-processor puts before
a text, so the ids of a document are transformers' `tokenizer(text)["input_ids"]` followed by the
EOS packtool appends as the document boundary. The EOS is the end-of-text token, also where
tokenizer_config.json's `eos_token` ends a chat turn.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import processors

from packtool.errors import ConfigError
from packtool.tokenizer.specials import NOTHING, added_by_post_processor
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run
from tests.packtool.tokenizer_shapes import build, stdlib_sample

POST = {  # shape -> (post-processor, the token it puts first, the token it puts last)
    "llama3": ("template", "<|begin_of_text|>", None),  # Llama 3: Sequence[ByteLevel, Template]
    "metaspace": ("template", "<s>", None),  # Llama 2, Mistral v0.1
    "qwen": (None, None, None),  # Qwen: no post-processor
    "gpt2": ("bytelevel", None, None),  # GPT-2: ByteLevel only
    "bert": ("bert", "[CLS]", "[SEP]"),  # BERT: [CLS] $A [SEP]
}


def with_post_processor(shape: str, folder: Path) -> Path:
    path = build(shape, folder)
    tok = HFTokenizer.from_file(str(path))
    kind, first, last = POST[shape]
    if kind == "template":
        template = processors.TemplateProcessing(
            single=f"{first} $A",
            pair=f"{first} $A {first} $B",
            special_tokens=[(first, tok.token_to_id(first))],
        )
        # Llama 3 ships its template inside a Sequence after ByteLevel.
        tok.post_processor = (
            processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
            if shape == "llama3"
            else template
        )
    elif kind == "bert":
        tok.post_processor = processors.BertProcessing(
            (last, tok.token_to_id(last)), (first, tok.token_to_id(first))
        )
    elif kind == "bytelevel":
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(str(path))
    return path


@pytest.mark.parametrize("shape", sorted(POST))
def test_the_default_bos_is_what_transformers_puts_before_a_text(tmp_path, shape):
    from transformers import AutoTokenizer

    path = with_post_processor(shape, tmp_path / shape)
    ours = load_tokenizer(str(path))
    theirs = AutoTokenizer.from_pretrained(str(tmp_path / shape))
    _, first, last = POST[shape]
    vocab = HFTokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    assert ours.identity.bos_id == (vocab[first] if first else None)
    texts = [t[:3000] for t in stdlib_sample(every=400)]
    flat, lengths = ours.encode_batch(texts)
    start = 0
    for text, n in zip(texts, lengths.tolist(), strict=True):
        doc = flat[start : start + n].tolist()
        start += n
        expected = theirs(text)["input_ids"]
        if last is not None:  # a trailing special of the post-processor: our EOS stands there
            assert expected[-1] == vocab[last] == doc[-1]
        assert doc[:-1] == expected[: len(expected) - (last is not None)]


def test_the_summary_says_where_the_bos_came_from(tmp_path):
    path = with_post_processor("metaspace", tmp_path / "m")
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hello world"}\n{"text": "again"}\n')
    code, out, err = run("pack", corpus, "-o", tmp_path / "p", "--tokenizer", path)
    assert code == 0, err
    bos = HFTokenizer.from_file(str(path)).token_to_id("<s>")
    assert f"bos {bos} <s> (tokenizer.json post-processor TemplateProcessing)" in out
    extra = json.loads((tmp_path / "p" / "index.json").read_text())["extra"]
    assert (
        extra["special_tokens"]["bos"] == "<s> (tokenizer.json post-processor TemplateProcessing)"
    )
    # --no-bos turns it off; --bos-id still overrides; the two together are a mistake.
    code, out, _ = run("pack", corpus, "-o", tmp_path / "q", "--tokenizer", path, "--no-bos")
    assert code == 0 and ", bos none)" in out
    code, out, _ = run("pack", corpus, "-o", tmp_path / "r", "--tokenizer", path, "--bos-id", "7")
    assert code == 0 and ", bos 7)" in out
    code, _, err = run("pack", corpus, "-o", tmp_path / "s", "--tokenizer", path, "--no-bos", "--bos-id", "7")  # fmt: skip
    assert code == 1 and "contradict" in one_error_line(err)


def test_a_tokenizer_that_adds_nothing_gets_no_bos_and_says_so(tmp_path):
    path = with_post_processor("qwen", tmp_path / "q")
    tok = load_tokenizer(str(path))
    assert tok.identity.bos_id is None
    assert tok.special_names["bos"] == "(the tokenizer adds none)"
    assert load_tokenizer("byte").identity.bos_id is None  # byte adds none unless asked


def test_add_bos_token_that_disagrees_with_the_post_processor_is_reported_not_obeyed(tmp_path):
    # transformers 5 follows tokenizer.json's post-processor; the flag is shown so nobody is
    # surprised either way.
    path = with_post_processor("metaspace", tmp_path / "m")
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": False}))
    tok = load_tokenizer(str(path))
    assert tok.identity.bos_id == HFTokenizer.from_file(str(path)).token_to_id("<s>")
    assert "add_bos_token false is not obeyed" in tok.special_names["bos"]
    path = build("qwen", tmp_path / "q")
    (tmp_path / "q" / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True}))
    tok = load_tokenizer(str(path))
    assert tok.identity.bos_id is None and "add_bos_token true" in tok.special_names["bos"]


def test_a_chat_turn_eos_gives_way_to_the_end_of_text_token(tmp_path):
    path = build("llama3", tmp_path / "l")
    vocab = HFTokenizer.from_file(str(path)).get_vocab(with_added_tokens=True)
    config = tmp_path / "l" / "tokenizer_config.json"
    config.write_text(json.dumps({"eos_token": "<|eot_id|>", "bos_token": "<|begin_of_text|>"}))
    tok = load_tokenizer(str(path))
    assert tok.identity.eos_id == vocab["<|end_of_text|>"] != vocab["<|eot_id|>"]
    assert tok.special_names["eos"] == (
        "<|end_of_text|> (end of text; tokenizer_config.json's eos_token <|eot_id|> ends a chat turn)"
    )
    # An eos_token that ends a text is taken as it is; an explicit id always wins.
    config.write_text(json.dumps({"eos_token": "<|end_of_text|>"}))
    assert (
        load_tokenizer(str(path)).special_names["eos"] == "<|end_of_text|> (tokenizer_config.json)"
    )
    assert load_tokenizer(str(path), eos=vocab["<|eot_id|>"]).identity.eos_id == vocab["<|eot_id|>"]


def test_the_post_processor_reader_on_every_shape_it_may_meet():
    def added(processor):
        return added_by_post_processor(json.dumps({"post_processor": processor}))

    template = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<s>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": "</s>", "type_id": 0}},
        ],  # fmt: skip
        "special_tokens": {
            "<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
            "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]},
        },  # fmt: skip
    }
    assert (added(template).first, added(template).last) == (("<s>", 1), ("</s>", 2))
    inside = added({"type": "Sequence", "processors": [{"type": "ByteLevel"}, template]})
    assert inside.first == ("<s>", 1)
    roberta = added({"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]})
    assert (roberta.first, roberta.last) == (("<s>", 0), ("</s>", 2))
    assert added({"type": "ByteLevel"}) == NOTHING
    assert added(None) == NOTHING
    assert added_by_post_processor("not json") == NOTHING
    multi = {**template, "special_tokens": {"<s>": {"id": "<s>", "ids": [1, 5]}}}
    assert added(multi).first is None  # a special of two ids is not one BOS: said so
    assert added(multi).unlike == "special token <s> as the ids [1,5]"
    two = {**template, "single": [template["single"][0], *template["single"]]}
    assert added(two).unlike == "2 special tokens (<s> [1], <s> [1])"
    assert added(template).unlike == ""


def test_several_tokens_before_a_text_are_refused_in_one_line_not_cut_to_one(tmp_path):
    # `<|begin_of_text|> <|eot_id|> $A`: transformers' tokenizer(text) starts [0, 2, ...];
    # packtool kept the first as its BOS, [0, ...], with no word (audit t6 two_before). A
    # dataset records one BOS id, so the default is refused, naming both and the options.
    from transformers import AutoTokenizer

    path = build("llama3", tmp_path / "t", single_word=False)
    tok = HFTokenizer.from_file(str(path))
    first, second = "<|begin_of_text|>", "<|eot_id|>"
    ids = (tok.token_to_id(first), tok.token_to_id(second))
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} {second} $A",
        special_tokens=[(first, ids[0]), (second, ids[1])],
    )
    tok.save(str(path))
    assert AutoTokenizer.from_pretrained(str(path.parent))("hi")["input_ids"][:2] == list(ids)
    message = (
        f"{path}: its post-processor (TemplateProcessing) puts 2 special tokens ({first} "
        f"[{ids[0]}], {second} [{ids[1]}]) before a text, so transformers' tokenizer(text) "
        f"starts with [{ids[0]}, {ids[1]}]; a packtool dataset records one BOS id, and no choice "
        f"gives that prefix: --bos-id {ids[0]} puts {first} alone before each document; "
        f"--bos-id {ids[1]} puts {second} alone before each document; --no-bos puts none (in "
        "Python: bos=ID or bos=None, to load_tokenizer or to any function given the tokenizer by "
        "name)"
    )
    with pytest.raises(ConfigError) as e:
        load_tokenizer(str(path))
    assert str(e.value) == message
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "hi"}\n')
    code, _, err = run("tokenize", corpus, "-o", tmp_path / "o.parquet", "--tokenizer", path)
    assert code == 1 and one_error_line(err) == f"error: {message}"
    chosen = load_tokenizer(str(path), bos=ids[0])  # an explicit choice is taken as it is
    assert chosen.identity.bos_id == ids[0] and chosen.own_ids["bos"] is None
    assert load_tokenizer(str(path), bos=None).identity.bos_id is None


def test_bos_must_be_a_word_it_knows():
    with pytest.raises(ConfigError, match="'default' or 'auto'"):
        load_tokenizer("byte", bos="first")


def test_without_a_config_a_special_eos_beats_a_plain_word_earlier_in_the_list(tmp_path):
    """`<|endoftext|>` comes before `</s>` in the names tried; where the vocabulary holds both and
    only `</s>` is marked special, `</s>` is the tokenizer's end of text."""
    path = build("metaspace", tmp_path / "m")
    tok = HFTokenizer.from_file(str(path))
    tok.add_tokens(["<|endoftext|>"])  # a plain word of the vocabulary, not a special token
    tok.save(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    assert not (tmp_path / "m" / "tokenizer_config.json").exists()
    loaded = load_tokenizer(str(path))
    assert loaded.identity.eos_id == vocab["</s>"] != vocab["<|endoftext|>"]
    assert loaded.special_names["eos"] == "</s>"
    # Where both are special (or neither is), the list's order decides, as documented.
    tok.add_special_tokens(["<|endoftext|>"])
    tok.save(str(path))
    assert load_tokenizer(str(path)).identity.eos_id == vocab["<|endoftext|>"]


@pytest.mark.parametrize("turn_end", ["<|eot|>", "<|return|>", "<|END_OF_TURN_TOKEN|>"])
def test_llama4_gpt_oss_and_command_r_turn_ends_give_way_too(tmp_path, turn_end):
    """Llama 4's `<|eot|>`, gpt-oss's `<|return|>` and Command-R's `<|END_OF_TURN_TOKEN|>`
    were appended as every document's end where the end-of-text token was there."""
    path = build("llama3", tmp_path / "l")
    tok = HFTokenizer.from_file(str(path))
    tok.add_special_tokens([turn_end])
    tok.save(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    (tmp_path / "l" / "tokenizer_config.json").write_text(json.dumps({"eos_token": turn_end}))
    assert load_tokenizer(str(path)).identity.eos_id == vocab["<|end_of_text|>"]


def test_a_chat_turn_eos_never_gives_way_to_a_plain_word(tmp_path):
    """A `</s>` that is only a word of the vocabulary (not special) was every document's EOS
    where tokenizer_config.json names the special `<|im_end|>` and no special end of text is
    there (Qwen's shape, its `<|endoftext|>` renamed)."""
    path = build("qwen", tmp_path / "q")
    spec = json.loads(path.read_text())
    for added in spec["added_tokens"]:
        if added["content"] == "<|endoftext|>":
            added["content"] = "<|pad|>"
    spec["model"]["vocab"]["<|pad|>"] = spec["model"]["vocab"].pop("<|endoftext|>")
    path.write_text(json.dumps(spec))
    tok = HFTokenizer.from_file(str(path))
    tok.add_tokens(["</s>"])  # a plain word
    tok.save(str(path))
    vocab = tok.get_vocab(with_added_tokens=True)
    (tmp_path / "q" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    loaded = load_tokenizer(str(path))
    assert loaded.identity.eos_id == vocab["<|im_end|>"] != vocab["</s>"]
    assert loaded.special_names["eos"] == "<|im_end|> (tokenizer_config.json)"


def test_the_summary_names_special_tokens_map_json_where_the_eos_came_from_it(tmp_path):
    path = build("metaspace", tmp_path / "m")
    tok = HFTokenizer.from_file(str(path))
    tok.add_special_tokens(["<eos2>"])
    tok.save(str(path))
    folder = tmp_path / "m"
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<eos2>"}))
    loaded = load_tokenizer(str(folder))  # no tokenizer_config.json at all
    assert loaded.special_names["eos"] == "<eos2> (special_tokens_map.json)"
    # An old config (no added_tokens_decoder) overridden key by key by the map.
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    assert load_tokenizer(str(folder)).special_names["eos"] == "<eos2> (special_tokens_map.json)"


def test_a_pack_of_tokenized_parquet_records_where_the_eos_and_bos_came_from(tmp_path):
    """index.json's extra.special_tokens (and the summary) said where the EOS / BOS came from
    for a pack of text, nothing for a pack of the same text tokenized first."""
    path = with_post_processor("metaspace", tmp_path / "m")
    (tmp_path / "m" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in stdlib_sample(every=300)))
    code, _, err = run("tokenize", corpus, "-o", tmp_path / "t.parquet", "--tokenizer", path)
    assert code == 0, err
    packed = {}
    for name, source in (("text", corpus), ("tokenized", tmp_path / "t.parquet")):
        out = tmp_path / name
        code, summary, err = run("pack", source, "-o", out, "--max-len", "256", "--tokenizer", path)
        assert code == 0, err
        packed[name] = json.loads((out / "index.json").read_text())["extra"]["special_tokens"]
        assert "</s> (tokenizer_config.json)" in summary
    assert packed["tokenized"] == packed["text"]
    assert packed["text"]["bos"].startswith("<s> (tokenizer.json post-processor")
