"""RequestBatcher: every request gets its own slice, deadlines, budget, close, bad requests."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.online.packer import OnlinePacker
from loader.online.request_queue import RequestQueue
from loader.online.serving import BatcherClosedError, BatcherTimeoutError, RequestBatcher
from packtool.errors import ConfigError, DataError


class Model:
    """Elementwise model (2x + 1) that records each batch's arrival time and size."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list[tuple[float, int, int]] = []
        self.delay = delay
        self.lock = threading.Lock()

    def __call__(self, batch: dict) -> torch.Tensor:
        cu = batch["cu_seqlens"]
        assert cu.dtype == torch.int32 and int(cu[-1]) == batch["input_ids"].shape[0]
        with self.lock:
            self.calls.append((time.monotonic(), int(cu[-1]), len(cu) - 1))
        if self.delay:
            time.sleep(self.delay)
        return batch["input_ids"] * 2 + 1


def test_concurrent_requests_get_their_own_slice() -> None:
    model = Model()
    results: dict[tuple[int, int], tuple[np.ndarray, object]] = {}
    with RequestBatcher(run_batch=model, max_wait_ms=5, token_budget=256) as batcher:

        def client(t: int) -> None:
            rng = np.random.default_rng(t)
            futs = []
            for i in range(25):
                toks = rng.integers(0, 1000, rng.integers(1, 120))
                futs.append((i, toks, batcher.submit(toks)))
                if i % 5 == 0:
                    time.sleep(0.001)
            for i, toks, f in futs:
                results[(t, i)] = (toks, f.result(timeout=30))

        threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    assert len(results) == 200
    for toks, out in results.values():
        assert out.tolist() == (toks * 2 + 1).tolist()
    assert all(total <= 256 for _, total, _ in model.calls)
    assert sum(n for _, _, n in model.calls) == 200
    s = batcher.stats
    assert s["requests"] == 200 and s["rejected"] == 0 and s["batches"] == len(model.calls)
    assert s["closed"] and s["queued"] == 0


def test_lone_request_waits_the_window_but_not_past_it() -> None:
    model = Model()
    with RequestBatcher(run_batch=model, max_wait_ms=50, token_budget=1000) as batcher:
        t0 = time.monotonic()
        out = batcher.submit([1, 2, 3]).result(timeout=10)
        dispatched = model.calls[0][0] - t0
    assert out.tolist() == [3, 5, 7]
    assert 0.045 <= dispatched <= 0.05 + 0.5  # generous slack for a loaded machine


def test_full_budget_goes_without_waiting() -> None:
    model = Model()
    with RequestBatcher(run_batch=model, max_wait_ms=10_000, token_budget=100) as batcher:
        t0 = time.monotonic()
        a, b = batcher.submit(np.ones(60, np.int64)), batcher.submit(np.ones(40, np.int64))
        a.result(timeout=5), b.result(timeout=5)
        assert time.monotonic() - t0 < 5
    assert model.calls[0][1:] == (100, 2)


class GatedModel(Model):
    """`Model` whose first call holds the model until `release` is set (`started` says it is
    running): what arrives meanwhile is queued, whatever the machine's speed."""

    def __init__(self) -> None:
        super().__init__()
        self.started, self.release = threading.Event(), threading.Event()

    def __call__(self, batch: dict) -> torch.Tensor:
        out = super().__call__(batch)
        if not self.started.is_set():
            self.started.set()
            assert self.release.wait(30)
        return out


def test_gap_filling_and_budget_split() -> None:
    # 70 + 50 > 100: the 50 waits for the next batch, the 30 fills the gap after the 70
    model = GatedModel()
    with RequestBatcher(run_batch=model, max_wait_ms=20, token_budget=100) as batcher:
        first = batcher.submit(np.ones(5, np.int64))  # occupies the model until released
        assert model.started.wait(30)
        futs = [batcher.submit(np.ones(n, np.int64)) for n in (70, 50, 30)]
        model.release.set()
        [f.result(timeout=10) for f in futs + [first]]
    assert [c[1:] for c in model.calls] == [(5, 1), (100, 2), (50, 1)]


