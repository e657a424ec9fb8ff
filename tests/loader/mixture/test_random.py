"""MixedDataset under random weights, source orders and cut points (hypothesis): every prefix of
the delivered rows within one row of each source's target, in tokens and in rows mode; a resume
at any step, with the same mixture (the same stream) or with changed weights, an added or a
removed source (each kept source continues from its cursor: nothing repeated, nothing skipped).
"""

from __future__ import annotations

import json
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader import MixedDataset
from packtool.mixture.spec import MixtureSpec, SourceSpec
from tests.loader.mixture.test_dataset import (
    per_source_reference,
    same,
    source_rows,
    sources,
    spec,
    stream,
)

__all__ = ["sources"]  # the module fixture, shared with test_mixture.py

NAMES = ("web", "code", "books")
MAX_LEN = 64  # the fixture's sources
weights_st = st.lists(
    st.one_of(st.floats(0.05, 1.0), st.integers(1, 5).map(float)), min_size=3, max_size=3
)


def examples(n: int) -> settings:
    """Hypothesis settings: `n` examples, no deadline; the fixtures are module-scoped (made
    once, never changed by a test)."""
    return settings(
        max_examples=n, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
    )


@pytest.fixture(scope="module")
def refs(sources):
    return per_source_reference(sources)


@pytest.fixture(scope="module")
def extras(tmp_path_factory):
    """Three more sources (other data: the same data twice in one mixture is refused) and each
    one's documents in its own epoch order."""
    from loader.testing import write_random_dataset

    root = tmp_path_factory.mktemp("extras")
    paths = [root / f"extra{i}" for i in range(3)]
    for i, (p, n) in enumerate(zip(paths, (9, 14, 5), strict=True)):
        write_random_dataset(
            p, n_rows=n, max_len=64, mean_doc=9, rows_per_shard=7, row_group_rows=3, seed=30 + i
        )
    return paths, per_source_reference(paths)


def delivered_rows(batches):
    """(source, tokens) of every row, in order: a batch of `rows_per_batch=1` is one row."""
    out = []
    for b in batches:
        src = b["source"].tolist()
        assert len(set(src)) == 1  # every document of a row comes from one source
        out.append((src[0], int(b["cu_seqlens"][-1])))
    return out


@examples(25)
@given(
    weights=weights_st,
    order=st.permutations(range(3)),
    unit=st.sampled_from(["tokens", "rows"]),
)
def test_every_prefix_of_rows_is_within_one_row_of_its_target(sources, weights, order, unit):
    paths = [sources[i] for i in order]  # sources of 23, 17 and 6 rows in a random order
    names = [NAMES[i] for i in order]
    ds = MixedDataset(spec(paths, weights=weights, names=names, unit=unit), rows_per_batch=1)
    rows = delivered_rows(stream(ds)[0])
    assert sum(n for _, n in rows) >= 6000  # the mixture's total_tokens
    total = sum(Fraction(w) for w in weights)
    w = [Fraction(x) / total for x in weights]
    one_row = MAX_LEN if unit == "tokens" else 1
    done, D = [0, 0, 0], 0
    worst = Fraction(0)
    for s, n in rows:
        u = n if unit == "tokens" else 1
        done[s] += u
        D += u
        worst = max(worst, *(abs(d - wi * D) for d, wi in zip(done, w, strict=True)))
    assert worst <= one_row, (weights, unit, float(worst))
    assert min(done) > 0  # every source drawn


@examples(20)
@given(
    cut=st.integers(1, 30),
    change=st.sampled_from(["same", "weights", "added", "removed"]),
    weights=weights_st,
    dropped=st.integers(0, 2),
)
def test_resume_at_any_step_same_or_changed_mixture(
    sources, extras, refs, cut, change, weights, dropped
):
    old = spec(sources)
    first, state = stream(MixedDataset(old, tokens_per_batch=150), take=cut)
    state = json.loads(json.dumps(state))  # a checkpoint survives JSON
    if change == "same":
        rest, _ = stream(MixedDataset(old, tokens_per_batch=150), state=state)
        ref, _ = stream(MixedDataset(old, tokens_per_batch=150))
        assert same(first + rest, ref)
        return
    if change == "weights":
        new, kept = spec(sources, weights=weights), {0: 0, 1: 1, 2: 2}
    elif change == "removed":
        keep = [i for i in range(3) if i != dropped]
        new = spec(
            [sources[i] for i in keep],
            weights=[weights[i] for i in keep],
            names=[NAMES[i] for i in keep],
        )
        kept = {i: k for k, i in enumerate(keep)}
    else:
        extra = SourceSpec(name="extra", path=str(extras[0][dropped]), weight=1)
        new = MixtureSpec(sources=old.sources + (extra,), total_tokens=old.total_tokens)
        kept = {0: 0, 1: 1, 2: 2}
    ds = MixedDataset(new, tokens_per_batch=150)
    with pytest.warns(UserWarning, match="resuming a changed mixture"):
        ds.load_state_dict(state)
    before, after = source_rows(first), source_rows(stream(ds)[0])
    for old_i, new_i in kept.items():
        got = before[old_i] + after.get(new_i, [])
        assert got == refs[old_i][: len(got)]  # its epoch order: no repeat, no gap
    if change == "added" and after.get(3):
        assert after[3] == extras[1][dropped][: len(after[3])]  # from its first row
