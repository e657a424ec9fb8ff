"""Rendering in a pool of processes gives exactly what rendering in this process gives.

packtool/sft/render.py: the same texts, ids, masks, skips (counts, examples, order) and strict
errors, for `encode_chat` and for `tokenize` (JSONL -> Parquet, byte for byte), with and without
`{% generation %}` blocks; and the vectorised overlap rule equals transformers' token loop.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packtool.sft.encode as sft_encode
import packtool.sft.render as chat_render
from packtool.engines.local import RunConfig
from packtool.engines.preflight import Checked, fingerprint_of
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from packtool.read.sft_config import SFTConfig
from packtool.sft.encode import encode_chat
from packtool.sft.render import Renderer, RenderPool, render_processes, rendered_in_order
from packtool.sft.template import ChatTemplate, TemplateFailure
from packtool.sft.tokens import overlap_mask
from packtool.tokenize.tokenize import tokenize_corpus
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.sft.test_inputs import GEN, TURNS, template_file

PIECES = ["hello", " world", "\n", "é", "日本語", "🙂", "<|end|>", "x", "  "]
BAD = [  # records the readers / to_messages count as skips
    "not a list",
    [],
    [{"role": "wizard", "content": "?"}],
    [{"content": "no role"}],
    [1, 2],
]
FAIL = "{% if messages[0].content == 'boom' %}{{ raise_exception('boom') }}{% endif %}"
SETTINGS = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@st.composite
def conversation(draw):
    content = st.lists(st.sampled_from(PIECES), max_size=5).map("".join)
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(BAD))
    msgs = [{"role": "system", "content": draw(content)}] if draw(st.booleans()) else []
    for i in range(draw(st.integers(0, 6))):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append(
            {"role": role, "content": "boom" if draw(st.integers(0, 15)) == 0 else draw(content)}
        )
    if draw(st.booleans()) and msgs:  # ShareGPT form
        names = {"system": "system", "user": "human", "assistant": "gpt"}
        msgs = [{"from": names[m["role"]], "value": m["content"]} for m in msgs]
    return msgs


def same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (x.skip, x.detail, x.text) == (y.skip, y.detail, y.text)
        for u, v in ((x.ids, y.ids), (x.mask, y.mask)):
            assert (u is None) == (v is None)
            if u is not None:
                assert u.dtype == v.dtype and u.tolist() == v.tolist()


@pytest.mark.parametrize("source", [FAIL + GEN, FAIL + TURNS], ids=["generation", "turns"])
@pytest.mark.parametrize("train_on", ["assistant", "last", "all"])
@SETTINGS
@given(convs=st.lists(conversation(), max_size=40))
def test_encode_chat_in_a_pool_equals_in_process(source, train_on, convs):
    template = ChatTemplate(source, name="t")
    tok = load_tokenizer("byte")
    here = encode_chat(convs, template=template, tokenizer=tok, train_on=train_on, processes=0)
    pooled = encode_chat(convs, template=template, tokenizer=tok, train_on=train_on, processes=2)
    same(here, pooled)


@pytest.mark.parametrize("source", [FAIL + GEN, FAIL + TURNS], ids=["generation", "turns"])
def test_encode_chat_pool_over_many_chunks_and_skips(monkeypatch, source):
    started = spy_pools(monkeypatch)
    monkeypatch.setattr(sft_encode, "POOL_MIN_CONVERSATIONS", 1000)  # the default pools too
    rng = np.random.default_rng(0)
    convs = []
    for k in range(1500):
        if k % 97 == 0:
            convs.append(BAD[k % len(BAD)])
            continue
        n = int(rng.integers(1, 7))
        convs.append([
            {"role": "user" if i % 2 == 0 else "assistant", "content": "boom" if k % 211 == 0 else
             "".join(rng.choice(PIECES, int(rng.integers(0, 5))))}
            for i in range(n)
        ])  # fmt: skip
    template = ChatTemplate(source, name="t")
    tok = load_tokenizer("byte")
    here = encode_chat(convs, template=template, tokenizer=tok, processes=0)
    for processes in (None, 1, 3):
        same(here, encode_chat(convs, template=template, tokenizer=tok, processes=processes))
    # By default a pool only where rendering is most of the work (turn masks).
    default = [render_processes(None)] if source.endswith(TURNS) and render_processes(None) else []
    assert started == [*default, 1, 3]
    reasons = {r.skip for r in here}
    assert {None, "template_error", "malformed_conversation", "empty", "unknown_role"} <= reasons


def spy_pools(monkeypatch) -> list[int]:
    """The process counts of the render pools started from now on."""
    started: list[int] = []

    class Spy(RenderPool):
        def __init__(self, renderer, processes, method=None):
            started.append(processes)
            super().__init__(renderer, processes, method)

    monkeypatch.setattr(sft_encode, "RenderPool", Spy)
    return started


def _records(n: int, seed: int, bad: bool = True):
    rng = np.random.default_rng(seed)
    lines = []
    for k in range(n):
        if bad and k % 53 == 7:
            lines.append("{not json")
            continue
        if bad and k % 41 == 3:
            lines.append(json.dumps({"messages": BAD[k % len(BAD)]}))
            continue
        msgs = [{"role": "system", "content": "s"}] if k % 3 == 0 else []
        for i in range(int(rng.integers(1, 6))):
            words = rng.choice(PIECES, int(rng.integers(0, 6)))
            msgs.append({"role": ("user", "assistant")[i % 2], "content": "".join(words)})
        if bad and k % 61 == 5:
            msgs[0]["content"] = "boom"
        lines.append(json.dumps({"messages": msgs, "id": str(k)}, ensure_ascii=False))
    return lines


@pytest.mark.parametrize("source", [FAIL + GEN, FAIL + TURNS], ids=["generation", "turns"])
def test_tokenize_in_a_pool_writes_the_same_bytes_and_skips(tmp_path, source, monkeypatch):
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(_records(700, 1)) + "\n", "utf-8")
    template = template_file(tmp_path, source)
    started = spy_pools(monkeypatch)
    monkeypatch.setattr(sft_encode, "POOL_MIN_BYTES", path.stat().st_size)  # None: a pool
    outs, skips = {}, {}
    for processes in (0, 1, 2, None):
        sft = SFTConfig(chat_template=str(template), render_processes=processes)
        read = ReadConfig(sft=sft, batch_docs=37, extra_fields=("id",))  # many batches
        out = tmp_path / f"t{processes}.parquet"
        summary = tokenize_corpus([path], out, read_config=read, tokenizer="byte", progress=False)
        outs[processes] = pq.read_table(out)
        skips[processes] = summary.skips
    assert outs[0].num_rows > 500
    default = [render_processes(None)] if source.endswith(TURNS) and render_processes(None) else []
    assert started == [1, 2, *default]
    for processes in (1, 2, None):
        assert outs[processes].equals(outs[0])
        assert skips[processes] == skips[0]
    assert {"template_error", "malformed_json", "unknown_role"} <= set(skips[0])


def test_the_first_strict_error_is_the_same_with_a_pool(tmp_path):
    # A template error in the first batch, a malformed line in a later one: the pool reads
    # ahead, but the error raised is the first in reading order, as without a pool.
    lines = _records(200, 2, bad=False)
    lines[3] = json.dumps({"messages": [{"role": "user", "content": "boom"}]})
    lines[150] = "{not json"
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(lines) + "\n", "utf-8")
    template = template_file(tmp_path, FAIL + GEN)
    errors = []
    for processes in (0, 2):
        sft = SFTConfig(chat_template=str(template), render_processes=processes)
        read = ReadConfig(sft=sft, batch_docs=20, strict=True)
        with pytest.raises(DataError) as info:
            tokenize_corpus([path], tmp_path / "t.parquet", read_config=read, tokenizer="byte",
                            progress=False, overwrite=True)  # fmt: skip
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert ":4: template error (boom)" in errors[0]


def test_a_reading_error_comes_after_the_batches_read_before_it():
    template = ChatTemplate(GEN, name="t")
    renderer = Renderer(template, "assistant")
    conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]

    def batches():
        yield [conv]
        yield [conv, conv]
        raise DataError("bad file")

    got = []
    with RenderPool(renderer, 2) as pool, pytest.raises(DataError, match="bad file"):
        for batch, r in rendered_in_order(
            batches(), lambda b: b, renderer, pool, convert=False, drop_unsupervised=True
        ):
            got.append((len(batch), r.kept.tolist()))
    assert got == [(1, [0]), (2, [0, 1])]


def test_values_marshal_cannot_write_go_by_pickle():
    when = datetime.date(2024, 1, 2)  # e.g. a date column of a Parquet conversation
    convs = [
        [{"role": "user", "content": "q", "when": when}, {"role": "assistant", "content": "a"}]
    ]
    template = ChatTemplate("{{ messages[0].when }}" + GEN, name="t")
    renderer = Renderer(template, "assistant")
    here = renderer.render_batch(convs, convert=True, drop_unsupervised=False)
    with RenderPool(renderer, 1) as pool:
        pooled = pool.submit(convs, convert=True, drop_unsupervised=False).result()
    assert pooled.text == here.text and pooled.text.startswith("2024-01-02")
    assert pooled.span_starts.tolist() == here.span_starts.tolist()


def test_a_dead_worker_is_a_one_line_error(monkeypatch):
    def die(*args, **kwargs):
        os._exit(3)

    # Forked workers inherit the patched method.
    monkeypatch.setattr(chat_render.Renderer, "render_batch", die)
    renderer = Renderer(ChatTemplate(GEN, name="t"), "assistant")
    with RenderPool(renderer, 1, "fork") as pool, pytest.raises(DataError, match="died"):
        list(rendered_in_order(
            iter([[[]]]), lambda b: b, renderer, pool, convert=True, drop_unsupervised=True
        ))  # fmt: skip


def test_spawned_workers_render_the_same(tmp_path):
    renderer = Renderer(ChatTemplate(TURNS, name="t"), "last")
    convs = [
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"a{i}"}] * (i % 4 + 1)
        for i in range(30)
    ]
    here = renderer.render_batch(convs, convert=True, drop_unsupervised=True)
    with RenderPool(renderer, 1, "spawn") as pool:
        pooled = pool.submit(convs, convert=True, drop_unsupervised=True).result()
    assert pooled.texts() == here.texts()
    for name in ("lengths", "kept", "span_counts", "span_starts", "span_ends"):
        assert getattr(pooled, name).tolist() == getattr(here, name).tolist()


def test_render_processes_option_and_its_default():
    assert render_processes(0) == 0 and render_processes(3) == 3
    cores = len(os.sched_getaffinity(0))
    assert render_processes(None) == (cores if cores >= 2 else 0)
    for bad in (-1, 1.5, True, "2"):
        with pytest.raises(ConfigError, match="render_processes"):
            SFTConfig(render_processes=bad)


def test_where_templates_render_is_not_part_of_the_resume_fingerprint(tmp_path):
    def fingerprint(sft):
        config = RunConfig(
            inputs=("x",), out_dir=str(tmp_path), pack=PackConfig(max_len=64, long_docs="split"),
            read=ReadConfig(sft=sft),
        )  # fmt: skip
        checked = Checked(
            tokenizer=None, identity={"kind": "byte"}, tokenized=True, paths=[], config=config
        )
        return fingerprint_of(config, checked)

    prints = [fingerprint(SFTConfig(render_processes=p)) for p in (None, 0, 4)]
    assert prints[0] == prints[1] == prints[2]
    assert fingerprint(SFTConfig(train_on="last")) != prints[0]


def _loop(starts, ends, span_starts, span_ends):
    """transformers' rule, token by token."""
    out, k = [0] * len(starts), 0
    for t in range(len(starts)):
        while k < len(span_ends) and starts[t] >= span_ends[k]:
            k += 1
        if k == len(span_ends):
            break
        if ends[t] > span_starts[k]:
            out[t] = 1
    return out


