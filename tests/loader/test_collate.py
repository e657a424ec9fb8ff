"""loader/collate.py: exact small batches, invariants on random documents, HF convention."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.collate import IGNORE_INDEX, collate
from loader.record import Documents
from packtool.errors import DataError


def docs(tokens, lens, ids, mask=None) -> Documents:
    return Documents(tokens, lens, ids, {} if mask is None else {"loss_mask": mask})


def test_exact_small_batch():
    b = collate(docs(np.array([5, 6, 7, 8, 9], np.uint16), np.array([3, 2]), np.array([10, 11])))
    assert b["input_ids"].tolist() == [5, 6, 7, 8, 9]
    assert b["cu_seqlens"].tolist() == [0, 3, 5]
    assert b["cu_seqlens"].dtype == torch.int32
    assert b["max_seqlen"] == 3 and isinstance(b["max_seqlen"], int)
    assert b["position_ids"].tolist() == [0, 1, 2, 0, 1]
    assert b["labels"].tolist() == [6, 7, -100, 9, -100]
    assert b["doc_ids"].tolist() == [10, 11]
    for k in ("input_ids", "position_ids", "labels", "doc_ids"):
        assert b[k].dtype == torch.int64


def test_static_shape_padding_convention():
    b = collate(
        docs(np.array([5, 6, 7], np.uint32), np.array([2, 1]), np.array([1, 2])),
        pad_tokens=8,
        pad_docs=5,
        pad_id=0,
        position_limit=4,
    )
    assert b["input_ids"].tolist() == [5, 6, 7, 0, 0, 0, 0, 0]
    # Padding = one trailing pseudo-document; extra entries repeat the total.
    assert b["cu_seqlens"].tolist() == [0, 2, 3, 8, 8, 8]
    assert b["position_ids"].tolist() == [0, 1, 0, 0, 1, 2, 3, 0]
    assert b["labels"].tolist() == [6, -100, -100] + [-100] * 5
    assert b["doc_ids"].tolist() == [1, 2, -1, -1, -1]
    assert b["max_seqlen"] == 8


def test_static_shape_overflow_is_a_clear_error():
    with pytest.raises(DataError, match="static budget"):
        collate(docs(np.arange(5), np.array([5]), np.array([0])), pad_tokens=4)
    with pytest.raises(DataError, match="pad_docs"):
        collate(docs(np.arange(4), np.array([1, 1, 1, 1]), np.arange(4)), pad_tokens=4, pad_docs=3)


def test_hf_layout_matches_transformers_collator():
    from transformers import DataCollatorWithFlattening

    seqs = [[5, 6, 7], [8, 9], [1, 2, 3, 4]]
    ref = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": d} for d in seqs]
    )
    tokens = np.concatenate([np.array(d) for d in seqs])
    b = collate(docs(tokens, np.array([len(d) for d in seqs]), np.arange(3)), layout="hf")
    # transformers' keys, plus the per-document target counts (per-sequence loss normalisation).
    assert b["doc_targets"].tolist() == [2, 1, 3]
    assert_same_as_collator(b, ref)


def assert_same_as_collator(b, ref) -> None:
    """`b` holds transformers' keys with the collator's values (and `doc_targets` beside)."""
    assert set(b) == set(ref) | {"doc_targets"}
    for k, v in ref.items():
        if isinstance(v, torch.Tensor):
            assert b[k].shape == v.shape, k
            assert torch.equal(b[k].to(v.dtype), v), k
        else:
            assert b[k] == v, k


def test_hf_and_packtool_labels_give_the_same_loss_targets():
    tokens = np.array([5, 6, 7, 8, 9, 1])
    lens = np.array([3, 2, 1])
    ours = collate(docs(tokens, lens, np.arange(3)))["labels"]
    hf = collate(docs(tokens, lens, np.arange(3)), layout="hf")["labels"][0]
    # transformers predicts hf[t + 1] from position t.
    assert ours[:-1].tolist() == hf[1:].tolist()


@st.composite
def documents(draw):
    lens = draw(st.lists(st.integers(1, 40), min_size=0, max_size=12))
    total = sum(lens)
    pad = draw(st.one_of(st.none(), st.integers(0, 30)))
    extra_docs = draw(st.integers(0, 3))
    return lens, total, pad, extra_docs


@settings(max_examples=60, deadline=None)
@given(documents(), st.integers(0, 2**31))
def test_invariants_against_a_plain_reference(case, seed):
    lens, total, pad, extra_docs = case
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 60_000, size=total).astype(np.uint16)
    doc_ids = rng.integers(0, 10**9, size=len(lens))
    pad_tokens = None if pad is None else total + pad
    pad_docs = None if pad is None else len(lens) + 1 + extra_docs
    b = collate(
        docs(tokens, np.array(lens, dtype=np.int64), doc_ids),
        pad_tokens=pad_tokens,
        pad_docs=pad_docs,
    )
    T = total if pad is None else total + pad
    ids, labels, pos, cu = (
        b[k].numpy() for k in ("input_ids", "labels", "position_ids", "cu_seqlens")
    )
    assert ids.shape == labels.shape == pos.shape == (T,)
    assert ids[:total].tolist() == tokens.tolist()
    assert cu[0] == 0 and cu[-1] == T and (np.diff(cu) >= 0).all()
    # Plain per-document reference.
    ref_labels, ref_pos, start = [], [], 0
    for n in lens:
        doc = tokens[start : start + n].tolist()
        ref_labels += doc[1:] + [IGNORE_INDEX]
        ref_pos += list(range(n))
        start += n
    assert labels[:total].tolist() == ref_labels
    assert pos[:total].tolist() == ref_pos
    assert (labels[total:] == IGNORE_INDEX).all()
    # No label crosses a boundary: every labelled token's successor is in the same document.
    doc_of = np.searchsorted(cu, np.arange(T), side="right") - 1
    t = np.flatnonzero(labels != IGNORE_INDEX)
    assert (doc_of[t] == doc_of[t + 1]).all()
    assert b["doc_ids"].numpy()[: len(lens)].tolist() == doc_ids.tolist()
    if pad is None:
        assert b["max_seqlen"] == (max(lens) if lens else 0)
        assert len(cu) == len(lens) + 1
    else:
        assert len(cu) == pad_docs + 1
