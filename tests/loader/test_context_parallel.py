"""Context-parallel batches (loader/context_parallel.py), verified on CPU: every rank's queries
attending to its documents' keys give, put back in order, the unsplit packed attention, and the
ranks' losses add up to the unsplit loss, for random packed batches and cp in {2, 4, 8}."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataLoader, PackedDataset
from loader.collate import collate
from loader.config import LoaderConfig
from loader.context_parallel import STYLES, cp_split
from loader.record import Documents
from loader.testing import write_dataset
from packtool.errors import ConfigError

H, D = 2, 8


def _attention(q, k, v, allowed):
    """Plain softmax attention, fp64 accumulation cast back (the reference)."""
    scores = torch.einsum("qhd,khd->hqk", q.double(), k.double()) / D**0.5
    scores = scores.masked_fill(~allowed[None], float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("hqk,khd->qhd", weights, v.double()).float()


def _batch(lens, seed, pad=None):
    rng = np.random.default_rng(seed)
    total = sum(lens)
    docs = Documents(rng.integers(1, 500, total), np.array(lens), np.arange(len(lens)))
    return collate(docs, pad_tokens=None if pad is None else total + pad)


@settings(max_examples=40, deadline=None)
@given(
    lens=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    size=st.sampled_from([2, 4, 8]),
    style=st.sampled_from(["megatron", "balanced"]),
    block=st.sampled_from([1, 4, 16]),
    pad=st.one_of(st.none(), st.integers(1, 9)),
    seed=st.integers(0, 2**31),
)
def test_ranks_attention_and_loss_equal_the_unsplit_batch(lens, size, style, block, pad, seed):
    batch = _batch(lens, seed, pad)
    total = batch["input_ids"].shape[0]
    cu = batch["cu_seqlens"].long()
    doc = torch.repeat_interleave(torch.arange(len(cu) - 1), cu.diff())
    pos = batch["position_ids"]
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(total, H, D, generator=gen) for _ in range(3))
    full = _attention(q, k, v, (doc[:, None] == doc[None]) & (pos[None] <= pos[:, None]))
    logits = torch.randn(total, 50, generator=gen)
    labels = batch["labels"].clamp(max=49).where(batch["labels"] != -100, -100)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    full_loss = ce.sum() / (labels != -100).sum().clamp(min=1)

    shares = [cp_split(batch, size, r, style, block) for r in range(size)]
    n_global = shares[0]["global_tokens"]
    offsets = shares[0]["global_cu_seqlens"].long()
    g_doc = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
    g_pos = torch.arange(n_global) - offsets[g_doc]
    g_real = g_pos < shares[0]["doc_lengths"].long()[g_doc]
    # The global padded layout, filled from the unsplit batch (padding: random, never attended).
    where = torch.full((n_global,), -1)
    where[g_real] = (cu[g_doc[g_real]] + g_pos[g_real]).long() if len(cu) > 1 else where[g_real]
    gk, gv = torch.randn(n_global, H, D, generator=gen), torch.randn(n_global, H, D, generator=gen)
    gq = torch.randn(n_global, H, D, generator=gen)
    gk[g_real], gv[g_real], gq[g_real] = k[where[g_real]], v[where[g_real]], q[where[g_real]]
    g_logits = torch.randn(n_global, 50, generator=gen)
    g_logits[g_real] = logits[where[g_real]]
    out = torch.zeros(n_global, H, D)
    loss = torch.zeros((), dtype=torch.float64)
    seen = torch.zeros(n_global, dtype=torch.long)
    for r, share in enumerate(shares):
        idx = share["token_index"]
        assert len(idx) == n_global // size  # every rank the same number of tokens
        # Per-document keys: global, one entry per document of the layout (the balanced
        # style's padding document included, as -1 / 0 targets), so doc_index indexes them.
        n_docs, n_in = len(share["doc_lengths"]), len(batch["doc_ids"])
        assert share["cp_rank"] == r and torch.equal(share["doc_ids"][:n_in], batch["doc_ids"])
        assert len(share["doc_ids"]) == len(share["doc_targets"]) == n_docs
        assert (share["doc_ids"][n_in:] == -1).all() and (share["doc_targets"][n_in:] == 0).all()
        assert torch.equal(share["doc_targets"][:n_in], batch["doc_targets"])
        qd, qp = share["doc_index"].long(), share["position_ids"]
        assert torch.equal(qd, g_doc[idx])
        allowed = (qd[:, None] == g_doc[None]) & (g_pos[None] <= g_pos[idx][:, None]) & g_real[None]
        out[idx] = _attention(gq[idx], gk, gv, allowed)
        # Labels and positions of the real tokens are the unsplit batch's.
        real = g_real[idx]
        assert torch.equal(share["labels"][real], batch["labels"][where[idx[real]]])
        assert torch.equal(qp[real], pos[where[idx[real]]])
        assert (share["labels"][~real] == -100).all() and (share["loss_weights"][~real] == 0).all()
        local_labels = share["labels"].clamp(max=49).where(share["labels"] != -100, -100)
        local_ce = torch.nn.functional.cross_entropy(g_logits[idx], local_labels, reduction="none")
        loss += (local_ce.double() * share["loss_weights"].double()).sum()
        seen[idx] += 1
    assert (seen == 1).all()  # the ranks' shares tile the global layout
    assert torch.allclose(out[g_real], full[where[g_real]], atol=1e-6, rtol=0)
    assert abs(loss.item() - full_loss.item()) <= 1e-6 * max(1.0, abs(full_loss.item()))
    if style == "megatron":  # every document a multiple of 2 * cp; TE's two cu_seqlens
        assert (offsets.diff() % (2 * size) == 0).all()
        assert torch.equal(
            shares[0]["cu_seqlens"].long(),
            torch.cat([torch.zeros(1), shares[0]["doc_lengths"].cumsum(0)]).long(),
        )


def test_the_zigzag_of_one_document():
    batch = _batch([8], 0)
    shares = [cp_split(batch, 2, r, "megatron")["token_index"].tolist() for r in range(2)]
    assert shares == [[0, 1, 6, 7], [2, 3, 4, 5]]  # chunks 0 and 3, 1 and 2


def test_balanced_spreads_causal_work_better_than_contiguous():
    batch = _batch([512], 0)  # one long document: the contiguous split is at its worst
    work = lambda idx: (torch.as_tensor(idx) + 1).sum().item()  # noqa: E731
    balanced = [work(cp_split(batch, 4, r, "balanced", 16)["token_index"]) for r in range(4)]
    contiguous = [work(torch.arange(r * 128, (r + 1) * 128)) for r in range(4)]
    assert max(balanced) / min(balanced) < 1.05 < max(contiguous) / min(contiguous)


def test_bad_settings_are_one_line(tmp_path):
    batch = _batch([4, 4], 0)
    for args, message in [
        ((0, 0), "size must be"),
        ((2, 2), "rank must be in 0..1"),
        ((2, 0, "ring"), "unknown"),
    ]:
        with pytest.raises(ConfigError, match=message):
            cp_split(batch, *args)
    # position_limit was used unchecked: 0 divided by zero, -5 gave negative positions, 2.5
    # float positions (collate refuses them)
    # (2**70 was an OverflowError deep in the split)
    for limit in (0, -5, 2.5, True, 2**70):
        with pytest.raises(ConfigError, match="position_limit must be an integer from 1 to "):
            cp_split(batch, 4, 0, position_limit=limit)
    for pad_id in (-1, 2**63, 1.0):
        with pytest.raises(ConfigError, match="^pad_id must be an integer from 0 to 2"):
            cp_split(batch, 4, 0, pad_id=pad_id)
    hf = collate(Documents(np.arange(4), np.array([4]), np.arange(1)), layout="hf")
    with pytest.raises(ConfigError, match="packtool-layout"):
        cp_split(hf, 2, 0)
    # A style or block is checked without a group too; varlen_keys would be dropped by the split.
    for kwargs, message in [
        ({"cp_style": "nonsense"}, "context-parallel style 'nonsense' is unknown"),
        ({"cp_block": -5}, "context-parallel block must be an integer >= 1, got -5"),
        ({"context_parallel": (2, 0), "varlen_keys": True}, "varlen_keys does not combine"),
    ]:
        with pytest.raises(ConfigError, match=message):
            LoaderConfig(rows_per_batch=1, **kwargs)


def test_the_loader_gives_each_cp_rank_its_share_of_the_same_rows(tmp_path):
    rng = np.random.default_rng(1)
    rows = [
        [list(rng.integers(1, 200, size=int(n))) for n in rng.integers(1, 30, size=int(k))]
        for k in rng.integers(1, 4, size=24)
    ]
    write_dataset(tmp_path / "d", rows, max_len=96, row_group_rows=8)
    loaders = [
        PackedDataLoader(
            PackedDataset(tmp_path / "d", rows_per_batch=2, context_parallel=(2, r)), num_workers=w
        )
        for r, w in ((0, 0), (1, 2))
    ]
    whole = PackedDataLoader(PackedDataset(tmp_path / "d", rows_per_batch=2), num_workers=0)
    for a, b, full in zip(*loaders, whole, strict=True):
        assert torch.equal(a["doc_ids"], b["doc_ids"]) and torch.equal(
            a["doc_ids"], full["doc_ids"]
        )
        index = torch.cat([a["token_index"], b["token_index"]])
        assert sorted(index.tolist()) == list(range(a["global_tokens"]))
        assert a["num_targets"] == b["num_targets"] == int((full["labels"] != -100).sum())


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(1, 50), min_size=1, max_size=8),
    size=st.sampled_from([2, 4, 8]),
    style=st.sampled_from(["megatron", "balanced"]),
    block=st.sampled_from([1, 4, 16, 64]),
    pad=st.one_of(st.none(), st.integers(1, 60)),
    room=st.integers(0, 3),
    seed=st.integers(0, 2**31),
)
def test_padding_positions_stay_inside_the_position_table(
    lens, size, style, block, pad, room, seed
):
    """The split's padding took its place in the padded document as position (max 111 with
    max_len 100, cp 8, megatron; 155 balanced with static shape), past a RoPE table of max_len
    rows, where collate wraps its padding at `position_limit`. It wraps the same way now; the
    real tokens' positions are the unsplit batch's."""
    max_len = max(lens) + room  # every document fits the model's context
    rng = np.random.default_rng(seed)
    total = sum(lens)
    docs = Documents(rng.integers(1, 500, total), np.array(lens), np.arange(len(lens)))
    batch = collate(docs, pad_tokens=None if pad is None else total + pad, position_limit=max_len)
    for r in range(size):
        for limit in (max_len, None):
            share = cp_split(batch, size, r, style, block, position_limit=limit)
            offsets = share["global_cu_seqlens"].long()
            g_doc = torch.repeat_interleave(torch.arange(len(offsets) - 1), offsets.diff())
            idx = share["token_index"]
            in_doc = idx - offsets[g_doc[idx]]
            real = in_doc < share["doc_lengths"].long()[g_doc[idx]]
            pos = share["position_ids"]
            top = max_len if limit is not None else int(batch["position_ids"].max()) + 1
            assert int(pos.max()) < top
            assert torch.equal(pos[~real], in_doc[~real] % top)
            cu = batch["cu_seqlens"].long()
            where = cu[g_doc[idx[real]]] + in_doc[real]
            assert torch.equal(pos[real], batch["position_ids"][where])


@pytest.mark.parametrize(
    ("style", "static"), [("megatron", False), ("balanced", False), ("balanced", True)]
)
def test_the_loader_keeps_cp_positions_below_max_len(tmp_path, style, static):
    rows = [[list(range(1, 100))], [list(range(1, 31))]]  # a 99-token document in max_len 100
    write_dataset(tmp_path / "d", rows, max_len=100)
    for b in _rank_batches(
        tmp_path / "d", 8, rows_per_batch=2, static_shape=static, cp_style=style
    ):
        assert int(b["position_ids"].max()) < 100


def _rank_batches(path, cp: int, **settings):
    """Every batch of every rank of a context-parallel group of `cp`, in order."""
    for rank in range(cp):
        yield from PackedDataset(path, shuffle=False, context_parallel=(cp, rank), **settings)


def test_static_shape_with_context_parallel_is_fixed_or_refused(tmp_path):
    """The megatron style pads every document to a multiple of 2 x cp, so under static_shape
    its shapes still varied ((26, 104), (28, 32), ... tokens and max_seqlen per rank batch): it
    is refused, naming the balanced style, whose shapes are fixed."""
    with pytest.raises(ConfigError, match=r"^static_shape with context_parallel needs cp_style="):
        LoaderConfig(rows_per_batch=1, static_shape=True, context_parallel=(4, 0))
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(6):
        cuts = np.sort(rng.choice(np.arange(1, 100), int(rng.integers(0, 5)), replace=False))
        lens = np.diff(np.r_[0, cuts, 100])
        rows.append([list(rng.integers(1, 50, int(n))) for n in lens])
    write_dataset(tmp_path / "d", rows, max_len=100)
    shapes = set()
    for b in _rank_batches(
        tmp_path / "d", 4, rows_per_batch=1, static_shape=True, cp_style="balanced"
    ):
        shapes.add(tuple((k, tuple(v.shape)) for k, v in b.items() if torch.is_tensor(v)))
    assert len(shapes) == 1


@pytest.mark.parametrize("style", STYLES)
def test_pin_memory_reaches_the_share(style):
    """`pin_memory` pinned the collated batch, then the split made new, unpinned tensors (the
    loader's `pin_memory=True` was lost with context_parallel). Without CUDA: no pinning, the
    same share."""
    batch = _batch([5, 9, 3], 0)
    plain = cp_split(batch, 2, 1, style, 4)
    pinned = cp_split(batch, 2, 1, style, 4, pin_memory=True)
    assert plain.keys() == pinned.keys()
    for key, value in plain.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, pinned[key]), key
            assert pinned[key].is_pinned() == torch.cuda.is_available(), key
        else:
            assert value == pinned[key], key


@pytest.mark.parametrize("style", STYLES)
def test_the_split_pads_with_the_batch_pad_id(tmp_path, style):
    """The split's padding was token 0 whatever `pad_id`: a rank of a static-shape batch held
    [7, 7, 0, 0, 0, 0] (collate's padding 7, the split's 0). Every padded place holds pad_id:
    where `token_index` is past the document's real tokens, or in the batch's own padding."""
    write_dataset(tmp_path / "d", [[[1, 2, 3]], [[4, 5], [6]]], max_len=8)
    static = {"static_shape": True} if style == "balanced" else {}
    padded = 0
    for rank in range(2):
        config = LoaderConfig(
            rows_per_batch=1, pad_id=7, cp_style=style, cp_block=3,
            context_parallel=(2, rank), **static,
        )  # fmt: skip
        for b in PackedDataset(tmp_path / "d", config):
            ids, labels = b["input_ids"].tolist(), b["labels"].tolist()
            assert set(ids) <= {1, 2, 3, 4, 5, 6, 7}, ids  # no 0
            pads = [lab for i, lab in zip(ids, labels, strict=True) if i == 7]
            assert set(pads) <= {-100}, (ids, labels)
            padded += len(pads)
    assert padded > 0
