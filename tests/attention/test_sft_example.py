"""examples/sft.py end to end: chat data packed with a loss mask, trained, loss falls."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_sft_example_packs_chat_data_and_the_assistant_loss_falls(tmp_path):
    spec = importlib.util.spec_from_file_location("example_sft", ROOT / "examples" / "sft.py")
    sft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sft)
    losses = sft.main(
        ["--out", str(tmp_path), "--limit", "80", "--max-len", "512",
         "--steps", "14", "--rows-per-batch", "2", "--dim", "32", "--layers", "1",
         "--heads", "2", "--kv-heads", "1", "--warmup", "1", "--lr", "1e-2", "--threads", "1"]
    )  # fmt: skip
    assert len(losses) == 14
    assert sum(losses[-3:]) / 3 < 0.8 * sum(losses[:3]) / 3
    index = json.loads((tmp_path / "packed" / "index.json").read_text())
    assert "loss_mask" in index["columns"]
    assert index["long_docs"] == "truncate"  # a conversation is never split across rows
    c = index["counts"]
    assert 0 < c["tokens_supervised"] < c["tokens_out"]
    assert c["documents_truncated"] > 0  # some conversations are longer than the row