class _Held:
    def __init__(self) -> None:
        self.data = np.arange(1, 5)

    def __array__(self, dtype=None, copy=None):
        return self.data


def test_a_caller_refilling_its_buffer_after_submit_does_not_change_its_request() -> None:
    # Before: submit() kept the caller's array (or a CPU tensor's memory): refilled while the
    # request waited, the model got [0, 0, 0, 0] for a request of [1, 2, 3, 4], and a -7
    # written after the per-request id check reached the model and failed another client's
    # batch.
    model = GatedModel()
    batcher = RequestBatcher(run_batch=model, max_wait_ms=float("inf"), token_budget=64)
    first = batcher.submit([1] * 64)  # a full batch, occupying the model: the rest wait
    assert model.started.wait(30)
    buf, tensor = np.arange(1, 5), torch.arange(1, 5)
    futs = [batcher.submit(buf), batcher.submit(tensor)]
    buf[:] = 0
    tensor.zero_()
    ids = np.array([5, 6])
    futs.append(batcher.submit(ids))
    ids[0] = -7
    held = _Held()  # an object handing out the buffer it keeps (__array__)
    futs.append(batcher.submit(held))
    held.data[:] = 0
    other = batcher.submit([1, 2])
    model.release.set()
    batcher.close(timeout=30)  # dispatches the rest
    assert first.result(timeout=0).tolist() == [3] * 64
    assert [f.result(timeout=0).tolist() for f in futs] == [[3, 5, 7, 9]] * 2 + [[11, 13]] + [
        [3, 5, 7, 9]
    ]
    assert other.result(timeout=0).tolist() == [3, 5]


def first_fit(sizes: list[int], budget: int, cap: int | None) -> list[list[int]]:
    """The batches docs/online.md describes, by a plain scan: each batch goes through the queue
    in arrival order and takes every request that still fits (`cap` at most)."""
    queue, batches = list(range(len(sizes))), []
    while queue:
        room, batch = budget, []
        for i in queue:
            if sizes[i] <= room and (cap is None or len(batch) < cap):
                batch.append(i)
                room -= sizes[i]
        if not batch:  # what is left is longer than the budget
            break
        queue = [i for i in queue if i not in batch]
        batches.append(batch)
    return batches


@pytest.mark.parametrize("cap", [None, 3])
def test_a_backlog_is_batched_by_first_fit_looking_at_each_request_once(cap) -> None:
    # Before: every batch walked and rebuilt the whole queue under the lock, so the cost per
    # request grew with the backlog (98 us at 5,000 queued, 547 us at 40,000). Now a batch of k
    # requests visits two paths of the size tree per request (a scan of this backlog would
    # visit ~450,000 entries); the batches are the same first fit as before.
    rng = np.random.default_rng(0)
    sizes = [int(n) for n in rng.integers(1, 120, 3000)] + [1000]  # one fills a whole batch
    batches = []
    model = GatedModel()

    def run(batch: dict) -> torch.Tensor:
        batches.append(batch["doc_ids"].tolist())
        return model(batch)

    batcher = RequestBatcher(
        run_batch=run, max_wait_ms=float("inf"), token_budget=1000, max_requests=cap
    )
    first = batcher.submit([1] * 1000)  # occupies the model: the rest queue up behind it
    assert model.started.wait(30)
    futs = [batcher.submit(np.ones(n, np.int64)) for n in sizes]
    model.release.set()
    batcher.close(timeout=60)
    assert first.result(timeout=0).shape == (1000,)
    assert [f.result(timeout=0).shape[0] for f in futs] == sizes
    queued = [[i - 1 for i in b] for b in batches[1:]]  # request seq 1.. are sizes[0..]
    assert queued == first_fit(sizes, 1000, cap)
    queue = batcher._core.queue  # a few tree nodes per level per request, not the backlog
    levels = queue._n.bit_length()
    assert queue.examined <= (len(sizes) + len(batches)) * 2 * levels


