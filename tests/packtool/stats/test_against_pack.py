"""`stats --long-docs X` against what `pack --long-docs X` then does on the same corpus
(docs/stats.md, "Long documents").

For each policy the figures are that run's: the tokens it packs, the FFD rows it uses and the
bounds it reports. (Until 2026-12-08 stats modelled split alone, and its bound stood above the
rows of a truncate or drop run: 694 against 508 and 468 on the sample corpus at 4,096.)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from packtool.engines.config import RunConfig
from packtool.engines.local import run_pack
from packtool.pack.chunk import PackConfig
from packtool.stats.lengths import StatsConfig, compute_stats
from tests.cli import run

POLICIES = ("split", "truncate", "drop")
SAMPLE = str(Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl")


def _corpus(path, seed, n):
    """Log-normal text lengths, some empty, some several times the max length (64)."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            n_chars = 0 if rng.random() < 0.03 else int(rng.lognormvariate(3, 1.3))
            f.write(json.dumps({"text": "ab\u00e9"[: rng.randint(1, 3)] * n_chars}) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def skewed_corpus(tmp_path_factory):
    return _corpus(tmp_path_factory.mktemp("c") / "c.jsonl", 7, 600)


def _pack(corpus, out, long_docs, rounds=1):
    config = PackConfig(max_len=64, long_docs=long_docs, rounds=rounds)
    return run_pack(RunConfig(inputs=(corpus,), out_dir=str(out), pack=config, workers=1))


def _same_as_pack(stats, run):
    assert run.counts.tokens_out == stats.packed_tokens
    assert run.counts.rows == stats.ffd_rows
    assert (run.lower_bound_l1, run.lower_bound_l2) == (
        stats.lower_bound_l1,
        stats.lower_bound_l2,
    )
    assert stats.lower_bound_l2 <= run.counts.rows


@pytest.mark.parametrize("long_docs", POLICIES)
def test_each_policy_is_what_pack_packs(skewed_corpus, tmp_path, long_docs):
    stats = compute_stats(skewed_corpus, StatsConfig(max_len=64, candidates=(64,)))
    assert stats.long_documents > 0  # the corpus has long documents
    stats = compute_stats(
        skewed_corpus, StatsConfig(max_len=64, candidates=(64,), long_docs=long_docs)
    )
    assert stats.long_docs == long_docs
    _same_as_pack(stats, _pack(skewed_corpus, tmp_path / "one", long_docs))
    (cand,) = stats.candidates
    assert (cand.tokens, cand.rows, cand.lower_bound_rows) == (
        stats.packed_tokens,
        stats.ffd_rows,
        stats.lower_bound_l2,
    )
    # More rounds can beat FFD, never the bound.
    better = _pack(skewed_corpus, tmp_path / "rounds", long_docs, rounds=20)
    assert stats.lower_bound_l2 <= better.counts.rows <= stats.ffd_rows


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("long_docs", POLICIES)
def test_each_policy_on_random_small_corpora(tmp_path, seed, long_docs):
    corpus = _corpus(tmp_path / "c.jsonl", seed, random.Random(seed).randint(5, 120))
    stats = compute_stats(corpus, StatsConfig(max_len=64, candidates=(64,), long_docs=long_docs))
    _same_as_pack(stats, _pack(corpus, tmp_path / "out", long_docs))


@pytest.fixture(scope="module")
def sample_stats():
    return {p: compute_stats(SAMPLE, StatsConfig(max_len=4096, long_docs=p)) for p in POLICIES}


@pytest.mark.parametrize(("long_docs", "rows"), [("split", 694), ("truncate", 508), ("drop", 468)])
def test_the_sample_corpus_as_docs_stats_md_gives_it(sample_stats, tmp_path, long_docs, rows):
    """`packtool pack sample_data/corpus.jsonl --max-len 4096 --long-docs X` against stats."""
    stats = sample_stats[long_docs]
    out = tmp_path / long_docs
    code, printed, err = run(
        "pack", SAMPLE, "-o", out, "--max-len", 4096, "--long-docs",
        long_docs, "--json",
    )  # fmt: skip
    assert code == 0, err
    packed = json.loads(printed)
    assert packed["counts"]["rows"] == stats.ffd_rows == stats.lower_bound_l2 == rows
    assert packed["counts"]["tokens_out"] == stats.packed_tokens
    assert packed["lower_bound_rows"] == stats.lower_bound_l2
