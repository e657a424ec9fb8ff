"""Train the small Llama-style model on packed shards, with checkpoint and exact resume.

    packtool pack sample_data/corpus.jsonl -o /tmp/packed --max-len 512
    python examples/train.py --data /tmp/packed --steps 300 --ckpt /tmp/ckpt.pt
    python examples/train.py --data /tmp/packed --steps 600 --ckpt /tmp/ckpt.pt --resume
    python examples/train.py --mixture mix.yaml --steps 300   # several datasets, docs/mixtures.md

Every step prints (and appends to ``--log`` as JSON lines) the loss; a checkpoint holds the
model, the optimizer, the loader position and the step, so a resumed run continues the same
loss curve it would have followed without the interruption. With ``--mixture`` the log also has
the loss per source; resuming with an edited mixture file continues every kept source from its
cursor (a warning says what changed).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import zipfile
from pathlib import Path
from typing import NoReturn

import torch
import torch.nn.functional as F

from attention import ModelConfig, Transformer
from loader import MixedDataLoader, MixedDataset, PackedDataLoader, PackedDataset, token_sources
from packtool.errors import PacktoolError


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a bad option on one line (its default prints the usage block of
    every option first, which buries the message)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def int_from(low: int, high: int | None = None):
    """An argparse type: an int in [low, high]; argparse prints the message as one line."""

    def parse(text: str) -> int:
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an int {bounds}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an int {bounds}, got {value}")
        return value

    return parse


def _positive_float(text: str) -> float:
    """An argparse type: a number > 0 (inf allowed: `--clip inf` clips nothing)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _device(text: str) -> str:
    """An argparse type: a device of this machine that torch can train on (cpu, cuda, cuda:N,
    mps); anything else was torch's traceback when the model moved there."""
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(
            f"must be cpu, cuda, cuda:N or mps, got {text!r}"
        ) from None
    if device.type == "cuda":
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if have == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: torch sees no CUDA device here; use cpu")
        if device.index is not None and device.index >= have:
            raise argparse.ArgumentTypeError(
                f"{text!r}: torch sees {have} CUDA device(s) here, cuda:0 to cuda:{have - 1}"
            )
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: torch sees no MPS device here; use cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda, cuda:N or mps, got {text!r}")
    return text