@settings(max_examples=300, deadline=None)
@given(
    widths=st.lists(st.integers(0, 4), max_size=30),
    cuts=st.lists(st.integers(0, 80), max_size=12),
    shuffle=st.booleans(),
    data=st.data(),
)
def test_overlap_mask_equals_transformers_loop(widths, cuts, shuffle, data):
    # Tokens end to end (byte lengths, zero-length ones included), or any intervals with
    # sorted starts; spans in order (cut points, empty spans included) or anyhow.
    ends = np.cumsum(np.asarray(widths, np.int64))
    starts = ends - np.asarray(widths, np.int64)
    if shuffle and len(starts):
        jitter = data.draw(st.lists(st.integers(-3, 3), min_size=len(ends), max_size=len(ends)))
        ends = np.maximum(starts, ends + np.asarray(jitter, np.int64))
    points = sorted(cuts)
    ss = np.asarray(points[0::2][: len(points) // 2], np.int64)
    se = np.asarray(points[1::2], np.int64)
    if data.draw(st.booleans()):  # spans in any order
        ss, se = ss[::-1].copy(), se[::-1].copy()
    got = overlap_mask(starts, ends, ss, se).tolist()
    assert got == _loop(starts.tolist(), ends.tolist(), ss.tolist(), se.tolist())


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=60), data=st.data())
def test_character_offsets_to_bytes(text, data):
    from packtool.sft.tokens import _char_to_byte

    chars = data.draw(st.lists(st.integers(0, len(text)), max_size=10))
    got = _char_to_byte(text, np.asarray(chars, np.int64)).tolist()
    assert got == [len(text[:c].encode("utf-8")) for c in chars]


