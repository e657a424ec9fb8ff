"""Fine-tuning data: chat rendering + tokenizing against transformers, and `pack` against TRL.

Run: `python -m benchmarks.bench_sft [--copies 3] [--repeat 5] [--pool-copies 20] [--quick]
[--no-readme]`.

Data (bench_data/sft/, git-ignored, made once): sample_data/chat.jsonl (700 generated
conversations, 1-8 exchanges) `--copies` times; a byte-level BPE tokenizer (vocabulary 8,192)
trained here on sample_data with the template's special tokens, saved as tokenizer.json with a
tokenizer_config.json naming BOS/EOS: both sides load that same file. The template is TRL's
`qwen2_5_training.jinja` (Qwen2.5's template with `{% generation %}` blocks), read from the
installed trl package; `qwen2_5.jinja` (the original, no generation blocks) measures packtool's
turn-by-turn masks, where transformers returns no mask (its row renders and tokenizes only).

1. Rendering + tokenizing, the same conversations and template, interleaved, best of `--repeat`:
   transformers `apply_chat_template(conv, tokenize=True, return_dict=True,
   return_assistant_tokens_mask=True)` per conversation (as TRL's SFTTrainer calls it);
   `datasets.Dataset.map` of that call with `num_proc=2` (the usual way to use both cores);
   packtool `encode_chat` (the library, in memory); packtool `tokenize` from the JSONL file to
   tokenized Parquet (reading, rendering, encoding, masks and writing, in its pipeline), with
   rendering in the main process (the default here) and in a pool of 2 forked
   processes (`--render-processes 2`, packtool/sft/render.py). CPU seconds count this process
   and its children. The same two on `--pool-copies` copies (above the pool's threshold).
2. End to end at max_len 2048: `packtool pack` (the whole process) against TRL's SFTTrainer data
   path (`load_dataset("json")`, `map` with `apply_chat_template` and the assistant mask, the
   labels, `trl.pack_dataset(..., strategy="bfd")`): wall time, rows, efficiency and supervised
   efficiency (supervised tokens / (rows x max_len)).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks._common import ROOT, compile_sources, markdown_table, update_block

DATA = ROOT / "bench_data" / "sft"
CHAT = ROOT / "sample_data" / "chat.jsonl"
SPECIALS = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
MAX_LEN = 2048
POOLED = "packtool tokenize, 2 render processes"


def _cpu() -> float:
    """CPU seconds of this process and of its children that have ended (render workers)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def template_source(name: str) -> str:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja"
    return path.read_text(encoding="utf-8")


