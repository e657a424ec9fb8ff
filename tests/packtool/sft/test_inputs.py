"""Fine-tuning records in: kinds detected or given, prompt/completion and chat encoded with a
loss mask, every bad input a counted skip or a one-line error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer

from packtool.dataset.columns import flat_parts
from packtool.errors import ConfigError, DataError
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.read.sft_config import SFTConfig
from packtool.sft.encode import encode_chat
from packtool.sft.render import Renderer
from packtool.sft.template import ChatTemplate
from packtool.sft.turns import turn_spans
from packtool.tokenize.tokenize import input_columns, tokenize_corpus, tokenized_batches
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.cli import one_error_line, run

# Two small templates of our own: turns as `<|role|>content<|end|>` lines; the first marks the
# assistant's text and end-of-turn with {% generation %}, the second leaves it to turn masks.
GEN = (
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}<|end|>{% endgeneration %}"
    "{% else %}{{ m.content }}<|end|>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TURNS = GEN.replace("{% generation %}", "").replace("{% endgeneration %}", "")

CONV = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3+3?"},
    {"role": "assistant", "content": "6"},
]


def jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    return path


def template_file(tmp_path: Path, source: str = GEN) -> Path:
    path = tmp_path / "chat.jinja"
    path.write_text(source, "utf-8")
    return path


def read(paths, skips=None, tokenizer="byte", **sft):
    config = ReadConfig(sft=SFTConfig(**sft))
    skips = skips if skips is not None else SkipCounter()
    tables = list(tokenized_batches(paths, read_config=config, tokenizer=tokenizer, skips=skips))
    return pa.concat_tables(tables), skips


def docs(table):
    off, mask = flat_parts(table.column("loss_mask"))
    ids = table.column("input_ids").to_pylist()
    return [(i, mask[off[k] : off[k + 1]].tolist()) for k, i in enumerate(ids)]


def expected_chat(conv, spans_of):
    """ids (bytes) and mask of the GEN template's text, supervised where `spans_of` says."""
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in conv)
    mask = [0] * len(text.encode())
    for a, b in spans_of(text):
        for k in range(len(text[:a].encode()), len(text[:b].encode())):
            mask[k] = 1
    return list(text.encode()), mask


def assistant_spans(text):
    out, at = [], 0
    while (i := text.find("<|assistant|>", at)) >= 0:
        a = i + len("<|assistant|>")
        b = text.index("<|end|>", a) + len("<|end|>")
        out.append((a, b))
        at = b
    return out


@pytest.mark.parametrize("source", [GEN, TURNS], ids=["generation", "turns"])
def test_chat_jsonl_exact(tmp_path, source):
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    assert input_columns([path], ReadConfig()) == ("loss_mask",)
    table, skips = read([path], chat_template=str(template_file(tmp_path, source)))
    # Turn by turn, a turn is what its render adds after the generation prompt: the newline
    # the template writes after each turn included; {% generation %} marks only up to <|end|>.
    extra = 1 if source == TURNS else 0

    def spans(text):
        return [(a, b + extra) for a, b in assistant_spans(text)]

    assert docs(table) == [expected_chat(CONV, spans)]
    assert not skips.counts
    last, _ = read([path], chat_template=str(template_file(tmp_path, source)), train_on="last")
    assert docs(last) == [expected_chat(CONV, lambda t: spans(t)[-1:])]
    every, _ = read([path], chat_template=str(template_file(tmp_path, source)), train_on="all")
    ids, _ = expected_chat(CONV, assistant_spans)
    assert docs(every) == [(ids, [1] * len(ids))]


def test_sharegpt_and_parquet_read_as_the_same_conversations(tmp_path):
    tpl = str(template_file(tmp_path))
    share = [{"from": {"user": "human", "assistant": "gpt"}.get(m["role"], m["role"]),
              "value": m["content"]} for m in CONV]  # fmt: skip
    a = jsonl(tmp_path / "a.jsonl", [{"messages": CONV}])
    b = jsonl(tmp_path / "b.jsonl", [{"conversations": share}])
    c = tmp_path / "c.parquet"
    pq.write_table(pa.table({"messages": [CONV], "lang": ["en"]}), c)
    d = tmp_path / "d.parquet"
    pq.write_table(pa.table({"conversations": [share]}), d)
    want = docs(read([a], chat_template=tpl)[0])
    for path in (b, c, d):
        assert docs(read([path], chat_template=tpl)[0]) == want, path
    assert docs(read([b], chat_template=tpl, format="sharegpt")[0]) == want


