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


_UNDER_A_LOW_FILE_LIMIT = """
import dataclasses, json, os, resource, sys
from packtool.audit import pieces
from packtool.audit.verify import verify_dataset
from packtool.storage import writing

pieces.MEMORY_PIECES = int(sys.argv[2])
real, spills = writing.temporary_folder, []
def recorded(prefix):
    spills.append(prefix)
    return real(prefix)
writing.temporary_folder = recorded
open_now = len(os.listdir("/proc/self/fd"))
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (open_now + int(sys.argv[3]), hard))
report = dataclasses.asdict(verify_dataset(sys.argv[1]))
print(json.dumps({"spills": len(spills), **{k: v for k, v in report.items() if k != "seconds"}},
                 default=str))
"""


def test_spilling_into_hundreds_of_buckets_stays_under_a_low_open_file_limit(
    packed_dataset_factory,
):
    """Pieces are spilled into ~2 * pieces / MEMORY_PIECES buckets: 10^9 pieces need 1,000.
    Each once held its own open file, so past ~10^9 pieces a default limit of 1,024 open
    files failed `verify` ("bucket-01018.bin: Too many open files"). Here 2,400 pieces with
    MEMORY_PIECES 8 need 600 buckets, checked with 40 files to spare: the same report as
    the in-memory check."""
    import dataclasses
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import packtool

    rng = np.random.default_rng(5)
    ids = rng.permutation(1 << 20)[:2000]
    docs = [(int(d), 0, 3) for d in ids[:1600]]  # short documents, 4 to a row
    rows = [docs[i : i + 4] for i in range(0, len(docs), 4)]
    rows += [[(int(d), 0, 16)] for d in ids[1600:]] + [[(int(d), 1, 5)] for d in ids[1600:]]
    order = rng.permutation(len(rows))
    shards = [[rows[i] for i in order[k::3]] for k in range(3)]
    d = packed_dataset_factory(shards, row_group_size=16)
    memory = verify_dataset(d)
    assert memory.documents == 2400 and memory.distinct_documents == 2000

    done = subprocess.run(
        [sys.executable, "-c", _UNDER_A_LOW_FILE_LIMIT, str(d), "8", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(Path(packtool.__file__).parents[1])},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    spilled = json.loads(done.stdout)
    assert spilled.pop("spills") == 1  # it did spill (into 2 * 2,400 / 8 = 600 buckets)
    expected = {k: v for k, v in dataclasses.asdict(memory).items() if k != "seconds"}
    assert spilled == json.loads(json.dumps(expected, default=str))
