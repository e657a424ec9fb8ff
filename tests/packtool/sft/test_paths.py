"""The loss mask of chat and prompt/completion records survives every path: the local and the
Ray engine, resume, verify, stats, the loader's three layouts, online packing and its resume.

Every conversation comes out whole (truncated to max_len, never split), with exactly the ids and
mask `encode_chat` gives it on its own."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from loader import PackedDataLoader, PackedDataset, StreamingPackedDataset
from loader.collate import IGNORE_INDEX
from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import read_manifest
from packtool.dataset.shards import ShardConfig
from packtool.engines import records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import staging_folder
from packtool.errors import DataError
from packtool.pack.chunk import PackConfig
from packtool.read import docids
from packtool.read.documents import ReadConfig
from packtool.read.sft_config import SFTConfig
from packtool.sft.encode import encode_chat
from packtool.sft.template import load_chat_template
from packtool.stats.lengths import StatsConfig, compute_stats
from packtool.stats.report import render_report
from packtool.tokenize.tokenize import tokenize_corpus
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.pack.test_mask import pieces, shard_bytes
from tests.packtool.sft.test_inputs import GEN

MAX_LEN = 160


def make_chats(n: int = 240, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "café", "日本", "🙂", "delta", "x"]
    chats = []
    for _ in range(n):
        msgs = [{"role": "system", "content": "sys"}] if rng.random() < 0.4 else []
        for _turn in range(int(rng.integers(1, 5))):
            for role, size in (("user", 6), ("assistant", 14)):
                k = int(rng.integers(0, size))
                msgs.append({"role": role, "content": " ".join(rng.choice(words, k))})
        if rng.random() < 0.1:
            msgs = msgs[:-1]  # ends with a question: nothing to learn, a counted skip
        chats.append(msgs)
    return chats


@pytest.fixture(scope="module")
def chat(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("chat")
    template = tmp / "chat.jinja"
    template.write_text(GEN, "utf-8")
    chats = make_chats()
    paths = []
    for f in range(2):  # two files
        path = tmp / f"chat-{f}.jsonl"
        part = chats[f * len(chats) // 2 : (f + 1) * len(chats) // 2]
        path.write_text("".join(json.dumps({"messages": c}) + "\n" for c in part), "utf-8")
        paths.append(path)
    kept, expected = [], {}
    for f in range(2):
        part = chats[f * len(chats) // 2 : (f + 1) * len(chats) // 2]
        encoded = encode_chat(
            part, template=load_chat_template(template), tokenizer=load_tokenizer("byte")
        )
        kept += [r for r in encoded if r.skip is None]
        # Ids: the input file's index and the byte where the record's line starts, so the
        # records skipped before it move no id.
        lines = [len((json.dumps({"messages": c}) + "\n").encode()) for c in part]
        starts = np.concatenate([[0], np.cumsum(lines)[:-1]]).tolist()
        for r, start in zip(encoded, starts, strict=True):
            if r.skip is not None:
                continue
            ids, mask = r.ids[:MAX_LEN].tolist(), r.mask[:MAX_LEN].tolist()
            if sum(mask):
                expected[docids.encode(f, start)] = (ids, mask, 0)
    return {
        "paths": paths,
        "read": ReadConfig(sft=SFTConfig(chat_template=str(template))),
        "expected": expected,
        "skipped": len(chats) - len(kept),
        "truncated": sum(1 for r in kept if len(r.ids) > MAX_LEN and r.mask[:MAX_LEN].any()),
    }


def config(out: Path, chat, **kw) -> RunConfig:
    kw.setdefault("chunk_docs", 60)
    return RunConfig(
        inputs=tuple(map(str, chat["paths"])),
        out_dir=str(out),
        pack=PackConfig(max_len=MAX_LEN, long_docs="truncate"),
        shards=ShardConfig(shard_rows=30, row_group_rows=8),
        read=chat["read"],
        progress=False,
        **kw,
    )


def packed_pieces(out: Path):
    return pieces(pq.read_table(sorted(str(p) for p in out.glob("shard-*.parquet"))))


def test_local_engine_keeps_each_conversation_whole_with_its_mask(chat, tmp_path):
    summary = run_pack(config(tmp_path / "out", chat))
    assert packed_pieces(tmp_path / "out") == chat["expected"]
    c = summary.counts
    assert c.documents_truncated == chat["truncated"] > 0
    assert summary.skips == {"no_supervised_tokens": chat["skipped"]}
    assert c.tokens_supervised == sum(sum(m) for _, m, _ in chat["expected"].values())
    report = verify_dataset(tmp_path / "out")
    assert report.supervised_tokens == c.tokens_supervised
    assert "loss_mask" in read_manifest(tmp_path / "out").columns


def test_resume_gives_the_same_bytes(chat, tmp_path, monkeypatch):
    kw = {"partition_size": 1, "workers": 1}  # one partition per file
    run_pack(config(tmp_path / "whole", chat, **kw))
    _interrupted(tmp_path / "cut", chat, chat["read"], monkeypatch)
    summary = run_pack(config(tmp_path / "cut", chat, resume=True, **kw))
    assert summary.resumed_partitions == 1 and summary.partitions == 2
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")


def test_ray_engine_writes_the_same_bytes(ray_session, chat, tmp_path):
    from packtool.engines.ray import RayConfig, run_pack_ray

    want = run_pack(config(tmp_path / "local", chat))
    got = run_pack_ray(config(tmp_path / "ray", chat), RayConfig())
    assert shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
    assert got.counts == want.counts


def supervised_targets(expected) -> int:
    return sum(sum(m[1:]) for _, m, _ in expected.values())  # a first token is never a target


@pytest.mark.parametrize(
    "settings_",
    [
        {"rows_per_batch": 3},
        {"rows_per_batch": 3, "layout": "hf"},
        {"tokens_per_batch": 2 * MAX_LEN, "static_shape": True, "max_docs_per_batch": 64},
    ],
    ids=["varlen", "hf", "static"],
)
def test_every_layout_labels_exactly_the_supervised_targets(chat, tmp_path, settings_):
    run_pack(config(tmp_path / "out", chat))
    by_token = {}  # (doc id, position) -> supervised
    for doc, (_, mask, _) in chat["expected"].items():
        for k, m in enumerate(mask):
            by_token[doc, k] = m
    layout = settings_.get("layout", "packtool")
    n = 0
    for b in PackedDataset(tmp_path / "out", seed=3, **settings_):
        labels = b["labels"].reshape(-1).numpy()
        cu = (b["cu_seqlens"] if layout == "packtool" else b["cu_seq_lens_q"]).numpy()
        doc_ids = b["doc_ids"].numpy() if "doc_ids" in b else None
        for t in np.flatnonzero(labels != IGNORE_INDEX):
            target = t + 1 if layout == "packtool" else t
            d = int(np.searchsorted(cu, target, side="right") - 1)
            assert cu[d] < target  # never a document's first token
            if doc_ids is not None:
                assert by_token[int(doc_ids[d]), int(target - cu[d])] == 1
        counts = np.diff(np.searchsorted(np.flatnonzero(labels != IGNORE_INDEX), cu))
        assert b["doc_targets"].tolist() == counts.tolist()
        n += int((labels != IGNORE_INDEX).sum())
    assert n == supervised_targets(chat["expected"])


def test_worker_transport_and_online_packing_keep_the_mask(chat, tmp_path):
    run_pack(config(tmp_path / "out", chat))
    ds = PackedDataset(tmp_path / "out", rows_per_batch=3, seed=0)
    want = [b["labels"].tolist() for b in ds]
    assert [b["labels"].tolist() for b in PackedDataLoader(ds, num_workers=2)] == want
    # Online: tokenized once, packed as it streams, stopped and resumed.
    tok = tmp_path / "tok.parquet"
    tokenize_corpus(chat["paths"], tok, read_config=chat["read"])
    kw = {"max_len": MAX_LEN, "buffer_docs": 32, "long_docs": "truncate", "rows_per_batch": 2}
    batches = list(StreamingPackedDataset([tok], **kw))
    total = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in batches)
    assert total == supervised_targets(chat["expected"])
    it = iter(stream := StreamingPackedDataset([tok], **kw))
    head = [next(it) for _ in range(4)]
    resumed = StreamingPackedDataset([tok], **kw)
    resumed.load_state_dict(copy.deepcopy(stream.state_dict()))
    again = [b["labels"].tolist() for b in head + list(resumed)]
    assert again == [b["labels"].tolist() for b in batches]


def test_stats_projects_what_pack_does_for_chat(chat, tmp_path):
    summary = run_pack(config(tmp_path / "out", chat, chunk_docs=10_000))
    stats = compute_stats(
        chat["paths"], StatsConfig(max_len=MAX_LEN, candidates=(MAX_LEN,)), read_config=chat["read"]
    )
    at = stats.supervised.at[MAX_LEN]
    assert at.supervised_tokens == summary.counts.tokens_supervised
    assert at.rows == summary.counts.rows
    assert at.documents_truncated == summary.counts.documents_truncated
    assert "supervised eff." in render_report(stats)


def test_prompt_completion_through_the_engine(tmp_path):
    rng = np.random.default_rng(1)
    records = [
        {"prompt": "q" * int(rng.integers(0, 30)), "completion": "a" * int(rng.integers(0, 30))}
        for _ in range(100)
    ]
    path = tmp_path / "pc.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    run_pack(
        RunConfig(
            inputs=(str(path),),
            out_dir=str(tmp_path / "out"),
            pack=PackConfig(max_len=40, long_docs="truncate"),
            progress=False,
        )
    )
    got = packed_pieces(tmp_path / "out")
    lines = [len(json.dumps(r)) + 1 for r in records]
    for doc, r in zip(np.concatenate([[0], np.cumsum(lines)[:-1]]).tolist(), records, strict=True):
        # (a record's id: the byte its line starts at, in input file 0)
        p, c = len(r["prompt"]), len(r["completion"])
        ids = ([113] * p + [97] * c + [256])[:40]
        mask = ([0] * p + [1] * (c + 1))[:40]
        if sum(mask):
            assert got[doc] == (ids, mask, 0)
        else:
            assert doc not in got  # the prompt filled the row: nothing supervised is left


def test_truncation_that_leaves_no_supervised_token_drops_a_dataset_verify_accepts(tmp_path):
    """Under `truncate` a conversation whose every supervised token lies past max_len is dropped
    (counted as unsupervised); the dataset is still one verify and the loader accept."""
    template = tmp_path / "chat.jinja"
    template.write_text(GEN, "utf-8")
    chats = [
        [{"role": "user", "content": "long " * 60}, {"role": "assistant", "content": "fine"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a short answer"}],
    ]
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(json.dumps({"messages": c}) + "\n" for c in chats), "utf-8")
    read = ReadConfig(sft=SFTConfig(chat_template=str(template)))
    summary = run_pack(config(tmp_path / "out", {"paths": [src], "read": read}))
    c = summary.counts
    assert (c.documents_packed, c.documents_dropped, c.documents_unsupervised) == (1, 1, 1)
    assert verify_dataset(tmp_path / "out").supervised_tokens == c.tokens_supervised > 0
    assert len(PackedDataset(tmp_path / "out", rows_per_batch=1)) == 1
    # Any other drop under truncate is an inconsistent manifest.
    index = tmp_path / "out" / "index.json"
    manifest = json.loads(index.read_text())
    manifest["counts"]["documents_unsupervised"] = 0
    index.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match="documents_dropped is 1 .* but long_docs is 'truncate'"):
        verify_dataset(tmp_path / "out")


def test_a_skipped_record_moves_no_later_id_and_inspect_names_each_records_line(tmp_path):
    """Ids were the k-th record kept, shown as `record k`: after a skipped record every later
    conversation was attributed to the record before it (the bad one, first)."""
    from packtool.audit.inspect import read_row

    template = tmp_path / "chat.jinja"
    template.write_text(GEN, "utf-8")
    good = [
        [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        for i in range(4)
    ]
    lines = [json.dumps({"messages": good[0]}), json.dumps({"messages": "bad"})]
    lines += [json.dumps({"messages": c}) for c in good[1:]]
    src = tmp_path / "chat.jsonl"
    src.write_text("".join(line + "\n" for line in lines), "utf-8")
    read = ReadConfig(sft=SFTConfig(chat_template=str(template)))
    summary = run_pack(config(tmp_path / "out", {"paths": [src], "read": read}))
    assert sum(summary.skips.values()) == 1
    table = pq.read_table(sorted(str(p) for p in (tmp_path / "out").glob("shard-*.parquet")))
    ids = sorted(i for row in table.column("doc_ids").to_pylist() for i in row)
    starts = [sum(len(x) + 1 for x in lines[:k]) for k in range(len(lines))]
    assert ids == [docids.encode(0, starts[k]) for k in (0, 2, 3, 4)]
    shown = sorted(
        (d.doc_id, d.source)
        for row in range(table.num_rows)
        for d in read_row(tmp_path / "out", row).documents
    )
    # 1-based line numbers of the good records (never the bad line 2).
    assert [s.split("chat.jsonl:")[1] for _, s in shown] == [
        f"line {k + 1} (byte {starts[k]})" for k in (0, 2, 3, 4)
    ]


def _interrupted(out: Path, chat, read: ReadConfig, monkeypatch, tokenizer=None) -> None:
    """A run into `out` stopped after its first partition (one per input file)."""
    real = worker.write_chunk
    staging = staging_folder(out)

    def crash_in_the_second_partition(*args, **kwargs):
        if records.finished(staging):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "write_chunk", crash_in_the_second_partition)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(out, {**chat, "read": read}, partition_size=1, workers=1), tokenizer)
    monkeypatch.setattr(worker, "write_chunk", real)


def test_resume_refuses_a_changed_template_file(chat, tmp_path, monkeypatch):
    """The fingerprint held the --chat-template path, not its text: a template edited between
    the interrupted run and --resume was accepted, and the dataset held conversations of both
    renderings (2,900 old and 5,500 new in the audit's run)."""
    import hashlib

    from packtool.errors import AlreadyComplete, ConfigError

    tpl = tmp_path / "t.jinja"
    tpl.write_text(GEN, "utf-8")
    read = ReadConfig(sft=SFTConfig(chat_template=str(tpl)))
    resume = config(
        tmp_path / "out", {**chat, "read": read}, partition_size=1, workers=1, resume=True
    )
    _interrupted(tmp_path / "out", chat, read, monkeypatch)
    tpl.write_text(GEN.replace("<|end|>", "<|eot|>"), "utf-8")
    with pytest.raises(ConfigError, match=r"options or inputs differ \(chat_template\.sha256: "):
        run_pack(resume)
    tpl.write_text(GEN, "utf-8")
    summary = run_pack(resume)
    assert summary.resumed_partitions == 1
    assert packed_pieces(tmp_path / "out") == chat["expected"]
    recorded = read_manifest(tmp_path / "out").extra["chat_template"]
    assert recorded["sha256"] == hashlib.sha256(GEN.encode()).hexdigest()
    with pytest.raises(AlreadyComplete):
        run_pack(resume)
    tpl.write_text(GEN.replace("<|end|>", "<|eot|>"), "utf-8")
    with pytest.raises(ConfigError, match="a finished dataset of other options or inputs"):
        run_pack(resume)


def test_resume_refuses_a_changed_tokenizer_template(chat, tmp_path, monkeypatch):
    """The tokenizer's identity hashed tokenizer.json alone: an edited chat_template in
    tokenizer_config.json, or a chat_template.jinja added beside it, was resumed as well."""
    from packtool.errors import ConfigError
    from tests.packtool.chat_helpers import trained_tokenizer_dir

    folder = tmp_path / "tok"
    folder.mkdir()
    trained = trained_tokenizer_dir(str(tmp_path))
    (folder / "tokenizer.json").write_bytes((trained / "tokenizer.json").read_bytes())
    cfg = {"chat_template": GEN, "eos_token": "</s>"}
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    read = ReadConfig(sft=SFTConfig())
    out = tmp_path / "out"
    _interrupted(out, chat, read, monkeypatch, load_tokenizer(str(folder)))
    resume = config(out, {**chat, "read": read}, partition_size=1, workers=1, resume=True)
    edited = {**cfg, "chat_template": GEN.replace("<|end|>", "<|eot|>")}
    (folder / "tokenizer_config.json").write_text(json.dumps(edited))
    with pytest.raises(ConfigError, match=r"differ \(chat_template\.sha256: "):
        run_pack(resume, load_tokenizer(str(folder)))
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "chat_template.jinja").write_text(GEN.replace("<|end|>", "<|eot|>"))
    with pytest.raises(ConfigError, match=r"differ \(chat_template\.sha256: "):
        run_pack(resume, load_tokenizer(str(folder)))
    (folder / "chat_template.jinja").unlink()
    assert run_pack(resume, load_tokenizer(str(folder))).resumed_partitions == 1


