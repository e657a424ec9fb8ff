"""Chat templates: packtool's text, ids and masks equal transformers' on TRL's real templates.

With `{% generation %}` blocks: text, ids and assistant mask equal `apply_chat_template(...,
tokenize=True, return_dict=True, return_assistant_tokens_mask=True)`. Without: text and ids
equal transformers', and the turn-by-turn mask (two renders, linear) equals a reference built
from transformers' own prefix renders (quadratic) wherever that reference is defined; where it
is not, packtool skips the conversation rather than guess.
"""

from __future__ import annotations

from functools import cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.sft.encode import encode_chat
from packtool.sft.template import ChatTemplate, load_chat_template
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.chat_helpers import (
    SPECIALS,
    hf_tokenizer,
    needs_trl,
    templates,
    trained_tokenizer_dir,
)

pytest.importorskip("transformers")
pytestmark = needs_trl()

PIECES = ["hello", " world", "\n", "  ", "é", "日本語", "🙂", "x", "Ünï", "\t", "<|im_end|>", "."]
LOOK_AHEAD = {
    # Templates that read ahead of the current turn (loop.last, the list reversed, a namespace
    # value computed from later turns): for them the linear method may leave turns undetermined
    # that prefix renders happen to define. It never gives a mask that differs.
    "diffusion_gemma",
    "gemma4",
    "gemma4_v3",
    "gemma4_v4",
    "gemma4_v5",
    "glm4moe",
    "lfm2_2_5",
    "lfm2_2_5_v2",
    "lfm2_2_5_vl",
    "muse_glimmer",
    "qwen3",
    "qwen3_5_nothink",
    "qwen3_5_think",
    "qwen3_6",
    "qwen3_8",
}
SETTINGS = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def conversations(draw, max_turns: int = 8):
    content = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
    msgs = []
    if draw(st.booleans()):
        msgs.append({"role": "system", "content": draw(content)})
    for i in range(draw(st.integers(1, max_turns))):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": draw(content)})
    return msgs


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return trained_tokenizer_dir(str(tmp_path_factory.mktemp("chat")))


@cache
def _tokenizers(folder):
    return load_tokenizer(str(folder / "tokenizer.json")), hf_tokenizer(folder)


# A template compiled once for all of a test's examples, as a run compiles it once for all its
# conversations (compiling it for each example, twice with the watched copy, was 3/4 of these
# tests' time).
@cache
def _loaded_template(path, folder) -> ChatTemplate:
    return load_chat_template(path, tokenizer_dir=folder)


@cache
def _template(path, name: str = "") -> ChatTemplate:
    return ChatTemplate(path.read_text(encoding="utf-8"), special_tokens=SPECIALS, name=name)


def _transformers(hf, source, conv, **kw):
    """transformers' result, or None when it raises."""
    try:
        return hf.apply_chat_template(conv, chat_template=source, **kw)
    except Exception:
        return None


