"""Row groups of a dataset in a bucket read through the node's cache (loader/store/bucket.py),
against moto's S3 server on loopback (the `s3_server` fixture): a cached footer that is wrong
but passes its CRC32 (another shard's) is downloaded again before a shard is called damaged."""

from __future__ import annotations

from pathlib import Path

import pytest

from loader import PackedDataset
from packtool.dataset.shards import ShardConfig
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def url(s3_server) -> str:
    """The sample corpus in shards of 256 rows (the last 214) of 32-row row groups, in a bucket."""

    return _packed_into("footers", shard_rows=256)


def _packed_into(bucket: str, shard_rows: int) -> str:
    """The sample corpus packed into a new bucket (max_len 1024, 32-row row groups)."""
    import boto3

    boto3.client("s3").create_bucket(Bucket=bucket)
    run_pack(
        RunConfig(
            inputs=(str(CORPUS),),
            out_dir=f"s3://{bucket}/ds",
            pack=PackConfig(max_len=1024),
            shards=ShardConfig(shard_rows=shard_rows, row_group_rows=32),
            progress=False,
        )  # fmt: skip
    )
    return f"s3://{bucket}/ds"


def _batches(url: str, cache: Path) -> list[list[list[int]]]:
    ds = PackedDataset(url, tokens_per_batch=4096, seed=3, cache_dir=str(cache))
    return [b["input_ids"].tolist() for b in ds]


@pytest.mark.parametrize("other", [1, -1], ids=["same_rows", "other_rows"])
def test_a_cached_footer_of_another_shard_is_downloaded_again(url, tmp_path, other):
    """Two shards' 64 KB footer ranges swapped in the cache pass their CRC32s: every run failed
    'row group N: doc_offsets unreadable ... the shard is damaged' (or, rows differing, 'the
    footer is damaged, repack it') until the cache was emptied by hand."""
    cache = tmp_path / "cache"
    ds = PackedDataset(url, tokens_per_batch=4096, seed=3, cache_dir=str(cache))
    want = [b["input_ids"].tolist() for b in ds]
    shards = ds.store.manifest.shards
    assert len(shards) > 2 and shards[0].rows != shards[-1].rows
    a, b = (
        cache / s.sha256[:2] / f"{s.sha256}-{s.bytes - (64 << 10)}-{s.bytes}"
        for s in (shards[0], shards[other])
    )
    data_a, data_b = a.read_bytes(), b.read_bytes()
    assert len(data_a) == len(data_b) and data_a != data_b
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    assert _batches(url, cache) == want
    assert a.read_bytes() == data_a and b.read_bytes() == data_b  # each its own again


def test_a_footer_over_64_kb_is_downloaded_once_per_node(s3_server, tmp_path):
    """A shard whose footer is over 64 KB re-downloaded the 64 KB tail at every warm open (its
    cached copy was deleted each time the larger range was read)."""
    import boto3

    boto3.client("s3").create_bucket(Bucket="bigfooter")
    lines = CORPUS.read_text(encoding="utf-8").splitlines(keepends=True)[:500]
    corpus = tmp_path / "small.jsonl"
    corpus.write_text("".join(lines), encoding="utf-8")
    run_pack(
        RunConfig(
            inputs=(str(corpus),),
            out_dir="s3://bigfooter/ds",
            pack=PackConfig(max_len=1024),
            shards=ShardConfig(row_group_rows=1),
            progress=False,
        )  # fmt: skip
    )
    cache = tmp_path / "cache"
    cold = PackedDataset("s3://bigfooter/ds", rows_per_batch=4, cache_dir=str(cache))
    meta = cold.store.bucket.metas[0]
    assert meta.serialized_size > 64 << 10 and cold.store.downloaded_bytes > 0
    warm = PackedDataset("s3://bigfooter/ds", rows_per_batch=4, cache_dir=str(cache))
    assert warm.store.downloaded_bytes == 0


def test_a_cold_open_fetches_the_footers_on_the_fetch_threads(url, tmp_path, monkeypatch):
    """A cold open downloaded every shard's footer one after another on the main thread (347
    shards at 50 ms a GET: 21 s before the first batch). They are fetched on the fetch threads
    together, and read in manifest order."""
    import threading

    from loader.store.bucket import BucketRowGroups

    real = BucketRowGroups.footer
    where: dict[int, str] = {}

    def recording(self, shard):
        where[shard] = threading.current_thread().name
        return real(self, shard)

    monkeypatch.setattr(BucketRowGroups, "footer", recording)
    ds = PackedDataset(url, tokens_per_batch=4096, seed=3, cache_dir=str(tmp_path / "c"))
    shards = ds.store.manifest.shards
    assert sorted(where) == list(range(len(shards))) and len(shards) > 2
    assert all(name.startswith("packtool-fetch") for name in where.values()), where
    metas = ds.store.bucket.metas
    assert [m.num_rows for m in metas] == [s.rows for s in shards]
    assert sum(len(b["input_ids"]) for b in ds) > 0