def test_prompt_completion_exact(tmp_path):
    path = jsonl(
        tmp_path / "pc.jsonl",
        [{"prompt": "Q: hi ", "completion": "A: yo"}, {"question": "x", "answer": "y"}],
    )
    table, skips = read([path])
    ids = list(b"Q: hi ") + list(b"A: yo") + [256]  # byte ids, EOS 256 ends the completion
    mask = [0] * 6 + [1] * 6  # the completion and its EOS are supervised
    assert docs(table) == [(ids, mask)]
    assert skips.counts == {"missing_field": 1}
    renamed, _ = read([path], prompt_field="question", completion_field="answer")
    assert docs(renamed) == [(list(b"x") + list(b"y") + [256], [0, 1, 1])]
    # the skip names what is missing (a record with its prompt was "no 'prompt' and ...")
    half = jsonl(tmp_path / "half.jsonl", [{"prompt": "Q"}, {"prompt": "Q", "completion": "A"}])
    _, skips = read([half])
    assert skips.examples["missing_field"][0].endswith("(no 'completion')")
    # TRL's conversational prompt/completion (message lists) said "'prompt' is a array, not a
    # string": it now says what the format is and what to write instead
    conv = jsonl(
        tmp_path / "conv.jsonl",
        [
            {"prompt": [{"role": "user", "content": "hi"}], "completion": "yo"},
            {
                "prompt": [{"role": "user", "content": "hi"}],
                "completion": [{"role": "assistant", "content": "yo"}],
            },
            {"prompt": "Q", "completion": "A"},
        ],
    )
    _, skips = read([conv])
    assert skips.examples["missing_field"] == [
        f"{conv}:1 ('prompt' is an array, not a string)",
        f"{conv}:2 ('prompt' and 'completion' are message lists: conversational "
        'prompt/completion is not supported; write one "messages" list (the prompt\'s '
        "messages, then the completion's))",
    ]
    bos = load_tokenizer("byte", bos="default")
    with_bos, _ = read([path], tokenizer=bos)
    assert docs(with_bos) == [([257, *ids], [0, *mask])]
    every, _ = read([path], train_on="all")
    assert docs(every) == [(ids, [1] * len(ids))]


def test_pc_parquet_and_extra_fields(tmp_path):
    path = tmp_path / "pc.parquet"
    pq.write_table(
        pa.table({"prompt": ["a", "b"], "completion": ["c", ""], "lang": ["x", "y"]}), path
    )
    config = ReadConfig(extra_fields=("lang",))
    (table,) = list(tokenized_batches([path], read_config=config, tokenizer="byte"))
    # An empty completion still supervises its EOS: the model learns to stop.
    assert docs(table) == [([97, 99, 256], [0, 1, 1]), ([98, 256], [0, 1])]
    assert table.column("lang").to_pylist() == ["x", "y"]
    assert table.column("doc_id").to_pylist() == [0, 1]


def test_a_kept_column_that_is_no_text_is_one_error_also_under_strict(tmp_path):
    # Under --strict the batch read before an error is handed on first (the error names the
    # first bad record in reading order): a record whose second kept column held bytes that are
    # no UTF-8 was half in it (its first column's value, not its second), an IndexError.
    path = tmp_path / "pc.parquet"
    k = pa.array([b"ok", b"\xff", b"ok"])
    pq.write_table(pa.table({"prompt": ["a", "b", "x"], "completion": ["c", "d", "y"],
                             "j": ["1", "2", "3"], "k": k}), path)  # fmt: skip
    config = ReadConfig(extra_fields=("j", "k"))
    for strict in (False, True):
        with pytest.raises(DataError, match=r":row 1: column 'k' holds bytes that are not UTF-8"):
            list(tokenized_batches([path], read_config=config, tokenizer="byte",
                                   skips=SkipCounter(strict=strict)))  # fmt: skip


def test_a_record_supervised_only_at_its_first_token_is_a_counted_skip(tmp_path):
    """The loader never makes a document's first token a target (labels shift): an empty
    prompt and completion (only the EOS, first and supervised) or an assistant turn of one
    token that opens the text train on nothing, as a record with no supervised token (r6)."""
    pc = jsonl(
        tmp_path / "pc.jsonl", [{"prompt": "", "completion": ""}, {"prompt": "", "completion": "c"}]
    )
    table, skips = read([pc])
    assert docs(table) == [([99, 256], [1, 1])]
    assert skips.counts == {"no_supervised_tokens": 1}
    first = (
        "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}"
        "{% endgeneration %}{% else %}{{ m.content }}{% endif %}{% endfor %}"
    )
    chat = jsonl(
        tmp_path / "chat.jsonl",
        [
            {"messages": [{"role": "assistant", "content": "x"}, {"role": "user", "content": "q"}]},
            {"messages": [{"role": "assistant", "content": "xy"}]},
        ],
    )
    table, skips = read([chat], chat_template=str(template_file(tmp_path, first)))
    assert docs(table) == [(list(b"xy"), [1, 1])]
    assert skips.counts == {"no_supervised_tokens": 1}


