"""Issue #11 through the CLI: a failed run never harms a good dataset, and every input `pack`
accepts makes a dataset `verify` accepts. One test (or table row) per defect of the issue."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import read_manifest
from tests.cli import one_error_line, run

ROOT = Path(__file__).resolve().parents[3]


def jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def folder_bytes(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too), relative name -> bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))}


def beside(out: Path) -> list[str]:
    """packtool's hidden names next to `out` (staging, ready, old, lock)."""
    return sorted(p.name for p in out.parent.glob(f".{out.name}.packtool-*"))


@pytest.fixture
def good(tmp_path) -> Path:
    return jsonl(tmp_path / "good.jsonl", [{"text": f"good {i} " * (i % 9 + 1)} for i in range(80)])


def bad_inputs(tmp_path: Path) -> dict[str, list[str]]:
    """Commands that fail, each for another reason, and each late enough to have read input."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    gz = tmp_path / "cut.jsonl.gz"
    lines = "".join(
        json.dumps({"text": f"line {i} {i * 7919 % 10007}"}) + "\n" for i in range(3000)
    )
    whole = gzip.compress(lines.encode())
    gz.write_bytes(whole[: len(whole) // 2])
    nofield = jsonl(tmp_path / "nofield.jsonl", [{"body": "x"}] * 3)
    lang = jsonl(tmp_path / "lang.jsonl", [{"text": "bonjour", "lang": "fr"}] * 5)
    return {
        "empty corpus": [empty],
        "truncated .gz": [gz],
        "missing text field": [nofield],
        "misspelt --group-by": [lang, "--group-by", "lnag"],
    }


FAILURES = ["empty corpus", "truncated .gz", "missing text field", "misspelt --group-by"]


# --- 1 and 7: a failed run leaves the old dataset, and nothing new ---------------------------


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_overwrite_keeps_the_dataset(tmp_path, good, failure):
    out = tmp_path / "D"
    code, _, err = run("pack", good, "-o", out, "--max-len", "64")
    assert code == 0, err
    before = folder_bytes(out)
    args = bad_inputs(tmp_path)[failure]
    code, _, err = run("pack", *args, "-o", out, "--max-len", "64", "--overwrite")
    assert code == 1
    one_error_line(err)
    assert folder_bytes(out) == before  # the same dataset, byte for byte
    assert verify_dataset(out).rows == read_manifest(out).num_rows
    assert beside(out) == []  # and nothing new beside it


@pytest.mark.parametrize("failure", FAILURES)
def test_a_failed_first_run_leaves_nothing_so_the_corrected_one_needs_no_overwrite(
    tmp_path, good, failure
):
    out = tmp_path / "D"
    code, _, err = run("pack", *bad_inputs(tmp_path)[failure], "-o", out, "--max-len", "64")
    assert code == 1
    one_error_line(err)
    assert not out.exists() and beside(out) == []
    code, _, err = run("pack", good, "-o", out, "--max-len", "64")
    assert code == 0, err


def test_a_misspelt_group_by_then_the_corrected_command(tmp_path):
    # Defect 7 exactly: the corrected command used to be refused ("not empty").
    lang = jsonl(tmp_path / "lang.jsonl", [{"text": "bonjour", "lang": "fr"}] * 5)
    out = tmp_path / "D"
    code, _, err = run("pack", lang, "-o", out, "--group-by", "lnag")
    line = one_error_line(err)
    assert code == 1 and "--group-by lnag / group_by='lnag': no document has this field" in line
    assert "nothing was committed" in line and "--overwrite" not in line  # it is not needed
    assert not out.exists() and beside(out) == []
    code, out_text, err = run("pack", lang, "-o", out, "--group-by", "lang")
    assert code == 0, err
    assert "group 'fr'" in out_text


def test_an_empty_field_name_names_its_option(tmp_path):
    # it was the library's "extra_fields must be a tuple of non-empty names, got ('',)"
    lang = jsonl(tmp_path / "lang.jsonl", [{"text": "bonjour", "lang": "fr"}] * 5)
    for args in (
        ["pack", lang, "-o", tmp_path / "p", "--group-by", ""],
        ["tokenize", lang, "-o", tmp_path / "t.parquet", "--keep-field", " "],
    ):
        code, _, err = run(*args)
        assert code == 1 and f"{args[-2]}: the field name is empty" in one_error_line(err)


def test_tokenize_overwrite_of_a_folder_keeps_it_on_failure(tmp_path, good):
    parts = tmp_path / "tok"
    assert run("tokenize", good, "-o", parts)[0] == 0
    before = folder_bytes(parts)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code, _, err = run("tokenize", empty, "-o", parts, "--overwrite")
    assert code == 1 and "no documents" in one_error_line(err)
    assert folder_bytes(parts) == before and beside(parts) == []
    other = jsonl(tmp_path / "other.jsonl", [{"text": "another corpus"}])
    code, _, err = run("tokenize", other, "-o", parts, "--overwrite")  # replaced whole
    assert code == 0, err
    assert folder_bytes(parts) != before and beside(parts) == []


# --- 2: output inside an input, input inside the output --------------------------------------


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_an_output_inside_an_input_folder_is_refused_before_anything(tmp_path, good, command):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.jsonl").write_bytes(good.read_bytes())
    before = folder_bytes(src)
    out = src / ("packed" if command == "pack" else "tok.parquet")
    for extra in ([], ["--overwrite"]):
        code, _, err = run(command, src, "-o", out, *extra)
        assert code == 1
        assert f"output {out} is inside the input folder {src}" in one_error_line(err)
        assert folder_bytes(src) == before


@pytest.mark.parametrize("command", ["pack", "tokenize"])
def test_an_output_under_an_input_file_says_it_is_a_file(tmp_path, good, command):
    """It said the output "is inside the input folder" of a file."""
    out = good / ("packed" if command == "pack" else "tok.parquet")
    code, _, err = run(command, good, "-o", out)
    assert code == 1
    assert one_error_line(err) == (
        f"error: output {out}: {good} is a file, so no output can be made under it; choose "
        "another output"
    )


def test_an_input_inside_the_output_is_refused_and_kept(tmp_path, good):
    out = tmp_path / "D"
    out.mkdir()
    inside = out / "good.jsonl"
    inside.write_bytes(good.read_bytes())
    code, _, err = run("pack", inside, "-o", out, "--overwrite")
    assert code == 1 and "is inside the output" in one_error_line(err)
    assert inside.read_bytes() == good.read_bytes()
    code, _, err = run("pack", out, "-o", out, "--overwrite")
    assert code == 1 and "is also an input" in one_error_line(err)


def test_a_recursive_glob_that_reaches_the_output_is_refused(tmp_path, good):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_bytes(good.read_bytes())
    tok = tmp_path / "data" / "tok"
    code, _, err = run("tokenize", f"{tmp_path}/data/**/*.jsonl", "-o", tok)
    assert code == 0, err  # a glob for .jsonl cannot reach the part files tokenize writes
    code, _, err = run("pack", f"{tmp_path}/data/**/*.parquet", "-o", tmp_path / "data" / "p")
    assert code == 1 and "inside the folder the input glob" in one_error_line(err)
    assert not (tmp_path / "data" / "p").exists()


# --- 4: separately tokenized files, hand-made tokenized Parquet ------------------------------


def test_separately_tokenized_files_pack_into_a_dataset_that_verifies(tmp_path, good):
    a = jsonl(tmp_path / "a.jsonl", [{"text": f"alpha {i}"} for i in range(30)])
    assert run("tokenize", a, "-o", tmp_path / "a.parquet")[0] == 0
    assert run("tokenize", good, "-o", tmp_path / "b.parquet")[0] == 0
    out = tmp_path / "O"
    code, _, err = run("pack", tmp_path / "a.parquet", tmp_path / "b.parquet", "-o", out)
    assert code == 0, err
    code, text, err = run("verify", out)
    assert code == 0, err
    assert "110 documents" in text
    # Each packed id leads back to its tokenized row (docs/pack.md, "Document ids").
    from packtool.read import docids

    manifest = read_manifest(out)
    extra = manifest.extra
    ids = pq.read_table(out / manifest.shards[0].file).column("doc_ids").combine_chunks()
    for doc_id in ids.values.to_pylist()[:20]:
        file, row = docids.locate(extra, doc_id)
        original = pq.read_table(file).slice(row, 1).to_pylist()[0]
        assert original["source"] == str(a if file.endswith("a.parquet") else good)


def tokenized_file(path: Path, rows: list[list[int]], doc_ids: list[int]) -> Path:
    """A hand-made tokenized Parquet with the byte tokenizer's identity (vocab 258)."""
    from packtool.dataset.tokenized import tokenized_schema
    from packtool.tokenizer.tokenizers import load_tokenizer

    schema = tokenized_schema(load_tokenizer("byte").identity)
    table = pa.table(
        {
            "doc_id": pa.array(doc_ids, pa.int64()),
            "source": pa.array(["hand"] * len(rows)),
            "input_ids": pa.array(rows, pa.list_(pa.uint16())),
            "length": pa.array([len(r) for r in rows], pa.int32()),
        },
        schema=schema,
    )
    pq.write_table(table, path, row_group_size=2)
    return path