def tokenizer_dir() -> Path:
    """bench_data/sft/tok: tokenizer.json (trained once) and tokenizer_config.json."""
    folder = DATA / "tok"
    if (folder / "tokenizer.json").is_file():
        return folder
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    trainer = trainers.BpeTrainer(
        vocab_size=8192,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = ROOT / "sample_data" / "corpus.jsonl"
    texts = [json.loads(line)["text"] for line in corpus.read_text("utf-8").splitlines()]
    tok.train_from_iterator(texts, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(SPECIALS), encoding="utf-8")
    return folder


def chat_file(copies: int) -> Path:
    path = DATA / f"chat_x{copies}.jsonl"
    if not path.is_file():
        DATA.mkdir(parents=True, exist_ok=True)
        text = CHAT.read_text(encoding="utf-8")
        path.write_text(text * copies, encoding="utf-8")
    return path


def hf_tokenizer(folder: Path):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"), **SPECIALS)


def run_transformers(hf, source: str, convs: list, mask: bool) -> int:
    tokens = 0
    for conv in convs:
        out = hf.apply_chat_template(
            conv,
            chat_template=source,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=mask,
        )
        tokens += len(out["input_ids"])
    return tokens


def _map_fn(example, hf, source, mask):
    out = hf.apply_chat_template(
        example["messages"],
        chat_template=source,
        tokenize=True,
        return_dict=True,
        return_assistant_tokens_mask=mask,
    )
    keep = {"input_ids": out["input_ids"]}
    if mask:
        keep["assistant_masks"] = out["assistant_masks"]
    return keep


def run_datasets_map(folder: Path, name: str, path: Path, mask: bool, num_proc: int) -> tuple:
    """`datasets.map(num_proc=...)` in a fresh process: (seconds of load_dataset + map, tokens).

    Not in this process: once it has forked, Hugging Face tokenizers here stop using their
    threads (measured: batch encoding 2x slower afterwards), which would slow packtool's runs.
    """
    cmd = [
        sys.executable, "-m", "benchmarks.bench_sft", "--map-worker", str(path), str(folder),
        name, str(int(mask)), str(num_proc),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["seconds"], out["tokens"]


def _map_worker(path: Path, folder: Path, name: str, mask: bool, num_proc: int) -> dict:
    import datasets

    datasets.disable_progress_bars()
    hf, source = hf_tokenizer(folder), template_source(name)
    best = None
    for _ in range(2):  # the first warms the workers' start-up paths
        t0 = time.perf_counter()
        ds = datasets.load_dataset("json", data_files=str(path), split="train")
        ds = ds.map(
            _map_fn,
            fn_kwargs={"hf": hf, "source": source, "mask": mask},
            num_proc=num_proc,
            remove_columns=ds.column_names,
            load_from_cache_file=False,
        )
        seconds = time.perf_counter() - t0
        best = seconds if best is None else min(best, seconds)
    return {"seconds": best, "tokens": sum(len(x) for x in ds["input_ids"])}


def run_packtool(template, tok, convs: list) -> int:
    from packtool.sft.encode import encode_chat

    return sum(
        len(r.ids)
        for r in encode_chat(convs, template=template, tokenizer=tok)
        if r.ids is not None
    )


def run_packtool_tokenize(
    path: Path, template_path: Path, tok, out: Path, processes: int | None = None
) -> int:
    from packtool.read.documents import ReadConfig
    from packtool.read.sft_config import SFTConfig
    from packtool.tokenize.tokenize import tokenize_corpus

    sft = SFTConfig(chat_template=str(template_path), render_processes=processes)
    read = ReadConfig(sft=sft)
    summary = tokenize_corpus(
        [path], out, read_config=read, tokenizer=tok, overwrite=True, progress=False
    )
    return summary.tokens


def trl_data_path(path: Path, folder: Path) -> dict:
    """SFTTrainer's preparation of a conversational dataset with assistant_only_loss + packing.

    Run in a fresh process (`--trl-worker`), like `packtool pack`: imports included.
    """
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "benchmarks.bench_sft", "--trl-worker", str(path), str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["seconds"] = time.perf_counter() - t0
    return out


def _trl_worker(path: Path, folder: Path, max_len: int = MAX_LEN) -> dict:
    import datasets
    from trl import pack_dataset

    datasets.disable_progress_bars()
    source = template_source("qwen2_5_training")
    hf = hf_tokenizer(folder)
    ds = datasets.load_dataset("json", data_files=str(path), split="train")
    ds = ds.map(
        _map_fn,
        fn_kwargs={"hf": hf, "source": source, "mask": True},
        remove_columns=ds.column_names,
        load_from_cache_file=False,
    )
    ds = ds.filter(lambda x: 1 in x["assistant_masks"], load_from_cache_file=False)

    def labels(x):
        return {
            "labels": [
                t if m else -100 for t, m in zip(x["input_ids"], x["assistant_masks"], strict=True)
            ]
        }

    ds = ds.map(labels, remove_columns=["assistant_masks"], load_from_cache_file=False)
    packed = pack_dataset(ds.select_columns(["input_ids", "labels"]), max_len, strategy="bfd")
    rows = len(packed)
    tokens = sum(len(x) for x in packed["input_ids"])
    supervised = sum(sum(1 for t in x if t != -100) for x in packed["labels"])
    return {"rows": rows, "tokens": tokens, "supervised": supervised}


def packtool_pack(path: Path, folder: Path, template_path: Path, max_len: int, out: Path) -> dict:
    """`packtool pack` as a user runs it: a whole process, start-up and imports included."""
    t0 = time.perf_counter()
    cmd = [
        sys.executable, "-m", "packtool.cli", "pack", str(path), "-o", str(out), "--overwrite",
        "--tokenizer", str(folder / "tokenizer.json"), "--chat-template", str(template_path),
        "--max-len", str(max_len), "--json",
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t0
    summary = json.loads(done.stdout)
    counts = summary["counts"]
    return {
        "seconds": seconds,
        "rows": counts["rows"],
        "tokens": counts["tokens_out"],
        "supervised": counts["tokens_supervised"],
    }


def pool_table(copies: int, repeat: int, tok) -> tuple[str, int, float]:
    """`packtool tokenize` of a bigger input, rendering in process and in 2 processes."""
    path = chat_file(copies)
    n = sum(1 for _ in path.open("rb"))
    rows = []
    for name in ("qwen2_5_training", "qwen2_5"):
        template_path = DATA / f"{name}.jinja"
        best: dict[int, tuple[float, float]] = {}
        for _ in range(repeat):
            for processes in (0, 2):
                c0, t0 = _cpu(), time.perf_counter()
                run_packtool_tokenize(path, template_path, tok, DATA / "big.parquet", processes)
                seconds, cpu = time.perf_counter() - t0, _cpu() - c0
                if processes not in best or seconds < best[processes][0]:
                    best[processes] = (seconds, cpu)
        for processes, (seconds, cpu) in best.items():
            where = "main process" if not processes else f"{processes} processes"
            rows.append([
                f"`{name}`", where, f"{seconds:.2f}", f"{n / seconds:,.0f}", f"{cpu:.2f}",
                f"{best[0][0] / seconds:.2f}x",
            ])  # fmt: skip
    (DATA / "big.parquet").unlink(missing_ok=True)
    header = ["template", "rendering in", "seconds", "conversations/s", "CPU s", "vs main process"]
    return markdown_table(header, rows), n, path.stat().st_size / 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--copies", type=int, default=3)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="1 copy, 1 repeat")
    p.add_argument("--no-readme", action="store_true")
    p.add_argument("--pool-copies", type=int, default=20, help="input copies for the pool table")
    p.add_argument(
        "--trl-worker", nargs=2, metavar=("JSONL", "TOKENIZER_DIR"), help=argparse.SUPPRESS
    )
    p.add_argument("--map-worker", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    compile_sources()  # packtool's processes start from bytecode, as installed
    if args.trl_worker:
        print(json.dumps(_trl_worker(Path(args.trl_worker[0]), Path(args.trl_worker[1]))))
        return
    if args.map_worker:
        path, folder, name, mask, num_proc = args.map_worker
        print(json.dumps(_map_worker(Path(path), Path(folder), name, mask == "1", int(num_proc))))
        return
    if args.quick:
        args.copies, args.repeat, args.pool_copies = 1, 1, 2
    from packtool.sft.template import ChatTemplate
    from packtool.tokenizer.tokenizers import load_tokenizer

    load_before = os.getloadavg()[0]
    folder = tokenizer_dir()
    path = chat_file(args.copies)
    convs = [json.loads(line)["messages"] for line in path.read_text("utf-8").splitlines()]
    hf = hf_tokenizer(folder)
    tok = load_tokenizer(str(folder / "tokenizer.json"))
    results: dict[tuple[str, str], tuple[float, int, float | None]] = {}
    for name, mask in (("qwen2_5_training", True), ("qwen2_5", False)):
        source = template_source(name)
        template_path = DATA / f"{name}.jinja"
        template_path.write_text(source, encoding="utf-8")  # bench_data only, never committed
        template = ChatTemplate(source, special_tokens=SPECIALS, name=name)
        runs = {
            "transformers": lambda s=source, m=mask: run_transformers(hf, s, convs, m),
            "datasets.map(num_proc=2)": lambda n=name, m=mask: run_datasets_map(
                folder, n, path, m, 2
            ),
            "packtool encode_chat": lambda t=template: run_packtool(t, tok, convs),
            "packtool tokenize": lambda tp=template_path: run_packtool_tokenize(
                path, tp, tok, DATA / "tok.parquet"
            ),
            POOLED: lambda tp=template_path: run_packtool_tokenize(
                path, tp, tok, DATA / "tok.parquet", 2
            ),
        }
        for key, run in runs.items():  # warm-up: caches, imports, the BPE's word cache
            if not key.startswith("datasets"):  # (its worker process warms itself up)
                run()
        best: dict[str, tuple[float, int, float | None]] = {}
        for _ in range(args.repeat):  # interleaved: each run sees the same load
            for key, run in runs.items():
                c0 = _cpu()
                t0 = time.perf_counter()
                tokens = run()
                seconds = time.perf_counter() - t0
                cpu: float | None = _cpu() - c0
                if isinstance(tokens, tuple):  # timed in its own process
                    (seconds, tokens), cpu = tokens, None
                if key not in best or seconds < best[key][0]:
                    best[key] = (seconds, tokens, cpu)
        for key, value in best.items():
            results[name, key] = value
    n = len(convs)
    rows = []
    for name in ("qwen2_5_training", "qwen2_5"):
        base = results[name, "transformers"][0]
        for key in (
            "transformers",
            "datasets.map(num_proc=2)",
            "packtool encode_chat",
            "packtool tokenize",
            POOLED,
        ):
            seconds, tokens, cpu = results[name, key]
            what = (
                "text + ids + assistant mask"
                if name.endswith("training")
                else ("text + ids" if not key.startswith("packtool") else "text + ids + turn mask")
            )
            rows.append([
                f"`{name}`", key, what, f"{n / seconds:,.0f}", f"{tokens / seconds / 1e6:.2f}",
                "–" if cpu is None else f"{cpu:.2f}", f"{base / seconds:.2f}x",
            ])  # fmt: skip
    table1 = markdown_table(
        ["template", "run", "output", "conversations/s", "M tokens/s", "CPU s", "vs transformers"],
        rows,
    )
    table_pool, big_n, big_mb = pool_table(args.pool_copies, args.repeat, tok)
    e2e_path = path
    template_path = DATA / "qwen2_5_training.jinja"
    best_pt, best_trl = None, None
    for _ in range(args.repeat):
        pt = packtool_pack(e2e_path, folder, template_path, MAX_LEN, DATA / "packed")
        tr = trl_data_path(e2e_path, folder)
        best_pt = pt if best_pt is None or pt["seconds"] < best_pt["seconds"] else best_pt
        best_trl = tr if best_trl is None or tr["seconds"] < best_trl["seconds"] else best_trl
    shutil.rmtree(DATA / "packed", ignore_errors=True)
    rows2 = []
    for label, r in (
        ("`packtool pack` (whole process)", best_pt),
        ("TRL SFTTrainer data path", best_trl),
    ):
        slots = r["rows"] * MAX_LEN
        rows2.append([
            label, f"{r['seconds']:.2f}", f"{r['rows']:,}", f"{r['tokens']:,}",
            f"{r['tokens'] / slots:.2%}", f"{r['supervised']:,}", f"{r['supervised'] / slots:.2%}",
        ])  # fmt: skip
    table2 = markdown_table(
        ["run", "seconds", "rows", "tokens", "efficiency", "supervised tokens", "supervised eff."],
        rows2,
    )
    load_after = os.getloadavg()[0]
    head = (
        f"`python -m benchmarks.bench_sft{' --quick' if args.quick else ''}` "
        f"({time.strftime('%Y-%m-%d')}): sample_data/chat.jsonl x{args.copies} ({n:,} "
        f"conversations), a byte-level BPE of 8,192 ids trained on sample_data (packtool encodes "
        f"with {tok.identity.engine}), TRL's "
        f"`qwen2_5_training.jinja` and `qwen2_5.jinja`; best of {args.repeat}, interleaved; "
        f"{platform.machine()}, {os.cpu_count()} cores, load average (1 min) {load_before:.1f} "
        f"before, {load_after:.1f} after."
    )
    tail = (
        f"End to end on the same {n:,} conversations (JSONL) at max_len {MAX_LEN}, the same "
        "tokenizer and template, each a whole process (start-up and imports included); "
        "conversations longer than a row are truncated by both (TRL's `bfd`, packtool's "
        f"`--long-docs truncate`); best of {args.repeat}, interleaved:"
    )
    pool_head = (
        f"`packtool tokenize` on sample_data/chat.jsonl x{args.pool_copies} ({big_n:,} "
        f"conversations, {big_mb:.1f} MB; from 8 MiB the render pool is the default for turn masks), "
        "rendering "
        f"in the main process and in 2 forked processes; best of {args.repeat}, interleaved:"
    )
    body = f"{head}\n\n{table1}\n\n{pool_head}\n\n{table_pool}\n\n{tail}\n\n{table2}"
    print(body)
    if not args.no_readme:
        update_block("sft", body)


if __name__ == "__main__":
    main()
