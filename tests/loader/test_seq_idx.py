"""`seq_idx` and the explicit varlen keys, in every layout: against a plain reference, against
transformers' DataCollatorWithFlattening (the collator its hybrid models are trained with), and
through the loader's workers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataLoader, PackedDataset
from loader.collate import collate
from loader.record import Documents
from loader.testing import write_dataset
from packtool.errors import ConfigError
from tests.loader.test_collate import assert_same_as_collator


@settings(max_examples=80, deadline=None)
@given(
    lens=st.lists(st.integers(1, 30), max_size=10),
    pad=st.one_of(st.none(), st.integers(0, 20)),
    layout=st.sampled_from(["packtool", "hf"]),
)
def test_seq_idx_is_each_tokens_document(lens, pad, layout):
    total = sum(lens)
    docs = Documents(np.arange(total) % 97, np.array(lens, dtype=np.int64), np.arange(len(lens)))
    pad_tokens = None if pad is None else total + pad
    b = collate(docs, pad_tokens=pad_tokens, layout=layout, seq_idx=True, varlen_keys=True)
    seq = b["seq_idx"]
    assert seq.dtype == torch.int32
    cu = (b["cu_seqlens"] if layout == "packtool" else b["cu_seq_lens_q"]).numpy()
    if layout == "hf":
        assert seq.shape == (1, int(cu[-1]))
        seq = seq[0]
    # The reference: the cu_seqlens entry each position falls in.
    want = np.searchsorted(cu, np.arange(len(seq)), side="right") - 1
    assert seq.numpy().tolist() == want.tolist()
    # Padding is one more document: no state flows from a real document into it.
    if pad:
        assert seq[total:].unique().tolist() == [len(lens)]
    for key in ("cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(b[key], torch.from_numpy(cu))
    max_len = b["max_seqlen"] if layout == "packtool" else b["max_length_q"]
    assert b["max_length_q"] == b["max_length_k"] == max_len


def test_without_the_options_the_batch_is_as_before():
    docs = Documents(np.arange(5), np.array([2, 3]), np.arange(2))
    assert set(collate(docs)) == {
        "input_ids", "cu_seqlens", "max_seqlen", "position_ids", "labels", "doc_ids", "doc_targets"
    }  # fmt: skip
    assert "seq_idx" not in collate(docs, layout="hf")


def test_hf_layout_with_seq_idx_matches_transformers_collator():
    from transformers import DataCollatorWithFlattening

    seqs = [[5, 6, 7], [8, 9], [1, 2, 3, 4], [11]]
    ref = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_seq_idx=True)(
        [{"input_ids": d} for d in seqs]
    )
    tokens = np.concatenate([np.array(d) for d in seqs])
    b = collate(
        Documents(tokens, np.array([len(d) for d in seqs]), np.arange(4)), layout="hf", seq_idx=True
    )
    assert_same_as_collator(b, ref)
    assert b["seq_idx"].dtype == ref["seq_idx"].dtype == torch.int32


@pytest.mark.parametrize("workers", [0, 2])
def test_the_loader_carries_the_keys_through_its_workers(tmp_path, workers):
    rng = np.random.default_rng(0)
    rows = [
        [list(rng.integers(1, 200, size=int(n))) for n in rng.integers(1, 12, size=int(k))]
        for k in rng.integers(1, 5, size=40)
    ]
    write_dataset(tmp_path / "d", rows, max_len=64, row_group_rows=8)
    ds = PackedDataset(tmp_path / "d", rows_per_batch=3, seq_idx=True, varlen_keys=True, seed=1)
    seen = 0
    for b in PackedDataLoader(ds, num_workers=workers):
        cu = b["cu_seqlens"].numpy()
        lens = np.diff(cu)
        assert b["seq_idx"].numpy().tolist() == np.repeat(np.arange(len(lens)), lens).tolist()
        assert torch.equal(b["cu_seq_lens_q"], b["cu_seqlens"])
        assert b["max_length_k"] == b["max_seqlen"]
        seen += len(lens)
    assert seen == sum(len(r) for r in rows)


def test_a_wrong_type_is_refused(tmp_path):
    write_dataset(tmp_path / "d", [[[1, 2, 3]]], max_len=8)
    with pytest.raises(ConfigError, match="seq_idx must be True or False"):
        PackedDataset(tmp_path / "d", rows_per_batch=1, seq_idx="yes")