def test_hand_made_duplicate_ids_still_make_a_dataset_that_verifies(tmp_path):
    tok = tokenized_file(tmp_path / "dup.parquet", [[1, 2, 256], [3, 256], [4, 5, 256]], [7, 7, 7])
    out = tmp_path / "O"
    assert run("pack", tok, "-o", out, "--max-len", "8")[0] == 0
    assert run("verify", out)[0] == 0


def test_an_id_beyond_the_vocabulary_is_refused_on_the_way_in(tmp_path):
    tok = tokenized_file(
        tmp_path / "big.parquet", [[1, 2, 256], [3, 256], [4, 300, 256]], [0, 1, 2]
    )
    out = tmp_path / "O"
    code, _, err = run("pack", tok, "-o", out, "--max-len", "8")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith(f"error: {tok}: row 2: token id 300 is outside the vocabulary")
    assert not out.exists() and beside(out) == []


# --- 3: one writer per output (real processes) -----------------------------------------------


def packtool_process(*args: object, gate: Path | None = None) -> subprocess.Popen:
    """`packtool ARGS` in a process of its own; with `gate`, it writes no shard until that
    file exists (so a test can act while it holds the output)."""
    code = "import sys; from packtool.cli.commands import main; main(sys.argv[1:])"
    if gate is not None:
        code = (
            "import os, sys, time; import packtool.engines.worker as worker; real = worker.write_chunk\n"
            "def gated(*a, **k):\n"
            f"    while not os.path.exists({str(gate)!r}): time.sleep(0.02)\n"
            "    return real(*a, **k)\n"
            "worker.write_chunk = gated\n" + code
        )
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PACKTOOL_NO_PROGRESS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_concurrent_writers_in_real_processes(tmp_path, good):
    import time

    small = jsonl(tmp_path / "small.jsonl", [{"text": f"small {i}"} for i in range(50)])
    out, gate = tmp_path / "D", tmp_path / "gate"
    args = ["-o", out, "--max-len", "64", "--overwrite"]
    first = packtool_process("pack", good, *args, gate=gate)
    lock = tmp_path / ".D.packtool-lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and b"pid" in lock.read_bytes()):  # the first holds the output
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first writer never started"
        time.sleep(0.02)
    second = packtool_process("pack", small, *args)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 1, err
    line = one_error_line(err)
    assert line.startswith(
        f"error: {out} is being written by another packtool (pid {first.pid} on "
    )
    assert "packtool pack" in line and str(good) in line
    gate.touch()
    _, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    verify_dataset(out)
    assert read_manifest(out).counts["documents_packed"] == 80  # the first run's, whole
    assert beside(out) == []
    # Started together, either may win the lock; the folder holds one whole dataset.
    procs = [packtool_process("pack", f, *args) for f in (small, small)]
    codes = [p.wait(timeout=120) for p in procs]
    assert 0 in codes and set(codes) <= {0, 1}
    verify_dataset(out)
    assert read_manifest(out).counts["documents_packed"] == 50 and beside(out) == []


