"""Generate the sample corpus: `python sample_data/generate.py` rewrites it byte-identically.

A few thousand synthetic documents with the length shape real corpora have: a log-normal body
(most documents a few hundred bytes), a long tail with documents far beyond 8k tokens, a handful
of empty documents, and non-ASCII text (accents, CJK, emoji). Words follow a Zipf law so a BPE
trained on the corpus learns something real. Written as JSONL and as Parquet (same documents),
plus a folder of plain-text files (one document per file).

Also `chat.jsonl`: a fine-tuning set of conversations (`{"messages": [...]}`, from its own seed,
so the corpus above does not change): a system prompt in about half, 1 to 8 user/assistant
exchanges (most 1 to 3), short questions, longer answers with a long tail, so that some
conversations are longer than a 1,024-token row (byte tokenizer). Each answer repeats a few words
of its question, so a model trained on the answers alone has something to learn from the prompt.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SEED = 20261129
CHAT_SEED = 20261201
N_CHATS = 700
N_BODY = 4000
N_TAIL = 24
N_EMPTY = 6
N_TEXT_FILES = 40
HERE = Path(__file__).resolve().parent

_SYLLABLES = [
    "ka", "to", "ri", "ne", "sa", "mo", "lu", "pe", "di", "an", "or", "is", "el", "um", "ba",
    "ve", "qu", "th", "st", "ch", "ex", "in", "al", "co", "re", "pro", "tion", "ment", "ing",
]
_FOREIGN = [
    "café", "naïve", "Größe", "über", "façade", "señor", "日本語", "東京", "データ", "学习",
    "модель", "данные", "λόγος", "🙂", "🚀", "données", "smörgåsbord", "ünïcödé",
]
_SOURCES = ["web", "books", "code", "forum"]
_LANGS = ["en", "de", "fr", "ja"]


def _vocabulary(rng: np.random.Generator, size: int = 3000) -> list[str]:
    words = set()
    while len(words) < size:
        n = int(rng.integers(1, 4))
        words.add("".join(rng.choice(_SYLLABLES, size=n)))
    return sorted(words) + _FOREIGN


def _document(rng: np.random.Generator, vocab: list[str], weights: np.ndarray, n_bytes: int) -> str:
    parts: list[str] = []
    size = 0
    while size < n_bytes:
        n_words = int(rng.integers(4, 18))
        idx = rng.choice(len(vocab), size=n_words, p=weights)
        sentence = " ".join(vocab[i] for i in idx)
        sentence = sentence[0].upper() + sentence[1:] + rng.choice([".", ".", ".", "?", "!"])
        parts.append(sentence)
        size += len(sentence.encode("utf-8")) + 1
        if rng.random() < 0.08:
            parts.append("\n\n")
    text = " ".join(parts).replace(" \n\n ", "\n\n")
    return text.encode("utf-8")[:n_bytes].decode("utf-8", errors="ignore").strip()


def build() -> list[dict]:
    rng = np.random.default_rng(SEED)
    vocab = _vocabulary(rng)
    ranks = np.arange(1, len(vocab) + 1, dtype=np.float64)
    weights = 1.0 / ranks**1.1
    weights[-len(_FOREIGN):] = weights[len(vocab) // 20]  # foreign words are not rare
    weights /= weights.sum()

    body = np.clip(rng.lognormal(mean=np.log(320), sigma=1.0, size=N_BODY), 8, 7000).astype(int)
    tail = rng.integers(9000, 60000, size=N_TAIL)
    lengths = np.concatenate([body, tail, np.zeros(N_EMPTY, dtype=int)])
    rng.shuffle(lengths)

    docs = []
    for i, n in enumerate(lengths):
        text = _document(rng, vocab, weights, int(n)) if n > 0 else ""
        docs.append(
            {
                "id": f"doc-{i:05d}",
                "text": text,
                "source": str(rng.choice(_SOURCES, p=[0.5, 0.2, 0.2, 0.1])),
                "lang": str(rng.choice(_LANGS, p=[0.7, 0.1, 0.1, 0.1])),
            }
        )
    return docs


_SYSTEM = [
    "You are a helpful assistant.",
    "Answer briefly and precisely.",
    "You are a careful tutor: explain each step.",
    "Reply in the language of the question.",
]


def build_chat() -> list[dict]:
    """Conversations for fine-tuning (see the module docstring)."""
    rng = np.random.default_rng(CHAT_SEED)
    vocab = _vocabulary(np.random.default_rng(SEED))  # the corpus's words, its generator untouched
    ranks = np.arange(1, len(vocab) + 1, dtype=np.float64)
    weights = 1.0 / ranks**1.1
    weights /= weights.sum()
    chats = []
    for i in range(N_CHATS):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": str(rng.choice(_SYSTEM))})
        for _ in range(min(8, int(rng.geometric(0.45)))):
            q_len = int(np.clip(rng.lognormal(np.log(70), 0.6), 8, 600))
            a_len = int(np.clip(rng.lognormal(np.log(260), 0.9), 4, 6000))
            question = _document(rng, vocab, weights, q_len)
            words = question.split()
            echo = " ".join(words[: int(rng.integers(1, 4))]) if words else ""
            answer = (echo + " " + _document(rng, vocab, weights, a_len)).strip()
            messages.append({"role": "user", "content": question})
            messages.append({"role": "assistant", "content": answer})
        chats.append({"id": f"chat-{i:05d}", "messages": messages})
    return chats


def write(docs: list[dict], out: Path = HERE) -> None:
    with open(out / "corpus.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for doc in docs:
            f.write(json.dumps(doc, ensure_ascii=False, sort_keys=True) + "\n")
    table = pa.table({k: [d[k] for d in docs] for k in ("id", "text", "source", "lang")})
    pq.write_table(table, out / "corpus.parquet", compression="zstd", row_group_size=1000)
    text_dir = out / "text"
    text_dir.mkdir(exist_ok=True)
    for old in text_dir.glob("*.txt"):
        old.unlink()
    non_empty = [d for d in docs if d["text"]][:N_TEXT_FILES]
    for doc in non_empty:
        (text_dir / f"{doc['id']}.txt").write_text(doc["text"] + "\n", encoding="utf-8")
    with open(out / "chat.jsonl", "w", encoding="utf-8", newline="\n") as f:
        for chat in build_chat():
            f.write(json.dumps(chat, ensure_ascii=False, sort_keys=True) + "\n")


if __name__ == "__main__":
    write(build())
