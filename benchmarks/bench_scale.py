"""Scale benchmark for the partition engines (#13). Run from the repo root:

    python -m benchmarks.bench_scale [--docs 1000000] [--quick]

Five measurements, written to the docs/benchmarks.md block `scale` (`--only-tail`: the fifth alone,
printed, no docs/benchmarks.md update):

1. **Chunk size no longer matters**: `packtool pack` (byte tokenizer, max_len 2048, local
   engine, one process per run, wall clock) on 1 M short synthetic documents (~184 MB of JSONL,
   bench_data/scale_1m.jsonl, made on first use) at `--chunk-docs 100,000` and `1,000` (best of
   `--repeat`, alternating), and at 1,000 on the first 250k / 500k documents (before #13 the cost of a chunk grew with the
   chunks done: 10.5 s against 77.0 s).
2. **Bookkeeping of constant cost**: the driver's part alone (`records.read_record` +
   `Totals.add` per partition record, then `finish.write_index` streamed from the records) fed
   1k, 10k and 100k synthetic records (~2 KB each, as a partition writes them; written here
   without fsync, which is the worker's cost, once per partition): time per record and the
   process's RSS.
3. **Reading rate, 1 vs 2 partition workers** (byte tokenizer, `--partition-size 32MB`), and
   **the per-core rate of a partition worker with GPT-2 BPE** (`tiktoken:bench_data/gpt2.tiktoken`,
   fetched once from the openai-whisper sdist by benchmarks/bench_tokenize.py) under
   `taskset -c 0`, one tokenizer thread.
4. **On paper**: 64 nodes x 32 cores from the per-core rate, and what limits it then.
5. **The tail tree** (packtool/engines/merge.py) on synthetic partition tails (each the
   least-filled rows a real `pack_table` call sets aside from 2,000 log-normal documents at
   max_len 2048, ~32 rows): the time of the merge waves with 1 and 2 worker processes, the
   root's input (bounded by 64 x 32 rows), and the flat final stage before the tree (every
   tail packed by one process) for comparison; the two worker counts give the same shards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._common import ROOT, compile_sources, markdown_table, update_block

DATA = ROOT / "bench_data"
CORPUS = DATA / "scale_1m.jsonl"
OUT = DATA / "scale_out"
_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were their one all we can her has there been if more when "
    "will would who so no packing tokens rows shards partition cluster worker record"
)
WORDS = _TEXT.split()  # noqa: SIM905
ONE_THREAD = {
    "NUMBA_NUM_THREADS": "1",
    "OMP_NUM_THREADS": "1",
    "RAYON_NUM_THREADS": "1",
    "FASTOKENS_BPE_THREADS": "1",
}


def load() -> float:
    return os.getloadavg()[0]


def make_corpus(docs: int) -> Path:
    """`docs` documents of ~184 bytes of JSONL on average (log-normal word counts)."""
    path = DATA / f"scale_{docs // 1000}k.jsonl" if docs != 1_000_000 else CORPUS
    if path.exists():
        return path
    DATA.mkdir(exist_ok=True)
    rng = random.Random(0)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for _ in range(docs):
            n = max(1, min(400, int(rng.lognormvariate(3.1, 0.7))))
            f.write(json.dumps({"text": " ".join(rng.choices(WORDS, k=n))}) + "\n")
    tmp.replace(path)
    return path


def head(path: Path, docs: int) -> Path:
    """The first `docs` lines of `path` (a file of its own)."""
    out = path.with_name(f"{path.stem}_head{docs // 1000}k.jsonl")
    if not out.exists():
        with open(path, "rb") as src, open(out, "wb") as dst:
            for _, line in zip(range(docs), src, strict=False):
                dst.write(line)
    return out


def pack(corpus: Path, *args: str, env: dict | None = None, prefix=()) -> tuple[float, dict]:
    """One `packtool pack` process: (wall seconds, its --json summary)."""
    out = OUT / "run"
    shutil.rmtree(OUT, ignore_errors=True)  # also a staging folder an interrupted bench left
    OUT.mkdir(parents=True)
    cmd = [
        *prefix,
        sys.executable,
        "-m",
        "packtool.cli",
        "pack",
        str(corpus),
        "-o",
        str(out),
    ]
    cmd += ["--max-len", "2048", "--json", *args]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env={**os.environ, "PACKTOOL_NO_PROGRESS": "1", **(env or {})},
        cwd=ROOT,
    )
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(proc.stderr[-2000:])
    summary = json.loads(proc.stdout[proc.stdout.index("{") :])
    shutil.rmtree(out, ignore_errors=True)
    return seconds, summary


def chunk_table(corpus: Path, docs: int, quick: bool, repeat: int) -> tuple[str, float]:
    """Best of `repeat` for the two full-size runs, alternating (the box is shared)."""
    full = [(100_000, docs), (1000, docs)]
    part = [] if quick else [(1000, docs // 4), (1000, docs // 2)]
    best: dict[tuple[int, int], tuple[float, dict]] = {}
    for _ in range(repeat):
        for chunk, n in full:
            got = pack(corpus, "--chunk-docs", str(chunk))
            if (chunk, n) not in best or got[0] < best[(chunk, n)][0]:
                best[(chunk, n)] = got
    for chunk, n in part:
        best[(chunk, n)] = pack(head(corpus, n), "--chunk-docs", str(chunk))
    rows = []
    for chunk, n in [full[0], *part, full[1]]:
        seconds, s = best[(chunk, n)]
        rows.append(
            [f"{chunk:,}", f"{n:,}", f"{s['counts']['rows']:,}", f"{s['efficiency']:.4%}"]
            + [f"{seconds:.1f}", f"{s['seconds']['total']:.1f}"]
        )
    ratio = best[(1000, docs)][0] / best[(100_000, docs)][0]
    table = markdown_table(
        ["--chunk-docs", "documents", "rows", "efficiency", "wall s", "in-run s"], rows
    )
    return table, ratio


def bookkeeping(counts=(1_000, 10_000, 100_000)) -> str:
    """The driver's bookkeeping alone on synthetic partition records (see the module doc)."""
    from packtool.dataset.manifest import Manifest
    from packtool.engines import finish, records

    rng = random.Random(1)
    rows = []
    real_fsync = os.fsync
    os.fsync = lambda fd: None  # the worker's once-per-partition cost, not the driver's
    try:
        for n in counts:
            work = Path(tempfile.mkdtemp(dir=DATA, prefix="book-"))
            lengths = sorted(rng.sample(range(1, 2049), 120))
            t0 = time.perf_counter()
            for p in range(n):
                records.write_record(work, _record(p, lengths, rng))
            t_write = time.perf_counter() - t0
            totals = records.Totals(2048, 1)
            rss0 = _rss_mib()
            t0 = time.perf_counter()
            for p in records.finished(work):
                totals.add(records.read_record(work, p))
            t_add = time.perf_counter() - t0
            records.write_record(work, _record(n, lengths, rng))  # the final stage's record
            m = Manifest(
                tokenizer={"kind": "byte", "name": "byte", "vocab_size": 258, "eos_id": 256},
                max_len=2048,
                algorithm="ffd",
                seed=0,
                rounds=1,
                long_docs="split",
                counts={},
                efficiency=0.99,
                lower_bound_rows=0,
                shards=(),
            )
            t0 = time.perf_counter()
            finish.write_index(work, m, n)
            t_index = time.perf_counter() - t0
            size = (work / "index.json").stat().st_size
            rows.append(
                [
                    f"{n:,}",
                    f"{t_write / n * 1e6:.0f}",
                    f"{t_add / n * 1e6:.0f}",
                    f"{t_index / n * 1e6:.0f}",
                    f"{_rss_mib():.0f} ({_rss_mib() - rss0:+.0f})",
                    f"{size / 1e6:.1f}",
                ]
            )
            shutil.rmtree(work)
    finally:
        os.fsync = real_fsync
    return markdown_table(
        [
            "records",
            "write µs/record (worker side)",
            "read + add µs/record (driver)",
            "index.json µs/record",
            "RSS MiB (growth while adding)",
            "index.json MB",
        ],
        rows,
    )


