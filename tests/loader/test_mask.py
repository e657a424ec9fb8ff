"""A loss mask in the loader: labels -100 where the target is not supervised, on top of the
document boundaries, in every layout, through the worker transport, online packing and resume."""

from __future__ import annotations

import copy

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import OnlinePacker, PackedDataLoader, PackedDataset, StreamingPackedDataset
from loader.collate import IGNORE_INDEX, collate
from loader.record import Documents
from loader.store.shards import ShardStore
from loader.testing import write_dataset
from packtool.engines.local import RunConfig, run_pack
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.tokenize.tokenize import tokenize_corpus


def reference_labels(tokens, lens, mask, layout):
    """Per document on its own: the shifted (packtool) or unshifted (hf) targets, masked."""
    out, start = [], 0
    for n in lens:
        t = list(tokens[start : start + n])
        m = list(mask[start : start + n])
        if layout == "packtool":
            out += [t[i + 1] if m[i + 1] else IGNORE_INDEX for i in range(n - 1)] + [IGNORE_INDEX]
        else:
            out += [IGNORE_INDEX] + [t[i] if m[i] else IGNORE_INDEX for i in range(1, n)]
        start += n
    return out


def test_exact_small_batch_both_layouts():
    docs = Documents(
        np.array([5, 6, 7, 8, 9, 1, 2], np.uint16),
        np.array([4, 3]),
        np.array([0, 1]),
        {"loss_mask": np.array([0, 0, 1, 1, 1, 0, 1], np.uint8)},
    )
    # Position t predicts token t + 1: only supervised targets (7, 8 and 2) keep a label; the
    # last token of each document predicts nothing; 1 is a first token, never a target.
    assert collate(docs)["labels"].tolist() == [-100, 7, 8, -100, -100, 2, -100]
    assert collate(docs, layout="hf")["labels"][0].tolist() == [-100, -100, 7, 8, -100, -100, 2]
    padded = collate(docs, pad_tokens=10, pad_docs=4)
    assert padded["labels"].tolist() == [-100, 7, 8, -100, -100, 2, -100, -100, -100, -100]


@settings(max_examples=80, deadline=None)
@given(
    docs=st.lists(
        st.lists(st.tuples(st.integers(0, 999), st.integers(0, 1)), min_size=1, max_size=20),
        min_size=0,
        max_size=10,
    ),
    layout=st.sampled_from(["packtool", "hf"]),
    pad=st.one_of(st.none(), st.integers(0, 8)),
)
def test_a_masked_token_never_has_a_label(docs, layout, pad):
    tokens = np.array([t for d in docs for t, _ in d], np.uint16)
    mask = np.array([m for d in docs for _, m in d], np.uint8)
    lens = np.array([len(d) for d in docs], np.int64)
    total = len(tokens)
    kw = {} if pad is None else {"pad_tokens": total + pad, "pad_docs": len(docs) + 2}
    b = collate(
        Documents(tokens, lens, np.arange(len(docs)), {"loss_mask": mask}), layout=layout, **kw
    )
    labels = b["labels"].numpy().reshape(-1)
    assert labels[:total].tolist() == reference_labels(tokens, lens, mask, layout)
    assert (labels[total:] == IGNORE_INDEX).all()
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    labelled = np.flatnonzero(labels[:total] != IGNORE_INDEX)
    # The position whose label it is, and the token that label names (its target).
    target = labelled + 1 if layout == "packtool" else labelled
    assert (mask[target] == 1).all()  # a masked token is never a target
    assert not np.isin(target, starts).any()  # no label predicts the first token of a document
    doc_of = np.searchsorted(np.cumsum(lens), np.arange(total), side="right")
    source = labelled if layout == "packtool" else labelled - 1
    assert (doc_of[source] == doc_of[target]).all()  # no label crosses a document
    # Without the mask the same batch has a label at every masked target too.
    plain = collate(Documents(tokens, lens, np.arange(len(docs))), layout=layout, **kw)
    assert (plain["labels"].numpy().reshape(-1)[labelled] == labels[labelled]).all()


ROWS = [[[1, 2, 3], [4, 5]], [[6, 7, 8, 9]], [[10, 11], [12], [13, 14, 15]]] * 4
MASKS = [[[0, 1, 1], [0, 1]], [[0, 0, 1, 1]], [[0, 1], [1], [0, 0, 1]]] * 4


@pytest.fixture
def masked_dataset(tmp_path):
    path = tmp_path / "masked"
    write_dataset(path, ROWS, max_len=6, loss_masks=MASKS, row_group_rows=2, rows_per_shard=5)
    return path


