"""The model on packed batches equals the model on each document alone: no leakage."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attention.model import CausalLMOutput, ModelConfig, Transformer
from tests.attention.helpers import make_batch

DOCS = [[5, 9, 2, 7, 1], [3], [8, 8, 4, 6, 11, 2, 9, 10, 1], [12, 0], [7, 3, 3, 5]]
VOCAB = 16


def _model(backend="auto", seed=0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=VOCAB,
        dim=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        max_seq_len=64,
        attn_backend=backend,
        **overrides,
    )
    return Transformer(cfg)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["dense", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
def test_packed_equals_each_document_alone(backend, window):
    model = _model(backend, sliding_window=window)
    packed = make_batch(DOCS)
    out = model(packed)
    out.loss.backward()
    packed_grads = _grads(model)

    model.zero_grad()
    logits, loss_sum, count = [], 0.0, 0
    for doc in DOCS:
        alone = model(make_batch([doc]))
        logits.append(alone.logits)
        loss_sum = loss_sum + alone.loss_sum
        count += int(alone.num_targets)
    # Per-document losses combine as sum over all real targets / total count.
    loss = loss_sum / count
    loss.backward()
    alone_grads = _grads(model)

    torch.testing.assert_close(out.logits, torch.cat(logits), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.loss, loss, rtol=1e-5, atol=1e-5)
    assert int(out.num_targets) == count == sum(len(d) - 1 for d in DOCS)
    for name, g in packed_grads.items():
        torch.testing.assert_close(g, alone_grads[name], rtol=1e-5, atol=1e-5, msg=name)


@pytest.mark.parametrize("backend", ["dense", "sdpa"])
def test_changing_one_document_leaves_the_others_bit_identical(backend):
    model = _model(backend)
    before = model(make_batch(DOCS)).logits
    changed = [list(d) for d in DOCS]
    changed[2] = [15 - t for t in changed[2]]
    after = model(make_batch(changed)).logits
    start = 0
    for i, doc in enumerate(DOCS):
        end = start + len(doc)
        same = torch.equal(before[start:end], after[start:end])
        assert same is (i != 2), f"document {i}"
        start = end


def test_order_of_documents_does_not_change_the_loss():
    model = _model()
    a = model(make_batch(DOCS)).loss
    b = model(make_batch(DOCS[::-1])).loss
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


def test_loss_is_mean_over_real_targets_by_hand():
    model = _model()
    batch = make_batch([[1, 2, 3], [4, 5]])
    assert batch["labels"].tolist() == [2, 3, -100, 5, -100]
    out = model(batch)
    logp = out.logits.log_softmax(-1)
    expected = -(logp[0, 2] + logp[1, 3] + logp[3, 5]) / 3
    torch.testing.assert_close(out.loss, expected)
    assert isinstance(out, CausalLMOutput) and out.backend == "dense"


def test_rotary_uses_per_document_positions(monkeypatch):
    # Rotary scores depend on position differences: a uniform shift of one document's
    # position ids leaves its logits (numerically) unchanged, stretched positions change them.
    # forward refuses such positions (below); to probe the rotary lookup alone, the check is off.
    from attention import model as model_module

    monkeypatch.setattr(model_module, "_position_fault", lambda *_: torch.tensor([-1, 0, 0, 0]))
    model = _model()
    batch = make_batch([[1, 2, 3], [4, 5, 6]])
    out = model(batch).logits
    shifted = dict(batch, position_ids=torch.tensor([0, 1, 2, 7, 8, 9]))
    torch.testing.assert_close(model(shifted).logits, out, rtol=1e-5, atol=1e-5)
    stretched = dict(batch, position_ids=torch.tensor([0, 1, 2, 0, 3, 9]))
    changed = model(stretched).logits
    assert torch.equal(changed[:4], out[:4])  # doc 0, and doc 1's first token (sees only itself)
    assert not torch.allclose(changed[4:], out[4:], atol=1e-4)
    torch.testing.assert_close(out[3:], model(make_batch([[4, 5, 6]])).logits)


def test_no_labels_gives_logits_only_and_padding_is_ignored():
    model = _model()
    batch = make_batch(DOCS)
    del batch["labels"]
    out = model(batch)
    assert out.loss is None and out.logits.shape == (sum(map(len, DOCS)), 16)
    # Padding as a trailing pseudo-document with -100 labels does not move the loss.
    padded = make_batch([*DOCS, [0, 0, 0]])
    padded["labels"][-3:] = -100
    torch.testing.assert_close(model(padded).loss, model(make_batch(DOCS)).loss)


def test_bf16_autocast_on_cpu_trains(monkeypatch):
    import attention.model as model_module

    seen = set()  # q, k, v dtypes at the attention call: on CUDA, bf16 is what lets `auto`
    real = model_module.varlen_attention  # pick flash_attn / torch_varlen (half-only kernels)

    def spy(q, k, v, *args, **kwargs):
        seen.update((q.dtype, k.dtype, v.dtype))
        return real(q, k, v, *args, **kwargs)

    monkeypatch.setattr(model_module, "varlen_attention", spy)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = make_batch(DOCS)
    losses = []
    for _ in range(15):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(batch)
        assert out.logits.dtype == torch.bfloat16
        assert seen == {torch.bfloat16}
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        losses.append(out.loss.item())
    assert losses[-1] < 0.7 * losses[0]


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("vocab_size", 0, "vocab_size must be a positive int"),
        ("dim", 30, "multiple of n_heads"),
        ("n_kv_heads", 3, "n_kv_heads 3 must be >= 1 and divide n_heads 4"),
        ("n_kv_heads", 0, "n_kv_heads must be a positive int or None, got 0"),
        ("sliding_window", 0, "sliding_window must be a positive int or None"),
        # Types the layers would fail on later (nn.Linear, the first forward), not here.
        ("n_kv_heads", 2.0, "n_kv_heads must be a positive int or None, got 2.0"),
        ("ffn_hidden", 64.5, "ffn_hidden must be a positive int or None, got 64.5"),
        ("vocab_size", True, "vocab_size must be a positive int, got True"),
        ("sliding_window", 2.5, "sliding_window must be a positive int or None, got 2.5"),
        ("sliding_window", True, "sliding_window must be a positive int or None, got True"),
        ("rope_theta", "x", "rope_theta must be a number, got 'x'"),
        ("rope_theta", float("inf"), "rope_theta must be a finite number > 0"),
        ("tie_embeddings", "yes", "tie_embeddings must be True or False"),
        ("attn_backend", "fast", "attn_backend 'fast' is unknown; choose from auto"),
        ("rope_theta", 0.0, "rope_theta"),
        ("norm_eps", 0.0, "norm_eps"),
        ("ffn_hidden", 0, "ffn_hidden"),
    ],
)
def test_config_validation(field, value, match):
    base = ModelConfig(vocab_size=16, dim=32, n_heads=4)
    with pytest.raises(ValueError, match=match):
        dataclasses.replace(base, **{field: value})


def test_config_head_dim_must_be_even():
    with pytest.raises(ValueError, match="head_dim .* must be even"):
        ModelConfig(vocab_size=16, dim=12, n_heads=4)


def test_static_shape_padding_longer_than_max_seq_len_is_accepted():
    # The loader's static-shape padding is one pseudo-document with wrapped positions; it may
    # be longer than the model's context. It must not change the real documents' loss.
    model = _model()
    batch = make_batch(DOCS)
    n = batch["input_ids"].numel()
    pad = 100  # > max_seq_len 64
    padded = {
        "input_ids": torch.cat([batch["input_ids"], torch.zeros(pad, dtype=torch.int64)]),
        "cu_seqlens": torch.cat([batch["cu_seqlens"], torch.tensor([n + pad], dtype=torch.int32)]),
        "max_seqlen": n + pad,
        "position_ids": torch.cat([batch["position_ids"], torch.arange(pad) % 64]),
        "labels": torch.cat([batch["labels"], torch.full((pad,), -100)]),
    }
    out = model(padded)
    torch.testing.assert_close(out.loss, model(batch).loss)
    torch.testing.assert_close(out.logits[:n], model(batch).logits, rtol=1e-5, atol=1e-5)


def test_batch_errors():
    model = _model()
    with pytest.raises(ValueError, match="batch lacks cu_seqlens"):
        model({"input_ids": torch.zeros(3, dtype=torch.int64), "position_ids": torch.arange(3)})
    long = make_batch([list(range(16)) * 5])
    with pytest.raises(ValueError, match="position id 79 is outside ModelConfig.max_seq_len 64"):
        model(long)
    bad = make_batch(DOCS)
    bad["cu_seqlens"] = bad["cu_seqlens"].long()
    with pytest.raises(ValueError, match="int32"):
        model(bad)


def _edited(key, change):
    batch = make_batch(DOCS)
    batch[key] = change(batch[key])
    return batch


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (list(make_batch(DOCS).values()), "batch must be a dict of tensors .* got list"),
        (_edited("position_ids", lambda p: p - 1), "position id -1 is negative"),
        (
            _edited("input_ids", lambda t: t + VOCAB),
            rf"input id \d+ is outside ModelConfig.vocab_size {VOCAB}",
        ),
        (_edited("input_ids", lambda t: t - 1), "input id -1 is outside"),
        (_edited("position_ids", lambda p: p[1:]), r"batch\['position_ids'\] has \d+ entries for"),
        (_edited("labels", lambda t: t[1:]), r"batch\['labels'\] has"),
        (
            _edited("input_ids", lambda t: t.float()),
            r"batch\['input_ids'\] must be a 1-D int64 or int32",
        ),
        (
            _edited("labels", lambda t: t.view(1, -1)),
            r"batch\['labels'\] must be a 1-D signed integer",
        ),
        # bool is not an integer dtype: F.embedding, the rotary lookup and the loss fail on it
        (
            _edited("input_ids", torch.Tensor.bool),
            r"batch\['input_ids'\] .* got \(\d+,\) torch.bool",
        ),
        (
            _edited("position_ids", torch.Tensor.bool),
            r"batch\['position_ids'\] must be a 1-D int64 or int32",
        ),
        (_edited("labels", torch.Tensor.bool), r"batch\['labels'\] must be a 1-D signed integer"),
        (_edited("labels", lambda t: t.clamp_min(-1)), "label -1 is neither -100"),
        (
            _edited("labels", lambda t: t.clamp_min(0) + VOCAB),
            rf"label \d+ is neither -100 .*vocab_size {VOCAB}",
        ),
    ],
)
def test_a_batch_the_layers_would_fail_on_is_one_value_error(batch, match):
    """Each of these was a raw torch error (IndexError, a shape mismatch, a target dtype)."""
    with pytest.raises(ValueError, match=match):
        _model()(batch)


def test_int32_labels_and_an_empty_batch_run():
    model = _model()
    batch = make_batch(DOCS)
    expected = model(batch).loss
    batch["labels"] = batch["labels"].int()
    torch.testing.assert_close(model(batch).loss, expected)
    empty = {
        "input_ids": torch.zeros(0, dtype=torch.int64),
        "position_ids": torch.zeros(0, dtype=torch.int64),
        "labels": torch.zeros(0, dtype=torch.int64),
        "cu_seqlens": torch.zeros(2, dtype=torch.int32),
    }
    out = model(empty)
    assert out.logits.shape == (0, VOCAB) and out.loss.item() == 0.0


def test_the_model_ignores_the_label_the_loader_writes():
    # attention/ imports nothing of packtool (the GPU image lacks its dependencies), so it keeps
    # its own copy of the batch contract's ignore label: the two must never differ.
    import loader
    from attention import model
    from packtool.dataset.columns import IGNORE_INDEX

    assert model.IGNORE_INDEX == IGNORE_INDEX == loader.IGNORE_INDEX == -100


@pytest.mark.parametrize("value", ["4", "abc", 4.9, 9.0, True, [4], torch.tensor(9), -1])
def test_batch_max_seqlen_is_checked_as_varlen_attention_checks_it(value):
    # It was int(value or longest): "4", 4.9 (to 4) and tensor(9) were taken, "abc" and [4]
    # gave a raw ValueError / TypeError that named no key.
    with pytest.raises(ValueError, match=r"max_seqlen must be an int >= 0 or None, got "):
        _model()({**make_batch(DOCS), "max_seqlen": value})


def test_batch_max_seqlen_zero_is_a_value_not_absent():
    with pytest.raises(ValueError, match=r"batch max_seqlen 0 is below its longest document \(9\)"):
        _model()({**make_batch(DOCS), "max_seqlen": 0})
    model, batch = _model(), make_batch(DOCS)
    expected = model(batch).logits
    for value in (None, 9, 100):  # None and a missing key: the longest document
        torch.testing.assert_close(model({**batch, "max_seqlen": value}).logits, expected)
    del batch["max_seqlen"]
    torch.testing.assert_close(model(batch).logits, expected)


def test_auto_in_the_model_counts_only_non_empty_documents():
    # 4 documents of 64 tokens: 256^2 > 4096 * 4, so sdpa; with cu_seqlens padded to 20 entries
    # (static shapes) the 16 empty ones were counted and tipped the choice to dense.
    batch = make_batch([[1] * 64] * 4)
    padded = {**batch, "cu_seqlens": torch.cat([batch["cu_seqlens"], torch.full((16,), 256)])}
    padded["cu_seqlens"] = padded["cu_seqlens"].int()
    model = _model()
    assert model(batch).backend == model(padded).backend == "sdpa"


def test_the_models_auto_choice_is_logged_like_varlen_attentions(caplog):
    # The model resolves auto once per batch and passes the name to each layer, so the layers'
    # varlen_attention never logged it: docs/attention.md promised a DEBUG line that never came.
    model, batch = _model(), make_batch(DOCS)
    with caplog.at_level(logging.DEBUG, logger="attention.varlen"):
        out = model(batch)
    lines = [r.getMessage() for r in caplog.records if r.name == "attention.varlen"]
    assert len(lines) == 1 and lines[0].startswith(f"Transformer auto -> {out.backend} (cpu: ")
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="attention.varlen"):
        _model("sdpa")(batch)  # an explicit backend is no choice: nothing logged
    assert not [r for r in caplog.records if r.name == "attention.varlen"]


def test_position_ids_that_do_not_restart_where_cu_seqlens_says_are_refused():
    # Documents [2, 4] with the positions of [3, 3]: taken, and document 2's logits were off by
    # up to 9.7 (its rotary angles came from another packing).
    batch = make_batch([[1, 2], [3, 4, 5, 6]])
    batch["position_ids"] = torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match=r"^position_ids\[2\] is 2 where document 1 .* expects 0"):
        _model()(batch)


def _collated(lengths, pad, extra_docs, limit):
    from loader.collate import collate
    from loader.record import Documents

    tokens = np.arange(sum(lengths), dtype=np.int64) % VOCAB
    docs = Documents(tokens, np.array(lengths, np.int64), np.arange(len(lengths)))
    pad_tokens = sum(lengths) + pad if pad or extra_docs else None
    pad_docs = len(lengths) + (pad > 0) + extra_docs if pad_tokens is not None else None
    return collate(docs, pad_tokens=pad_tokens, pad_docs=pad_docs, position_limit=limit)


LENGTHS = st.lists(st.integers(1, 12), min_size=1, max_size=6)
PADDING = (st.integers(0, 40), st.integers(0, 3), st.one_of(st.none(), st.integers(1, 9)))


@settings(max_examples=40, deadline=None)
@given(LENGTHS, *PADDING)
def test_collate_batches_are_accepted_with_their_wrapping_padding(lengths, pad, extra, limit):
    # Static-shape padding is one pseudo-document whose positions wrap at position_limit (here
    # up to 40 tokens at a limit of 1..9), then empty cu_seqlens entries.
    batch = _collated(lengths, pad, extra, limit)
    out = _model()(batch)
    assert out.logits.shape[0] == batch["input_ids"].numel()


@settings(max_examples=40, deadline=None)
@given(LENGTHS, *PADDING, st.data())
def test_any_position_off_its_documents_count_is_refused(lengths, pad, extra, limit, data):
    batch = _collated(lengths, pad, extra, limit)
    cu = batch["cu_seqlens"].tolist()
    # every token but those of the last non-empty document, whose positions may wrap
    last = max(a for a in cu if a < cu[-1])
    assume(last > 0)
    t = data.draw(st.integers(0, last - 1))
    pos = batch["position_ids"].clone()
    pos[t] = data.draw(st.integers(0, 63).filter(lambda p: p != pos[t]))
    with pytest.raises(ValueError, match=rf"^position_ids\[{t}\] is {int(pos[t])} where document"):
        _model()({**batch, "position_ids": pos})


@pytest.mark.parametrize(
    ("positions", "t"),
    [
        ([0, 1, 0, 1, 0, 1, 2], 4),  # wraps after 2, then after 3: not one period
        ([0, 1, 0, 1, 2, 0, 2], 6),  # period 3, but 0 is followed by 2
        ([0, 1, 1, 2, 3, 4, 5], 2),  # the last document does not start at 0
    ],
)
def test_the_last_document_may_only_wrap_at_one_period(positions, t):
    batch = make_batch([[1, 2], [3, 4, 5, 6, 7]])
    batch["position_ids"] = torch.tensor(positions)
    with pytest.raises(ValueError, match=rf"^position_ids\[{t}\] is"):
        _model()({**batch, "doc_ids": torch.tensor([0, -1])})  # padding: it may wrap
    batch["position_ids"] = torch.tensor([0, 1, 0, 1, 2, 0, 1])  # period 3: padding's wrap
    with pytest.raises(ValueError, match=r"^position_ids\[5\] is 0 where document 1 "):
        _model()(batch)  # every document named in doc_ids: no padding, so no wrap
    _model()({**batch, "doc_ids": torch.tensor([0, -1])})  # the last is padding: accepted
    _model()({k: v for k, v in batch.items() if k != "doc_ids"})  # not known: accepted


def test_a_lost_boundary_between_the_last_documents_is_refused():
    # Two documents of 3 with cu_seqlens [0, 6]: the row's last stretch was taken for one
    # document whose positions wrap as padding's do, and the second attended to the first.
    batch = make_batch([[1, 2, 3, 4, 5, 6]])
    batch["position_ids"] = torch.tensor([0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match=r"^position_ids\[3\] is 0 where document 0 "):
        _model()(batch)
    # Static shapes add empty entries (doc_ids -1) after the last document: they made any
    # wrap of the last non-empty document pass, a lost boundary with them (found by a reader)
    two = make_batch([[1, 2, 3], [4, 5, 6, 7, 8, 9]])
    two["cu_seqlens"] = torch.tensor([0, 3, 9, 9, 9], dtype=torch.int32)
    two["position_ids"] = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    with pytest.raises(ValueError, match=r"^position_ids\[6\] is 0 where document 1 "):
        _model()({**two, "doc_ids": torch.tensor([7, 8, -1, -1])})
    _model()({**two, "doc_ids": torch.tensor([7, -1, -1, -1])})  # the last is padding: it may


@pytest.mark.parametrize("key", ["input_ids", "position_ids", "labels"])
@pytest.mark.parametrize(
    "dtype", [torch.int8, torch.int16, torch.uint8, torch.uint16, torch.uint32, torch.uint64]
)
def test_integer_dtypes_the_layers_cannot_take_are_refused(key, dtype):
    # int16 ids failed in the embedding, uint16 in the check itself; uint8 positions indexed
    # the rotary table as a boolean mask (other logits, no error); uint8 labels wrapped -100.
    batch = make_batch([[1, 2, 3], [4, 5]])
    ok = key == "labels" and dtype in (torch.int8, torch.int16)
    value = (
        batch[key].clamp_min(-100 if ok else 0).to(dtype)
        if ok
        else batch[key].clamp_min(0).to(dtype)
    )
    batch[key] = value
    if ok:
        assert _model()(batch).loss is not None
        return
    with pytest.raises(
        ValueError, match=rf"^batch\['{key}'\] must be a 1-D .* got \(5,\) {dtype}$"
    ):
        _model()(batch)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-5, 30), min_size=1, max_size=8), st.integers(1, 20))
def test_the_position_check_is_safe_on_cu_seqlens_not_yet_validated(cu, total):
    # On a GPU the check is queued before cu_seqlens is validated (its verdict comes back in
    # the same read): any cu_seqlens, unsorted or out of range, must index in bounds (on CPU an
    # out-of-bounds index raises, where CUDA would assert and poison the context).
    from attention import model as model_module

    fault = model_module._position_fault(torch.arange(total), torch.tensor(cu, dtype=torch.int32))
    assert fault.shape == (4,) and -1 <= int(fault[0]) < total
    fault = model_module._label_fault(torch.arange(total), torch.tensor(cu, dtype=torch.int32))
    assert fault.shape == (3,) and -1 <= int(fault[0]) < total


def test_a_label_at_a_documents_last_token_is_refused():
    # labels[4], the last token of document 0, set to the next document's first token: the model
    # trained on it silently (attention keeps documents apart; nothing checked the labels).
    leaked = make_batch(DOCS)
    leaked["labels"][4] = leaked["input_ids"][5]
    with pytest.raises(
        ValueError,
        match=r"^labels\[4\] is 3 at the last token of document 0 \(cu_seqlens\[1\] = 5\): "
        r"nothing of its document follows it, so its label must be -100 ",
    ):
        _model()(leaked)
    unshifted = make_batch(DOCS)  # transformers' layout: labels = input_ids, shifted inside
    unshifted["labels"] = unshifted["input_ids"].clone()
    with pytest.raises(ValueError, match=r"^labels\[4\] is 1 at the last token of document 0"):
        _model()(unshifted)
    # Empty documents (static-shape entries) have no last token; the check finds the next one.
    padded = make_batch([[1, 2, 3], [4, 5]])
    padded["cu_seqlens"] = torch.tensor([0, 0, 3, 3, 5, 5], dtype=torch.int32)
    padded["doc_ids"] = torch.tensor([-1, 0, -1, 1, -1])
    assert _model()(padded).num_sequences.item() == 2
    padded["labels"][4] = 7
    with pytest.raises(ValueError, match=r"^labels\[4\] is 7 at the last token of document 3 "):
        _model()(padded)