def _record(p: int, lengths: list[int], rng: random.Random) -> dict:
    return {
        "partition": p,
        "shards": [
            {"file": f"shard-{p:06d}-{k:05d}.parquet", "rows": 50_000, "tokens": 10**8}
            | {"bytes": 3 * 10**8, "sha256": f"{rng.getrandbits(256):064x}"}
            for k in range(3)
        ],
        "counts": {"documents_in": 1000, "tokens_in": 10**6, "rows": 500},
        "rows_per_round": [500],
        "groups": {},
        "histogram": {"lengths": lengths, "counts": [rng.randint(1, 99) for _ in lengths]},
        "skips": {"counts": {"empty": 1}, "examples": {"empty": [f"f{p}.jsonl:3"]}},
        "tail": {"pieces": 30, "tokens": 20_000},
        "documents": 1000,
        "input_bytes": 256 << 20,
        "seconds": {"pack": 1.0},
    }


def _synthetic_tails(work: Path, partitions: int, max_len: int) -> int:
    """Write `partitions` tails as partition workers would; return their tokens."""
    import numpy as np
    import pyarrow as pa

    from packtool.engines import records
    from packtool.pack.chunk import PackConfig, pack_table
    from packtool.pack.tail import TailPolicy

    rng = np.random.default_rng(0)
    config = PackConfig(max_len=max_len)
    tokens = 0
    for p in range(partitions):
        lengths = np.clip(rng.lognormal(5.0, 0.9, 2000).astype(np.int64), 2, 3 * max_len)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        ids = pa.array(rng.integers(0, 256, int(offsets[-1])).astype(np.uint16))
        table = pa.table(
            {
                "doc_id": pa.array(np.arange(len(lengths)) + (p << 20), pa.int64()),
                "source": pa.array([f"f{p}.jsonl"] * len(lengths)),
                "input_ids": pa.ListArray.from_arrays(pa.array(offsets), ids),
                "length": pa.array(lengths.astype(np.int32)),
            }
        )
        tail = pack_table(table, config, chunk_index=(p, 0), tail=TailPolicy()).tail
        records.write_tail(work, p, tail)
        tokens += int(np.sum(tail.column("length")))
    return tokens


