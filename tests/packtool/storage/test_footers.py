"""A Parquet file's identity by content (packtool/storage/footers.py): its size and footer
bytes, one ranged read per file, the same for a local file and an object in a bucket."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import DataError
from packtool.storage import footers
from packtool.storage.footers import footer_digest, footer_digests
from tests.packtool.storage.common import bucket_fs, requests_seen

BUCKET = "footers"


def _parquet(path, first_id=0, n=300, row_group_size=100):
    """`n` rows of doc ids from `first_id` (uncompressed: one size for every `first_id`)."""
    table = pa.table({"doc_id": pa.array(np.arange(first_id, first_id + n), pa.int64())})
    pq.write_table(table, path, row_group_size=row_group_size, compression="NONE")
    return path


def _footer(path):
    data = path.read_bytes()
    n = int.from_bytes(data[-8:-4], "little")
    return data[-8 - n :]


def test_a_copy_elsewhere_with_another_time_has_the_digest_and_other_data_another(tmp_path):
    a = _parquet(tmp_path / "a.parquet")
    (tmp_path / "node").mkdir()
    copy = shutil.copy(a, tmp_path / "node" / "a.parquet")
    st = a.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    other = _parquet(tmp_path / "b.parquet", first_id=7000)
    assert other.stat().st_size == st.st_size
    one, two, three = footer_digests([a, copy, other], [st.st_size] * 3)
    assert one == two != three
    assert len(one) == 32 and int(one, 16) >= 0


def test_the_digest_is_of_the_size_and_the_footer_bytes(tmp_path):
    import hashlib

    a = _parquet(tmp_path / "a.parquet")
    size = a.stat().st_size
    want = hashlib.sha256(f"{size}:".encode() + _footer(a)).hexdigest()[:32]
    assert footer_digest(a, size) == want


def test_a_footer_longer_than_the_first_read_is_read_whole(tmp_path, monkeypatch):
    a = _parquet(tmp_path / "a.parquet", n=4000, row_group_size=10)  # 400 row groups
    size = a.stat().st_size
    whole = footer_digest(a, size)
    assert len(_footer(a)) > 4096
    reads = []
    real = footers.local.read_range

    def counted(path, start, end):
        reads.append((start, end))
        return real(path, start, end)

    monkeypatch.setattr(footers, "TAIL", 4096)
    monkeypatch.setattr(footers.local, "read_range", counted)
    assert footer_digest(a, size) == whole
    assert len(reads) == 2 and reads[0] == (size - 4096, size)
    reads.clear()
    monkeypatch.setattr(footers, "TAIL", 64 << 10)
    footer_digest(a, size)
    assert reads == [(max(0, size - (64 << 10)), size)]  # one read where it holds the footer


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"not parquet at all, just text\n", "not a Parquet file"),
        (b"PAR1" + b"\0\0\0" + b"PAR1", "too short to be a Parquet file"),
        (b"PAR1" + b"\xff\xff\xff\x7f" + b"PAR1", "damaged Parquet footer"),
        (b"PAR1" + b"\0" * 8 + b"\xff\xff\x00\x00PAR1", "damaged Parquet footer"),
    ],
)
def test_a_file_that_is_not_parquet_is_a_one_line_error(tmp_path, body, match):
    p = tmp_path / "x.parquet"
    p.write_bytes(body)
    with pytest.raises(DataError, match=match) as info:
        footer_digest(p, len(body))
    assert "\n" not in str(info.value) and str(p) in str(info.value)


def test_a_file_gone_or_cut_after_its_stat_is_a_one_line_error(tmp_path):
    a = _parquet(tmp_path / "a.parquet")
    size = a.stat().st_size
    with pytest.raises(DataError, match="cannot read its Parquet footer"):
        footer_digest(tmp_path / "gone.parquet", size)
    a.write_bytes(a.read_bytes()[:-100])
    with pytest.raises(DataError, match="shorter than its"):
        footer_digest(a, size)


def test_an_object_in_a_bucket_has_its_local_copy_s_digest_in_one_request(
    s3_server, tmp_path, monkeypatch
):
    bucket_fs(s3_server, BUCKET)
    import boto3

    a = _parquet(tmp_path / "a.parquet")
    boto3.client("s3").upload_file(str(a), BUCKET, "data/a.parquet")
    size = a.stat().st_size
    url = f"s3://{BUCKET}/data/a.parquet"
    with requests_seen(s3_server, monkeypatch) as seen:
        got = list(footer_digests([url], [size]))
    assert got == [footer_digest(a, size)]
    assert [m for m, _ in seen if m == "GET"] == ["GET"], seen
