"""StreamingPackedDataset: exactly once over ranks × workers, exact resume, bad input."""

from __future__ import annotations

import copy
import io
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from torch.utils.data import DataLoader

from loader.online.packer import OnlinePacker
from loader.online.state import LATER_KEYS
from loader.online.streaming import StreamingPackedDataset
from packtool.dataset.tokenized import tokenized_schema
from packtool.errors import ConfigError, DataError
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.loader.conftest import damaged_states, negative_states

MAX_LEN = 32


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """Two tokenized Parquet files, row groups of 25 documents; token id = global position.

    Lengths 0..80: empty documents and documents longer than MAX_LEN included.
    """
    root = tmp_path_factory.mktemp("stream")
    rng = np.random.default_rng(5)
    schema = tokenized_schema(load_tokenizer("byte").identity)
    pos = 0
    doc = 0
    lengths_all = []
    for f in range(2):
        with pq.ParquetWriter(root / f"part-{f:05d}.parquet", schema) as w:
            for _ in range(4):
                lengths = rng.integers(0, 30, 25)
                lengths[rng.integers(0, 25, 2)] = rng.integers(33, 80, 2)
                lengths[rng.integers(0, 25)] = 0
                offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
                ids = np.arange(pos, pos + offsets[-1]) % 65536
                pos += int(offsets[-1])
                table = pa.Table.from_arrays(
                    [
                        pa.array(np.arange(doc, doc + 25), pa.int64()),
                        pa.array(["t"] * 25),
                        pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.uint16())),
                        pa.array(lengths.astype(np.int32)),
                    ],
                    schema=schema,
                )
                w.write_table(table)
                doc += 25
                lengths_all.append(lengths)
    assert pos < 65536
    return root, np.concatenate(lengths_all)


def make(path, **kw):
    settings = dict(max_len=MAX_LEN, buffer_docs=16, rows_per_batch=3)
    settings.update(kw)
    return StreamingPackedDataset(path, **settings)


def collect(batches) -> tuple[np.ndarray, dict[int, int]]:
    toks, per_doc = [], {}
    for b in batches:
        assert b["cu_seqlens"].dtype == torch.int32
        toks.append(b["input_ids"].numpy())
        lens = np.diff(b["cu_seqlens"].numpy())
        for d, n in zip(b["doc_ids"].tolist(), lens.tolist(), strict=True):
            per_doc[d] = per_doc.get(d, 0) + n
    return (np.concatenate(toks) if toks else np.zeros(0, np.int64)), per_doc


# Document sharding over every combination; row-group sharding on the hardest one only.
COMBINATIONS = [(w, k, "document") for w in (1, 2) for k in (0, 2)] + [(2, 2, "row_group")]


@pytest.mark.parametrize("world, workers, shard_by", COMBINATIONS)
def test_exactly_once_over_ranks_and_workers(tokenized, world, workers, shard_by) -> None:
    path, lengths = tokenized
    batches = []
    for rank in range(world):
        ds = make(path, rank=rank, world_size=world, shard_by=shard_by)
        batches += list(DataLoader(ds, batch_size=None, num_workers=workers))
    toks, per_doc = collect(batches)
    assert sorted(toks.tolist()) == list(range(int(lengths.sum())))  # every token exactly once
    assert per_doc == {d: int(n) for d, n in enumerate(lengths) if n}
    for b in batches:  # rows never over max_len: each row's documents fit in MAX_LEN
        assert int(b["max_seqlen"]) <= MAX_LEN


def _roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_resume_equals_uninterrupted_run(tokenized) -> None:
    path, _ = tokenized
    full = list(make(path, world_size=2, rank=1))
    assert len(full) > 6
    for cut in (0, 1, 4, len(full) - 1, len(full)):
        ds = make(path, world_size=2, rank=1)
        it = iter(ds)
        head = [next(it) for _ in range(cut)]
        state = _roundtrip(ds.state_dict())
        ds2 = make(path, world_size=2, rank=1)
        ds2.load_state_dict(state)
        tail = list(ds2)
        both = head + tail
        assert len(both) == len(full)
        for a, b in zip(both, full, strict=True):
            assert torch.equal(a["input_ids"], b["input_ids"])
            assert torch.equal(a["cu_seqlens"], b["cu_seqlens"])
            assert torch.equal(a["doc_ids"], b["doc_ids"])