def test_a_run_state_and_dataset_from_before_the_template_record_still_resume(
    chat, tmp_path, monkeypatch
):
    """A run state (or a finished dataset's digest) written before the fingerprint held the
    template: nothing says what it was, so it resumes as before."""
    from packtool.engines.resume_checks import fingerprint_digest
    from packtool.errors import AlreadyComplete

    out = tmp_path / "out"
    _interrupted(out, chat, chat["read"], monkeypatch)
    plan = records.run_dir(staging_folder(out)) / records.PLAN_FILE
    state = json.loads(plan.read_text())
    del state["fingerprint"]["chat_template"]
    # Nor did its input facts have the key (an empty "differ" list refused every old state).
    assert state["inputs_read"].pop("chat_template") is None
    plan.write_text(json.dumps(state))
    resume = config(out, chat, partition_size=1, workers=1, resume=True)
    assert run_pack(resume).resumed_partitions == 1
    index = json.loads((out / "index.json").read_text())
    index["extra"]["fingerprint"] = fingerprint_digest(state["fingerprint"])
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(AlreadyComplete):
        run_pack(resume)


def test_tokenized_conversations_carry_their_template_into_the_pack(chat, tmp_path):
    """`packtool tokenize` of chat records kept no record of the template it rendered with, so a
    pack of its output had none in index.json, unlike a pack of the records themselves."""
    import hashlib

    from packtool.dataset.tokenized import tokenized_meta

    run_pack(config(tmp_path / "direct", chat))
    want = read_manifest(tmp_path / "direct").extra["chat_template"]
    assert want["sha256"] == hashlib.sha256(GEN.encode()).hexdigest()
    tok = tmp_path / "tok.parquet"
    tokenize_corpus(chat["paths"], tok, read_config=chat["read"])
    assert tokenized_meta(tok)["chat_template"] == want
    run_pack(replace(config(tmp_path / "packed", chat), inputs=(str(tok),), read=ReadConfig()))
    assert read_manifest(tmp_path / "packed").extra["chat_template"] == want
    tokenize_corpus([tok], tmp_path / "again.parquet")  # tokenized again: the record goes on
    assert tokenized_meta(tmp_path / "again.parquet")["chat_template"] == want
    # Plain text tokenized records none.
    text = tmp_path / "t.jsonl"
    text.write_text('{"text": "one"}\n', "utf-8")
    tokenize_corpus([text], tmp_path / "t.parquet")
    assert "chat_template" not in tokenized_meta(tmp_path / "t.parquet")