def test_a_skipped_parquet_record_is_named_by_its_row_from_0(tmp_path):
    """Parquet rows are named from 0 everywhere (as pyarrow and inspect count them); these
    skips counted from 1."""
    path = tmp_path / "pc.parquet"
    pq.write_table(pa.table({"prompt": ["a", None, "b"], "completion": ["c", "d", "e"]}), path)
    skips = SkipCounter()
    (table,) = list(tokenized_batches([path], tokenizer="byte", skips=skips))
    assert table.num_rows == 2
    assert skips.examples["missing_field"][0].startswith(f"{path}:row 1 ")


def test_detection_and_format(tmp_path):
    chat = jsonl(tmp_path / "chat.jsonl", [{"messages": CONV}])
    text = jsonl(tmp_path / "text.jsonl", [{"text": "plain"}])
    assert input_columns([text], ReadConfig()) == ()
    with pytest.raises(DataError, match="holds text records, unlike .*chat.jsonl \\(messages\\)"):
        input_columns([chat, text], ReadConfig())
    # --format text reads a chat file as text: no text field there, the usual error.
    with pytest.raises(DataError, match="no line has the text field"):
        read([chat], format="text")
    with pytest.raises(ConfigError, match="--format tokenized / format='tokenized', but"):
        input_columns([chat], ReadConfig(sft=SFTConfig(format="tokenized")))
    tok = tmp_path / "tok.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2]], "labels": [[-100, 2]]}), tok)
    with pytest.raises(ConfigError, match="tokenized Parquet; --format messages"):
        input_columns([tok], ReadConfig(sft=SFTConfig(format="messages")))
    both = jsonl(tmp_path / "both.jsonl", [{"text": "t", "messages": CONV}])
    assert input_columns([both], ReadConfig()) == ("loss_mask",)  # chat wins over text


def test_bad_records_are_counted_or_strict_errors(tmp_path):
    tpl = str(
        template_file(
            tmp_path,
            "{% if messages[0].content == 'boom' %}{{ raise_exception('no boom') }}"
            "{% endif %}" + GEN,
        )
    )
    records = [
        {"messages": CONV},
        {"messages": [{"role": "wizard", "content": "x"}]},  # unknown_role
        {"messages": "hello"},  # malformed_conversation
        {"messages": [1, 2]},  # malformed_conversation
        {"messages": []},  # empty
        {"text": "plain"},  # other_kind
        {"messages": [{"role": "user", "content": "only a question"}]},  # no_supervised_tokens
        {"messages": [{"role": "user", "content": "boom"}, *CONV[2:3]]},  # template_error
        {"messages": [{"role": "user", "content": "q"}, {"role": "assistant"}]},  # content: None
        [1, 2],  # malformed_json (not an object)
        {"other": 1},  # missing_field
    ]
    path = jsonl(tmp_path / "bad.jsonl", records)
    table, skips = read([path], chat_template=tpl)
    assert table.num_rows == 2  # the good one, and the one whose assistant has no content
    assert skips.counts == {
        "unknown_role": 1,
        "malformed_conversation": 2,
        "empty": 1,
        "other_kind": 1,
        "no_supervised_tokens": 1,
        "template_error": 1,
        "malformed_json": 1,
        "missing_field": 1,
    }
    assert "no boom" in skips.examples["template_error"][0]
    assert f"{path}:2 (message 0 has role 'wizard')" in skips.examples["unknown_role"]
    for line, reason in ((2, "unknown role"), (8, "template error")):
        one = jsonl(tmp_path / f"one{line}.jsonl", [records[line - 1]])
        with pytest.raises(DataError, match=f"{one}:1: {reason}"):
            read([one], chat_template=tpl, skips=SkipCounter(strict=True))


def test_the_strict_error_names_the_first_bad_record_of_its_batch(tmp_path):
    # Record 2 fails only once rendered (no assistant turn, a template error) or encoded (no
    # supervised token), record 3 as it is read (no messages, no completion), all in one batch:
    # the error named record 3 (read first), which fixed, record 2 would fail next.
    tpl = str(template_file(tmp_path, "{% if messages[0].content == 'boom' %}"
                            "{{ raise_exception('no boom') }}{% endif %}" + GEN))  # fmt: skip
    boom = {"messages": [{"role": "user", "content": "boom"}, *CONV[2:3]]}
    cases = [
        ("no supervised tokens (no assistant turn)", [CONV, CONV[1:2], []], tpl),
        ("template error (no boom)", [CONV, boom["messages"], []], tpl),
        ("no supervised tokens (the mask", [("p", "c"), ("", ""), ("p", None)], None),
    ]
    for reason, values, template in cases:
        if template:
            records = [{"messages": v} for v in values]
        else:
            records = [{"prompt": p, "completion": c} for p, c in values]
            del records[2]["completion"]
        path = jsonl(tmp_path / "order.jsonl", records)
        for processes in (0, 2) if template else (0,):
            with pytest.raises(DataError, match=re.escape(f"{path}:2: {reason}")):
                read([path], skips=SkipCounter(strict=True), chat_template=template,
                     render_processes=processes)  # fmt: skip


