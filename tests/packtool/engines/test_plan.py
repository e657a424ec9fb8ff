"""The partition plan (packtool/engines/plan.py) and the ids of the documents it hands out.

Properties, with hypothesis: cut anywhere, the plan's byte ranges give every line of every file
to exactly one partition (a boundary on a newline, CRLF, no final newline, a BOM, empty files);
the plan is a pure function of the files and the target size (no worker count in it); document
ids are unique and decode to the file and the line they came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packtool.engines.plan import InputFile, Piece, check_unchanged, describe, make_plan
from packtool.errors import ConfigError, DataError
from packtool.read import docids
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.read.lines import BOM, TO_END, line_number, lines
from packtool.tokenize.tables import read_piece

LINE = st.text(alphabet=st.characters(codec="utf-8", exclude_characters="\r\n"), max_size=12)
FILE = st.tuples(
    st.lists(LINE, max_size=8),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),  # final newline
    st.booleans(),  # BOM
)
SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def write_files(folder: Path, files) -> list[tuple[Path, list[tuple[int, bytes]]]]:
    """Write JSONL files; return each path with its (byte offset, JSON line) list."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i, (texts, end, final, bom) in enumerate(files):
        data = bytearray(BOM if bom else b"")
        expected = []
        for k, text in enumerate(texts):
            line = json.dumps({"text": text}).encode()
            expected.append((len(data) if k else 0, line))
            data += line
            if k < len(texts) - 1 or final:
                data += end
        path = folder / f"f{i:03d}.jsonl"
        path.write_bytes(bytes(data))
        out.append((path, expected))
    return out


def plan_of(written, target: int):
    files = [describe(p, "jsonl", target) for p, _ in written]
    return make_plan(files, target)


@SETTINGS
@given(files=st.lists(FILE, min_size=1, max_size=5), target=st.integers(1, 120))
def test_every_line_is_in_exactly_one_partition(tmp_path_factory, files, target):
    written = write_files(tmp_path_factory.mktemp("plan"), files)
    plan = plan_of(written, target)
    seen: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(len(written))}
    for part in plan.partitions:
        for piece in part:
            path = written[piece.file][0]
            for offset, _, line in lines(path, piece.start, piece.end):
                if line.strip():  # a file holding only a BOM has one blank line: no document
                    seen[piece.file].append((offset, line.rstrip(b"\r\n")))
    for i, (_, expected) in enumerate(written):
        # Lines in file order, each once; the blank last "line" of a file ending in a newline
        # does not exist.
        assert seen[i] == expected
    # Pieces of one file are consecutive, cover it, and do not overlap.
    for i, (path, _) in enumerate(written):
        pieces = [p for part in plan.partitions for p in part if p.file == i]
        size = path.stat().st_size
        if len(pieces) == 1 and pieces[0].end == TO_END:
            continue
        assert pieces[0].start == 0 and pieces[-1].end == size
        assert all(a.end == b.start for a, b in zip(pieces, pieces[1:], strict=False))


@SETTINGS
@given(files=st.lists(FILE, min_size=1, max_size=5), target=st.integers(1, 120))
def test_ids_are_unique_and_decode_to_the_file_and_line(tmp_path_factory, files, target):
    written = write_files(tmp_path_factory.mktemp("ids"), files)
    plan = plan_of(written, target)
    ids = []
    skips = SkipCounter()
    for part in plan.partitions:
        for piece in part:
            path = written[piece.file][0]
            for batch in read_piece(
                path, piece.file, ReadConfig(), skips, start=piece.start, end=piece.end
            ):
                for doc_id, text in zip(batch.doc_ids.tolist(), batch.texts, strict=True):
                    ids.append(doc_id)
                    file_index, offset = docids.decode(doc_id)
                    assert file_index == piece.file
                    data = path.read_bytes()
                    line = data[offset:].split(b"\n", 1)[0].removeprefix(BOM)
                    assert json.loads(line)["text"] == text
                    # The line number a person can open: one more than the newlines before it.
                    assert line_number(path, offset) == data[:offset].count(b"\n") + 1
    assert len(ids) == len(set(ids))
    non_empty = sum(1 for _, exp in written for _, line in exp if json.loads(line)["text"])
    assert len(ids) == non_empty  # empty texts are counted skips, nothing else is lost
    assert skips.counts.get("empty", 0) == sum(len(e) for _, e in written) - non_empty


