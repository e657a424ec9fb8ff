"""The attention tests run on one torch thread (tests/torch_threads.py)."""

from __future__ import annotations

from tests.torch_threads import one_torch_thread  # noqa: F401  (autouse, per module)
