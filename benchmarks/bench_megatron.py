"""`packtool tokenize --to megatron` against Megatron's own preprocessing loop, same corpus, same bytes.

Run from the repository root: `python -m benchmarks.bench_megatron [--mb 60] [--quick]` (about three
minutes on 2 cores at 60 MB; the tokenizer load, ~0.5 s, is in both pipelines).

The baseline is what Megatron-LM's `tools/preprocess_data.py` does with `--append-eod` and no
sentence splitting, written out here with megatron-core's own builder (the script lives in the
Megatron-LM repository, not in the megatron-core package): a `multiprocessing.Pool` of one
encoder per core (`--workers`) over the JSONL lines in chunks of 32 (`pool.imap(encoder.encode,
fin, 32)`), each line `json.loads`-ed and encoded one document at a time with Hugging Face
`tokenizers` (`Tokenizer.encode(text).ids`, what Megatron's HuggingFace tokenizer wrapper
returns) plus the EOD id, and the main process adding each document to
`IndexedDatasetBuilder(dtype=DType.optimal_dtype(vocab_size))` as
`add_document(torch.tensor(ids), [len(ids)])`, then `finalize`. packtool:
`tokenize_megatron` (the `packtool tokenize --to megatron` call), JSONL in -> `.bin`/`.idx` out.
Both outputs are compared byte for byte before a figure is printed.

Corpus: real text made at bench time (benchmarks/real_corpus.py: man page sources first, never
repeated). Tokenizer: GPT-2's own tokenizer.json, as the hub serves it (bench_tokenize's
`gpt2_hub_tokenizer_json`, assembled from GPT-2's vocab.json and merges.txt).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
import warnings
from pathlib import Path

WORKERS = len(os.sched_getaffinity(0))
os.environ.setdefault("RAYON_NUM_THREADS", str(WORKERS))
os.environ.setdefault("PACKTOOL_NO_PROGRESS", "1")

from benchmarks import real_corpus  # noqa: E402
from benchmarks._common import markdown_table, update_block  # noqa: E402
from benchmarks.bench_tokenize import DATA, gpt2_hub_tokenizer_json  # noqa: E402

GOAL = 10.0
PARTS = "packtool, 8 partitions"
"""The same command on the partition engine: `--partition-size` MB/8, a worker process per core."""


class Encoder:
    """preprocess_data.py's Encoder: a tokenizer per worker process, one document per call."""

    def initializer(self, tokenizer_json: str) -> None:
        from tokenizers import Tokenizer

        Encoder.tokenizer = Tokenizer.from_file(tokenizer_json)
        Encoder.eod = Encoder.tokenizer.token_to_id("<|endoftext|>")

    def encode(self, line: str) -> tuple[list[int], int]:
        text = json.loads(line)["text"]
        ids = Encoder.tokenizer.encode(text).ids
        if ids:
            ids.append(Encoder.eod)  # --append-eod
        return ids, len(line)


def megatron_loop(corpus: Path, tokenizer_json: Path, prefix: Path, workers: int) -> int:
    """Megatron's preprocessing of `corpus` into `prefix`.bin/.idx; the tokens written."""
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder
    from tokenizers import Tokenizer

    vocab = Tokenizer.from_file(str(tokenizer_json)).get_vocab_size()
    encoder = Encoder()
    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=DType.optimal_dtype(vocab))
    tokens = 0
    ctx = multiprocessing.get_context("fork")
    with (
        open(corpus, encoding="utf-8") as fin,
        ctx.Pool(workers, initializer=encoder.initializer, initargs=(str(tokenizer_json),)) as pool,
    ):
        for ids, _ in pool.imap(encoder.encode, fin, 32):
            if not ids:  # packtool skips (and counts) empty documents; so does this baseline
                continue
            builder.add_document(torch.tensor(ids), [len(ids)])
            tokens += len(ids)
    builder.finalize(f"{prefix}.idx")
    return tokens


