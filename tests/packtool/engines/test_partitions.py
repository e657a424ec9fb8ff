"""The partition engine on a generated 1,000-file corpus (tests/packtool/scale_corpus.py).

The same bytes whatever the number of workers; efficiency within 0.05 points of one chunk, also
with a tail tree of two levels (and its bytes unchanged by a stop mid-tree and a resume);
`--resume` reads no byte of a finished partition; an input changed between planning and reading
is a one-line error naming it; every packed id leads back to its file and line.
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from pathlib import Path

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest

from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import read_manifest
from packtool.dataset.shards import ShardConfig
from packtool.engines import base as base_engine
from packtool.engines import merge, records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import staging_folder
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import PackConfig
from packtool.read import docids, formats
from packtool.read import lines as corpus_lines
from tests.packtool.scale_corpus import make_corpus

PARTITION = 200_000  # ~1.9 MB of input: ~10 partitions; the big JSONL and Parquet files are cut


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("scale") / "in"
    make_corpus(folder, big_bytes=1_200_000)
    return folder


def config(out: Path, inputs, **kw) -> RunConfig:
    kw.setdefault("partition_size", PARTITION)
    kw.setdefault("chunk_docs", 1000)
    return RunConfig(
        inputs=tuple(str(p) for p in inputs),
        out_dir=str(out),
        pack=kw.pop("pack", PackConfig(max_len=1024)),
        shards=ShardConfig(shard_rows=128),
        progress=False,
        **kw,
    )


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory):
    """One uninterrupted run with one worker, and one with the whole corpus as one chunk."""
    base = tmp_path_factory.mktemp("ref")
    one_worker = run_pack(config(base / "w1", [corpus], workers=1))
    one_chunk = run_pack(
        config(base / "one", [corpus], workers=1, partition_size=1 << 40, chunk_docs=10**9)
    )
    return base, one_worker, one_chunk


def test_the_plan_cuts_big_files_and_groups_tiny_ones(reference):
    base, summary, _ = reference
    plan = read_manifest(base / "w1").extra
    assert summary.partitions == plan["partitions"] >= 8
    assert plan["doc_ids"]["num_files"] == 1007 and (base / "w1" / docids.SOURCES_FILE).is_file()
    # The big file's bad lines, counted in the records of the partitions that own them.
    assert summary.skips == {"invalid_utf8": 10, "malformed_json": 10}


def test_verify_and_inspect_check_the_list_of_sources(reference, tmp_path):
    """Past 1,000 inputs the list is in sources.json, whose sha256 index.json records: verify
    passed an edited, deleted or FIFO list (never reading it), and inspect then credited
    documents to the wrong file or left the place out without a word."""
    import shutil

    from packtool.audit.inspect import inspect_dataset

    base, _, _ = reference
    verify_dataset(base / "w1")  # the list as written passes
    edited, gone, fifo = (tmp_path / n for n in ("edited", "gone", "fifo"))
    for d in (edited, gone, fifo):
        shutil.copytree(base / "w1", d)
    listed = edited / docids.SOURCES_FILE
    listed.write_text(listed.read_text().replace("a-0003.jsonl", "a-0999.jsonl"))
    (gone / docids.SOURCES_FILE).unlink()
    (fifo / docids.SOURCES_FILE).unlink()
    os.mkfifo(fifo / docids.SOURCES_FILE)
    with pytest.raises(DataError, match="its sha256 is not the one index.json records"):
        verify_dataset(edited)
    with pytest.raises(DataError, match="unreadable list of input files .*No such file"):
        verify_dataset(gone)
    with pytest.raises(DataError, match="unreadable list of input files .*not a regular file"):
        verify_dataset(fifo)
    row = inspect_dataset(edited, row=0).row
    assert row.documents[0].source.startswith("unknown (")
    assert "its sha256 is not the one index.json records" in row.documents[0].source
    # The snippet in docs/pack.md, with the folder the list lives in.
    doc_id = int(row.documents[0].doc_id)
    file, _ = docids.locate(read_manifest(base / "w1").extra, doc_id, base / "w1")
    assert Path(file).exists()


def test_the_same_bytes_with_two_worker_processes(reference, corpus, tmp_path):
    base, one, _ = reference
    two = run_pack(config(tmp_path / "w2", [corpus], workers=2))
    assert "2 partition worker process" in two.cores_used
    assert shard_bytes(tmp_path / "w2") == shard_bytes(base / "w1")
    assert (tmp_path / "w2" / "index.json").read_bytes() == (
        base / "w1" / "index.json"
    ).read_bytes()
    assert two.counts == one.counts


def test_efficiency_is_within_0_05_points_of_one_chunk(reference):
    base, parts, one = reference
    assert parts.counts.documents_packed == one.counts.documents_packed
    assert parts.counts.tokens_out == one.counts.tokens_out
    assert one.efficiency - parts.efficiency < 0.0005, (parts.efficiency, one.efficiency)
    assert verify_dataset(base / "w1", checksums=True).rows == parts.counts.rows


def test_every_id_leads_back_to_its_file_and_line(reference):
    base, _, _ = reference
    out = base / "w1"
    extra = read_manifest(out).extra
    table = pq.read_table(sorted(out.glob("shard-*.parquet"))[3])
    checked = 0
    for ids, chunks, tokens, offs in zip(
        table.column("doc_ids").to_pylist(),
        table.column("doc_chunks").to_pylist(),
        table.column("input_ids").to_pylist(),
        table.column("doc_offsets").to_pylist(),
        strict=True,
    ):
        for k, (doc_id, chunk) in enumerate(zip(ids, chunks, strict=True)):
            if chunk != 0:
                continue
            file, offset, unit = docids.source(extra, doc_id, out)
            ids_k = [t for t in tokens[offs[k] : offs[k + 1]] if t < 256]  # without the EOS
            text = bytes(ids_k).decode("utf-8", "replace")
            if unit == "byte":
                data = Path(file).read_bytes()
                line = data[offset:].split(b"\n", 1)[0].removeprefix(corpus_lines.BOM)
                original = json.loads(line)["text"]
                place = docids.place(extra, doc_id, out)
                line_no = data[:offset].count(b"\n") + 1
                assert place == f"{file}:line {line_no} (byte {offset})"
            else:
                assert unit == "row" and file.endswith(".parquet")
                original = pq.read_table(file).column("text")[offset].as_py()
            assert original.encode().startswith(text.encode()[: len(text) - 1][:50])
            checked += 1
    assert checked > 50


def test_resume_reads_no_byte_of_a_finished_partition(reference, corpus, tmp_path, monkeypatch):
    base, whole, _ = reference
    out = tmp_path / "cut"
    staging = staging_folder(out)
    real = worker.write_chunk

    def stop_after_five(writer, packed):
        if len(records.finished(staging)) >= 5:
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", stop_after_five)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(out, [corpus], workers=1))
    monkeypatch.undo()
    done = records.finished(staging)
    assert len(done) == 5
    plan = json.loads((staging / records.RUN_DIR / records.PLAN_FILE).read_text())["plan"]
    files = plan["files"]

    # Count every byte the readers take from an input (JSONL ranges, whole files, Parquet).
    opened: list[tuple[str, int]] = []  # (path, bytes read)
    real_open, real_stream = corpus_lines.storage.open_input, corpus_lines.open_stream

    class Counting:
        def __init__(self, f, path):
            self.f, self.path, self.n = f, str(path), 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            opened.append((self.path, self.n))
            self.f.close()

        def __iter__(self):
            for line in self.f:
                self.n += len(line)
                yield line

        def read(self, *a):
            data = self.f.read(*a)
            self.n += len(data)
            return data

        def readline(self, *a):
            data = self.f.readline(*a)
            self.n += len(data)
            return data

        def seek(self, *a):
            return self.f.seek(*a)

    # Every open of lines.py goes through the storage seam: count those of this module only.
    monkeypatch.setattr(
        corpus_lines,
        "storage",
        types.SimpleNamespace(open_input=lambda p, *a, **k: Counting(real_open(p, *a, **k), p)),
    )
    monkeypatch.setattr(corpus_lines, "open_stream", lambda p: Counting(real_stream(p), p))
    parquet_reads: list[str] = []
    real_read_parquet = formats.PARQUET.read

    def counting_read_parquet(path, *a, **k):
        parquet_reads.append(str(path))
        return real_read_parquet(path, *a, **k)

    counting = dataclasses.replace(formats.PARQUET, read=counting_read_parquet)
    monkeypatch.setattr(
        formats, "FORMATS", tuple(counting if f is formats.PARQUET else f for f in formats.FORMATS)
    )
    summary = run_pack(config(out, [corpus], workers=1, resume=True))
    monkeypatch.undo()
    assert summary.resumed_partitions == 5
    assert shard_bytes(out) == shard_bytes(base / "w1")
    assert summary.counts == whole.counts

    finished_only = set()
    todo_files = set()
    for p, part in enumerate(plan["partitions"]):
        for f, _, _ in part:
            (finished_only if p in done else todo_files).add(files[f][0])
    finished_only -= todo_files
    assert finished_only  # whole files that only finished partitions read
    read = {path for path, n in opened if n} | set(parquet_reads)
    assert not read & finished_only, sorted(read & finished_only)[:3]

    # A file cut into ranges: the resumed run reads its unfinished ranges only (plus at most one
    # line across each range's end), never a finished range. (Compressed files are read whole
    # and counted decompressed: they are left out of this sum; they were checked above.)
    def plain(path: str) -> bool:
        return not path.endswith((".parquet", ".zst", ".gz"))

    todo_bytes = sum(
        (files[f][1] if e == -1 else e - s)
        for p, part in enumerate(plan["partitions"])
        if p not in done
        for f, s, e in part
        if plain(files[f][0])
    )
    assert sum(n for path, n in opened if plain(path)) <= todo_bytes + 10 * 4096


def test_an_input_changed_between_plan_and_read_names_the_file(corpus, tmp_path, monkeypatch):
    import shutil

    folder = tmp_path / "in"
    shutil.copytree(corpus, folder)
    victim = folder / "b-big.jsonl"
    real = worker.write_chunk
    touched = []

    def edit_the_input(writer, packed):
        if not touched:
            with open(victim, "ab") as f:
                f.write(b'{"text": "appended while packing"}\n')
            touched.append(1)
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", edit_the_input)
    with pytest.raises(DataError) as e:
        run_pack(config(tmp_path / "out", [folder], workers=1))
    message = str(e.value)
    assert message.startswith(f"{victim}: changed since the run was planned (size ")
    assert "\n" not in message and "--overwrite" in message
    monkeypatch.undo()
    os.utime(victim)
    # A run stopped by a changed input keeps nothing a resume could wrongly finish, and a plain
    # rerun (what the message says: "run it again", no restore) packs the final file.
    with pytest.raises(ConfigError, match="nothing to resume|no interrupted run|differ"):
        run_pack(config(tmp_path / "out", [folder], workers=1, resume=True))
    assert "run it again once they are final" in message
    assert run_pack(config(tmp_path / "out", [folder], workers=1)).partitions >= 1


def test_a_killed_worker_process_is_replaced_and_the_bytes_are_unchanged(
    reference, corpus, tmp_path
):
    """SIGKILL one of the local engine's worker processes mid-run: the pool is rebuilt, the
    unfinished partitions run again, and the dataset is the one an uninterrupted run makes."""
    import multiprocessing
    import signal
    import threading
    import time

    base, _, _ = reference
    out = tmp_path / "killed"
    staging = staging_folder(out)
    killed: list[int] = []

    def kill_one_worker():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            workers = multiprocessing.active_children()
            if workers and records.finished(staging):  # mid-run: a partition is done
                os.kill(workers[0].pid, signal.SIGKILL)
                killed.append(workers[0].pid)
            time.sleep(0.005)

    killer = threading.Thread(target=kill_one_worker, daemon=True)
    killer.start()
    run_pack(config(out, [corpus], workers=2))
    killer.join(timeout=5)
    assert killed, "no worker process was killed: the run ended first"
    assert shard_bytes(out) == shard_bytes(base / "w1")
    assert (out / "index.json").read_bytes() == (base / "w1" / "index.json").read_bytes()


def _stopped_after(finished: int, out: Path, corpus: Path | str, monkeypatch) -> Path:
    """A one-worker run of `corpus` into `out` stopped (Ctrl-C) once `finished` partitions are
    recorded, in the next one's first shard; its staging folder."""
    staging = staging_folder(out)
    real = worker.write_chunk

    def stop_in_the_next_partition(writer, packed):
        if len(records.finished(staging)) == finished:
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", stop_in_the_next_partition)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(out, [corpus], workers=1))
    monkeypatch.undo()
    return staging


