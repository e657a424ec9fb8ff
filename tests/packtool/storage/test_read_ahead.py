"""`remote_read.ReadAhead`: an object read in ranged blocks, the next fetched ahead on a thread.

The reader's logic is checked here against the bytes themselves over an in-memory object (the
`cat_file` of a file system, the one call it makes); the same reader on moto's S3 server is
what tests/packtool/storage/test_remote.py packs through.
"""

from __future__ import annotations

import io
import os
import threading

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from packtool.errors import DataError
from packtool.storage import remote_read


class Blob:
    """An object's bytes behind `cat_file`, counting the ranges asked for."""

    def __init__(self, data: bytes, fail_at: int | None = None):
        self.data = data
        self.fail_at = fail_at
        self.ranges: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def cat_file(self, path: str, start: int, end: int) -> bytes:
        with self.lock:
            self.ranges.append((start, end))
        if self.fail_at is not None and start <= self.fail_at < end:
            raise ConnectionError("connection reset by peer\nsecond line")
        return self.data[start:end]


def _open(
    blob: Blob, block: int, end: int | None = None, buffering: int = 7, first: int | None = None
) -> io.BufferedReader:
    raw = remote_read.ReadAhead("s3://b/k", blob, "b/k", len(blob.data), end, block, first or block)
    return io.BufferedReader(raw, buffer_size=buffering)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.integers(-1, 80)),
        st.tuples(st.just("readline"), st.integers(-1, 40)),
        st.tuples(st.just("seek"), st.integers(-20, 300), st.sampled_from([0, 1, 2])),
    ),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=250).map(lambda b: b.replace(b"\x00", b"\n")),
    block=st.integers(1, 64),
    first=st.integers(1, 64),
    buffering=st.integers(1, 32),
    end=st.one_of(st.none(), st.integers(0, 260)),
    steps=ops,
)
def test_reads_equal_a_plain_file_of_the_same_bytes(data, block, first, buffering, end, steps):
    """Any sequence of reads, lines and seeks gives what `io.BytesIO` of the bytes gives."""
    got = _open(Blob(data), block, end, buffering, first)
    want = io.BytesIO(data)
    for op in steps:
        if op[0] == "seek":
            _, offset, whence = op
            if whence == 0 and offset < 0:
                continue
            assert got.seek(offset, whence) == want.seek(max(0, offset + (
                0 if whence == 0 else want.tell() if whence == 1 else len(data)
            )), 0)  # fmt: skip
        else:
            assert getattr(got, op[0])(op[1]) == getattr(want, op[0])(op[1])
        assert got.tell() == want.tell()
    assert got.read() == want.read()


def _settle() -> None:
    """Wait for the read-ahead threads' queued fetches (one thread's turn comes after them)."""
    pool = remote_read._fetchers(os.getpid())
    for f in [pool.submit(lambda: None) for _ in range(remote_read.READ_AHEAD_THREADS)]:
        f.result()


def test_a_small_first_block_a_larger_second_then_full_ones_each_fetched_at_half_the_last():
    data = bytes(range(256)) * 40  # 10,240 bytes
    blob = Blob(data)
    with _open(blob, 3200, buffering=10, first=100) as f:
        assert f.read(40) == data[:40]  # a probe: one small GET, nothing ahead
        _settle()
        assert blob.ranges == [(0, 100)]
        assert f.read(20) == data[40:60]  # past half of the first block: the next, 4x as large
        _settle()
        assert blob.ranges == [(0, 100), (100, 500)]
        assert f.read() == data[60:]
    # 100, 400, then full 3,200-byte blocks (two at a time in flight: any order between them)
    want = [(0, 100), (100, 500)]
    want += [(at, min(at + 3200, len(data))) for at in range(500, len(data), 3200)]
    assert sorted(blob.ranges) == want  # each byte fetched once


