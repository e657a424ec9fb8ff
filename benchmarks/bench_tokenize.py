"""Tokenize throughput per engine against each engine's library, and peak RSS as corpora grow.

Run from the repository root: `python -m benchmarks.bench_tokenize [--quick]` (about 3 minutes on
2 cores).

Throughput (tokens/s, all cores, same texts, same threads, measured in this run), on real text
made at bench time (benchmarks/real_corpus.py: man page sources first), one row per engine that
loads each tokenizer (`--tokenizer-engine` forced):
- library: the engine's own batch call on the whole list of texts, ids in hand —
  `Tokenizer.encode_batch_flat(texts)` (fastokens: one flat buffer),
  `[e.ids for e in Tokenizer.encode_batch_fast(texts)]` (Hugging Face `tokenizers`),
  `Encoding.encode_ordinary_batch(texts, num_threads=N)` (tiktoken), and for `byte` (no library)
  the least work that gives the ids: all texts' UTF-8 bytes joined and widened to uint16.
- packtool encode: `Tokenizer.encode_batch` over the batches the reader makes (flat ids + EOS).
- packtool tokenize: `tokenize_corpus`, JSONL file in -> tokenized Parquet out (reading, JSON
  parsing, EOS, Arrow, zstd Parquet writing included).

GPT-2 tokenizers: the real GPT-2 ranks file `gpt2.tiktoken`, fetched from the `openai-whisper`
sdist on PyPI (`pip download --no-deps openai-whisper`) into bench_data/ (git-ignored), loaded
offline with GPT-2's split pattern; two Hugging Face `tokenizer.json` files with the same ids
(checked here): GPT-2's own, as the hub serves it (`gpt2_hub_tokenizer_json`: its vocab.json and
50,000 merges, a `ByteLevel` pre-tokenizer), and one converted from the ranks with
`transformers`' `TikTokenConverter` (108,299 merges, GPT-2's regex as a `Split` before
`ByteLevel(use_regex=False)`: the shape of Llama 3 / Qwen style tokenizer.json files).

Peak RSS: `packtool tokenize` and `packtool stats` run as child processes on sample_data and on
corpora 10x and 30x larger (sample_data repeated, in bench_data/); each child's own peak, read by
a small parent process (`getrusage(RUSAGE_CHILDREN)`).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path

WORKERS = len(os.sched_getaffinity(0))
os.environ.setdefault("RAYON_NUM_THREADS", str(WORKERS))  # HF tokenizers' thread pool
os.environ.setdefault("PACKTOOL_NO_PROGRESS", "1")

import numpy as np  # noqa: E402

from benchmarks import real_corpus  # noqa: E402
from benchmarks._common import ROOT, best_of, compile_sources, markdown_table, update_block  # noqa: E402
from packtool.read.corpus import read_corpus  # noqa: E402
from packtool.read.documents import ReadConfig  # noqa: E402
from packtool.tokenize.tokenize import tokenize_corpus  # noqa: E402
from packtool.tokenizer.tokenizers import GPT2_PATTERN, Tokenizer, load_tokenizer  # noqa: E402

DATA = ROOT / "bench_data"
SAMPLE = ROOT / "sample_data" / "corpus.jsonl"
TARGET = 0.85


def gpt2_ranks() -> Path:
    """bench_data/gpt2.tiktoken, fetched from the openai-whisper sdist when absent."""
    path = DATA / "gpt2.tiktoken"
    if path.exists():
        return path
    DATA.mkdir(exist_ok=True)
    sdists = sorted(DATA.glob("openai_whisper-*.tar.gz"))
    if not sdists:
        print("fetching gpt2.tiktoken: pip download --no-deps openai-whisper", file=sys.stderr)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             "openai-whisper", "-d", str(DATA)],
            check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        sdists = sorted(DATA.glob("openai_whisper-*.tar.gz"))
    with tarfile.open(sdists[-1]) as tar:
        member = next(
            m for m in tar.getmembers() if m.name.endswith("whisper/assets/gpt2.tiktoken")
        )
        data = tar.extractfile(member).read()  # type: ignore[union-attr]
    path.write_bytes(data)
    return path


WHISPER_WITH_GPT2_FILES = (
    "https://files.pythonhosted.org/packages/00/c6/"
    "fb251c4f7de1c78753a2d54d6aaf1a859ddc3797ed4d6003f15866f4c4a4/openai-whisper-20230124.tar.gz",
    "31adf9353bf0e3f891b6618896f22c65cf78cd6f845a4d5b7125aa5102187f79",
)
"""The last openai-whisper sdist that bundled GPT-2's own `vocab.json` and `merges.txt` (the
files of the Hugging Face repository `gpt2`), and its sha256. pip cannot download it (its
setup.py needs `pkg_resources`), so it is fetched from PyPI's file host directly."""


