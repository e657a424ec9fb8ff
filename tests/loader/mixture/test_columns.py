"""Optional columns in a mixture (a loss mask gives the labels `PackedDataset` gives for the same
rows, in every layout and through the workers) and mixture batches in the Hugging Face layout
(`model(**batch)` and `loader.hf.check_packed_model` take them; no document sees another)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from loader import MixedDataLoader, MixedDataset, PackedDataset, StreamingPackedDataset
from loader.collate import IGNORE_INDEX
from loader.mixture.batch import HFMixedBatch, batch_sources, token_sources
from loader.mixture.sources import missing_fill, mixture_columns
from loader.testing import write_dataset
from packtool.dataset.columns import LOSS_MASK, TOKEN, Column, get
from packtool.errors import ConfigError
from packtool.mixture.spec import MixtureSpec, SourceSpec
from packtool.tokenize.tokenize import tokenize_corpus
from tests.loader.hf_helpers import VOCAB, documents, per_document_loss, tiny_model


def random_rows(n_rows: int, *, seed: int, max_len: int = 32, masked: bool):
    """Rows of 1-4 documents of 1-12 random tokens; with `masked`, a random 0/1 mask each."""
    rng = np.random.default_rng(seed)
    rows, masks = [], []
    for _ in range(n_rows):
        docs, used = [], 0
        for _ in range(int(rng.integers(1, 5))):
            n = int(rng.integers(1, 13))
            if used + n > max_len:
                break
            docs.append(rng.integers(2, VOCAB, n).tolist())
            used += n
        docs = docs or [[int(rng.integers(2, VOCAB))]]
        rows.append(docs)
        masks.append([rng.integers(0, 2, len(d)).tolist() for d in docs])
    return rows, (masks if masked else None)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """A masked source (30 rows) and a plain one (20 rows), max_len 32, 3-row row groups."""
    root = tmp_path_factory.mktemp("mixcols")
    out = {}
    for name, n, masked, first in (("sft", 30, True, 0), ("web", 20, False, 10_000)):
        rows, masks = random_rows(n, seed=n, masked=masked)
        ids = [[first + 10 * r + k for k in range(len(row))] for r, row in enumerate(rows)]
        write_dataset(
            root / name,
            rows,
            max_len=32,
            loss_masks=masks,
            doc_ids=ids,
            row_group_rows=3,
            rows_per_shard=7,
        )
        out[name] = root / name
    return out


def mixture(paths, **kw):
    return MixtureSpec(
        sources=(
            SourceSpec(name="sft", path=str(paths["sft"]), weight=0.6),
            SourceSpec(name="web", path=str(paths["web"]), weight=0.4),
        ),
        total_tokens=kw.pop("total_tokens", 3000),  # several epochs of both
        **kw,
    )


def labels_by_doc(batches, ids_from=None):
    """Per document id: its labels, from batches of either layout (`ids_from`: the same stream
    in the packtool layout, for the ids of an hf stream)."""
    out: dict[int, list[int]] = {}
    for i, b in enumerate(batches):
        ref = b if ids_from is None else ids_from[i]
        cu = (b["cu_seqlens"] if "cu_seqlens" in b else b["cu_seq_lens_q"]).tolist()
        labels = b["labels"].reshape(-1).tolist()
        for d, doc in enumerate(ref["doc_ids"].tolist()):
            if doc >= 0:
                got = labels[cu[d] : cu[d + 1]]
                assert out.setdefault(doc, got) == got  # every epoch gives a row the same labels
    return out


def reference(paths, layout):
    """Per document id: the labels `PackedDataset` gives it (each dataset on its own)."""
    out = {}
    for path in paths.values():
        kw = {"rows_per_batch": 2, "shuffle": False}
        plain = list(PackedDataset(path, **kw))
        batches = plain if layout == "packtool" else list(PackedDataset(path, layout="hf", **kw))
        out.update(labels_by_doc(batches, ids_from=plain))
    return out


SETTINGS = [
    {"rows_per_batch": 3},
    {"tokens_per_batch": 64},
    {"rows_per_batch": 2, "static_shape": True},
    {"tokens_per_batch": 40, "static_shape": True, "max_docs_per_batch": 12},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=["rows", "tokens", "static", "static-tokens"])
@pytest.mark.parametrize("layout", ["packtool", "hf"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_masked_source_has_the_labels_packed_dataset_gives(sources, settings, layout, workers):
    plain = list(MixedDataLoader(MixedDataset(mixture(sources), **settings), num_workers=workers))
    batches = plain
    if layout == "hf":
        ds = MixedDataset(mixture(sources), layout="hf", **settings)
        batches = list(MixedDataLoader(ds, num_workers=workers))
        assert all(isinstance(b, HFMixedBatch) for b in batches)
        for b, p in zip(batches, plain, strict=True):  # the same documents, their sources
            assert torch.equal(b.source, p["source"])
    got = labels_by_doc(batches, ids_from=plain)
    want = reference(sources, layout)
    assert set(got) == set(want)  # every row of both sources came
    assert got == want
    masked = [doc for doc in got if doc < 10_000]
    assert any(IGNORE_INDEX in got[d][:-1] for d in masked)  # the mask cut some targets


def test_labels_of_a_masked_source_come_from_its_mask(sources):
    """Against the stored mask directly: a label only where the target token is supervised."""
    store = PackedDataset(sources["sft"], rows_per_batch=1).store
    whole = store.gather(np.arange(store.num_rows))
    want, start = {}, 0
    for doc, n in zip(whole.doc_ids.tolist(), whole.doc_lens.tolist(), strict=True):
        t = whole.tokens[start : start + n].tolist()
        m = whole.loss_mask[start : start + n].tolist()
        want[doc] = [t[i + 1] if m[i + 1] else IGNORE_INDEX for i in range(n - 1)] + [-100]
        start += n
    got = labels_by_doc(MixedDataset(mixture(sources), rows_per_batch=2))
    assert {d: v for d, v in got.items() if d < 10_000} == want


def test_the_mixture_carries_the_columns_any_source_has(sources):
    both = MixedDataset(mixture(sources), rows_per_batch=2)
    assert [c.name for c in both.columns] == [LOSS_MASK]
    docs, _ = both.gather(next(iter(_steps(both))))
    assert docs.loss_mask is not None and len(docs.loss_mask) == docs.n_tokens
    plain = MixedDataset(
        MixtureSpec(
            sources=(SourceSpec(name="web", path=str(sources["web"]), weight=1),), total_steps=2
        ),
        rows_per_batch=2,
    )
    assert plain.columns == ()
    assert all(IGNORE_INDEX not in _inner_labels(b) for b in plain)


def _steps(ds):
    from loader.mixture.steps import RowStream, plan_steps

    stream = RowStream(ds, ds.start_state()["schedule"])
    for s in plan_steps(ds, stream, 0, lambda step: True):
        yield s.rows


def _inner_labels(batch):
    """Labels of every token but each document's last (which predicts nothing)."""
    cu = batch["cu_seqlens"].tolist()
    labels = batch["labels"].tolist()
    return [x for a, b in zip(cu[:-1], cu[1:], strict=True) for x in labels[a : b - 1]]


