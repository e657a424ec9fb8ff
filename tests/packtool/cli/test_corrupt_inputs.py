"""Truncated and corrupt inputs at every command that reads a corpus: one line, never a traceback.

Every read path goes through `packtool.read.compressed.read_errors` (the record-kind probe of
fine-tuning data, the `.json` array check and the readers alike), so a `.zst` that holds plain
text or gzip bytes, a gzip stream cut short, a Parquet file cut or scribbled on, or a JSON array
cut in the middle ends `stats`, `tokenize` and `pack` with exit code 1 and one `error:` line
naming the file. Damage that leaves the data readable may succeed; it must still not crash.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.cli import one_error_line, run

TEXTS = [f"document {i}: " + "word " * (i * 7 % 40) for i in range(60)]
JSONL = b"".join(json.dumps({"text": t}).encode() + b"\n" for t in TEXTS)
CHAT = b"".join(
    json.dumps(
        {"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": t}]}
    ).encode()
    + b"\n"
    for t in TEXTS
)


def _parquet() -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table({"text": TEXTS}), sink, row_group_size=16)
    return sink.getvalue()


ENCODE = {
    "plain": lambda data: data,
    "gzip": gzip.compress,
    "zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}
FILES = {  # name -> (content, how it is encoded)
    "corpus.jsonl.gz": (JSONL, "gzip"),
    "corpus.jsonl.zst": (JSONL, "zstd"),
    "chat.jsonl.zst": (CHAT, "zstd"),  # read first by the record-kind probe
    "corpus.txt.gz": (b"one document of plain text\n" * 50, "gzip"),
    "corpus.txt.zst": (b"one document of plain text\n" * 50, "zstd"),
    "corpus.json": (json.dumps([{"text": t} for t in TEXTS]).encode(), "plain"),
    "corpus.parquet": (_parquet(), "plain"),
}
DAMAGE = ("truncate", "scribble", "plain bytes", "gzip bytes", "zstd bytes")


def damaged(name: str, damage: str, where: float) -> bytes:
    content, encoding = FILES[name]
    if damage in ("plain bytes", "gzip bytes", "zstd bytes"):  # what the name does not say
        return ENCODE[damage.split()[0]](content)
    data = ENCODE[encoding](content)
    cut = max(1, int(len(data) * where))
    if damage == "truncate":
        return data[: min(cut, len(data) - 1)]
    return data[:cut] + bytes(b ^ 0x5A for b in data[cut : cut + 64]) + data[cut + 64 :]


TEMPLATE = Path(__file__).resolve().parents[3] / "examples" / "chat_template.jinja"
COMMANDS = {
    "stats": lambda path, out: ["stats", path, *_chat(path)],
    "tokenize": lambda path, out: ["tokenize", path, "-o", out / "tok.parquet", *_chat(path)],
    "pack": lambda path, out: ["pack", path, "-o", out / "packed", "--workers", "1", *_chat(path)],
}


def _chat(path: Path) -> list[object]:
    return ["--chat-template", TEMPLATE] if path.name.startswith("chat") else []


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    name=st.sampled_from(sorted(FILES)),
    damage=st.sampled_from(DAMAGE),
    where=st.floats(0.0, 1.0),
    command=st.sampled_from(sorted(COMMANDS)),
)
def test_a_damaged_input_is_one_line_at_every_command(
    tmp_path_factory, name, damage, where, command
):
    folder = tmp_path_factory.mktemp("damaged")
    path = folder / name
    path.write_bytes(damaged(name, damage, where))
    code, _, err = run(*COMMANDS[command](path, folder))
    assert code in (0, 1), err
    if code == 1:
        assert str(path.name) in one_error_line(err)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("name", "damage", "says"),
    [
        ("corpus.jsonl.zst", "plain bytes", "drop the .zst"),
        ("corpus.jsonl.zst", "gzip bytes", "holds gzip-compressed data: name it with .gz"),
        ("chat.jsonl.zst", "gzip bytes", "holds gzip-compressed data: name it with .gz"),
        ("corpus.jsonl.gz", "plain bytes", "Not a gzipped file"),
        ("corpus.jsonl.gz", "plain bytes", "the file is not compressed: drop the .gz"),
        ("corpus.jsonl.gz", "truncate", "truncated"),
        ("corpus.txt.zst", "truncate", "truncated"),
    ],
)
def test_a_file_that_is_not_what_its_name_says_is_named_with_the_fix(
    tmp_path, command, name, damage, says
):
    # The defect: a `.zst` holding plain text or gzip bytes was a zstandard.ZstdError traceback
    # from all three commands (raised in the fine-tuning record-kind probe).
    path = tmp_path / name
    path.write_bytes(damaged(name, damage, 0.5))
    code, _, err = run(*COMMANDS[command](path, tmp_path))
    assert code == 1
    line = one_error_line(err)
    assert str(path) in line and says in line


# --- tokenized Parquet that another tool wrote (with packtool's metadata) --------------------

ROWS = [[1, 2, 256], [3, 4, 5, 256], [6, 256]]


def foreign_tokenized(path: Path, types: dict | None = None, **columns: list) -> Path:
    """Tokenized Parquet as another tool might write it: packtool's metadata (the byte
    tokenizer, vocab 258; version 2 when there is a `loss_mask`) over three documents, with
    `columns` replacing or adding to the usual ones, each of its `types` or the format's."""
    from packtool.dataset.tokenized import tokenized_schema
    from packtool.tokenizer.tokenizers import load_tokenizer

    data = {"doc_id": [0, 1, 2], "source": ["s"] * 3, "input_ids": ROWS, "length": [3, 4, 2]}
    data.update(columns)
    optional = ["loss_mask"] if "loss_mask" in data else []
    extras = [c for c in data if c not in ("doc_id", "source", "input_ids", "length", *optional)]
    schema = tokenized_schema(load_tokenizer("byte").identity, extras, optional=optional)
    types = {f.name: f.type for f in schema} | (types or {})
    table = pa.table({c: pa.array(v, types[c]) for c, v in data.items()})
    pq.write_table(table.replace_schema_metadata(schema.metadata), path, row_group_size=2)
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize(
    ("mask", "says"),
    [
        (
            [b"\x01" * 3, b"\x01" * 4, b"\x01\x02"],
            "row 2: loss_mask[1] = 2; a loss mask holds 0 or 1",
        ),
        ([b"\x01", b"\x01", b"\x01"], "row 0: loss_mask has 1 value for 3 tokens"),
        ([[0, 1, 1], [0, 1, 1, 1], None], "row 2: loss_mask is null"),
        ([[0, 1, 1], [0, 1, 1, 1], [0, None]], "row 2: loss_mask holds a null"),
    ],
    ids=["a 2", "one byte a document", "null row", "null value"],
)
def test_a_bad_loss_mask_in_tokenized_parquet_is_one_line_at_every_command(
    tmp_path, command, mask, says
):
    # A mask of 2s was packed ("supervised: 200.00% of tokens out") into a dataset verify
    # refused; a mask of one byte per document was copied by tokenize, accepted by stats, and
    # failed in pack as "tokenized table: loss_mask does not have one value per token", no file.
    types = {"loss_mask": pa.list_(pa.uint8())} if isinstance(mask[0], list) else None
    path = foreign_tokenized(tmp_path / "t.parquet", types, loss_mask=mask)
    code, _, err = run(*COMMANDS[command](path, tmp_path))
    assert code == 1 and one_error_line(err).startswith(f"error: {path}: {says}")