def check_batch(batch, layout="packtool"):
    """Every label is a supervised target inside its document (recomputed from the batch)."""
    ids = batch["input_ids"].reshape(-1).numpy()
    labels = batch["labels"].reshape(-1).numpy()
    cu = (batch["cu_seqlens"] if layout == "packtool" else batch["cu_seq_lens_q"]).numpy()
    supervised = {(int(a), int(b)) for a, b in zip(ROWS_TOKENS, MASK_FLAT, strict=True) if b}
    labelled = np.flatnonzero(labels != IGNORE_INDEX)
    for t in labelled:
        target = t + 1 if layout == "packtool" else t
        assert (int(ids[target]), 1) in supervised  # token values are unique in this dataset
        doc = np.searchsorted(cu, target, side="right") - 1
        assert cu[doc] < target  # never a document's first token
    return len(labelled)


ROWS_TOKENS = [t for r in ROWS[:3] for d in r for t in d]
MASK_FLAT = [m for r in MASKS[:3] for d in r for m in d]


@pytest.mark.parametrize(
    "settings_",
    [
        {"rows_per_batch": 2},
        {"rows_per_batch": 2, "layout": "hf"},
        {"rows_per_batch": 2, "static_shape": True},
        {"tokens_per_batch": 12, "static_shape": True, "max_docs_per_batch": 8, "layout": "hf"},
    ],
    ids=["varlen", "hf", "static", "static-hf"],
)
def test_every_layout_masks_labels(masked_dataset, settings_):
    ds = PackedDataset(masked_dataset, seed=1, **settings_)
    layout = settings_.get("layout", "packtool")
    n = sum(check_batch(b, layout) for b in ds)
    # Every supervised target that is not a document's first token gets exactly one label.
    per_epoch = sum(m for r in MASKS for d in r for m in d[1:])
    assert n == per_epoch


def test_the_worker_transport_carries_the_mask(masked_dataset):
    ds = PackedDataset(masked_dataset, rows_per_batch=3, seed=0)
    want = [b["labels"].tolist() for b in ds]
    got = [b["labels"].tolist() for b in PackedDataLoader(ds, num_workers=2)]
    assert got == want
    assert ShardStore(masked_dataset).gather(np.array([1])).loss_mask.tolist() == [0, 0, 1, 1]


def test_format_1_datasets_still_load(tmp_path):
    write_dataset(tmp_path, ROWS, max_len=6, format_version=1)
    ds = PackedDataset(tmp_path, rows_per_batch=4, shuffle=False)
    batch = next(iter(ds))
    assert batch["labels"].tolist()[:5] == [2, 3, -100, 5, -100]  # boundaries only, no mask


# --- online packing ----------------------------------------------------------------------------


def test_online_packer_carries_the_mask_into_rows_and_labels():
    p = OnlinePacker(max_len=8, buffer_docs=100, long_docs="truncate", shuffle_rows=False)
    p.push(
        np.array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], np.int64),
        np.array([3, 2, 6]),
        loss_mask=np.array([0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1], np.uint8),
    )
    p.flush()
    rows = p.pop()
    stats = p.stats
    # Document 1 (4, 5) has no supervised token: dropped and counted.
    assert stats["documents_unsupervised"] == 1 and stats["documents_dropped"] == 1
    assert sorted(rows.doc_ids.tolist()) == [0, 2]
    assert stats["tokens_supervised"] == int(rows.columns["loss_mask"].sum()) == 5
    for r in range(rows.n_rows):
        docs = rows.row(r)
        check = dict(zip(docs.tokens.tolist(), docs.loss_mask.tolist(), strict=True))
        assert all(check[t] == (t in (2, 3, 9, 10, 11)) for t in check)
    labels = rows.collate()["labels"].tolist()
    assert sorted(t for t in labels if t != IGNORE_INDEX) == [2, 3, 9, 10, 11]


def test_online_packer_refuses_split_and_mixed_documents():
    # (In the Python setting's words: the packer has no --long-docs.)
    with pytest.raises(ConfigError, match="long_docs='split' cuts documents.*'truncate' or 'drop'"):
        OnlinePacker(max_len=8).push(np.arange(3), np.array([3]), loss_mask=np.ones(3, np.uint8))
    p = OnlinePacker(max_len=8, long_docs="drop")
    p.push(np.arange(3), np.array([3]), loss_mask=np.ones(3, np.uint8))
    with pytest.raises(ConfigError, match="with and without loss_mask"):
        p.push(np.arange(3), np.array([3]))
    with pytest.raises(DataError, match="loss_mask must have one value per token"):
        p.push(np.arange(3), np.array([3]), loss_mask=np.ones(2, np.uint8))
    with pytest.raises(DataError, match=r"loss_mask values must be in 0..1"):
        p.push(np.arange(3), np.array([3]), loss_mask=np.array([0, 2, 1]))