def test_a_column_a_source_cannot_stand_in_for_is_refused():
    other = Column(name="doc_weight", dtype="float32", level=TOKEN, required=False, doc="test")
    with_it = SimpleNamespace(name="a", columns=(get(LOSS_MASK), other))
    without = SimpleNamespace(name="b", columns=())
    assert missing_fill(get(LOSS_MASK), "b") == 1
    with pytest.raises(ConfigError, match="source 'b' has no 'doc_weight' column"):
        missing_fill(other, "b")
    assert mixture_columns([with_it, without]) == (get(LOSS_MASK),)  # undeclared: not carried


def test_a_masked_streaming_source_has_the_labels_of_its_stream(tmp_path):
    ids = [[int(x) for x in np.arange(i, i + 3 + i % 5)] for i in range(40)]
    labels = [[t if k % 2 else -100 for k, t in enumerate(d)] for d in ids]  # odd positions
    src = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), src, row_group_size=8)
    tok = tmp_path / "tok.parquet"
    tokenize_corpus([src], tok)
    kw = {"max_len": 12, "buffer_docs": 6, "long_docs": "truncate"}
    want = labels_by_doc(StreamingPackedDataset([tok], rows_per_batch=1, **kw))
    live = StreamingPackedDataset([tok], rows_per_batch=1, **kw)
    spec = MixtureSpec(sources=(SourceSpec(name="live", path=live, max_epochs=1, weight=1),))
    for workers in (0, 2):
        ds = MixedDataset(spec, rows_per_batch=2)
        got = labels_by_doc(MixedDataLoader(ds, num_workers=workers))
        assert got == want, workers
    assert sum(x != IGNORE_INDEX for v in want.values() for x in v) == sum(
        len(d[1::2]) for d in ids
    )