def test_resume_with_stateful_dataloader_workers(tokenized) -> None:
    import torchdata.stateful_dataloader as tdn  # in the dev extra: never skipped

    path, _ = tokenized
    full = [
        b["input_ids"] for b in tdn.StatefulDataLoader(make(path), batch_size=None, num_workers=2)
    ]
    loader = tdn.StatefulDataLoader(make(path), batch_size=None, num_workers=2)
    it = iter(loader)
    head = [next(it)["input_ids"] for _ in range(5)]
    state = loader.state_dict()
    del it, loader
    loader2 = tdn.StatefulDataLoader(make(path), batch_size=None, num_workers=2)
    loader2.load_state_dict(state)
    tail = [b["input_ids"] for b in loader2]
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        assert torch.equal(a, b)


def test_bad_input_and_states(tokenized, tmp_path) -> None:
    path, _ = tokenized
    raw = tmp_path / "c.jsonl"
    raw.write_text('{"text": "hi"}\n')
    with pytest.raises(DataError, match="packtool tokenize"):
        make(raw)
    with pytest.raises(ConfigError, match="buffer_seconds"):
        make(path, buffer_seconds=1.0)
    with pytest.raises(ConfigError, match="shard_by"):
        make(path, shard_by="file")
    with pytest.raises(ConfigError, match="exactly one"):
        make(path, tokens_per_batch=64)
    ds = make(path)
    next(iter(ds))
    state = ds.state_dict()
    with pytest.raises(DataError, match="rows_per_batch"):
        make(path, rows_per_batch=4).load_state_dict(state)
    # packing settings too: these were "malformed ... the checkpoint is damaged"
    for other in ({"max_len": MAX_LEN * 2}, {"buffer_docs": 7}, {"seed": 5}):
        with pytest.raises(DataError, match="saved with other inputs or settings"):
            make(path, **other).load_state_dict(state)
    with pytest.raises(DataError, match="not a StreamingPackedDataset state"):
        make(path).load_state_dict({"version": 99})


def test_stats_count_skips(tokenized) -> None:
    path, lengths = tokenized
    ds = make(path, long_docs="truncate", tokens_per_batch=64, rows_per_batch=None)
    toks, _ = collect(ds)
    s = ds.stats
    assert s["documents_empty"] == int((lengths == 0).sum())
    assert s["tokens_truncated"] == int(np.maximum(lengths - MAX_LEN, 0).sum())
    assert s["tokens_out"] == len(toks) == s["tokens_in"] - s["tokens_truncated"]


def test_no_inputs_and_files_gone_after_open(tokenized, tmp_path) -> None:
    path, _ = tokenized
    # Before: an empty input list made a stream that silently yielded nothing.
    with pytest.raises(ConfigError, match="^no inputs: give at least one file"):
        make([])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty: folder has no corpus files"):
        make(tmp_path / "empty")
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in path.glob("*.parquet"):
        (copy / f.name).write_bytes(f.read_bytes())
    ds = make(copy)
    (copy / "part-00000.parquet").unlink()
    # Before: a bare FileNotFoundError / ArrowInvalid (the latter naming no file).
    with pytest.raises(DataError, match=r"part-00000.parquet: row group 0 unreadable"):
        list(ds)
    # Rewritten as valid Parquet with fewer rows, or other row groups: a raw ArrowIndexError,
    # or rows read under the wrong documents' places, before.
    import pyarrow.parquet as pq

    second = sorted(copy.glob("*.parquet"))[0]
    original = second.read_bytes()
    table = pq.read_table(second)
    assert pq.ParquetFile(second).metadata.row_group(0).num_rows > 1
    for kwargs in ({}, {"shard_by": "row_group"}):
        second.write_bytes(original)
        ds = make(copy, **kwargs)
        pq.write_table(table.slice(0, 1), second)  # fewer rows, other row groups
        with pytest.raises(DataError, match=rf"{second.name}: row group 0 holds 1 rows where"):
            list(ds)