@given(
    sizes=st.lists(st.integers(1, 40), max_size=60),
    budget=st.integers(1, 50),
    cap=st.one_of(st.none(), st.integers(1, 5)),
)
@settings(max_examples=200, deadline=None)
def test_the_request_queue_takes_what_a_scan_would(sizes, budget, cap) -> None:
    queue: RequestQueue[int] = RequestQueue()
    for i, n in enumerate(sizes):
        queue.append(i, n)
    want = first_fit(sizes, budget, cap)
    got = []
    while batch := queue.take(budget, cap):  # RequestBatcher refuses what exceeds the budget
        got.append(batch)
    assert got == want
    levels = queue._n.bit_length()  # each take: per item and once more, a path up the tree
    assert queue.examined <= (sum(map(len, got)) + len(got) + 1) * 2 * levels
    rest = queue.drain()
    assert rest == sorted(rest) and len(queue) == 0
    assert sorted(rest + [i for b in got for i in b]) == list(range(len(sizes)))


def test_a_long_request_grows_the_queue_index_by_its_paths_not_its_size(monkeypatch) -> None:
    """Before: growing the size index recomputed every one of its ~size nodes in Python, under
    the batcher's lock (1.3 s in `submit` for one request of 8M tokens); now only the paths
    above the sizes queued (the rest stay empty). Counted as the node minima taken."""
    from loader.online import request_queue

    calls = 0

    def counting_min(*args):
        nonlocal calls
        calls += 1
        return min(*args)

    queue: RequestQueue[int] = RequestQueue()
    for i, n in enumerate([3, 5, 3, 40]):
        queue.append(i, n)
    monkeypatch.setattr(request_queue, "min", counting_min, raising=False)
    queue.append(4, 2**20)  # 2**21 tree nodes
    assert calls <= 5 * 21
    assert [queue.take(2**20, None) for _ in range(3)] == [[0, 1, 2, 3], [4], []]


def test_close_drains_and_refuses() -> None:
    model = Model()
    batcher = RequestBatcher(run_batch=model, max_wait_ms=10_000, token_budget=1000)
    futs = [batcher.submit([i + 1]) for i in range(3)]
    batcher.close()
    assert [f.result(timeout=0).tolist() for f in futs] == [[3], [5], [7]]
    with pytest.raises(BatcherClosedError, match="closed"):
        batcher.submit([1])


def test_bad_requests_and_model_errors_reach_the_future() -> None:
    def broken(batch: dict) -> torch.Tensor:
        raise RuntimeError("model exploded")

    with RequestBatcher(run_batch=Model(), max_wait_ms=1, token_budget=8) as batcher:
        with pytest.raises(DataError, match="exceeds the token budget 8"):
            batcher.submit(np.arange(9)).result(timeout=5)
        with pytest.raises(DataError, match="empty request"):
            batcher.submit([]).result(timeout=5)
        assert batcher.stats["rejected"] == 2
    with RequestBatcher(run_batch=broken, max_wait_ms=1, token_budget=8) as batcher:
        with pytest.raises(RuntimeError, match="exploded"):
            batcher.submit([1, 2]).result(timeout=5)
        assert batcher.submit([1]).exception(timeout=5) is not None  # thread still serves
    with (
        RequestBatcher(run_batch=lambda b: 3, max_wait_ms=1, token_budget=8) as batcher,
        pytest.raises(DataError, match="first axis"),
    ):
        batcher.submit([1, 2]).result(timeout=5)


@pytest.mark.parametrize("extra", [-1, 5])
def test_a_model_output_of_another_length_fails_the_batch(extra: int) -> None:
    # only a shorter one was refused: 258 rows for 3 tokens handed request one 3 wrong rows
    def model(batch: dict) -> torch.Tensor:
        return torch.zeros(batch["input_ids"].numel() + extra, 2)

    with (
        RequestBatcher(run_batch=model, max_wait_ms=1, token_budget=8) as batcher,
        pytest.raises(DataError, match="expected a first axis of 3 tokens"),
    ):
        batcher.submit([1, 2, 3]).result(timeout=5)


