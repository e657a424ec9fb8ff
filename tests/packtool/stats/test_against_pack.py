"""`stats` against what `pack` then does on the same corpus (docs/stats.md, "Splitting").

The split figures are `pack --long-docs split`'s: the same tokens, the FFD rows it uses and the
bounds it reports. The bounds bound that run only: `--long-docs truncate` or `drop` pack fewer
tokens and can use fewer rows, which the docs say with the sample corpus's numbers.
"""

from __future__ import annotations

import json
import random

import pytest

from packtool.engines.config import RunConfig
from packtool.engines.local import run_pack
from packtool.pack.chunk import PackConfig
from packtool.stats.lengths import StatsConfig, compute_stats


@pytest.fixture(scope="module")
def skewed_corpus(tmp_path_factory):
    """Log-normal text lengths, some empty, some several times the max length (64)."""
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("c") / "c.jsonl"
    with open(path, "w") as f:
        for _ in range(600):
            n = 0 if rng.random() < 0.03 else int(rng.lognormvariate(3, 1.3))
            f.write(json.dumps({"text": "ab\u00e9"[: rng.randint(1, 3)] * n}) + "\n")
    return str(path)


def _pack(corpus, out, long_docs, rounds=1):
    config = PackConfig(max_len=64, long_docs=long_docs, rounds=rounds)
    return run_pack(RunConfig(inputs=(corpus,), out_dir=str(out), pack=config, workers=1))


def test_split_figures_are_what_pack_splits_and_packs(skewed_corpus, tmp_path):
    stats = compute_stats(skewed_corpus, StatsConfig(max_len=64, candidates=(64,)))
    assert stats.long_documents > 0  # the corpus has documents to split
    run = _pack(skewed_corpus, tmp_path / "split", "split")
    assert run.counts.tokens_out == stats.tokens
    assert run.counts.rows == stats.ffd_rows
    assert (run.lower_bound_l1, run.lower_bound_l2) == (
        stats.lower_bound_l1,
        stats.lower_bound_l2,
    )
    # More rounds can beat FFD, never the bound.
    better = _pack(skewed_corpus, tmp_path / "rounds", "split", rounds=20)
    assert stats.lower_bound_l2 <= better.counts.rows <= stats.ffd_rows


@pytest.mark.parametrize("long_docs", ["truncate", "drop"])
def test_the_split_bound_is_not_a_bound_for_truncate_or_drop(skewed_corpus, tmp_path, long_docs):
    """What docs/stats.md warns of: these runs pack fewer tokens into fewer rows."""
    stats = compute_stats(skewed_corpus, StatsConfig(max_len=64, candidates=(64,)))
    run = _pack(skewed_corpus, tmp_path / long_docs, long_docs)
    assert run.counts.tokens_out < stats.tokens
    assert run.counts.rows < stats.lower_bound_l1