def test_only_the_file_being_read_is_open(tmp_path) -> None:
    # Before: every file read stayed open till the epoch's end, one descriptor per input file
    # (per DataLoader worker): past `ulimit -n` files, "Too many open files" named as damage.
    import os

    schema = tokenized_schema(load_tokenizer("byte").identity)
    for f in range(60):
        ids = pa.ListArray.from_arrays(
            pa.array([0, 3], pa.int32()), pa.array([1, 2, 3], pa.uint16())
        )
        columns = [pa.array([f], pa.int64()), pa.array(["t"]), ids, pa.array([3], pa.int32())]
        pq.write_table(pa.Table.from_arrays(columns, schema=schema), tmp_path / f"p{f:03d}.parquet")
    ds = make(tmp_path, max_len=8, buffer_docs=4, rows_per_batch=1)
    before = len(os.listdir("/proc/self/fd"))
    most, docs = 0, []
    for batch in ds:
        most = max(most, len(os.listdir("/proc/self/fd")) - before)
        docs += batch["doc_ids"].tolist()
    assert sorted(docs) == list(range(60))
    assert most <= 2


@pytest.mark.parametrize("kwargs", [[1], "hf", 1])
def test_collate_kwargs_that_are_not_a_dict_are_a_config_error(tokenized, kwargs) -> None:
    # Before: dict()'s bare TypeError or ValueError.
    path, _ = tokenized
    with pytest.raises(
        ConfigError, match=f"^collate_kwargs must be a dict .*{type(kwargs).__name__}$"
    ):
        make(path, collate_kwargs=kwargs)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        # Before: -1 re-read every row group (documents twice), a huge one skipped them all.
        ({"next_group": -1}, "resumes at row group -1 but the inputs have 8"),
        ({"next_group": 99}, "resumes at row group 99 but the inputs have 8"),
        ({"packer": None}, "packer is missing; the checkpoint is damaged"),
        ({"epoch": "0"}, "epoch is '0', not an integer"),
        # Before: accepted, then a seed_key error at the first batch naming no checkpoint.
        ({"epoch": -1}, "epoch is -1, not >= 0"),
        # Before: loaded, then numpy's OverflowError at the first batch.
        ({"epoch": 2**70}, f"epoch is {2**70}, past int64"),
    ],
)
def test_damaged_state_is_a_clear_error(tokenized, edit, match) -> None:
    path, _ = tokenized
    ds = make(path)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    for k, v in edit.items():
        if v is None:
            del state[k]
        else:
            state[k] = v
    with pytest.raises(DataError, match=match):
        make(path).load_state_dict(state)


def test_set_epoch_drops_a_resume_point_of_another_epoch(tokenized) -> None:
    path, _ = tokenized
    ds = make(path)
    it = iter(ds)
    next(it)
    state = ds.state_dict()  # mid-epoch 0
    ds2 = make(path)
    ds2.load_state_dict(state)
    ds2.set_epoch(1)
    # Before: epoch 1 continued epoch 0's buffer and position (the rest of epoch 0, in
    # epoch 0's order, and nothing of epoch 1's first row groups).
    got = [b["input_ids"] for b in ds2]
    fresh = make(path)
    fresh.set_epoch(1)
    want = [b["input_ids"] for b in fresh]
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # A checkpoint taken after set_epoch(1) and before iterating describes epoch 1's start.
    ds3 = make(path)
    list(ds3)
    ds3.set_epoch(1)
    assert (ds3.state_dict()["epoch"], ds3.state_dict()["start"]) == (1, True)


