"""Training from a bucket: `PackedDataset("s3://...")` reads row groups by ranged GETs into the
node's cache (packtool/storage/cache.py), against a real S3 API server on loopback (moto's
server mode, the `s3_server` fixture); its batches are those of the same dataset on disk."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path

import pytest

from loader import PackedDataLoader, PackedDataset
from packtool.dataset.shards import ShardConfig
from packtool.engines.local import RunConfig, run_pack
from packtool.pack.chunk import PackConfig
from packtool.storage.cache import RangeCache
from packtool.storage.cache_format import trailer_size
from tests.loader.store.conftest import CORPUS


def _epochs(path, cache: Path | None, epochs: int = 2, workers: int = 2, **kw) -> list[dict]:
    """Every batch of `epochs` epochs over 2 ranks, `workers` workers each (tensors as lists).

    The batches do not depend on the number of workers (loader/packed/dataloader.py; the resume
    test below holds a run of workers to one of none): the local dataset's, which the bucket's
    are held to, are read in this process (`workers=0`), not by worker processes of their own
    (8 for 2 epochs)."""
    out = []
    for rank in range(2):
        ds = PackedDataset(
            path, tokens_per_batch=4096, rank=rank, world_size=2, seed=3,
            cache_dir=None if cache is None else str(cache), **kw,
        )  # fmt: skip
        for epoch in range(epochs):
            ds.set_epoch(epoch)
            for b in PackedDataLoader(ds, num_workers=workers):
                out.append({k: v.tolist() for k, v in b.items() if hasattr(v, "tolist")})
    return out


def test_the_loader_from_a_bucket_gives_the_batches_of_the_local_dataset(datasets, tmp_path):
    local, url = datasets
    cache = tmp_path / "cache"
    want = _epochs(local, None, workers=0)
    # A cache much smaller than the dataset (~0.5 MB of ~3 MB): row groups come and go.
    got = _epochs(url, cache, cache_limit=512 << 10)
    assert len(got) == len(want) > 10
    assert got == want
    held = sum(p.stat().st_size for p in cache.rglob("*") if p.is_file())
    assert held <= 512 << 10 or held < 2 * (512 << 10)  # bounded (slack: one sweep interval)


def test_a_warm_cache_downloads_nothing_and_a_node_downloads_each_range_once(datasets, tmp_path):
    _, url = datasets
    cache = tmp_path / "cache"
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    first = [b["input_ids"].tolist() for b in ds]
    assert ds.store.downloaded_bytes > 0
    again = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    assert [b["input_ids"].tolist() for b in again] == first
    assert again.store.downloaded_bytes == 0  # every range came from the node's cache
    # Several readers of one range at once: one download.
    store = again.store
    fresh = RangeCache(tmp_path / "fresh", 1 << 30)
    info = store.manifest.shards[0]
    start, end = (int(x) for x in store.bucket.spans[0])
    readers = [RangeCache(tmp_path / "fresh", 1 << 30) for _ in range(6)]
    barrier = threading.Barrier(len(readers))

    def read(c: RangeCache) -> None:
        barrier.wait()
        with c.pinned(store.path / info.file, info.sha256, start, end) as view:
            assert len(view) == end - start

    threads = [threading.Thread(target=read, args=(c,)) for c in readers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(c.downloaded for c in readers) == end - start
    assert fresh.sweep() == end - start + trailer_size(end - start)  # the range, its CRC32s


def test_a_pinned_range_is_never_evicted(datasets, tmp_path):
    _, url = datasets
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(tmp_path), shuffle=False)
    store = ds.store
    cache = RangeCache(tmp_path, 1)  # everything is over the limit
    spans = [(int(a), int(b)) for a, b in store.bucket.spans[:3]]
    info = store.manifest.shards[int(store._rg_shard[0])]
    for a, b in spans:
        cache.fetch(store.path / info.file, info.sha256, a, b)
    a, b = spans[0]
    with cache.pinned(store.path / info.file, info.sha256, a, b) as view:
        before = bytes(view)
        cache.sweep()
        assert cache.path(info.sha256, a, b).exists()  # read now: kept
        assert not cache.path(info.sha256, *spans[1]).exists()  # nobody read it: gone
        assert bytes(view) == before
    cache.sweep()
    assert not cache.path(info.sha256, a, b).exists()


def test_a_damaged_cached_range_is_downloaded_again(datasets, tmp_path):
    local, url = datasets
    cache = tmp_path / "cache"
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    want = [b["input_ids"].tolist() for b in ds]
    for p in cache.rglob("*"):  # flip a byte in the middle of every cached range
        if p.is_file() and p.stat().st_size > 100:
            data = bytearray(p.read_bytes())
            data[len(data) // 2] ^= 0xFF
            p.write_bytes(bytes(data))
    again = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    assert [b["input_ids"].tolist() for b in again] == want  # page checksums caught each one
    assert again.store.downloaded_bytes > 0


def test_a_mixture_file_and_the_hf_view_read_a_bucket(datasets, tmp_path):
    from loader import MixedDataset
    from loader.hf import hf_dataset

    local, url = datasets
    mix = tmp_path / "mix.json"  # a relative local path and a URL, as a user writes them
    spec = {
        "total_tokens": 200_000,
        "sources": [
            {"name": "disk", "path": "ds", "weight": 1},
            {"name": "bucket", "path": url, "weight": 1},
        ],
    }
    mix.write_text(json.dumps(spec))
    # Other data on disk (another seed): the bucket's own copy under a second name would be
    # the same data twice, which a mixture refuses.
    run_pack(
        RunConfig(
            inputs=(str(CORPUS),),
            out_dir=str(tmp_path / "ds"),
            pack=PackConfig(max_len=1024, seed=1),
            shards=ShardConfig(row_group_rows=32),
            progress=False,
        )  # fmt: skip
    )
    mixed = MixedDataset(mix, tokens_per_batch=4096, cache_dir=str(tmp_path / "c"))
    sources = set()
    for b in mixed:
        sources.update(b["source"].tolist())
        assert b["input_ids"].numel() <= 4096
    assert sources == {0, 1}
    pytest.importorskip("datasets", reason="the hf extra is not installed")
    want = hf_dataset(local, cache_dir=str(tmp_path / "hf-local"))
    got = hf_dataset(url, cache_dir=str(tmp_path / "hf-bucket"))
    assert len(got) == len(want) and got[0] == want[0] and got[len(got) - 1] == want[len(want) - 1]


def test_resume_and_elastic_resume_from_a_bucket(datasets, tmp_path):
    """A loader state taken mid-epoch from the bucket resumes there (other worker counts, and
    other ranks) onto exactly the rows an uninterrupted local run delivers."""
    import itertools

    local, url = datasets
    settings = {"tokens_per_batch": 4096, "seed": 5, "cache_dir": str(tmp_path / "c")}

    def keys(dl, n=None):
        return [tuple(b["input_ids"].tolist()) for b in itertools.islice(dl, n)]

    want = keys(PackedDataLoader(PackedDataset(local, **settings), num_workers=0))
    dl = PackedDataLoader(PackedDataset(url, **settings), num_workers=2)
    first = keys(dl, 7)
    state = dl.state_dict()
    resumed = PackedDataLoader(PackedDataset(url, **settings), num_workers=1)
    resumed.load_state_dict(state)
    assert first + keys(resumed) == want
    # Elastic: the same global batches cut over 2 ranks (rows_per_batch 4 -> 2 x 2).
    rows = {"rows_per_batch": 4, "seed": 5, "cache_dir": str(tmp_path / "c")}
    dl = PackedDataLoader(PackedDataset(url, **rows), num_workers=1)
    seen = [d for b in itertools.islice(dl, 3) for d in b["doc_ids"].tolist() if d >= 0]
    state = dl.state_dict()
    for rank in range(2):
        ds = PackedDataset(url, **{**rows, "rows_per_batch": 2}, rank=rank, world_size=2)
        dl2 = PackedDataLoader(ds, num_workers=2)
        dl2.load_state_dict(state)
        seen += [d for b in dl2 for d in b["doc_ids"].tolist() if d >= 0]
    every = [d for b in PackedDataset(local, **rows) for d in b["doc_ids"].tolist() if d >= 0]
    assert sorted(seen) == sorted(every)


def test_opening_a_bucket_dataset_reads_its_link_and_its_manifest_once(
    datasets, tmp_path, monkeypatch
):
    from packtool.dataset import manifest as m

    _, url = datasets
    PackedDataset(url, tokens_per_batch=4096, cache_dir=str(tmp_path / "cache"))  # footers cached
    reads: list[str] = []
    for name in ("read_text", "stat", "is_dir", "is_file", "exists"):
        real = getattr(m.storage, name)

        def counted(path, *a, _real=real, _name=name, **kw):
            reads.append(f"{_name} {str(path)[len(url) :]}")
            return _real(path, *a, **kw)

        monkeypatch.setattr(m.storage, name, counted)
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(tmp_path / "cache"))
    version = str(ds.store.path)[len(url) + 1 :]
    assert reads == ["read_text /index.json", f"read_text /{version}/index.json"]


def test_a_range_file_reads_its_cached_bytes_in_place_and_nothing_outside():
    from loader.store.bucket import RangeFile

    data = bytearray(b"0123456789")
    f = RangeFile(memoryview(data), 100, 1000)  # bytes 100..110 of a 1,000-byte file
    f.seek(102)
    view = f.read(3)
    assert bytes(view) == b"234" and f.tell() == 105
    data[3] = ord("x")  # a view of the cached bytes, not a copy
    assert bytes(view) == b"2x4"
    for where in (99, 108):
        f.seek(where)
        with pytest.raises(OSError, match="outside the cached range"):
            f.read(3)


def test_an_uncompressed_dataset_reads_the_same_from_the_bucket_under_eviction(datasets, tmp_path):
    # Uncompressed pages are where a decoder could point into the cached bytes it was given;
    # evicted ranges (a tiny cache) must not change a batch.
    local, url = tmp_path / "plain", "s3://train/plain"
    for out in (local, url):
        run_pack(
            RunConfig(
                inputs=(str(CORPUS),),
                out_dir=str(out),
                pack=PackConfig(max_len=1024),
                shards=ShardConfig(row_group_rows=32, compression="none"),
                progress=False,
            )  # fmt: skip
        )
    want = _epochs(local, None, epochs=1, workers=0)
    got = _epochs(url, tmp_path / "cache", epochs=1, cache_limit=256 << 10)
    assert len(got) == len(want) > 10 and got == want


@pytest.mark.parametrize("where", ["local", "bucket"])
def test_a_dataset_replaced_under_a_reading_job_is_one_error_saying_so(tmp_path, where, s3_server):
    # It was "no such object" (bucket) or "cannot open shard" (local): now it says the dataset
    # was replaced. The shards a job's processes opened, or the ranges it cached, stay readable;
    # the rest went with the old dataset (docs/pack.md).
    import boto3

    from packtool.errors import DataError

    boto3.client("s3").create_bucket(Bucket="swap")
    out = str(tmp_path / "ds") if where == "local" else "s3://swap/ds"

    def pack(max_len: int) -> None:
        run_pack(
            RunConfig(
                inputs=(str(CORPUS),),
                out_dir=out,
                pack=PackConfig(max_len=max_len),
                shards=ShardConfig(row_group_rows=32, shard_rows=256),
                progress=False,
                overwrite=True,
            )  # fmt: skip
        )

    pack(1024)
    ds = PackedDataset(out, tokens_per_batch=4096, cache_dir=str(tmp_path / "cache"))
    batches = iter(ds)
    next(batches)
    pack(512)  # --overwrite: the old version's objects (or files) are deleted
    # (locally the new shards have the old names: "changed", not "gone")
    with pytest.raises(DataError, match=r"(gone: the dataset .* was )?replaced \(--overwrite\)"):
        for _ in batches:
            pass


def test_a_cache_dir_that_is_a_file_is_refused_at_construction(datasets, tmp_path):
    """A file as cache_dir was accepted, then failed at the first read as a DataError blaming
    a shard's footer."""
    from packtool.errors import ConfigError

    _, url = datasets
    file = tmp_path / "not-a-folder"
    file.write_text("x")
    for cache_dir, says in ((file, ";"), (file / "under", f" ({file} is a file);")):
        with pytest.raises(
            ConfigError, match=re.escape(f"cache_dir {cache_dir} is not a folder{says}")
        ):
            PackedDataset(url, rows_per_batch=2, cache_dir=str(cache_dir))
    fresh = tmp_path / "new" / "cache"  # a missing folder is made
    assert len(list(PackedDataset(url, rows_per_batch=2, cache_dir=str(fresh)))) > 0


