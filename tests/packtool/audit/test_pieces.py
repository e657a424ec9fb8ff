"""verify's exactly-once check in bounded memory (packtool/audit/pieces.py): spilled to hashed
buckets on disk past `MEMORY_PIECES`, it finds what the in-memory check finds, on random pieces
(hypothesis) and on datasets; the spill folder is removed, also when a problem stops it."""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit import pieces as pieces_module
from packtool.audit.pieces import Pieces
from packtool.audit.verify import verify_dataset
from packtool.errors import DataError
from packtool.storage import writing
from tests.packtool.audit import test_verify as verify_tests
from tests.packtool.audit.test_verify import SHARDS, TOKENS


def reference(triples: list[tuple[int, int, int]]) -> tuple[int, int, int] | str:
    """Plain Python: the (pieces, distinct ids, ids in several pieces), or which problem comes
    first in id order."""
    seen: dict[int, list[int]] = {}
    for doc, chunk, _ in triples:
        seen.setdefault(doc, []).append(chunk)
    for doc in sorted(seen):
        chunks = sorted(seen[doc])
        if len(set(chunks)) != len(chunks):
            return "appears again"
        if chunks != list(range(len(chunks))):
            return "is missing"
    return len(triples), len(seen), sum(len(c) > 1 for c in seen.values())


def checked(triples, memory: int, expected: int | None, monkeypatch) -> tuple[int, int, int] | str:
    monkeypatch.setattr(pieces_module, "MEMORY_PIECES", memory)
    p = Pieces(expected)
    a = np.asarray(triples, dtype=np.int64).reshape(-1, 3)
    for part in np.array_split(a, 5):  # five row groups
        p.add(part[:, 0], part[:, 1], part[:, 2])
    try:
        return p.check(lambda row: f"row {row}", lambda where, what: DataError(what))
    except DataError as exc:
        return "appears again" if "appears again" in str(exc) else "is missing"
    finally:
        p.close()


@settings(max_examples=150, deadline=None)
@given(
    docs=st.lists(
        st.tuples(st.integers(-(2**62), 2**62), st.integers(1, 3)), min_size=0, max_size=40
    ),
    damage=st.sampled_from(["none", "duplicate", "drop"]),
    memory=st.sampled_from([1, 3, 10**9]),
    expected=st.sampled_from([None, 5, 1000]),
    data=st.data(),
)
def test_spilled_or_not_the_check_finds_what_plain_python_finds(
    docs, damage, memory, expected, data
):
    triples = [(d, c, 0) for d, n in dict(docs).items() for c in range(n)]
    if triples and damage == "duplicate":
        triples.append(data.draw(st.sampled_from(triples)))
    elif triples and damage == "drop":
        triples.remove(data.draw(st.sampled_from(triples)))
    triples = data.draw(st.permutations(triples))
    triples = [(d, c, row) for row, (d, c, _) in enumerate(triples)]
    with pytest.MonkeyPatch.context() as mp:
        assert checked(triples, memory, expected, mp) == reference(triples)


@pytest.fixture
def spilling(monkeypatch):
    """Every dataset's pieces spilled (past 2 held), with the spill folders made recorded."""
    monkeypatch.setattr(pieces_module, "MEMORY_PIECES", 2)
    made = []
    real = writing.temporary_folder

    @contextlib.contextmanager
    def recorded(prefix):
        with real(prefix) as folder:
            made.append(folder)
            yield folder

    monkeypatch.setattr(writing, "temporary_folder", recorded)
    return made


def test_a_spilled_dataset_verifies_with_the_same_counts(packed_dataset_factory, spilling):
    import os

    d = packed_dataset_factory(SHARDS, row_group_size=2)
    report = verify_dataset(d)
    assert (report.rows, report.tokens, report.documents, report.distinct_documents) == (
        6,
        TOKENS,
        9,
        8,
    )
    assert len(spilling) == 1 and not os.path.exists(spilling[0])


def test_a_spilled_check_still_names_a_repeated_piece_and_a_missing_chunk(
    packed_dataset_factory, capsys, spilling
):
    import gc
    import os

    verify_tests.test_duplicated_document(packed_dataset_factory, capsys)  # same messages
    verify_tests.test_missing_chunk(packed_dataset_factory, capsys)
    gc.collect()
    assert spilling and not any(os.path.exists(f) for f in spilling)
