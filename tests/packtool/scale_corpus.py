"""A generated corpus of many files of mixed kinds and sizes, for the partition-engine tests.

`make_corpus(folder)` writes, in a fixed order (file names sort in it):

- `n_tiny` tiny JSON Lines files of 0-6 documents (some empty, some without a final newline,
  some with CRLF endings or a BOM);
- one JSON Lines file of ~`big_bytes` bytes, larger than the partition size the tests use, so
  the plan cuts it into byte ranges (CRLF endings, a BOM, malformed and invalid-UTF-8 lines);
- a few `.jsonl.zst` files (read whole);
- a few text Parquet files, one with many row groups and larger than a partition (cut between
  row groups).

Everything is a pure function of `seed`; nothing is read from outside.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

WORDS = [
    *("pack", "rows", "tokens", "shard", "loader", "ray", "plan", "partition", "resume"),
    *("offset", "line", "byte", "file", "cluster", "worker", "record", "tail", "chunk"),
    *("efficiency", "bound", "histogram", "manifest", "seed", "order", "epoch", "node"),
]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def _jsonl(rng: random.Random, texts: list[str], *, crlf: bool, bom: bool, final: bool) -> bytes:
    end = b"\r\n" if crlf else b"\n"
    lines = [json.dumps({"text": t}).encode() for t in texts]
    data = end.join(lines) + (end if final and lines else b"")
    return (b"\xef\xbb\xbf" if bom else b"") + data


def make_corpus(
    folder: Path, *, n_tiny: int = 1000, big_bytes: int = 400_000, seed: int = 0
) -> list[Path]:
    """Write the corpus into `folder`; return its files in reading order."""
    import zstandard

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for i in range(n_tiny):
        texts = [_text(rng, 1, 40) for _ in range(rng.choice([0, 1, 1, 2, 3, 6]))]
        data = _jsonl(
            rng, texts, crlf=i % 7 == 0, bom=i % 11 == 0, final=i % 5 != 0
        )  # every 5th without a final newline
        path = folder / f"a-{i:04d}.jsonl"
        path.write_bytes(data)
        paths.append(path)
    # The big file: cut into byte ranges by a plan with a smaller partition size.
    lines: list[bytes] = []
    size = 0
    k = 0
    while size < big_bytes:
        if k % 97 == 13:
            line = b'{"text": "broken'  # malformed JSON: a counted skip
        elif k % 101 == 17:
            line = b'{"text": "bad \xff utf-8"}'  # invalid UTF-8: a counted skip
        else:
            line = json.dumps({"text": _text(rng, 5, 400)}).encode()
        line += b"\r\n" if k % 3 == 0 else b"\n"
        lines.append(line)
        size += len(line)
        k += 1
    big = folder / "b-big.jsonl"
    big.write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    paths.append(big)
    for i in range(3):
        texts = [_text(rng, 3, 120) for _ in range(rng.randint(20, 80))]
        path = folder / f"c-{i}.jsonl.zst"
        path.write_bytes(
            zstandard.ZstdCompressor().compress(
                _jsonl(rng, texts, crlf=False, bom=False, final=True)
            )
        )
        paths.append(path)
    for i, (docs, group) in enumerate([(40, 40), (60, 30), (1500, 50)]):
        texts = [_text(rng, 3, 200) for _ in range(docs)]
        path = folder / f"d-{i}.parquet"
        pq.write_table(pa.table({"text": texts}), path, row_group_size=group)
        paths.append(path)
    return paths