def _merge_context(work: Path, max_len: int):
    from packtool.dataset.shards import ShardConfig
    from packtool.dataset.tokenized import tokenized_schema
    from packtool.engines.context import WorkerContext
    from packtool.pack.chunk import PackConfig
    from packtool.read.documents import ReadConfig
    from packtool.tokenize.tables import RAW, Source
    from packtool.tokenizer.tokenizers import load_tokenizer

    identity = load_tokenizer("byte").identity
    source = Source(
        mode=RAW, read=ReadConfig(), schema=tokenized_schema(identity), identity=identity
    )
    return WorkerContext(
        source=source,
        pack=PackConfig(max_len=max_len),
        shards=ShardConfig(),
        chunk_docs=100_000,
        work=str(work),
    )


def _run_tree(work: Path, partitions: int, fan_in: int | None, workers: int, max_len: int):
    """The tail tree's waves on `workers` processes, then the root here: (waves s, root s,
    root input tokens, sha256 of every shard in id order)."""
    from concurrent.futures import ProcessPoolExecutor

    from packtool.engines import finish, merge, records, worker

    ctx = _merge_context(work, max_len)
    tree = merge.TailTree(partitions, fan_in)
    for p in records.finished(work):  # a previous tree's records and shards
        for shard in records.read_record(work, p)["shards"]:
            (work / shard["file"]).unlink()
        records.record_path(work, p).unlink()
    for u in range(partitions, tree.root + 1):
        records.tail_path(work, u).unlink(missing_ok=True)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(workers) as pool:
        for level in range(1, tree.levels + 1):
            descriptors = [tree.descriptor(u) for u in tree.level_ids(level)]
            list(pool.map(worker.run_partition, [ctx] * len(descriptors), descriptors))
    t_waves = time.perf_counter() - t0
    root_in = sum(
        int(records.read_tail(path).column("length").to_numpy().sum())
        for path in map(lambda u: records.tail_path(work, u), tree.children(tree.root))
        if path.exists()
    )
    t0 = time.perf_counter()
    finish.final_stage(ctx, tree)
    t_root = time.perf_counter() - t0
    shas = [
        s["sha256"]
        for u in range(partitions, tree.root + 1)
        for s in records.read_record(work, u)["shards"]
    ]
    return t_waves, t_root, root_in, shas, tree


