"""Fixtures for every test: GPU tests skipped without CUDA, no engine check records, and
`s3_server`: a real S3 API server on loopback for the session (moto's server mode,
`ThreadedMotoServer`, as datatrove's and Ray's own suites do) with the standard AWS variables
pointing at it (`AWS_ENDPOINT_URL`, test credentials); its value is the endpoint URL."""

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        has_cuda = False
    if has_cuda:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _no_engine_check_records(monkeypatch):
    """Tests prove engines afresh: no record of earlier self-checks (packtool/tokenizer/engine_checks.py)
    is read or written, unless a test sets PACKTOOL_CACHE_DIR itself (subprocesses inherit it)."""
    monkeypatch.setenv("PACKTOOL_CACHE_DIR", "")


@pytest.fixture(scope="session")
def slurm_cluster():
    """The one-node Slurm test cluster (scripts/slurm-test-cluster.sh starts it once; `.ci/run`
    installs it); the script's output. Skips where it cannot be started."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "slurm-test-cluster.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        pytest.skip(f"Slurm cannot be started here: {done.stderr.strip().splitlines()[-1]}")
    return done.stdout.strip()


@pytest.fixture(scope="session")
def s3_server():
    """A real S3 API server on 127.0.0.1 (moto), the AWS_* variables pointing at it."""
    import os
    import socket

    server_mod = pytest.importorskip("moto.server", reason="moto[server] is not installed")
    pytest.importorskip("s3fs", reason="s3fs is not installed (pip install 'packtool[s3]')")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    names = ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(
        AWS_ENDPOINT_URL=endpoint,
        AWS_ACCESS_KEY_ID="packtool-test",
        AWS_SECRET_ACCESS_KEY="packtool-test",
        AWS_DEFAULT_REGION="us-east-1",
    )
    yield endpoint
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