def test_a_killed_writers_temporary_file_does_not_reach_the_dataset(corpus, tmp_path, monkeypatch):
    """A worker killed mid-shard leaves `.NAME.<writer>.tmp` in the staging folder; the finished
    dataset holds no such file."""
    out = tmp_path / "out"
    staging = _stopped_after(2, out, corpus, monkeypatch)
    (staging / ".shard-000002-00000.parquet.999-deadbeef.tmp").write_bytes(b"half a shard")
    run_pack(config(out, [corpus], workers=1, resume=True))
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]
    assert not verify_dataset(out).warnings


# --- the tail tree (packtool/engines/merge.py), with a small fan-in so ~21 partitions make one ---

TREE_PARTITION = 100_000  # ~1 MB of input: 21 partitions


def tree_config(out: Path, corpus: Path, **kw) -> RunConfig:
    return config(out, [corpus], partition_size=TREE_PARTITION, **kw)


@pytest.fixture(scope="module")
def tree_runs(corpus, tmp_path_factory):
    """Uninterrupted one-worker runs with a tail tree: fan-in 8 (21 partitions: 3 level-1
    nodes, then the root) and fan-in 4 (21 -> 6 -> 2 nodes, then the root)."""
    base = tmp_path_factory.mktemp("tree")
    runs = {}
    with pytest.MonkeyPatch.context() as mp:
        for fan_in in (8, 4):
            mp.setattr(merge, "TAIL_FAN_IN", fan_in)
            runs[fan_in] = run_pack(tree_config(base / f"f{fan_in}", corpus, workers=1))
    return base, runs