def test_every_damaged_part_of_a_state_is_a_clear_error(tokenized) -> None:
    path, _ = tokenized
    ds = make(path)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    # The parts worth damaging are all there: a buffer with tokens, rows waiting to be batched
    # and batches waiting to be yielded.
    assert len(state["packer"]["buffer"]["length"]) and len(state["pending"]["seg_len"])
    assert state["ready"]
    target = make(path)
    cases = list(damaged_states(state, skip=("version", "key"), optional=LATER_KEYS))
    assert len(cases) > 200
    for name, damaged in cases:
        # Before: bare KeyError / TypeError / ValueError (some only at the next iteration), or
        # accepted (counts deleted, pending.row_docs replaced).
        with pytest.raises(DataError, match=re.escape(name) + r".* the checkpoint is damaged"):
            target.load_state_dict(damaged)
    # Before: rows over max_len (a ready batch's, or pending ones) loaded and were yielded.
    for part in ("ready[0]", "pending"):
        damaged = copy.deepcopy(state)
        rows = damaged["ready"][0] if part == "ready[0]" else damaged["pending"]
        for key in ("seg_len", "tokens", "doc_ids", "doc_chunks"):  # every segment twice
            rows[key] = np.concatenate([rows[key], rows[key]])
        rows["row_docs"] = np.array([0, len(rows["seg_len"])])  # all in one row
        assert rows["seg_len"].sum() > MAX_LEN
        with pytest.raises(DataError, match=re.escape(f"{part}.seg_len makes a row of")):
            target.load_state_dict(damaged)
    # The intact state still loads and continues.
    target.load_state_dict(state)
    assert len(list(target)) > 0


def test_a_negative_id_or_length_anywhere_in_a_state_is_damage(tokenized) -> None:
    """Before: a state whose rows held document id -5 or token id -5 loaded and delivered them
    in batches (`doc_ids` -5, `input_ids` -5, which reaches the embedding)."""
    path, _ = tokenized
    ds = make(path)
    it = iter(ds)
    next(it)
    state = ds.state_dict()
    cases = list(negative_states(state, skip=("version", "key")))
    names = {name for name, _ in cases}
    assert {"pending.doc_ids", "ready[0].tokens", "packer.buffer.doc"} <= names
    for name, damaged in cases:
        with pytest.raises(DataError, match=re.escape(name) + r".* the checkpoint is damaged"):
            make(path).load_state_dict(damaged)


@pytest.mark.parametrize(("rank", "world"), [(0.5, 2), ("0", 2), (0, 2.0), (True, 2)])
def test_rank_and_world_size_must_be_integers(tokenized, rank, world) -> None:
    # Before: only the range was checked, as PackedDataset did before it checked types too; a
    # string rank was a TypeError, a float one made float document indices.
    with pytest.raises(ConfigError, match=r"(rank|world_size) must be an integer, got"):
        make(tokenized[0], rank=rank, world_size=world)