def gpt2_hub_tokenizer_json() -> Path:
    """GPT-2's own tokenizer.json, as the Hugging Face hub serves it for `gpt2`: its vocab.json
    and 50,000 merges, a `ByteLevel` pre-tokenizer, decoder and post-processor and the added
    `<|endoftext|>` (id 50256), assembled with `tokenizers` (bench_data/, git-ignored).

    The converted file (`gpt2_tokenizer_json`) encodes the same ids but holds 108,299 merges
    (every split of every token) and a `Split` + `ByteLevel(use_regex=False)` pre-tokenizer:
    ~0.11 s more to build in fastokens, ~0.05 s more in `tokenizers`.
    """
    path = DATA / "gpt2-hub-tokenizer.json"
    if path.exists():
        return path
    files = {name: DATA / f"gpt2-{name}" for name in ("vocab.json", "merges.txt")}
    if not all(f.exists() for f in files.values()):
        _fetch_gpt2_files(files)
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HFTokenizer

    tok = HFTokenizer(models.BPE.from_file(str(files["vocab.json"]), str(files["merges.txt"])))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    if tok.token_to_id("<|endoftext|>") != 50256 or tok.get_vocab_size() != 50257:
        raise SystemExit("GPT-2's files did not give its 50,257 ids")
    tok.save(str(path))
    return path


def _fetch_gpt2_files(files: dict[str, Path]) -> None:
    """GPT-2's vocab.json and merges.txt from the openai-whisper sdist that bundled them."""
    import hashlib
    import io
    import urllib.request

    url, sha256 = WHISPER_WITH_GPT2_FILES
    print(f"fetching GPT-2's vocab.json and merges.txt: {url.rsplit('/', 1)[1]}", file=sys.stderr)
    try:
        data = urllib.request.urlopen(url, timeout=120).read()
    except OSError as exc:  # URLError, timeouts: no route to PyPI's file host
        raise SystemExit(
            f"cannot fetch {url}: {exc}; put GPT-2's vocab.json and merges.txt at "
            f"{files['vocab.json']} and {files['merges.txt']}, or use the converted "
            "tokenizer.json (bench_e2e --shapes split-regex)"
        ) from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise SystemExit(f"{url}: sha256 differs from the release's")
    DATA.mkdir(exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for name, path in files.items():
            member = next(m for m in tar.getmembers() if m.name.endswith(f"assets/gpt2/{name}"))
            path.write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]


def gpt2_tokenizer_json(ranks: Path) -> Path:
    """A Hugging Face tokenizer.json converted from the GPT-2 ranks (same ids as tiktoken)."""
    path = DATA / "gpt2-tokenizer.json"
    if not path.exists():
        from transformers.convert_slow_tokenizer import TikTokenConverter

        tok = TikTokenConverter(vocab_file=str(ranks), pattern=GPT2_PATTERN).converted()
        tok.add_special_tokens(["<|endoftext|>"])  # id 50256, as in GPT-2
        tok.save(str(path))
    return path


def repeated_corpus(times: int) -> Path:
    path = DATA / f"corpus_x{times}.jsonl"
    if not path.exists() or path.stat().st_size != SAMPLE.stat().st_size * times:
        data = SAMPLE.read_bytes()
        with open(path, "wb") as f:
            for _ in range(times):
                f.write(data)
    return path


