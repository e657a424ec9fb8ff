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
