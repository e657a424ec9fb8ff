"""packtool/read/pretokenized.py: Parquet with input_ids plus labels or loss_mask, from elsewhere."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.tokenized import tokenized_meta
from packtool.errors import ConfigError, DataError
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.tokenize.tokenize import input_columns, tokenize_corpus, tokenized_batches
from tests.cli import run

IDS = [[1, 2, 3, 4], [5, 6, 7], [8, 9], [10, 11, 12]]
LABELS = [[-100, -100, 3, 4], [-100, 6, 7], [-100, -100], [10, -100, 12]]
MASK = [[0, 0, 1, 1], [0, 1, 1], [0, 0], [1, 0, 1]]


def write(path, **columns):
    pq.write_table(pa.table(columns), path)
    return path


def read_all(paths, **kw):
    skips = kw.pop("skips", SkipCounter())
    tables = list(tokenized_batches(paths, tokenizer="byte", skips=skips, **kw))
    return pa.concat_tables(tables), skips


@pytest.mark.parametrize("kind", ["labels", "loss_mask", "bool_mask"])
def test_labels_and_masks_become_one_loss_mask(tmp_path, kind):
    if kind == "labels":
        path = write(tmp_path / "a.parquet", input_ids=IDS, labels=LABELS)
    else:
        mask = [[bool(m) for m in d] for d in MASK] if kind == "bool_mask" else MASK
        path = write(tmp_path / "a.parquet", input_ids=IDS, loss_mask=mask)
    assert input_columns([path]) == ("loss_mask",)
    table, skips = read_all([path])
    # Document 2 has no supervised token: skipped and counted; ids are the rows in the file.
    assert table.column("input_ids").to_pylist() == [IDS[0], IDS[1], IDS[3]]
    # Stored as the shards store it: one byte per token, one binary value per document.
    assert [list(m) for m in table.column("loss_mask").to_pylist()] == [MASK[0], MASK[1], MASK[3]]
    assert table.column("loss_mask").type == pa.binary()
    assert table.column("doc_id").to_pylist() == [0, 1, 3]
    assert table.column("length").to_pylist() == [4, 3, 3]
    assert skips.counts == {"no_supervised_tokens": 1}
    assert skips.examples["no_supervised_tokens"][0].startswith(f"{path}:row 2")


def test_a_row_supervised_only_at_its_first_token_is_skipped(tmp_path):
    """The loader never makes a document's first token a target (labels shift): such a row
    trains on nothing, as one with no supervised token (r6)."""
    ids = [[5, 6, 7], [8, 9, 10], [11]]
    path = write(tmp_path / "a.parquet", input_ids=ids, loss_mask=[[1, 0, 0], [1, 0, 1], [1]])
    table, skips = read_all([path])
    assert table.column("doc_id").to_pylist() == [1]
    assert skips.counts == {"no_supervised_tokens": 2}


def test_no_bos_or_eos_is_added_and_ids_without_a_mask_are_read_too(tmp_path):
    path = write(tmp_path / "a.parquet", input_ids=IDS)
    assert input_columns([path]) == ()
    table, _ = read_all([path])
    assert table.column("input_ids").to_pylist() == IDS
    assert "loss_mask" not in table.column_names


def test_ids_used_unchanged_record_no_eos_or_bos_and_refuse_explicit_ones(tmp_path):
    """The pack and tokenize summaries and index.json said `eos 7, bos 9` for shards identical
    to a run without them, and --max-len 2 was refused for a BOS + EOS never added."""
    from packtool.dataset.manifest import read_manifest

    path = write(tmp_path / "a.parquet", input_ids=IDS)
    code, out, err = run("pack", path, "-o", tmp_path / "p", "--max-len", "2")
    assert code == 0, err
    assert "eos none, bos none" in out
    tokenizer = read_manifest(tmp_path / "p").tokenizer
    assert tokenizer["eos_id"] is None and tokenizer["bos_id"] is None
    code, out, err = run("tokenize", path, "-o", tmp_path / "t.parquet")
    assert code == 0, err
    assert "eos none, bos none" in out
    recorded = tokenized_meta(tmp_path / "t.parquet")["tokenizer"]
    assert recorded["eos_id"] is None and recorded["bos_id"] is None
    # and no EOS / BOS named beside them: tokenize named the tokenizer's (pack did not)
    from tests.packtool.tokenizer_shapes import mistral_model

    model = mistral_model()
    for cmd, out_name in (("tokenize", "tm.parquet"), ("pack", "pm")):
        code, out, err = run(cmd, path, "-o", tmp_path / out_name, "--tokenizer", model)
        assert code == 0, err
        assert "eos none, bos none" in out and "<s>" not in out and "</s>" not in out, out
    named = tokenized_meta(tmp_path / "tm.parquet").get("special_tokens") or {}
    assert not set(named) & {"eos", "bos"}, named
    for cmd, out_name in (("pack", "p2"), ("tokenize", "t2.parquet")):
        for flags, said in (
            (["--eos-id", "7"], "--eos-id 7 / eos=7 adds"),
            (["--eos-id", "7", "--bos-id", "9"], "--eos-id 7 / eos=7 and --bos-id 9 / bos=9 add"),
            (["--bos-id", "default"], "--bos-id default / bos='default' adds"),  # got through
            (["--eos-id", "default"], "--eos-id default / eos='default' adds"),
        ):
            code, _, err = run(cmd, path, "-o", tmp_path / out_name, *flags)
            assert code == 1
            assert f"error: {said} nothing to pre-tokenized ids, which are used unchanged" in err
            assert not (tmp_path / out_name).exists()
    # --to megatron appends the EOS to such ids (--append-eod): the option still counts there.
    code, _, err = run("tokenize", path, "--to", "megatron", "-o", tmp_path / "m", "--eos-id", "7")
    assert code == 0, err


def _entry_point(name, path, out, tokenizer, **kw):
    """Run one library entry point over `path` with `tokenizer` and `kw` (`bos=`)."""
    from packtool.engines.config import RunConfig
    from packtool.engines.local import run_pack
    from packtool.engines.megatron.run import tokenize_megatron
    from packtool.pack.chunk import PackConfig
    from packtool.stats.lengths import compute_stats

    if name == "tokenize_corpus":
        return tokenize_corpus([path], out / "t.parquet", tokenizer=tokenizer, **kw)
    if name == "tokenize_megatron":
        return tokenize_megatron([path], out / "m", tokenizer=tokenizer, workers=1, **kw)
    if name == "run_pack":
        pack = PackConfig(max_len=8)
        config = RunConfig(inputs=(str(path),), out_dir=str(out / "p"), pack=pack, workers=1)
        return run_pack(config, tokenizer, **kw)
    if name == "compute_stats":
        return compute_stats([path], tokenizer=tokenizer, **kw)
    return list(tokenized_batches([path], tokenizer=tokenizer, **kw))


ENTRY_POINTS = ["tokenize_corpus", "tokenize_megatron", "run_pack", "compute_stats", "batches"]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize(("tokenizer", "bos"), [("byte", 5), (None, 5), ("byte", "default")])
def test_library_entry_points_refuse_a_bos_over_pretokenized_ids(tmp_path, entry, tokenizer, bos):
    """The CLI refused `--bos-id 5` over pre-tokenized ids; `tokenize_corpus`, `run_pack`,
    `compute_stats`, `tokenize_megatron` and `tokenized_batches` given `bos=5` succeeded, the BOS
    neither added nor recorded (the Tokenizer loaded by name did not say an id was chosen)."""
    path = write(tmp_path / "a.parquet", input_ids=IDS)
    if entry == "batches" and tokenizer is None:
        tokenizer = "byte"  # tokenized_batches needs one for ids made elsewhere
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ConfigError) as caught:
        _entry_point(entry, path, out, tokenizer, bos=bos)
    said = f"--bos-id {bos} / bos={bos!r} adds nothing to pre-tokenized ids"
    assert str(caught.value).startswith(said), caught.value
    assert list(out.iterdir()) == []  # nothing written
    # --no-bos / bos=None adds nothing either way: read as without it
    _entry_point(entry, path, out, tokenizer, bos=None)


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_tokenizer_loaded_with_an_eos_or_bos_is_refused_over_pretokenized_ids(tmp_path, entry):
    """`load_tokenizer("byte", eos=7)` handed to an entry point: the EOS it was loaded with was
    neither appended nor recorded (but by tokenize_megatron, which appends it)."""
    from packtool.tokenizer.tokenizers import load_tokenizer

    path = write(tmp_path / "a.parquet", input_ids=IDS)
    for i, (kw, said) in enumerate(
        (
            ({"eos": 7}, "--eos-id 7 / eos=7 adds"),
            ({"bos": 9}, "--bos-id 9 / bos=9 adds"),
            ({"eos": 7, "bos": 9}, "--eos-id 7 / eos=7 and --bos-id 9 / bos=9 add"),
        )
    ):
        out = tmp_path / f"out{i}"
        out.mkdir()
        if entry == "tokenize_megatron" and "bos" not in kw:
            summary = _entry_point(entry, path, out, load_tokenizer("byte", **kw))
            assert summary.tokenizer["eos_id"] == 7 and summary.tokens == 16  # 12 ids + 4 EOS
            continue
        if entry == "tokenize_megatron":
            said = "--bos-id 9 / bos=9 adds"
        with pytest.raises(ConfigError, match=f"^{said} nothing to pre-tokenized ids"):
            _entry_point(entry, path, out, load_tokenizer("byte", **kw))
        assert list(out.iterdir()) == []  # nothing written


def test_a_text_column_with_ids_and_no_mask_is_still_read_as_text(tmp_path):
    path = write(tmp_path / "a.parquet", text=["ab", "c"], input_ids=[[1], [2]])
    table, _ = read_all([path])
    assert table.column("length").to_pylist() == [3, 2]  # byte tokenizer: text + EOS


def test_strict_makes_an_unsupervised_document_an_error(tmp_path):
    path = write(tmp_path / "a.parquet", input_ids=IDS, labels=LABELS)
    with pytest.raises(DataError, match=r"a.parquet:row 2: no supervised tokens"):
        read_all([path], skips=SkipCounter(strict=True))


@pytest.mark.parametrize(
    ("source", "first", "last"), [("loss_mask", [1, 1], [1, 1]), ("labels", [1, 2], [3, 4])]
)
def test_empty_and_null_documents_are_counted_skips(tmp_path, source, first, last):
    # A row of null ids and a null mask or labels (a row with nothing, as datasets writes one)
    # stopped the run ("`labels` holds nulls"), read before the rows of null ids were skipped;
    # docs/tokenize.md says null ids are a counted `missing_field` skip, whatever their mask
    ids = pa.array([[1, 2], [], None, [3, 4]], pa.list_(pa.int64()))
    path = tmp_path / "a.parquet"
    for third in (None, [], [5]):
        mask = pa.array([first, [], third, last], ids.type)
        pq.write_table(pa.table({"input_ids": ids, source: mask}), path)
        table, skips = read_all([path])
        assert table.column("input_ids").to_pylist() == [[1, 2], [3, 4]]
        assert table.column("loss_mask").to_pylist() == [b"\1\1", b"\1\1"]
        assert skips.counts == {"empty": 1, "missing_field": 1}
    # ids without their mask, or a null inside one, are still an error naming the row
    for fourth in (None, [last[0], None]):
        mask = pa.array([first, [], [], fourth], ids.type)
        pq.write_table(pa.table({"input_ids": ids, source: mask}), path)
        with pytest.raises(DataError, match=f"a.parquet:row 3: `{source}` holds nulls"):
            read_all([path])


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        ({"labels": [[-100, 2], [5, 6, 7], [-100, 9], [10, 11, 12]]}, r"row 0: 2 `labels` for 4"),
        (
            {"labels": [[2, 3, 4, -100], [5, 6, 7], [8, 9], [10, 11, 12]]},
            r"row 0: labels\[0\] = 2 but input_ids\[0\] = 1; labels must be the input_ids",
        ),
        ({"loss_mask": [[0, 2, 1, 1], [1, 1, 1], [1, 1], [1, 1, 1]]}, r"loss_mask\[1\] = 2"),
        ({"loss_mask": [["a"] * 4, ["a"] * 3, ["a"] * 2, ["a"] * 3]}, "not a list of integers"),
    ],
)
def test_bad_masks_are_one_line_errors_naming_the_row(tmp_path, columns, message):
    path = write(tmp_path / "a.parquet", input_ids=IDS, **columns)
    with pytest.raises(DataError, match=message) as info:
        read_all([path])
    assert "\n" not in str(info.value)


def test_an_id_outside_the_vocabulary_names_the_tokenizer(tmp_path):
    path = write(tmp_path / "a.parquet", input_ids=[[1, 50_000]], labels=[[1, 50_000]])
    with pytest.raises(DataError, match=r"row 0: input_ids\[1\] = 50000 is outside ") as e:
        read_all([path])
    # Both callers' forms: `tokenizer=` of the library's functions reaches it as well.
    assert str(e.value).endswith(
        "pass the tokenizer that made these ids: --tokenizer SPEC / tokenizer=SPEC"
    )


def test_an_id_past_int64_is_named_as_it_is(tmp_path):
    # uint64 ids were cast to int64 before the check: 2**63 was named as -9223372036854775808
    ids = pa.array([[1, 2], [3, 2**63]], pa.list_(pa.uint64()))
    pq.write_table(pa.table({"input_ids": ids, "labels": ids}), tmp_path / "a.parquet")
    with pytest.raises(DataError, match=rf"a.parquet:row 1: input_ids\[1\] = {2**63} is outside"):
        read_all([tmp_path / "a.parquet"])


@pytest.mark.parametrize(
    ("ids", "kind"),
    [
        ([[1.0, 2.0]], "list<element: double>"),
        ([["a", "b"]], "list<element: string>"),
        ([[[1], [2]]], "list<element: list<element: int64>>"),
    ],
)
@pytest.mark.parametrize("mask", [False, True])
def test_ids_that_are_not_integer_lists_are_named_as_such(tmp_path, ids, kind, mask):
    # They were read as text: "no text column 'text'", saying nothing of the ids
    columns = {"input_ids": ids, **({"loss_mask": [[1, 1]]} if mask else {})}
    path = write(tmp_path / "a.parquet", **columns)
    message = f"^{path}: input_ids is {kind}, not lists of integer token ids$"
    with pytest.raises(DataError, match=message.replace("[", r"\[")):
        read_all([path])
    # beside a text column (and no mask) they are a column of their own: the text is read
    write(tmp_path / "t.parquet", input_ids=ids, text=["a text"])
    if not mask:
        assert read_all([tmp_path / "t.parquet"])[0].column("length").to_pylist() == [7]


def test_a_dataset_is_one_kind(tmp_path):
    a = write(tmp_path / "a.parquet", input_ids=IDS, labels=LABELS)
    b = write(tmp_path / "b.parquet", input_ids=IDS)
    with pytest.raises(DataError, match="b.parquet: has no labels or loss_mask, unlike"):
        read_all([a, b])
    c = write(tmp_path / "c.parquet", input_ids=IDS, loss_mask=MASK)
    with pytest.raises(DataError, match="has a `loss_mask` column, unlike"):
        read_all([a, c])
    (tmp_path / "d.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ConfigError, match="mix pre-tokenized Parquet"):
        read_all([a, tmp_path / "d.jsonl"])
    both = write(tmp_path / "e.parquet", input_ids=IDS, labels=LABELS, loss_mask=MASK)
    with pytest.raises(DataError, match="both `labels` and `loss_mask`"):
        read_all([both])


def test_tokenize_passes_the_mask_through(tmp_path):
    src = write(tmp_path / "sft.parquet", input_ids=IDS, labels=LABELS, lang=["a", "b", "c", "d"])
    out = tmp_path / "tok.parquet"
    summary = tokenize_corpus([src], out, read_config=ReadConfig(extra_fields=("lang",)))
    meta = tokenized_meta(out)
    assert meta["version"] == 2 and meta["columns"] == ["loss_mask"]
    assert summary.supervised_tokens == 2 + 2 + 2
    assert "Loss mask kept: 6 supervised tokens" in summary.format()
    back = pq.read_table(out)
    assert [list(m) for m in back.column("loss_mask").to_pylist()] == [MASK[0], MASK[1], MASK[3]]
    assert back.column("lang").to_pylist() == ["a", "b", "d"]
    assert input_columns([out]) == ("loss_mask",)
    # Tokenized Parquet without a mask stays version 1 (older packtool reads it).
    plain = tmp_path / "plain.parquet"
    tokenize_corpus([write(tmp_path / "ids.parquet", input_ids=IDS)], plain)
    assert tokenized_meta(plain)["version"] == 1 and "columns" not in tokenized_meta(plain)
    with pytest.raises(DataError, match="has columns none beyond the ids, unlike"):
        list(tokenized_batches([out, plain], tokenizer=None))


def test_tokenize_cli_reports_the_mask(tmp_path):
    src = write(tmp_path / "sft.parquet", input_ids=IDS, labels=LABELS)
    code, out, err = run("tokenize", str(src), "-o", str(tmp_path / "t.parquet"))
    assert code == 0, err
    assert "supervised tokens" in out and "no_supervised_tokens 1" in out
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"packtool"])
    assert meta["columns"] == ["loss_mask"]


def test_ids_stay_int_typed_per_tokenizer(tmp_path):
    path = write(tmp_path / "a.parquet", input_ids=[[1, 2]], loss_mask=[[1, 1]])
    table, _ = read_all([path])
    assert table.column("input_ids").type == pa.list_(pa.uint16())
    assert np.array_equal(table.column("input_ids").combine_chunks().values.to_numpy(), [1, 2])


@pytest.mark.parametrize("command", ["pack", "stats", "tokenize"])
def test_a_packed_dataset_as_input_is_refused(tmp_path, command):
    # Its shards were read as pre-tokenized Parquet, one document a row: the documents of each
    # row merged, their ids and boundaries gone, exit 0.
    (tmp_path / "c.jsonl").write_text("".join(f'{{"text": "doc {i} " }}\n' for i in range(50)))
    code, _, err = run("pack", tmp_path / "c.jsonl", "-o", tmp_path / "packed", "--max-len", 64)
    assert code == 0, err
    out = {
        "pack": ["-o", tmp_path / "again", "--max-len", 64],
        "stats": [],
        "tokenize": ["-o", tmp_path / "t.parquet"],
    }
    for given in (tmp_path / "packed", next((tmp_path / "packed").glob("*.parquet"))):
        code, _, err = run(command, given, *out[command])
        assert code == 1
        assert "a shard of a packed dataset (rows of several documents" in err.splitlines()[-1]
    # Its index.json named (verify, inspect and the loader take it as the dataset): its lines
    # were malformed-JSON skips and "no line has the text field", whose advice (--text-field
    # file) packed its one shard entry as a document, exit 0. A bucket's link is refused too.
    link = tmp_path / "link" / "index.json"
    link.parent.mkdir()
    link.write_text('{"packtool_dataset": "v-20261206T000000-0123abcd"}\n')
    for given in (tmp_path / "packed" / "index.json", link):
        for extra in ((), ("--text-field", "file")):
            code, _, err = run(command, given, *out[command], *extra)
            assert code == 1, err
            assert err.splitlines()[-1] == (
                f"error: {given}: the index.json of a packed dataset; packtool reads corpora and "
                "tokenized Parquet: train on the dataset as it is (loader.PackedDataset), check it "
                "with packtool verify / inspect, or pack the corpus it was made from"
            )
    # Any other file of that name is a corpus file as before.
    other = tmp_path / "other" / "index.json"
    other.parent.mkdir()
    other.write_text('{"text": "a document named index.json"}\n')
    code, _, err = run(command, other, *out[command])
    assert code == 0, err


def test_an_unreadable_row_group_is_a_one_line_error(tmp_path):
    # Seen: pyarrow's several-line message appended whole ("Couldn't deserialize thrift:
    # ...\nDeserializing page header failed.\n").
    path = write(tmp_path / "p.parquet", input_ids=[[1, 2, 3], [4, 5]], labels=[[1, 2, 3], [4, 5]])
    column = pq.ParquetFile(path).metadata.row_group(0).column(0)
    assert column.path_in_schema.startswith("input_ids")
    data = bytearray(path.read_bytes())
    for i in range(6):
        data[column.data_page_offset + i] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError) as info:
        read_all([path])
    said = str(info.value)
    assert "p.parquet: row group 0 unreadable (" in said
    assert "\n" not in said