def test_a_padded_batch_still_returns_each_request_its_rows() -> None:
    kw = {"collate_kwargs": {"pad_tokens": 16}, "max_wait_ms": 1, "token_budget": 8}
    with RequestBatcher(run_batch=Model(), **kw) as batcher:
        assert batcher.submit([4, 5]).result(timeout=5).tolist() == [9, 11]


def test_bad_token_ids_fail_only_their_own_request() -> None:
    emb = torch.nn.Embedding(10, 2)
    gate = threading.Event()

    def model(batch: dict) -> torch.Tensor:
        gate.wait(5)
        return emb(batch["input_ids"])

    with RequestBatcher(run_batch=model, max_wait_ms=50, token_budget=64, vocab_size=10) as b:
        good = b.submit([1, 2, 3])
        negative, past = b.submit([4, -1, 5]), b.submit([9, 10])
        gate.set()
        assert good.result(timeout=5).shape == (3, 2)  # its neighbours' ids no longer fail it
        with pytest.raises(DataError, match="must be >= 0, got -1"):
            negative.result(timeout=5)
        with pytest.raises(DataError, match="token id 10 is past the vocabulary"):
            past.result(timeout=5)
    with RequestBatcher(run_batch=lambda b: b["input_ids"], max_wait_ms=50) as b:
        big = b.submit(np.array([2**60 + 1], np.uint64))  # batched beside an int64 request
        small = b.submit(np.array([5], np.int64))
        assert int(big.result(timeout=5)[0]) == 2**60 + 1  # was rounded through float64
        assert int(small.result(timeout=5)[0]) == 5
        with pytest.raises(DataError, match="does not fit int64"):
            b.submit(np.array([2**63 + 3], np.uint64)).result(timeout=5)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"token_budget": 0}, "token_budget"),
        ({"max_wait_ms": -1}, "max_wait_ms"),
        ({"max_wait_ms": "x"}, "max_wait_ms must be a number"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"max_requests": 0}, "max_requests"),
        ({"run_batch": 3}, "callable"),
        # Before: accepted; a batch past int32 cu_seqlens (2**31 - 1 tokens) cannot be built.
        ({"token_budget": 2**31}, "token_budget 2,147,483,648 is more tokens than a batch"),
    ],
)
def test_config_validation(kwargs: dict, match: str) -> None:
    settings = {"run_batch": Model(), **kwargs}
    with pytest.raises(ConfigError, match=match):
        RequestBatcher(**settings)


def test_model_raising_base_exception_does_not_kill_the_thread() -> None:
    def quits(batch: dict) -> torch.Tensor:
        raise SystemExit("model quit")

    with RequestBatcher(run_batch=quits, max_wait_ms=0, token_budget=8) as batcher:
        # Before: the thread died; this future and every later one waited forever.
        with pytest.raises(SystemExit):
            batcher.submit([1, 2]).result(timeout=5)
        assert isinstance(batcher.submit([3]).exception(timeout=5), SystemExit)
        assert batcher.stats["failed_batches"] == 2