def test_past_the_second_block_two_full_blocks_are_in_flight_at_most():
    data = b"w" * 20_000
    blob = Blob(data)
    raw = remote_read.ReadAhead("s3://b/k", blob, "b/k", len(data), None, 1000, 100)
    buf = bytearray(50)
    got = bytearray()
    most = 0
    while n := raw.readinto(buf):
        got += buf[:n]
        most = max(most, len(raw._ahead))
    assert bytes(got) == data and most == remote_read.READ_AHEAD_BLOCKS == 2


def test_a_buffered_probe_of_the_first_block_fetches_only_it_and_a_reader_goes_on():
    """A buffered reader (the JSONL reader's) takes the whole first block in one call: that
    asked for the next block (`GROWTH` x the first) before the probe of a first record had
    read a line of it, a second GET per object probed. Now the next call asks for it, if it
    comes: a reader that goes on gets the `GROWTH` x block, then full ones, each byte once."""
    blob = Blob((b"q" * 99 + b"\n") * 1000)
    with _open(blob, 50_000, buffering=1 << 20, first=1000) as f:
        f.readline()
        _settle()
        assert blob.ranges == [(0, 1000)]
        assert f.read() == blob.data[100:]
    assert blob.ranges == [(0, 1000), (1000, 1000 + remote_read.GROWTH * 1000), (5000, 55_000),
                           (55_000, 100_000)]  # fmt: skip


def test_a_seek_elsewhere_starts_small_again():
    data = b"z" * 10_000
    blob = Blob(data)
    with _open(blob, 1600, buffering=10, first=100) as f:
        f.seek(5000)
        assert f.read(5) == b"zzzzz"
        assert blob.ranges == [(5000, 5100)]


def test_nothing_is_fetched_ahead_past_end_but_a_read_past_it_still_gets_its_bytes():
    data = b"x" * 5000
    blob = Blob(data)
    with _open(blob, 1000, end=2500, buffering=50) as f:
        assert f.read(2500) == data[:2500]
        _settle()
        assert max(s for s, _ in blob.ranges) == 2000  # block 3 (3000...) never sent ahead
        assert f.read(700) == data[2500:3200]  # the range's last line runs past `end`
    assert (3000, 4000) in blob.ranges and (4000, 5000) not in blob.ranges


def test_a_failed_fetch_is_one_line_naming_the_url_where_its_bytes_are_read():
    blob = Blob(b"y" * 3000, fail_at=1500)
    with _open(blob, 1000, buffering=10) as f:
        assert f.read(1000) == b"y" * 1000  # block 1 failed on its thread: not yet seen
        with pytest.raises(
            DataError, match=r"^s3://b/k: cannot be read \(connection reset by peer\)$"
        ) as e:
            f.read(10)
    assert "\n" not in str(e.value)