def test_a_template_that_looks_ahead_is_a_counted_skip(tmp_path):
    # Marks the last assistant turn differently: rendered alone, an earlier assistant turn is
    # not what it is in the whole render, so its boundaries are unknown without guessing.
    ahead = (
        "{% for m in messages %}{{ m.role }}:{{ m.content }}"
        "{% if m.role == 'assistant' and loop.last %}!{% endif %};{% endfor %}"
    )
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}, {"messages": CONV[:3]}])
    table, skips = read([path], chat_template=str(template_file(tmp_path, ahead)))
    assert skips.counts == {"template_not_incremental": 1}
    assert docs(table)[0][0] == list(b"system:Be brief.;user:2+2?;assistant:4!;")
    # What the last turn adds after the prompt: this template has no generation prompt, so
    # the role header is part of it.
    assert docs(table)[0][1] == [0] * 27 + [1] * 13
    last, skips = read([path], chat_template=str(template_file(tmp_path, ahead)), train_on="last")
    assert last.num_rows == 2 and not skips.counts  # only the last turn: always known


def test_template_problems_are_one_line_errors(tmp_path):
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    code, _, err = run("pack", path, "-o", tmp_path / "o")
    assert code == 1 and "chat inputs need a chat template" in one_error_line(err)
    bad = template_file(tmp_path, "{% for m in messages %}")
    code, _, err = run("pack", path, "-o", tmp_path / "o", "--chat-template", bad)
    assert code == 1 and "not a valid jinja2 template" in one_error_line(err)
    code, _, err = run("stats", path, "--chat-template", tmp_path / "missing.jinja")
    assert code == 1 and "does not exist" in one_error_line(err)
    (tmp_path / "tpl").mkdir()  # a folder: it said "does not exist"
    code, _, err = run("stats", path, "--chat-template", tmp_path / "tpl")
    assert code == 1
    assert f"chat template '{tmp_path / 'tpl'}' is a folder; pass the template file" in (
        one_error_line(err)
    )
    macro = template_file(
        tmp_path,
        "{% macro all(ms) %}{% for m in ms %}{{ m.content }}{% endfor %}{% endmacro %}"
        "{{ all(messages) }}",
    )
    code, _, err = run("tokenize", path, "-o", tmp_path / "t.parquet", "--chat-template", macro)
    assert code == 1 and "passes the messages to macro" in one_error_line(err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "t.parquet").exists()


def test_cli_tokenize_stats_pack_on_chat(tmp_path):
    tpl = template_file(tmp_path)
    convs = [CONV[: 1 + (i % 4) + 1] for i in range(40)]
    path = jsonl(tmp_path / "c.jsonl", [{"messages": c} for c in convs])
    code, out, err = run("tokenize", path, "-o", tmp_path / "t.parquet", "--chat-template", tpl)
    assert code == 0, err
    assert "Loss mask kept" in out and "no_supervised_tokens 10" in out
    code, out, err = run("stats", path, "--chat-template", tpl, "--max-len", 64)
    assert code == 0 and "supervised" in out, err
    code, out, err = run(
        "pack", path, "-o", tmp_path / "p", "--chat-template", tpl, "--max-len", 64
    )
    assert code == 0, err
    assert "supervised efficiency" in out and "skips: no_supervised_tokens 10" in out


def test_turn_masks_take_two_renders_however_long_the_conversation(monkeypatch):
    template = ChatTemplate(TURNS)
    renders = []
    real = ChatTemplate.blocks

    def counted(self, compiled, variables):
        renders.append(compiled is template.watched)
        return real(self, compiled, variables)

    monkeypatch.setattr(ChatTemplate, "blocks", counted)
    sizes = {}
    for turns in (50, 400):
        conv = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"t{i}"}
            for i in range(turns)
        ]
        renders.clear()
        text, spans = turn_spans(template, conv, list(range(1, turns, 2)))
        assert renders == [True, True]  # two watched renders, never one per turn
        assert len(spans) == turns // 2
        assert all(text[a:b].startswith(f"t{2 * k + 1}") for k, (a, b) in enumerate(spans))
        sizes[turns] = len(text)
    assert sizes[400] < 9 * sizes[50]  # the text, and the work, grow linearly