def test_infinite_window_waits_for_a_full_budget_or_close() -> None:
    batcher = RequestBatcher(run_batch=Model(), max_wait_ms=float("inf"), token_budget=4)
    # Before: Condition.wait(inf) raised OverflowError in the thread, which then died.
    a, b = batcher.submit([1]), batcher.submit([1, 2, 3])
    assert a.result(timeout=5).tolist() == [3] and b.result(timeout=5).tolist() == [3, 5, 7]
    c = batcher.submit([4])
    time.sleep(0.1)
    assert not c.done()
    batcher.close(timeout=5)
    assert c.result(timeout=0).tolist() == [9]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        # Before: each of these failed every batch (every request) at its first model call.
        ({"collate_kwargs": {"pad_tokn": 8}}, r"collate_kwargs \['pad_tokn'\] unknown"),
        ({"collate_kwargs": {"pad_tokens": 4}}, "pad_tokens=4 is smaller than token_budget=8"),
        ({"collate_kwargs": {"pad_tokens": 8, "pad_docs": 1}}, "leaves no room"),
        # A TypeError from the checks themselves, before.
        (
            {"collate_kwargs": {"pad_tokens": "64"}},
            r"pad_tokens must be an integer from 1 to 2\*\*63-1, got '64'",
        ),
        (
            {"collate_kwargs": {"pad_docs": "4"}},
            r"pad_docs must be an integer from 1 to 2\*\*63-1, got '4'",
        ),
        ({"collate_kwargs": {"seq_idx": "yes"}}, "seq_idx must be True or False"),
        # Before: accepted, then every batch failed with collate's ValueError.
        ({"collate_kwargs": {"layout": "HF"}}, "layout must be 'packtool' or 'hf', got 'HF'"),
        # Before: dict()'s bare TypeError / ValueError.
        ({"collate_kwargs": [1]}, "collate_kwargs must be a dict .*, got list"),
        ({"collate_kwargs": "hf"}, "collate_kwargs must be a dict .*, got str"),
        # Before: accepted, then every batch failed with torch's "can't allocate memory".
        ({"collate_kwargs": {"pad_tokens": 2**40}}, "cu_seqlens is int32, so at most"),
    ],
)
def test_collate_kwargs_are_checked_upfront(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RequestBatcher(run_batch=Model(), token_budget=8, **kwargs)


def test_pad_docs_caps_the_requests_per_batch() -> None:
    model = Model(delay=0.2)
    kw = {"pad_tokens": 16, "pad_docs": 3}  # 2 requests + the padding pseudo-document
    with RequestBatcher(
        run_batch=model, max_wait_ms=50, token_budget=16, collate_kwargs=kw
    ) as batcher:
        first = batcher.submit([9])  # keeps the model busy while the next five queue up
        futs = [batcher.submit([i + 1]) for i in range(5)]
        # Before: the five went into one batch, which collate refused (6 > pad_docs): all failed.
        assert [f.result(timeout=10).tolist() for f in futs] == [[3], [5], [7], [9], [11]]
        first.result(timeout=10)
    assert max(n for _, _, n in model.calls) == 3  # cu_seqlens has pad_docs + 1 entries


def test_requests_of_several_sequences_and_device_tensors() -> None:
    with RequestBatcher(run_batch=Model(), max_wait_ms=0, token_budget=16) as batcher:
        # Before: a (2, 3) batch was flattened into one request of 6 tokens.
        with pytest.raises(DataError, match=r"one sequence of token ids, got shape \(2, 3\)"):
            batcher.submit(torch.ones(2, 3, dtype=torch.long)).result(timeout=5)
        assert batcher.submit(torch.tensor([[1, 2]])).result(timeout=5).tolist() == [3, 5]
        # Ragged lists (a ValueError from submit itself) and a (2, 1) batch (taken as one
        # request of 2 tokens) are several sequences too.
        with pytest.raises(DataError, match="one sequence of token ids"):
            batcher.submit([[1, 2], [3]]).result(timeout=5)
        with pytest.raises(DataError, match=r"one sequence of token ids, got shape \(2, 1\)"):
            batcher.submit(np.array([[1], [2]])).result(timeout=5)
        x = torch.ones(2, requires_grad=True)  # .numpy() refuses a tensor that tracks grad
        assert batcher.submit(x.long()).result(timeout=5).tolist() == [3, 3]
        # Before: bfloat16 (numpy has no such dtype) raised a bare TypeError from submit()
        # itself; a grad-tracking float tensor reached the integer check only through .detach().
        for tensor in (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), torch.ones(2) * x):
            with pytest.raises(DataError, match="request token ids must be integers, got"):
                batcher.submit(tensor).result(timeout=5)


def test_a_single_value_is_not_served_as_a_one_token_request() -> None:
    # Before: submit(5) and submit(np.int64(5)) were served as the request [5].
    expected = r"a request is one 1-d array of token ids, got a single value \(5\)"
    with RequestBatcher(run_batch=Model(), max_wait_ms=0, token_budget=16) as batcher:
        for bad in (5, np.int64(5), np.array(5), torch.tensor(5)):
            with pytest.raises(DataError, match=expected):
                batcher.submit(bad).result(timeout=5)
        assert batcher.submit([5]).result(timeout=5).tolist() == [11]


