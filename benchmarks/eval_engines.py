"""Which fast tokenizer engine to use: ids, speed, refusals, licence, offline behaviour.

Run from the repository root: `python -m benchmarks.eval_engines [--quick]` (a few minutes on
2 cores). It `pip install`s the candidates it lacks (fastokens, riptoken, wordchipper) and prints
the markdown table docs/tokenize.md keeps ("Choosing the engine"). All on GPT-2 BPE (the real
ranks, bench_tokenize's gpt2.tiktoken, and the tokenizer.json converted from it):

- ids: every document of the Python standard library's `.py` sources plus hypothesis-generated
  text (unicode categories, whitespace and digit runs, special-token look-alikes), against
  `tokenizers` (tokenizer.json) and tiktoken `encode_ordinary` (ranks file);
- speed: tokens/s of each engine's own batch call on 2 threads over real text found on this
  machine (benchmarks/real_corpus.py: man pages, else stdlib sources), interleaved, best of 3;
- refusals: which tokenizer.json shapes (built here with the tokenizers trainer) each loads;
- licence: the installed package's metadata (or its licence file);
- offline: whether loading and encoding opens a network connection (`strace -e connect`).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import importlib.metadata as md
import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "2")
os.environ.setdefault("FASTOKENS_BPE_THREADS", "2")

import numpy as np  # noqa: E402

from benchmarks import real_corpus  # noqa: E402
from benchmarks._common import ROOT, markdown_table  # noqa: E402
from benchmarks.bench_tokenize import gpt2_ranks, gpt2_tokenizer_json  # noqa: E402
from packtool.tokenizer.tokenizers import GPT2_PATTERN  # noqa: E402

CANDIDATES = ("fastokens", "riptoken", "wordchipper")
DATA = ROOT / "bench_data"


def ensure_installed() -> None:
    missing = [c for c in CANDIDATES if not _installed(c)]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", *missing], check=True)


def _installed(name: str) -> bool:
    try:
        md.version(name)
    except md.PackageNotFoundError:
        return False
    return True


def licence(name: str) -> str:
    meta = md.metadata(name)
    text = meta.get("License-Expression") or meta.get("License") or ""
    if not text:
        files = [f for f in md.files(name) or [] if "LICENSE" in f.name.upper()]
        head = files[0].read_text()[:200] if files else ""
        text = "Apache-2.0 (licence file)" if "Apache License" in head else "see licence file"
    return text


def stdlib_texts() -> list[str]:
    std = sysconfig.get_paths()["stdlib"]
    out = []
    for f in sorted(glob.glob(std + "/**/*.py", recursive=True)):
        if "site-packages" in f:
            continue
        with contextlib.suppress(OSError, UnicodeDecodeError):
            out.append(Path(f).read_text(encoding="utf-8"))
    return out


def hypothesis_texts(n: int) -> list[str]:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    runs = st.sampled_from([" ", "\t", "\n", "0", "9", "\u3000", "<|endoftext|>", "<|"]).flatmap(
        lambda c: st.integers(1, 400).map(lambda k: c * k)
    )
    piece = st.one_of(st.text(max_size=40), runs, st.sampled_from(["<|endoftext|>", "<|end", "'s", "'LL"]))  # fmt: skip
    out: list[str] = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None)
    @given(st.lists(piece, max_size=12).map("".join))
    def collect(text: str) -> None:
        out.append(text)

    collect()
    return [t.encode("utf-8", "replace").decode("utf-8") for t in out]  # no lone surrogates


def engines(json_path: Path, ranks_path: Path) -> dict[str, tuple[str, object]]:
    """name -> (reference it must match, batch encode returning per-document id lists)."""
    import fastokens
    import riptoken
    import tiktoken
    import tokenizers
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(ranks_path))
    sp = {"<|endoftext|>": 50256}
    hf = tokenizers.Tokenizer.from_file(str(json_path))
    tt = tiktoken.Encoding("gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=sp)
    ft_json = fastokens.Tokenizer.from_file(str(json_path))
    ft_tt = fastokens.Tokenizer.from_tiktoken(str(ranks_path), pattern=GPT2_PATTERN, special_tokens=sp)  # fmt: skip
    rip = riptoken.CoreBPE(ranks, sp, GPT2_PATTERN)

    def flat_lists(raw: tuple[bytes, bytes]) -> list[list[int]]:
        ids, offs = np.frombuffer(raw[0], np.uint32), np.frombuffer(raw[1], np.uint64)
        return [ids[a:b].tolist() for a, b in zip(offs[:-1], offs[1:], strict=True)]

    out = {
        "tokenizers (reference, tokenizer.json)": (
            "tokenizers",
            lambda t: [e.ids for e in hf.encode_batch_fast(t, add_special_tokens=False)],
        ),  # fmt: skip
        "tiktoken (reference, ranks file)": (
            "tiktoken",
            lambda t: tt.encode_ordinary_batch(t, num_threads=2),
        ),  # fmt: skip
        "fastokens, tokenizer.json": (
            "tokenizers",
            lambda t: flat_lists(ft_json.encode_batch_flat(t)),
        ),  # fmt: skip
        "fastokens, ranks file": (
            "tiktoken",
            lambda t: flat_lists(ft_tt.encode_batch_flat(t, split_special_tokens=True)),
        ),  # fmt: skip
        "riptoken, ranks file": ("tiktoken", lambda t: rip.encode_ordinary_batch(t)),
    }
    wc = wordchipper_encoder(ranks_path)
    if wc is not None:
        out["wordchipper, r50k_base (cache seeded by hand)"] = ("tiktoken", wc)
    return out


def wordchipper_encoder(ranks_path: Path) -> Callable[[list[str]], list[list[int]]] | None:
    """wordchipper loads only its built-in OpenAI vocabularies, by name, from its own cache (or
    the network); offline, seed the cache with the same GPT-2 ranks (r50k_base, sha256 checked
    by wordchipper) so its ids and speed can be measured at all."""
    import shutil

    import wordchipper

    cache = Path.home() / ".cache" / "io.crates.wordchipper" / "openai" / "r50k_base"
    seeded = cache / "r50k_base.tiktoken"
    made = not seeded.exists()
    cache.mkdir(parents=True, exist_ok=True)
    shutil.copy(ranks_path, seeded)
    try:
        tok = wordchipper.Tokenizer.from_pretrained("openai:r50k_base")
    finally:
        if made:
            shutil.rmtree(cache.parents[1], ignore_errors=True)
    if tok.vocab_size <= 256:
        return None
    plain = wordchipper.SpecialFilter.include_none()  # as encode_ordinary: specials are text
    return lambda texts: tok.encode_batch(texts, special_filter=plain)


OFFLINE_PROBE = {
    "fastokens": "import fastokens as f; t=f.Tokenizer.from_file({json!r}); t.encode_batch_flat(['hi there'])",  # fmt: skip
    "riptoken": "import riptoken as r; e=r.CoreBPE(r.load_tiktoken_bpe({ranks!r}), {{}}, r'\\w+|\\s+'); e.encode_ordinary('hi')",  # fmt: skip
    "wordchipper": "import wordchipper as w; t=w.Tokenizer.from_pretrained('openai:r50k_base'); print(t.vocab_size, t.encode('hello world'))",  # fmt: skip
}


def offline(name: str, json_path: Path, ranks_path: Path) -> str:
    """What loading + encoding does without network: connect() calls (strace), outcome."""
    code = OFFLINE_PROBE[name].format(json=str(json_path), ranks=str(ranks_path))
    cmd = ["strace", "-f", "-qq", "-e", "trace=connect", sys.executable, "-c", code]
    with tempfile.TemporaryDirectory() as home:  # empty caches (wordchipper keeps its own)
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": home}
            )
        except FileNotFoundError:
            return "not checked (no strace)"
    inet = [ln for ln in proc.stderr.splitlines() if "connect(" in ln and "AF_INET" in ln]
    outcome = "ok" if proc.returncode == 0 else "fails"
    if name == "wordchipper" and proc.returncode == 0:
        outcome = f"loads a {proc.stdout.split()[0]}-token vocabulary with no error (wrong ids)"
    return f"{len(inet)} network connect() call(s); {outcome}"


def refusals() -> dict[str, str]:
    """Which tokenizer.json shapes fastokens loads (tokenizers loads them all)."""
    import fastokens
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    train = stdlib_texts()[:80]
    llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"  # fmt: skip
    byte = pre_tokenizers.ByteLevel(add_prefix_space=False)
    split = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(llama3), "isolated"), pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])  # fmt: skip
    shapes = {
        "GPT-2 ByteLevel": (byte, None),
        "Llama-3 Split + ByteLevel(use_regex=False)": (split, None),
        "NFC / Lowercase normalizer": (byte, normalizers.NFC()),
        "NFKC normalizer": (byte, normalizers.NFKC()),
        "BertNormalizer": (byte, normalizers.BertNormalizer()),
        "Metaspace (SentencePiece-style)": (pre_tokenizers.Metaspace(), None),
        "Whitespace": (pre_tokenizers.Whitespace(), None),
    }
    out = {}
    for label, (pre, norm) in shapes.items():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre
        if norm is not None:
            tok.normalizer = norm
        trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False)
        tok.train_from_iterator(train, trainer)
        try:
            fastokens.Tokenizer.from_json_str(tok.to_str())
            out[label] = "loads"
        except Exception as exc:  # fastokens raises ValueError naming what it lacks
            out[label] = f"refuses: {str(exc)[:70]}"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer texts, one timing")
    args = ap.parse_args()
    ensure_installed()
    ranks_path = gpt2_ranks()
    json_path = gpt2_tokenizer_json(ranks_path)
    texts = stdlib_texts()
    hyp = hypothesis_texts(200 if args.quick else 2000)
    if args.quick:
        texts = texts[:1500]
    corpus = DATA / "real_corpus_30mb.jsonl"
    real_corpus.build(corpus, 30_000_000)
    import orjson

    with open(corpus, "rb") as f:
        speed_texts = [orjson.loads(line)["text"] for line in f]
    found = engines(json_path, ranks_path)
    refs = {"tokenizers": found["tokenizers (reference, tokenizer.json)"][1], "tiktoken": found["tiktoken (reference, ranks file)"][1]}  # fmt: skip
    want = {k: (fn(texts), fn(hyp)) for k, fn in refs.items()}
    n_tokens = sum(map(len, refs["tiktoken"](speed_texts)))
    best = dict.fromkeys(found, float("inf"))
    for _ in range(1 if args.quick else 3):
        for name, (_, fn) in found.items():
            t0 = time.perf_counter()
            fn(speed_texts)
            best[name] = min(best[name], time.perf_counter() - t0)
    rows = []
    for name, (ref, fn) in found.items():
        a, b = want[ref]
        bad_std = sum(x != y for x, y in zip(fn(texts), a, strict=True))
        bad_hyp = sum(x != y for x, y in zip(fn(hyp), b, strict=True))
        tps = n_tokens / best[name]
        rows.append([name, f"{bad_std} of {len(texts):,}", f"{bad_hyp} of {len(hyp):,}", f"{tps / 1e6:.1f}M"])  # fmt: skip
    print(markdown_table(["engine", "stdlib docs differing", "hypothesis docs differing", "tokens/s (2 threads)"], rows))  # fmt: skip
    print(f"\nspeed corpus: {corpus.name} ({corpus.stat().st_size / 1e6:.0f} MB, {n_tokens / 1e6:.1f} M tokens); load {os.getloadavg()[0]:.1f}\n")  # fmt: skip
    facts = [[c, md.version(c), licence(c), offline(c, json_path, ranks_path)] for c in CANDIDATES]
    print(markdown_table(["package", "version", "licence", "offline (load + encode, no network)"], facts))  # fmt: skip
    print()
    print(markdown_table(["tokenizer.json shape", "fastokens"], [[k, v] for k, v in refusals().items()]))  # fmt: skip


if __name__ == "__main__":
    main()
