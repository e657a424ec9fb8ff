"""Length statistics: exact values on tiny inputs, bound properties, sample_data end to end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.errors import ConfigError, DataError
from packtool.pack.kernels import ffd_assign
from packtool.stats.lengths import (
    SUGGESTION_FALLBACK,
    SUGGESTION_RULE,
    Candidate,
    StatsConfig,
    compute_stats,
    gini,
    length_stats,
    lower_bound_l1,
    lower_bound_l2,
    split_lengths,
    suggest_max_len,
)
from packtool.stats.report import render_report

SAMPLE = "sample_data/corpus.jsonl"


def optimal_rows(lengths: list[int], max_len: int) -> int:
    """Exact bin packing by exhaustive search (tiny inputs only)."""
    items = sorted(lengths, reverse=True)
    best = len(items)

    def place(i: int, fills: list[int]) -> None:
        nonlocal best
        if len(fills) >= best:
            return
        if i == len(items):
            best = len(fills)
            return
        seen = set()
        for r, fill in enumerate(fills):
            if fill + items[i] <= max_len and fill not in seen:
                seen.add(fill)
                fills[r] += items[i]
                place(i + 1, fills)
                fills[r] -= items[i]
        fills.append(items[i])
        place(i + 1, fills)
        fills.pop()

    place(0, [])
    return best


# --- exact values ---


def test_gini_exact():
    assert gini([5, 5, 5, 5]) == 0.0
    assert gini([1, 3]) == pytest.approx(0.25)  # mean |xi - xj| / (2 mean) = 1 / 4
    assert gini([1, 1, 1, 5]) == pytest.approx(0.375)
    assert gini([0, 0, 0, 8]) == pytest.approx(0.75)  # one holds all: (n - 1) / n
    assert gini([7, 1, 1, 1]) == gini([1, 1, 7, 1])  # order does not matter


def test_percentiles_are_nearest_rank():
    s = length_stats(np.arange(1, 11), StatsConfig(max_len=16, candidates=(16,)))
    assert (s.min, s.p50, s.p90, s.p99, s.max) == (1, 5, 9, 10, 10)
    assert s.mean == 5.5
    assert (s.documents, s.tokens) == (10, 55)


def test_split_lengths():
    assert split_lengths([10, 3, 16, 0], 8).tolist() == [8, 2, 3, 8, 8]
    assert split_lengths([3, 0, 5], 8).tolist() == [3, 5]


def test_lower_bounds_known_cases():
    # L1 is loose when documents longer than max_len/2 cannot share rows.
    assert lower_bound_l1([6, 6, 6, 6], 10) == 3
    assert lower_bound_l2([6, 6, 6, 6], 10) == 4
    # Only k > 0 catches this one: the 9s leave room 1 each, the 2 needs a third row.
    assert lower_bound_l1([9, 9, 2], 10) == 2
    assert lower_bound_l2([9, 9, 2], 10) == 3
    # Tight case: 6+4 pairs.
    assert lower_bound_l2([6, 6, 6, 4, 4, 4], 10) == 3
    # Long documents are split first: 25 -> 10, 10, 5.
    assert lower_bound_l1([25], 10) == 3
    assert lower_bound_l2([25, 4], 10) == 3  # 10 | 10 | 5 + 4
    assert lower_bound_l2([25, 6], 10) == 4  # 10 | 10 | 6 | 5: nothing pairs
    assert lower_bound_l2([], 10) == 0


def test_padding_waste_exact():
    s = length_stats([3, 5, 2, 8], StatsConfig(max_len=8, batch_size=2, candidates=(8,)))
    assert s.pad_to_max_len_slots == 32  # 4 documents x 8
    assert s.pad_to_max_len_waste == pytest.approx(14 / 32)
    assert s.pad_per_batch_slots == 2 * 5 + 2 * 8  # batches (3, 5) and (2, 8)
    assert s.pad_per_batch_waste == pytest.approx(8 / 26)


def test_padding_after_split_and_partial_batch():
    # [10, 3] at max_len 8 -> chunks 8, 2, 3; batches (8, 2) -> 16 slots, (3) -> 3 slots.
    s = length_stats([10, 3], StatsConfig(max_len=8, batch_size=2, candidates=(8,)))
    assert (s.long_documents, s.long_tokens, s.chunks) == (1, 10, 3)
    assert s.long_chunks == 2  # the 10-token document's pieces (the corpus has 3 in all)
    assert s.to_dict()["longer_than_max_len"] == {
        "documents": 1,
        "tokens": 10,
        "chunks": 2,
        "chunks_after_split": 3,
    }
    assert s.pad_to_max_len_slots == 24
    assert s.pad_per_batch_slots == 19
    assert (s.lower_bound_l1, s.lower_bound_l2, s.ffd_rows) == (2, 2, 2)
    assert s.ffd_efficiency == pytest.approx(13 / 16)


def test_histograms():
    s = length_stats([1, 2, 3, 4, 8, 33, 64, 65], StatsConfig(max_len=64, candidates=(64,)))
    log2 = [(b["lo"], b["hi"], b["documents"], b["tokens"]) for b in s.histogram_log2]
    assert log2 == [
        (1, 1, 1, 1),
        (2, 3, 2, 5),
        (4, 7, 1, 4),
        (8, 15, 1, 8),
        (16, 31, 0, 0),
        (32, 63, 1, 33),
        (64, 127, 2, 129),
    ]
    lin = [(b["lo"], b["hi"], b["documents"]) for b in s.histogram_32]
    assert lin == [(1, 32, 5), (33, 64, 2), (65, 96, 1)]  # empty buckets left out


def test_histogram_starts_at_shortest():
    s = length_stats([300, 700], StatsConfig(max_len=1024, candidates=(1024,)))
    assert [b["lo"] for b in s.histogram_log2] == [256, 512]


def test_candidates_and_suggestion():
    lengths = [100] * 50 + [900] * 50
    s = length_stats(lengths, StatsConfig(max_len=1024, candidates=(256, 1024, 2048)))
    by_len = {c.max_len: c for c in s.candidates}
    assert by_len[256].long_documents == 50  # 900 > 256: half the documents split
    assert by_len[256].chunks == 50 + 50 * 4
    assert by_len[1024].long_documents == 0
    assert by_len[1024].rows == ffd_assign(lengths, 1024)[2]
    # 256 splits half the documents, so it is not eligible; 1024 and 2048 pack about as well.
    assert s.suggested_max_len == 1024


def test_suggestion_rule():
    def cand(max_len, long_docs, eff):
        return Candidate(
            max_len=max_len,
            long_documents=long_docs,
            chunks=0,
            tokens=0,
            lower_bound_rows=0,
            rows=0,
            efficiency=eff,
            pad_to_max_len_waste=0.0,
        )

    cands = [cand(512, 0, 0.90), cand(1024, 0, 0.985), cand(2048, 0, 0.99)]
    assert suggest_max_len(cands, 1000) == 1024  # within one point of 0.99
    cands = [cand(512, 0, 0.90), cand(1024, 0, 0.975), cand(2048, 0, 0.99)]
    assert suggest_max_len(cands, 1000) == 2048
    cands = [cand(512, 50, 0.999), cand(1024, 10, 0.95), cand(2048, 0, 0.95)]
    assert suggest_max_len(cands, 1000) == 1024  # 512 splits 5% of documents
    cands = [cand(512, 50, 0.999), cand(1024, 20, 0.99)]
    assert suggest_max_len(cands, 1000) == 1024  # none eligible: the largest


def test_the_printed_rule_says_when_no_candidate_splits_few_enough():
    # Every candidate splits more than 1% of the documents: the largest is suggested, and the
    # rule printed (and in the JSON) said "among candidates that split at most 1%" all the same.
    lengths = [100] * 90 + [5000] * 10
    s = length_stats(lengths, StatsConfig(max_len=1024, candidates=(512, 1024, 2048)))
    assert s.suggested_max_len == 2048
    assert s.suggestion_rule == SUGGESTION_FALLBACK
    assert s.to_dict()["suggestion_rule"] == SUGGESTION_FALLBACK
    assert SUGGESTION_FALLBACK.startswith("no candidate splits at most 1% of documents")
    assert render_report(s).endswith(f"suggested max length: 2,048 (* : {SUGGESTION_FALLBACK})")
    kept = length_stats([100] * 99 + [5000], StatsConfig(max_len=1024, candidates=(512, 1024)))
    assert (kept.suggested_max_len, kept.suggestion_rule) == (512, SUGGESTION_RULE)
    assert render_report(kept).endswith(f"(* : {SUGGESTION_RULE})")


def test_to_dict_is_stable_and_json_ready():
    import json

    s = length_stats([3, 5, 2, 8], StatsConfig(max_len=8, batch_size=2, candidates=(8, 16)))
    d = json.loads(json.dumps(s.to_dict()))
    assert list(d) == [
        "max_len",
        "long_docs",  # added 2026-12-08
        "inputs",
        "documents",
        "tokens",
        "length",
        "gini",
        "longer_than_max_len",
        "padding",
        "lower_bound_rows",
        "packed",
        "candidates",
        "suggested_max_len",
        "suggestion_rule",
        "histogram_log2",
        "histogram_32",
    ]
    assert d["packed"] == {
        "algorithm": "ffd",
        "tokens": 18,  # added 2026-12-08: what the efficiency divides
        "rows": 3,
        "efficiency": 18 / 24,
        "rows_over_l2": 1.0,
    }
    assert d["lower_bound_rows"] == {"l1": 3, "l2": 3}
    assert "lengths" not in d


def test_numpy_ints_in_the_config_give_a_json_ready_dict():
    # StatsConfig accepted NumPy ints and kept them: to_dict() then held an int64 max_len and
    # json.dumps raised TypeError.
    import json

    config = StatsConfig(
        max_len=np.int64(512), batch_size=np.int32(2), candidates=(np.int64(512), np.uint16(1024))
    )
    assert (type(config.max_len), type(config.batch_size)) == (int, int)
    assert config.candidates == (512, 1024) and {type(c) for c in config.candidates} == {int}
    d = json.loads(json.dumps(length_stats([5, 600, 7], config).to_dict()))
    assert (d["max_len"], d["padding"]["pad_per_batch"]["batch_size"]) == (512, 2)
    assert [c["max_len"] for c in d["candidates"]] == [512, 1024]


def test_render_mentions_the_figures():
    text = render_report(length_stats([3, 5, 2, 8], StatsConfig(max_len=8, batch_size=2)))
    assert "documents   4" in text
    assert "L1 3  L2 3" in text
    assert "suggested max length" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        # The lengths `packtool pack` refuses, with its message (PackConfig).
        ({"max_len": 0}, "^max_len must be an integer >= 2, got 0$"),
        ({"max_len": 1}, "^max_len must be an integer >= 2, got 1$"),
        ({"max_len": 1.5}, "^max_len must be an integer >= 2, got 1.5$"),
        ({"candidates": (512, 1)}, "^candidate max length must be an integer >= 2, got 1$"),
        ({"batch_size": 0}, "^batch_size must be a positive integer, got 0$"),
        # Before: accepted, then a TypeError (slice indices) in length_stats.
        ({"batch_size": 2.5}, "^batch_size must be a positive integer, got 2.5$"),
        ({"batch_size": None}, "^batch_size must be a positive integer, got None$"),
        ({"batch_size": "8"}, "^batch_size must be a positive integer, got '8'$"),
        ({"batch_size": True}, "^batch_size must be a positive integer, got True$"),
        ({"candidates": ()}, "candidates must be a non-empty tuple"),
        ({"candidates": (512, -1)}, "candidates must be a non-empty tuple"),
        # Before: TypeErrors ('<' between str and int; 'int' object is not iterable).
        ({"candidates": ("512",)}, "candidates must be a non-empty tuple"),
        ({"candidates": 512}, "candidates must be a non-empty tuple"),
        ({"long_docs": "keep"}, "^long_docs must be one of split, truncate, drop, got 'keep'$"),
        ({"long_docs": None}, "^long_docs must be one of split, truncate, drop, got None$"),
    ],
)
def test_config_validation(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        StatsConfig(**kwargs)


def test_max_lengths_that_bos_and_eos_fill_are_refused_as_pack_refuses_them(tmp_path):
    from packtool.tokenize.tokenize import tokenize_corpus
    from packtool.tokenizer.tokenizers import load_tokenizer

    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "abc"}\n')
    both = load_tokenizer("byte", bos="default")  # BOS + EOS: 2 tokens a document
    tokenize_corpus([src], tmp_path / "tok.parquet", tokenizer=both, progress=False)
    packs_message = (
        "--max-len 2 / max_len=2 leaves no room for text: every document already takes 2 "
        "tokens for BOS and EOS; use --max-len 3 / max_len=3 or more"
    )
    # Raw input with that tokenizer, and tokenized input that recorded it.
    for inputs, tokenizer in [([src], both), ([tmp_path / "tok.parquet"], None)]:
        with pytest.raises(ConfigError) as info:
            compute_stats(inputs, StatsConfig(max_len=2, candidates=(64,)), tokenizer=tokenizer)
        assert str(info.value) == packs_message
        with pytest.raises(ConfigError, match="^candidate max length 2 leaves no room for text"):
            compute_stats(inputs, StatsConfig(max_len=64, candidates=(2, 64)), tokenizer=tokenizer)
    # EOS alone leaves one token a row, which pack allows: so does stats.
    s = compute_stats([src], StatsConfig(max_len=2, candidates=(2,)), tokenizer="byte")
    assert (s.tokens, s.chunks) == (4, 2)


@pytest.mark.parametrize("inputs", [[], (), iter([])])
def test_an_empty_list_of_inputs_is_refused_as_such(inputs):
    # It read nothing and said "no documents in " (the inputs' names: none).
    with pytest.raises(ConfigError) as info:
        compute_stats(inputs)
    assert str(info.value) == "no inputs: give at least one file, folder, glob or URL"


@pytest.mark.parametrize("api", ["run_pack", "tokenize_corpus"])
def test_pack_and_tokenize_refuse_an_empty_list_of_inputs_as_such(api, tmp_path):
    # Both read nothing and said "no documents in " (naming nothing), as compute_stats did.
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig
    from packtool.tokenize.tokenize import tokenize_corpus

    with pytest.raises(ConfigError, match=r"^no inputs: give at least one file"):
        if api == "run_pack":
            run_pack(RunConfig(inputs=(), out_dir=str(tmp_path / "o"), pack=PackConfig(max_len=8)))
        else:
            tokenize_corpus([], tmp_path / "t")
    assert not (tmp_path / "o").exists() and not (tmp_path / "t").exists()


def test_bad_lengths():
    with pytest.raises(DataError, match="no documents"):
        length_stats([])
    with pytest.raises(ConfigError, match="negative length -2"):
        length_stats([3, -2])
    with pytest.raises(ConfigError, match="1-D integer array"):
        length_stats([1.5])
    # Before: 2**63 + 5 wrapped to int64 and was called "negative length -9223372036854775803".
    huge = np.array([3, 2**63 + 5], dtype=np.uint64)
    with pytest.raises(ConfigError, match=r"^document 1 has length 9223372036854775813, more"):
        length_stats(huge)
    assert length_stats(np.array([3, 5], dtype=np.uint64)).tokens == 8


@pytest.mark.parametrize("bound", [lower_bound_l1, lower_bound_l2, split_lengths])
@pytest.mark.parametrize("max_len", [0, -1, 2.5, True])
def test_lower_bounds_refuse_a_max_len_as_split_lengths_does(bound, max_len):
    # Before: lower_bound_l1(.., 0) raised ZeroDivisionError, (.., -1) returned -11 and
    # lower_bound_l2(.., 0) returned 0.
    with pytest.raises(ConfigError, match=f"^max_len must be a positive integer, got {max_len}$"):
        bound([5, 6], max_len)


def test_one_path_is_one_input_not_its_characters(tmp_path, monkeypatch):
    """Before: `compute_stats("corpus.jsonl")` read each character as an input ("/" of an
    absolute path walked the whole file system); one str or Path is one input, as for
    `expand_inputs` and `tokenized_batches`."""
    from packtool.tokenize.tokenize import tokenize_corpus

    monkeypatch.chdir(tmp_path)
    Path("c.jsonl").write_text('{"text": "abc"}\n{"text": "hello"}\n')
    want = compute_stats(["c.jsonl"], StatsConfig(max_len=64, candidates=(64,))).to_dict()
    for one in ("c.jsonl", Path("c.jsonl")):
        assert compute_stats(one, StatsConfig(max_len=64, candidates=(64,))).to_dict() == want
    tokenize_corpus(["c.jsonl"], "tok.parquet", progress=False)
    s = compute_stats("tok.parquet", StatsConfig(max_len=64, candidates=(64,)))
    assert (s.inputs["kind"], s.documents, s.tokens) == ("tokenized", 2, 10)


# --- properties ---


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 20).flatmap(
        lambda c: st.tuples(st.just(c), st.lists(st.integers(1, c), min_size=1, max_size=7))
    )
)
def test_bounds_below_optimum(case):
    max_len, lengths = case
    l1, l2 = lower_bound_l1(lengths, max_len), lower_bound_l2(lengths, max_len)
    opt = optimal_rows(lengths, max_len)
    assert l1 <= l2 <= opt <= ffd_assign(lengths, max_len)[2]


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 2000), st.sampled_from([8, 100, 4096]))
def test_bounds_below_ffd_on_random_input(seed, n, max_len):
    rng = np.random.default_rng(seed)
    lengths = np.clip(rng.lognormal(np.log(max_len / 4), 1.2, n), 1, 3 * max_len).astype(np.int64)
    chunks = split_lengths(lengths, max_len)
    l1, l2 = lower_bound_l1(chunks, max_len), lower_bound_l2(lengths, max_len)
    rows = ffd_assign(chunks, max_len)[2]
    assert l1 <= l2 <= rows
    assert l1 == -(-int(lengths.sum()) // max_len)


# --- end to end over sample_data ---


@pytest.fixture(scope="module")
def sample_stats():
    return compute_stats([SAMPLE], StatsConfig(max_len=4096))


def test_sample_data_raw(sample_stats):
    s = sample_stats
    assert s.inputs["kind"] == "raw"
    assert s.inputs["skipped"] == {"empty": 6}
    assert s.documents == 4024
    assert s.tokens == int(s.lengths.sum())
    assert s.long_documents == int((s.lengths > 4096).sum()) > 0
    assert s.lower_bound_l1 <= s.lower_bound_l2 <= s.ffd_rows
    assert 0.95 < s.ffd_efficiency <= 1.0
    assert s.suggested_max_len in {c.max_len for c in s.candidates}
    assert sum(b["documents"] for b in s.histogram_log2) == s.documents
    assert sum(b["documents"] for b in s.histogram_32) == s.documents


def test_sample_data_tokenized_parquet_matches_raw(sample_stats, tmp_path):
    from packtool.tokenize.tokenize import tokenize_corpus

    out = tmp_path / "tok.parquet"
    tokenize_corpus([SAMPLE], out, tokenizer="byte", workers=1, progress=False)
    s = compute_stats([out], StatsConfig(max_len=4096))
    assert s.inputs["kind"] == "tokenized"
    assert s.inputs["tokenizer"]["kind"] == "byte"
    d, want = s.to_dict(), sample_stats.to_dict()
    d.pop("inputs")
    want.pop("inputs")
    assert d == want


def test_text_output_draws_the_32_token_histogram():
    # Buckets up to max_len 64: [1, 32] holds 2 documents (full bar), [33, 64] 1 (half bar).
    s = length_stats([1, 32, 33, 100, 200], StatsConfig(max_len=64, candidates=(64,)))
    text = render_report(s)
    assert "length histogram (32-token buckets up to 64; bar height ~ documents)" in text
    assert "      1-64      |█▄|" in text
    assert "longer than 64: 2 documents" in text


def test_documents_past_max_len_stay_out_of_the_last_histogram_bucket():
    """At max_len 40 the last bucket is [33, 64]: the 40 documents of 51 tokens were drawn in it
    (a full bar under '1-64') and counted again as longer than 40; no document is 33-40 long."""
    s = length_stats([10] * 10 + [51] * 40 + [35], StatsConfig(max_len=40, candidates=(40,)))
    text = render_report(s)
    assert "      1-40      |█▁|" in text  # 10 documents of 10 tokens, 1 of 35
    assert "longer than 40: 40 documents" in text


# --- inputs listed and classified once ---


def _sft_corpus(path: Path) -> Path:
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for i in range(6):
            f.write(json.dumps({"prompt": "q" * (i + 3), "completion": "a" * (2 * i + 1)}) + "\n")
    return path


@pytest.mark.parametrize("kind", ["raw", "records", "tokenized", "tokenized_masked"])
def test_compute_stats_lists_and_classifies_its_inputs_once(tmp_path, monkeypatch, kind):
    """Before: a library `compute_stats` listed its inputs 4 times (input_identity,
    input_columns, inputs_read, then tokenized_batches or read_lengths / read_supervised: each a
    walk of every folder and, for a bucket prefix, a listing of it) and read each tokenized
    file's footer 3 times; docs/architecture.md says the inputs are classified once."""
    import packtool.dataset.tokenized as tokenized_mod
    import packtool.read.corpus as corpus_mod
    from packtool.tokenize.tokenize import tokenize_corpus

    folder = tmp_path / "in"
    if kind == "raw":
        (folder / "a").mkdir(parents=True)
        (folder / "a" / "c.jsonl").write_text('{"text": "abc"}\n{"text": "hello"}\n')
        (folder / "d.jsonl").write_text('{"text": "xyz"}\n')
    elif kind == "records":
        _sft_corpus(folder / "qa.jsonl")
    else:
        src = _sft_corpus(tmp_path / "qa.jsonl")
        if kind == "tokenized":
            src.write_text('{"text": "abc"}\n{"text": "hello"}\n')
        folder.mkdir()
        for name in ("a.parquet", "b.parquet"):
            tokenize_corpus([src], folder / name, progress=False)
    listings, footers = [], []
    real_expand, real_meta = corpus_mod.expand, tokenized_mod.tokenized_meta
    monkeypatch.setattr(corpus_mod, "expand", lambda *x: listings.append(x) or real_expand(*x))
    monkeypatch.setattr(
        tokenized_mod, "tokenized_meta", lambda p: footers.append(p) or real_meta(p)
    )
    s = compute_stats(folder, StatsConfig(max_len=64, candidates=(64,)))
    assert s.inputs["kind"] == ("raw" if kind in ("raw", "records") else "tokenized")
    assert s.inputs["skipped"] == {}  # for tokenized inputs too (a KeyError before)
    assert (s.supervised is not None) == (kind in ("records", "tokenized_masked"))
    assert len(listings) == 1
    assert sorted(map(str, footers)) == sorted(map(str, set(footers)))  # each file once


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("damage", ["negative", "null", "dropped", "wide", "past_int32", "float"])
def test_a_damaged_length_column_is_an_error_with_or_without_a_loss_mask(tmp_path, masked, damage):
    """Before: with a loss mask, stats read `length` without read_lengths' checks: a negative
    length gave "document 1 has negative length -5" (no file named), a null one a numpy
    RuntimeWarning and "negative length -2147483648", a dropped column a pyarrow traceback."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from packtool.tokenize.tokenize import tokenize_corpus

    src = _sft_corpus(tmp_path / "qa.jsonl")
    if not masked:
        src.write_text("".join('{"text": "%s"}\n' % ("x" * (i + 1)) for i in range(6)))
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    tokenize_corpus([src], good, progress=False)
    t = pq.read_table(good)
    assert ("loss_mask" in t.column_names) == masked
    if damage == "dropped":
        t = t.drop_columns(["length"])
    else:
        # (int64 lengths past int32 were wrapped: 2^32 + 7 read as 7, 2^31 + 5 as negative
        # with no file named; float lengths were cut, 9.9 to 9: found by a second reader)
        values = t.column("length").to_pylist()
        kind = {"wide": pa.int64(), "past_int32": pa.int64(), "float": pa.float64()}
        values[1] = {"negative": -5, "null": None, "wide": 2**32 + 7, "past_int32": 2**31 + 5,
                     "float": 9.9}[damage]  # fmt: skip
        i = t.schema.get_field_index("length")
        dtype = kind.get(damage, pa.int32())
        t = t.set_column(i, pa.field("length", dtype), pa.array(values, dtype))
    pq.write_table(t.replace_schema_metadata(pq.read_schema(good).metadata), bad)
    want = {
        "negative": "row 1 has length -5, not a token count",
        "null": "row 1 has no length (null), not a token count",
        "dropped": "no column 'length'",
        "wide": "row 1 has length 4294967303, not a token count",
        "past_int32": "row 1 has length 2147483653, not a token count",
        "float": "column 'length' holds double, not integer token counts",
    }[damage]
    with pytest.raises(DataError) as info:
        compute_stats([bad], StatsConfig(max_len=64, candidates=(64,)))
    assert str(info.value).startswith(f"{bad}: {want}")


def test_a_masked_file_without_its_loss_mask_column_is_an_error(tmp_path):
    # Before: a pyarrow KeyError traceback ('Field "loss_mask" does not exist in schema').
    import pyarrow.parquet as pq

    from packtool.tokenize.tokenize import tokenize_corpus

    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    tokenize_corpus([_sft_corpus(tmp_path / "qa.jsonl")], good, progress=False)
    t = pq.read_table(good).drop_columns(["loss_mask"])
    pq.write_table(t.replace_schema_metadata(pq.read_schema(good).metadata), bad)
    with pytest.raises(DataError, match=f"^{bad}: no column 'loss_mask' \\(columns: doc_id, "):
        compute_stats([bad], StatsConfig(max_len=64, candidates=(64,)))


def test_stats_of_a_raw_corpus_draws_a_bar_while_it_tokenizes(tmp_path, capsys):
    """stats tokenized a whole corpus with nothing on the terminal until its report (pack and
    tokenize draw a bar): it draws one too, on stderr, and leaves none behind."""
    from packtool.stats.lengths import compute_stats

    src = tmp_path / "c.jsonl"
    src.write_text("".join(f'{{"text": "document {i} {"x" * i}"}}\n' for i in range(50)))
    got = compute_stats([src], StatsConfig(max_len=64, candidates=(64,)), progress=True)
    assert got.documents == 50
    err = capsys.readouterr().err
    assert "stats" in err and "docs" in err, err
    compute_stats([src], StatsConfig(max_len=64, candidates=(64,)), progress=False)
    assert capsys.readouterr().err == ""


def test_a_length_cut_into_too_many_chunks_is_refused_naming_it_not_a_memory_error():
    # length_stats([2**40], StatsConfig(max_len=8)) was a bare "MemoryError: Allocation failed"
    # traceback (audit repro_huge_length.py): split_lengths allocated one entry per chunk
    # (2**37 of them) before anything checked the count.
    config = StatsConfig(max_len=8, candidates=(8,))
    with pytest.raises(ConfigError) as info:
        length_stats([5, 2**40], config)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("document 1 has length 1,099,511,627,776: cut at max_len 8 ")
    assert "137,438,953,472 chunks" in message and "2,147,483,647" in message
    with pytest.raises(ConfigError, match=r"^document 1 has length 1,099,511,627,776: "):
        split_lengths([5, 2**40], 8)
    # no one length too many, but together: 2**30 + 2**30 chunks; the longest is named
    with pytest.raises(ConfigError, match=r"^document 1 has length 8,589,934,600: cut at max_len"):
        split_lengths([2**33, 2**33 + 8], 8)


def test_split_lengths_cuts_up_to_the_chunk_bound_and_refuses_one_past_it(monkeypatch):
    from packtool.pack import limits

    monkeypatch.setattr(limits, "MAX_SPLIT_CHUNKS", 5)
    assert split_lengths([16, 0, 17], 8).tolist() == [8, 8, 8, 8, 1]
    with pytest.raises(
        ConfigError, match=r"^document 2 has length 25: cut at max_len 8 .* more than the 5 chunks "
    ):
        split_lengths([16, 0, 25], 8)


def test_a_tokenizer_given_for_tokenized_parquet_must_be_the_recorded_one(tmp_path, capsys):
    """Before: `compute_stats(tok.parquet, tokenizer=...)` ignored the tokenizer without a word
    and reported the file's, where `tokenize_corpus` and `pack` refuse one unlike the recorded
    tokenizer. Now the same rule (packtool/tokenize/recorded.py): the recorded one is accepted
    (a note where the EOS / BOS not chosen are the file's), another is refused."""
    from packtool.tokenize.tokenize import tokenize_corpus
    from packtool.tokenizer.tokenizers import load_tokenizer

    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "abc"}\n{"text": "hello"}\n')
    tok, with_bos = tmp_path / "tok.parquet", tmp_path / "bos.parquet"
    tokenize_corpus([src], tok, progress=False)  # byte: eos 256, bos None
    bos = load_tokenizer("byte", bos="default")
    tokenize_corpus([src], with_bos, tokenizer=bos, progress=False)
    config = StatsConfig(max_len=64, candidates=(64,))
    plain = compute_stats([tok], config).to_dict()
    for same in ("byte", load_tokenizer("byte")):
        assert compute_stats([tok], config, tokenizer=same).to_dict() == plain
    capsys.readouterr()

    other = load_tokenizer("byte", eos=None)
    with pytest.raises(DataError) as ours:
        compute_stats([tok], config, tokenizer=other)
    with pytest.raises(DataError) as theirs:
        tokenize_corpus([tok], tmp_path / "again.parquet", tokenizer=other, progress=False)
    assert str(ours.value) == str(theirs.value)
    assert "tokenized with byte:byte (vocab 258, eos 256, bos None)" in str(ours.value)
    assert "pass --eos-id 256 / eos=256 (what the file records)" in str(ours.value)

    # `byte` given for a file that records a BOS: the BOS not chosen is the file's (a note).
    s = compute_stats([with_bos], config, tokenizer="byte")
    assert s.inputs["tokenizer"] == bos.identity.to_dict()
    assert s.tokens == 3 + 5 + 2 * 2  # a BOS and an EOS each
    bos_id = bos.identity.bos_id
    assert f"records bos {bos_id}, not this tokenizer's bos None" in capsys.readouterr().err
    with pytest.raises(DataError, match=f"pass --bos-id {bos_id} / bos={bos_id} .what the file"):
        compute_stats([with_bos], config, tokenizer="byte", bos=None)  # chosen: no BOS