def test_a_dropped_batcher_serves_its_queue_and_stops_its_thread() -> None:
    import gc

    def submit_and_drop() -> object:
        batcher = RequestBatcher(run_batch=Model(), max_wait_ms=60_000, token_budget=16)
        return batcher.submit([1, 2])

    before = {t.ident for t in threading.enumerate()}
    fut = submit_and_drop()
    gc.collect()
    # Before: nothing referenced the batcher but its own thread, which waited forever.
    assert fut.result(timeout=5).tolist() == [3, 5]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        extra = [
            t for t in threading.enumerate() if t.ident not in before and t.name == "RequestBatcher"
        ]
        if not extra:
            break
        time.sleep(0.01)
    assert not extra


def test_hf_layout_and_list_outputs_give_each_request_its_rows() -> None:
    # Before: with layout="hf" every request failed ("returned Tensor of shape (1, 2); expected
    # a first axis of 2 tokens"), and a list output, "something indexable", was refused.
    def hf_model(batch: dict) -> torch.Tensor:
        assert batch["input_ids"].shape[0] == 1 and "cu_seq_lens_q" in batch
        return (batch["input_ids"] * 2 + 1)[..., None].expand(-1, -1, 3)  # (1, T, 3) logits

    with RequestBatcher(
        run_batch=hf_model, max_wait_ms=20, token_budget=16, collate_kwargs={"layout": "hf"}
    ) as batcher:
        futs = [batcher.submit([i, i + 1]) for i in (1, 5, 9)]
        for i, fut in zip((1, 5, 9), futs, strict=True):
            out = fut.result(timeout=10)
            assert out.shape == (2, 3) and out[:, 0].tolist() == [2 * i + 1, 2 * i + 3]
    with RequestBatcher(
        run_batch=lambda b: b["input_ids"].tolist(), max_wait_ms=20, token_budget=16
    ) as batcher:
        futs = [batcher.submit([1, 2, 3]), batcher.submit([4])]
        assert [f.result(timeout=10) for f in futs] == [[1, 2, 3], [4]]
    with (
        RequestBatcher(run_batch=lambda b: [0], max_wait_ms=1, token_budget=16) as batcher,
        pytest.raises(DataError, match="run_batch returned list of 1 entries; expected 3"),
    ):
        batcher.submit([1, 2, 3]).result(timeout=10)


def test_times_take_numpy_numbers() -> None:
    # Before: np.int64(5) or np.float32(5) as max_wait_ms (or exit_timeout) was a ConfigError
    # "must be a number", though token_budget takes numpy integers.
    for wait in (np.int64(5), np.float32(5.0)):
        with RequestBatcher(run_batch=Model(), max_wait_ms=wait, exit_timeout=np.float32(5)) as b:
            assert b.max_wait == 0.005
            assert b.submit([1, 2]).result(timeout=5).tolist() == [3, 5]  # 2x + 1
            b.close(timeout=np.int64(5))


def test_a_meta_or_sparse_tensor_is_a_data_error_naming_it() -> None:
    # Before: torch's NotImplementedError (meta) on the future, or "request token ids must be
    # integers, got torch.int64" (sparse); the packer's documents the same.
    with RequestBatcher(run_batch=Model(), max_wait_ms=1) as b:
        meta = b.submit(torch.empty(3, dtype=torch.long, device="meta"))
        with pytest.raises(DataError, match="^request token ids: a tensor on the meta device"):
            meta.result(timeout=5)
        sparse = b.submit(torch.tensor([1, 2]).to_sparse())
        with pytest.raises(DataError, match="must be a dense tensor, got layout torch.sparse_coo"):
            sparse.result(timeout=5)
    with pytest.raises(DataError, match="^document 0: token ids: a tensor on the meta device"):
        OnlinePacker(max_len=8).push_docs([torch.empty(3, dtype=torch.long, device="meta")])


