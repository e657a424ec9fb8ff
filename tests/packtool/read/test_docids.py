"""packtool/read/docids.py: (file index, offset) <-> int64 doc ids."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from packtool.errors import DataError
from packtool.read import docids

FILES = st.integers(0, docids.MAX_FILES - 1)
OFFSETS = st.integers(0, docids.MAX_OFFSET)


@given(FILES, OFFSETS)
def test_encode_and_decode_are_inverse_and_ids_are_non_negative(file_index, offset):
    doc_id = docids.encode(file_index, offset)
    assert 0 <= doc_id < 2**63
    assert docids.decode(doc_id) == (file_index, offset)
    arr = docids.encode(file_index, np.array([offset], dtype=np.int64))
    assert arr.dtype == np.int64 and int(arr[0]) == doc_id
    files, offsets = docids.decode(arr)
    assert (int(files[0]), int(offsets[0])) == (file_index, offset)


@given(st.tuples(FILES, OFFSETS), st.tuples(FILES, OFFSETS))
def test_different_places_never_share_an_id(a, b):
    assert (docids.encode(*a) == docids.encode(*b)) == (a == b)


def test_the_layout_is_24_bits_of_file_and_39_of_offset():
    assert docids.FILE_BITS + docids.OFFSET_BITS == 63
    assert docids.encode(0, 5) == 5  # one input file: the id is the row
    assert docids.encode(1, 0) == 2**39
    assert docids.encode(docids.MAX_FILES - 1, docids.MAX_OFFSET) == 2**63 - 1


@pytest.mark.parametrize(("file_index", "offset"), [(-1, 0), (2**24, 0), (0, -1), (0, 2**39)])
def test_what_does_not_fit_is_refused(file_index, offset):
    with pytest.raises(DataError, match="beyond"):
        docids.encode(file_index, offset)
    if file_index == 0:
        with pytest.raises(DataError, match="beyond"):
            docids.encode(0, np.array([0, offset]))


def test_locate_names_the_file_and_row():
    extra = {"doc_ids": docids.record(["a.parquet", "b.parquet"])}
    assert docids.locate(extra, docids.encode(1, 41)) == ("b.parquet", 41)
    with pytest.raises(DataError, match="names input file 2; the dataset lists 2"):
        docids.locate(extra, docids.encode(2, 0))
    with pytest.raises(DataError, match="'sequential'"):
        docids.locate({"doc_ids": {"scheme": "sequential"}}, 3)


@pytest.mark.parametrize("doc_id", [-7, -(100 << 39), -(2**63)])
def test_a_negative_id_is_refused_not_read_as_a_file_from_the_end(doc_id):
    """Before: -7 decoded to file index -1, which Python's indexing took for the last listed
    file (inspect named it as the document's source); below minus the number of files it was
    an IndexError traceback. `encode` makes no negative id (its sign bit is 0)."""
    extra = {"doc_ids": docids.record(["a.parquet", "b.parquet"])}
    for read in (docids.locate, docids.place, docids.source):
        with pytest.raises(DataError, match=f"doc id {doc_id} is negative"):
            read(extra, doc_id)
    assert docids.places(extra, [doc_id, 1]) == [
        f"unknown (doc id {doc_id} is negative (ids are file index << 39 | offset, never below 0))",
        "a.parquet:row 1",
    ]
    with pytest.raises(DataError, match=f"doc id {doc_id} is negative"):
        docids.decode(np.array([3, doc_id], dtype=np.int64))


def test_where_names_each_unit_and_an_older_datasets_kept_record_count():
    assert docids.where("a.parquet", 4, "row") == "a.parquet:row 4"
    assert docids.where("a.json", 2, "item") == "a.json:item 2"
    assert docids.where("a.txt", 0, "file") == "a.txt"
    # Fine-tuning ids before 2026-12-05 counted the records kept, not the file's records.
    assert docids.where("c.jsonl", 3, "record") == "c.jsonl:record 3 of those kept"


def test_a_line_is_named_only_where_the_file_has_one_at_that_byte(tmp_path):
    """Before: inspect run from another folder resolved a dataset's relative `a.jsonl` to an
    unrelated 35-byte a.jsonl there and said `a.jsonl:line 3 (byte 10550)`: a line counted up to
    the file's end, past it, or inside a line. The byte form is all that can be said then."""
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"text": "one"}\n{"text": "two"}\n')
    assert docids.where(str(f), 0, "byte", size=32) == f"{f}:line 1 (byte 0)"
    assert docids.where(str(f), 16, "byte", size=32) == f"{f}:line 2 (byte 16)"
    for offset in (5, 32, 33, 10550):  # inside a line; at the end; past it
        assert docids.where(str(f), offset, "byte", size=32) == f"{f}:byte {offset}"