def test_damaged_cached_footers_and_row_groups_are_downloaded_again(datasets, tmp_path):
    """A flipped bit in a cached footer could abort every reader of the node inside pyarrow's
    C++ (exit 134, no exception), and a cut row-group copy failed every read as 'the shard is
    damaged' until the cache was emptied by hand: each copy is now checked (CRC32) first."""
    local, url = datasets
    cache = tmp_path / "cache"
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    want = [b["input_ids"].tolist() for b in ds]
    assert want == [
        b["input_ids"].tolist() for b in PackedDataset(local, tokens_per_batch=4096, shuffle=False)
    ]
    sizes = {s.sha256: s.bytes for s in ds.store.manifest.shards}
    footers = rows = 0
    for f in cache.rglob("*-*-*"):
        key, _, end = f.name.rsplit("-", 2)
        data = bytearray(f.read_bytes())
        if int(end) == sizes[key]:  # a footer's range: flip a bit in the middle
            data[len(data) // 2] ^= 0x04
            footers += 1
        else:  # a row group's: cut it short
            data = data[: len(data) // 3]
            rows += 1
        f.write_bytes(bytes(data))
    assert footers == len(sizes) and rows > 10
    again = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), shuffle=False)
    assert [b["input_ids"].tolist() for b in again] == want
    assert again.store.downloaded_bytes > 0  # the damaged copies, downloaded again