def test_at_most_64_partitions_the_tree_is_the_root_alone_as_partition_n(reference):
    """The final stage before the tree: "partition N" packs every partition's tail, last."""
    base, summary, _ = reference
    n = summary.partitions
    assert n <= merge.TAIL_FAN_IN
    listed = [s.file for s in read_manifest(base / "w1").shards]
    assert {int(f.split("-")[1]) for f in listed} <= set(range(n + 1))
    assert listed[-1].startswith(f"shard-{n:06d}-") and listed == sorted(listed)


def test_a_tail_tree_keeps_efficiency_within_0_05_points_of_one_chunk(tree_runs, reference):
    base, runs = tree_runs
    _, _, one = reference
    for fan_in, summary in runs.items():
        tree = merge.TailTree(summary.partitions, fan_in)
        assert summary.partitions == 21 and tree.levels == (1 if fan_in == 8 else 2)
        names = {int(p.name.split("-")[1]) for p in (base / f"f{fan_in}").glob("shard-*")}
        assert names & set(tree.level_ids(1)) and tree.root in names  # the nodes wrote rows
        assert summary.counts.documents_packed == one.counts.documents_packed
        assert summary.counts.tokens_out == one.counts.tokens_out
        assert verify_dataset(base / f"f{fan_in}", checksums=True).rows == summary.counts.rows
    # Two levels (3 nodes of 8 partitions' tails, then the root): one row more than one chunk,
    # as without the tree (one row of this 2,534-row corpus is 0.04 points).
    assert one.efficiency - runs[8].efficiency < 0.0005, (runs[8].efficiency, one.efficiency)
    # Three levels of fan-in 4 pack each node's pieces with 3 other partitions' only, so the
    # rows they write keep gaps only other partitions' small pieces could fill: one row more
    # here (with F = 64, a node packs 64 partitions' tails, as rich as this whole corpus's).
    assert one.efficiency - runs[4].efficiency < 0.001, (runs[4].efficiency, one.efficiency)