def library_call(tok: Tokenizer) -> Callable[[list[str]], object]:
    """The batch call of the library that encodes for `tok` (its engine), giving the ids."""
    engine = tok.identity.engine
    if engine == "gigatoken":
        lib = tok.encoder.tok
        return lambda texts: lib.encode_batch(texts, parallel=WORKERS > 1)
    if engine == "sentencepiece":
        sp = tok.encoder.sp
        return lambda texts: sp.encode(texts, out_type=int, num_threads=WORKERS)
    if engine == "fastokens":
        lib, split_special = tok.encoder.tok, tok.identity.kind == "tiktoken"
        return lambda texts: lib.encode_batch_flat(texts, split_special_tokens=split_special)
    if engine == "tokenizers":
        lib = tok.encoder.tok
        return lambda texts: [e.ids for e in lib.encode_batch_fast(texts, add_special_tokens=False)]
    if engine == "tiktoken":
        enc = tok.encoder.enc
        return lambda texts: enc.encode_ordinary_batch(texts, num_threads=WORKERS)
    # byte: no library; the least work that gives the ids (UTF-8 bytes widened, no EOS).
    return lambda texts: np.frombuffer(
        b"".join([t.encode("utf-8") for t in texts]), np.uint8
    ).astype(np.uint16)


def best_interleaved(runs: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Best wall time of each run, timed interleaved (a, b, c, a, b, c, ...).

    Load from other processes on a shared machine then falls on all runs alike.
    """
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeat):
        for key, fn in runs.items():
            best[key] = min(best[key], best_of(fn, 1))
    return best


def measure(
    spec: str, engine: str, corpus: Path, batches: list[list[str]], repeat: int
) -> dict[str, float]:
    """Seconds for the library call, packtool's encode_batch and tokenize_corpus; and tokens."""
    tok = load_tokenizer(spec, workers=WORKERS, engine=engine)
    lib = library_call(tok)
    texts = [t for b in batches for t in b]
    out = DATA / "bench-out.parquet"
    # `byte` in memory takes milliseconds: time 10 passes so timer noise does not decide.
    loops = 10 if tok.identity.kind == "byte" else 1
    best = best_interleaved(
        {
            "lib": lambda: [lib(texts) for _ in range(loops)],
            "enc": lambda: [tok.encode_batch(b) for _ in range(loops) for b in batches],
            "e2e": lambda: tokenize_corpus(
                [corpus], out, tokenizer=tok, workers=WORKERS, overwrite=True, progress=False
            ),
        },
        repeat,
    )
    best["lib"] /= loops
    best["enc"] /= loops
    best["tokens"] = float(sum(int(tok.encode_batch(b)[1].sum()) for b in batches))
    best["mb_per_s"] = corpus.stat().st_size / 1e6 / best["e2e"]
    return best


def throughput(repeat: int, mb: int) -> tuple[list[list[object]], dict[str, float], float, Path]:
    """Rows of the throughput table, the ratios by (spec, engine, kind), byte MB/s, the corpus."""
    corpus = DATA / f"real_corpus_{mb}mb.jsonl"
    real_corpus.build(corpus, mb * 1_000_000)
    batches = [b.texts for b in read_corpus([corpus], ReadConfig())]
    ranks = gpt2_ranks()
    hf_json = gpt2_tokenizer_json(ranks)
    # Both GPT-2 tokenizers must give the same ids, or the conversion is wrong.
    a = load_tokenizer(f"tiktoken:{ranks}", engine="tiktoken")
    b = load_tokenizer(str(hf_json), engine="tokenizers")
    if not np.array_equal(a.encode_batch(batches[0])[0], b.encode_batch(batches[0])[0]):
        raise SystemExit("HF and tiktoken GPT-2 ids differ; the tokenizer.json conversion is wrong")
    hub_json = gpt2_hub_tokenizer_json()
    c = load_tokenizer(str(hub_json), engine="tokenizers")
    if not np.array_equal(a.encode_batch(batches[0])[0], c.encode_batch(batches[0])[0]):
        raise SystemExit("GPT-2's own tokenizer.json and the ranks give different ids")
    hub, converted = "GPT-2 tokenizer.json (hub)", "GPT-2 tokenizer.json (converted: Split regex)"
    from benchmarks.bench_e2e import _mistral_json, _mistral_model_file

    metaspace, model = "Mistral v1 tokenizer.json (Metaspace form)", "Mistral v1 tokenizer.model"
    specs = [
        ("byte", "byte", "auto"),
        ("GPT-2 ranks file", f"tiktoken:{ranks}", "gigatoken"),
        ("GPT-2 ranks file", f"tiktoken:{ranks}", "fastokens"),
        ("GPT-2 ranks file", f"tiktoken:{ranks}", "tiktoken"),
        (hub, str(hub_json), "gigatoken"),
        (hub, str(hub_json), "fastokens"),
        (hub, str(hub_json), "tokenizers"),
        (converted, str(hf_json), "gigatoken"),
        (converted, str(hf_json), "fastokens"),
        (converted, str(hf_json), "tokenizers"),
        (metaspace, str(_mistral_json("metaspace")), "gigatoken"),
        (metaspace, str(_mistral_json("metaspace")), "tokenizers"),
        (model, str(_mistral_model_file()), "gigatoken"),
        (model, str(_mistral_model_file()), "sentencepiece"),
    ]
    rows, ratios = [], {}
    for label, spec, engine in specs:
        m = measure(spec, engine, corpus, batches, repeat)
        tokens = m["tokens"]
        lib_tps, enc_tps, e2e_tps = tokens / m["lib"], tokens / m["enc"], tokens / m["e2e"]
        ratios[f"{label}, {engine}, encode"] = enc_tps / lib_tps
        ratios[f"{label}, {engine}, e2e"] = e2e_tps / lib_tps
        if spec == "byte":
            byte_mb_per_s = m["mb_per_s"]
        rows.append(
            [
                label,
                "byte" if spec == "byte" else engine,
                f"{tokens / 1e6:.2f}M",
                f"{lib_tps / 1e6:.2f}M",
                f"{enc_tps / 1e6:.2f}M ({enc_tps / lib_tps:.2f}x)",
                f"{e2e_tps / 1e6:.2f}M ({e2e_tps / lib_tps:.2f}x)",
            ]
        )
        print(markdown_table(HEADERS, rows[-1:]).splitlines()[-1], flush=True)
    return rows, ratios, byte_mb_per_s, corpus


HEADERS = [
    "tokenizer",
    "engine",
    "tokens",
    "library tokens/s",
    "packtool encode_batch tokens/s (vs library)",
    "packtool tokenize JSONL->Parquet tokens/s (vs library)",
]


# A small parent that runs the command and reports its child's peak: measuring from this
# (large) process would count the pages the child inherits from it before exec.
_PEAK = (
    "import resource, subprocess, sys, time; t = time.perf_counter(); "
    "r = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE); "
    "s = time.perf_counter() - t; "
    "sys.exit(r.stderr.decode()) if r.returncode else "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, s)"
)


