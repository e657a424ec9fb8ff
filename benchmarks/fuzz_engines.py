"""Every fast tokenizer engine against its reference library on random text, on real files.

Run from the repository root: `python -m benchmarks.fuzz_engines [--examples 8000] [--long]`
(about 10 minutes at 8,000 on 2 cores). The tests hold the engines to the references on
tokenizers trained at test time; this holds them on the files users load, as the benchmarks make
them in git-ignored bench_data/ (GPT-2's hub tokenizer.json, the same vocabulary converted with
a Split regex and as a tiktoken ranks file, Mistral v1's SentencePiece model from mistral-common
and its two tokenizer.json forms). Each engine packtool would pick for a file (it passed the
probe) encodes hypothesis text (every Unicode category, Unicode's other whitespace, runs,
mojibake, special-token look-alikes) in batches; every text of a batch that differs is printed.
`--long` adds documents of 150 kB to 1 MB cut from the bench corpus (engines split long
documents themselves).

It found gigatoken's U+0085 loss under nmt_nfkc normalization (the probe holds that case since,
packtool/tokenizer/choice.py); on these files it found no difference (2026-12-04).
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks._common import ROOT
from benchmarks.bench_e2e import _mistral_json, _mistral_model_file
from benchmarks.bench_tokenize import gpt2_hub_tokenizer_json, gpt2_ranks, gpt2_tokenizer_json
from packtool.tokenizer.tokenizers import load_tokenizer

SPECIAL = (
    "\x85\u2028\u2029\x0b\x0c\x1c\x1d\x1e\x1f\u00a0\u3000\u1680\u2000\u200a\u202f\u205f\t\r\n "
    "\x00\ufeff\u200b\u200d'sSlLdDmMtTvVrReE0123456789é日😀▁<>|/\\Ã©â€™"
)
PIECE = st.one_of(
    st.text(st.characters(codec="utf-8"), max_size=20),
    st.text(st.sampled_from(SPECIAL), max_size=12),
    st.tuples(st.sampled_from(SPECIAL), st.integers(1, 40)).map(lambda t: t[0] * t[1]),
)
TEXTS = st.lists(st.lists(PIECE, max_size=8).map("".join), min_size=1, max_size=5)


def cases() -> list[tuple[str, str, list[str], str]]:
    """(name, file, fast engines, reference) for each tokenizer file."""
    mistral = {
        "normalizer": _mistral_json("normalizer"),
        "metaspace": _mistral_json("metaspace"),
        "model": _mistral_model_file(),
    }
    return [
        ("gpt2-hub", str(gpt2_hub_tokenizer_json()), ["fastokens", "gigatoken"], "tokenizers"),
        ("gpt2-split", str(gpt2_tokenizer_json(gpt2_ranks())), ["gigatoken", "fastokens"], "tokenizers"),
        ("gpt2-ranks", str(gpt2_ranks()), ["gigatoken", "fastokens"], "tiktoken"),
        ("mistral-normalizer", str(mistral["normalizer"]), ["fastokens", "gigatoken"], "tokenizers"),
        ("mistral-metaspace", str(mistral["metaspace"]), ["gigatoken"], "tokenizers"),
        ("mistral-model", str(mistral["model"]), ["gigatoken"], "sentencepiece"),
    ]  # fmt: skip


def ids(tok, texts: list[str]) -> list[list[int]]:
    flat, lengths = tok.encode_batch(texts)
    ends = np.cumsum(lengths)
    return [flat[e - n : e].tolist() for e, n in zip(ends, lengths, strict=True)]


def differing(tok, ref, examples: int) -> list[str]:
    """The texts of `examples` random batches whose ids `tok` and `ref` disagree on."""
    bad: list[str] = []

    @settings(max_examples=examples, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(TEXTS)
    def check(texts: list[str]) -> None:
        if ids(tok, texts) != ids(ref, texts):
            bad.extend(t for t in texts if ids(tok, [t]) != ids(ref, [t]))

    check()
    return bad


def long_documents() -> list[str]:
    path = ROOT / "bench_data" / "real_corpus_110mb.jsonl"
    with path.open() as f:
        docs = [json.loads(line)["text"] for _, line in zip(range(3000), f, strict=False)]
    rng = np.random.default_rng(1)
    out = []
    for size in (150_000, 400_000, 1_000_000):
        parts, n = [], 0
        while n < size:
            parts.append(docs[int(rng.integers(len(docs)))])
            n += len(parts[-1])
        out.append("\n\n".join(parts)[:size])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=8000, help="hypothesis batches per engine")
    ap.add_argument("--long", action="store_true", help="also 150 kB-1 MB documents")
    args = ap.parse_args()
    longs = long_documents() if args.long else []
    print(
        "| tokenizer | engine | reference | random batches | texts that differ | long documents equal |"
    )
    print("|---|---|---|---|---|---|")
    for name, path, engines, reference in cases():
        ref = load_tokenizer(path, engine=reference, bos=None, eos=None)
        want_long = [ids(ref, [d])[0] for d in longs]
        for engine in engines:
            try:
                tok = load_tokenizer(path, engine=engine, bos=None, eos=None)
            except Exception as exc:  # refused at load or by its probe: never used for the file
                print(f"| {name} | {engine} | {reference} | - | not used: {str(exc)[:80]} | - |")
                continue
            bad = differing(tok, ref, args.examples)
            same_long = [a == b for a, b in zip(ids(tok, longs), want_long, strict=True)]
            shown = ", ".join(repr(t)[:40] for t in sorted(set(bad), key=len)[:3])
            print(f"| {name} | {engine} | {reference} | {args.examples:,} | {len(set(bad))} "
                  f"{shown} | {all(same_long) if longs else '-'} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