# --- 6, 9, 11: inputs packtool used to misread -----------------------------------------------


def test_a_dangling_symlink_inside_an_input_folder_is_an_error(tmp_path, good):
    src = tmp_path / "src"
    src.mkdir()
    (src / "good.jsonl").write_bytes(good.read_bytes())
    (src / "gone.jsonl").symlink_to(tmp_path / "nowhere.jsonl")
    code, _, err = run("pack", src, "-o", tmp_path / "O")
    assert code == 1
    assert "gone.jsonl: a symbolic link to" in one_error_line(err)
    assert not (tmp_path / "O").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX named pipes")
def test_a_fifo_input_says_it_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "stream.jsonl"
    os.mkfifo(fifo)
    code, _, err = run("pack", fifo, "-o", tmp_path / "O")
    assert code == 1
    assert one_error_line(err).startswith(f"error: {fifo}: a pipe (FIFO), not a regular file")


@pytest.mark.skipif(not Path("/dev/stdin").exists(), reason="no /dev/stdin")
def test_dev_stdin_from_a_pipe_says_so(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "packtool.cli.commands", "stats", "/dev/stdin"],
        input='{"text": "x"}\n',
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert one_error_line(done.stderr).startswith("error: /dev/stdin: a pipe (FIFO)")


@pytest.mark.parametrize(
    "column",
    [
        pa.array(["one text", "two texts", "one text"]).dictionary_encode(),
        pytest.param(
            pa.array(
                ["one text", "two texts", "one text"], getattr(pa, "string_view", pa.string)()
            ),
            marks=pytest.mark.skipif(not hasattr(pa, "string_view"), reason="pyarrow < 16"),
        ),
    ],
    ids=["dictionary", "string_view"],
)
def test_dictionary_and_string_view_text_columns_are_read(tmp_path, column):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": column}), path)
    code, _, err = run("pack", path, "-o", tmp_path / "O", "--max-len", "64")
    assert code == 0, err
    assert verify_dataset(tmp_path / "O").documents == 3


@pytest.mark.parametrize("command", ["stats", "pack"])
def test_output_to_a_reader_that_has_gone_exits_0_with_nothing_on_stderr(tmp_path, command):
    """A closed pipe is not a failure (`packtool pack ... | true`, exits.py). Before: click's own
    EPIPE handler exited 1 first, so a script saw a written dataset as failed."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(50)))
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written
    args = [command, str(corpus)] + (["-o", str(tmp_path / "out")] if command == "pack" else [])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "packtool.cli.commands", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
    finally:
        os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
    if command == "pack":
        assert verify_dataset(tmp_path / "out").rows > 0