def test_counts_take_numpy_integers_and_refuse_bools_and_huge_ids() -> None:
    # Before: token_budget=np.int64(64) was refused ("got np.int64(64)"), max_requests=True
    # taken as 1, and an id past uint64 was reported as "got dtype object".
    with RequestBatcher(
        run_batch=lambda b: b["input_ids"],
        max_wait_ms=1,
        token_budget=np.int64(64),
        max_requests=np.int32(4),
        vocab_size=np.int64(100),
    ) as b:
        assert b.submit([1, 2]).result(timeout=5).tolist() == [1, 2]
        with pytest.raises(DataError, match=f"request token id {2**64} does not fit int64"):
            b.submit([1, 2**64]).result(timeout=5)
        with pytest.raises(DataError, match="must be >= 0, got -"):
            b.submit([1, -(2**64)]).result(timeout=5)
    for name in ("token_budget", "max_requests", "vocab_size"):
        with pytest.raises(ConfigError, match=f"{name} must be an integer >= 1"):
            RequestBatcher(run_batch=lambda b: b, **{name: True})


def test_stats_computes_its_percentiles_without_the_queue_lock(monkeypatch) -> None:
    """Before: `stats` held the queue lock while it took percentiles of up to 100k waits, so
    `submit` and the serving thread waited on every read of it."""
    batcher = RequestBatcher(run_batch=Model(), max_wait_ms=0)
    for f in [batcher.submit([1]) for _ in range(20)]:
        f.result(timeout=5)
    free = []
    percentile = np.percentile

    def take_the_lock() -> None:  # on another thread, as submit() would
        lock = batcher._core.cond
        free.append(lock.acquire(timeout=2))
        if free[-1]:
            lock.release()

    def probe(*args, **kwargs):
        other = threading.Thread(target=take_the_lock)
        other.start()
        other.join()
        return percentile(*args, **kwargs)

    monkeypatch.setattr(np, "percentile", probe)
    s = batcher.stats
    monkeypatch.undo()
    batcher.close()
    assert free == [True] and s["requests"] == 20 and s["wait_ms_max"] >= s["wait_ms_p50"]


def test_close_called_by_the_model_on_the_batchers_thread() -> None:
    """Before: close() from run_batch (the batcher's own thread) failed the batch with
    RuntimeError('cannot join current thread')."""
    holder = {}

    def closing(batch: dict) -> torch.Tensor:
        holder["batcher"].close()
        return batch["input_ids"] * 2 + 1

    batcher = holder["batcher"] = RequestBatcher(run_batch=closing, max_wait_ms=1)
    assert batcher.submit([1, 2]).result(timeout=5).tolist() == [3, 5]
    batcher._thread.join(5)
    assert not batcher._thread.is_alive()
    with pytest.raises(BatcherClosedError, match="closed"):
        batcher.submit([1])


def _hung_batcher(**kw):
    """A batcher whose model hangs until `release` is set; `called` is set when it starts."""
    called, release = threading.Event(), threading.Event()

    def hang(batch: dict) -> torch.Tensor:
        called.set()
        release.wait(30)
        return batch["input_ids"] * 2 + 1

    return RequestBatcher(run_batch=hang, max_wait_ms=1, **kw), called, release


def test_leaving_the_with_block_is_bounded_when_the_model_hangs() -> None:
    """Before: __exit__ called close() with no timeout and blocked forever on a hung model."""
    batcher, called, release = _hung_batcher(exit_timeout=0.3)
    start = time.monotonic()
    try:
        with (
            pytest.raises(
                BatcherTimeoutError,
                match=r"^RequestBatcher: the model call \(run_batch\) is still running after 0\.3 s; "
                r"its thread goes on in the background \(1 request queued\)$",
            ),
            batcher,
        ):
            fut = batcher.submit([1, 2])
            assert called.wait(5)
            batcher.submit([3])  # queued behind the hung call
    finally:
        release.set()
    assert time.monotonic() - start < 10
    assert fut.result(timeout=5).tolist() == [3, 5]  # served once the model returns
    assert isinstance(BatcherTimeoutError("x"), TimeoutError)