FILES = st.lists(
    st.tuples(
        st.integers(0, 5000),
        st.sampled_from(["jsonl", "text", "parquet", "json_array"]),
        st.booleans(),  # compressed
    ),
    min_size=1,
    max_size=30,
)


def input_files(spec) -> list[InputFile]:
    out = []
    for i, (size, kind, zst) in enumerate(spec):
        suffix = {"jsonl": ".jsonl", "text": ".txt", "parquet": ".parquet", "json_array": ".json"}
        name = f"f{i}{suffix[kind]}" + (".zst" if zst and kind == "jsonl" else "")
        groups = (
            tuple([size // 4] * 4) if kind == "parquet" and size > 1000 and size % 4 == 0 else None
        )
        out.append(InputFile(name, size, 1000 + i, kind, groups))
    return out


@settings(max_examples=200, deadline=None)
@given(spec=FILES, target=st.integers(1, 3000))
def test_the_plan_is_a_pure_function_that_covers_every_file_in_order(spec, target):
    files = input_files(spec)
    plan = make_plan(files, target)
    assert plan == make_plan(list(files), target)  # the same files, the same plan
    assert plan.to_dict() == make_plan(files, target).to_dict()
    pieces = [p for part in plan.partitions for p in part]
    assert [p.file for p in pieces] == sorted(p.file for p in pieces)  # reading order
    assert {p.file for p in pieces} == set(range(len(files)))
    for part in plan.partitions:
        assert part  # no empty partition
    for f, file in enumerate(files):
        mine = [p for p in pieces if p.file == f]
        if file.cut_by_bytes and file.size > target:
            assert len(mine) == -(-file.size // target)  # equal ranges of at most the target
            assert all(p.end - p.start <= target for p in mine)
        elif file.kind == "parquet" and file.row_group_bytes and file.size > target:
            assert mine[0].start == 0 and mine[-1].end == 4
            assert all(a.end == b.start for a, b in zip(mine, mine[1:], strict=False))
        else:
            assert mine == [Piece(f)]  # whole: compressed, text, a .json array, small files


def test_small_files_are_grouped_up_to_the_target():
    files = [InputFile(f"f{i}.jsonl", 10, 0, "jsonl") for i in range(10)]
    plan = make_plan(files, 35)
    assert [len(p) for p in plan.partitions] == [3, 3, 3, 1]


def test_a_bad_partition_size_is_refused():
    with pytest.raises(ConfigError, match="partition_size must be a positive"):
        make_plan([], 0)


def test_an_input_that_changed_since_planning_is_one_line_naming_it(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n')
    st_ = path.stat()
    check_unchanged(str(path), st_.st_size, st_.st_mtime_ns)
    path.write_text('{"text": "xy"}\n')
    with pytest.raises(DataError, match=r"a\.jsonl: changed since the run was planned") as e:
        check_unchanged(str(path), st_.st_size, st_.st_mtime_ns)
    assert "\n" not in str(e.value)
    path.unlink()
    with pytest.raises(DataError, match=r"a\.jsonl: cannot be read any more"):
        check_unchanged(str(path), st_.st_size, st_.st_mtime_ns)


def test_ids_pack_file_and_offset_into_int64():
    ids = docids.encode(7, np.array([0, 5, docids.MAX_OFFSET]))
    files, offsets = docids.decode(ids)
    assert files.tolist() == [7, 7, 7] and offsets.tolist() == [0, 5, docids.MAX_OFFSET]
    assert (ids >= 0).all()