def test_encode_chat_is_the_library_form(tmp_path):
    tok = load_tokenizer("byte")
    out = encode_chat(
        [CONV, [{"role": "bot", "content": "x"}]], template=ChatTemplate(GEN), tokenizer=tok
    )
    ids, mask = expected_chat(CONV, assistant_spans)
    assert out[0].ids.tolist() == ids and out[0].mask.tolist() == mask and out[0].skip is None
    assert out[1].skip == "unknown_role"


@pytest.mark.parametrize("train_on", ["x", "ALL", None, 5])
def test_encode_chat_refuses_an_unknown_train_on(train_on):
    # Anything but assistant/last/all used to supervise the assistant turns without a word.
    tok = load_tokenizer("byte")
    with pytest.raises(ConfigError, match=r"unknown; choose one of assistant, last, all"):
        encode_chat([CONV], template=ChatTemplate(GEN), tokenizer=tok, train_on=train_on)
    with pytest.raises(ConfigError, match=r"unknown; choose one of assistant, last, all"):
        Renderer(ChatTemplate(GEN), train_on)


def test_tokenize_writes_the_mask_and_pack_reads_it_back(tmp_path):
    tpl = template_file(tmp_path)
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}] * 3)
    config = ReadConfig(sft=SFTConfig(chat_template=str(tpl)))
    summary = tokenize_corpus([path], tmp_path / "t.parquet", read_config=config)
    assert summary.documents == 3 and summary.supervised_tokens == 3 * sum(
        expected_chat(CONV, assistant_spans)[1]
    )
    back = pq.read_table(tmp_path / "t.parquet")
    assert docs(back) == [expected_chat(CONV, assistant_spans)] * 3
    assert np.array_equal(
        back.column("length").to_numpy(), [len(expected_chat(CONV, assistant_spans)[0])] * 3
    )


def test_the_tokenizers_own_template_and_special_tokens(tmp_path):
    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = trained_tokenizer_dir(str(tmp_path))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    source = "{{ bos_token }}" + GEN + "{{ eos_token }}"
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": source}))
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    tok = load_tokenizer(str(folder / "tokenizer.json"))
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))  # the reference library
    (table,) = list(tokenized_batches([path], tokenizer=tok))
    text = "<s>" + "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in CONV) + "</s>"
    assert (
        table.column("input_ids").to_pylist()[0] == ref.encode(text, add_special_tokens=False).ids
    )
    # chat_template.jinja beside the tokenizer takes precedence over the config's template.
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{{ m.content }}{% endfor %}"
    )
    code, out, err = run(
        "tokenize", path, "-o", tmp_path / "t.parquet", "--tokenizer", folder / "tokenizer.json",
        "--train-on", "all",
    )  # fmt: skip
    assert code == 0, err
    ids = pq.read_table(tmp_path / "t.parquet").column("input_ids").to_pylist()[0]
    assert ids == ref.encode("".join(m["content"] for m in CONV), add_special_tokens=False).ids


def test_cli_options_reach_the_readers(tmp_path):
    share = [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]
    a = jsonl(tmp_path / "a.jsonl", [{"chat": share}])
    tpl = template_file(tmp_path)
    code, out, err = run(
        "pack", a, "-o", tmp_path / "p", "--chat-template", tpl, "--messages-field", "chat",
        "--format", "sharegpt", "--train-on", "last", "--json",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["counts"]["tokens_supervised"] == len("a<|end|>")
    b = jsonl(tmp_path / "b.jsonl", [{"q": "x", "a": "y"}])
    code, out, err = run(
        "stats", b, "--prompt-field", "q", "--completion-field", "a", "--max-len", 16, "--json"
    )
    assert code == 0, err
    assert json.loads(out)["supervised"]["supervised_tokens"] == 2  # "y" and the EOS
    code, _, err = run("stats", b, "--format", "nonsense")
    assert code == 1 and "nonsense" in one_error_line(err)  # a bad value: one line, 1
    code, _, err = run(
        "pack", b, "-o", tmp_path / "x", "--format", "messages", "--strict", "--chat-template", tpl
    )
    assert code == 1 and f"{b}:1: missing field (no 'messages' or" in one_error_line(err)


def test_record_batches_are_cut_by_utf8_bytes_not_characters(tmp_path):
    from packtool.sft.inputs import read_records

    path = tmp_path / "cjk.jsonl"
    record = {"prompt": "问" * 100, "completion": "答" * 100}  # 200 characters, 600 UTF-8 bytes
    path.write_text((json.dumps(record, ensure_ascii=False) + "\n") * 50, encoding="utf-8")
    read = ReadConfig(batch_bytes=6000)
    batches = list(read_records([path], "prompt-completion", read, SkipCounter()))
    assert [len(b) for b in batches] == [10] * 5
    assert all(b.text_bytes == 6000 for b in batches)


def test_a_record_holding_a_number_beyond_a_double_s_range_stays_a_skip(tmp_path):
    """orjson refuses `1e400`, and the standard library read it as inf: a tool call's
    arguments of a chat record went to the template as `{"x": Infinity}`, not what was written
    (a pre-training record's other fields are not read, so there it is read)."""
    from packtool.sft.inputs import read_records

    path = tmp_path / "chat.jsonl"
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 1e400}}}
    rows = [
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
    ]  # fmt: skip
    path.write_text(
        "".join(json.dumps({"messages": m}) + "\n" for m in rows).replace("Infinity", "1e400")
    )
    skips = SkipCounter()
    batches = list(read_records([path], "messages", ReadConfig(), skips))
    assert sum(len(b) for b in batches) == 1
    assert skips.examples["malformed_json"] == [f"{path}:1 (a number beyond a double's range)"]