def tail_tree(counts=(256, 1024), max_len: int = 2048) -> str:
    """The tail stage on synthetic tails (see the module docstring, item 5)."""
    from packtool.engines import merge

    rows = []
    for n in counts:
        work = Path(tempfile.mkdtemp(dir=DATA, prefix="tails-"))
        try:
            tokens = _synthetic_tails(work, n, max_len)
            _, t_flat, flat_in, _, _ = _run_tree(work, n, None, 1, max_len)
            got = {w: _run_tree(work, n, merge.TAIL_FAN_IN, w, max_len) for w in (1, 2)}
            assert got[1][3] == got[2][3], "1 and 2 workers wrote different shards"
            tree = got[1][4]
            bound = merge.TAIL_FAN_IN * 32 * max_len
            rows.append(
                [
                    f"{n:,}",
                    f"{tokens / 1e6:.1f}",
                    f"{t_flat:.1f}",
                    " -> ".join(f"{k:,}" for k in (*tree.sizes[1:], 1)),
                    f"{got[1][0]:.1f} ({got[1][0] / (tree.root - n):.2f} per node)",
                    f"{got[2][0]:.1f}",
                    f"{got[1][1]:.2f}",
                    f"{got[1][2] / 1e6:.2f} (bound {bound / 1e6:.2f})",
                ]
            )
            assert flat_in == tokens and got[1][2] <= bound
        finally:
            shutil.rmtree(work)
    return markdown_table(
        [
            "partitions",
            "tail M tokens",
            "flat final stage s (one process, before the tree)",
            "tree nodes per level",
            "merge waves s, 1 worker",
            "2 workers",
            "root s (driver)",
            "root input M tokens",
        ],
        rows,
    )


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reading(corpus: Path, gpt2: str | None, gpt2_docs: int) -> tuple[str, dict]:
    rows = []
    rates = {}
    size = corpus.stat().st_size
    for workers, pool in ((1, "process"), (2, "process"), (2, "thread")):
        seconds, s = pack(
            corpus,
            *("--partition-size", "32MB", "--workers", str(workers)),
            env={"PACKTOOL_WORKER_POOL": pool},
        )
        rates[f"byte x{workers} {pool}"] = size / seconds / 1e6
        rows.append(
            [
                f"byte, {workers} partition worker(s)" + (", threads" if pool == "thread" else ""),
                *_rates(size, seconds, s),
                s["cores_used"],
            ]
        )
    if gpt2 is not None:
        small = head(corpus, gpt2_docs)
        size = small.stat().st_size
        for label, prefix, env, workers in (
            ("GPT-2 BPE, 1 core", ["taskset", "-c", "0"], ONE_THREAD, 1),
            ("GPT-2 BPE, 2 partition workers", [], {}, 2),
        ):
            args = ["--tokenizer", gpt2, "--partition-size", "16MB", "--workers", str(workers)]
            seconds, s = pack(small, *args, env=env, prefix=prefix)
            rates[label] = s["counts"]["tokens_in"] / s["seconds"]["total"] / 1e6
            rows.append([label, *_rates(size, seconds, s), s["cores_used"]])
    headers = ["run", "input MB", "wall s", "in-run s", "MB/s (wall)"]
    headers += ["M tokens/s (wall)", "M tokens/s (in run)", "what ran"]
    table = markdown_table(headers, rows)
    return table, rates