def test_a_state_taken_right_after_a_resume_is_the_loaded_position(tokenized) -> None:
    """Before: `state_dict()` between `load_state_dict()` and the first batch described the
    epoch's start, so a checkpoint written then replayed it (100 + 290 batches where 290)."""
    path, _ = tokenized
    full = list(make(path))
    ds = make(path)
    it = iter(ds)
    head = [next(it) for _ in range(4)]
    ds2 = make(path)
    ds2.load_state_dict(_roundtrip(ds.state_dict()))
    again = _roundtrip(ds2.state_dict())  # a checkpoint written right after the resume
    assert again["start"] is False and again["next_group"] == ds.state_dict()["next_group"]
    ds3 = make(path)
    ds3.load_state_dict(again)
    tail = list(ds3)
    assert len(head) + len(tail) == len(full)
    for a, b in zip(head + tail, full, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
    ds2.set_epoch(1)  # another epoch drops the resume point: its start
    assert ds2.state_dict()["start"] is True and ds2.state_dict()["epoch"] == 1


@pytest.mark.parametrize("version", [np.zeros(0), np.ones(2), "1", None, True, 2])
def test_a_state_of_another_version_is_a_data_error(tokenized, version) -> None:
    # Before: version=np.zeros(0) was a ValueError (the truth value of an empty array).
    path, _ = tokenized
    state = {**make(path).state_dict(), "version": version}
    with pytest.raises(DataError, match="not a StreamingPackedDataset state"):
        make(path).load_state_dict(state)


def test_a_state_of_other_input_files_is_refused(tokenized, tmp_path) -> None:
    """Before: the key was the files' names and the total of documents, so a state of [A, B]
    resumed [B, A], or other files of the same names: documents lost and repeated. A copy of
    the same files at another path (another node's mount) is the same inputs."""
    import shutil

    path, _ = tokenized
    files = sorted(path.glob("*.parquet"))
    ds = make(files)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    state = _roundtrip(ds.state_dict())
    with pytest.raises(DataError, match=r"other inputs \(input file 0 is part-00001.parquet"):
        make(files[::-1]).load_state_dict(state)
    with pytest.raises(DataError, match="input files: 1 here, 2 in the state"):
        make([files[0]]).load_state_dict(make(files).state_dict())
    other = tmp_path / "other"  # files of the same names, other documents
    other.mkdir()
    shutil.copy(files[0], other / files[0].name)
    table = pq.read_table(files[1])
    pq.write_table(table.slice(0, table.num_rows - 1), other / files[1].name)
    with pytest.raises(DataError, match=re.escape(f"input file 1 is {files[1].name} (")):
        make(other).load_state_dict(state)
    # Two folders of files of the same names and documents, in the other order: the old key
    # (names, total) took it.
    trimmed = tmp_path / "trimmed"
    trimmed.mkdir()
    for f in files:
        t = pq.read_table(f)
        ids = pa.array([x[:-1] if x else x for x in t.column("input_ids").to_pylist()])
        t = t.set_column(
            t.schema.get_field_index("input_ids"),
            "input_ids",
            ids.cast(t.schema.field("input_ids").type),
        )
        pq.write_table(t, trimmed / f.name)
    both = make([path, trimmed])
    it = iter(both)
    next(it)
    with pytest.raises(DataError, match=re.escape("input file 0 is part-00000.parquet (")):
        make([trimmed, path]).load_state_dict(_roundtrip(both.state_dict()))
    # the same files elsewhere, or named another way (a folder), are the same inputs
    copied = shutil.copytree(path, tmp_path / "copy")
    for same in (make(copied), make(path)):
        same.load_state_dict(state)
        tail = list(same)
        full = list(make(files))
        got = [b["input_ids"].tolist() for b in head + tail]
        assert got == [b["input_ids"].tolist() for b in full]


def test_a_state_saved_before_the_inputs_were_keyed_still_loads(tokenized) -> None:
    path, _ = tokenized
    ds = make(path)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    state = ds.state_dict()
    del state["key"]["inputs"], state["key"]["footers"]  # what such a state held instead:
    state["key"].update(files=["part-00000.parquet", "part-00001.parquet"], documents=200)
    old = make(path)
    old.load_state_dict(state)
    both = [b["input_ids"].tolist() for b in head + list(old)]
    assert both == [b["input_ids"].tolist() for b in make(path)]
    state["key"]["documents"] = 199
    with pytest.raises(DataError, match=r"other inputs or settings \(documents\)"):
        make(path).load_state_dict(state)


def _plain_file(path, first_id):
    """A tokenized file of 60 documents in 3 row groups, doc ids from `first_id`: uncompressed,
    so every `first_id` gives a file of one name, size and document count (and another footer:
    its statistics hold the ids)."""
    lengths = np.random.default_rng(2).integers(1, 30, 60)
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(first_id, first_id + 60), pa.int64()),
            pa.array(["t"] * 60),
            pa.ListArray.from_arrays(
                pa.array(offsets), pa.array(np.arange(offsets[-1]) % 250, pa.uint16())
            ),
            pa.array(lengths.astype(np.int32)),
        ],
        schema=tokenized_schema(load_tokenizer("byte").identity),
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, row_group_size=20, compression="NONE", use_dictionary=False)
    return path


def test_a_state_of_a_file_rewritten_with_other_documents_of_one_size_is_refused(tmp_path):
    """The key was each file's name, size and document count: a file rewritten with other
    documents (re-tokenized, another shard of the corpus) of the same size resumed on other data
    without a word, the documents of the saved run's buffer packed beside the new file's. The
    key holds the files' Parquet footers too (row groups, byte sizes, statistics)."""
    path = _plain_file(tmp_path / "a" / "part.parquet", 0)
    ds = make(path)
    it = iter(ds)
    next(it)
    state = _roundtrip(ds.state_dict())
    size = path.stat().st_size
    data = path.read_bytes()
    _plain_file(path, 5000)
    assert path.stat().st_size == size and path.read_bytes() != data
    again = make(path)
    assert again.num_documents == ds.num_documents
    with pytest.raises(DataError) as info:
        again.load_state_dict(state)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("the state was saved with other inputs (")
    assert "footer" in message


