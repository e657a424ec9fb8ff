"""examples/train.py end to end: packtool pack -> loader -> model; loss falls; resume is exact."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from packtool.cli.commands import cli

ROOT = Path(__file__).resolve().parents[2]


def _train_module():
    spec = importlib.util.spec_from_file_location("example_train", ROOT / "examples" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("train")
    lines = (ROOT / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()[:150]
    corpus = tmp / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp / "packed"
    result = CliRunner().invoke(
        cli, ["pack", str(corpus), "-o", str(out), "--max-len", "256", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    return out


def _args(packed: Path, tmp: Path, steps: int, *extra: str) -> list[str]:
    return [
        "--data", str(packed), "--steps", str(steps), "--rows-per-batch", "2", "--dim", "32",
        "--layers", "1", "--heads", "2", "--kv-heads", "1", "--warmup", "1", "--lr", "1e-2",
        "--threads", "1", "--ckpt-every", "100", *extra,
    ]  # fmt: skip


def test_loss_falls_and_resume_continues_the_same_curve(packed, tmp_path):
    train = _train_module()
    straight_log = tmp_path / "straight.jsonl"
    straight = train.main(_args(packed, tmp_path, 12, "--log", str(straight_log)))
    assert len(straight) == 12
    assert sum(straight[-3:]) / 3 < 0.8 * straight[0]

    ckpt, log = tmp_path / "ckpt.pt", tmp_path / "resumed.jsonl"
    first = train.main(_args(packed, tmp_path, 5, "--ckpt", str(ckpt), "--log", str(log)))
    second = train.main(
        _args(packed, tmp_path, 12, "--ckpt", str(ckpt), "--log", str(log), "--resume")
    )
    # Model, optimizer and loader position restored: the very same losses, bit for bit.
    assert first + second == straight
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert steps == list(range(1, 13))


def test_resume_without_checkpoint_is_a_clear_error(packed, tmp_path):
    train = _train_module()
    with pytest.raises(SystemExit, match="--resume needs an existing --ckpt"):
        train.main(_args(packed, tmp_path, 2, "--resume", "--ckpt", str(tmp_path / "none.pt")))


def test_checkpoint_folder_is_created_and_bad_data_is_one_line(packed, tmp_path):
    train = _train_module()
    ckpt = tmp_path / "new" / "dir" / "ckpt.pt"
    train.main(_args(packed, tmp_path, 1, "--ckpt", str(ckpt)))
    assert ckpt.is_file()
    with pytest.raises(SystemExit, match=r"^error: .*no_such_folder"):
        train.main(_args(tmp_path / "no_such_folder", tmp_path, 1))
    with pytest.raises(SystemExit, match=r"^error: n_kv_heads 3 must be >= 1 and divide n_heads"):
        train.main(_args(packed, tmp_path, 1, "--kv-heads", "3"))


@pytest.fixture(scope="module")
def mixture(tmp_path_factory, packed) -> Path:
    """A mixture file: the packed sample slice and a second slice of the corpus."""
    tmp = tmp_path_factory.mktemp("mixture")
    lines = (ROOT / "sample_data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
    corpus = tmp / "other.jsonl"
    corpus.write_text("\n".join(lines[150:260]) + "\n", encoding="utf-8")
    other = tmp / "other"
    result = CliRunner().invoke(
        cli, ["pack", str(corpus), "-o", str(other), "--max-len", "256", "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    file = tmp / "mix.json"
    file.write_text(
        json.dumps(
            {
                "total_steps": 40,
                "sources": [
                    {"name": "first", "path": str(packed), "weight": 0.7},
                    {"name": "second", "path": str(other), "weight": 0.3},
                ],
            }
        )
    )
    return file


def _mix_args(mixture: Path, steps: int, *extra: str) -> list[str]:
    args = _args(Path("unused"), Path("unused"), steps, *extra)
    i = args.index("--data")
    return args[:i] + ["--mixture", str(mixture)] + args[i + 2 :]


def test_a_mixture_trains_logs_loss_per_source_and_resumes(mixture, tmp_path):
    train = _train_module()
    log = tmp_path / "mix.jsonl"
    straight = train.main(_mix_args(mixture, 8, "--log", str(log)))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 8 and set(records[0]["loss_by_source"]) <= {"first", "second"}
    assert any(len(r["loss_by_source"]) == 2 for r in records)
    ckpt = tmp_path / "mix.pt"
    first = train.main(_mix_args(mixture, 3, "--ckpt", str(ckpt)))
    second = train.main(_mix_args(mixture, 8, "--ckpt", str(ckpt), "--resume"))
    assert first + second == straight
    edited = tmp_path / "edited.json"
    spec = json.loads(mixture.read_text())
    spec["sources"][1]["weight"] = 0.9
    edited.write_text(json.dumps(spec))
    with pytest.warns(UserWarning, match="weight of 'second' 0.3 -> 0.9"):
        more = train.main(_mix_args(edited, 10, "--ckpt", str(ckpt), "--resume"))
    assert len(more) == 2


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--ckpt-every", "0", "must be an int >= 1, got 0"),  # was a ZeroDivisionError
        ("--steps", "0", "must be an int >= 1, got 0"),  # was a run of no step
        ("--lr", "-1", "must be a number > 0, got -1"),  # was AdamW's ValueError
        ("--threads", "-1", "must be an int >= 1, got -1"),  # was torch's RuntimeError
        ("--warmup", "-1", "must be an int >= 0, got -1"),
        ("--clip", "nan", "must be a number > 0, got nan"),
        ("--rows-per-batch", "x", "must be an int >= 1, got 'x'"),
    ],
)
def test_option_ranges_are_refused_at_parse_in_one_line(
    packed, tmp_path, capsys, option, value, message
):
    train = _train_module()
    with pytest.raises(SystemExit) as exc:
        train.main(_args(packed, tmp_path, 3, option, value))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: argument {option}: {message}" in err


@pytest.mark.parametrize(
    ("value", "gpus", "message"),
    [
        ("gpu", 0, "must be cpu, cuda, cuda:N or mps, got 'gpu'"),  # was torch's RuntimeError
        ("cuda:x", 1, "must be cpu, cuda, cuda:N or mps, got 'cuda:x'"),
        ("meta", 0, "must be cpu, cuda, cuda:N or mps, got 'meta'"),
        ("cuda", 0, "'cuda': torch sees no CUDA device here; use cpu"),  # was an AssertionError
        ("cuda:1", 1, "'cuda:1': torch sees 1 CUDA device(s) here, cuda:0 to cuda:0"),
    ],
)
def test_a_device_torch_cannot_use_is_refused_at_parse_in_one_line(
    packed, tmp_path, capsys, monkeypatch, value, gpus, message
):
    import torch

    train = _train_module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    with pytest.raises(SystemExit) as exc:
        train.main(_args(packed, tmp_path, 3, "--device", value))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"error: argument --device: {message}" in err, err


def test_resume_refuses_other_model_flags_and_files_that_are_no_checkpoint(packed, tmp_path):
    train = _train_module()
    ckpt = tmp_path / "dim32.pt"
    train.main(_args(packed, tmp_path, 1, "--ckpt", str(ckpt)))
    # Was a screen of torch "size mismatch" lines from load_state_dict.
    with pytest.raises(SystemExit) as exc:
        train.main(_args(packed, tmp_path, 2, "--ckpt", str(ckpt), "--resume", "--dim", "64"))
    assert str(exc.value) == (
        f"error: --ckpt {ckpt} holds a model of --dim 32; this run has --dim 64: resume with "
        "the flags it was written with"
    )
    text = tmp_path / "text.pt"
    text.write_text("hello\n")  # was _pickle.UnpicklingError, then torch's "KeyError: 101"
    not_torch = rf"^error: --ckpt {text} is not a checkpoint of .*\(not a file torch.save wrote"
    with pytest.raises(SystemExit, match=not_torch):
        train.main(_args(packed, tmp_path, 2, "--ckpt", str(text), "--resume"))
    import torch

    tensor = tmp_path / "tensor.pt"
    torch.save(torch.zeros(3), tensor)  # readable, but no training state
    with pytest.raises(SystemExit, match=r"is not a checkpoint of .*it lacks the model"):
        train.main(_args(packed, tmp_path, 2, "--ckpt", str(tensor), "--resume"))
    # A pickle that runs code on load (torch.load's weights_only=True refuses it; the script
    # passed weights_only=False until 2026-12-07): one line, and the code never ran.
    ran = tmp_path / "ran"
    torch.save({"model": _RunsOnLoad(str(ran))}, tmp_path / "evil.pt")
    with pytest.raises(SystemExit, match=r"is not a checkpoint of .*\(UnpicklingError: "):
        train.main(_args(packed, tmp_path, 2, "--ckpt", str(tmp_path / "evil.pt"), "--resume"))
    assert not ran.exists()
    assert len(train.main(_args(packed, tmp_path, 2, "--ckpt", str(ckpt), "--resume"))) == 1


class _RunsOnLoad:
    """An object whose unpickling creates the file `path` (what a malicious checkpoint does)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_a_mixture_that_reaches_its_total_steps_says_so(mixture, tmp_path, capsys):
    spec = json.loads(mixture.read_text())
    spec["total_steps"] = 3
    short = tmp_path / "short.json"
    short.write_text(json.dumps(spec))
    losses = _train_module().main(_mix_args(short, 10))
    assert len(losses) == 3
    # Printed "the mixture ended at step 3: None": the schedule's `done` names caps only.
    assert "the mixture ended at step 3: its total_steps 3 was reached\n" in capsys.readouterr().out


def test_help_says_a_split_document_weighs_once_per_piece(capsys):
    # It said "each document's mean", but a document --long-docs split cut into rows is one
    # cu_seqlens entry per piece, and the model weighs each entry as a sequence.
    with pytest.raises(SystemExit):
        _train_module().main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "one cut by --long-docs split (the default without a loss mask) counts once per" in text