def _rates(size: int, seconds: float, s: dict) -> list[str]:
    """Wall time includes the interpreter start and imports; in-run is the summary's total."""
    run = s["seconds"]["total"]
    tokens = s["counts"]["tokens_in"]
    return [
        f"{size / 1e6:.0f}",
        f"{seconds:.1f}",
        f"{run:.1f}",
        f"{size / seconds / 1e6:.1f}",
        f"{tokens / seconds / 1e6:.2f}",
        f"{tokens / run / 1e6:.2f}",
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=1_000_000)
    ap.add_argument("--gpt2-docs", type=int, default=400_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument(
        "--quick", action="store_true", help="fewer runs (no docs/benchmarks.md update)"
    )
    ap.add_argument("--no-gpt2", action="store_true")
    ap.add_argument("--only-tail", action="store_true", help="the tail tree alone, printed")
    args = ap.parse_args()
    compile_sources()  # packtool's processes start from bytecode, as installed
    OUT.mkdir(parents=True, exist_ok=True)
    before = load()
    if args.only_tail:
        table = tail_tree((256,) if args.quick else (256, 1024))
        print(f"load average {before:.1f} before, {load():.1f} after\n\n{table}")
        return
    corpus = make_corpus(args.docs)
    print(f"corpus {corpus} ({corpus.stat().st_size / 1e6:.0f} MB)", file=sys.stderr)
    chunks, ratio = chunk_table(corpus, args.docs, args.quick, args.repeat)
    print(chunks, f"\nratio {ratio:.2f}", file=sys.stderr)
    book = bookkeeping((1_000, 10_000) if args.quick else (1_000, 10_000, 100_000))
    print(book, file=sys.stderr)
    gpt2 = None
    if not args.no_gpt2:
        from benchmarks.bench_tokenize import gpt2_ranks

        gpt2 = f"tiktoken:{gpt2_ranks()}"
    read, rates = reading(corpus, gpt2, args.gpt2_docs)
    print(read, file=sys.stderr)
    tails = tail_tree()
    print(tails, file=sys.stderr)
    after = load()
    per_core = rates.get("GPT-2 BPE, 1 core")
    paper = ""
    if per_core:
        cluster = per_core * 64 * 32
        paper = (
            f"- On paper, 64 nodes x 32 cores: 2,048 partition workers x {per_core:.2f} M tokens/s (the 1-core in-run rate) "
            f"= **{cluster:,.0f} M tokens/s** (~{cluster * 4 / 1e3:.1f} GB/s of JSONL at ~4 bytes "
            "a token), no sequential stage left on the corpus bytes: the driver stats every "
            "file and, on a fresh run (not on --resume), reads one small piece of each (a "
            "Parquet footer, a first record) to check the inputs, one file after another: "
            "~10^5 Parquet inputs make that a sequential step of minutes. Each worker reads its "
            "own byte ranges from the shared file system. What limits it then: the file "
            "system's aggregate read + "
            "write bandwidth (the input once, the shards once); per partition the driver "
            "spends the read + add time above (100k partitions, i.e. 25 TB at 256 MB, ~"
            "minutes in all, overlapped with the work); and what follows the last "
            "partition: the tail tree (at most 32 rows x max_len tokens of tail a partition: "
            "~65k tokens, 1.3 G at 20k partitions) packed by merge nodes of at most 64 "
            "children in ~log_64(partitions) waves as parallel as the partitions (20k: 313 "
            "nodes, then 5, then the root), the root in the driver (at most 64 x 32 rows), "
            "and index.json streamed from the records (µs per record above)."
        )
    when = time.strftime("%Y-%m-%d")
    body = f"""`python -m benchmarks.bench_scale` ({when}; 2-core box shared with other work, load average (1 min) {before:.1f} before, {after:.1f} after). Byte tokenizer unless said, max_len 2048, local engine, every run a separate `packtool pack` process timed from outside (interpreter start included).

**Chunk size** ({args.docs:,} synthetic documents, {corpus.stat().st_size / 1e6:.0f} MB of JSONL, one partition of the default 256 MB): at `--chunk-docs 1,000` the run takes **{ratio:.2f}x** the wall time at 100,000 (best of {args.repeat}, alternating) (before #13: 7.3x, 77.0 s against 10.5 s, since every chunk rewrote the whole state file). Time grows linearly with the documents:

{chunks}

**Bookkeeping** fed synthetic partition records (~2 KB each; 3 shards, a 120-length histogram, skip examples): constant time per record and flat memory, whatever the number of records (the driver keeps running sums; `index.json` is streamed, one record file read at a time):

{book}

**Reading rate** with 1 and 2 partition workers (byte: {corpus.stat().st_size / 1e6:.0f} MB in 32 MB partitions; 2 workers as processes, the default, and as threads of one process, `PACKTOOL_WORKER_POOL=thread`), and a partition worker's per-core rate with GPT-2 BPE (first {args.gpt2_docs:,} documents, 16 MB partitions; `taskset -c 0`, one tokenizer thread). *In run*: the run's own total from its summary, without the interpreter start and imports (~1 s) that *wall* includes:

{read}

**Tail tree** (packtool/engines/merge.py) on synthetic partition tails (each what `pack_table` sets aside from 2,000 log-normal documents, max_len 2048): the merge nodes' waves on 1 and 2 worker processes (the same shards), the root in the driver, against the flat final stage before the tree (every tail in one process: it grows with the partitions; a node's and the root's input do not):

{tails}

{paper}
"""
    print(body)
    if not args.quick:
        update_block("scale", body)


if __name__ == "__main__":
    main()