# --- prefetch: the first blocks of the next object a reader opens ------------------------------


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 100 B first, 400 B second, then 1,000 B; `remote_read.filesystem` of any URL is the
    blob the test sets."""
    monkeypatch.setattr(remote_read, "FIRST_READ_BYTES", 100)
    monkeypatch.setattr(remote_read, "READ_BYTES", 1000)
    monkeypatch.setattr(remote_read, "_PREFETCHED", type(remote_read._PREFETCHED)())
    blobs: dict[str, Blob] = {}
    monkeypatch.setattr(remote_read, "filesystem", lambda url: (blobs[str(url)], str(url)[5:]))
    return blobs


def _reader(blob: Blob, url: str, end: int | None = None) -> io.BufferedReader:
    return io.BufferedReader(remote_read.ReadAhead(url, blob, url[5:], len(blob.data), end))


@settings(max_examples=100, deadline=None)
@given(
    data=st.binary(min_size=1, max_size=4000),
    start=st.integers(0, 4000),
    end=st.one_of(st.none(), st.integers(0, 4000)),
)
def test_a_prefetched_piece_reads_the_same_bytes_each_fetched_once(data, start, end):
    import contextlib

    with pytest.MonkeyPatch.context() as mp:  # blocks of a few bytes: hypothesis's data is short
        mp.setattr(remote_read, "FIRST_READ_BYTES", 4)
        mp.setattr(remote_read, "READ_BYTES", 16)
        mp.setattr(remote_read, "TAIL_BYTES", 3)
        mp.setattr(remote_read, "_PREFETCHED", type(remote_read._PREFETCHED)())
        blob = Blob(data)
        mp.setattr(remote_read, "filesystem", lambda url: (blob, "b/k"))
        start = min(start, len(data) - 1)
        assume(end is None or end > start)  # a piece ending where it starts is never read
        remote_read.prefetch("s3://b/k", start, end, len(data))
        _settle()
        before = list(blob.ranges)  # what the prefetch asked for, before any open
        with contextlib.closing(_reader(blob, "s3://b/k", end)) as f:
            f.seek(start)
            got = f.read()
        assert got == data[start:]
        assert len(before) == 1 and before[0][0] == start  # one GET: the piece's first block
        ranges = sorted(blob.ranges)
        assert ranges[0][0] == start and ranges[-1][1] == len(data)
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        assert not remote_read._PREFETCHED  # taken


def test_the_blocks_of_a_prefetch_are_the_reader_s_own_and_the_reader_goes_on_after_them(
    small_blocks,
):
    blob = small_blocks["s3://b/k"] = Blob(bytes(range(256)) * 20)  # 5,120 bytes
    remote_read.prefetch("s3://b/k", 0, None, len(blob.data))
    _settle()
    # One full block (a probe's reader starts at 100 bytes: three GETs for a small object).
    assert blob.ranges == [(0, 1000)]
    with _reader(blob, "s3://b/k") as f:
        assert f.read() == blob.data
    assert sorted(blob.ranges) == [(a, min(a + 1000, 5120)) for a in range(0, 5120, 1000)]


def test_a_prefetch_of_a_piece_stops_a_tail_past_its_end(small_blocks, monkeypatch):
    """A piece shorter than a block: its first block is the piece and `TAIL_BYTES` past it (the
    end of the line that crosses its end), not a whole block of the next piece's bytes."""
    monkeypatch.setattr(remote_read, "TAIL_BYTES", 50)
    blob = small_blocks["s3://b/k"] = Blob(bytes(range(256)) * 20)
    remote_read.prefetch("s3://b/k", 1000, 1300, len(blob.data))
    _settle()
    assert blob.ranges == [(1000, 1350)]


def test_prefetched_pieces_are_bounded_and_one_never_opened_is_dropped(small_blocks):
    for name in "abc":
        small_blocks[f"s3://b/{name}"] = Blob(b"n" * 3000)
        remote_read.prefetch(f"s3://b/{name}", 0, 2000, 3000)
    assert list(remote_read._PREFETCHED) == [("b/b", 0), ("b/c", 0)]  # `a` dropped, oldest first
    _settle()
    a = small_blocks["s3://b/a"]
    asked = len(a.ranges)
    with _reader(a, "s3://b/a") as f:  # opened anyway: its first block fetched again, here
        assert f.read(10) == b"n" * 10
    assert a.ranges[asked] == (0, 100)
    # A prefetch stops at the piece's end; one at or past it asks for nothing.
    assert max(e for _, e in small_blocks["s3://b/b"].ranges) <= 2000 + 1000
    remote_read.prefetch("s3://b/a", 3000, None, 3000)
    assert ("b/a", 3000) not in remote_read._PREFETCHED


def test_a_failed_prefetched_block_is_one_line_naming_the_url_where_it_is_read(small_blocks):
    blob = small_blocks["s3://b/k"] = Blob(b"y" * 3000, fail_at=300)
    remote_read.prefetch("s3://b/k", 0, None, 3000)
    _settle()
    failed = pytest.raises(DataError, match=r"^s3://b/k: cannot be read \(connection reset")
    with _reader(blob, "s3://b/k") as f, failed:
        f.read(100)  # the prefetched block failed on its thread
    assert blob.ranges == [(0, 1000)]  # raised from the prefetch's GET, not asked again