# ---- the Hugging Face layout ------------------------------------------------------------------


@pytest.mark.parametrize("workers", [0, 2])
def test_hf_layout_batches_train_a_transformers_model_without_leakage(sources, workers, tmp_path):
    from loader.hf import check_packed_model

    torch.set_num_threads(1)
    # a second plain source: other data (web's twice is refused: every row would come twice)
    rows, _ = random_rows(20, seed=21, masked=False)
    ids = [[20_000 + 10 * r + k for k in range(len(row))] for r, row in enumerate(rows)]
    write_dataset(tmp_path / "web2", rows, max_len=32, doc_ids=ids, row_group_rows=3)
    web = {"web": sources["web"], "web2": tmp_path / "web2"}  # unmasked: every target counts
    spec = MixtureSpec(
        sources=tuple(SourceSpec(name=n, path=str(p), weight=1) for n, p in web.items()),
        total_steps=3,
    )
    model = tiny_model()
    model.config.use_cache = False
    model.eval()
    batches = list(
        MixedDataLoader(MixedDataset(spec, rows_per_batch=3, layout="hf"), num_workers=workers)
    )
    assert len(batches) == 3
    for batch in batches:
        assert set(batch) == {
            "input_ids",
            "labels",
            "position_ids",
            "cu_seq_lens_q",
            "cu_seq_lens_k",
            "max_length_q",
            "max_length_k",
            "doc_targets",
        }
        assert check_packed_model(model, batch) == "position_ids"
        with torch.no_grad():
            loss = model(**batch).loss
            alone = per_document_loss(model, documents(batch))
        assert torch.allclose(loss, alone, atol=1e-5)
        per_token = token_sources(batch)
        assert per_token.shape == batch["input_ids"].reshape(-1).shape
        assert set(per_token.tolist()) <= {0, 1}
        assert len(batch_sources(batch)) == len(batch["cu_seq_lens_q"]) - 1
        assert int(batch["doc_targets"].sum()) == int((batch["labels"] != -100).sum())


@pytest.mark.parametrize("style", ["megatron", "balanced"])
def test_token_sources_of_a_context_parallel_share_are_its_tokens_sources(sources, style):
    """A cp_split share's `cu_seqlens` are the whole batch's: token_sources expanded them, the
    wrong length and other sources (megatron), or a KeyError (balanced, no `cu_seqlens`)."""
    whole = MixedDataset(mixture(sources), rows_per_batch=2)
    counts = {}  # per step, the tokens of each source over both ranks (the split's padding: -1)
    for r in range(2):
        share = MixedDataset(
            mixture(sources), rows_per_batch=2, context_parallel=(2, r), cp_style=style, cp_block=4
        )
        for step, (full, part, _) in enumerate(zip(whole, share, range(6), strict=False)):
            per_token = token_sources(part)
            got = counts.setdefault(step, torch.zeros(3, dtype=torch.int64))
            got += torch.bincount(per_token + 1, minlength=3)
            if r == 1:  # as many tokens of each source as the whole batch has, padding aside
                want = torch.bincount(token_sources(full) + 1, minlength=3)
                assert torch.equal(got[1:], want[1:]), (step, got, want)
            assert per_token.shape == part["input_ids"].shape
            want = token_sources(full)  # each token's source, in the unsplit layout
            real = part["labels"] != -100  # (the split's padding has no token of the batch)
            cu = full["cu_seqlens"].long()
            doc = part["doc_index"].long()
            pos = part["position_ids"].long()
            at = (cu[doc[real]] + pos[real]).clamp(max=len(want) - 1)
            assert torch.equal(per_token[real], want[at])


def test_an_hf_batch_copied_without_its_sources_says_so(sources):
    ds = MixedDataset(mixture(sources), rows_per_batch=2, layout="hf")
    batch = next(iter(ds))
    moved = type(batch)({k: v for k, v in batch.items()})  # what a device move does
    with pytest.raises(ConfigError, match="read batch.source before moving it"):
        token_sources(moved)