def test_a_web_server_that_ignores_ranges_serves_the_loader_too(datasets, tmp_path):
    """Python's http.server answers every ranged GET with the whole file: the loader's range
    read said "bytes 6965-72501 came back 72501 long; read it again" (the stores audit). Each
    range is cut out of such an answer, as the readers of inputs do, with one note."""
    import functools
    import http.server

    local, _ = datasets
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(local.parent))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/{local.name}"
        ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(tmp_path / "c"), seed=3)
        want = PackedDataset(local, tokens_per_batch=4096, seed=3)
        got = [b["input_ids"].tolist() for b in ds]
        assert got == [b["input_ids"].tolist() for b in want] and got
    finally:
        server.shutdown()
        server.server_close()


def test_row_groups_asked_for_together_come_in_one_get_each_run(datasets, tmp_path, monkeypatch):
    """The stored order asks for row groups side by side: they came one GET each (~90 GETs of
    ~30 KB here, a round trip and a billed request each on a real store); now one GET a run of
    adjacent ones (at most 16 MB), each still cached and checked on its own."""
    from tests.loader.store.test_range_cache import _gets

    local, url = datasets
    asked = _gets(monkeypatch)
    want = [
        b["input_ids"].tolist() for b in PackedDataset(local, tokens_per_batch=4096, shuffle=False)
    ]
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(tmp_path / "c"), shuffle=False)
    footers = len(asked)
    assert [b["input_ids"].tolist() for b in ds] == want
    groups = ds.store.num_row_groups
    gets = len(asked) - footers
    assert groups > 40 and gets <= groups // 4, (gets, groups)
    cached = [p for p in (tmp_path / "c").rglob("*") if p.is_file()]
    assert len(cached) == groups + footers  # a file per row group (and per footer)