def test_a_record_holding_an_integer_past_pythons_digit_limit_is_a_skip_in_words(tmp_path):
    """A chat record is used whole (a tool call's arguments go to the template): one holding an
    integer of 5,000 digits, past Python's limit on int conversion, was skipped as "number is
    infinity when parsed as double" (orjson's words); the skip now says what is there."""
    import sys

    from packtool.sft.inputs import read_records

    path = tmp_path / "chat.jsonl"
    call = {"type": "function", "function": {"name": "f", "arguments": {"x": 7}}}
    rows = [
        [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}],
    ]  # fmt: skip
    text = "".join(json.dumps({"messages": m}) + "\n" for m in rows)
    path.write_text(text.replace('{"x": 7}', '{"x": ' + "9" * 5000 + "}"))
    skips = SkipCounter()
    batches = list(read_records([path], "messages", ReadConfig(), skips))
    assert sum(len(b) for b in batches) == 1
    limit = sys.get_int_max_str_digits()
    assert skips.examples["malformed_json"] == [
        f"{path}:1 (a number with more than {limit} digits)"
    ]


def test_a_hub_tokenizers_template_is_read_from_its_snapshot(tmp_path, monkeypatch):
    """`--tokenizer org/model` from the Hugging Face cache looked for the template in ./org: the
    pack failed ('no chat template for the tokenizer in me'), or used ./me/chat_template.jinja."""
    import shutil

    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = trained_tokenizer_dir(str(tmp_path))
    repo = tmp_path / "hub" / "models--me--tiny"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    shutil.copy(folder / "tokenizer.json", snapshot)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = GEN
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    work = tmp_path / "work"
    (work / "me").mkdir(parents=True)
    monkeypatch.chdir(work)
    path = jsonl(work / "c.jsonl", [{"messages": CONV}])
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in CONV)

    def ids() -> list[int]:
        (table,) = list(tokenized_batches([path], tokenizer=load_tokenizer("me/tiny")))
        return table.column("input_ids").to_pylist()[0]

    assert ids() == ref.encode(text, add_special_tokens=False).ids
    (work / "me" / "chat_template.jinja").write_text("{% for m in messages %}WRONG{% endfor %}")
    assert ids() == ref.encode(text, add_special_tokens=False).ids  # not the one in ./me
    (snapshot / "chat_template.jinja").write_text(TURNS.replace("<|end|>", "<|end|>!"))
    assert ids() == ref.encode(text.replace("<|end|>", "<|end|>!"), add_special_tokens=False).ids


def test_a_downloaded_hub_tokenizer_brings_its_chat_template_jinja(tmp_path, monkeypatch):
    """The download fetched tokenizer.json and the configs only: a repository whose template
    is its chat_template.jinja (transformers' save_pretrained writes it there) had none."""
    import fnmatch
    import shutil

    import huggingface_hub

    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = trained_tokenizer_dir(str(tmp_path))
    (folder / "chat_template.jinja").write_text(GEN)
    (folder / "model.safetensors").write_text("weights: never fetched")

    def snapshot_download(repo_id, revision, allow_patterns):  # the Hub, for these files
        snapshot = tmp_path / "hub" / "snapshot"
        snapshot.mkdir(parents=True, exist_ok=True)
        for file in folder.iterdir():
            if any(fnmatch.fnmatch(file.name, p) for p in allow_patterns):
                shutil.copy(file, snapshot)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    (table,) = list(tokenized_batches([path], tokenizer=load_tokenizer("me/tiny")))
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "".join(f"<|{m['role']}|>{m['content']}<|end|>\n" for m in CONV)
    assert (
        table.column("input_ids").to_pylist()[0] == ref.encode(text, add_special_tokens=False).ids
    )
    assert not (tmp_path / "hub" / "snapshot" / "model.safetensors").exists()


