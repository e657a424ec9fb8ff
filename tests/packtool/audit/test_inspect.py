"""`packtool inspect`: exact summary and row contents on a hand-made dataset, pictures, JSON."""

from __future__ import annotations

import json
from dataclasses import replace

import matplotlib.image
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit.inspect import inspect_dataset, read_row, summarize_dataset
from packtool.audit.verify import verify_dataset
from packtool.errors import ConfigError
from packtool.stats.plots import plot_attention_mask, plot_row_fill
from tests.packtool.audit.test_verify import run_cli

HELLO = list(b"hello world\n")
# max_len 16; row fills 16, 16, 7 | 16, 16, 2 tokens; document 5 split across shards.
SHARDS = [
    [[(0, 0, HELLO), (1, 0, 4)], [(2, 0, 16)], [(3, 0, 4), (4, 0, 3)]],
    [[(5, 0, 16)], [(5, 1, 6), (6, 0, 10)], [(7, 0, [257, 258])]],
]


@pytest.fixture
def dataset(packed_dataset_factory):
    return packed_dataset_factory(SHARDS, vocab_size=300, row_group_size=2)


def test_summary_measures_fill(dataset):
    s = summarize_dataset(dataset)
    assert (s.rows, s.tokens) == (6, 73)
    assert s.fill is not None
    assert s.fill.fill_min == pytest.approx(2 / 16)
    assert s.fill.fill_p50 == pytest.approx(1.0)
    assert s.fill.fill_mean == pytest.approx(73 / 96)
    assert (s.fill.docs_min, s.fill.docs_max, s.fill.docs_mean) == (1, 2, 1.5)
    assert s.gap_rows == 6 - 5
    assert [list(r) for r in s.first_rows] == [
        [0, 12, 16],
        [0, 16],
        [0, 4, 7],
        [0, 16],
        [0, 6, 16],
        [0, 2],
    ]
    text = s.format()
    assert "rows        6 (lower bound 5, gap 1 = 20.00%)" in text
    assert "fill        min 12.5%  p50 100.0%  p90 100.0%  mean 76.0%" in text


def test_row_lists_its_documents(dataset):
    # Global row 4 is shard 1's row 1, in that shard's second row group.
    view = read_row(dataset, 4)
    assert (view.file, view.shard_row, view.length) == ("shard-00001.parquet", 1, 16)
    assert [(d.doc_id, d.chunk, d.start, d.length) for d in view.documents] == [
        (5, 1, 0, 6),
        (6, 0, 6, 10),
    ]
    assert list(view.doc_offsets) == [0, 6, 16]


def test_byte_preview_and_token_ids(dataset, packed_dataset_factory):
    view = read_row(dataset, 0)
    assert view.documents[0].preview == "'hello world\\n'"
    # Ids above 255 (specials) are left out of a byte preview.
    assert read_row(dataset, 5).documents[0].preview == "''"
    other = packed_dataset_factory(
        [[[(0, 0, [*range(100, 110), 0])]]],  # ends in its EOS, as verify (and inspect) want
        name="hf",
        tokenizer={"kind": "hf", "name": "t", "vocab_size": 300, "eos_id": 0, "bos_id": None},
    )
    assert read_row(other, 0).documents[0].preview == "[100 101 102 103 104 105 106 107 ...]"


