"""tokenized_batches, tokenize_corpus, read_lengths: schema, ids, round trips, outputs, real corpus."""

from __future__ import annotations

import json
import sysconfig
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.tokenized import FORMAT, tokenized_meta
from packtool.errors import ConfigError, DataError
from packtool.prefetch import prefetch
from packtool.read import docids
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.tokenize.tokenize import (
    input_identity,
    read_lengths,
    tokenize_corpus,
    tokenized_batches,
)
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.read.test_corpus import DOCS, write_corpus


def concat(tables: list[pa.Table]) -> pa.Table:
    return pa.concat_tables(tables)


def test_raw_corpus_gives_the_tokenized_schema(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl")
    tables = list(
        tokenized_batches(
            [path], read_config=ReadConfig(extra_fields=("lang",), batch_docs=2), tokenizer="byte"
        )
    )
    assert [t.num_rows for t in tables] == [2, 1]
    table = concat(tables)
    assert table.schema.names == ["doc_id", "source", "input_ids", "length", "lang"]
    assert table.schema.field("input_ids").type == pa.list_(pa.uint16())
    assert table.schema.field("length").type == pa.int32()
    meta = json.loads(table.schema.metadata[b"packtool"])
    assert meta["format"] == FORMAT
    assert meta["version"] == 1
    assert meta["tokenizer"]["kind"] == "byte"
    assert meta["tokenizer"]["eos_id"] == 256
    # The ids `packtool pack` gives the same documents: file 0, each line's byte offset.
    starts = np.cumsum([0] + [len(line) for line in path.read_bytes().splitlines(True)])[:3]
    assert table.column("doc_id").to_pylist() == list(docids.encode(0, starts))
    assert table.column("source").to_pylist() == [str(path)] * 3
    assert table.column("lang").to_pylist() == ["en", "de", "el"]
    for row, doc in zip(table.column("input_ids").to_pylist(), DOCS, strict=True):
        assert row[-1] == 256
        assert bytes(row[:-1]).decode() == doc["text"]
    assert table.column("length").to_pylist() == [len(d["text"].encode()) + 1 for d in DOCS]


def test_tokenized_parquet_round_trips_and_checks_the_tokenizer(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "tok.parquet"
    tokenize_corpus([src], out, read_config=ReadConfig(extra_fields=("lang",)), progress=False)
    assert tokenized_meta(out)["tokenizer"]["kind"] == "byte"
    assert tokenized_meta(src) is None
    direct = concat(list(tokenized_batches([src], read_config=ReadConfig(extra_fields=("lang",)))))
    again = concat(list(tokenized_batches([out], read_config=ReadConfig(extra_fields=("lang",)))))
    # Read back, a tokenized file numbers its rows (read/tokenized.py); the rest is the same.
    assert again.column("doc_id").to_pylist() == [0, 1, 2]
    assert again.drop_columns(["doc_id"]).equals(direct.drop_columns(["doc_id"]))
    assert pq.read_table(out).column("doc_id").equals(direct.column("doc_id"))  # kept as made
    # Without the extra field asked for, it is not read; with None, any tokenizer is accepted.
    assert concat(list(tokenized_batches([out], tokenizer=None))).num_columns == 4
    assert input_identity([out]) == load_tokenizer("byte").identity
    assert input_identity([src]) is None
    with pytest.raises(
        DataError, match=r"tokenized with byte:byte .*eos 256.*the options give .*eos None"
    ):
        list(tokenized_batches([out], tokenizer=load_tokenizer("byte", eos=None)))
    with pytest.raises(DataError, match=r"no column 'topic'"):
        list(tokenized_batches([out], read_config=ReadConfig(extra_fields=("topic",))))


def test_inputs_of_mixed_kinds_or_tokenizers_are_refused(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    tokenize_corpus([src], a, progress=False)
    tokenize_corpus([src], b, tokenizer=load_tokenizer("byte", bos="default"), progress=False)
    with pytest.raises(ConfigError, match="mix tokenized Parquet"):
        list(tokenized_batches([a, src]))
    with pytest.raises(DataError, match="b.parquet: tokenized with byte:byte"):
        read_lengths([a, b])


def test_read_lengths(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "parts"
    tokenize_corpus([src, src.with_name("c.jsonl")], out, progress=False, part_tokens=10)
    lengths = read_lengths([out])
    assert lengths.dtype == np.int32
    assert lengths.tolist() == [len(d["text"].encode()) + 1 for d in DOCS]
    with pytest.raises(DataError, match="not tokenized Parquet; run `packtool tokenize` first"):
        read_lengths([src])


def test_tokenize_corpus_outputs_overwrite_and_summary(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl")
    out = tmp_path / "o.parquet"
    s = tokenize_corpus([src], out, read_config=ReadConfig(batch_docs=1), progress=False)
    assert (s.documents, s.tokens) == (3, sum(len(d["text"].encode()) + 1 for d in DOCS))
    assert s.files == [str(out)]
    assert pq.ParquetFile(out).num_row_groups == 3
    text = s.format()
    assert "Tokenized 3 documents into" in text
    assert "tokens/s" in text
    assert "no skips" in text
    with pytest.raises(ConfigError, match="already exists; pass --overwrite"):
        tokenize_corpus([src], out, progress=False)
    tokenize_corpus([src], out, overwrite=True, progress=False)
    # A folder of parts; a new part after part_tokens tokens.
    folder = tmp_path / "parts"
    s = tokenize_corpus([src], folder, read_config=ReadConfig(batch_docs=1), part_tokens=20)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["part-00000.parquet", "part-00001.parquet"]
    assert read_lengths([folder]).sum() == s.tokens
    tokenize_corpus([src], folder, overwrite=True, progress=False)
    assert sorted(p.name for p in folder.iterdir()) == ["part-00000.parquet"]
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files that are not tokenize parts"):
        tokenize_corpus([src], folder, overwrite=True, progress=False)
    assert not list(tmp_path.glob(".*tmp*"))


def test_failed_run_leaves_nothing_behind(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "a"}\n{broken\n')
    out = tmp_path / "o.parquet"
    with pytest.raises(DataError, match=r"bad.jsonl:2: malformed json"):
        tokenize_corpus([src], out, read_config=ReadConfig(strict=True), progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]
    s = tokenize_corpus([src], out, progress=False)
    assert s.skips == {"malformed_json": 1}
    assert f"malformed_json 1 (e.g. {src}:2" in s.format()


@pytest.mark.parametrize("name", ["o.parquet", "parts"])
def test_a_corpus_without_a_usable_document_is_an_error_that_writes_nothing(tmp_path, name):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": ""}\n{"text": 5}\n')
    out = tmp_path / "new" / "sub" / name
    with pytest.raises(
        DataError, match=rf"^no documents in {src} \(2 skipped: empty 1 .*missing_field 1 "
    ):
        tokenize_corpus([src], out, progress=False)
    # No output, no temporary, and not the folders made for them.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]
    # An empty file is the same mistake, with no skips to name.
    (tmp_path / "e.jsonl").write_text("")
    with pytest.raises(DataError, match=rf"^no documents in {tmp_path / 'e.jsonl'}$"):
        tokenize_corpus([tmp_path / "e.jsonl"], out, progress=False)
    # An earlier output is kept, even with overwrite=True.
    good = write_corpus(tmp_path / "good.jsonl")
    tokenize_corpus([good], out, progress=False)
    before = sorted((p.name, p.stat().st_size) for p in out.parent.rglob("*"))
    with pytest.raises(DataError, match="no documents"):
        tokenize_corpus([src], out, overwrite=True, progress=False)
    assert sorted((p.name, p.stat().st_size) for p in out.parent.rglob("*")) == before
    assert read_lengths([out]).size == len(DOCS)


def test_hf_tokenizer_through_the_pipeline(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    texts = [d["text"] for d in DOCS] * 5
    hf = Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["</s>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    hf.save(str(tmp_path / "tokenizer.json"))
    src = write_corpus(tmp_path / "c.jsonl")
    table = concat(list(tokenized_batches([src], tokenizer=str(tmp_path / "tokenizer.json"))))
    eos = hf.token_to_id("</s>")
    want = [hf.encode(d["text"], add_special_tokens=False).ids + [eos] for d in DOCS]
    assert table.column("input_ids").to_pylist() == want


def test_python_stdlib_sources_as_a_real_corpus(tmp_path):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(stdlib.glob("*.py"))
    assert len(files) > 100
    want_docs, want_tokens, want_skips = 0, 0, {}
    for f in files:
        data = f.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            want_skips["invalid_utf8"] = want_skips.get("invalid_utf8", 0) + 1
            continue
        if not data:
            want_skips["empty"] = want_skips.get("empty", 0) + 1
            continue
        want_docs += 1
        want_tokens += len(data) + 1
    out = tmp_path / "stdlib.parquet"
    s = tokenize_corpus([str(stdlib / "*.py")], out, progress=False)
    assert (s.documents, s.tokens, s.skips) == (want_docs, want_tokens, want_skips)
    table = pq.read_table(out, columns=["source", "length"])
    first = next(f for f in files if f.stat().st_size > 0)
    assert table.column("source")[0].as_py() == str(first)
    assert table.column("length")[0].as_py() == first.stat().st_size + 1
    assert int(read_lengths([out]).sum()) == want_tokens


def test_skips_are_shared_with_the_caller(tmp_path):
    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "a"}\n{"text": ""}\n')
    skips = SkipCounter()
    assert sum(t.num_rows for t in tokenized_batches([src], skips=skips)) == 1
    assert skips.counts == {"empty": 1}


def test_a_strict_config_makes_the_callers_counter_strict(tmp_path):
    """Before: the caller's counter was used as it was, so `ReadConfig(strict=True)` beside
    `SkipCounter()` skipped and counted with no error, in both entry points."""
    from packtool.read.corpus import read_corpus

    src = tmp_path / "types.jsonl"
    src.write_text('{"text": "a"}\n{"text": 5}\n')
    strict = ReadConfig(strict=True)
    says = r"types.jsonl:2: missing field \('text' is a number\); run without --strict / strict"
    for read in (
        lambda skips: tokenized_batches([src], tokenizer="byte", skips=skips, read_config=strict),
        lambda skips: read_corpus([src], strict, skips),
    ):
        skips = SkipCounter()
        with pytest.raises(DataError, match=says):
            list(read(skips))
        assert skips.strict and skips.counts == {}


def test_prefetch_forwards_errors_and_stops_early():
    def gen():
        yield 1
        raise DataError("boom")

    it = prefetch(gen())
    assert next(it) == 1
    with pytest.raises(DataError, match="boom"):
        next(it)

    produced = []

    def endless():
        i = 0
        while True:
            produced.append(i)
            yield i
            i += 1

    before = set(threading.enumerate())
    it = prefetch(endless(), depth=2)
    assert next(it) == 0
    it.close()
    assert not set(threading.enumerate()) - before  # its threads (compared by identity: a
    assert len(produced) <= 5  # thread of an earlier test ending meanwhile changes no count)


def test_abandoned_pipeline_stops_all_its_threads(tmp_path):
    src = write_corpus(tmp_path / "c.jsonl", [{"text": f"doc {i}"} for i in range(200)])
    before = set(threading.enumerate())
    it = tokenized_batches([src], read_config=ReadConfig(batch_docs=3))
    assert next(it).num_rows == 3
    it.close()
    deadline = time.monotonic() + 5
    while set(threading.enumerate()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(threading.enumerate()) - before  # every thread it started has ended


def test_progress_counts_and_draws_only_when_enabled(monkeypatch):
    import io
    import sys

    from packtool.progress import Progress, progress_enabled

    monkeypatch.delenv("PACKTOOL_NO_PROGRESS", raising=False)
    assert not progress_enabled()  # pytest's stderr is not a terminal
    tty = io.StringIO()
    tty.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", tty)
    assert progress_enabled()
    monkeypatch.setenv("PACKTOOL_NO_PROGRESS", "1")
    assert not progress_enabled()
    with Progress("tokenize", enabled=True) as bar:
        bar.update(docs=3, tokens=2_500_000, nbytes=1_000_000)
        bar._last_postfix = 0.0  # the postfix is throttled to every 0.5 s
        bar.update(docs=1, tokens=1, nbytes=1)
        bar._bar.refresh()
    assert (bar.docs, bar.tokens, bar.nbytes) == (4, 2_500_001, 1_000_001)
    assert "tokenize" in tty.getvalue()
    assert "2.5M tokens" in tty.getvalue()


# --- tokenized Parquet read back as input (issue #11 defect 4) --------------------------------


def _hand_tokenized(path, rows, *, lengths=None, doc_ids=None, ids_type=None):
    """A tokenized file made by hand with the byte tokenizer's identity (vocab 258)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.dataset.tokenized import tokenized_schema
    from packtool.tokenizer.tokenizers import load_tokenizer

    schema = tokenized_schema(load_tokenizer("byte").identity)
    ids_type = pa.list_(ids_type or pa.uint16())
    schema = schema.set(2, pa.field("input_ids", ids_type, nullable=True))  # a foreign writer
    table = pa.table(
        {
            "doc_id": pa.array(doc_ids or [0] * len(rows), pa.int64()),
            "source": pa.array(["hand"] * len(rows)),
            "input_ids": pa.array(rows, schema.field("input_ids").type),
            "length": pa.array(lengths or [len(r or []) for r in rows], pa.int32()),
        },
        schema=schema,
    )
    pq.write_table(table, path, row_group_size=2)
    return path


@pytest.mark.parametrize(
    ("rows", "kw", "message"),
    [
        ([[1, 256], [2, 300, 256]], {}, "row 1: token id 300 is outside the vocabulary"),
        ([[1, 256], [2, 256], [3, 4]], {"lengths": [2, 2, 3]}, "row 2: length is 3 but the row"),
        ([[1, 256], [2, 256], None], {}, "row 2: null input_ids"),
        ([[1, 256], [2, None]], {}, "row 1: a null token id"),
    ],
    ids=["beyond the vocabulary", "wrong length", "null row", "null id"],
)
def test_damaged_tokenized_rows_are_named_by_file_and_row(tmp_path, rows, kw, message):
    from packtool.tokenize.tokenize import tokenized_batches

    path = _hand_tokenized(tmp_path / "t.parquet", rows, **kw)
    with pytest.raises(DataError, match=f"^{path}: {message}"):
        list(tokenized_batches([path], tokenizer=None))


def test_ids_are_unique_across_files_and_row_groups(tmp_path):
    from packtool.read import docids
    from packtool.tokenize.tokenize import tokenized_batches

    a = _hand_tokenized(tmp_path / "a.parquet", [[1, 256]] * 5, doc_ids=[0, 1, 2, 3, 4])
    b = _hand_tokenized(tmp_path / "b.parquet", [[2, 256]] * 3, doc_ids=[0, 0, 0])
    ids = [i for t in tokenized_batches([a, b], tokenizer=None) for i in t["doc_id"].to_pylist()]
    assert ids == [docids.encode(0, r) for r in range(5)] + [docids.encode(1, r) for r in range(3)]


def test_other_integer_id_types_are_cast_to_the_contract(tmp_path):
    import pyarrow as pa

    from packtool.audit.verify import verify_dataset
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    path = _hand_tokenized(tmp_path / "t.parquet", [[1, 2, 256], [3, 256]], ids_type=pa.int64())
    out = tmp_path / "O"
    run_pack(
        RunConfig(inputs=(str(path),), out_dir=str(out), pack=PackConfig(max_len=8), progress=False)
    )
    assert verify_dataset(out).tokens == 5  # list<uint16>, as verify expects for vocab 258


def test_one_path_is_one_input_not_its_characters(tmp_path, monkeypatch):
    """Before: `tokenize_corpus("c.jsonl", out)` took each character as an input and refused the
    output as inside the input folder "." (an absolute path: "/"). One str or Path is one input,
    as `tokenized_batches` takes it."""
    monkeypatch.chdir(tmp_path)
    write_corpus(Path("c.jsonl"))
    for one in ("c.jsonl", Path("c.jsonl")):
        tokenize_corpus(one, tmp_path / "out" / "tok.parquet", overwrite=True, progress=False)
        assert read_lengths(tmp_path / "out" / "tok.parquet").size == len(DOCS)


def test_foreign_tokenized_columns_are_read_as_the_format_stores_them(tmp_path):
    """Another writer's tokenized Parquet (packtool's metadata, its own column types): a
    list<uint8> loss mask and list/struct extra columns were `Table.cast` tracebacks (Unsupported
    cast); they are read as the format stores them, the mask as bytes, the extras as JSON text,
    as the pre-tokenized reader keeps them, and an int64 length as int32."""
    from tests.packtool.cli.test_corrupt_inputs import foreign_tokenized

    path = foreign_tokenized(
        tmp_path / "t.parquet",
        {
            "loss_mask": pa.list_(pa.uint8()),
            "tags": pa.list_(pa.int64()),
            "meta": pa.struct([("k", pa.string())]),
            "length": pa.int64(),
        },
        loss_mask=[[0, 1, 1], [0, 0, 1, 1], [1, 1]],
        tags=[[1], [], [2, 3]],
        meta=[{"k": "a"}, {"k": "b"}, None],
    )
    table = concat(
        list(
            tokenized_batches(
                [path], read_config=ReadConfig(extra_fields=("tags", "meta")), tokenizer=None
            )
        )
    )
    assert table.schema.field("loss_mask").type == pa.binary()
    assert table.column("loss_mask").to_pylist() == [b"\0\1\1", b"\0\0\1\1", b"\1\1"]
    assert table.column("tags").to_pylist() == ["[1]", "[]", "[2,3]"]
    assert table.column("meta").to_pylist() == ['{"k":"a"}', '{"k":"b"}', None]
    assert table.column("length").type == pa.int32()
    assert table.column("length").to_pylist() == [3, 4, 2]
