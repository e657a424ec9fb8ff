"""The README's test command runs the suite in parallel processes (pytest-xdist, `-n`):
tests/conftest.py's scheduler keeps the tests of each shared cluster (Slurm, Ray) in one process,
by their names, and fails a test that drives one without naming it. Checked on small suites of
their own, run with a copy of tests/conftest.py in a folder of their own."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import need

ROOT = Path(__file__).resolve().parents[1]

SUITE = """
import os, time
import pytest

@pytest.fixture
def ray_session():
    return None

def _log(name):
    with open(os.environ["RUNS_LOG"], "a") as f:
        f.write(f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')} {name}\\n")
    time.sleep(0.3)

@pytest.mark.parametrize("i", range(6))
def test_slurm_queue(i):
    _log("slurm")

@pytest.mark.parametrize("i", range(6))
def test_ray_engine(ray_session, i):
    _log("ray")

@pytest.mark.parametrize("i", range(6))
def test_other(i):
    _log("other")
"""


def _pytest(folder: Path, *args: str) -> subprocess.CompletedProcess:
    need("xdist", "pytest-xdist is not installed (the dev extras)")
    (folder / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RUNS_LOG": str(folder / "runs.log")}
    # The plugins these suites never use stay out: hypothesis's and anyio's took ~5 s of the
    # 7 s each `-n 2` run spent starting its three processes.
    quiet = ["-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-p", "no:anyio"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *quiet, *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_each_shared_cluster_s_tests_run_in_one_process(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    done = _pytest(tmp_path, "-n", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    workers = defaultdict(set)
    for line in (tmp_path / "runs.log").read_text().splitlines():
        worker, name = line.split()
        workers[name].add(worker)
    assert len(workers["slurm"]) == 1 and len(workers["ray"]) == 1, dict(workers)
    assert {w for ws in workers.values() for w in ws} == {"gw0", "gw1"}  # and in parallel


@pytest.mark.parametrize("parallel", [(), ("-n", "2")])
def test_a_test_that_drives_a_cluster_without_naming_it_fails_in_one_line(tmp_path, parallel):
    (tmp_path / "test_suite.py").write_text(
        "def test_uses(ray_session):\n    pass\n\ndef test_plain():\n    pass\n"
        "import pytest\n@pytest.fixture\ndef ray_session():\n    return None\n"
    )
    done = _pytest(tmp_path, *parallel)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "INTERNALERROR" not in out, out
    assert "1 passed, 1 error" in out, out  # (an error at its setup)
    assert (
        "test_suite.py::test_uses drives the shared ray cluster but its name does not say so" in out
    ), out