def test_a_template_edited_during_the_run_stops_it(chat, tmp_path, monkeypatch):
    """Each partition worker reads the template file again: edited while the run went on, the
    later partitions rendered with the new text while index.json recorded the old."""
    from packtool.errors import ConfigError

    tpl = tmp_path / "t.jinja"
    tpl.write_text(GEN, "utf-8")
    read = ReadConfig(sft=SFTConfig(chat_template=str(tpl)))
    out = tmp_path / "out"
    real = worker.write_chunk

    def edit_once_the_first_partition_rendered(*args, **kwargs):
        tpl.write_text(GEN.replace("<|end|>", "<|eot|>"), "utf-8")
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "write_chunk", edit_once_the_first_partition_rendered)
    run = config(out, {**chat, "read": read}, partition_size=1, workers=1)
    with pytest.raises(ConfigError, match=r"t\.jinja: the chat template changed during the run"):
        run_pack(run)
    assert not (out / "index.json").exists()
    monkeypatch.setattr(worker, "write_chunk", real)
    tpl.write_text(GEN, "utf-8")  # restored: a run ends with one rendering
    run_pack(run)
    assert packed_pieces(out) == chat["expected"]


def test_a_masked_run_of_the_earlier_mask_rule_is_not_resumed(chat, tmp_path, monkeypatch):
    """Before documents supervised only at their first token were dropped (8398556), a run kept
    them: resumed, its finished partitions held such documents and the rest did not, and
    verify refused the dataset. Its state lacks the rule, so it is refused; a finished dataset
    of the earlier rule is still complete."""
    from packtool.engines.resume_checks import fingerprint_digest
    from packtool.errors import AlreadyComplete, ConfigError

    out = tmp_path / "out"
    _interrupted(out, chat, chat["read"], monkeypatch)
    plan = records.run_dir(staging_folder(out)) / records.PLAN_FILE
    state = json.loads(plan.read_text())
    old = dict(state)
    old["fingerprint"] = {k: v for k, v in state["fingerprint"].items() if k != "loss_mask_rule"}
    assert old["fingerprint"] != state["fingerprint"]
    plan.write_text(json.dumps(old))
    resume = config(out, chat, partition_size=1, workers=1, resume=True)
    with pytest.raises(ConfigError, match=r"options or inputs differ \(loss_mask_rule: "):
        run_pack(resume)
    plan.write_text(json.dumps(state))
    assert run_pack(resume).resumed_partitions == 1
    index = json.loads((out / "index.json").read_text())
    index["extra"]["fingerprint"] = fingerprint_digest(old["fingerprint"])
    (out / "index.json").write_text(json.dumps(index))
    with pytest.raises(AlreadyComplete):
        run_pack(resume)