def _two_batches_in(tmp_path) -> tuple:
    """A plain file, its whole run's batches, the first two of a run stopped there, and the
    state saved after them."""
    path = _plain_file(tmp_path / "a" / "part.parquet", 0)
    full = [b["input_ids"].tolist() for b in make(path)]
    ds = make(path)
    it = iter(ds)
    head = [next(it)["input_ids"].tolist() for _ in range(2)]
    return path, full, head, _roundtrip(ds.state_dict())


@pytest.mark.parametrize("staged", ["copied to another folder", "new modification time"])
def test_a_state_resumes_on_its_files_staged_again(tmp_path, staged) -> None:
    """Byte-identical files staged again (another folder, a new modification time) resume."""
    import os
    import shutil

    path, full, head, state = _two_batches_in(tmp_path)
    st = path.stat()
    now = path
    if staged == "copied to another folder":
        (tmp_path / "node").mkdir()
        now = shutil.copy(path, tmp_path / "node" / "part.parquet")
    os.utime(now, ns=(st.st_atime_ns, st.st_mtime_ns + 7_000_000_000))
    again = make(now)
    again.load_state_dict(state)
    assert head + [b["input_ids"].tolist() for b in again] == full


def test_a_state_saved_before_the_footers_were_keyed_still_loads(tmp_path) -> None:
    """A state saved before the key held the files' footers (`inputs` only) resumes on the
    same files, checked on what it holds (names, sizes, documents)."""
    path, full, head, state = _two_batches_in(tmp_path)
    del state["key"]["footers"]
    old = make(path)
    old.load_state_dict(state)
    assert head + [b["input_ids"].tolist() for b in old] == full
    state["key"]["inputs"][0][1] += 1
    with pytest.raises(DataError, match=r"other inputs \(input file 0 is part.parquet \("):
        make(path).load_state_dict(state)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"collate_kwargs": {"pad_tokens": 64}},
            r"pad_tokens=64 is smaller than a batch can hold \(rows_per_batch=3 × max_len=32 = 96 "
            r"tokens\); raise pad_tokens to at least 96",
        ),
        (
            {"rows_per_batch": None, "tokens_per_batch": 64, "collate_kwargs": {"pad_tokens": 48}},
            r"pad_tokens=48 is smaller than a batch can hold \(tokens_per_batch=64\)",
        ),
        ({"collate_kwargs": {"layout": "HF"}}, "layout must be 'packtool' or 'hf', got 'HF'"),
        (  # Before: accepted, then "batch holds 32 documents ..., more than pad_docs=8"
            {"collate_kwargs": {"pad_tokens": 96, "pad_docs": 8}},
            r"pad_docs=8 is smaller than the documents a batch can hold \(rows_per_batch=3 × "
            r"max_len=32 = 96 tokens: up to 96 one-token documents\); raise pad_docs to at "
            r"least 96",
        ),
        (
            {"collate_kwargs": {"pad_tokens": 97, "pad_docs": 96}},
            r"up to 96 one-token documents and the padding\); raise pad_docs to at least 97",
        ),
    ],
)
def test_collate_kwargs_a_batch_would_fail_on_are_refused_when_made(tokenized, kw, match) -> None:
    """Before: accepted, then every batch failed (in a DataLoader worker: its traceback)."""
    path, _ = tokenized
    with pytest.raises(ConfigError, match=match):
        make(path, **kw)
    with pytest.raises(ConfigError, match=match):
        settings = {"rows_per_batch": 3, **{k: v for k, v in kw.items() if k != "collate_kwargs"}}
        settings = {k: v for k, v in settings.items() if v is not None}
        OnlinePacker(max_len=MAX_LEN).batches(iter([]), **settings, **kw["collate_kwargs"])
    make(path, collate_kwargs={"pad_tokens": 96, "layout": "hf"})  # a batch's most: fine
    make(path, collate_kwargs={"pad_tokens": 96, "pad_docs": 96})


def _ids(batches) -> list[list[int]]:
    return [b["input_ids"].tolist() for b in batches]


def test_set_epoch_reaches_persistent_workers(tokenized) -> None:
    """Before: persistent workers kept the epoch they were started with, so every epoch
    repeated epoch 0's order."""
    path, _ = tokenized
    ds = make(path)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for epoch in (0, 1):
        ds.set_epoch(epoch)
        fresh = make(path)
        fresh.set_epoch(epoch)
        want = _ids(DataLoader(fresh, batch_size=None, num_workers=2))
        assert _ids(loader) == want
    assert want != _ids(DataLoader(make(path), batch_size=None, num_workers=2))  # epoch 0's