MODEL_FLAGS = ("dim", "layers", "heads", "kv_heads")
"""The options that shape the model: a checkpoint resumes only under its own values."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    # Ranges are checked here, before any data is read: `--ckpt-every 0` was a
    # ZeroDivisionError after the first step, `--steps 0` a run of no step, `--lr -1` and
    # `--threads -1` torch tracebacks.
    positive = int_from(1)
    p = OneLineParser(description=__doc__.splitlines()[0])
    data = p.add_mutually_exclusive_group(required=True)
    data.add_argument("--data", help="folder written by `packtool pack`")
    data.add_argument("--mixture", help="mixture file of several packed folders (docs/mixtures.md)")
    p.add_argument("--steps", type=positive, default=300, help="train until this global step")
    p.add_argument("--rows-per-batch", type=positive, default=4)
    p.add_argument("--dim", type=positive, default=128)
    p.add_argument("--layers", type=positive, default=2)
    p.add_argument("--heads", type=positive, default=4)
    p.add_argument("--kv-heads", type=positive, default=2)
    p.add_argument("--lr", type=_positive_float, default=3e-3)
    p.add_argument(
        "--warmup", type=int_from(0), default=20, help="linear learning-rate warm-up steps"
    )
    p.add_argument("--clip", type=_positive_float, default=1.0, help="gradient norm clipping")
    p.add_argument(
        "--seed",
        type=int_from(-(2**63), 2**63 - 1),
        default=0,
        help="model init (and data order, but a mixture's file has its own seed)",
    )
    p.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16"],
        default="auto",
        help="bf16 autocast; auto = bf16 where the hardware has native bf16 (CUDA that supports "
        "it; a CPU with avx512_bf16 or amx_bf16), else fp32 (CPU autocast still works, only slower)",
    )
    p.add_argument(
        "--device",
        type=_device,
        default="cuda" if torch.cuda.is_available() else "cpu",
        help="cpu, cuda, cuda:N or mps (default: cuda where torch sees one)",
    )
    p.add_argument("--ckpt", default=None, help="checkpoint file (written every --ckpt-every)")
    p.add_argument("--ckpt-every", type=positive, default=100)
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from --ckpt (with the model flags it was written with: "
        + ", ".join("--" + f.replace("_", "-") for f in MODEL_FLAGS)
        + ")",
    )
    p.add_argument("--log", default=None, help="append {step, loss, ...} JSON lines here")
    p.add_argument("--threads", type=positive, default=None, help="CPU threads for torch")
    p.add_argument(
        "--loss-normalization",
        choices=["token", "sequence"],
        default="token",
        help="mean over every target (token), or each sequence's mean, then their mean "
        "(sequence); a sequence is a document as packed: one cut by --long-docs split (the "
        "default without a loss mask) counts once per piece",
    )
    return p.parse_args(argv)


def native_bf16(device: torch.device) -> bool:
    """Whether bf16 autocast runs on native bf16 instructions here."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def save_checkpoint(path: str, state: dict) -> None:
    """Write atomically: a crash mid-write leaves the previous checkpoint intact."""
    tmp = f"{path}.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(args: argparse.Namespace, device: torch.device) -> dict:
    """The state in ``--ckpt`` to resume from, or SystemExit with one line: a file that is no
    checkpoint of this script (not a zip file torch.save wrote, or one torch.load refused: it
    loads with `weights_only=True`, so a pickle that would run code is refused), or one written
    with other model flags (the model's load_state_dict would print a screen of size mismatches;
    the checkpoint keeps the flags it was written with under "config")."""
    try:
        state = torch.load(args.ckpt, map_location=device, weights_only=True)
    except Exception as exc:  # any unreadable file: what torch.load says, on one line
        why = f"{type(exc).__name__}: " + (str(exc).strip().splitlines() or [""])[0]
        if os.path.isfile(args.ckpt) and not zipfile.is_zipfile(args.ckpt):
            why = "not a file torch.save wrote"  # torch.load said "KeyError: 101" of a text file
        raise SystemExit(
            f"error: --ckpt {args.ckpt} is not a checkpoint of examples/train.py ({why})"
        ) from None
    if not isinstance(state, dict) or not {"model", "optimizer", "loader", "step"} <= set(state):
        raise SystemExit(
            f"error: --ckpt {args.ckpt} is not a checkpoint of examples/train.py (it lacks the "
            "model, optimizer, loader and step it writes)"
        )
    saved = state.get("config") or {}
    differ = [f for f in MODEL_FLAGS if f in saved and saved[f] != getattr(args, f)]
    if differ:
        flag = {f: "--" + f.replace("_", "-") for f in differ}
        raise SystemExit(
            f"error: --ckpt {args.ckpt} holds a model of "
            + ", ".join(f"{flag[f]} {saved[f]}" for f in differ)
            + "; this run has "
            + ", ".join(f"{flag[f]} {getattr(args, f)}" for f in differ)
            + ": resume with the flags it was written with"
        )
    return state


def loss_by_source(logits: torch.Tensor, batch: dict, names: list[str]) -> dict[str, float]:
    """Mean next-token loss of each source's tokens in a mixture batch (no gradient)."""
    with torch.no_grad():
        labels = batch["labels"].to(logits.device)
        per_token = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="none")
        src = token_sources(batch).to(logits.device)
        counted = labels != -100
        out = {}
        for i, name in enumerate(names):
            mine = counted & (src == i)
            if mine.any():
                out[name] = float(per_token[mine].mean())
        return out


def mixture_end(dataset: MixedDataset, loader: MixedDataLoader) -> str:
    """Why the mixture's batches ran out: the schedule's `done` names a cap or total_tokens
    reached; it stays None when total_steps ends the mixture (it printed "None")."""
    done = loader.state_dict()["mixed_dataset"]["schedule"]["done"]
    if done:
        return str(done)
    total = dataset.spec.total_steps
    if total is not None:
        return f"its total_steps {total} was reached"
    return "its sources have no more rows"


def lr_at(step: int, args: argparse.Namespace) -> float:
    return args.lr * min(1.0, (step + 1) / max(args.warmup, 1))