def test_a_tail_tree_is_the_same_with_two_workers_and_after_a_stop_mid_tree(
    tree_runs, corpus, tmp_path, monkeypatch
):
    base, runs = tree_runs
    want = base / "f4"
    monkeypatch.setattr(merge, "TAIL_FAN_IN", 4)
    two = run_pack(tree_config(tmp_path / "w2", corpus, workers=2))
    assert "2 partition worker process" in two.cores_used
    assert shard_bytes(tmp_path / "w2") == shard_bytes(want)
    assert (tmp_path / "w2" / "index.json").read_bytes() == (want / "index.json").read_bytes()

    # Stop (as a killed driver) once every level-1 node has its record.
    tree = merge.TailTree(21, 4)
    out = tmp_path / "cut"
    real_account = base_engine.Run.account

    def driver_dies(self, record):
        real_account(self, record)
        if self.totals.merges == len(tree.level_ids(1)):
            raise KeyboardInterrupt

    monkeypatch.setattr(base_engine.Run, "account", driver_dies)
    with pytest.raises(KeyboardInterrupt):
        run_pack(tree_config(out, corpus, workers=1))
    monkeypatch.undo()
    done = set(records.finished(staging_folder(out)))
    assert done == set(range(tree.level_ids(2).start))  # partitions and level 1, nothing above

    # The resume builds the saved tree (fan-in 4, not today's 64) and runs only what is left.
    ran: list[int] = []
    real_node = merge.merge_node

    def counting(ctx, descriptor):
        ran.append(descriptor["index"])
        return real_node(ctx, descriptor)

    monkeypatch.setattr(merge, "merge_node", counting)
    summary = run_pack(tree_config(out, corpus, workers=1, resume=True))
    assert summary.resumed_partitions == 21
    assert sorted(ran) == [*tree.level_ids(2), tree.root]
    assert shard_bytes(out) == shard_bytes(want)
    assert (out / "index.json").read_bytes() == (want / "index.json").read_bytes()
    assert summary.counts == runs[4].counts