def test_cli_render_processes(tmp_path, monkeypatch):
    from tests.cli import one_error_line, run

    started = spy_pools(monkeypatch)
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(_records(120, 3)) + "\n", "utf-8")
    template = template_file(tmp_path, FAIL + GEN)
    tables = []
    for n in ("2", "0"):
        out = tmp_path / f"t{n}.parquet"
        code, _, err = run(
            "tokenize", path, "-o", out, "--tokenizer", "byte", "--chat-template", template,
            "--render-processes", n,
        )  # fmt: skip
        assert code == 0, err
        tables.append(pq.read_table(out))
    assert started == [2]  # 0: no pool
    assert tables[0].equals(tables[1]) and tables[0].num_rows > 80
    code, _, err = run("tokenize", path, "-o", tmp_path / "x.parquet", "--render-processes", "-1")
    assert code == 1 and "-1" in one_error_line(err)  # a bad value: one line, 1


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_render_workers_end_with_their_driver(method):
    # A driver killed outright (kill -9) left its render workers waiting on their queue.
    code = (
        "import os, sys\n"
        "from packtool.sft.render import RenderPool, Renderer\n"
        "from packtool.sft.template import ChatTemplate\n"
        f"pool = RenderPool(Renderer(ChatTemplate({GEN!r}, name='t'), 'assistant'), 2, {method!r})\n"
        "pids = {pool._executor.submit(os.getpid).result() for _ in range(8)}\n"
        "print(*pids, flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    workers = [int(p) for p in out.stdout.split()]
    assert workers, out.stderr
    deadline = time.monotonic() + 30
    while any(_running(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = [p for p in workers if _running(p)]
    for p in left:
        os.kill(p, 9)
    assert not left


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _trl_generation_templates():
    from tests.packtool.chat_helpers import SPECIALS, templates

    return [(p.name, p, SPECIALS) for p in templates(generation=True)]


@pytest.mark.parametrize(("name", "path", "specials"), _trl_generation_templates())
def test_train_on_last_is_every_block_of_the_last_turn(name, path, specials):
    """`last` took the last `{% generation %}` block: phi-3's training templates close the
    conversation with a block of their own (`{{ eos_token }}`), and diffusion_gemma's cut a turn
    into several, so the last answer went untrained (1 supervised token, `</s>`). Now: the
    `assistant` blocks that start where the whole render parts from the render of the
    conversation before the last turn (phi-3 closes that one with an EOS of its own)."""
    t = ChatTemplate(path.read_text(encoding="utf-8"), special_tokens=specials, name=name)
    said = ("hi", "hello there", "and?", "ok good")
    roles = ("user", "assistant") * 2
    plain = [{"role": r, "content": c} for r, c in zip(roles, said, strict=True)]
    # idefics3, smolvlm and llava_next render content as a list of parts only
    parts = [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in plain]
    for msgs in (plain, parts):
        try:
            text, every = Renderer(t, "assistant").spans(msgs)
        except TemplateFailure:
            continue
        if "ok good" in text:
            break
    else:
        raise AssertionError(f"{name} renders neither plain nor list-of-parts content")
    before = t.render(msgs[:3]).text
    _, last = Renderer(t, "last").spans(msgs)
    start = len(os.path.commonprefix([text, before]))
    assert last == [(a, b) for a, b in every if a >= start], name
    assert "ok good" in "".join(text[a:b] for a, b in last), name
    assert "hello there" not in "".join(text[a:b] for a, b in last), name


@pytest.mark.parametrize(("name", "path", "specials"), _trl_generation_templates())
def test_train_on_last_with_the_answer_first_is_that_answer(name, path, specials):
    """A conversation whose last assistant turn is message 0 was a `template_error` skip with
    `--train-on last` (qwen2_5_training: 'list object has no element 0', phi3_training: 'no
    element -1'): the render before that turn was of an empty list, which real templates
    cannot render. Nothing comes before it: `last` is what `assistant` gives (its only turn)."""
    t = ChatTemplate(path.read_text(encoding="utf-8"), special_tokens=specials, name=name)
    for msgs in (
        [{"role": "assistant", "content": "hello there"}],
        [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "u"}],
    ):
        try:
            every = Renderer(t, "assistant").spans(msgs)
        except TemplateFailure:  # the template refuses the conversation (gemma3: roles)
            with pytest.raises(TemplateFailure):
                Renderer(t, "last").spans(msgs)
            continue
        assert Renderer(t, "last").spans(msgs) == every, (name, msgs)


STATEFUL = {
    # a cycler advanced once a message and read after the loop (audit t8: the generation
    # prompt's '>' came from it, and the whole render's loop had moved it on)
    "cycler_after": "{%- set c = cycler('', '>') -%}"
    "{%- for m in messages -%}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{{ c.next() and '' }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<assistant>{{ c.current }}{%- endif -%}",
    # a joiner used in the loop and called after it (an answer starting '|' after no user
    # turn: the whole render's joiner, used by a later user turn, wrote it in the prompt)
    "joiner_after": "{%- set j = joiner('|') -%}{%- for m in messages -%}"
    "{%- if m.role == 'user' %}{{ j() }}{% endif %}<{{ m.role }}>{{ m.content }}"
    "{%- endfor -%}{%- if add_generation_prompt -%}<assistant>{{ j() }}{%- endif -%}",
    # both changed in the loop, and nothing read after it: every turn is known
    "inside_only": "{%- set c = cycler('a', 'b') -%}{%- for m in messages -%}"
    "{%- set j = joiner(',') -%}<{{ m.role }}>{{ j() }}{{ m.content }}{{ j() }}"
    "{{ c.next() }}{{ c.next() }}{{ c.reset() or '' }}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<assistant>{%- endif -%}",
}


def _prefix_render_spans(t, msgs):
    """The turn spans by prefix renders (quadratic: the definition), or None where undefined."""
    whole = t.render(msgs).text
    spans = []
    for k, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = t.render(msgs[:k], add_generation_prompt=True).text
        upto = t.render(msgs[: k + 1]).text
        if not (whole.startswith(before) and whole.startswith(upto)) or len(before) > len(upto):
            return None
        spans.append((len(before), len(upto)))
    return whole, spans


@pytest.mark.parametrize("name", sorted(STATEFUL))
@settings(max_examples=40, deadline=None)
@given(
    convo=st.lists(
        st.tuples(st.sampled_from(["user", "assistant"]), st.sampled_from(["", "x", ">", "|"])),
        min_size=1,
        max_size=5,
    )
)
def test_a_cycler_or_joiner_carried_across_turns_is_never_a_wrong_turn_mask(name, convo):
    """The turn-by-turn masks watched `namespace` only: a template keeping state across turns
    in jinja2's `cycler` or `joiner` got a mask no prefix render gives, with no skip (audit t8:
    '>hi</assistant>' supervised where the prefix renders give 'hi</assistant>'). Now their
    state is watched as a namespace's: wherever a mask is given it is the prefix renders'."""
    from packtool.sft.turns import NotIncremental

    t = ChatTemplate(STATEFUL[name], name=name)
    msgs = [{"role": r, "content": c} for r, c in convo]
    ref = _prefix_render_spans(t, msgs)
    try:
        got = Renderer(t, "assistant").spans(msgs)
    except NotIncremental:
        assert name != "inside_only", msgs  # no skip where nothing is carried
        return
    assert ref is not None and got == ref, (name, msgs)


def test_the_audited_cycler_conversation_is_a_counted_skip():
    t = ChatTemplate(STATEFUL["cycler_after"], name="cycler.jinja")
    conv = [{"role": "user", "content": "u"}, {"role": "assistant", "content": ">hi"}]
    (r,) = encode_chat([conv], template=t, tokenizer=load_tokenizer("byte"), processes=0)
    assert r.skip == "template_not_incremental" and "cycler" in r.detail


PARTS = GEN.replace(
    "{{ m.content }}",
    "{% if m.content is string %}{{ m.content }}"
    "{% else %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endif %}",
)
"""GEN reading a content of parts as Llama 3's and Qwen's templates do."""


@pytest.mark.parametrize("train_on", ["all", "assistant", "last"])
def test_content_parts_a_template_prints_as_a_list_are_a_counted_skip(train_on):
    # OpenAI-style content parts reached a template written for strings, which wrote the
    # list as Python does ("[{'type': 'text', 'text': '4'}]"): trained on, in silence.
    parts = [{"type": "text", "text": "4"}]
    conv = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": parts}]
    plain = [conv[0], {"role": "assistant", "content": "4"}]
    for source, kept in ((GEN, False), (PARTS, True)):
        r = Renderer(ChatTemplate(source, name="t"), train_on).render_batch(
            [conv, plain], convert=True, drop_unsupervised=True
        )
        if kept:  # a template that reads the parts renders what the string renders
            assert r.kept.tolist() == [0, 1] and r.skips == []
            assert len(set(r.texts())) == 1 and "'type'" not in r.text
        else:
            assert r.kept.tolist() == [1]
            assert r.skips == [(0, "content_parts", (
                "message 1's content is a list of parts, which the chat template writes as "
                "Python does; give the content as a string, or a template that reads parts"
            ))]  # fmt: skip
    # An empty content writes "[]", which a text may hold anyway: not taken for parts.
    empty = [
        {"role": "user", "content": "why is x = [] falsy?"},
        {"role": "assistant", "content": []},
    ]
    r = Renderer(ChatTemplate(GEN, name="t"), train_on).render_batch(
        [empty], convert=True, drop_unsupervised=False
    )
    assert r.kept.tolist() == [0] and r.skips == []
