"""Shared fixtures for packtool tests: small packed datasets built by hand, per the shard contract.

`ray_session` starts a two-node Ray cluster at the first test that needs it (start-up ~10 s) and
stops it after the session's last Ray test (tests/conftest.py runs them in one process).

`packed_dataset_factory` writes Parquet shards with pyarrow and an `index.json` with
`packtool.dataset.manifest.write_manifest`, independently of `packtool pack`, so readers (verify, inspect,
the loader) can be tested on exact, hand-checkable data, then damaged in specific ways.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.dataset.manifest import (
    Manifest,
    ShardInfo,
    packed_schema,
    sha256_file,
    write_manifest,
)
from tests.conftest import _cluster_named, _environ, need

Doc = tuple[int, int, int | Sequence[int]]
"""(doc_id, chunk, tokens): tokens is a list of ids, or a length (ids then derived from doc_id)."""
Row = Sequence[Doc] | dict[str, list]
"""A row: a list of documents, or a dict of the four raw column values (for invalid rows)."""


def doc_tokens(doc_id: int, chunk: int, length: int, vocab_size: int) -> list[int]:
    """Deterministic token ids for a document given by its length."""
    return [(doc_id * 31 + chunk * 7 + i) % vocab_size for i in range(length)]


def row_columns(row: Row, vocab_size: int) -> dict[str, list]:
    """The four contract columns of one row."""
    if isinstance(row, dict):
        return row
    ids: list[int] = []
    offsets = [0]
    doc_ids: list[int] = []
    chunks: list[int] = []
    for doc_id, chunk, tokens in row:
        toks = doc_tokens(doc_id, chunk, tokens, vocab_size) if isinstance(tokens, int) else tokens
        ids.extend(toks)
        offsets.append(len(ids))
        doc_ids.append(doc_id)
        chunks.append(chunk)
    return {"input_ids": ids, "doc_offsets": offsets, "doc_ids": doc_ids, "doc_chunks": chunks}


def build_packed_dataset(
    directory: Path,
    shards: Sequence[Sequence[Row]],
    *,
    max_len: int = 16,
    vocab_size: int = 256,
    tokenizer: dict[str, Any] | None = None,
    schema: pa.Schema | None = None,
    row_group_size: int | None = None,
    **manifest_fields: Any,
) -> Path:
    """Write `shards` (each a list of rows) as a packed dataset in `directory`.

    The manifest is computed from what was written (rows, tokens, bytes, sha256, counts), so the
    checksums always match even when the rows themselves break the contract. `manifest_fields`
    override any `Manifest` field (e.g. `counts=...`, `lower_bound_rows=...`).
    """
    directory.mkdir(parents=True, exist_ok=True)
    if schema is None:
        schema = packed_schema(pa.uint16() if vocab_size <= 65_536 else pa.uint32())
    infos = []
    total_tokens = total_rows = 0
    documents: set[tuple[int, int]] = set()
    for i, rows in enumerate(shards):
        cols = [row_columns(r, vocab_size) for r in rows]
        table = pa.table({name: [c[name] for c in cols] for name in schema.names}, schema=schema)
        name = f"shard-{i:05d}.parquet"
        path = directory / name
        pq.write_table(table, path, row_group_size=row_group_size)
        tokens = sum(len(c["input_ids"]) for c in cols)
        for c in cols:
            documents.update(zip(c["doc_ids"], c["doc_chunks"], strict=False))
        infos.append(
            ShardInfo(
                file=name,
                rows=len(rows),
                tokens=tokens,
                bytes=path.stat().st_size,
                sha256=sha256_file(path),
            )
        )
        total_tokens += tokens
        total_rows += len(rows)
    fields: dict[str, Any] = {
        "tokenizer": tokenizer
        or {
            "kind": "byte",
            "name": "byte",
            "vocab_size": vocab_size,
            # None: these documents' ids do not end in an EOS (verify checks that pieces end in
            # the recorded eos_id or are max_len long: packtool/audit/piece_ends.py)
            "eos_id": None,
            "bos_id": None,
            "sha256": "",
        },
        "max_len": max_len,
        "algorithm": "ffd",
        "seed": 0,
        "rounds": 1,
        "long_docs": "split",
        "counts": {
            "documents_in": len({d for d, _ in documents}),
            "tokens_in": total_tokens,
            "tokens_out": total_tokens,
            "rows": total_rows,
        },
        "efficiency": total_tokens / (total_rows * max_len) if total_rows else 0.0,
        "lower_bound_rows": -(-total_tokens // max_len),
        "shards": tuple(infos),
        "command": "tests",
    }
    fields.update(manifest_fields)
    write_manifest(directory, Manifest(**fields))
    return directory


@pytest.fixture
def packed_dataset_factory(tmp_path: Path) -> Callable[..., Path]:
    """`make(shards, *, name="packed", **options) -> Path`; see `build_packed_dataset`."""

    def make(shards: Sequence[Sequence[Row]], *, name: str = "packed", **options: Any) -> Path:
        return build_packed_dataset(tmp_path / name, shards, **options)

    return make


@pytest.fixture
def ray_session():
    """A real two-node Ray cluster on this machine (`ray.cluster_utils.Cluster`: a head and a
    worker node, 1 CPU each, separate raylets and object stores), shared by every test that
    runs the Ray engine; the `ray_cluster` fixture lets a test add and remove nodes.

    Started by the first test that asks for it; stopped once the session's last Ray test is
    done (`pytest_runtest_teardown`), not at the session's end: idle, a cluster that has run
    Ray Data (its raylets, agents and Ray Data's own actors) took ~0.06 of a core, and
    tests/conftest.py runs the Ray tests first in the process that runs them, which then goes
    on with other tests."""
    ray = need("ray", "ray[data] is not installed (pip install 'packtool[ray]')")
    if not _CLUSTER:
        _start_cluster(ray)
    return ray


_CLUSTER: list[Any] = []

NODE_ENV = {"PACKTOOL_NUMBA_EXTENSIONS": "0"}
"""What the cluster's processes (and so its Ray workers) have in their environment besides
this process's variables: numba's extension scan skipped, as in the CLI's own processes
(packtool/pack/jit.py). Each partition actor's kernel warm-up scanned every installed
distribution's metadata and imported awkward, which no test is about: ~1 s of CPU per actor here
(a one-partition Ray run took ~6.0 s of CPU, now ~4.7)."""

RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0"}
"""What the nodes and this process (the driver: Ray Data reads it at each run) have in their
environment while the cluster is up: Ray's usage stats off, as `ray disable-usage-stats` does.
With them on, the first Ray Data run started a `_UsageCollectionActor`, a worker process of
its own importing ray.data (~2-4 s of CPU, per cluster), and every run built and sent it a
usage record; nothing leaves this machine either way, and no test is about them."""
_RAY_ENV = contextlib.ExitStack()

GCS_CONFIG = {"health_check_period_ms": 1000}
"""The head's GCS checks each node's raylet every second, not every 3 s: a node removed from
the cluster (`ray_cluster.remove_node`) is declared dead after its 5 failed checks (Ray's
threshold, kept, as is each check's 10 s timeout) ~5 s after its raylet went, not ~15 s, and
its actors restart elsewhere that much sooner; the removed node's checks fail at once
(connection refused), so only a raylet gone or unanswering for 5 checks in a row counts."""


def _start_cluster(ray: Any) -> None:
    from ray.cluster_utils import Cluster

    # No log monitor on either node: it only sends the workers' output to drivers, and this
    # one takes none (`log_to_driver=False`); each polled the logs at ~0.01 of a core.
    node = {"num_cpus": 1, "include_log_monitor": False}
    head = {**node, "include_dashboard": False, "_system_config": GCS_CONFIG}
    _RAY_ENV.enter_context(_environ(**RAY_ENV))  # until `_stop_cluster`
    with _environ(**NODE_ENV):
        cluster = Cluster(initialize_head=True, head_node_args=head)
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")
    _CLUSTER.append(cluster)


def _stop_cluster() -> None:
    import ray

    cluster = _CLUSTER.pop()
    logs = Path(cluster.head_node.get_session_dir_path()) / "logs"
    ray.shutdown()
    cluster.shutdown()
    _RAY_ENV.close()
    _kill_hung_workers(logs)


def _kill_hung_workers(logs: Path) -> None:
    """Kill the cluster's worker processes that outlived it: a Ray worker can deadlock in its own
    exit handlers (seen 2026-12-07: an actor's `CoreWorkerProcessImpl` destructor waiting on a
    boost::asio lock it held, after "Shutdown complete"), and then lives on, orphaned, after its
    raylet is gone. Each worker's log file names its pid (`worker-<id>-<job>-<pid>.out`)."""
    import signal

    for log in logs.glob("worker-*.out"):
        pid = log.stem.rsplit("-", 1)[-1]
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue  # ended, as it should have
        if cmd.startswith(b"ray::") or b"default_worker.py" in cmd:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)


_RAY_TESTS_LEFT: set[str] | None = None
"""The node ids of this session's Ray tests under this folder not yet run (None: not yet known)."""


def _ray_tests(session: pytest.Session) -> set[str]:
    """The tests tests/conftest.py schedules together as the Ray cluster's (by their names):
    those this folder's `ray_session` can serve."""
    here = Path(__file__).resolve().parent
    return {
        item.nodeid
        for item in session.items
        if _cluster_named(item.nodeid) == "ray" and here in Path(item.path).resolve().parents
    }


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    global _RAY_TESTS_LEFT
    try:
        return (yield)
    finally:
        if _RAY_TESTS_LEFT is None:
            _RAY_TESTS_LEFT = _ray_tests(item.session)
        _RAY_TESTS_LEFT.discard(item.nodeid)
        if _CLUSTER and not _RAY_TESTS_LEFT:
            _stop_cluster()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _CLUSTER:  # a Ray test that did not run here (another xdist scheduler), or none named so
        _stop_cluster()


@pytest.fixture
def ray_cluster(ray_session):
    """The `ray.cluster_utils.Cluster` behind `ray_session`."""
    return _CLUSTER[0]