def test_eos_and_bos_options_leave_the_templates_tokens_alone(tmp_path):
    """Without a tokenizer_config.json the template's `eos_token` was the string of the run's
    EOS id: `--eos-id 5` wrote id 5 into every turn, `--no-eos` wrote nothing (every assistant
    turn lost its end marker). Its tokens are the tokenizer's own defaults, whatever the
    options say."""
    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = tmp_path / "noconfig"
    folder.mkdir()
    source = trained_tokenizer_dir(str(tmp_path)) / "tokenizer.json"
    (folder / "tokenizer.json").write_bytes(source.read_bytes())
    tpl = template_file(
        tmp_path,
        "{{ bos_token | default('') }}"
        + GEN.replace(
            "{{ m.content }}<|end|>{% endgeneration %}",
            "{{ m.content }}{{ eos_token }}{% endgeneration %}",
        ),
    )
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    ref = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "".join(
        f"<|{m['role']}|>{m['content']}"
        + ("</s>" if m["role"] == "assistant" else "<|end|>")
        + "\n"
        for m in CONV
    )
    expected = ref.encode(text, add_special_tokens=False).ids
    assert ref.token_to_id("</s>") in expected
    for options in ({}, {"eos": 5}, {"eos": None}, {"bos": 5}, {"bos": None}, {"bos": "default"}):
        tok = load_tokenizer(str(folder / "tokenizer.json"), **options)
        (table,) = list(
            tokenized_batches(
                [path], tokenizer=tok, read_config=ReadConfig(sft=SFTConfig(chat_template=str(tpl)))
            )
        )
        assert table.column("input_ids").to_pylist()[0] == expected, options


def test_a_tiktoken_templates_eos_token_is_its_end_of_text_token(tmp_path):
    """Before: only a Hugging Face tokenizer's template saw `eos_token`; with a tiktoken ranks
    file it was undefined, so `{{ eos_token }}` wrote nothing after every assistant turn (the
    model never learned where an answer ends) while the summary said `eos <|endoftext|>`."""
    from tests.packtool.tokenizer_shapes import build, byte_level_ranks

    ranks = byte_level_ranks(build("gpt2", tmp_path / "tj"), tmp_path / "x.tiktoken")
    tok = load_tokenizer(str(ranks))
    eos = tok.own_ids["eos"]
    tpl = template_file(
        tmp_path,
        GEN.replace("{{ m.content }}<|end|>{% endgeneration %}", "{{ m.content }}{{ eos_token }}"
                    "{% endgeneration %}"),
    )  # fmt: skip
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}])
    config = ReadConfig(sft=SFTConfig(chat_template=str(tpl)))
    (table,) = list(tokenized_batches([path], tokenizer=tok, read_config=config))
    ids = table.column("input_ids").to_pylist()[0]
    mask = np.frombuffer(table.column("loss_mask").to_pylist()[0], np.uint8).tolist()
    ends = [i for i, t in enumerate(ids) if t == eos]
    assert len(ends) == 2 and all(mask[i] == 1 for i in ends)  # each answer's end, supervised
    # The byte tokenizer's EOS is no text: undefined, as the docs say (nothing written).
    (table,) = list(tokenized_batches([path], tokenizer="byte", read_config=config))
    assert 256 not in table.column("input_ids").to_pylist()[0]


def test_every_input_format_has_a_record_reader():
    # The fine-tuning readers dispatch on the format registry, as the corpus readers do: a
    # format added to FORMATS needs its record reader here, or reading it is a KeyError.
    from packtool.read.formats import FORMATS
    from packtool.sft.inputs import RECORD_READERS

    assert set(RECORD_READERS) == {f.name for f in FORMATS}


def test_each_format_says_its_record_kind_fields_and_records(tmp_path):
    from packtool.sft.inputs import file_record_kind, first_fields, read_records

    chat = jsonl(tmp_path / "chat.jsonl", [{"messages": CONV, "id": 1}])
    pq.write_table(pa.table({"prompt": ["p"], "completion": ["c"]}), tmp_path / "pc.parquet")
    (tmp_path / "notes.txt").write_text("plain text", "utf-8")
    config = ReadConfig()
    kinds = [file_record_kind(tmp_path / n, config) for n in ("chat.jsonl", "pc.parquet")]
    assert kinds == ["messages", "prompt-completion"]
    assert file_record_kind(tmp_path / "notes.txt", config) == "text"
    assert first_fields([chat]) == ["id", "messages"]
    assert first_fields([tmp_path / "pc.parquet"]) == ["completion", "prompt"]
    assert first_fields([tmp_path / "notes.txt"]) == []
    batches = list(
        read_records([tmp_path / "pc.parquet"], "prompt-completion", config, SkipCounter())
    )
    assert [b.values for b in batches] == [[("p", "c")]]
    with pytest.raises(DataError, match="notes.txt: a plain text file in a messages dataset"):
        list(read_records([tmp_path / "notes.txt"], "messages", config, SkipCounter()))


