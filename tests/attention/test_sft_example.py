"""examples/sft.py end to end: chat data packed with a loss mask, trained, loss falls."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _sft():
    spec = importlib.util.spec_from_file_location("example_sft", ROOT / "examples" / "sft.py")
    sft = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sft)
    return sft


def test_sft_example_packs_chat_data_and_the_assistant_loss_falls(tmp_path):
    losses = _sft().main(
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


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-len", "16"], "every document was empty or dropped; nothing to pack"),
        (["--data", "/nonexist.jsonl"], "/nonexist.jsonl: no such file or folder"),
        (["--data", "/nonexist.jsonl", "--limit", "3"], "/nonexist.jsonl: no such file or folder"),
        (["--chat-template", "/nonexist.jinja"], "chat template file '/nonexist.jinja' does not"),
    ],
)
def test_a_packing_error_is_one_line(tmp_path, extra, message):
    """Each was a DataError or ConfigError traceback: main packed with no except."""
    argv = ["--out", str(tmp_path), "--limit", "5", "--steps", "1", *extra]
    with pytest.raises(SystemExit) as exc:
        _sft().main(argv)
    assert str(exc.value).startswith(f"error: {message}")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--bogus"], "unrecognized arguments: --bogus"),  # was found after packing
        (["--steps", "0"], "argument --steps: must be an int >= 1, got 0"),  # ran, exit 1
        (["--limit", "0"], "argument --limit: must be an int >= 1, got 0"),  # a DataError
    ],
)
def test_options_for_train_py_are_checked_before_packing(tmp_path, capsys, extra, message):
    with pytest.raises(SystemExit) as exc:
        _sft().main(["--out", str(tmp_path), *extra])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f": error: {message} (--help lists" in err
    assert not (tmp_path / "packed").exists()


def test_help_says_where_the_other_options_go_and_when_checkpoints_are_written(capsys):
    with pytest.raises(SystemExit):
        _sft().main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Every other option goes to examples/train.py" in text
    assert "checkpoints are written only where --ckpt names a file" in text
    assert "(and checkpoints)" not in text
