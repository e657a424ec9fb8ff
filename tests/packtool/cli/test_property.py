"""A property of the whole `packtool pack` CLI (issue #11).

Whatever sequence of commands runs into one output folder — good and bad inputs, with and
without `--overwrite` or `--resume`, runs interrupted by Ctrl-C or a full disk at the n-th chunk
— after every command the folder is the last good dataset (verify passes, the same bytes) or
absent: never a mixture, never empty-but-present, never half of a run.
"""

from __future__ import annotations

import errno
import gzip
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from packtool.audit.verify import verify_dataset
from packtool.engines import worker
from tests.cli import run

OPTIONS = ["--max-len", "64", "--chunk-docs", "20", "--shard-rows", "8"]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def snapshot(folder: Path) -> dict[str, bytes] | None:
    """Every file's bytes; index.json's `command` (the run's own arguments) left out."""
    if not folder.exists():
        return None
    files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))}
    if "index.json" in files:
        files["index.json"] = re.sub(rb'\n  "command": "[^\n]*",\n', b"\n", files["index.json"])
    return files


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The inputs, and the dataset an uninterrupted run of each good one makes (its bytes)."""
    base = tmp_path_factory.mktemp("property")
    gz = base / "cut.jsonl.gz"
    rows = "".join(json.dumps({"text": f"line {i} {i * 7919 % 10007}"}) + "\n" for i in range(3000))
    whole = gzip.compress(rows.encode())
    gz.write_bytes(whole[: len(whole) // 2])
    (base / "empty.jsonl").write_text("")
    inputs = {
        # 60 and 45 documents: 3 chunks each at --chunk-docs 20, so a run can stop between.
        "A": [jsonl(base / "a.jsonl", [{"text": f"alpha {i} " * (i % 7 + 1)} for i in range(60)])],
        "B": [jsonl(base / "b.jsonl", [{"text": f"beta {i} " * (i % 5 + 2)} for i in range(45)])],
        "empty": [base / "empty.jsonl"],
        "truncated gz": [gz],
        "no text field": [jsonl(base / "nofield.jsonl", [{"body": "x"}] * 30)],
        "misspelt group-by": [
            jsonl(base / "lang.jsonl", [{"text": f"salut {i}", "lang": "fr"} for i in range(50)]),
            "--group-by",
            "lnag",
        ],
    }
    expected = {}
    for name in ("A", "B"):
        out = base / f"ref-{name}"
        code, _, err = run("pack", *inputs[name], "-o", out, *OPTIONS)
        assert code == 0, err
        expected[name] = snapshot(out)
    return base, inputs, expected


GOOD, BAD = ["A", "B"], ["empty", "truncated gz", "no text field", "misspelt group-by"]
STEP = st.tuples(
    st.one_of(st.sampled_from(GOOD), st.sampled_from(BAD)),  # half good, half bad
    st.sampled_from([(), ("--overwrite",), ("--resume",)]),
    st.one_of(st.none(), st.tuples(st.sampled_from(["ctrl-c", "disk full"]), st.integers(1, 3))),
)
# Sequences worth running every time, whatever the generator draws.
RESUMED = [("A", (), ("ctrl-c", 2)), ("A", ("--resume",), None)]
REPLACED = [
    ("A", (), None),
    ("B", ("--overwrite",), ("disk full", 3)),
    ("empty", ("--overwrite",), None),
    ("B", ("--resume",), None),
    ("misspelt group-by", ("--overwrite",), None),
    ("A", ("--overwrite",), ("ctrl-c", 1)),
    ("B", ("--resume",), None),  # another run's state: refused, kept
    ("A", ("--resume",), None),
]


def interrupting(kind: str, at: int):
    """A `write_chunk` that fails at its `at`-th call, as Ctrl-C or a full disk would."""
    real, calls = worker.write_chunk, []

    def write_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == at:
            if kind == "ctrl-c":
                raise KeyboardInterrupt
            raise OSError(errno.ENOSPC, "No space left on device", "shard.parquet")
        return real(*args, **kwargs)

    return write_chunk


@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,  # the same sequences every run: a CI failure reproduces
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=1, max_size=6))
@example(steps=RESUMED)
@example(steps=REPLACED)
def test_the_output_is_always_the_last_good_dataset_or_absent(world, tmp_path_factory, steps):
    base, inputs, expected = world
    out = tmp_path_factory.mktemp("run") / "D"
    last_good = None
    for name, flags, interrupt in steps:
        args = ["pack", *inputs[name], "-o", out, *OPTIONS, *flags]
        if interrupt is None:
            code, _, err = run(*args)
        else:
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(worker, "write_chunk", interrupting(*interrupt))
                code, _, err = run(*args)
        assert "Traceback" not in err
        now = snapshot(out)
        if code == 0:
            assert name in expected, (name, err)
            assert now == expected[name]  # the same bytes an uninterrupted fresh run makes
            verify_dataset(out)
            last_good = now
            assert list(out.parent.glob(".D.packtool-*")) == []  # nothing beside it
        else:
            assert len(err.strip().splitlines()) == 1, err
            assert now == last_good, (name, flags, interrupt, err)  # untouched, or still absent
        # Between commands only an interrupted run's staging folder may wait beside it.
        assert {p.name for p in out.parent.glob(".D.packtool-*")} <= {".D.packtool-staging"}
