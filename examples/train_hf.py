"""Train a transformers model on packed shards: a plain accelerate loop, or `--trainer`.

    packtool pack sample_data/corpus.jsonl -o /tmp/packed --max-len 512
    python examples/train_hf.py --data /tmp/packed --steps 50
    accelerate launch --num_processes 2 examples/train_hf.py --data /tmp/packed --steps 50
    python examples/train_hf.py --data /tmp/packed --steps 50 --trainer --out /tmp/hf-out

The model is a small random Llama (or GPT-2) sized from the data's vocabulary, or `--model`, a
local `from_pretrained` folder (with at least as many embedding rows as the data's tokenizer has
ids). Before the first step, `loader.hf.check_packed_model` refuses a model or configuration in
which packed documents would attend to each other (try `--use-cache`).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch

from loader import PackedDataLoader, PackedDataset
from loader.hf import check_packed_model
from packtool.errors import ConfigError, PacktoolError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="folder written by `packtool pack`")
    p.add_argument("--steps", type=int, default=50, help="optimizer steps")
    p.add_argument("--rows-per-batch", type=int, default=4)
    p.add_argument("--model", default=None, help="local from_pretrained folder (default: random)")
    p.add_argument("--arch", choices=["llama", "gpt2"], default="llama", help="random model kind")
    p.add_argument("--attn", default="sdpa", help="attn_implementation (sdpa, eager, ...)")
    p.add_argument("--use-cache", action="store_true", help="leave the KV cache on (refused)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trainer", action="store_true", help="loader.hf.PackedTrainer instead")
    p.add_argument("--out", default="hf-out", help="Trainer output folder (checkpoints)")
    return p.parse_args(argv)


def make_model(args: argparse.Namespace, vocab: int, max_len: int):
    from transformers import (
        AutoModelForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
    )

    if args.model:
        model = _from_pretrained(AutoModelForCausalLM, args)
        check_vocab(model, vocab, args.model)
        return model
    torch.manual_seed(args.seed)
    if args.arch == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=max_len, n_embd=128, n_layer=2,
                            n_head=4, attn_implementation=args.attn)  # fmt: skip
        return GPT2LMHeadModel(config)
    config = LlamaConfig(vocab_size=vocab, max_position_embeddings=max_len, hidden_size=128,
                         intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, attn_implementation=args.attn)  # fmt: skip
    return LlamaForCausalLM(config)


def _from_pretrained(auto, args: argparse.Namespace):
    """`from_pretrained(--model)`, or ConfigError in one line: a folder that is not there (which
    transformers takes for a hub id: "Repo id must be in the form ..."), or one it cannot load."""
    name = args.model
    path = Path(name).expanduser()
    looks_like_path = path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1
    if looks_like_path and not path.is_dir():
        raise ConfigError(f"--model {name}: no such folder")
    try:
        return auto.from_pretrained(
            str(path) if looks_like_path else name, attn_implementation=args.attn
        )
    except (OSError, ValueError) as exc:  # no config.json or weights, an unknown model type
        why = (str(exc).strip().splitlines() or [""])[0]
        raise ConfigError(f"--model {name}: {why}") from None


def check_vocab(model, vocab: int, name: str) -> None:
    """Refuse (ConfigError) a model with fewer embedding rows than the data's tokenizer has
    ids (index.json): the first id past them was an IndexError deep in torch's embedding."""
    rows = model.get_input_embeddings().num_embeddings
    if rows < vocab:
        raise ConfigError(
            f"--model {name} has {rows:,} token ids (embedding rows), the data's tokenizer "
            f"(index.json) {vocab:,}: pack the data with the model's tokenizer"
        )


def train_loop(args: argparse.Namespace, ds_kwargs: dict) -> list[float]:
    from accelerate import Accelerator

    # Without a GPU, accelerate spreads over torchrun's processes only with cpu=True.
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    ds = PackedDataset(
        args.data, rank=accelerator.process_index, world_size=accelerator.num_processes, **ds_kwargs
    )
    manifest = ds.store.manifest
    model = make_model(args, int(manifest.tokenizer["vocab_size"]), int(manifest.max_len))
    model.config.use_cache = args.use_cache
    loader = PackedDataLoader(ds)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    model, opt = accelerator.prepare(model, opt)
    losses: list[float] = []
    epoch = 0
    while len(losses) < args.steps:
        loader.set_epoch(epoch)
        for batch in loader:
            batch = {
                k: v.to(accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()
            }
            if not losses:
                check_packed_model(model, batch)
            # The global target count: a token mean over all ranks, 0 from a filler batch.
            targets = accelerator.reduce((batch["labels"] != -100).sum(), "sum")
            loss = model(**batch, num_items_in_batch=targets).loss * accelerator.num_processes
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(accelerator.reduce(loss.detach(), "mean")))
            if len(losses) % 10 == 0 or len(losses) == args.steps:
                accelerator.print(f"step {len(losses):5d}  epoch {epoch}  loss {losses[-1]:.4f}")
            if len(losses) == args.steps:
                break
        epoch += 1
    return losses


def train_trainer(args: argparse.Namespace, ds_kwargs: dict) -> list[float]:
    from transformers import TrainingArguments

    from loader.hf import PackedTrainer

    targs = TrainingArguments(args.out, max_steps=args.steps, learning_rate=args.lr,
                              use_cache=args.use_cache, logging_steps=10, report_to=[],
                              seed=args.seed, save_steps=max(args.steps // 2, 1))  # fmt: skip
    ds = PackedDataset(args.data, **ds_kwargs)
    manifest = ds.store.manifest
    model = make_model(args, int(manifest.tokenizer["vocab_size"]), int(manifest.max_len))
    trainer = PackedTrainer(model=model, args=targs, train_dataset=ds)
    trainer.train()
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def main(argv: list[str] | None = None) -> list[float]:
    args = parse_args(argv)
    ds_kwargs = {"rows_per_batch": args.rows_per_batch, "layout": "hf", "seed": args.seed}
    try:
        losses = (train_trainer if args.trainer else train_loop)(args, ds_kwargs)
    except PacktoolError as exc:  # a bad --data or --model, a model that would leak: one line
        raise SystemExit(f"error: {exc}") from None
    if not all(math.isfinite(x) for x in losses):
        raise SystemExit("error: the loss is not finite")
    return losses


if __name__ == "__main__":
    main()