def test_cli_row_output(dataset, capsys):
    code, out, err = run_cli(["inspect", str(dataset), "--row", "4"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    i = lines.index(
        "row 4 (shard-00001.parquet row 1): 16 tokens of max_len 16 (100.0%), 2 documents"
    )
    assert lines[i + 2].split()[:4] == ["5", "1", "0", "6"]
    assert lines[i + 3].split()[:4] == ["6", "0", "6", "10"]


@pytest.mark.parametrize("row", ["6", "-1"])
def test_out_of_range_row_is_one_line(dataset, capsys, row):
    code, out, err = run_cli(["inspect", str(dataset), "--row", row], capsys)
    assert code == 1
    assert err.strip() == f"error: --row {row} / row={row} is out of range (valid: 0..5; 6 rows)"
    with pytest.raises(ConfigError):
        read_row(dataset, int(row))


def test_json_parses(dataset, capsys):
    code, out, err = run_cli(["inspect", str(dataset), "--json", "--row", "0"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["summary"]["rows"] == 6
    assert data["summary"]["gap_rows"] == 1
    assert data["summary"]["tokenizer"]["vocab_size"] == 300
    assert data["row"]["doc_offsets"] == [0, 12, 16]
    assert [d["doc_id"] for d in data["row"]["documents"]] == [0, 1]
    assert data["plots"] == []


def assert_png(path, min_side=200):
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 2_000
    image = matplotlib.image.imread(path)
    assert min(image.shape[:2]) >= min_side
    # Not blank: several distinct colours (documents, white padding, axes).
    assert len(np.unique(image.reshape(-1, image.shape[2]), axis=0)) > 3


def test_plot_writes_fill_and_mask(dataset, tmp_path, capsys):
    out_png = tmp_path / "pics" / "fill.png"
    out_png.parent.mkdir()
    code, out, err = run_cli(
        ["inspect", str(dataset), "--row", "2", "--plot", str(out_png)], capsys
    )
    assert code == 0, err
    mask_png = tmp_path / "pics" / "fill-row-2.png"
    assert f"wrote {out_png}" in out
    assert f"wrote {mask_png}" in out
    assert_png(out_png, min_side=150)
    assert_png(mask_png)
    # Without --row only the fill picture is written.
    result = inspect_dataset(dataset, plot=tmp_path / "only.png")
    assert result.plots == (tmp_path / "only.png",)
    assert not (tmp_path / "only-row-2.png").exists()


def test_plot_rejects_unknown_suffix(dataset, tmp_path, capsys):
    code, out, err = run_cli(["inspect", str(dataset), "--plot", str(tmp_path / "x.txt")], capsys)
    assert code == 1
    assert err.startswith("error: plot file") and ".txt" in err
    assert len(err.strip().splitlines()) == 1


def test_plots_draw_long_rows_quickly(tmp_path):
    # Rows of max_len 32,768 and a 32k-token mask are sampled down, not drawn pixel by pixel.
    rng = np.random.default_rng(0)
    rows = [np.unique(np.r_[0, rng.integers(1, 32_768, 30), 32_768]) for _ in range(16)]
    assert_png(plot_row_fill(rows, 32_768, tmp_path / "fill.png"), min_side=150)
    assert_png(plot_attention_mask(rows[0], tmp_path / "mask.png"))


def test_a_packed_documents_source_file_and_line(tmp_path, capsys):
    """`inspect --row` names the file and line each document came from (format 3 ids)."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    files = []
    for f in range(2):
        path = tmp_path / f"in-{f}.jsonl"
        lines = [json.dumps({"text": f"file {f} line {k + 1} " + "x" * (k % 9)}) for k in range(30)]
        path.write_text("\n".join(lines) + "\n")
        files.append(path)
    out = tmp_path / "out"
    run_pack(
        RunConfig(
            inputs=tuple(map(str, files)),
            out_dir=str(out),
            pack=PackConfig(max_len=128),
            partition_size=500,  # the files are cut into byte ranges
            workers=1,
            progress=False,
        )
    )
    code, text, err = run_cli(["inspect", str(out), "--row", "3"], capsys)
    assert code == 0, err
    sources = [line.split("from ", 1)[1] for line in text.splitlines() if " from " in line]
    view = read_row(out, 3)
    assert len(sources) == len(view.documents) >= 2
    for doc, where in zip(view.documents, sources, strict=True):
        file, rest = where.split(":line ")
        line_no = int(rest.split()[0])
        # The document's own text names its file and line: the two must agree.
        assert doc.preview.strip("'").startswith(f"file {file[-7]} line {line_no} ")
        assert where == doc.source


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_inspect_says_a_gz_documents_byte_is_of_the_decompressed_text(tmp_path, capsys, suffix):
    """`inspect --row` of data packed from a `.jsonl.gz` said `s.jsonl.gz:line 14 (byte 5889)`,
    an offset in the decompressed text labelled as the file's own byte."""
    import gzip

    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    path = tmp_path / f"s{suffix}"
    text = "".join(json.dumps({"text": f"line {k + 1} " + "x" * k}) + "\n" for k in range(30))
    path.write_bytes(gzip.compress(text.encode()) if suffix == ".jsonl.gz" else text.encode())
    out = tmp_path / "out"
    config = RunConfig(inputs=(str(path),), out_dir=str(out), pack=PackConfig(max_len=64))
    run_pack(replace(config, workers=1, progress=False))
    code, shown, err = run_cli(["inspect", str(out), "--row", "2"], capsys)
    assert code == 0, err
    sources = [line.split("from ", 1)[1] for line in shown.splitlines() if " from " in line]
    assert sources, shown
    for where in sources:
        line_no = int(where.split(":line ")[1].split()[0])
        offset = text.encode().index(json.dumps({"text": f"line {line_no} "})[:-2].encode())
        label = f"byte {offset}" + (" of the decompressed text" if suffix != ".jsonl" else "")
        assert where == f"{path}:line {line_no} ({label})", where


@settings(max_examples=200, deadline=None)
@given(
    shards=st.lists(
        st.lists(st.integers(0, 70), min_size=0, max_size=30), min_size=1, max_size=5
    ).filter(lambda s: sum(map(len, s)) > 0),
    q=st.sampled_from([0, 10, 50, 90, 99, 100]),
)
def test_the_summary_histogram_gives_numpys_figures(shards, q):
    """inspect's summary folds each shard's figures into counts (bounded memory); its
    percentiles must be numpy's own on all the values."""
    from packtool.audit.inspect import _Histogram

    h = _Histogram()
    for shard in shards:
        h.add(np.asarray(shard, dtype=np.int64))
    every = np.concatenate([np.asarray(s, dtype=np.int64) for s in shards])
    assert h.n == len(every) and h.total() == every.sum()
    assert (h.min(), h.max()) == (every.min(), every.max())
    assert h.mean() == pytest.approx(every.mean())
    assert h.percentile(q) == pytest.approx(float(np.percentile(every, q)))


def _pack_relative(folder, monkeypatch, text: str, max_len: int = 64, **pack):
    """A dataset packed in `folder` from the relative input `in/a.jsonl` (its `text` lines)."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    (folder / "in").mkdir(parents=True)
    (folder / "in" / "a.jsonl").write_text(text)
    monkeypatch.chdir(folder)
    run_pack(
        RunConfig(
            inputs=("in/a.jsonl",),
            out_dir=str(folder / "out"),
            pack=PackConfig(max_len=max_len, **pack),
            workers=1,
            progress=False,
        )
    )
    return folder / "out"


def test_a_line_is_never_counted_in_another_file_of_the_same_name(tmp_path, monkeypatch):
    """Before: inspect run from another folder counted the line in that folder's unrelated
    in/a.jsonl wherever a line started at the recorded byte (r1: `in/small.jsonl:line 24860
    (byte 99436)` for line 105). The size pack recorded is compared first."""
    lines = [json.dumps({"text": f"document {k} " + "y" * (k % 7)}) for k in range(20)]
    out = _pack_relative(tmp_path / "made", monkeypatch, "\n".join(lines) + "\n")
    here = read_row(out, 0).documents
    assert all(":line " in d.source for d in here), [d.source for d in here]
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "in").mkdir(parents=True)
    (elsewhere / "in" / "a.jsonl").write_bytes(b"\n" * 5000)  # a line starts at every byte
    monkeypatch.chdir(elsewhere)
    docs = read_row(out, 0).documents
    for d, before in zip(docs, here, strict=True):
        offset = before.source.split("(byte ")[1].rstrip(")")
        assert d.source == f"in/a.jsonl:byte {offset}"


def test_a_rows_lines_are_counted_in_one_scan_of_their_file(tmp_path, monkeypatch):
    """Before: each document of the row rescanned its input from byte 0 (r2: a row of 84
    documents after 40 MB of JSONL took ~5 s, 84 x 40 MB read). Now one read per file, up
    to the row's last offset."""
    import packtool.read.lines as lines_module

    text = json.dumps({"text": "x" * 200_000}) + "\n"
    text += "".join(json.dumps({"text": f"short document {k}"}) + "\n" for k in range(60))
    out = _pack_relative(tmp_path / "made", monkeypatch, text, max_len=512, long_docs="drop")
    read = {"bytes": 0, "opens": 0}
    real = lines_module.open_stream

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            block = self.f.read(n)
            read["bytes"] += len(block)
            return block

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def counting(path):
        read["opens"] += 1
        return Counting(real(path))

    monkeypatch.setattr(lines_module, "open_stream", counting)
    docs = read_row(out, 0).documents
    assert len(docs) >= 3 and all(":line " in d.source for d in docs)
    for d in docs:  # the document's own text says which line it is (line 1 was dropped)
        k = int(d.preview.strip("'").split()[2])
        assert f":line {k + 2} (byte " in d.source
    assert read["opens"] == 1
    assert read["bytes"] <= len(text.encode())


def _damaged_row(d, edit):
    """Rewrite the first shard of `d` with `edit(rows)` applied (a pyarrow row list)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    shard = d / "shard-00000.parquet"
    table = pq.read_table(shard)
    rows = table.to_pylist()
    edit(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), shard)


@pytest.mark.parametrize(
    "edit",
    [
        lambda rows: rows[0].update(doc_offsets=rows[0]["doc_offsets"][:-1]),  # one short
        lambda rows: rows[0]["input_ids"].__setitem__(0, None),  # a null token
        lambda rows: rows[0]["doc_chunks"].__setitem__(0, None),  # a null chunk
        lambda rows: rows[0]["doc_ids"].__setitem__(1, None),  # a null id
        lambda rows: rows[0].update(doc_offsets=None),  # a null list
        lambda rows: rows[0]["doc_offsets"].__setitem__(1, 10**6),  # past the row
    ],
)
def test_a_damaged_row_is_the_one_line_verify_error(dataset, capsys, edit):
    """Before: `inspect --row` on a row whose doc_offsets was one entry short gave an
    IndexError traceback, on a null token or chunk a TypeError (r5): the per-document loop
    ran outside the check that turns damage into `run packtool verify`."""
    from packtool.errors import DataError

    _damaged_row(dataset, edit)
    with pytest.raises(DataError, match="run `packtool verify`"):
        read_row(dataset, 0)
    code, out, err = run_cli(["inspect", str(dataset), "--row", "0"], capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("kind", "shown"), [("list<string>", "list<.*string>"), ("int32", "int32")]
)
def test_doc_offsets_of_another_type_is_one_line(dataset, capsys, kind, shown):
    """Before: a TypeError ("data type 'string' not understood") or AttributeError ("'Int32Array'
    object has no attribute 'offsets'") traceback from the summary; verify said it in one line."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.errors import DataError

    shard = dataset / "shard-00000.parquet"
    table = pq.read_table(shard)
    i = table.schema.get_field_index("doc_offsets")
    if kind == "int32":
        column = pa.array([len(r) for r in table.column(i).to_pylist()], pa.int32())
    else:
        column = table.column(i).cast(pa.list_(pa.string()))
    pq.write_table(table.set_column(i, pa.field("doc_offsets", column.type), column), shard)
    with pytest.raises(DataError, match=f"doc_offsets is {shown}, not a list of integers"):
        summarize_dataset(dataset)
    code, _, err = run_cli(["inspect", str(dataset)], capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def _flip_a_value_bit(dataset, column: str, group: int) -> None:
    """Rewrite the first shard as `pack` writes shards (a CRC32 on every page; plain, unpacked
    values here, so that a flipped bit still decodes), then flip a bit of the last byte of
    `column`'s values in row group `group` (a value, not a page header)."""
    import pyarrow.parquet as pq

    shard = dataset / "shard-00000.parquet"
    table = pq.read_table(shard)
    options = {"compression": "none", "use_dictionary": False, "row_group_size": 2}
    pq.write_table(table, shard, write_page_checksum=True, **options)
    meta = pq.ParquetFile(shard).metadata.row_group(group)
    chunk = next(
        meta.column(i)
        for i in range(meta.num_columns)
        if meta.column(i).path_in_schema.split(".")[0] == column
    )
    data = bytearray(shard.read_bytes())
    data[chunk.data_page_offset + chunk.total_compressed_size - 1] ^= 0x01
    shard.write_bytes(bytes(data))


def test_a_flipped_bit_in_a_page_is_one_line_not_a_wrong_value(dataset, capsys):
    """Before: inspect read shards without checking the pages' CRC32s (verify and the loader
    check them), so `inspect --row` showed a damaged doc_ids page's values, exit 0 (r3: a
    wrong doc id and its source; verify --no-checksums said the CRC failed)."""
    from packtool.errors import DataError

    _flip_a_value_bit(dataset, "doc_ids", 1)  # row 2, [3, 4]: 4 became 4 + 2**56
    with pytest.raises(DataError, match=r"cannot read row 2 in row group 1 \(.*CRC"):
        read_row(dataset, 2)
    assert [d.doc_id for d in read_row(dataset, 0).documents] == [0, 1]  # group 0 is whole
    code, out, err = run_cli(["inspect", str(dataset), "--row", "2"], capsys)
    assert code == 1 and len(err.strip().splitlines()) == 1 and "CRC" in err, err
    _flip_a_value_bit(dataset, "doc_offsets", 1)  # the summary reads doc_offsets only
    with pytest.raises(DataError, match=r"cannot read doc_offsets in row group 1 \(.*CRC"):
        summarize_dataset(dataset)


def test_a_negative_doc_id_is_named_not_decoded(dataset, capsys):
    """Before: a negative doc id decoded to a negative file index, which Python's indexing
    took for a file counted from the end (-7 showed the last input file) or, below minus the
    number of files, an IndexError traceback. verify said "doc id -7 is negative"."""
    import json

    from packtool.errors import DataError

    index = json.loads((dataset / "index.json").read_text())
    files = [f"in-{k}.jsonl" for k in range(3)]
    ids = {"scheme": "file_offset", "file_bits": 24, "offset_bits": 39, "files": files}
    index["extra"] = {**index.get("extra", {}), "doc_ids": {**ids, "units": ["row"] * 3}}
    (dataset / "index.json").write_text(json.dumps(index))
    for bad in (-7, -(100 << 39)):
        _damaged_row(dataset, lambda rows, bad=bad: rows[0]["doc_ids"].__setitem__(1, bad))
        with pytest.raises(DataError, match=f"row 0: doc id {bad} is negative; run `packtool"):
            read_row(dataset, 0)
        code, out, err = run_cli(["inspect", str(dataset), "--row", "0"], capsys)
        assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_a_token_column_of_another_type_is_one_line_and_any_id_previews(dataset, capsys):
    """Before: a shard whose input_ids were int32 (verify: "column input_ids is list<int32>,
    expected list<uint16>") was read as it was, and a negative id stopped the byte preview
    with a ValueError traceback ("bytes must be in range(0, 256)")."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.audit.inspect import preview
    from packtool.errors import DataError

    shard = dataset / "shard-00000.parquet"
    table = pq.read_table(shard)
    rows = table.to_pylist()
    rows[0]["input_ids"][0] = -5
    schema = table.schema.set(0, pa.field("input_ids", pa.list_(pa.int32())))
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), shard)
    expected = "column input_ids is list<int32>, expected list<uint16> for vocab_size 300"
    with pytest.raises(DataError, match=expected):
        read_row(dataset, 0)
    code, out, err = run_cli(["inspect", str(dataset), "--row", "0"], capsys)
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    byte = {"kind": "byte", "eos_id": 256, "bos_id": None}
    ids = np.array([-5, 104, 2**40, 105, 256], dtype=np.int64)
    assert preview(ids, byte) == "'hi'"


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([0, 0, 2, 1], r"loss_mask\[2\] = 2 is above 1"),
        ([0, 0, 1], "3 loss_mask values for 4 input_ids"),
        ([1, 0, 0, 0], r"document 0 \(tokens 0..4\) has no non-zero loss_mask value past its"),
    ],
)
def test_inspect_row_refuses_the_mask_verify_refuses_in_one_line(
    packed_dataset_factory, capsys, bad, message
):
    """Before: `inspect --row` showed a loss_mask value of 2 as supervised (mask strip drawn,
    exit 0) where verify says "loss_mask[250] = 2 is above 1" (audit repro_mask2_inspect.sh):
    the row reader checked the mask's length only, never verify_columns.row_problem."""
    from packtool.errors import DataError
    from tests.packtool.audit.test_verify_columns import GOOD, make

    d = make(packed_dataset_factory, [GOOD[0], {**GOOD[1], "loss_mask": bad}])
    assert read_row(d, 0).documents[0].supervised == 2  # the good row still reads
    with pytest.raises(DataError, match=message) as verified:
        verify_dataset(d)
    with pytest.raises(DataError, match=f"row 1: {message}.*; run `packtool verify`$"):
        read_row(d, 1)
    code, out, err = run_cli(["inspect", str(d), "--row", "1"], capsys)
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1, err
    assert str(verified.value).split("(global row 1): ")[1] in err  # verify's own words