@pytest.mark.parametrize("failure", ["unreadable", "rows"])
def test_a_failed_open_starts_no_footer_fetch_after_the_failure(
    url, tmp_path, monkeypatch, failure
):
    """Shard 0's footer failing (its GET fails: 'unreadable'; or the open refuses the footer:
    'rows', another shard's row count) raised the open's error while the other shards' footer
    GETs went on in the background, the fetch threads taking the next ones (3-4 still running
    at the raise, one more started after it). No footer fetch starts after a failed GET or after
    the open's error, and none is still running once the open has raised."""
    import threading
    import time

    from loader.store.bucket import BucketRowGroups
    from packtool.errors import DataError

    metas = PackedDataset(url, rows_per_batch=4, cache_dir=str(tmp_path / "c")).store.bucket.metas
    assert len(metas) > 8
    lock = threading.Lock()
    starts: list[float] = []
    running = [0]
    failed_at: list[float] = []

    # A footer GET of 250 ms; shard 0's fails after 100 ms: the other fetch threads are busy
    # 150 ms past the failure, so a loaded machine's scheduling cannot start one early.
    def stand_in(self, shard):
        with lock:
            starts.append(time.monotonic())
            running[0] += 1
        try:
            time.sleep(0.1 if shard == 0 else 0.25)
            if shard == 0:
                failed_at.append(time.monotonic())
                if failure == "unreadable":
                    raise DataError("s3://footers/ds/shard 0: footer unreadable (stand-in)")
                return metas[-1]  # 214 rows where index.json says 256
            return metas[shard]
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(BucketRowGroups, "footer", stand_in)
    with pytest.raises(DataError, match="unreadable" if failure == "unreadable" else "index.json"):
        PackedDataset(url, tokens_per_batch=4096, seed=3, cache_dir=str(tmp_path / "c"))
    raised, still = time.monotonic(), running[0]
    time.sleep(0.6)
    # A refused footer is seen on the open's thread: its fetch thread has taken the next one.
    after = [t for t in starts if t > (failed_at[0] if failure == "unreadable" else raised)]
    figures = f"{still} running at the raise, {len(after)} of {len(starts)} started after failing"
    assert still == 0 and after == [], figures  # no GET outlives the open, none starts after


@pytest.fixture(scope="module")
def other(url) -> str:
    """The same corpus packed with another max_len: shards of the same names, other sizes."""
    run_pack(
        RunConfig(
            inputs=(str(CORPUS),),
            out_dir="s3://footers/other",
            pack=PackConfig(max_len=512),
            shards=ShardConfig(shard_rows=256, row_group_rows=32),
            progress=False,
        )  # fmt: skip
    )
    return "s3://footers/other"


def _version(fs, prefix: str) -> str:
    import json

    return json.loads(fs.cat(f"{prefix}/index.json"))["packtool_dataset"]


@pytest.mark.parametrize("when", ["after_open", "before_open"])
@pytest.mark.parametrize("kind", ["shorter", "longer"])
def test_a_shard_rewritten_in_the_bucket_is_named_by_its_size(url, other, tmp_path, when, kind):
    """Another pack's shards put over two of a dataset's (the auditor's swap.py): the read
    failed 'footers/ds/.../shard-...: bytes A-B came back N long (the server answered with fewer
    bytes than asked for); read it again' (no s3://, and reading again cannot help), or, cold,
    the same at open. Now, as `packtool verify` says it: the shard's URL, 'size is N bytes,
    expected M (index.json); truncated or rewritten' (one HEAD, made only once a read failed).
    `longer`: the other way round (max_len 1024's shards over 512's), which failed its footer."""
    import re

    from packtool.errors import DataError
    from packtool.storage import remote

    fs, _ = remote.filesystem(url)
    prefix = f"footers/t-{when}-{kind}"
    source, donor = ("footers/ds", "footers/other")[:: 1 if kind == "shorter" else -1]
    for name in fs.find(source):
        fs.pipe(prefix + name[len(source) :], fs.cat(name))
    mine, theirs = _version(fs, prefix), _version(fs, donor)
    names = ["shard-000000-00001.parquet", "shard-000000-00002.parquet"]
    sizes = {n: fs.size(f"{prefix}/{mine}/{n}") for n in names}
    cache = tmp_path / "cache"

    def swap() -> None:
        for n in names:
            fs.pipe(f"{prefix}/{mine}/{n}", fs.cat(f"{donor}/{theirs}/{n}"))
        fs.invalidate_cache()

    if when == "after_open":
        ds = PackedDataset(f"s3://{prefix}", tokens_per_batch=4096, seed=3, cache_dir=str(cache))
        swap()
        with pytest.raises(DataError) as got:
            for _ in ds:
                pass
    else:
        swap()
        with pytest.raises(DataError) as got:
            PackedDataset(f"s3://{prefix}", tokens_per_batch=4096, seed=3, cache_dir=str(cache))
    text = str(got.value)
    said = re.fullmatch(
        rf"s3://{prefix}/{mine}/(shard-000000-0000[12]\.parquet): size is ([\d,]+) bytes, "
        r"expected ([\d,]+) \(index.json\); truncated or rewritten",
        text,
    )
    assert said is not None, text
    name, now, was = said.group(1), said.group(2), said.group(3)
    now, was = int(now.replace(",", "")), int(was.replace(",", ""))
    assert now == fs.size(f"{donor}/{theirs}/{name}") and was == sizes[name]
    assert now < was if kind == "shorter" else now > was