def test_each_merge_node_reads_only_its_childrens_tails(corpus, tmp_path, monkeypatch):
    """The bookkeeping stays constant: a node reads its children's tails and nothing else, and
    the root's input is at most F tails of at most 32 rows each."""
    monkeypatch.setattr(merge, "TAIL_FAN_IN", 4)
    tree = merge.TailTree(21, 4)
    current: list[int] = []
    reads: list[tuple[int, int, int]] = []  # (node, child, tokens)
    real_node, real_read = merge.merge_node, records.read_tail

    def node(ctx, descriptor):
        current.append(descriptor["index"])
        return real_node(ctx, descriptor)

    def read(path):
        table = real_read(path)
        tokens = int(pa.compute.sum(table.column("length")).as_py())
        reads.append((current[-1], int(Path(path).stem), tokens))
        return table

    monkeypatch.setattr(merge, "merge_node", node)
    monkeypatch.setattr(records, "read_tail", read)
    run_pack(tree_config(tmp_path / "out", corpus, workers=1))
    assert sorted(current) == list(range(21, tree.root + 1))  # each node once
    assert len({child for _, child, _ in reads}) == len(reads)  # each tail read once
    for n, child, tokens in reads:
        assert child in tree.children(n), (n, child)
        assert tokens <= 32 * 1024  # a tail: at most 32 rows of at most max_len tokens
    root_reads = [t for n, _, t in reads if n == tree.root]
    assert 1 <= len(root_reads) <= 4 and sum(root_reads) <= 4 * 32 * 1024


def _meeting(calls: int, real):
    """`real`, wrapped so that its first `calls` calls wait for each other (a barrier): calls
    made one after another never meet, and the barrier breaks after 20 s."""
    import threading

    barrier = threading.Barrier(calls, timeout=20)
    seen = [0]
    lock = threading.Lock()

    def wrapped(*args):
        with lock:
            seen[0] += 1
            first = seen[0] <= calls
        if first:
            barrier.wait()
        return real(*args)

    return wrapped


def test_records_are_read_side_by_side(corpus, tmp_path, monkeypatch):
    """The records index.json's shard list streams (`records_in_order`), and the finished
    partitions' records and their shards' stats at a resume: one after another, each read
    waited a round trip on a bucket (10^5 records at 20 ms: half an hour)."""
    out = tmp_path / "out"
    staging = _stopped_after(3, out, corpus, monkeypatch)
    monkeypatch.setattr(records, "read_record", _meeting(2, records.read_record))
    got = [r["shards"] for r in records.records_in_order(staging, 3)]
    monkeypatch.undo()
    assert got == [records.read_record(staging, p)["shards"] for p in range(3)]
    checked = base_engine.Run._checked_record
    monkeypatch.setattr(base_engine.Run, "_checked_record", _meeting(3, checked))
    run_pack(config(out, [corpus], workers=1, resume=True))
    assert not verify_dataset(out).warnings


def test_a_resume_naming_the_same_files_another_way_says_so(corpus, tmp_path, monkeypatch):
    """A run given `in` (relative, from the corpus's parent folder), resumed from elsewhere
    with the absolute path: refused (doc ids name the files as first given), and the line said
    only "inputs: /abs/in/a-0000.jsonl added", not that the file taken for removed was it."""
    out = tmp_path / "out"
    monkeypatch.chdir(corpus.parent)
    _stopped_after(2, out, corpus.name, monkeypatch)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        run_pack(config(out, [corpus], workers=1, resume=True))
    line = str(caught.value)
    assert f"inputs: {corpus}/a-0000.jsonl added, {corpus.name}/a-0000.jsonl removed" in line
    assert "(the same file named another way? give the inputs as the first run did)" in line
