"""loader/store/shards.py: manifest checks and damaged shards give clear errors, never garbage."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loader import PackedDataset, ShardStore
from loader.record import Documents
from loader.testing import write_dataset, write_random_dataset
from packtool.dataset.manifest import packed_schema, read_manifest, sha256_file, write_manifest
from packtool.errors import DataError


def _rewrite_shard(path, table):
    """Replace shard 0 with `table` and update the manifest so only the content is wrong.

    The manifest stays consistent on its own (read_manifest checks it as a whole): the shard's
    tokens are recorded within rows..rows x max_len even when the rows break that bound.
    """
    m = read_manifest(path)
    file = path / m.shards[0].file
    pq.write_table(table, file)
    import dataclasses

    tokens = sum(len(r) for r in table.column("input_ids").to_pylist())
    tokens = min(max(tokens, table.num_rows), table.num_rows * m.max_len)
    s0 = dataclasses.replace(
        m.shards[0],
        bytes=file.stat().st_size,
        sha256=sha256_file(file),
        rows=table.num_rows,
        tokens=tokens,
    )
    shards = (s0, *m.shards[1:])
    if (s0.rows, s0.tokens) == (m.shards[0].rows, m.shards[0].tokens):
        write_manifest(path, dataclasses.replace(m, shards=shards))
        return
    rows, tokens = sum(s.rows for s in shards), sum(s.tokens for s in shards)
    counts = {"rows": rows, "tokens_out": tokens, "tokens_in": tokens}
    fixed = dataclasses.replace(
        m,
        shards=shards,
        counts=counts,
        efficiency=tokens / (rows * m.max_len),
        lower_bound_rows=-(-tokens // m.max_len),
        extra={},
    )
    write_manifest(path, fixed)


def test_reads_rows_exactly(hand_dataset):
    store = ShardStore(hand_dataset)
    assert store.num_rows == 3 and store.num_row_groups == 2
    got = store.gather(np.array([2, 0]))
    tokens, lens, ids = got.tokens, got.doc_lens, got.doc_ids
    assert got.columns == {}  # no optional column in this dataset
    assert tokens.tolist() == [10, 11, 12, 1, 2, 3, 4, 5]
    assert lens.tolist() == [1, 1, 1, 3, 2]
    assert ids.tolist() == [3, 4, 5, 0, 1]
    lengths, n_docs, sq = store.row_index()
    assert lengths.tolist() == [5, 4, 3]
    assert n_docs.tolist() == [2, 1, 3]
    assert sq.tolist() == [13.0, 16.0, 3.0]


def test_index_json_path_opens_its_dataset(hand_dataset):
    by_file = ShardStore(hand_dataset / "index.json")
    assert by_file.path == hand_dataset
    assert by_file.gather(np.array([2, 0])).tokens.tolist() == [10, 11, 12, 1, 2, 3, 4, 5]
    assert len(list(PackedDataset(hand_dataset / "index.json", rows_per_batch=1))) == 3


def test_cache_is_bounded(tmp_path):
    rows = [[[i] * 5] for i in range(40)]
    write_dataset(tmp_path, rows, max_len=5, row_group_rows=4)
    store = ShardStore(tmp_path, cache_bytes=1)  # keeps one row group
    store.gather(np.arange(40))
    assert len(store._cache) == 1
    assert store.decoded_row_groups == 10
    store = ShardStore(tmp_path, cache_bytes=1 << 20)
    store.gather(np.arange(40))
    store.gather(np.arange(40)[::-1])
    assert store.decoded_row_groups == 10
    store = ShardStore(tmp_path, cache_bytes=1, min_row_groups=3)  # keeps three whatever bytes
    store.gather(np.arange(40))
    assert list(store._cache) == [7, 8, 9]
    store.gather(np.arange(28, 40)[::-1])
    assert store.decoded_row_groups == 10


def test_missing_shard(hand_dataset):
    (hand_dataset / "shard-00000.parquet").unlink()
    with pytest.raises(
        DataError, match="shard-00000.parquet: shard listed in index.json is missing"
    ):
        PackedDataset(hand_dataset, rows_per_batch=1)


def test_truncated_shard(hand_dataset):
    file = hand_dataset / "shard-00000.parquet"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="truncated"):
        PackedDataset(hand_dataset, rows_per_batch=1)


@pytest.mark.parametrize("same_size", [False, True])
def test_a_shard_replaced_after_the_dataset_opened_is_an_error(tmp_path, same_size):
    # Shards are opened lazily (per process): one copied over after the open, its row counts
    # matching, had its rows delivered in place of the ones it replaced, without a word.
    path = tmp_path / "d"
    write_random_dataset(path, n_rows=64, max_len=32, rows_per_shard=32, row_group_rows=8)
    ds = PackedDataset(path, rows_per_batch=4)
    files = sorted(path.glob("*.parquet"))
    data = files[0].read_bytes()
    if same_size:  # rewritten in place at its size: only the modification time tells
        os.utime(files[1], ns=(0, 0))
    else:
        files[1].write_bytes(data)
    with pytest.raises(DataError, match="the shard changed after the dataset was opened"):
        for _ in ds:
            pass


def test_truncated_shard_with_matching_manifest_is_not_parquet(hand_dataset):
    file = hand_dataset / "shard-00000.parquet"
    file.write_bytes(file.read_bytes()[:100])
    m = json.loads((hand_dataset / "index.json").read_text())
    m["shards"][0]["bytes"] = 100
    (hand_dataset / "index.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="not a readable Parquet file"):
        ShardStore(hand_dataset)


def test_a_declared_column_the_shards_hold_but_index_json_omits_is_refused(tmp_path):
    # index.json edited to drop loss_mask from `columns` (the shards still hold it): the loader
    # read only the listed columns and trained on every token, prompts included, without a
    # word (the auditor's r4: 700 labels -100 instead of 140,436); `packtool verify` refused it.
    path = tmp_path / "d"
    rows = [[[5, 6, 7, 8], [9, 10]], [[11, 12, 13]]]
    masks = [[[0, 0, 1, 1], [1, 1]], [[0, 1, 1]]]
    write_dataset(path, rows, max_len=8, loss_masks=masks)
    assert PackedDataset(path, rows_per_batch=2).store.optional  # the mask is read
    m = json.loads((path / "index.json").read_text())
    m["columns"].remove("loss_mask")
    (path / "index.json").write_text(json.dumps(m))
    with pytest.raises(DataError) as info:
        PackedDataset(path, rows_per_batch=2)
    message = str(info.value)
    assert "shard-00000.parquet" in message and "'loss_mask'" in message
    assert "index.json columns" in message and "\n" not in message


def test_wrong_format_version(hand_dataset):
    m = json.loads((hand_dataset / "index.json").read_text())
    m["format_version"] = 99
    (hand_dataset / "index.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="format_version 99 is not supported"):
        PackedDataset(hand_dataset, rows_per_batch=1)


def test_a_version_2_dataset_is_read_and_its_ids_are_not_taken_for_sources(tmp_path):
    """Format 3 changed what doc ids mean, not how rows are read: the loader reads format 2 as
    before, and asking a format 2 dataset where a document came from is one line saying why
    it cannot tell."""
    from packtool.read import docids

    write_dataset(tmp_path / "v2", [[[1, 2, 3], [4, 5]], [[6, 7]]], max_len=6, format_version=2)
    assert json.loads((tmp_path / "v2" / "index.json").read_text())["format_version"] == 2
    ds = PackedDataset(tmp_path / "v2", rows_per_batch=1)
    assert sum(1 for _ in ds) == 2
    m = read_manifest(tmp_path / "v2")
    with pytest.raises(DataError, match="they number documents in reading order") as e:
        docids.source(m.extra, 0)
    assert "\n" not in str(e.value)


def test_missing_manifest(tmp_path):
    with pytest.raises(DataError, match="index.json: missing"):
        PackedDataset(tmp_path, rows_per_batch=1)


def test_verify_catches_same_size_corruption(hand_dataset):
    file = hand_dataset / "shard-00000.parquet"
    data = bytearray(file.read_bytes())
    data[10] ^= 0xFF
    file.write_bytes(bytes(data))
    ShardStore(hand_dataset)  # sizes match: only hashing notices
    with pytest.raises(DataError, match="sha256 does not match"):
        ShardStore(hand_dataset, verify=True)


def _table(offsets, tokens, ids, max_len=None):
    return pa.table(
        {
            "input_ids": tokens,
            "doc_offsets": offsets,
            "doc_ids": ids,
            "doc_chunks": [[0] * len(i) for i in ids],
        },
        schema=packed_schema(pa.uint16()),
    )


@pytest.mark.parametrize(
    ("offsets", "tokens", "ids", "message"),
    [
        (
            [[0, 3, 5], [0, 2, 3]],
            [[1] * 5, [1] * 4],
            [[0, 1], [2, 3]],
            "row 1: doc_offsets does not end at the row length",
        ),
        (
            [[0, 3, 5], [1, 4]],
            [[1] * 5, [1] * 4],
            [[0, 1], [2]],
            "row 1: doc_offsets does not start at 0",
        ),
        ([[0, 3, 2, 5]], [[1] * 5], [[0, 1, 2]], "row 0: doc_offsets is not strictly increasing"),
        (
            [[0, 5], [0, 2, 4]],
            [[1] * 5, [1] * 4],
            [[0, 1], [2, 3]],
            "row 0: doc_ids and doc_offsets disagree",
        ),
        ([[0, 7]], [[1] * 7], [[0]], "row 0: row longer than max_len 6"),
        ([[0]], [[]], [[]], "row 0: empty row"),
    ],
)
def test_corrupted_offsets_name_file_and_row(hand_dataset, offsets, tokens, ids, message):
    _rewrite_shard(hand_dataset, _table(offsets, tokens, ids))
    ds = PackedDataset(hand_dataset, rows_per_batch=4, shuffle=False)
    with pytest.raises(DataError, match="shard-00000.parquet: " + message):
        list(ds)


def test_corrupted_offsets_caught_by_row_index(hand_dataset):
    _rewrite_shard(hand_dataset, _table([[0, 3, 9]], [[1] * 5], [[0, 1]]))
    match = "shard-00000.parquet: row 0: doc_offsets out of range"
    # Row counts are read per row group when the order first needs them (was: at open, for
    # every row): the first batch of a token budget reads them.
    ds = PackedDataset(hand_dataset, tokens_per_batch=8)
    with pytest.raises(DataError, match=match):
        next(iter(ds))
    with pytest.raises(DataError, match=match):
        ShardStore(hand_dataset).row_stats(0)
    with pytest.raises(DataError, match=match):
        ShardStore(hand_dataset).row_index()


def test_manifest_row_count_mismatch(hand_dataset):
    m = json.loads((hand_dataset / "index.json").read_text())
    m["shards"][0]["rows"] = 7
    # Consistent on its own (read_manifest checks that first): only the file disagrees.
    m["counts"]["rows"] = 7
    m["efficiency"] = m["counts"]["tokens_out"] / (7 * m["max_len"])
    (hand_dataset / "index.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="3 rows but index.json says 7"):
        ShardStore(hand_dataset)


def test_prefetch_decodes_each_row_group_once_with_the_same_rows(random_dataset):
    plain = ShardStore(random_dataset)
    store = ShardStore(random_dataset)
    groups = np.arange(store.num_row_groups)[::-1]
    store.prefetch(groups)
    store.prefetch(groups)  # already pending: not decoded twice
    assert store.pending_row_groups == store.num_row_groups
    rows = np.random.default_rng(0).permutation(store.num_rows)
    a, b = store.gather(rows), plain.gather(rows)
    for got, want in ((a.tokens, b.tokens), (a.doc_lens, b.doc_lens), (a.doc_ids, b.doc_ids)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert store.pending_row_groups == 0
    assert store.decoded_row_groups == store.num_row_groups
    store.prefetch(groups)  # all cached: nothing to do
    assert store.pending_row_groups == 0


def test_stores_sharing_a_decode_thread_read_the_same_rows(random_dataset, hand_dataset):
    import pickle

    from loader.store.shards import DecodeThread

    shared = DecodeThread()
    stores = [ShardStore(random_dataset), ShardStore(hand_dataset), ShardStore(random_dataset)]
    for s in stores:
        s.share_decode_thread(shared)
    for s in stores:
        s.prefetch(np.arange(s.num_row_groups)[::-1])
    assert len({id(s._decoder) for s in stores}) == 1  # one thread decodes for all three
    for s, path in zip(stores, (random_dataset, hand_dataset, random_dataset), strict=True):
        rows = np.random.default_rng(1).permutation(s.num_rows)
        a, b = s.gather(rows), ShardStore(path).gather(rows)
        for got, want in ((a.tokens, b.tokens), (a.doc_lens, b.doc_lens), (a.doc_ids, b.doc_ids)):
            assert got.dtype == want.dtype and np.array_equal(got, want)
        assert s.pending_row_groups == 0 and s.decoded_row_groups == s.num_row_groups
    with pytest.raises(RuntimeError, match="before the store decodes ahead"):
        stores[0].share_decode_thread(DecodeThread())
    # a pickled pair (a spawned worker) shares one thread of its own, made when first used
    a, b = pickle.loads(pickle.dumps(stores[:2]))
    assert a._thread is b._thread and a._thread is not shared and a._thread._pool is None
    a.prefetch(np.array([0]))
    b.prefetch(np.array([0]))
    assert a._decoder is b._decoder is not shared._pool
    assert np.array_equal(a.gather(np.array([0])).tokens, stores[0].gather(np.array([0])).tokens)


def test_ring_reuses_its_slot_views_and_does_not_pickle_them():
    from loader.packed.transport import Ring

    ring = Ring(num_workers=1, slots=2, max_tokens=64, max_docs=8, token_dtype=np.uint16)
    ring.start_worker()
    docs = [
        Documents(np.arange(n, dtype=np.uint16) + n, np.array([n], np.int32), np.array([n]))
        for n in (5, 9, 3)
    ]

    class _Store:  # gathers a fixed record (what `Ring.put` needs of a store)
        def __init__(self, d):
            self.d = d

        def gather_into(self, rows, dest):
            n, k = self.d.n_tokens, self.d.n_docs
            dest.tokens[:n], dest.doc_lens[:k], dest.doc_ids[:k] = (
                self.d.tokens,
                self.d.doc_lens,
                self.d.doc_ids,
            )
            return n, k

    for step, d in enumerate(docs):  # the third batch reuses slot 0 and its cached views
        item = ring.put(_Store(d), None, filler=False, step=step)
        got = ring.take(item)
        assert np.array_equal(got.tokens, d.tokens) and np.array_equal(got.doc_ids, d.doc_ids)
        assert np.array_equal(got.doc_lens, d.doc_lens)
        ring.release(item)
    assert set(ring._views) == {0, 1}
    assert ring.__getstate__()["_views"] == {}


def test_prefetch_error_surfaces_where_the_row_group_is_used(hand_dataset):
    _rewrite_shard(hand_dataset, _table([[0, 3, 2, 5]], [[1] * 5], [[0, 1, 2]]))
    store = ShardStore(hand_dataset)
    store.prefetch(np.array([0]))  # decodes (and fails) in the background: no error yet
    with pytest.raises(DataError, match="row 0: doc_offsets is not strictly increasing"):
        store.row_group(0)
    store.cancel_prefetch()
    assert store.pending_row_groups == 0


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_workers_forked_mid_prefetch_read_the_same_stream(random_dataset):
    from loader import PackedDataLoader

    kw = {"tokens_per_batch": 150, "seed": 5, "shuffle_window": 2}
    ds = PackedDataset(random_dataset, **kw)
    expected = [b["input_ids"] for b in PackedDataset(random_dataset, **kw)]
    it = iter(ds)
    next(it)  # the trainer now has a decode thread and pending row groups, then forks workers
    assert ds.store.pending_row_groups > 0
    got = [b["input_ids"] for b in PackedDataLoader(ds, num_workers=2)]
    assert len(got) == len(expected)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_row_index_while_decoding_ahead_matches(random_dataset):
    ds = PackedDataset(random_dataset, rows_per_batch=2, seed=1)
    before = ShardStore(random_dataset).row_index()
    it = iter(ds)
    next(it)  # the decode thread now owns the files
    for got, want in zip(ds.store.row_index(), before, strict=True):
        assert np.array_equal(got, want)
    assert sum(int(b["cu_seqlens"][-1]) for b in it) > 0


@pytest.mark.parametrize("spelled", ["shard-00000.parquet", "./shard-00000.parquet"])
def test_shard_listed_twice_is_refused(hand_dataset, spelled):
    # Before: every row of that shard was delivered twice per epoch (under another spelling,
    # `./shard-00000.parquet`, it still was).
    m = read_manifest(hand_dataset)
    import dataclasses

    again = dataclasses.replace(m.shards[0], file=spelled)
    write_manifest(hand_dataset, dataclasses.replace(m, shards=(m.shards[0], again)))
    with pytest.raises(DataError, match=f"shard file '{spelled}' is listed more than once"):
        PackedDataset(hand_dataset, rows_per_batch=1)


def test_two_shard_names_alike_once_decoded_are_two_files(hand_dataset):
    # The listed-once check keyed on the URL-decoded name: `shard%2000.parquet` beside
    # `shard 00.parquet` (two files on a disk) was "listed more than once" (a reviewer's find).
    from packtool.dataset.manifest import _shard_files_problem

    m = read_manifest(hand_dataset)
    import dataclasses

    pair = (
        dataclasses.replace(m.shards[0], file="shard%2000.parquet"),
        dataclasses.replace(m.shards[0], file="shard 00.parquet"),
    )
    assert _shard_files_problem(dataclasses.replace(m, shards=pair)) is None
    again = (pair[0], dataclasses.replace(m.shards[0], file="./shard%2000.parquet"))
    assert "listed more than once" in _shard_files_problem(dataclasses.replace(m, shards=again))


def test_shard_outside_the_folder_is_refused(hand_dataset, tmp_path):
    # The loader must never open a file the manifest points to outside the dataset folder.
    m = read_manifest(hand_dataset)
    import dataclasses

    outside = dataclasses.replace(m.shards[0], file="../elsewhere.parquet")
    write_manifest(hand_dataset, dataclasses.replace(m, shards=(outside, *m.shards[1:])))
    with pytest.raises(DataError, match="'../elsewhere.parquet' must be a path inside the dataset"):
        PackedDataset(hand_dataset, rows_per_batch=1)


# --- damage caught on read by default (issue #11 defect 5) ------------------------------------


FIRST_PACKED = "shard-000000-00000.parquet"
"""The first shard `packtool pack` writes (partition 0, shard 0)."""


def _packed(tmp_path, codec: str, name: str = "p", rows_per_group: int = 8):
    """A small dataset as `packtool pack` writes it (page CRC32s included), vocab 258."""
    import json as _json

    from packtool.dataset.shards import ShardConfig
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        "".join(_json.dumps({"text": f"text {i} " * (i % 9 + 1)}) + "\n" for i in range(60))
    )
    out = tmp_path / name
    run_pack(
        RunConfig(
            inputs=(str(corpus),),
            out_dir=str(out),
            pack=PackConfig(max_len=64),
            shards=ShardConfig(compression=codec, row_group_rows=rows_per_group),
            progress=False,
        )
    )
    return out


def _all_rows(path, **kw):
    store = ShardStore(path, cache_bytes=0, **kw)
    store.row_index()
    docs = store.gather(np.arange(store.num_rows))
    return [a.copy() for a in (docs.tokens, docs.doc_lens, docs.doc_ids)]


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_a_flipped_byte_in_token_data_is_an_error_by_default(tmp_path, codec):
    d = _packed(tmp_path, codec)
    shard = d / FIRST_PACKED
    column = pq.ParquetFile(shard).metadata.row_group(0).column(0)  # input_ids
    assert column.path_in_schema == "input_ids.list.element"
    data = bytearray(shard.read_bytes())
    want = _all_rows(d)
    # The middle of the first token page (past its header); the size, so the manifest, is intact.
    data[column.data_page_offset + column.total_compressed_size // 2] ^= 0x04
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match=FIRST_PACKED + r": row group 0 unreadable .*CRC"):
        list(PackedDataset(d, rows_per_batch=4, shuffle=False))
    if codec == "none":  # the CRC is what catches it: unchecked, other tokens come back,
        # or, when the flipped bit happens to make an id past the vocabulary, the id check fails
        try:
            got = _all_rows(d, page_checksums=False)
        except DataError as exc:
            assert "is not below the tokenizer's vocab_size" in str(exc)
        else:
            assert not all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))


def test_every_damaged_byte_is_an_error_or_harmless(tmp_path):
    """Flip bytes all over a shard (data pages, page headers, the footer): the loader, with its
    defaults, either raises DataError or delivers exactly the original rows."""
    d = _packed(tmp_path, "lz4", rows_per_group=4)
    shard = d / FIRST_PACKED
    original = shard.read_bytes()
    want = _all_rows(d)
    footer_start = len(original) - 8 - int.from_bytes(original[-8:-4], "little")
    rng = np.random.default_rng(0)
    positions = sorted(
        set(rng.choice(footer_start, 250, replace=False).tolist())
        | set(range(footer_start, len(original), 9))
    )
    outcomes = {"error": 0, "same": 0}
    for pos in positions:
        data = bytearray(original)
        data[pos] ^= 0x10
        shard.write_bytes(bytes(data))
        try:
            got = _all_rows(d)
        except DataError:
            outcomes["error"] += 1
            continue
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True)), pos
        outcomes["same"] += 1
    assert outcomes["error"] > 200  # and the harmless ones are footer text (created_by, ...)


def test_a_token_id_beyond_the_vocabulary_is_an_error(tmp_path):
    d = _packed(tmp_path, "lz4")
    table = pq.read_table(d / FIRST_PACKED)
    rows = table.column("input_ids").to_pylist()
    row = next(i for i, r in enumerate(rows) if 101 in r)  # a stored 101 ('e') becomes 357
    rows[row][rows[row].index(101)] = 357
    table = table.set_column(0, "input_ids", pa.array(rows, pa.list_(pa.uint16())))
    _rewrite_shard(d, table)
    with pytest.raises(DataError, match=rf"row {row}: token id 357 is not below .* vocab_size 258"):
        list(PackedDataset(d, rows_per_batch=4, shuffle=False))


def test_a_negative_token_id_of_signed_ids_is_an_error(tmp_path):
    # Shards another tool wrote with signed ids (list<int32>): the check was `>= vocab_size`
    # only, so an id of -1 reached input_ids without a word.
    d = _packed(tmp_path, "lz4")
    table = pq.read_table(d / FIRST_PACKED)
    rows = table.column("input_ids").to_pylist()
    rows[3][1] = -1
    table = table.set_column(0, "input_ids", pa.array(rows, pa.list_(pa.int32())))
    _rewrite_shard(d, table)
    with pytest.raises(DataError, match=r"row 3: token id -1 is negative"):
        list(PackedDataset(d, rows_per_batch=4, shuffle=False))


def test_a_footer_whose_row_groups_disagree_with_its_rows_is_an_error(tmp_path):
    d = _packed(tmp_path, "lz4")
    shard = d / FIRST_PACKED
    meta = pq.read_metadata(shard)
    assert meta.num_row_groups > 1
    # pyarrow cannot write such a footer: damage one, bit by bit, until a row group's count is
    # off while the file's total still matches index.json (it used to shift rows, or IndexError).
    original = shard.read_bytes()
    footer_start = len(original) - 8 - int.from_bytes(original[-8:-4], "little")
    caught = 0
    for pos in range(footer_start, len(original) - 8):
        data = bytearray(original)
        data[pos] ^= 0x02
        shard.write_bytes(bytes(data))
        try:
            m = pq.read_metadata(shard)
        except Exception:
            continue
        groups = [m.row_group(g).num_rows for g in range(m.num_row_groups)]
        if m.num_rows == meta.num_rows and sum(groups) != m.num_rows:
            with pytest.raises(DataError, match="its row groups hold .* the footer is damaged"):
                ShardStore(d)
            caught += 1
    assert caught  # the footer has such fields: each is refused


def _damage_page_header(shard) -> None:
    """The first page header of row group 0's input_ids, overwritten: pyarrow's error for it is
    several lines ("Couldn't deserialize thrift: ...\\nDeserializing page header failed.\\n")."""
    column = pq.ParquetFile(shard).metadata.row_group(0).column(0)
    assert column.path_in_schema == "input_ids.list.element"
    data = bytearray(shard.read_bytes())
    for i in range(6):
        data[column.data_page_offset + i] ^= 0xFF
    shard.write_bytes(bytes(data))


def test_an_unreadable_row_group_is_a_one_line_error(tmp_path):
    # Seen: "...: row group 0 unreadable (Couldn't deserialize thrift: ...\nDeserializing page
    # header failed.\n); the shard is damaged", pyarrow's message appended whole.
    d = _packed(tmp_path, "zstd")
    _damage_page_header(d / FIRST_PACKED)
    with pytest.raises(DataError) as info:
        list(PackedDataset(d, rows_per_batch=4, shuffle=False))
    said = str(info.value)
    assert FIRST_PACKED + ": row group 0 unreadable (" in said and "the shard is damaged" in said
    assert "Deserializing page header failed" in said
    assert "\n" not in said