def packtool_run(corpus: Path, tokenizer_json: Path, prefix: Path, partitions: int = 1) -> int:
    """`tokenize --to megatron`: one partition in this process (the default for a corpus under
    256 MB), or `partitions` of them on the local engine's worker processes."""
    from packtool.engines.megatron.run import tokenize_megatron

    size = corpus.stat().st_size
    kw = {"partition_size": -(-size // partitions)} if partitions > 1 else {}
    summary = tokenize_megatron(
        [corpus], prefix, tokenizer=str(tokenizer_json), overwrite=True, progress=False, **kw
    )
    return summary.tokens


def timed(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = fn()
    return time.perf_counter() - t0, tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=60, help="MB of real text")
    ap.add_argument("--repeat", type=int, default=3, help="timings per figure; the best counts")
    ap.add_argument("--quick", action="store_true", help="5 MB, one timing, docs left alone")
    ap.add_argument("--no-docs", action="store_true", help="print only")
    args = ap.parse_args()
    if args.quick:
        args.mb, args.repeat = 5, 1
    corpus = DATA / f"real_corpus_{args.mb}mb.jsonl"
    counts = real_corpus.build(corpus, args.mb * 1_000_000)
    tok = gpt2_hub_tokenizer_json()
    out = DATA / "megatron"
    out.mkdir(parents=True, exist_ok=True)
    best: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for _ in range(args.repeat):  # interleaved, best of
        for name, fn in (
            ("megatron", lambda: megatron_loop(corpus, tok, out / "megatron", WORKERS)),
            ("packtool", lambda: packtool_run(corpus, tok, out / "packtool")),
            (PARTS, lambda: packtool_run(corpus, tok, out / "parts", 8)),
        ):
            seconds, tokens[name] = timed(fn)
            best[name] = min(best.get(name, float("inf")), seconds)
            print(f"{name}: {seconds:.2f} s", flush=True)
    for suffix in (".bin", ".idx"):
        a = (out / f"megatron{suffix}").read_bytes()
        for other in ("packtool", "parts"):
            if (out / f"{other}{suffix}").read_bytes() != a:
                raise SystemExit(f"{other}{suffix} differs from megatron's: not the same dataset")
    size = corpus.stat().st_size
    rows = [
        [
            name,
            f"{best[name]:.2f}",
            f"{size / 1e6 / best[name]:.1f}",
            f"{tokens[name] / best[name] / 1e6:.2f}",
            f"{best['megatron'] / best[name]:.1f}x",
        ]
        for name in ("megatron", "packtool", PARTS)
    ]
    table = markdown_table(["pipeline", "seconds", "MB/s of JSONL", "M tokens/s", "speed-up"], rows)
    ratio = best["megatron"] / best["packtool"]
    body = (
        f"Megatron indexed dataset (`python -m benchmarks.bench_megatron`, {time.strftime('%Y-%m-%d')}, "
        f"{WORKERS} cores, best of {args.repeat}, interleaved): {size / 1e6:.0f} MB of real text "
        f"({counts['documents']:,} documents, benchmarks/real_corpus.py), GPT-2's tokenizer.json, "
        "into `.bin`/`.idx` with each document's ids then the EOD. megatron = preprocess_data.py's "
        "loop (a process pool of `tokenizers` encoders, one document a call, chunks of 32, into "
        "megatron-core's `IndexedDatasetBuilder`); packtool = `packtool tokenize --to megatron` (one "
        "partition, in this process), and the same with `--partition-size` an eighth of the corpus "
        "(the local engine: a worker process per core, parts joined in order as they finish). "
        f"The three outputs are byte-identical (checked in the run). packtool: **{ratio:.1f}x** "
        f"(goal {GOAL:.0f}x: {'met' if ratio >= GOAL else 'missed'}).\n\n{table}"
    )
    print("\n" + body)
    if not args.no_docs and not args.quick:
        update_block("megatron", body)
        print("\ndocs/benchmarks.md block `megatron` updated.")


if __name__ == "__main__":
    main()
