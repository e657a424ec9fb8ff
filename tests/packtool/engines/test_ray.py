"""The Ray engine against the local engine, on a real two-node Ray cluster: the same dataset
byte for byte, a killed worker process, a node removed mid-run, a killed driver resumed.

The cluster (`ray_session` / `ray_cluster` in conftest.py) has two nodes of 1 CPU each, each
with its own raylet and object store, so partition tasks run on both. The missing-extra tests
run without Ray.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import socket
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packtool.audit.verify import verify_dataset
from packtool.cli.commands import cli, main
from packtool.dataset.shards import ShardConfig
from packtool.engines import base, merge, records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import staging_folder
from packtool.engines.summary import PackSummary
from packtool.errors import ConfigError, DataError, MissingDependencyError, WorkersLost
from packtool.pack.chunk import PackConfig
from packtool.read.documents import ReadConfig
from tests.packtool.conftest import RAY_ENV
from tests.packtool.scale_corpus import make_corpus

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"
PARTITION = 600_000  # sample_data's 3.0 MB: 6 partitions (byte ranges of one file)


def config(out: Path, inputs=(CORPUS,), **kw) -> RunConfig:
    kw.setdefault("pack", PackConfig(max_len=2048))
    kw.setdefault("shards", ShardConfig(shard_rows=100))
    kw.setdefault("partition_size", PARTITION)
    kw.setdefault("chunk_docs", 400)
    kw.setdefault("workers", 1)
    return RunConfig(inputs=tuple(str(p) for p in inputs), out_dir=str(out), progress=False, **kw)


def run_ray(cfg: RunConfig, **ray_kw):
    from packtool.engines.ray import RayConfig, run_pack_ray

    return run_pack_ray(cfg, RayConfig(**ray_kw))


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def manifest_without_command(out: Path) -> dict:
    data = json.loads((out / "index.json").read_text())
    data.pop("command")
    return data


@pytest.fixture(scope="module")
def local(tmp_path_factory) -> tuple[Path, PackSummary]:
    """The local engine's dataset of sample_data with `config`'s defaults, and its summary: what
    the tests that run the Ray engine with those options compare with (they only read it)."""
    out = tmp_path_factory.mktemp("reference") / "local"
    return out, run_pack(config(out))


def assert_same_as_local(ray_out: Path, local_out: Path) -> None:
    assert manifest_without_command(ray_out) == manifest_without_command(local_out)
    assert shard_bytes(ray_out) == shard_bytes(local_out)
    assert sorted(p.name for p in ray_out.iterdir()) == sorted(p.name for p in local_out.iterdir())


@pytest.mark.parametrize(
    ("pack", "actors"),
    [
        (PackConfig(max_len=2048), None),
        # One actor: `ffd` is the run with a pool on both nodes (the cluster's CPUs); this one
        # is about the options, and a second actor process cost ~3 s of CPU.
        (PackConfig(max_len=1024, algorithm="bfd", rounds=3, seed=7, group_by="lang"), 1),
    ],
    ids=["ffd", "bfd-rounds-groups"],
)
def test_ray_is_byte_identical_to_the_local_engine(ray_session, tmp_path, pack, actors, request):
    read = ReadConfig(extra_fields=("lang",) if pack.group_by == "lang" else ())
    if config(tmp_path, pack=pack, read=read) == config(tmp_path):  # the module's reference
        local_out, want = request.getfixturevalue("local")
    else:
        local_out = tmp_path / "local"
        want = run_pack(config(local_out, pack=pack, read=read))
    got = run_ray(config(tmp_path / "ray", pack=pack, read=read), actors=actors)
    assert_same_as_local(tmp_path / "ray", local_out)
    assert got.partitions == want.partitions == 6
    assert got.counts == want.counts and got.skips == want.skips == {"empty": 6}
    pool = f"a Ray Data pool of up to {actors or 2} partition actor(s)"  # default: one per CPU
    assert f"Ray: 2 CPU(s) in the cluster, {pool}" in got.cores_used
    assert verify_dataset(tmp_path / "ray", checksums=True).rows == got.counts.rows
    # Every document exactly once, with all of its tokens.
    table = pq.read_table(sorted(str(p) for p in (tmp_path / "ray").glob("shard-*.parquet")))
    pieces: dict[int, int] = {}
    for offsets, ids in zip(
        table.column("doc_offsets").to_pylist(), table.column("doc_ids").to_pylist(), strict=True
    ):
        for doc, a, b in zip(ids, offsets, offsets[1:], strict=False):
            pieces[doc] = pieces.get(doc, 0) + b - a
    assert len(pieces) == got.counts.documents_packed == 4024  # of 4,030 lines, 6 empty
    assert sum(pieces.values()) == got.counts.tokens_out == got.counts.tokens_in


def test_ray_is_byte_identical_with_a_tail_tree_and_resumes_mid_tree(
    ray_session, tmp_path, monkeypatch
):
    """Fan-in 2 over the 6 partitions: 3 level-1 nodes, 2 level-2 nodes, the root (unit 11).
    The merge nodes run as Ray tasks, a wave per level; a driver stopped after the first
    merge record is resumed on Ray: between them the two runs made every level of the tree on
    Ray, and the result is the local engine's bytes. One actor per pool: a wave per level is
    the point here, not parallel actors (each pool of two cost an actor process more)."""
    monkeypatch.setattr(merge, "TAIL_FAN_IN", 2)
    tree = merge.TailTree(6, 2)
    assert tree.sizes == (6, 3, 2) and tree.root == 11
    run_pack(config(tmp_path / "local"))
    names = {int(p.name.split("-")[1]) for p in (tmp_path / "local").glob("shard-*")}
    assert names & set(tree.level_ids(1)) and tree.root in names

    real = base.Run.account

    def driver_dies(self, record):
        real(self, record)
        if "merge" in record:
            raise KeyboardInterrupt  # partitions done, one merge node recorded

    monkeypatch.setattr(base.Run, "account", driver_dies)
    with pytest.raises(KeyboardInterrupt):
        run_ray(config(tmp_path / "cut"), actors=1)
    monkeypatch.setattr(base.Run, "account", real)
    done = set(records.finished(staging_folder(tmp_path / "cut")))
    assert set(range(6)) <= done and done & set(tree.level_ids(1))
    assert tree.root not in done
    summary = run_ray(config(tmp_path / "cut", resume=True), actors=1)
    assert summary.resumed_partitions == summary.partitions == 6
    assert_same_as_local(tmp_path / "cut", tmp_path / "local")


def test_cli_engine_ray_on_tokenized_parquet(ray_session, tmp_path):
    """`packtool pack --engine ray` through the CLI, on `packtool tokenize` output (one actor:
    `--workers 1`; the pool on both nodes is `test_ray_is_byte_identical_to_the_local_engine`'s)."""
    runner = CliRunner()
    tok = tmp_path / "tok.parquet"
    assert runner.invoke(cli, ["tokenize", str(CORPUS), "-o", str(tok)]).exit_code == 0
    common = [str(tok), "--max-len", "4096", "--chunk-docs", "1500", "--shard-rows", "64"]
    common += ["--partition-size", "200KB"]
    ray = ["-o", str(tmp_path / "ray"), "--engine", "ray", "--workers", "1"]
    result = runner.invoke(cli, ["pack", *common, *ray])
    assert result.exit_code == 0, result.output
    assert "Ray: 2 CPU(s) in the cluster, a Ray Data pool of up to 1 " in result.output
    assert runner.invoke(cli, ["pack", *common, "-o", str(tmp_path / "local")]).exit_code == 0
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")


def test_relative_inputs_and_output_mean_the_same_on_the_ray_engine(
    ray_session, tmp_path, monkeypatch
):
    """A Ray actor starts in a folder of Ray's: relative paths are resolved where packtool ran
    (they failed as "cannot be read any more" before), with the local engine's bytes. One
    actor (`--workers 1`): an actor's folder is the point, not a pool of them."""
    import shutil

    shutil.copy(CORPUS, tmp_path / "corpus.jsonl")
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    common = ["corpus.jsonl", "--max-len", "1024", "--partition-size", "200KB"]
    result = runner.invoke(cli, ["pack", *common, "-o", "ray", "--engine", "ray", "--workers", "1"])
    assert result.exit_code == 0, result.output
    # The local engine's bytes, in this process (a pool of workers writes the same ones)
    assert runner.invoke(cli, ["pack", *common, "-o", "local", "--workers", "1"]).exit_code == 0
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """The 1,000-file corpus and the local engine's dataset of it."""
    base_dir = tmp_path_factory.mktemp("gen")
    make_corpus(base_dir / "in", big_bytes=600_000)
    kw = {"pack": PackConfig(max_len=1024), "partition_size": 150_000, "chunk_docs": 500}
    run_pack(config(base_dir / "local", [base_dir / "in"], **kw))
    return base_dir, kw


def test_a_killed_worker_and_a_removed_node_leave_the_bytes_unchanged(
    generated, ray_cluster, tmp_path, monkeypatch
):
    """On the 1,000-file corpus (tiny files, ranges of a big one, .zst, Parquet, bad lines):
    the worker process of one partition dies (os._exit), and a third node is removed from the
    cluster while it runs a partition; Ray runs both again elsewhere."""
    from packtool.engines import ray as ray_engine

    base_dir, kw = generated
    victim = ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    victim_id = victim.node_id
    killed, on_victim = tmp_path / "killed", tmp_path / "on-victim"

    # Defined here, so Ray ships it by value to the workers.
    def flaky(key, blob, descriptor):
        import os

        import ray

        from packtool.engines import ray as engine

        here = ray.get_runtime_context().get_node_id()
        # The other nodes' tasks wait until one runs on the victim, so a quick run cannot end
        # before the scheduler has placed a partition there (it would on a quiet machine).
        deadline = time.monotonic() + 60
        while here != victim_id and not on_victim.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if here == victim_id and not on_victim.exists():
            on_victim.touch()
            time.sleep(120)  # until the node is removed under it
        if descriptor["index"] == 2 and here != victim_id and not killed.exists():
            killed.touch()
            os._exit(1)  # the worker process dies in the middle of its partition
        return engine._partition_task(key, blob, descriptor)

    def remove_when_busy():
        deadline = time.monotonic() + 90
        while not on_victim.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        ray_cluster.remove_node(victim, allow_graceful=False)

    remover = threading.Thread(target=remove_when_busy, daemon=True)
    remover.start()
    monkeypatch.setattr(ray_engine, "_partition_task", flaky)
    summary = run_ray(config(tmp_path / "ray", [base_dir / "in"], **kw), max_retries=3)
    remover.join(timeout=100)
    assert killed.exists() and on_victim.exists()  # both faults happened
    assert summary.partitions >= 8
    assert_same_as_local(tmp_path / "ray", base_dir / "local")


def test_a_killed_driver_is_resumed_with_the_same_bytes(ray_session, tmp_path, monkeypatch, local):
    real = base.Run.account
    seen = []

    def driver_dies(self, record):
        real(self, record)
        seen.append(record["partition"])
        if len(seen) == 2:
            raise KeyboardInterrupt  # as a killed driver: two records kept, the rest not

    def slow_after_two(key, blob, descriptor):  # defined here: Ray ships it by value
        import time

        from packtool.engines import ray as engine

        if descriptor["index"] >= 2:
            time.sleep(5)  # still running when the driver dies
        return engine._partition_task(key, blob, descriptor)

    from packtool.engines import ray as ray_engine

    monkeypatch.setattr(ray_engine, "_partition_task", slow_after_two)
    monkeypatch.setattr(base.Run, "account", driver_dies)
    with pytest.raises(KeyboardInterrupt):
        run_ray(config(tmp_path / "ray"))
    monkeypatch.undo()
    out = tmp_path / "ray"
    staging = staging_folder(out)
    done = records.finished(staging)
    assert not out.exists() and 2 <= len(done) < 6
    time.sleep(6)  # an actor left running would finish its partition by now
    assert records.finished(staging) == done  # the pool was shut down with the driver
    with pytest.raises(ConfigError, match="interrupted run .* --resume"):
        run_ray(config(out))  # neither --overwrite nor --resume
    summary = run_ray(config(out, resume=True), actors=1)  # the resume needs no second actor
    assert summary.resumed_partitions == len(done)
    assert_same_as_local(out, local[0])
    assert not staging.exists()


def test_either_engine_resumes_the_others_run(ray_session, tmp_path, monkeypatch, local):
    whole = local[0]
    real = worker.write_chunk

    def stop_in_the_third_partition(writer, packed):
        if len(records.finished(staging_folder(tmp_path / "a"))) == 2:
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", stop_in_the_third_partition)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(tmp_path / "a"))
    monkeypatch.undo()
    # One actor in both Ray runs: what each engine left is the point, not a pool of two
    summary = run_ray(config(tmp_path / "a", resume=True), actors=1)  # local started, Ray ends
    assert summary.resumed_partitions == 2
    assert_same_as_local(tmp_path / "a", whole)

    real_account = base.Run.account

    def driver_dies(self, record):
        real_account(self, record)
        raise KeyboardInterrupt

    monkeypatch.setattr(base.Run, "account", driver_dies)
    with pytest.raises(KeyboardInterrupt):
        run_ray(config(tmp_path / "b"), actors=1)
    monkeypatch.undo()
    summary = run_pack(config(tmp_path / "b", resume=True))  # Ray started, local finishes
    assert summary.resumed_partitions >= 1
    assert_same_as_local(tmp_path / "b", whole)


def test_a_user_error_inside_a_ray_task_is_one_readable_error(ray_session, tmp_path):
    # sample_data has 6 empty documents: strict mode stops at the first, inside a task.
    with pytest.raises(DataError, match="empty.*run without --strict / strict=True") as e:
        run_ray(config(tmp_path / "out", read=ReadConfig(strict=True)), max_retries=0, actors=1)
    assert "\n" not in str(e.value)


def test_ray_config_validation():
    from packtool.engines.ray import RayConfig

    with pytest.raises(ConfigError, match="actors"):
        RayConfig(actors=0)
    with pytest.raises(ConfigError, match="max_retries"):
        RayConfig(max_retries=-1)


def test_missing_ray_names_the_extra(tmp_path, monkeypatch, capsys):
    from packtool.engines.ray import run_pack_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'packtool\[ray\]'"):
        run_pack_ray(config(tmp_path / "out"))
    argv = ["pack", str(CORPUS), "-o", str(tmp_path / "cli"), "--engine", "ray"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: the ray engine needs Ray: pip install 'packtool[ray]'"


def test_ray_address_needs_the_ray_engine(tmp_path):
    result = CliRunner().invoke(
        cli, ["pack", str(CORPUS), "-o", str(tmp_path / "o"), "--ray-address", "auto"]
    )
    assert result.exit_code != 0
    assert "--ray-address needs --engine ray" in str(result.exception)


def test_a_ray_address_nothing_answers_on_is_one_line_not_a_hang(tmp_path):
    """`--ray-address 127.0.0.1:1`: ray.init retried for ever, deaf to Ctrl-C and SIGTERM (the
    engines audit waited 500 s, then kill -9). Run in a process of its own with a deadline, so
    the old hang fails this test alone."""
    import socket
    import subprocess

    with socket.socket() as s:  # a free port, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ("pack", CORPUS, "-o", tmp_path / "o", "--engine", "ray", "--ray-address")
    cmd = [sys.executable, "-m", "packtool.cli.commands", *map(str, args), f"127.0.0.1:{port}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1, out.stderr[-500:]
    (line,) = out.stderr.strip().splitlines()
    assert line.startswith(
        f"error: --ray-address 127.0.0.1:{port} / address='127.0.0.1:{port}': nothing answers there ("
    )
    assert not (tmp_path / "o").exists()


def _pack_at(address: str, out: Path) -> tuple[int, str]:
    """`packtool pack --engine ray --ray-address ADDRESS` in a process of its own, with a
    deadline (a hang in `ray.init` ignores SIGTERM, so it must not be this process's)."""
    import subprocess

    args = ("pack", CORPUS, "-o", out, "--engine", "ray", "--ray-address", address)
    cmd = [sys.executable, "-m", "packtool.cli.commands", *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    return done.returncode, done.stderr


def test_a_ray_address_where_another_server_answers_is_one_line_not_a_hang(tmp_path):
    """An HTTP server's port (as Ray's dashboard, :8265, is): `ray.init` waited over 5 minutes
    in its GCS connect, deaf to SIGTERM; the TCP check alone let it through."""
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):  # its 505 to the preface, not on the test's stderr
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        code, err = _pack_at(address, tmp_path / "o")
    finally:
        server.shutdown()
    assert code == 1, err[-500:]
    (line,) = err.strip().splitlines()
    assert line.startswith(
        f"error: --ray-address {address} / address={address!r}: something listens there but it is "
    )
    assert "not Ray (it answered b'<!DOCTYPE' where Ray's GCS answers gRPC)" in line
    assert not (tmp_path / "o").exists()


def test_a_ray_address_that_accepts_and_stays_silent_is_named_within_the_timeout():
    from packtool.engines.ray import _check_address

    with socket.socket() as listener:  # connections queue in the backlog; nothing answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ConfigError, match=r"it did not answer within 0\.5 s where Ray's"):
            _check_address(address, timeout=0.5)
    assert time.monotonic() - start < 5


def _serve_once(handle) -> tuple[str, threading.Thread]:
    """A listener on loopback whose first connection `handle(conn)` answers; its address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        with listener:
            conn, _ = listener.accept()
            with conn:
                handle(conn)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"127.0.0.1:{listener.getsockname()[1]}", thread


def test_a_ray_address_that_resets_the_connection_is_named_as_not_ray():
    # The probe's reset was caught with the connect's errors: "nothing answers there".
    import struct

    from packtool.engines.ray import _check_address

    def reset(conn):
        conn.recv(64)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    address, thread = _serve_once(reset)
    with pytest.raises(ConfigError, match=r"something listens there but it is not Ray \(it reset"):
        _check_address(address, timeout=5)
    thread.join(5)


def test_a_ray_address_that_answers_a_byte_at_a_time_is_bounded_by_the_timeout():
    # The timeout bounded each recv, so a byte at once and then one every 0.7 s (under the 1 s
    # timeout) held the check 8 x 0.7 = 5.6 s. The bound leaves a loaded box 3 s over the 1 s
    # the check takes, and still fails that (and a hang).
    from packtool.engines.ray import _check_address

    def trickle(conn):
        conn.recv(64)
        with contextlib.suppress(OSError):  # the check hung up at its timeout: a broken pipe
            for _ in range(9):
                conn.sendall(b"x")
                time.sleep(0.7)

    address, thread = _serve_once(trickle)
    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"not Ray \(it answered b'x"):
        _check_address(address, timeout=1)
    assert time.monotonic() - start < 4
    thread.join(5)


def test_a_ray_client_address_is_refused_in_one_line(tmp_path):
    """Ray Data cannot run through Ray Client: Ray 2.60 failed inside Ray Data with a 60-line
    traceback ("'Worker' object has no attribute 'core_worker'"). Refused before connecting
    (nothing listens at this address)."""
    code, err = _pack_at("ray://127.0.0.1:1", tmp_path / "o")
    assert code == 1, err[-500:]
    (line,) = err.strip().splitlines()
    assert line.startswith(
        "error: --ray-address ray://127.0.0.1:1 / address='ray://127.0.0.1:1': Ray Data cannot "
        "run through"
    )
    assert "--ray-address auto / address='auto' (or HOST:6379)" in line
    assert "ray job submit" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "address",
    ["foo", "localhost:", ":6379", "host:port", "h:99999", "::1:6379", "[::1]", "http://h:6379"],
)
def test_a_malformed_ray_address_is_refused_in_one_line_naming_the_forms(address, monkeypatch):
    """`foo`, `localhost:` or `:6379` went on to `ray.init`: a 62-73 line traceback (`Invalid
    address format`, `Unable to parse port number`, `Malformed host`); `http://...` was split
    at its last colon and named "nothing answers there". Refused before any connection."""
    from packtool.engines.ray import _check_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError) as err:
        _check_address(address, timeout=0.5)
    (line,) = str(err.value).splitlines()
    assert line.startswith(  # quoted for a shell where it needs it: '[::1]'
        f"--ray-address {shlex.quote(address)} / address={address!r}: not a Ray address; give "
    )
    assert "auto" in line and "HOST:PORT" in line and "[IPv6]:PORT" in line


def test_a_malformed_ray_address_env_var_is_named_as_such(monkeypatch):
    from packtool.engines.ray import _check_address

    monkeypatch.setenv("RAY_ADDRESS", "foo")
    for given in (None, "auto"):  # ray.init takes RAY_ADDRESS for both
        with pytest.raises(ConfigError, match=r"^RAY_ADDRESS foo: not a Ray address; give "):
            _check_address(given, timeout=0.5)


def test_a_malformed_ray_address_on_the_command_line_is_one_line(tmp_path, monkeypatch, capsys):
    import ray

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # as in a fresh `packtool` process: a Ray this test process already joined takes no address
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    out = tmp_path / "o"
    argv = ["pack", str(CORPUS), "-o", str(out), "--engine", "ray", "--ray-address", ":6379"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: --ray-address :6379 / address=':6379': not a Ray address; give ")
    assert not out.exists()


def test_ray_init_refusing_an_address_is_one_line(monkeypatch):
    """Whatever form Ray still refuses (its ValueError) is a `ConfigError`, not a traceback."""
    from packtool.engines import ray as ray_engine

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            raise ValueError("Invalid address format: x\nmore")

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(
        ConfigError, match=r"^--ray-address local / address='local': Ray refused it \(Invalid"
    ):
        ray_engine._connect(FakeRay(), "local")


def test_ray_refusing_the_default_private_ray_does_not_name_an_address_not_given(monkeypatch):
    """With no address given, `_connect` asks for `local` (a private Ray); its refusal said
    `--ray-address local: ...`, an option the user never gave."""
    from packtool.engines import ray as ray_engine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError) as raised:
        ray_engine._connect(_RayFailingToConnect(ValueError("Invalid: x")), None)
    line = str(raised.value)
    assert not line.startswith("--ray-address"), line
    assert line.startswith(
        "a private Ray (no --ray-address / address nor RAY_ADDRESS given): Ray refused"
    )


def test_no_address_is_a_private_ray_not_a_cluster_ray_start_left_recorded(monkeypatch):
    """With no address and no RAY_ADDRESS, `ray.init(address=None)` joins a cluster `ray start`
    recorded in /tmp/ray/ray_current_cluster (a fixer's probe joined another run's Ray that
    way); docs/scale-out.md promises a private Ray: `local`. Given forms go on as given."""
    from packtool.engines import ray as ray_engine

    class FakeRay:
        def __init__(self):
            self.addresses = []

        def is_initialized(self):
            return False

        def init(self, **kw):
            self.addresses.append(kw["address"])

    fake = FakeRay()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ray_engine._connect(fake, None)
    monkeypatch.setenv("RAY_ADDRESS", "")  # empty: unset, as Ray reads it
    ray_engine._connect(fake, None)
    ray_engine._connect(fake, "auto")
    assert fake.addresses == ["local", "local", "auto"]


class _AuthenticationError(Exception):
    pass


class _RayFailingToConnect:
    """`ray.init` as Ray 2.60 fails against a GCS that requires a token it was not given."""

    exceptions = __import__("types").SimpleNamespace(AuthenticationError=_AuthenticationError)

    def __init__(self, error: BaseException):
        self.error = error

    def is_initialized(self):
        return False

    def init(self, **kw):
        raise self.error


def _gcs_failure(cause_text: str) -> ConnectionError:
    try:
        try:
            raise RuntimeError(cause_text)
        except RuntimeError as cause:
            raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379") from cause
    except ConnectionError as exc:
        return exc


@pytest.mark.parametrize(
    "error",
    [
        _gcs_failure(
            "Failed to connect to GCS. Last connection error: ... RpcError: Unauthenticated: RPC "
            "error: InvalidAuthToken: Authentication token is missing or incorrect"
        ),
        _AuthenticationError("Token authentication is enabled but no authentication token..."),
    ],
    ids=["no-or-wrong-token", "token-mode-without-token"],
)
def test_a_cluster_that_wants_a_token_is_named_in_one_line(error, monkeypatch):
    """Joining a GCS that requires a token without it said only `Failed to connect to Ray
    cluster at HOST:PORT` (after ~20 s of retries): the line now names the token."""
    from packtool.engines import ray as ray_engine

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    # what answers at 10.0.0.1:6379 is the network's (here a proxy, which the address check
    # refuses as no Ray GCS): the check is not this test's; ray.init's failure is
    monkeypatch.setattr(ray_engine, "_check_address", lambda address: None)
    with pytest.raises(ConfigError) as raised:
        ray_engine._connect(_RayFailingToConnect(error), "auto")
    line = str(raised.value)
    assert line.startswith("RAY_ADDRESS 10.0.0.1:6379: the Ray cluster there requires an auth")
    assert "RAY_AUTH_TOKEN" in line and "RAY_AUTH_MODE=token" in line and "\n" not in line


def test_a_connection_failure_without_auth_is_left_as_it_was(monkeypatch):
    from packtool.engines import ray as ray_engine

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setattr(ray_engine, "_check_address", lambda address: None)  # as above
    error = _gcs_failure("Failed to connect to GCS. Last connection error: timed out")
    with pytest.raises(ConnectionError, match="Failed to connect to Ray cluster"):
        ray_engine._connect(_RayFailingToConnect(error), "auto")


def test_a_real_ray_gcs_passes_the_address_check(ray_cluster):
    """The check's HTTP/2 probe against the session cluster's GCS (a real one): no error."""
    from packtool.engines.ray import _check_address

    _check_address(ray_cluster.address, timeout=5)
    host, _, port = ray_cluster.address.rpartition(":")
    _check_address(f"{host}:{port}", timeout=5)


def test_an_actor_that_keeps_dying_stops_the_run_in_one_line(
    ray_session, tmp_path, monkeypatch, capfd, local
):
    """A partition whose actor dies every time (as an out-of-memory kill would) ends the run
    after `max_retries` restarts with one line, not a Ray traceback or a hang (Ray Data's own
    record of it, a traceback of ~40 lines, stays in its log file); the partitions that
    finished are kept, and `--resume` ends with the local engine's bytes. One actor: a
    partition's actor dying is the point, not a pool of two (an actor process more, ~3-5 s
    of CPU); it runs the partitions in order, so 0-2 are done when partition 3 first dies."""
    from packtool.engines import ray as ray_engine

    out = tmp_path / "ray"
    staging = staging_folder(out)

    def partition_3_dies(key, blob, descriptor):  # defined here: Ray ships it by value
        import os
        import time

        from packtool.engines import ray as engine

        if descriptor["index"] == 3:
            deadline = time.monotonic() + 60
            while len(records.finished(staging)) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # die only once two partitions are done
            os._exit(1)
        return engine._partition_task(key, blob, descriptor)

    monkeypatch.setattr(ray_engine, "_partition_task", partition_3_dies)
    capfd.readouterr()
    with pytest.raises(WorkersLost) as e:
        run_ray(config(out), max_retries=1, actors=1)
    monkeypatch.undo()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ActorDiedError" not in err, err[-2000:]
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("a partition actor's process or node died more than 1 time(s); ")
    kept = int(message.split("its ")[1].split(" finished")[0])
    assert message.endswith(
        f"its {kept} finished partition(s) are kept: rerun with --resume / resume=True "
        "(fewer --workers N / actors=N if memory is short)"
    )
    assert 2 <= kept <= len(records.finished(staging)) < 6 and 3 not in records.finished(staging)
    summary = run_ray(config(out, resume=True), actors=1)  # the resume needs no second actor
    assert summary.resumed_partitions >= kept
    assert_same_as_local(out, local[0])


def test_an_os_error_inside_a_ray_actor_is_the_error_reported():
    # A full disk in an actor was Ray Data's 159-line UserCodeException traceback; the local
    # engine's one line (file, resume hint) comes from the OSError, now found under Ray's error.
    import errno

    from packtool.engines import ray as ray_engine

    full = OSError(errno.ENOSPC, "No space left on device", "/out/shard-000003-00000.parquet")
    udf = RuntimeError("UDF failed to process a data block")
    udf.__cause__ = full
    assert ray_engine._user_cause(udf) is full


def test_a_failed_run_on_a_ray_it_started_reports_before_ray_shuts_down(tmp_path):
    # `ray.shutdown` while Ray Data's threads still ran (its prefetcher, its executor) had Ray
    # end the process ("the core worker has already been shutdown"): exit 1, no error line, the
    # run's folder and lock left (3 of 8 runs). Only a Ray the run started itself shuts down: a
    # process of its own. Two actors (`--workers 2`), both failing: kept although one would
    # do, since the second actor, still writing while the failed run removed its staging
    # folder, once ended the run with "error: .../.y.packtool-staging: Directory not empty"
    # instead of the malformed-json line (2026-12-07): a race no other test meets.
    import subprocess

    bad = tmp_path / "bad"
    bad.mkdir()
    good = CORPUS.read_text().splitlines(keepends=True)[:100]
    for i in range(4):
        (bad / f"f{i}.jsonl").write_text('{"text": broken\n' + "".join(good))
    script = (
        "import sys, threading, ray\n"
        "real = ray.shutdown\n"
        "def checked(*a, **k):\n"
        "    print('ray.shutdown by the run', file=sys.stderr)\n"
        "    return real(*a, **k)\n"
        "ray.shutdown = checked\n"
        "from packtool.cli.commands import main\n"
        "main(sys.argv[1:])\n"
    )
    out = tmp_path / "y"
    args = ["pack", bad, "-o", out, "--max-len", "512", "--partition-size", "50KB", "--strict"]
    args += ["--engine", "ray", "--ray-address", "local", "--workers", "2"]
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "", **RAY_ENV},
    )
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-3000:]
    assert ":1: malformed json" in errors[0], errors
    assert "ray.shutdown by the run" not in done.stderr  # Ray's exit handler's, after the line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad"]  # no folder or lock left


def test_sigterm_to_the_ray_driver_stops_the_run_as_ctrl_c(monkeypatch):
    """SIGTERM while the waves run: Ray's core-worker handler printed a 6-line "*** SIGTERM
    received" dump and the driver exited 15 with no --resume line. It is now a Ctrl-C
    (KeyboardInterrupt), as in the Slurm driver; no Ray is started here."""
    import os
    import signal
    import types

    from packtool.engines import ray as ray_engine

    fake_ray = types.SimpleNamespace(cluster_resources=lambda: {"CPU": 1})
    monkeypatch.setattr(ray_engine, "import_ray", lambda: fake_ray)
    monkeypatch.setattr(ray_engine, "_connect", lambda ray, address: False)
    ran = []

    def execute(ray, run, ray_config, actors, wave, follow=0):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the handler runs at the next bytecode of the main thread
        ran.append(wave)

    monkeypatch.setattr(ray_engine, "_execute", execute)
    seen = []  # before the fix, this handler (not the default: death) took the signal
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    ctrl_c = []  # the CLI's Ctrl-C handler stands in: SIGTERM takes its path (its watchdog)

    def on_sigint(signum, frame):
        ctrl_c.append(signum)
        raise KeyboardInterrupt

    previous_int = signal.signal(signal.SIGINT, on_sigint)
    try:
        with pytest.raises(KeyboardInterrupt):
            ray_engine.drive_ray(
                types.SimpleNamespace(waves=lambda: [[0], [1]]), ray_engine.RayConfig()
            )
        assert ran == [] and seen == [] and ctrl_c == [signal.SIGINT]
        os.kill(os.getpid(), signal.SIGTERM)  # the handler before the run is back
        time.sleep(0.2)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, previous_int)


# The driver of a private Ray (`--ray-address local`), each partition slowed to >= 2 s.
SLOW_PRIVATE_DRIVER = """
import sys, time
from packtool.engines import ray as engine

real = engine._partition_task

def slow(key, blob, descriptor):  # defined in __main__: Ray ships it by value
    time.sleep(2.0)
    return real(key, blob, descriptor)

engine._partition_task = slow
from packtool.cli.commands import main
main(sys.argv[1:])
"""


def _actors_in(group: int) -> list[str]:
    """The Ray Data actor processes (`ray::MapWorker(...)`) of a process group still running
    (an ended one its raylet has not reaped yet is a zombie: state Z)."""
    import subprocess

    ps = subprocess.run(["ps", "-o", "stat=,pid=,args=", "-g", str(group)], capture_output=True)
    lines = ps.stdout.decode().splitlines()
    return [line for line in lines if "MapWorker" in line and not line.startswith("Z")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ps -g, pidfd")
def test_a_private_rays_actors_stop_when_its_driver_is_killed(tmp_path):
    """kill -9 of a driver that started its own Ray: its actors ran on (2-5 s here, ~15 s under
    load), the partitions they held still running and writing into the dead run's folder.
    They now follow the driver out (`lifeline`), as the local engine's workers do."""
    import os
    import signal
    import subprocess

    out = tmp_path / "out"
    args = ["pack", CORPUS, "-o", out, "--max-len", "512", "--partition-size", "100KB"]
    args += ["--engine", "ray", "--ray-address", "local", "--workers", "1"]
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_PRIVATE_DRIVER, *map(str, args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # the private Ray's processes too: killed below as a group
        env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_ADDRESS": "", **RAY_ENV},
    )
    staging = staging_folder(out)
    try:
        deadline = time.monotonic() + 240
        while len(records.finished(staging)) < 2 and proc.poll() is None:
            assert time.monotonic() < deadline, "no partition finished in 240 s"
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it could be killed"
        assert _actors_in(proc.pid), "no actor process found to watch"
        proc.kill()  # kill -9: nothing in the driver runs
        proc.wait()
        time.sleep(1.0)  # the lifeline ends an actor within milliseconds of its driver
        assert _actors_in(proc.pid) == []
        done = records.finished(staging)
        time.sleep(4)
        assert records.finished(staging) == done and len(done) < 30  # 30 partitions
    finally:
        proc.kill()
        with __import__("contextlib").suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_ray_init_leaves_the_callers_sigterm_handler_in_place(monkeypatch):
    """`ray.init` puts its own SIGTERM handler (`sys.exit`) in place of the caller's: a SIGTERM
    after the waves (the pool's end, the root, the finish) then ended a CLI run with exit 143
    and no --resume line (until 2026-12-08). The caller's handler (the CLI's) is put back; no
    Ray is started here."""
    import signal
    import types

    from packtool.engines import ray as ray_engine

    def init(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: None)  # Ray's, in its place

    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, init=init)
    monkeypatch.setattr(ray_engine, "_check_address", lambda address: None)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def cli_handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, cli_handler)
    try:
        assert ray_engine._connect(fake_ray, None) is True
        assert signal.getsignal(signal.SIGTERM) is cli_handler
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_the_summary_counts_no_more_actors_than_a_wave_has_units(monkeypatch):
    """`--workers 1000` with 6 partitions: the pool starts at most one actor per unit of a wave
    (`_execute`), and the summary says so, as the local engine's does; it said "a Ray Data pool
    of up to 1000 partition actor(s)" until 2026-12-08. No Ray is started here."""
    import types

    from packtool.engines import ray as ray_engine

    fake_ray = types.SimpleNamespace(cluster_resources=lambda: {"CPU": 2})
    monkeypatch.setattr(ray_engine, "import_ray", lambda: fake_ray)
    monkeypatch.setattr(ray_engine, "_connect", lambda ray, address: False)
    monkeypatch.setattr(ray_engine, "_execute", lambda *args, **kwargs: None)
    run = types.SimpleNamespace(waves=lambda: [[0, 1, 2, 3, 4, 5], [6]])
    said = ray_engine.drive_ray(run, ray_engine.RayConfig(actors=1000))
    assert said.startswith("Ray: 2 CPU(s) in the cluster, a Ray Data pool of up to 6 partition")
    said = ray_engine.drive_ray(run, ray_engine.RayConfig(actors=3))
    assert "a Ray Data pool of up to 3 partition" in said


def test_ray_address_auto_with_no_cluster_names_packtools_option(monkeypatch):
    """`--ray-address auto` on a node where no `ray start` cluster runs: Ray's own line told the
    user to set "the `--address` flag", which packtool has not (until 2026-12-08). No Ray is
    started here: the fake `ray.init` raises what Ray 2.60's does."""
    import types

    from packtool.engines import ray as ray_engine

    def init(**kwargs):
        raise ConnectionError(
            "Could not find any running Ray instance. Please specify the one to connect to by "
            "setting `--address` flag or `RAY_ADDRESS` environment variable."
        )

    exceptions = types.SimpleNamespace(AuthenticationError=type("AuthError", (Exception,), {}))
    fake_ray = types.SimpleNamespace(is_initialized=lambda: False, init=init, exceptions=exceptions)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError) as refused:
        ray_engine._connect(fake_ray, "auto")
    assert str(refused.value).startswith(
        "--ray-address auto / address='auto': no Ray cluster runs on this node"
    ), refused.value
    assert "`--address`" not in str(refused.value)
