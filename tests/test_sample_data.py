"""sample_data/ is what its committed generator makes, byte for byte, with the promised shape."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "sample_data"


def load_generator():
    spec = importlib.util.spec_from_file_location("generate", SAMPLE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_regenerates_byte_identically(tmp_path):
    gen = load_generator()
    gen.write(gen.build(), tmp_path)
    assert (tmp_path / "corpus.jsonl").read_bytes() == (SAMPLE / "corpus.jsonl").read_bytes()
    assert (tmp_path / "chat.jsonl").read_bytes() == (SAMPLE / "chat.jsonl").read_bytes()
    for txt in sorted((SAMPLE / "text").glob("*.txt")):
        assert (tmp_path / "text" / txt.name).read_bytes() == txt.read_bytes()
    assert len(list((tmp_path / "text").glob("*.txt"))) == len(
        list((SAMPLE / "text").glob("*.txt"))
    )
    # Parquet bytes carry the writer's version; the content must be identical.
    assert pq.read_table(tmp_path / "corpus.parquet").equals(
        pq.read_table(SAMPLE / "corpus.parquet")
    )


def test_has_the_promised_shape():
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").read_text("utf-8").splitlines()]
    sizes = sorted(len(d["text"].encode("utf-8")) for d in docs)
    assert 2000 <= len(docs) <= 10_000
    assert sum(1 for s in sizes if s == 0) >= 3  # a few empty documents
    assert sum(1 for s in sizes if s > 8192) >= 10  # a long tail beyond 8k byte tokens
    assert sizes[len(sizes) // 2] < sizes[-1] / 50  # skewed: the median is far below the max
    assert any(any(ord(c) > 127 for c in d["text"]) for d in docs)  # non-ASCII text
    total = sum(p.stat().st_size for p in SAMPLE.rglob("*") if p.is_file())
    assert total < 6 * 2**20  # a few MB


def test_chat_data_has_the_promised_shape():
    chats = [json.loads(line) for line in (SAMPLE / "chat.jsonl").read_text("utf-8").splitlines()]
    assert 500 <= len(chats) <= 2000
    turns, sizes, systems = [], [], 0
    for chat in chats:
        roles = [m["role"] for m in chat["messages"]]
        if roles[0] == "system":
            systems += 1
            roles = roles[1:]
        assert roles == ["user", "assistant"] * (len(roles) // 2)  # alternating, ends answered
        turns.append(len(roles) // 2)
        sizes.append(sum(len(m["content"].encode("utf-8")) for m in chat["messages"]))
    assert min(turns) == 1 and max(turns) == 8
    assert sum(t == 1 for t in turns) > sum(t >= 4 for t in turns)  # most are short
    assert 0.3 < systems / len(chats) < 0.7
    assert sum(s > 2048 for s in sizes) >= 20  # some are longer than a 2,048-token byte row
    assert sorted(sizes)[len(sizes) // 2] < 2048