@pytest.mark.parametrize("refused", ["tokenizer", "bos"])
def test_every_function_names_tokenized_parquet_as_it_was_given(tmp_path, refused):
    """A tokenizer (or a `bos`) unlike the recorded one: `run_pack` and `tokenize_megatron`
    named the input as given (`tok`), `compute_stats`, `tokenize_corpus` and
    `tokenized_batches` the first part file (`tok/part-00000.parquet`). One line now, naming
    `tok`, at each."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.engines.megatron.run import tokenize_megatron
    from packtool.pack.chunk import PackConfig
    from packtool.tokenize.tokenize import tokenize_corpus, tokenized_batches
    from packtool.tokenizer.tokenizers import load_tokenizer

    src = tmp_path / "c.jsonl"
    src.write_text('{"text": "abc"}\n{"text": "hello"}\n')
    tok = tmp_path / "tok"
    tokenize_corpus([src], tok, progress=False)  # byte: eos 256, bos None; tok/part-00000
    other = {"tokenizer": load_tokenizer("byte", eos=None)}  # no EOS: not the file's
    given = other if refused == "tokenizer" else {"tokenizer": None, "bos": 5}
    calls = {
        "compute_stats": lambda: compute_stats([tok], StatsConfig(max_len=64), **given),
        "tokenize_corpus": lambda: tokenize_corpus([tok], tmp_path / "t.parquet", **given),
        "tokenized_batches": lambda: list(tokenized_batches([tok], **given)),
        "run_pack": lambda: run_pack(
            RunConfig(inputs=(str(tok),), out_dir=str(tmp_path / "p"), pack=PackConfig(max_len=64)),
            **given,
        ),
        "tokenize_megatron": lambda: tokenize_megatron([tok], tmp_path / "m", **given),
    }
    lines = {}
    for name, call in calls.items():
        with pytest.raises(DataError) as raised:
            call()
        lines[name] = str(raised.value)
    assert lines["run_pack"].startswith(f"{tok}: tokenized with byte:byte"), lines
    assert set(lines.values()) == {lines["run_pack"]}, lines


@pytest.mark.parametrize(
    ("long_docs", "pieces", "long_chunks", "rule"),
    [
        ("split", [10, 10, 3, 8], 2, "split"),
        ("truncate", [10, 3, 8], 1, "truncate"),
        ("drop", [3, 8], 0, "drop"),
    ],
)
def test_the_max_length_figures_follow_the_long_docs_policy(long_docs, pieces, long_chunks, rule):
    # Lengths 20, 3, 0, 8 at max length 10 (the empty document is no piece under any policy).
    s = length_stats(
        [20, 3, 0, 8],
        StatsConfig(max_len=10, batch_size=2, candidates=(10, 32), long_docs=long_docs),
    )
    kept = sum(pieces)
    assert (s.documents, s.tokens, s.p50, s.max) == (4, 31, 3, 20)  # the corpus's, always
    assert (s.long_documents, s.long_tokens) == (1, 20)
    assert (s.chunks, s.packed_tokens, s.long_chunks) == (len(pieces), kept, long_chunks)
    assert s.pad_to_max_len_slots == 10 * len(pieces)
    assert s.pad_to_max_len_waste == pytest.approx(1 - kept / (10 * len(pieces)))
    assert s.lower_bound_l1 == -(-kept // 10)
    assert s.lower_bound_l2 == lower_bound_l2(pieces, 10)
    assert s.ffd_rows == ffd_assign(pieces, 10)[2]
    assert s.ffd_efficiency == pytest.approx(kept / (s.ffd_rows * 10))
    c = s.candidates[0]
    assert (c.chunks, c.tokens, c.rows, c.lower_bound_rows) == (
        len(pieces),
        kept,
        s.ffd_rows,
        s.lower_bound_l2,
    )
    # 32 cuts no document: the rule, in the policy's words
    assert f"candidates that {rule} at most 1% of documents" in s.suggestion_rule
    d = s.to_dict()
    assert d["long_docs"] == long_docs
    assert d["packed"]["tokens"] == kept and d["candidates"][0]["tokens"] == kept
    assert d["longer_than_max_len"]["chunks_after_split"] == len(pieces)


def test_the_report_says_what_became_of_the_long_documents():
    def report(long_docs):
        config = StatsConfig(max_len=10, candidates=(10,), long_docs=long_docs)
        return render_report(length_stats([25, 3, 8], config))

    assert "1 documents, 25 tokens -> 3 chunks after splitting (5 pieces in all)" in report("split")
    text = report("truncate")
    assert "1 documents, 25 tokens -> truncated, 15 tokens cut (3 pieces in all)" in text
    assert "candidate max lengths (FFD after truncating)\nmax_len  truncated docs" in text
    text = report("drop")
    assert "1 documents, 25 tokens -> dropped (2 pieces in all)" in text
    assert "candidate max lengths (FFD after dropping)\nmax_len  dropped docs" in text
    assert SUGGESTION_FALLBACK.replace("split", "drop") in render_report(
        length_stats([25] * 9 + [3], StatsConfig(max_len=10, candidates=(10,), long_docs="drop"))
    )
