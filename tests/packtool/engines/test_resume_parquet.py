"""`--resume` over Parquet inputs opens no file that only finished partitions read (#13, item 5).

Not tied to a call site: every file that only finished partitions read is (1) watched with
Linux inotify, which sees every open of it by any process (pyarrow's C++ reader, a Ray worker,
Python's `open`), and (2) overwritten with zeros of the same size and given back its
modification time, so the plan's fingerprint still matches but any byte read from it (a
Parquet footer, a schema) fails or changes the dataset. The resumed dataset must be the
uninterrupted run's, byte for byte.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import random
import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.shards import ShardConfig
from packtool.engines import base, records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import output_folder, staging_folder
from packtool.engines.preflight import FACTS_KEY, check_inputs, fingerprint_of
from packtool.errors import ConfigError
from packtool.pack.chunk import PackConfig
from packtool.tokenize.tokenize import tokenize_corpus

IN_ACCESS, IN_OPEN = 0x1, 0x20


class OpenWatch:
    """Every open or read of `paths`, by any process, from now on (Linux inotify)."""

    def __init__(self, paths: list[Path]) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.names: dict[int, str] = {}
        for p in paths:
            wd = libc.inotify_add_watch(self.fd, str(p).encode(), IN_OPEN | IN_ACCESS)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {p}")
            self.names[wd] = str(p)

    def seen(self) -> set[str]:
        out: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            i = 0
            while i < len(data):
                wd, _mask, _cookie, n = struct.unpack_from("iIII", data, i)
                out.add(self.names.get(wd, "<inotify queue overflow>"))
                i += 16 + n
        os.close(self.fd)
        return out


def config(out: Path, inputs, **kw) -> RunConfig:
    # Below every Parquet file's size: a partition per file.
    kw.setdefault("partition_size", 1_000)
    return RunConfig(
        inputs=tuple(str(p) for p in inputs),
        out_dir=str(out),
        pack=PackConfig(max_len=256),
        shards=ShardConfig(shard_rows=32),
        chunk_docs=100,
        workers=1,
        progress=False,
        **kw,
    )


def words(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join("".join(rng.choices("abcdefghij", k=rng.randint(1, 8))) for _ in range(30))


def text_parquet(folder: Path) -> Path:
    folder.mkdir(parents=True)
    for i in range(6):
        texts = [words(i * 100 + j) for j in range(40)]
        pq.write_table(pa.table({"text": texts}), folder / f"t-{i}.parquet")
    return folder


def jsonl(raw: Path) -> Path:
    raw.mkdir(parents=True)
    for i in range(6):
        lines = [json.dumps({"text": words(i * 100 + j)}) for j in range(40)]
        (raw / f"r-{i}.jsonl").write_text("\n".join(lines) + "\n")
    return raw


def tokenized_parquet(tmp_path: Path) -> Path:
    raw = jsonl(tmp_path / "raw")
    out = tmp_path / "tok"
    out.mkdir()
    for i in range(6):  # one tokenized file per raw file
        tokenize_corpus([raw / f"r-{i}.jsonl"], out / f"t-{i}.parquet", progress=False)
    return out


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("*")) if p.is_file()}


def interrupt_after(out: Path, inputs: list[Path], finished: int, monkeypatch, **kw) -> dict:
    """Run until `finished` partitions have a record, then Ctrl-C; the saved state."""
    staging = staging_folder(out)
    real = worker.write_chunk

    def stop(writer, packed):
        if len(records.finished(staging)) >= finished:
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", stop)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(out, inputs, **kw))
    monkeypatch.undo()
    assert len(records.finished(staging)) == finished
    return json.loads((staging / records.RUN_DIR / records.PLAN_FILE).read_text())


def finished_only_files(state: dict, done: set[int]) -> tuple[list[Path], list[Path]]:
    plan = state["plan"]
    files = plan["files"]
    finished, todo = set(), set()
    for p, part in enumerate(plan["partitions"]):
        for f, _, _ in part:
            (finished if p in done else todo).add(files[f][0])
    return sorted(Path(f) for f in finished - todo), sorted(Path(f) for f in todo)


def zero_keeping_stat(path: Path) -> None:
    """Same size, same modification time, no byte of the original."""
    st = path.stat()
    path.write_bytes(b"\0" * st.st_size)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns


@pytest.mark.parametrize("kind", ["text", "tokenized", "jsonl"])
def test_resume_over_parquet_opens_no_file_of_a_finished_partition(kind, tmp_path, monkeypatch):
    make = {"text": lambda: text_parquet(tmp_path / "text"), "jsonl": lambda: jsonl(tmp_path / "j")}
    folder = make.get(kind, lambda: tokenized_parquet(tmp_path))()
    inputs = [folder]
    kw = {}
    if kind == "jsonl":  # a partition per file, not byte ranges of one
        kw["partition_size"] = max(p.stat().st_size for p in folder.iterdir()) + 1
    whole = run_pack(config(tmp_path / "whole", inputs, **kw))
    state = interrupt_after(tmp_path / "cut", inputs, 3, monkeypatch, **kw)
    assert len(state["plan"]["partitions"]) >= 5
    finished, todo = finished_only_files(state, {0, 1, 2})
    assert finished and todo
    for p in finished:
        zero_keeping_stat(p)
    watch = OpenWatch(finished + todo)
    summary = run_pack(config(tmp_path / "cut", inputs, resume=True, **kw))
    seen = watch.seen()
    assert not seen & {str(p) for p in finished}, sorted(seen)
    assert {str(p) for p in todo} <= seen  # the watch works: the other files were read
    assert summary.resumed_partitions == 3
    assert summary.counts == whole.counts
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")


def test_resume_over_changed_parquet_names_the_file(tmp_path, monkeypatch):
    folder = text_parquet(tmp_path / "text")
    state = interrupt_after(tmp_path / "cut", [folder], 2, monkeypatch)
    victim = Path(state["plan"]["files"][0][0])
    os.utime(victim, ns=(victim.stat().st_atime_ns, victim.stat().st_mtime_ns + 1))
    with pytest.raises(ConfigError) as e:
        run_pack(config(tmp_path / "cut", [folder], resume=True))
    message = str(e.value)
    assert message.endswith(f"options or inputs differ (inputs: {victim} changed)")
    assert "\n" not in message


def test_a_state_without_saved_input_facts_still_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    """A run state written before the facts were saved: the inputs are read again, as then."""
    folder = tokenized_parquet(tmp_path)
    whole = run_pack(config(tmp_path / "whole", [folder]))
    interrupt_after(tmp_path / "cut", [folder], 2, monkeypatch)
    plan_file = staging_folder(tmp_path / "cut") / records.RUN_DIR / records.PLAN_FILE
    state = json.loads(plan_file.read_text())
    assert state.pop(FACTS_KEY)["mode"] == "tokenized"
    plan_file.write_text(json.dumps(state))
    summary = run_pack(config(tmp_path / "cut", [folder], resume=True))
    assert summary.resumed_partitions == 2
    assert summary.counts == whole.counts
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")


def test_a_resume_with_matching_facts_opens_no_input_before_its_partitions(tmp_path, monkeypatch):
    """Preflight and the plan of a resume (under the output lock, `check_facts` included) take
    what they know of the inputs from the saved state: no input file is opened at all."""
    folder = tokenized_parquet(tmp_path)
    whole = run_pack(config(tmp_path / "whole", [folder]))
    interrupt_after(tmp_path / "cut", [folder], 2, monkeypatch)
    inputs = sorted(folder.iterdir())
    watch = OpenWatch(inputs)
    checked = check_inputs(config(tmp_path / "cut", [folder], resume=True), None)
    cfg = checked.config  # as the engines go on: long_docs decided
    with (
        pytest.raises(KeyboardInterrupt),
        output_folder(cfg, fingerprint_of(cfg, checked)) as output,
    ):
        run = base.Run(cfg, checked, output)
        raise KeyboardInterrupt  # leave before any partition runs; the staging folder stays
    assert watch.seen() == set()
    assert run.resumed == 2 and len(run.todo) == len(inputs) - 2
    watch = OpenWatch(inputs)
    summary = run_pack(cfg)
    assert len(watch.seen()) == len(inputs) - 2  # the watch works: the partitions' files open
    assert summary.counts == whole.counts
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")


def test_facts_that_changed_under_the_lock_are_refused_naming_the_file(tmp_path, monkeypatch):
    """`check_facts`: the saved state is replaced between `check_inputs` (no lock yet) and the
    lock, by one that read an input differently: the resume stops, naming the file."""
    folder = jsonl(tmp_path / "j")
    kw = {"partition_size": max(p.stat().st_size for p in folder.iterdir()) + 1}
    interrupt_after(tmp_path / "cut", [folder], 2, monkeypatch, **kw)
    checked = check_inputs(config(tmp_path / "cut", [folder], resume=True, **kw), None)
    cfg = checked.config  # as the engines go on: long_docs decided
    plan_file = staging_folder(tmp_path / "cut") / records.RUN_DIR / records.PLAN_FILE
    state = json.loads(plan_file.read_text())
    assert state[FACTS_KEY]["kinds"] == ["jsonl"] * 6
    state[FACTS_KEY]["kinds"][3] = "json_array"  # as another run that saw a `[` there
    plan_file.write_text(json.dumps(state))
    with (
        pytest.raises(ConfigError) as e,
        output_folder(cfg, fingerprint_of(cfg, checked)) as output,
    ):
        base.Run(cfg, checked, output)
    message = str(e.value)
    assert message == (
        f"cannot resume {cfg.out_dir}: the inputs read differently from the saved run "
        f"({checked.paths[3]} read as jsonl, not json_array); start over with --overwrite / overwrite=True"
    )
    assert checked.paths[3] == sorted(folder.iterdir())[3]
    assert staging_folder(tmp_path / "cut").is_dir()  # a resumed run's work is kept