def test_runs_are_adjacent_row_groups_of_one_shard_in_the_order_asked():
    """`BucketRowGroups._runs` on random layouts against what a run must be: every row group
    once, each run one shard's adjacent groups within MERGED_BYTES (or one group), no two runs
    that could have been one, runs in the order their first group was asked for."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from loader.store.bucket import BucketRowGroups
    from packtool.storage.cache import MERGED_BYTES

    @settings(max_examples=200, deadline=None)
    @given(
        sizes=st.lists(st.lists(st.integers(1, 9 << 20), min_size=1, max_size=8), min_size=1,
                       max_size=4),
        data=st.data(),
    )  # fmt: skip
    def check(sizes, data):
        spans, shards = [], []
        for shard, groups in enumerate(sizes):
            at = 4
            for n in groups:
                gap = data.draw(st.sampled_from([0, 0, 0, 7]))  # now and then not adjacent
                spans.append((at + gap, at + gap + n))
                shards.append(shard)
                at += gap + n
        rows = object.__new__(BucketRowGroups)
        rows.spans = np.asarray(spans, dtype=np.int64)
        shard_of = np.asarray(shards, dtype=np.int64)
        asked = data.draw(st.permutations(range(len(spans))))
        asked = asked[: data.draw(st.integers(1, len(asked)))]
        runs = rows._runs(list(asked), shard_of)
        assert sorted(g for run in runs for g in run) == sorted(asked)
        for run in runs:
            assert len({shards[g] for g in run}) == 1
            assert all(spans[a][1] == spans[b][0] for a, b in zip(run, run[1:], strict=False))
            assert len(run) == 1 or spans[run[-1]][1] - spans[run[0]][0] <= MERGED_BYTES
        ends = {(shards[run[-1]], spans[run[-1]][1]): run for run in runs}
        for run in runs:  # maximal: a run that starts where another ends would pass the cap
            before = ends.get((shards[run[0]], spans[run[0]][0]))
            if before is not None and before is not run:
                assert spans[run[-1]][1] - spans[before[0]][0] > MERGED_BYTES
        firsts = [min(asked.index(g) for g in run) for run in runs]
        assert firsts == sorted(firsts)

    check()


def test_a_static_shape_open_downloads_the_counts_not_the_dataset(datasets, tmp_path):
    """`static_shape` reads every row's document count at open (`RowIndex.top_n_docs`): each
    row group's count read pinned, and so downloaded, its whole range, the whole dataset
    before the first batch (1 TB for a 1 TB dataset; under `cache_limit`, evicted and
    downloaded again by the decode). Now the `doc_offsets` chunks alone, each a range of its
    own; the epoch after it is the local dataset's."""
    local, url = datasets
    kw = dict(static_shape=True, rows_per_batch=4, shuffle=False)
    ds = PackedDataset(url, cache_dir=str(tmp_path / "c"), **kw)
    total = sum(s.bytes for s in ds.store.manifest.shards)
    opened = ds.store.downloaded_bytes  # the footers, and the counts' chunks
    assert 0 < opened < total * 0.05, (opened, total)
    got = [{k: v.tolist() for k, v in b.items() if hasattr(v, "tolist")} for b in ds]
    want = [
        {k: v.tolist() for k, v in b.items() if hasattr(v, "tolist")}
        for b in PackedDataset(local, **kw)
    ]
    assert len(got) == len(want) > 10 and got == want
    assert ds.store.downloaded_bytes < opened + total  # the row groups, downloaded once
    store = PackedDataset(url, rows_per_batch=4, cache_dir=str(tmp_path / "d")).store
    lengths, _, _ = store.row_index()  # `row_index` too: the chunks
    assert len(lengths) == store.num_rows and store.downloaded_bytes < total * 0.05


