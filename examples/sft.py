"""Supervised fine-tuning on packed chat data: the loss on the assistant turns only.

    python examples/sft.py --out /tmp/sft --steps 100

Packs sample_data/chat.jsonl (conversations rendered with examples/chat_template.jinja, the byte
tokenizer, rows of --max-len tokens; conversations longer than a row are truncated, never split
across rows, and the mask keeps only the assistant turns), then trains the small model with
examples/train.py's loop on those rows and prints how the loss on the assistant tokens falls.
`--loss-normalization sequence` weighs every conversation the same instead of every token.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _train_module():
    spec = importlib.util.spec_from_file_location("example_train", HERE / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """This script's options, and the rest for examples/train.py, checked by train.py's parser
    now: a mistyped or out-of-range option stops the run before the data is packed."""
    train = _train_module()
    p = train.OneLineParser(
        description=__doc__.splitlines()[0],
        epilog="Every other option goes to examples/train.py (--steps, --lr, --dim, --ckpt, "
        "--resume, --loss-normalization, ...; `python examples/train.py --help` lists them), "
        "which trains on OUT/packed.",
    )
    p.add_argument(
        "--out",
        required=True,
        help="folder for the packed data (OUT/packed; with --limit also OUT/chat-subset.jsonl); "
        "checkpoints are written only where --ckpt names a file",
    )
    p.add_argument("--data", default=str(ROOT / "sample_data" / "chat.jsonl"))
    p.add_argument("--chat-template", default=str(HERE / "chat_template.jinja"))
    p.add_argument("--max-len", type=train.int_from(1), default=2048)
    p.add_argument("--train-on", choices=["assistant", "last", "all"], default="assistant")
    p.add_argument(
        "--limit",
        type=train.int_from(1),
        default=None,
        help="use only the first N conversations",
    )
    args, rest = p.parse_known_args(argv)
    train.parse_args(["--data", str(Path(args.out) / "packed"), *rest])
    return args, rest


def pack(args: argparse.Namespace) -> Path:
    """`packtool pack` on the chat data, through the library (what the CLI runs)."""
    from packtool.engines.local import RunConfig, run_pack
    from packtool.errors import DataError
    from packtool.pack.chunk import PackConfig
    from packtool.read.documents import ReadConfig
    from packtool.read.sft_config import SFTConfig

    out = Path(args.out)
    data = Path(args.data)
    if args.limit is not None:
        if not data.is_file():  # the same words as run_pack's for a path that is not there
            raise DataError(f"{args.data}: no such file or folder")
        out.mkdir(parents=True, exist_ok=True)
        lines = data.read_text(encoding="utf-8").splitlines()[: args.limit]
        data = out / "chat-subset.jsonl"
        data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    summary = run_pack(
        RunConfig(
            inputs=(str(data),),
            out_dir=str(out / "packed"),
            pack=PackConfig(max_len=args.max_len, long_docs="truncate"),
            read=ReadConfig(
                sft=SFTConfig(chat_template=args.chat_template, train_on=args.train_on)
            ),
            overwrite=True,
            progress=False,
        )
    )
    print(summary.format(args.max_len))
    return out / "packed"


def main(argv: list[str] | None = None) -> list[float]:
    from packtool.errors import PacktoolError

    args, rest = parse_args(argv)
    try:
        packed = pack(args)
    except PacktoolError as exc:  # no data, a missing template, nothing left: one line
        raise SystemExit(f"error: {exc}") from None
    losses = _train_module().main(["--data", str(packed), *rest])
    k = max(1, len(losses) // 10)
    first, last = sum(losses[:k]) / k, sum(losses[-k:]) / k
    print(f"assistant-token loss: first {k} steps {first:.3f} -> last {k} steps {last:.3f}")
    return losses


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