def test_a_resume_point_reaches_persistent_workers_once(tokenized) -> None:
    """A mid-epoch state loaded before the workers start resumes their first iteration only;
    one loaded after they started, which they cannot hold, is a clear error."""
    path, _ = tokenized
    full = _ids(make(path))
    ds = make(path)
    it = iter(ds)
    head = _ids(next(it) for _ in range(4))
    state = ds.state_dict()  # slot 0 of 1: one worker's slot
    resumed = make(path)
    resumed.load_state_dict(state)
    loader = DataLoader(resumed, batch_size=None, num_workers=1, persistent_workers=True)
    assert head + _ids(loader) == full
    assert resumed.state_dict()["start"] is True  # used up by the worker, here too
    assert _ids(loader) == full  # the next iteration runs the whole epoch
    resumed.load_state_dict(state)
    with pytest.raises(ConfigError, match="after these persistent DataLoader workers started"):
        list(loader)
    resumed.load_state_dict(make(path).state_dict())  # a start: the epoch alone, it reaches them
    assert _ids(loader) == full


@pytest.mark.parametrize(("world", "rank"), [(1, 0), (2, 1), (4, 1)])
def test_a_null_document_names_its_file_row_group_and_row(tmp_path, world, rank) -> None:
    """Before: "input_ids of row 2 is null", the row counted in the slot's share of the row
    group (`take`), naming no file."""
    schema = tokenized_schema(load_tokenizer("byte").identity)
    nullable = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
    ids = pa.array([[1, 2]] * 5 + [None] + [[3]] * 4, pa.list_(pa.uint16()))
    columns = [pa.array(np.arange(10), pa.int64()), pa.array(["t"] * 10), ids]
    columns.append(pa.array([2] * 10, pa.int32()))
    pq.write_table(pa.Table.from_arrays(columns, schema=nullable), tmp_path / "a.parquet")
    ds = make(tmp_path, world_size=world, rank=rank, max_len=8, rows_per_batch=2)
    with pytest.raises(DataError, match=r"a\.parquet: row group 0, row 5: input_ids is null$"):
        list(ds)


def test_a_stream_pickles_and_copies_with_a_start_of_its_own(tokenized) -> None:
    """The epoch shared with workers (a multiprocessing array) made the dataset unpicklable and
    uncopyable (`pickle`, `copy.deepcopy`, Ray): a copy made that way now holds the epoch of
    its own, and goes on as the original would."""
    import copy
    import pickle

    path, _ = tokenized
    ds = make(path)
    ds.set_epoch(3)
    tokens, per_doc = collect(ds)
    for clone in (pickle.loads(pickle.dumps(ds)), copy.deepcopy(ds)):
        assert clone.epoch == 3
        theirs, their_docs = collect(clone)
        assert np.array_equal(theirs, tokens) and their_docs == per_doc
        clone.set_epoch(5)
        assert (clone.epoch, ds.epoch) == (5, 3)  # its own, not the original's


def test_an_unreadable_row_group_is_a_one_line_error(tokenized, tmp_path) -> None:
    # Seen: pyarrow's several-line message appended whole ("Couldn't deserialize thrift:
    # ...\nDeserializing page header failed.\n").
    path, _ = tokenized
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in path.glob("*.parquet"):
        (copy / f.name).write_bytes(f.read_bytes())
    first = copy / "part-00000.parquet"
    meta = pq.ParquetFile(first).metadata.row_group(0)
    column = next(
        meta.column(i) for i in range(meta.num_columns)
        if meta.column(i).path_in_schema.startswith("input_ids")
    )  # fmt: skip
    data = bytearray(first.read_bytes())
    for i in range(6):
        data[column.data_page_offset + i] ^= 0xFF
    first.write_bytes(bytes(data))
    with pytest.raises(DataError) as info:
        list(make(copy))
    said = str(info.value)
    assert "part-00000.parquet: row group 0 unreadable (" in said
    assert "\n" not in said