def test_an_epoch_by_tokens_reads_the_counts_from_the_ranges_it_fetches(
    datasets, tmp_path, monkeypatch
):
    """The token budget reads the counts of a window's row groups right after `fetch_ahead`
    started their whole ranges (the decode's downloads): the counts wait for those and use
    them, no chunk of their own is downloaded (no GET, no byte more than the ranges)."""
    from tests.loader.store.test_range_cache import _gets

    _, url = datasets
    asked = _gets(monkeypatch)
    cache = tmp_path / "c"
    ds = PackedDataset(url, tokens_per_batch=4096, cache_dir=str(cache), seed=3)
    footers = len(asked)
    assert len(list(ds)) > 10
    spans = [(int(a), int(b)) for a, b in ds.store.bucket.spans]
    starts, ends = {a for a, _ in spans}, {b for _, b in spans}
    gets = asked[footers:]
    assert all(a in starts and b in ends for a, b in gets)  # whole ranges (or runs of them)
    assert sum(b - a for a, b in gets) == sum(b - a for a, b in spans)  # each once
    assert ds.store.downloaded_bytes == sum(b - a for a, b in asked)


@pytest.mark.parametrize("damage", ["bit", "passes_crc32"])
def test_a_damaged_cached_counts_chunk_is_downloaded_again(datasets, tmp_path, damage):
    """A row group's counts chunk cached damaged, as a whole range can be: a flipped bit (its
    CRC32 fails: `pinned` downloads it again) or bytes that pass the CRC32 but not the page's
    own (the read fails: the range read, the chunk, is deleted and downloaded again, not the
    whole range, which was never downloaded)."""
    from loader.store.bucket import byte_range
    from packtool.storage.cache_format import trailer

    _, url = datasets
    ds = PackedDataset(url, static_shape=True, rows_per_batch=4, cache_dir=str(tmp_path / "c"))
    store, bucket = ds.store, ds.store.bucket
    g = store.num_row_groups // 2
    shard, local = int(store._rg_shard[g]), int(store._rg_local[g])
    _, key, start, end = bucket._where(shard, g)
    a, b = byte_range(bucket.metas[shard], local, ["doc_offsets"])
    path = bucket.cache.path(key, a, b)
    assert path.is_file() and not bucket.cache.cached(key, start, end)
    good = path.read_bytes()
    want = store.row_stats(g)
    body = bytearray(good[: b - a])
    body[-1] ^= 0x01  # the last page's data
    path.write_bytes(bytes(body) + (good[b - a :] if damage == "bit" else trailer(body)))
    before = bucket.cache.downloaded
    got = store.row_stats(g)
    for name in ("lengths", "n_docs", "sq"):
        assert getattr(got, name).tolist() == getattr(want, name).tolist()
    assert bucket.cache.downloaded - before == b - a  # the chunk again, alone
    assert path.read_bytes() == good and not bucket.cache.cached(key, start, end)