def test_the_row_stats_of_a_row_group_check_only_its_doc_offsets(url, tmp_path, monkeypatch):
    """`RowIndex`'s stats (the `doc_offsets` column of every row group an epoch plans, in every
    process) checked and mapped the CRC32 of each whole cached range: a warm epoch from a bucket
    spent ~1.4 CPU-s more than from disk (180 MB, 2 ranks x 2 workers), the stats most of it.
    Now they check the blocks of that column's chunk; the decode of the row group checks every
    column it reads, so damage the stats did not read is still never handed on."""
    from loader.store.bucket import byte_range
    from packtool.storage import cache_format

    # This corpus's row groups are ~36 KB, 3 blocks of 16 KiB: 4 KiB blocks here put the first
    # page of input_ids and the doc_offsets chunk in blocks of their own (asserted below)
    monkeypatch.setattr(cache_format, "BLOCK", 4096)
    cache = tmp_path / "cache"
    want = _batches(url, cache)
    ds = PackedDataset(url, tokens_per_batch=4096, seed=3, cache_dir=str(cache))
    store, bucket = ds.store, ds.store.bucket
    g = store.num_row_groups // 2
    shard, local = int(store._rg_shard[g]), int(store._rg_local[g])
    _, key, start, end = bucket._where(shard, g)
    ids = byte_range(bucket.metas[shard], local, ["input_ids"])
    offsets = byte_range(bucket.metas[shard], local, ["doc_offsets"])
    assert start <= ids[0] < ids[1] <= offsets[0] < offsets[1] <= end
    assert offsets[1] - offsets[0] < (end - start) // 4  # a small part of the range
    assert (ids[0] - start) // 4096 < (offsets[0] - start) // 4096  # in blocks of their own
    stats = store.row_stats(g)
    path = bucket.cache.path(key, start, end)
    damaged = bytearray(path.read_bytes())
    damaged[ids[0] - start] ^= 0x01  # the first page of input_ids: not in doc_offsets' blocks
    path.write_bytes(bytes(damaged))
    again = store.row_stats(g)
    assert bucket.cache.downloaded == 0  # nothing downloaded: the stats read no damaged byte
    for name in ("lengths", "n_docs", "sq"):
        assert getattr(again, name).tolist() == getattr(stats, name).tolist()
    assert _batches(url, cache) == want  # the decode finds the damage and downloads the range
    assert path.read_bytes() != bytes(damaged)


def test_a_bad_endpoint_is_a_config_error_naming_it_not_an_unreadable_manifest(
    monkeypatch, tmp_path
):
    # Before: obstore panicked (a Rust backtrace); and any ConfigError of the store (a bad
    # storage option) came as "DataError: .../index.json: unreadable manifest (...)".
    for name, value in (("AWS_ACCESS_KEY_ID", "k"), ("AWS_SECRET_ACCESS_KEY", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "minio:9000")
    monkeypatch.delenv("PACKTOOL_S3_CLIENT", raising=False)
    with pytest.raises(ConfigError) as info:
        PackedDataset("s3://nowhere/ds", rows_per_batch=2, cache_dir=str(tmp_path / "cache"))
    assert str(info.value) == (
        "s3://nowhere/ds/index.json: AWS_ENDPOINT_URL 'minio:9000' is not an endpoint URL; "
        "give http(s)://HOST[:PORT] (e.g. http://minio:9000)"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("PACKTOOL_STORAGE_OPTIONS", '{"bogus": 1}')
    with pytest.raises(
        ConfigError, match=r"^s3://nowhere/ds/index.json: .* 'bogus' is no s3 option"
    ):
        PackedDataset("s3://nowhere/ds", rows_per_batch=2, cache_dir=str(tmp_path / "cache"))


def test_a_shard_gone_at_a_cold_open_is_missing_not_replaced_since_the_open(s3_server, tmp_path):
    # Before: "...: gone: the dataset ... was replaced (--overwrite) or deleted since this job
    # opened it; reopen it to read the new one" at the open itself, where reopening finds the
    # same hole (a local dataset says "shard listed in index.json is missing").
    import boto3

    _packed_into("holes", shard_rows=512)
    ds = PackedDataset("s3://holes/ds", rows_per_batch=2, cache_dir=str(tmp_path / "warm"))
    shard = f"{ds.store.path}/{ds.store.manifest.shards[1].file}"
    boto3.client("s3").delete_object(Bucket="holes", Key=shard.removeprefix("s3://holes/"))
    with pytest.raises(DataError) as info:
        PackedDataset("s3://holes/ds", rows_per_batch=2, cache_dir=str(tmp_path / "cold"))
    assert str(info.value) == f"{shard}: shard listed in index.json is missing"
    with pytest.raises(DataError, match="was replaced .* since this job opened it"):
        list(ds)  # opened before: its footers were read, the shard has gone since