def test_leaving_the_with_block_on_a_hung_model_waits_one_exit_timeout() -> None:
    """Before: with exit_timeout=1 the BatcherTimeoutError came at 2.2 s: the first wait was
    taken for progress (no batch count to compare with yet), so a second one followed."""
    batcher, called, release = _hung_batcher(exit_timeout=1)
    joins = []
    join = batcher._thread.join

    def counted(timeout=None):
        joins.append(timeout)
        join(timeout)

    batcher._thread.join = counted
    try:
        with pytest.raises(BatcherTimeoutError, match=r"still running after 1 s"), batcher:
            batcher.submit([1])
            assert called.wait(5)
            start = time.monotonic()
        waited = time.monotonic() - start
    finally:
        release.set()
    assert joins == [1]  # one wait of exit_timeout: no batch finished in it
    assert waited < 2  # two waits took 2 s at least


def test_close_with_a_timeout_says_the_model_call_is_still_running() -> None:
    batcher, called, release = _hung_batcher()
    try:
        fut = batcher.submit([1])
        assert called.wait(5)
        with pytest.raises(BatcherTimeoutError, match=r"still running after 0\.2 s"):
            batcher.close(timeout=0.2)
    finally:
        release.set()
    assert fut.result(timeout=5).tolist() == [3]
    batcher.close(timeout=5)  # the thread has ended: no error


def test_an_error_leaving_the_with_block_is_kept_and_a_hung_model_warned() -> None:
    batcher, called, release = _hung_batcher(exit_timeout=0.2)
    try:
        warned = pytest.warns(UserWarning, match=r"the model call \(run_batch\) is still running")
        with warned, pytest.raises(KeyError, match="mine"), batcher:
            batcher.submit([1])
            assert called.wait(5)
            raise KeyError("mine")
    finally:
        release.set()


def test_leaving_the_with_block_waits_for_a_long_drain_that_makes_progress() -> None:
    """The bound is on a model call: a queue that takes longer to drain, batch after batch,
    is served whole."""
    model = Model(delay=0.05)
    batcher = RequestBatcher(run_batch=model, max_wait_ms=10_000, token_budget=2, exit_timeout=1)
    with batcher:
        futs = [batcher.submit([i, i]) for i in range(40)]  # 40 batches, ~2 s in all
    assert [f.result(timeout=0).tolist() for f in futs] == [[2 * i + 1] * 2 for i in range(40)]


@pytest.mark.parametrize("bad", [-1, -0.5, True, "5", float("nan")])
def test_exit_timeout_and_close_timeout_are_checked(bad) -> None:
    with pytest.raises(ConfigError, match="exit_timeout must be a number of seconds >= 0 or None"):
        RequestBatcher(run_batch=Model(), exit_timeout=bad)
    batcher = RequestBatcher(run_batch=Model(), exit_timeout=float("inf"))  # inf: no bound
    with pytest.raises(ConfigError, match="timeout must be a number of seconds >= 0 or None"):
        batcher.close(timeout=bad)
    batcher.close(timeout=float("inf"))


@pytest.mark.parametrize(
    ("request_", "what"),
    [
        ((i for i in range(3)), "a generator"),
        ({1: 2}, "a dict"),
        ({1, 2}, "a set"),
        (iter([1, 2]), "a list_iterator"),
    ],
)
def test_a_request_that_is_not_a_sequence_is_named_for_what_it_is(request_, what) -> None:
    """Before: a generator or a dict was refused as 'a single value (<generator ...>)'."""
    with RequestBatcher(run_batch=Model(), max_wait_ms=1) as batcher:
        with pytest.raises(
            DataError,
            match=rf"^a request must be a sequence of token ids \(list/array\), got {what}$",
        ):
            batcher.submit(request_).result(timeout=5)
        assert batcher.submit([1, 2]).result(timeout=5).tolist() == [3, 5]