@settings(max_examples=30, deadline=None)
@given(
    docs=st.lists(
        st.lists(st.tuples(st.integers(0, 50), st.integers(0, 1)), min_size=1, max_size=12),
        min_size=1,
        max_size=60,
    ),
    cut=st.integers(0, 60),
)
def test_online_resume_keeps_every_mask(docs, cut):
    """Pushed in pieces, checkpointed mid-stream: the rows equal an uninterrupted run's."""
    kw = {"max_len": 10, "buffer_docs": 8, "min_fill": 0.8, "long_docs": "truncate"}
    tokens = [np.array([t for t, _ in d]) for d in docs]
    masks = [np.array([m for _, m in d]) for d in docs]

    def feed(p, a, b):
        for i in range(a, b):
            p.push_docs([tokens[i]], [masks[i]])

    whole = OnlinePacker(**kw)
    feed(whole, 0, len(docs))
    whole.flush()
    cut = min(cut, len(docs))
    first = OnlinePacker(**kw)
    feed(first, 0, cut)
    state = copy.deepcopy(first.state_dict())
    second = OnlinePacker(**kw)
    second.load_state_dict(state)
    feed(second, cut, len(docs))
    second.flush()
    # Nothing was popped before the checkpoint: the state holds the rows packed so far.
    a, b = whole.pop(), second.pop()

    def flat(rows):  # no rows at all: no token array
        mask = rows.columns.get("loss_mask", np.zeros(0))
        return [] if rows.tokens is None else rows.tokens.tolist(), mask.tolist()

    assert flat(a) == flat(b)
    assert a.seg_len.tolist() == b.seg_len.tolist()
    assert whole.stats["tokens_supervised"] == second.stats["tokens_supervised"]
    # A document supervised only at its first token is left out (never a target: labels shift).
    kept = sum(int(m[:10].sum()) for m in masks if m[1:10].sum())
    assert whole.stats["tokens_supervised"] == kept


def test_streaming_dataset_reads_the_mask_and_resumes(tmp_path):
    ids = [[int(x) for x in np.arange(i, i + 3 + i % 5)] for i in range(40)]
    labels = [[t if k % 2 else -100 for k, t in enumerate(d)] for d in ids]  # odd positions
    src = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), src, row_group_size=8)
    tok = tmp_path / "tok.parquet"
    tokenize_corpus([src], tok)
    kw = {"max_len": 12, "buffer_docs": 6, "long_docs": "truncate", "rows_per_batch": 2}
    # The default split is refused when the dataset is made, not at its first batch (which,
    # in a DataLoader worker, was a worker's traceback).
    with pytest.raises(ConfigError, match="long_docs='split' cuts documents"):
        StreamingPackedDataset([tok], **{**kw, "long_docs": "split"})
    batches = list(StreamingPackedDataset([tok], **kw))
    n = 0
    for b in batches:
        labels_, cu = b["labels"].numpy(), b["cu_seqlens"].numpy()
        for t in np.flatnonzero(labels_ != IGNORE_INDEX):
            doc = np.searchsorted(cu, t, side="right") - 1
            assert (t + 1 - cu[doc]) % 2 == 1  # the target is at an odd, supervised position
            n += 1
    assert n == sum(len(d[1::2]) for d in ids)
    # Stopped after three batches and resumed in a new dataset: the same stream.
    ds = StreamingPackedDataset([tok], **kw)
    it = iter(ds)
    head = [next(it) for _ in range(3)]
    resumed = StreamingPackedDataset([tok], **kw)
    resumed.load_state_dict(copy.deepcopy(ds.state_dict()))
    again = [b["labels"].tolist() for b in head + list(resumed)]
    assert again == [b["labels"].tolist() for b in batches]


def test_pack_then_load_keeps_every_supervised_target(tmp_path):
    """End to end: labels from pre-tokenized Parquet, packed by the engine, loaded in batches."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 250, int(rng.integers(3, 30))).tolist() for _ in range(300)]
    masks = [(rng.random(len(d)) < 0.5).astype(int).tolist() for d in ids]
    for m in masks:
        m[-1] = 1
    labels = [
        [t if k else -100 for t, k in zip(d, m, strict=True)]
        for d, m in zip(ids, masks, strict=True)
    ]
    src = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), src)
    run_pack(
        RunConfig(
            inputs=(str(src),),
            out_dir=str(tmp_path / "out"),
            pack=PackConfig(max_len=64, long_docs="truncate"),
            chunk_docs=100,
            progress=False,
        )
    )
    expected = sum(sum(m[1:]) for m in masks)  # first tokens are never targets
    for layout in ("packtool", "hf"):
        ds = PackedDataset(tmp_path / "out", rows_per_batch=4, layout=layout)
        got = sum(int((b["labels"] != IGNORE_INDEX).sum()) for b in ds)
        assert got == expected
