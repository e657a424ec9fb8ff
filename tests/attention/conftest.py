"""One torch thread for the attention tests: their models are tiny (dim 32, a few dozen
tokens), where a second intra-op thread only spins. Under pytest-xdist (4 workers on 2 cores)
each worker's threads fought the others': test_packed_sft_batch_equals_each_conversation_alone
took 17.8 s with 2 threads on the loaded box, 2.5 s with 1. Same arithmetic either way for
what the tests compare (a packed batch and its parts run in the same process)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