def _check_generation_template(path, folder, convs):
    ours_tok, hf = _tokenizers(folder)
    source = path.read_text(encoding="utf-8")
    template = _loaded_template(path, folder)
    for conv, r in zip(
        convs, encode_chat(convs, template=template, tokenizer=ours_tok), strict=True
    ):
        ref = _transformers(
            hf, source, conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        if ref is None:
            assert r.skip == "template_error", (path.name, conv)
            continue
        assert r.text == _transformers(hf, source, conv, tokenize=False), (path.name, conv)
        if not ref["input_ids"]:
            assert r.skip == "empty"
            continue
        assert r.ids.tolist() == ref["input_ids"], (path.name, conv)
        assert r.mask.tolist() == ref["assistant_masks"], (path.name, conv)
        assert (r.skip == "no_supervised_tokens") == (sum(ref["assistant_masks"]) == 0)


@pytest.mark.parametrize("path", templates(generation=True), ids=lambda p: p.stem)
@SETTINGS
@given(convs=st.lists(conversations(), min_size=1, max_size=3))
def test_generation_templates_equal_transformers(path, tok_dir, convs):
    _check_generation_template(path, tok_dir, convs)


@pytest.mark.parametrize("kind", ["trim", "metaspace"])
@pytest.mark.parametrize("name", ["qwen2_5_training", "llama3_training", "gemma3_training"])
@SETTINGS
@given(convs=st.lists(conversations(), min_size=1, max_size=3))
def test_tokenizers_without_byte_offsets_use_their_own_offsets_and_still_agree(
    kind, name, tmp_path_factory, convs
):
    # A post-processor that trims offsets changes which tokens overlap a span, and a
    # SentencePiece-style tokenizer has no byte alphabet: packtool reads the tokenizer's offsets.
    folder = trained_tokenizer_dir(str(tmp_path_factory.getbasetemp()), kind)
    path = next(p for p in templates(generation=True) if p.stem == name)
    _check_generation_template(path, folder, convs)


def _overlap(offsets, spans):
    """transformers' rule, as its apply_chat_template loops over the tokens."""
    mask, k = [0] * len(offsets), 0
    for t, (start, end) in enumerate(offsets):
        while k < len(spans) and start >= spans[k][1]:
            k += 1
        if k == len(spans):
            break
        if end > spans[k][0]:
            mask[t] = 1
    return mask


def reference_turn_mask(hf, source, conv):
    """The turn-by-turn mask from prefix renders (quadratic), or None where it is undefined."""
    whole = hf.apply_chat_template(conv, chat_template=source, tokenize=False)
    spans = []
    for k, m in enumerate(conv):
        if m["role"] != "assistant":
            continue
        before = _transformers(hf, source, conv[:k], tokenize=False, add_generation_prompt=True)
        upto = _transformers(hf, source, conv[: k + 1], tokenize=False)
        if before is None or upto is None:
            return None
        if not (upto.startswith(before) and whole.startswith(upto)):
            return None
        spans.append((len(before), len(upto)))
    enc = hf(whole, add_special_tokens=False, return_offsets_mapping=True)
    return _overlap(enc["offset_mapping"], spans)


@pytest.mark.parametrize("path", templates(generation=False), ids=lambda p: p.stem)
@SETTINGS
@given(convs=st.lists(conversations(), min_size=1, max_size=3))
def test_turn_masks_equal_prefix_renders(path, tok_dir, convs):
    ours_tok, hf = _tokenizers(tok_dir)
    source = path.read_text(encoding="utf-8")
    template = _template(path, path.name)
    for conv, r in zip(
        convs, encode_chat(convs, template=template, tokenizer=ours_tok), strict=True
    ):
        ids = _transformers(hf, source, conv, tokenize=True, return_dict=False)
        if ids is None:
            assert r.skip == "template_error", (path.name, conv)
            continue
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if r.skip == "template_not_incremental":
            ref = reference_turn_mask(hf, source, conv)
            assert ref is None or path.stem in LOOK_AHEAD, (path.name, conv, r.detail)
            continue
        assert r.text == _transformers(hf, source, conv, tokenize=False), (path.name, conv)
        if not ids:
            assert r.skip == "empty"
            continue
        assert r.ids.tolist() == list(ids), (path.name, conv)
        ref = reference_turn_mask(hf, source, conv)
        assert ref is not None, (path.name, conv)  # packtool found turns the reference cannot
        assert r.mask.tolist() == ref, (path.name, conv)


@pytest.mark.parametrize("train_on", ["last", "all"])
@SETTINGS
@given(conv=conversations())
def test_train_on_last_and_all(train_on, tok_dir, conv):
    ours_tok, hf = _tokenizers(tok_dir)
    for name in ("qwen2_5_training", "qwen2_5"):  # generation blocks, and turn by turn
        path = next(p for p in templates() if p.stem == name)
        template = _template(path)
        (every,) = encode_chat([conv], template=template, tokenizer=ours_tok)
        (r,) = encode_chat([conv], template=template, tokenizer=ours_tok, train_on=train_on)
        if train_on == "all":
            assert r.mask.all() and r.skip is None
            continue
        if every.skip is not None:
            assert r.skip is not None
            continue
        # `last`: the supervised tokens are the last run of the `assistant` mask.
        m = every.mask.tolist()
        runs = [i for i in range(len(m)) if m[i] and (i == 0 or not m[i - 1])]
        expected = [0] * runs[-1] + m[runs[-1] :]
        assert r.mask.tolist() == expected, (name, conv)


@pytest.mark.parametrize("legacy", [True, False], ids=["legacy_config", "added_tokens_decoder"])
def test_template_special_tokens_merge_special_tokens_map_as_transformers_does(
    legacy, tok_dir, tmp_path
):
    # An older tokenizer_config.json (no added_tokens_decoder) beside a special_tokens_map.json:
    # transformers renders {{ bos_token }} / {{ eos_token }} from the map, which overrides the
    # config; packtool read the config alone ('user: hi...yo<|eot_id|>' where transformers wrote
    # '<|begin_of_text|>user: hi...yo<|im_end|>'). A config with added_tokens_decoder is
    # used as it is, in both.
    import json
    import shutil

    from transformers import AutoTokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(tok_dir / "tokenizer.json", folder / "tokenizer.json")
    source = (
        "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}"
        "{% if m.role == 'assistant' %}{{ eos_token }}{% endif %}\n{% endfor %}"
    )
    config = {
        "eos_token": "<|eot_id|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": source,
    }
    if not legacy:
        config["added_tokens_decoder"] = {}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": "<|im_end|>", "bos_token": "<|begin_of_text|>"})
    )
    conv = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    expected = AutoTokenizer.from_pretrained(str(folder)).apply_chat_template(conv, tokenize=False)
    assert ("<|im_end|>" in expected) == legacy  # the two cases differ in transformers
    template = load_chat_template(tokenizer_dir=folder)
    tok = load_tokenizer(str(folder / "tokenizer.json"))
    (r,) = encode_chat([conv], template=template, tokenizer=tok, train_on="all")
    assert r.text == expected
    # the same config passed as the template file: the map beside it counts too
    template = load_chat_template(folder / "tokenizer_config.json")
    (r,) = encode_chat([conv], template=template, tokenizer=tok, train_on="all")
    assert r.text == expected
