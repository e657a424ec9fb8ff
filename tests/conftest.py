"""Fixtures for every test: GPU tests skipped without CUDA, no engine check records, and the
object stores, each a real server on loopback for the session with its client library's
standard variables pointing at it (the value is the endpoint URL):

- `s3_server`: moto's server mode (`ThreadedMotoServer`, as datatrove's and Ray's own suites
  do), `AWS_ENDPOINT_URL` and test credentials.
- `gcs_server`: gcp-storage-emulator (pure Python, in a thread), `STORAGE_EMULATOR_HOST`.
- `azurite_server`: Azurite, Microsoft's Blob Storage emulator (node; `.ci/run` installs it with
  scripts/azurite.sh), `AZURE_STORAGE_CONNECTION_STRING` with its well-known dev account.

A server or client library that is missing skips its tests on a developer's machine; in CI
(`CI=true`, which `.ci/run` installs everything for) it fails them: a skip there would drop
their coverage without a word."""

import contextlib
import importlib
import os
import re
import socket

import pytest
from hypothesis import HealthCheck, settings

# Property tests check results, not speed (speed is measured in benchmarks/): with 4 workers on
# 2 cores, an example's time says nothing, and hypothesis's default 200 ms deadline failed
# examples that took 301 ms on a busy box (test_tail_tree, 2026-12-07). A test's own @settings
# still sets what it names.
settings.register_profile("packtool", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("packtool")

AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
"""Azurite's dev account key: public, the same in every Azurite (Microsoft's docs print it)."""


def unavailable(reason: str) -> None:
    """Skip for want of a server or library; fail in CI, where everything is installed."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: .ci/run installs it, so this is a failure)", False)
    pytest.skip(reason)


def need(module: str, reason: str):
    """`pytest.importorskip`, failing in CI (`unavailable`)."""
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        unavailable(reason)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _environ(**values: str):
    """Set these variables for the session's tests, then put back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _shared_cluster(item) -> str | None:
    """The machine-wide cluster a test drives, if any: "slurm" (the one Slurm test cluster, whose
    queue tests read and cancel) or "ray" (the session's local Ray cluster)."""
    names = set(getattr(item, "fixturenames", ()))
    if "slurm_cluster" in names:
        return "slurm"
    callspec = getattr(item, "callspec", None)
    if names & {"ray_session", "ray_cluster"} or (
        callspec is not None
        and any(isinstance(v, str) and v == "ray" for v in callspec.params.values())
    ):
        return "ray"
    return None


def _cluster_named(nodeid: str) -> str | None:
    """The shared cluster a test id names ("slurm", or "ray" as a word of it): what the test
    scheduler below can see of a test (it gets ids only)."""
    low = nodeid.lower()
    if "slurm" in low:
        return "slurm"
    return "ray" if re.search(r"(^|[/_\[-])ray([_.\]-]|$)", low) else None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """pytest-xdist (`-n`, the README's test command) hands each test module to one process,
    and all the tests of one shared cluster to one process, one after the other, as a serial
    run: a Slurm test that checks the queue holds none of its jobs must not see another test's
    (xdist's own `--dist loadgroup` no longer groups under pytest 9: it renames `_nodeid`)."""
    from xdist.scheduler import LoadScopeScheduling

    class SharedClusters(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _cluster_named(nodeid) or nodeid.split("::", 1)[0]

        def _assign_work_unit(self, node) -> None:
            # The two cluster scopes are the longest (Slurm ~8-10 minutes, Ray ~7-15, one
            # worker each): started first, not when xdist's order by test count reaches them
            # (Ray's 58 tests were the 17th scope), so neither is what the run waits on last.
            for scope in ("ray", "slurm"):
                if scope in self.workqueue:
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return SharedClusters(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """`-n auto` (the README's test command): one worker per core, and at least 4 (the command's
    `--maxprocesses 4` caps it). Many tests wait, not compute: on a Slurm job, a Ray cluster, a
    server on loopback, a subprocess; and each shared cluster's tests run one after another in
    one worker (the scheduler above), the Slurm ones for ~8 minutes. With one worker per core
    on a 2-core machine the other worker was left alone with the rest of the suite meanwhile.
    `PYTEST_XDIST_AUTO_NUM_WORKERS` still chooses (xdist's own rule)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None
    return max(4, os.cpu_count() or 1)


_UNNAMED = pytest.StashKey[str]()


def pytest_collection_modifyitems(config, items):
    for item in items:  # else the scheduler would run it beside the cluster's other tests
        cluster = _shared_cluster(item)
        if cluster not in (None, _cluster_named(item.nodeid)):
            item.stash[_UNNAMED] = cluster
    gpu = [item for item in items if "gpu" in item.keywords]
    if not gpu:  # torch not imported for nothing: ~3 CPU-s in each of test_parallel_runs'
        return  # sub-suites' processes (xdist's controller too)
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in gpu:
        item.add_marker(skip_gpu)


def pytest_runtest_setup(item):
    # A failed test, not a collection error: the scheduler runs in xdist's controller, which
    # collects nothing, and an error in a worker's collection is 35 lines of INTERNALERROR.
    cluster = item.stash.get(_UNNAMED, None)
    if cluster is not None:
        pytest.fail(
            f"{item.nodeid} drives the shared {cluster} cluster but its name does not say so: "
            f"put {cluster!r} in the test's name (tests/conftest.py schedules by name)",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _no_engine_check_records(monkeypatch):
    """Tests prove engines afresh: no record of earlier self-checks (packtool/tokenizer/engine_checks.py)
    is read or written, unless a test sets PACKTOOL_CACHE_DIR itself (subprocesses inherit it)."""
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", "")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The one-node Slurm test cluster (scripts/slurm-test-cluster.sh starts it once; `.ci/run`
    installs it); the script's output. Skips where it cannot be started (fails in CI)."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "slurm-test-cluster.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        unavailable(f"Slurm cannot be started here: {done.stderr.strip().splitlines()[-1]}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server on 127.0.0.1 (moto), the AWS_* variables pointing at it."""
    server_mod = need("moto.server", "moto[server] is not installed")
    need("s3fs", "s3fs is not installed (pip install 'packtool[s3]')")
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    port = _free_port()
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    with _backends_remembered():
        server.start()
        endpoint = f"http://127.0.0.1:{port}"
        with _environ(
            AWS_ENDPOINT_URL=endpoint,
            AWS_ACCESS_KEY_ID="packtool-test",
            AWS_SECRET_ACCESS_KEY="packtool-test",
            AWS_DEFAULT_REGION="us-east-1",
        ):
            yield endpoint
        server.stop()


@contextlib.contextmanager
def _backends_remembered():
    """moto's server finds the service of every request by matching its host against each
    service's URL patterns in turn (~180; S3's come 141st): 1.8 ms of its ~6 ms of CPU a
    request here, spent again at each of the thousands of requests the S3 tests make. The
    answer for a host never changes: while the block runs, each is looked up once."""
    try:  # (imported by name: the GPU run's conftest has no moto, test_architecture.py)
        app = importlib.import_module("moto.moto_server.werkzeug_app")
    except ImportError:  # another moto's layout: its server as it is, only slower
        app = None
    dispatcher = getattr(app, "DomainDispatcherApplication", None)
    look_up = getattr(dispatcher, "get_backend_for_host", None)
    if look_up is None:
        yield
        return

    def remembered(self, host):  # (called under the dispatcher's lock)
        known = self.__dict__.setdefault("_packtool_backends", {})
        if host not in known:
            known[host] = look_up(self, host)
        return known[host]

    dispatcher.get_backend_for_host = remembered
    try:
        yield
    finally:
        dispatcher.get_backend_for_host = look_up


@pytest.fixture(scope="session")
def gcs_server():
    """A Google Cloud Storage JSON API server on 127.0.0.1 (gcp-storage-emulator, in memory),
    `STORAGE_EMULATOR_HOST` pointing at it (gcsfs's own variable for an emulator)."""
    emulator = need("gcp_storage_emulator.server", "gcp-storage-emulator is not installed")
    import logging

    # It logs a missing object at ERROR, into the stderr the CLI tests read: quiet.
    logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
    port = _free_port()
    endpoint = f"http://127.0.0.1:{port}"
    # gcsfs asks a real GCS for the bucket's type over gRPC first (60 s of retries against an
    # emulator, which speaks only the JSON API); its own variable, read when it is imported,
    # turns that off.
    with _environ(STORAGE_EMULATOR_HOST=endpoint, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT="false"):
        need("gcsfs", "gcsfs is not installed (pip install 'packtool[gcs]')")
        server = emulator.create_server("127.0.0.1", port, in_memory=True)
        server.start()
        yield endpoint
        server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """Azure Blob Storage on 127.0.0.1 (Azurite, in memory), the connection string of its dev
    account in `AZURE_STORAGE_CONNECTION_STRING`. Skips, saying why, where Azurite is absent
    (fails in CI)."""
    import shutil
    import subprocess
    import time
    from pathlib import Path

    need("adlfs", "adlfs is not installed (pip install 'packtool[azure]')")
    home = Path(
        os.environ.get("PACKTOOL_AZURITE_HOME", Path.home() / ".cache" / "packtool-azurite")
    )
    program = shutil.which("azurite-blob") or home / "node_modules" / ".bin" / "azurite-blob"
    if not Path(program).exists():
        unavailable(f"Azurite is not installed (bash scripts/azurite.sh installs it in {home})")
    port = _free_port()
    log = tmp_path_factory.mktemp("azurite") / "azurite.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(program), "--blobHost", "127.0.0.1", "--blobPort", str(port),
             "--inMemoryPersistence", "--silent", "--skipApiVersionCheck", "--loose"],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.time() + 90  # node's start-up on a loaded machine
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            said = log.read_text(errors="replace").strip().splitlines() or ["no output"]
            unavailable(f"Azurite did not start ({program}): {said[-1]}")
        time.sleep(0.1)
    endpoint = f"http://127.0.0.1:{port}/devstoreaccount1"
    connection = (
        f"DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={endpoint};"
    )
    with _environ(AZURE_STORAGE_CONNECTION_STRING=connection):
        yield endpoint
    proc.kill()  # in memory: nothing to save (it takes its time over a SIGTERM)
    proc.wait()
