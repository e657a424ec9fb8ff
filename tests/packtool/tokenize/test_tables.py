"""packtool/tokenize/tables.py: the one dispatch from any input to tokenized tables.

Checked against plain references: every file read alone (`read_piece`, one file's records
alone), and `packtool pack`'s own ids for the same documents.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized import tokenized_schema
from packtool.engines.local import RunConfig, run_pack
from packtool.pack.chunk import PackConfig
from packtool.read import docids
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.read.sft_config import SFTConfig
from packtool.tokenize.tables import RAW, RECORDS, FilePiece, Source, partition_tables, read_piece
from packtool.tokenize.tokenize import tokenize_corpus, tokenized_batches
from packtool.tokenizer.tokenizers import load_tokenizer

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=30)


def _write(folder: Path, files: list[list[str]]) -> list[Path]:
    paths = []
    for i, texts in enumerate(files):
        path = folder / f"{i:02d}.jsonl"
        path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
        paths.append(path)
    return paths


def _pieces(paths: list[Path]) -> list[FilePiece]:
    return [FilePiece(str(p), 0, 0, i) for i, p in enumerate(paths)]


@SETTINGS
@given(files=st.lists(st.lists(TEXT, max_size=6), min_size=1, max_size=6), batch=st.integers(1, 7))
def test_raw_batches_span_files_and_keep_each_files_ids(tmp_path_factory, files, batch):
    paths = _write(tmp_path_factory.mktemp("raw"), files)
    config = ReadConfig(batch_docs=batch)
    tok = load_tokenizer("byte")
    source = Source(
        mode=RAW, read=config, schema=tokenized_schema(tok.identity), identity=tok.identity
    )
    checked: list[str] = []
    tables = [
        t
        for t, _ in partition_tables(
            source, tok, _pieces(paths), SkipCounter(), lambda p: checked.append(p.path)
        )
    ]
    # The reference: each file read alone, its ids docids.encode(file, line offset).
    want_ids, want_text = [], []
    for i, path in enumerate(paths):
        for b in read_piece(path, i, config, SkipCounter()):
            want_ids += b.doc_ids.tolist()
            want_text += b.texts
    got = pa.concat_tables(tables) if tables else None
    got_ids = got.column("doc_id").to_pylist() if got is not None else []
    assert got_ids == want_ids
    if got is not None:
        texts = [bytes(r[:-1]).decode() for r in got.column("input_ids").to_pylist()]
        assert texts == want_text
    # Batches are full but the last, whatever the files' sizes (one builder over the pieces).
    assert all(t.num_rows == batch for t in tables[:-1])
    assert checked == [str(p) for p in paths for _ in range(2)]  # before and after each


def _chat(path: Path, n: int) -> Path:
    with path.open("w", encoding="utf-8") as f:
        for k in range(n):
            f.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": f"question {k} of {path.name}"},
                            {"role": "assistant", "content": f"answer {k}"},
                        ]
                    }
                )
                + "\n"
            )
    return path


@settings(max_examples=10, deadline=None)
@given(sizes=st.lists(st.integers(0, 5), min_size=1, max_size=5))
def test_records_in_one_stream_number_each_files_records(tmp_path_factory, sizes):
    folder = tmp_path_factory.mktemp("chat")
    paths = [_chat(folder / f"{i}.jsonl", n) for i, n in enumerate(sizes)]
    tok = load_tokenizer("byte")
    template = folder / "t.jinja"
    template.write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}{% endgeneration %}{% else %}{{ m['content'] }}{% endif %}"
        "{% endfor %}"
    )
    config = ReadConfig(batch_docs=3, sft=SFTConfig(chat_template=str(template)))
    schema = tokenized_schema(tok.identity, optional=("loss_mask",))
    source = Source(
        mode=RECORDS, read=config, schema=schema, identity=tok.identity, sft_kind="messages"
    )
    checked: list[str] = []
    tables = [
        t
        for t, _ in partition_tables(
            source, tok, _pieces(paths), SkipCounter(), lambda p: checked.append(p.path)
        )
    ]
    ids = pa.concat_tables(tables).column("doc_id").to_pylist() if tables else []
    # The reference: a record of file i is docids.encode(i, the byte its line starts at).
    starts = [[m.start() for m in re.finditer(rb"^.", p.read_bytes(), re.MULTILINE)] for p in paths]
    assert ids == [int(docids.encode(i, b)) for i, lines in enumerate(starts) for b in lines]
    assert [len(lines) for lines in starts] == list(sizes)
    assert sorted(checked) == sorted(str(p) for p in paths for _ in range(2))


def test_tokenize_gives_a_document_the_id_pack_gives_it(tmp_path):
    files = [["alpha", "beta beta"], ["gamma"], ["delta", "epsilon", "zeta"]]
    paths = _write(tmp_path, files)
    out = tmp_path / "tok.parquet"
    tokenize_corpus(paths, out, progress=False)
    tokenized = pq.read_table(out)
    packed = tmp_path / "packed"
    run_pack(
        RunConfig(
            inputs=[str(p) for p in paths],
            out_dir=str(packed),
            pack=PackConfig(max_len=64),
            progress=False,
        )
    )
    pack_ids = sorted(
        i
        for f in packed.glob("shard-*.parquet")
        for row in pq.read_table(f).column("doc_ids").to_pylist()
        for i in row
    )
    assert sorted(tokenized.column("doc_id").to_pylist()) == pack_ids
    first = [docids.decode(i) for i in tokenized.column("doc_id").to_pylist()]
    assert [f for f, _ in first] == [0, 0, 1, 2, 2, 2]
    # and the same through tokenized_batches (what stats reads)
    direct = pa.concat_tables(list(tokenized_batches(paths)))
    assert direct.column("doc_id").equals(tokenized.column("doc_id"))
    assert np.all(np.diff(tokenized.column("doc_id").to_numpy()) > 0)


def test_an_identity_from_elsewhere_is_kept_on_the_tables(tmp_path):
    paths = _write(tmp_path, [["one", "two"]])
    tok = load_tokenizer("byte")
    table = pa.concat_tables(list(tokenized_batches(paths, tokenizer=tok)))
    meta = json.loads(table.schema.metadata[b"packtool"])
    assert TokenizerIdentity.from_dict(meta["tokenizer"]).matches(tok.identity)