def test_a_record_file_that_cannot_be_read_is_one_line_naming_it(tmp_path):
    import gzip

    data = "".join(json.dumps({"messages": CONV}) + "\n" for _ in range(200)).encode()
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(data)[:-40])
    (tmp_path / "plain.jsonl.gz").write_bytes(data)
    (tmp_path / "folder.parquet").mkdir()
    says = {
        "cut.jsonl.gz": "cut.jsonl.gz: file is truncated",
        "plain.jsonl.gz": "plain.jsonl.gz: cannot read (Not a gzipped file",
        "folder.parquet": "folder.parquet: cannot read (",
    }
    from packtool.sft.inputs import read_records

    for name, message in says.items():
        with pytest.raises(DataError) as err:
            list(read_records([tmp_path / name], "messages", ReadConfig(), SkipCounter()))
        assert message in str(err.value) and "\n" not in str(err.value)
    assert "the file is not compressed: drop the .gz" in str(
        pytest.raises(
            DataError,
            list,
            read_records([tmp_path / "plain.jsonl.gz"], "messages", ReadConfig(), SkipCounter()),
        ).value
    )


@pytest.mark.parametrize("kind", ["bytelevel", "metaspace"])
def test_a_completion_is_encoded_as_it_follows_its_prompt(kind, tmp_path_factory):
    """A Metaspace tokenizer (SentencePiece style) prefixes every text it encodes with "▁": a
    completion encoded alone began with a space its record does not have ("The answer is 4" +
    "2" decoded "The answer is 4 2", the model taught to say it). The completion is now the
    joined text's ids after the prompt's wherever those begin with the prompt's; a byte-level
    BPE, which encodes a completion alike alone and after its prompt, is unchanged."""
    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = trained_tokenizer_dir(str(tmp_path_factory.getbasetemp()), kind)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    pairs = [("The answer is 4", "2"), ("Q: hello", " world"), ("A list:\n", "- one\n- two")]
    root = tmp_path_factory.mktemp(f"pc-{kind}")
    src = root / "pc.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "completion": c}) + "\n" for p, c in pairs))
    code, _, err = run("tokenize", src, "-o", root / "o.parquet", "--tokenizer", folder, "--no-eos")
    assert code == 0, err
    rows = pq.read_table(root / "o.parquet").to_pylist()
    for row, (p, c) in zip(rows, pairs, strict=True):
        ids = [i for i in row["input_ids"]]
        prompt = tok.encode(p, add_special_tokens=False).ids
        alone = tok.encode(c, add_special_tokens=False).ids
        joined = tok.encode(p + c, add_special_tokens=False).ids
        start = (
            len(ids)
            - len(prompt)
            - (len(joined) - len(prompt) if kind == "metaspace" else len(alone))
        )
        assert ids[start : start + len(prompt)] == prompt
        if kind == "bytelevel":  # alike alone and after the prompt: unchanged
            assert ids[start + len(prompt) :] == alone
        else:
            assert joined[: len(prompt)] == prompt and ids[start:] == joined
            assert tok.decode(ids[start:]) == tok.decode(joined)
            if c == "2":  # alone: "▁2", a space the record does not have
                assert ids[start + len(prompt) :] != alone, "the probe found nothing to fix"


def test_a_template_that_writes_no_generation_prompt_is_named_once(tmp_path):
    # A template with no {% generation %} blocks and nothing for add_generation_prompt put each
    # assistant turn's role header inside the turn (the turn is what the conversation adds after
    # the generation prompt): `<|assistant|>` trained as part of every answer, in silence.
    path = jsonl(tmp_path / "c.jsonl", [{"messages": CONV}] * 3)
    no_prompt = TURNS.replace("{% if add_generation_prompt %}<|assistant|>{% endif %}", "")
    assert no_prompt != TURNS
    note = (
        f"note: {tmp_path / 'chat.jinja'} writes nothing for add_generation_prompt, so each assistant turn's "
        "opening (its role header) is trained as part of the answer; use a template that "
        "writes it, or one with {% generation %} blocks"
    )
    for source, train_on, said in (
        (no_prompt, "assistant", True),
        (no_prompt, "last", True),
        (no_prompt, "all", False),  # every token is trained anyway
        (TURNS, "assistant", False),
        (GEN, "assistant", False),
    ):
        template = template_file(tmp_path, source)
        for command, out in (("pack", ["-o", tmp_path / "p", "--overwrite"]),
                             ("tokenize", ["-o", tmp_path / "t.parquet", "--overwrite"])):  # fmt: skip
            code, _, err = run(
                command, path, *out, "--chat-template", template, "--train-on", train_on
            )
            assert code == 0, err
            assert err.count("writes nothing for add_generation_prompt") == int(said), err
            assert (note in err.splitlines()) == said, err
