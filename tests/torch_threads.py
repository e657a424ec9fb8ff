"""One torch thread for test modules whose models are tiny: a second intra-op thread only spins
there, and under pytest-xdist (4 workers on 2 cores) each worker's threads fought the others'
(test_packed_sft_batch_equals_each_conversation_alone: 17.8 s with 2 threads on the loaded box,
2.5 s with 1). Same arithmetic either way for what the tests compare. Import the fixture into a
test module or conftest.py to use it (autouse, per module)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