def main(argv: list[str] | None = None) -> list[float]:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.resume and not (args.ckpt and Path(args.ckpt).exists()):
        raise SystemExit(f"error: --resume needs an existing --ckpt, got {args.ckpt!r}")
    if args.ckpt:
        Path(args.ckpt).parent.mkdir(parents=True, exist_ok=True)
    device = torch.device(args.device)
    bf16 = args.precision == "bf16" or (args.precision == "auto" and native_bf16(device))

    try:
        if args.mixture:
            dataset = MixedDataset(args.mixture, rows_per_batch=args.rows_per_batch)
            vocab, max_len = dataset.sources[0].tokenizer["vocab_size"], dataset.max_len
        else:
            dataset = PackedDataset(args.data, rows_per_batch=args.rows_per_batch, seed=args.seed)
            vocab, max_len = dataset.store.manifest.tokenizer["vocab_size"], dataset.store.max_len
    except PacktoolError as exc:  # a missing or damaged --data folder: one line, no traceback
        raise SystemExit(f"error: {exc}") from None
    try:
        cfg = ModelConfig(
            vocab_size=int(vocab),
            dim=args.dim,
            n_layers=args.layers,
            n_heads=args.heads,
            n_kv_heads=args.kv_heads,
            max_seq_len=int(max_len),
            loss_normalization=args.loss_normalization,
        )
    except ValueError as exc:  # e.g. --dim 30 with --heads 4: one line, no traceback
        raise SystemExit(f"error: {exc}") from None
    torch.manual_seed(args.seed)
    model = Transformer(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    mixed = isinstance(dataset, MixedDataset)
    loader = MixedDataLoader(dataset) if mixed else PackedDataLoader(dataset)

    step, epoch = 0, 0
    if args.resume:
        state = load_checkpoint(args, device)
        try:
            loader.load_state_dict(state["loader"])
        except PacktoolError as exc:  # a checkpoint of other data: one line, no traceback
            raise SystemExit(f"error: {exc}") from None
        try:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        except (RuntimeError, ValueError, KeyError) as exc:  # flags agree, the model does not
            why = (str(exc).strip().splitlines() or [""])[0]
            raise SystemExit(f"error: --ckpt {args.ckpt} does not fit this model: {why}") from None
        step = state["step"]
        epoch = 0 if mixed else state["loader"]["packed_dataset"]["epoch"]
        print(f"resumed at step {step}" + ("" if mixed else f" (epoch {epoch})"))
    what = (
        "mixture of " + ", ".join(f"{s.name} {s.weight:g}" for s in dataset.spec.sources)
        if mixed
        else f"{len(dataset.store.manifest.shards)} shard(s)"
    )
    print(
        f"model {model.num_parameters() / 1e6:.2f} M params, vocab {cfg.vocab_size}, "
        f"max_len {cfg.max_seq_len}, {what}, {'bf16 autocast' if bf16 else 'fp32'} on {device}"
    )

    def checkpoint() -> None:
        if args.ckpt:
            save_checkpoint(
                args.ckpt,
                {
                    "model": model.state_dict(),
                    "optimizer": opt.state_dict(),
                    "loader": loader.state_dict(),
                    "step": step,
                    "config": vars(args),
                },
            )

    log = open(args.log, "a", encoding="utf-8") if args.log else None  # noqa: SIM115
    losses: list[float] = []
    t0, start_step = time.perf_counter(), step
    try:
        while step < args.steps:
            if not mixed:
                dataset.set_epoch(epoch)  # keeps a pending resume of this epoch
            for batch in loader:
                for group in opt.param_groups:
                    group["lr"] = lr_at(step, args)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                    out = model(batch)
                opt.zero_grad(set_to_none=True)
                out.loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
                opt.step()
                step += 1
                loss = float(out.loss.detach())
                losses.append(loss)
                record = {
                    "step": step,
                    "loss": loss,
                    "grad_norm": float(grad_norm),
                    "tokens": int(batch["input_ids"].numel()),
                    "epoch": epoch,
                }
                if mixed:
                    record["loss_by_source"] = loss_by_source(out.logits, batch, dataset.names)
                if log:
                    log.write(json.dumps(record) + "\n")
                    log.flush()
                if step % 10 == 0 or step == args.steps:
                    rate = (step - start_step) / (time.perf_counter() - t0)
                    print(
                        f"step {step:5d}  loss {loss:.4f}  |g| {float(grad_norm):.2f}  {rate:.1f} it/s"
                    )
                if step % args.ckpt_every == 0:
                    checkpoint()
                if step >= args.steps:
                    break
            else:
                if mixed:  # a mixture is one run: it ended (its total or a source's cap)
                    print(f"the mixture ended at step {step}: {mixture_end(dataset, loader)}")
                    break
                epoch += 1
    finally:
        if log:
            log.close()
    checkpoint()
    return losses


if __name__ == "__main__":
    main()