@pytest.mark.parametrize("command", ["pack", "tokenize"])
@pytest.mark.parametrize(
    ("columns", "types", "says"),
    [
        ({"length": [3, None, 2]}, None, "row 1: no length (null)"),
        ({"length": [3.0, 4.0, 2.0]}, {"length": pa.float64()}, "column 'length' holds double"),
        ({"source": ["s", None, "s"]}, None, "row 1: null source"),
        ({"tags": [b"a", b"\xff", b"b"]}, {"tags": pa.binary()}, "column 'tags' cannot be kept"),
    ],
    ids=["null length", "float length", "null source", "bytes not utf-8"],
)
def test_a_foreign_tokenized_column_pack_cannot_read_is_one_line(
    tmp_path, command, columns, types, says
):
    # Each was a traceback: `int(nan)` in the length message (ValueError), and `Table.cast` to
    # the tokenized schema ("Casting field 'source' with null values to non-nullable",
    # ArrowInvalid on bytes that are not UTF-8)
    path = foreign_tokenized(tmp_path / "t.parquet", types, **columns)
    keep = []  # the column read: kept by tokenize, grouped by in pack
    if "tags" in columns:
        keep = ["--keep-field" if command == "tokenize" else "--group-by", "tags"]
    code, _, err = run(*COMMANDS[command](path, tmp_path), *keep)
    assert code == 1 and one_error_line(err).startswith(f"error: {path}: {says}")


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_page_of_tokenized_parquet_is_named_at_every_command(tmp_path, command):
    # stats read the `length` column without checking the page CRC32s packtool tokenize writes:
    # a flipped bit there gave other statistics while pack refused the file, and an error the
    # decompressor raised ("ZSTD decompression failed: Data corruption detected") named no file.
    source = tmp_path / "c.jsonl"
    source.write_bytes(JSONL)
    path = tmp_path / "tok.parquet"
    code, _, err = run("tokenize", source, "-o", path)
    assert code == 0, err
    meta = pq.ParquetFile(path).metadata
    chunk = meta.row_group(0).column(meta.schema.names.index("length"))
    data = bytearray(path.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x10  # in the page's data
    path.write_bytes(bytes(data))
    code, _, err = run(*COMMANDS[command](path, tmp_path / "out"))
    line = one_error_line(err)
    assert code == 1 and line.startswith(f"error: {path}: row group 0 unreadable"), line
    assert "CRC checksum verification failed" in line


def test_a_row_of_no_id_is_an_empty_skip_at_every_command(tmp_path):
    # It was a document to stats ("documents 3", a length 0 in its histogram) and tokenize
    # (copied through) and `empty` to pack; now each counts it as an `empty` skip, as an empty
    # text or empty pre-tokenized ids, and --strict makes it an error
    rows = [[1, 2, 256], [], [6, 256]]
    path = foreign_tokenized(tmp_path / "t.parquet", input_ids=rows, length=[3, 0, 2])
    skipped = f"1 skipped: empty 1 (e.g. {path}:row 1 (no token id))"
    code, out, err = run("stats", path, "--json")
    assert code == 0, err
    stats = json.loads(out)
    assert (stats["documents"], stats["inputs"]["skipped_summary"]) == (2, skipped)
    code, out, err = run("tokenize", path, "-o", tmp_path / "o.parquet")
    assert code == 0 and f"Skips: {skipped}" in out, err
    table = pq.read_table(tmp_path / "o.parquet")
    assert table.column("input_ids").to_pylist() == [[1, 2, 256], [6, 256]]
    assert table.column("doc_id").to_pylist() == [0, 2]  # docids.encode(0, row): rows 0 and 2
    code, _, err = run("pack", path, "-o", tmp_path / "p")
    assert code == 0, err
    counts = json.loads((tmp_path / "p" / "index.json").read_text())["counts"]
    assert (counts["documents_in"], counts["documents_empty"], counts["tokens_out"]) == (3, 1, 5)
    for command in sorted(COMMANDS):
        code, _, err = run(*COMMANDS[command](path, tmp_path / "strict"), "--strict")
        assert code == 1 and one_error_line(err) == (
            f"error: {path}:row 1: empty (no token id); run without --strict / strict=True to skip and count "
            "such documents"
        )