def child_peak(cmd: list[str]) -> tuple[float, float]:
    """Run `cmd`; return (its peak RSS in MiB, wall seconds)."""
    proc = subprocess.run(
        [sys.executable, "-c", _PEAK, *cmd], cwd=ROOT, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {proc.stderr.strip()}")
    rss, seconds = proc.stdout.split()
    return float(rss), float(seconds)


def memory(scales: list[int]) -> list[list[object]]:
    cli = [sys.executable, "-m", "packtool.cli"]
    corpora = [SAMPLE, *(repeated_corpus(n) for n in scales)]
    commands = {
        "python -c 'import packtool.tokenize.tokenize' (floor)": lambda _: [
            sys.executable, "-c", "import packtool.tokenize.tokenize, packtool.cli.commands"
        ],
        "packtool tokenize": lambda c: [
            *cli, "tokenize", str(c), "-o", str(DATA / "rss-out.parquet"), "--overwrite"
        ],
    }  # fmt: skip
    help_text = subprocess.run([*cli, "--help"], capture_output=True, text=True, cwd=ROOT).stdout
    if "stats" in help_text.split("Commands:")[-1]:
        commands["packtool stats"] = lambda c: [*cli, "stats", str(c), "--json"]
    rows = []
    for name, make in commands.items():
        for corpus in corpora:
            rss, seconds = child_peak(make(corpus))
            size = corpus.stat().st_size / 1e6
            rows.append(
                [name, corpus.relative_to(ROOT), f"{size:.0f} MB", f"{rss:.0f}", f"{seconds:.1f}"]
            )
            print(" | ".join(map(str, rows[-1])), flush=True)
            if name.endswith("(floor)"):
                break
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5, help="timings per figure; the best counts")
    ap.add_argument("--mb", type=int, default=30, help="MB of real text for throughput")
    ap.add_argument(
        "--scales", default="10,30", help="sizes of the larger RSS corpora (x sample_data)"
    )
    ap.add_argument("--quick", action="store_true", help="8 MB, one timing, one RSS scale")
    ap.add_argument(
        "--no-readme", action="store_true", help="print only, leave docs/benchmarks.md alone"
    )
    args = ap.parse_args()
    compile_sources()  # packtool's processes start from bytecode, as installed
    if args.quick:
        args.repeat, args.mb, args.scales = 1, 8, "3"

    load_before = os.getloadavg()[0]
    print(f"throughput, {WORKERS} cores, best of {args.repeat}:", flush=True)
    rows, ratios, byte_mb_per_s, corpus = throughput(args.repeat, args.mb)
    table = markdown_table(HEADERS, rows)
    print("\npeak RSS (MiB) of child processes:", flush=True)
    mem = memory([int(x) for x in args.scales.split(",")])
    mem_table = markdown_table(["command", "corpus", "size", "peak RSS MiB", "seconds"], mem)
    bpe = {k: v for k, v in ratios.items() if k.startswith("GPT-2")}
    enc_min = min(v for k, v in bpe.items() if k.endswith("encode"))
    met = "met" if enc_min >= TARGET else "missed"
    e2e = "; ".join(f"{k.removesuffix(', e2e')} {v:.2f}x" for k, v in bpe.items() if k.endswith("e2e"))  # fmt: skip
    speedups = (
        "; ".join(
            f"{label}: " + ", ".join(f"{e} {x:.1f}x" for e, x in by_engine.items())
            for label, by_engine in _engine_speedups(rows).items()
        )
        + " (library tokens/s over the reference library's)"
    )
    body = (
        f"Tokenize throughput on {WORKERS} cores (`python -m benchmarks.bench_tokenize`, "
        f"{time.strftime('%Y-%m-%d')}; {corpus.stat().st_size / 1e6:.0f} MB of real text made at "
        "bench time by benchmarks/real_corpus.py (man page sources; never repeated text, which "
        f"would flatter caching engines), best of {args.repeat}, interleaved; load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after). One row per engine that "
        "loads the tokenizer; the library column is that engine's own batch call on the same "
        "texts in memory with the same threads (gigatoken `encode_batch`, fastokens "
        "`encode_batch_flat`, tiktoken `encode_ordinary_batch`, tokenizers `encode_batch_fast`, "
        "sentencepiece `encode(num_threads=)`). Engines: {speedups}. "
        f"packtool's `encode_batch` (flat ids + EOS) is at least {enc_min:.2f}x its library "
        f"(target {TARGET:.2f}x: {met}). End to end JSONL -> Parquet against the library alone "
        f"(reading, JSON, Arrow, zstd Parquet included): {e2e}. `byte` has no library: its "
        "column is UTF-8 encode + widen to uint16 (packtool also inserts EOS: "
        f"{ratios['byte, auto, encode']:.2f}x); end to end it is bound by JSON parsing and "
        f"Parquet writing, {byte_mb_per_s:.0f} MB/s of JSONL.\n\n"
        f"{table}\n\nPeak RSS of each command (a child process) as the corpus grows:\n\n"
        f"{mem_table}"
    ).replace("{speedups}", speedups)
    print("\n" + body)
    if not args.no_readme and not args.quick:
        update_block("tokenize", body)
        print("\ndocs/benchmarks.md block `tokenize` updated.")


def _engine_speedups(rows: list[list[object]]) -> dict[str, dict[str, float]]:
    """Per tokenizer, per fast engine: its library tokens/s over the reference library's."""
    speed = {(r[0], r[1]): float(str(r[3]).rstrip("M")) for r in rows}
    references = ("tiktoken", "tokenizers", "sentencepiece")
    out: dict[str, dict[str, float]] = {}
    for (label, engine), tps in speed.items():
        ref = next((speed[(label, r)] for r in references if (label, r) in speed), None)
        if engine not in (*references, "byte") and ref:
            out.setdefault(str(label), {})[str(engine)] = tps / ref
    return out


if __name__ == "__main__":
    main()