def test_a_line_is_counted_only_in_a_file_of_the_recorded_size(tmp_path):
    """A line can start at the byte in another file too (r1: inspect run from another folder
    said `in/small.jsonl:line 24860 (byte 99436)` for line 105 of the file packed): the size
    recorded at pack time is compared first; where none is recorded, the byte is all."""
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"\n" * 40)  # a line starts at every byte
    assert docids.where(str(f), 16, "byte", size=40) == f"{f}:line 17 (byte 16)"
    assert docids.where(str(f), 16, "byte", size=41) == f"{f}:byte 16"
    assert docids.where(str(f), 16, "byte") == f"{f}:byte 16"
    extra = {"doc_ids": docids.record([str(f)], ["byte"], sizes=[40])}
    assert docids.place(extra, docids.encode(0, 16)) == f"{f}:line 17 (byte 16)"
    extra = {"doc_ids": docids.record([str(f)], ["byte"])}  # packed before sizes were kept
    assert docids.place(extra, docids.encode(0, 16)) == f"{f}:byte 16"


def test_sizes_kept_in_the_sources_file_are_read(tmp_path):
    import hashlib

    f = tmp_path / "a.jsonl"
    f.write_bytes(b"\n" * 40)
    data = docids.sources_bytes([str(f)], ["byte"], [40])
    (tmp_path / docids.SOURCES_FILE).write_bytes(data)
    info = docids.record([str(f)], ["byte"], sources_sha256=hashlib.sha256(data).hexdigest())
    assert docids.place({"doc_ids": info}, 3, tmp_path) == f"{f}:line 4 (byte 3)"


@pytest.mark.parametrize("files", [[["a"]], [123], [None]])
def test_a_sources_file_naming_a_file_by_anything_but_text_is_damage(tmp_path, files):
    """Before: [["a"]] failed `inspect --row` with "unhashable type: 'list'" and [123] was shown
    as "from 123:byte ..."; the same lists inline in index.json were refused."""
    import hashlib
    import json

    data = (json.dumps({"files": files, "units": ["byte"], "sizes": [5]}) + "\n").encode()
    (tmp_path / docids.SOURCES_FILE).write_bytes(data)
    info = docids.record(["x"], ["byte"], sources_sha256=hashlib.sha256(data).hexdigest())
    with pytest.raises(DataError, match="not 1 input files with their units"):
        docids.places({"doc_ids": info}, [3], tmp_path)


def test_a_source_at_a_web_address_is_never_fetched_to_count_lines():
    """inspect counted a source's lines by reading it up to the offset, at whatever address
    the dataset names: a dataset from elsewhere made it fetch from hosts it chose (a cloud's
    metadata address included). A web source is named by its byte, with no request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            asked.append(self.path)
            self.send_response(200)
            self.send_header("Content-Length", "12")
            self.end_headers()
            self.wfile.write(b"a\nb\nc\nd\ne\nf\n")

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/corpus.jsonl"
        assert docids.where(url, 6, "byte") == f"{url}:byte 6"
    finally:
        server.shutdown()
        server.server_close()
    assert asked == []


def test_lines_are_counted_only_below_the_cap(tmp_path, monkeypatch):
    """Before: inspect --row read a source up to any offset to count its lines (1 GB: 1.6 s,
    50 GB: a minute; a bucket's object downloaded that far). Past `LINE_COUNT_BYTES` of the
    file before the document, its place is its byte."""
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"\n" * 40)
    monkeypatch.setattr(docids, "LINE_COUNT_BYTES", 16, raising=False)
    assert docids.where(str(f), 15, "byte", size=40) == f"{f}:line 16 (byte 15)"
    assert docids.where(str(f), 16, "byte", size=40) == f"{f}:byte 16"
    extra = {"doc_ids": docids.record([str(f)], ["byte"], sizes=[40])}
    ids = [docids.encode(0, 3), docids.encode(0, 30)]
    assert docids.places(extra, ids) == [f"{f}:line 4 (byte 3)", f"{f}:byte 30"]


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_compressed_files_byte_is_said_to_be_of_the_decompressed_text(
    tmp_path, monkeypatch, suffix
):
    """`inspect` said `s.jsonl.gz:line 14 (byte 5889)`: an offset in the decompressed text,
    labelled as if it were the file's own byte (`compressed.byte_place` says which)."""
    import gzip

    import zstandard

    text = b"a\n" * 20
    f = tmp_path / f"s{suffix}"
    compress = {".gz": gzip.compress, ".zst": zstandard.ZstdCompressor().compress}
    f.write_bytes(compress.get(f.suffix, bytes)(text))
    size = f.stat().st_size
    label = "byte 6" if suffix == ".jsonl" else "byte 6 of the decompressed text"
    assert docids.where(str(f), 6, "byte", size=size) == f"{f}:line 4 ({label})"
    assert docids.where(str(f), 6, "byte", count_lines=False) == f"{f}:{label}"
    extra = {"doc_ids": docids.record([str(f)], ["byte"], sizes=[size])}
    assert docids.place(extra, docids.encode(0, 6)) == f"{f}:line 4 ({label})"
    monkeypatch.setattr(docids, "LINE_COUNT_BYTES", 4, raising=False)  # past the cap: no line
    assert docids.places(extra, [docids.encode(0, 2), docids.encode(0, 6)]) == [
        f"{f}:line 2 ({label.replace('6', '2')})",
        f"{f}:{label}",
    ]
