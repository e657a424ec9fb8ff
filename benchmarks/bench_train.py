"""Training throughput: packed documents + varlen attention against padded batches.

Both runs train the same model (same seed) on the same documents, step for step: step i sees
the same documents in both, either concatenated into one packed sequence (``cu_seqlens``,
varlen attention, no padding) or padded to the step's longest document ``(B, L_max)`` with
standard batched causal SDPA (right padding + causal means real tokens never see padding; the
loss ignores it). Padding is the only difference, so the ideal speed-up is
padded tokens / real tokens; we report measured / ideal.

Each run goes in its own process, so its peak RSS is its own.

    python -m benchmarks.bench_train                    # CPU, ~1-2 minutes on 2 cores
    python -m benchmarks.bench_train --device cuda      # bigger model, bf16; adds a GPU table
    python -m benchmarks.bench_train --crossover        # CPU dense-vs-sdpa threshold for `auto`
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing as mp
import platform
import queue as _queue
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from attention.model import ModelConfig, Transformer, apply_rotary
from attention.varlen import varlen_attention
from benchmarks._common import ROOT, markdown_table, peak_rss_mib, update_block

CORPUS = ROOT / "sample_data" / "corpus.jsonl"


@dataclass(frozen=True, kw_only=True)
class Setup:
    device: str
    model: ModelConfig
    max_len: int
    docs_per_step: int
    steps: int
    warmup: int
    bf16: bool
    seed: int = 0
    threads: int | None = None
    flex_dynamic: bool = False
    """Compile flex attention with `dynamic=True` (an experiment: `--flex-dynamic`)."""


def cpu_setup(steps: int | None) -> Setup:
    model = ModelConfig(
        vocab_size=512, dim=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=1024
    )
    return Setup(
        device="cpu",
        model=model,
        max_len=1024,
        docs_per_step=8,
        steps=steps or 30,
        warmup=2,
        bf16=False,
    )


def cuda_setup(steps: int | None) -> Setup:
    model = ModelConfig(
        vocab_size=32000, dim=1024, n_layers=8, n_heads=16, n_kv_heads=4, max_seq_len=4096
    )
    return Setup(
        device="cuda",
        model=model,
        max_len=4096,
        docs_per_step=16,
        steps=steps or 60,
        warmup=5,
        bf16=True,
    )


def document_lengths(n: int, max_len: int, seed: int) -> np.ndarray:
    """``n`` lengths drawn from sample_data (bytes + 1 for EOS, as the byte tokenizer makes them),
    clipped to ``max_len``; a log-normal of the same shape when the corpus is absent."""
    rng = np.random.default_rng(seed)
    if CORPUS.exists():
        with CORPUS.open(encoding="utf-8") as f:
            pool = np.array([len(json.loads(line)["text"].encode()) + 1 for line in f])
        pool = pool[pool > 1]  # empty documents are skipped by the pipeline
        lengths = rng.choice(pool, size=n)
    else:
        lengths = np.rint(rng.lognormal(mean=5.8, sigma=1.1, size=n)).astype(np.int64) + 2
    return np.minimum(lengths, max_len).astype(np.int64)


def make_steps(setup: Setup) -> list[list[np.ndarray]]:
    """Per step, the token arrays of its documents (random ids; throughput only)."""
    total = setup.docs_per_step * (setup.steps + setup.warmup)
    lengths = document_lengths(total, setup.max_len, setup.seed)
    rng = np.random.default_rng(setup.seed + 1)
    docs = [rng.integers(0, setup.model.vocab_size, size=int(n)) for n in lengths]
    b = setup.docs_per_step
    return [docs[i : i + b] for i in range(0, total, b)]


def packed_batch(docs: list[np.ndarray]) -> dict:
    """The loader's batch dict (docs/CONTRACTS.md) for one step's documents."""
    lengths = [len(d) for d in docs]
    ids = torch.from_numpy(np.concatenate(docs)).long()
    labels = ids.clone()
    labels[:-1] = ids[1:]
    ends = np.cumsum(lengths)
    labels[torch.from_numpy(ends - 1)] = -100  # no target across a document boundary
    return {
        "input_ids": ids,
        "cu_seqlens": torch.tensor([0, *ends.tolist()], dtype=torch.int32),
        "max_seqlen": max(lengths),
        "position_ids": torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])).long(),
        "labels": labels,
        "doc_ids": torch.arange(len(docs)),
    }


def padded_batch(docs: list[np.ndarray]) -> dict:
    """``(B, L_max)`` right-padded ids and labels (-100 at padding and each last token)."""
    width = max(len(d) for d in docs)
    ids = torch.zeros(len(docs), width, dtype=torch.int64)
    labels = torch.full((len(docs), width), -100, dtype=torch.int64)
    for r, d in enumerate(docs):
        t = torch.from_numpy(d).long()
        ids[r, : len(d)] = t
        labels[r, : len(d) - 1] = t[1:]
    return {"input_ids": ids, "labels": labels}


def padded_forward(model: Transformer, batch: dict) -> torch.Tensor:
    """The standard padded baseline with the same weights: batched causal SDPA per layer."""
    cfg = model.cfg
    ids, labels = batch["input_ids"], batch["labels"]
    b, width = ids.shape
    pos = torch.arange(width, device=ids.device).repeat(b)
    cos, sin = model.rope_cos[pos], model.rope_sin[pos]
    h = model.embed(ids.reshape(-1))  # (B * L, dim)
    group = cfg.n_heads // cfg.kv_heads
    for layer in model.layers:
        attn, x = layer.attn, layer.attn_norm(h)
        q = apply_rotary(attn.wq(x).view(b * width, cfg.n_heads, cfg.head_dim), cos, sin)
        k = apply_rotary(attn.wk(x).view(b * width, cfg.kv_heads, cfg.head_dim), cos, sin)
        v = attn.wv(x).view(b * width, cfg.kv_heads, cfg.head_dim)

        def heads(t: torch.Tensor, n: int) -> torch.Tensor:
            return t.view(b, width, n, cfg.head_dim).transpose(1, 2)  # (B, H, L, D)

        kh = heads(k, cfg.kv_heads).repeat_interleave(group, dim=1)
        vh = heads(v, cfg.kv_heads).repeat_interleave(group, dim=1)
        o = F.scaled_dot_product_attention(heads(q, cfg.n_heads), kh, vh, is_causal=True)
        h = h + attn.wo(o.transpose(1, 2).reshape(b * width, -1))
        h = h + layer.ffn(layer.ffn_norm(h))
    logits = model.lm_head(model.norm(h))
    flat = labels.reshape(-1)
    loss_sum = F.cross_entropy(logits.float(), flat, ignore_index=-100, reduction="sum")
    return loss_sum / (flat != -100).sum().clamp_min(1)


def step_counts(timed: list[list[np.ndarray]]) -> dict:
    """Tokens and attention sum(len^2), packed (real) and padded, over the timed steps."""
    return {
        "real_tokens": sum(sum(len(d) for d in s) for s in timed),
        "padded_tokens": sum(len(s) * max(len(d) for d in s) for s in timed),
        "attn_flops_real": sum(sum(len(d) ** 2 for d in s) for s in timed),
        "attn_flops_padded": sum(len(s) * max(len(d) for d in s) ** 2 for s in timed),
    }


class Run:
    """One mode's model (same seed in both modes), optimizer and batches."""

    def __init__(self, setup: Setup, mode: str) -> None:
        if setup.threads:
            torch.set_num_threads(setup.threads)
        if setup.flex_dynamic:
            _use_dynamic_flex()
        torch.manual_seed(setup.seed)
        self.setup, self.mode = setup, mode
        self.device = torch.device(setup.device)
        self.model = Transformer(setup.model).to(self.device)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=3e-4)
        self.steps = make_steps(setup)
        make = packed_batch if mode == "packed" else padded_batch
        self.batches = [make(s) for s in self.steps]
        self.backend = "sdpa (batched, causal)"

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    def step(self, i: int) -> tuple[float, float]:
        """Train on step ``i``'s batch; returns (seconds, loss)."""
        self.sync()
        t0 = time.perf_counter()
        batch = {
            k: v.to(self.device) if isinstance(v, torch.Tensor) else v
            for k, v in self.batches[i].items()
        }
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.setup.bf16):
            if self.mode == "packed":
                out = self.model(batch)
                loss, self.backend = out.loss, out.backend
            else:
                loss = padded_forward(self.model, batch)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.sync()
        return time.perf_counter() - t0, float(loss.detach())


def _use_dynamic_flex() -> None:
    """Make the flex backend compile `flex_attention` with `dynamic=True`: one kernel for every
    token count, instead of a recompile for each new one (the first CUDA run's flex training did
    not finish 65 steps of varying shape in 170 s; docs/attention.md)."""
    import functools

    from torch.nn.attention.flex_attention import flex_attention

    from attention import backends

    backends._compiled_flex = functools.lru_cache(maxsize=1)(
        lambda: torch.compile(flex_attention, dynamic=True)
    )


def compiled_graphs() -> int:
    """Graphs torch.compile has made in this process (a recompile for a new shape adds one)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def run_mode(setup: Setup, mode: str) -> dict:
    """All steps of one mode alone (a fresh process): its peak memory and loss curve."""
    run = Run(setup, mode)
    losses = []
    for i in range(len(run.steps)):
        if i == setup.warmup and run.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        losses.append(run.step(i)[1])
    if run.device.type == "cuda":
        memory = torch.cuda.max_memory_allocated() / 2**20
    else:
        memory = _vm_hwm_mib()
    return {
        "mode": mode,
        "peak_mib": memory,
        "backend": run.backend,
        "losses": losses,
        "graphs": compiled_graphs(),
    }


def _vm_hwm_mib() -> float:
    """This process's own peak RSS. getrusage's ru_maxrss survives exec on Linux, so a spawned
    child would report its parent's peak at fork; /proc's VmHWM belongs to the new image."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return peak_rss_mib()


def interleaved_timing(setup: Setup) -> dict[str, float]:
    """Seconds per mode over the timed steps, the two modes alternating step by step.

    On a shared machine a burst of load then slows both modes alike instead of one of them.
    """
    runs = {mode: Run(setup, mode) for mode in ("padded", "packed")}
    seconds = dict.fromkeys(runs, 0.0)
    for i in range(setup.warmup + setup.steps):
        order = ("padded", "packed") if i % 2 == 0 else ("packed", "padded")
        for mode in order:
            elapsed, _ = runs[mode].step(i)
            if i >= setup.warmup:
                seconds[mode] += elapsed
    return seconds


def _child(setup: Setup, mode: str, queue) -> None:
    queue.put(run_mode(setup, mode))


def run_isolated(setup: Setup, mode: str) -> dict:
    """`run_mode` in a fresh process: each mode's peak memory is its own."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(setup, mode, queue))
    proc.start()
    while True:  # a child that dies (a backend that cannot run, an OOM kill) puts nothing
        try:
            result = queue.get(timeout=1.0)
            break
        except _queue.Empty:
            if not proc.is_alive() and queue.empty():  # a result put just before it ended
                raise SystemExit(
                    f"bench_train: the {mode} run's process ended (exit code {proc.exitcode}) "
                    "without a result; its error is above"
                ) from None
    proc.join()
    return result


def measure(setup: Setup) -> tuple[dict, dict]:
    """Timing (interleaved, this process) plus memory and losses (one process per mode)."""
    isolated = {mode: run_isolated(setup, mode) for mode in ("padded", "packed")}
    seconds = interleaved_timing(setup)
    counts = step_counts(make_steps(setup)[setup.warmup :])
    results = []
    for mode in ("padded", "packed"):
        r = isolated[mode]
        r.update(counts)
        r["seconds"] = seconds[mode]
        r["tokens_per_s"] = counts["real_tokens"] / seconds[mode]
        r["first_loss"], r["last_loss"] = r["losses"][0], r["losses"][-1]
        results.append(r)
    return results[1], results[0]


def train_flops(cfg: ModelConfig, tokens: int, sum_len2: int) -> float:
    """Training FLOPs (forward + backward = 3x forward): 6 per weight per token for the linear
    layers, plus causal attention's QK^T and PV, 2 * sum(len^2) * dim per layer forward."""
    linear = 2 * cfg.dim * (cfg.n_heads + 2 * cfg.kv_heads) * cfg.head_dim  # wq, wk, wv
    linear += cfg.dim * cfg.dim + 3 * cfg.dim * cfg.hidden_dim  # wo, SwiGLU
    per_token = 6 * (cfg.n_layers * linear / 2 + cfg.dim * cfg.vocab_size)
    return per_token * tokens + 6 * cfg.n_layers * cfg.dim * sum_len2


def train_table(setup: Setup, packed: dict, padded: dict) -> tuple[str, str]:
    ideal_tokens = padded["padded_tokens"] / padded["real_tokens"]
    flops = {
        "padded": train_flops(setup.model, padded["padded_tokens"], padded["attn_flops_padded"]),
        "packed": train_flops(setup.model, packed["real_tokens"], packed["attn_flops_real"]),
    }
    ideal_flops = flops["padded"] / flops["packed"]
    measured = packed["tokens_per_s"] / padded["tokens_per_s"]
    rows = []
    for r in (padded, packed):
        mode = r["mode"]
        tokens = r["padded_tokens"] if mode == "padded" else r["real_tokens"]
        len2 = r["attn_flops_padded"] if mode == "padded" else r["attn_flops_real"]
        rows.append(
            [
                mode,
                r["backend"],
                f"{tokens:,}",
                f"{r['real_tokens']:,}",
                f"{len2 / 1e6:,.1f} M",
                f"{flops[mode] / 1e12:,.2f}",
                f"{r['seconds']:.1f}",
                f"{r['tokens_per_s']:,.0f}",
                f"{r['peak_mib']:,.0f}",
                f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}",
            ]
        )
    mem = "peak CUDA allocated" if setup.device == "cuda" else "peak RSS"
    headers = [
        "batches",
        "attention",
        "tokens computed",
        "real tokens",
        "attention sum len^2",
        "train TFLOPs (est.)",
        "seconds",
        "real tokens/s",
        f"{mem} (MiB)",
        "loss first -> last step",
    ]
    summary = (
        f"Speed-up packed / padded: measured **{measured:.2f}x**; ideal by tokens "
        f"(padded tokens / real tokens) {ideal_tokens:.2f}x -> **{measured / ideal_tokens:.0%} "
        f"of ideal**; ideal by estimated FLOPs (padding also inflates attention, ~L_max^2 per "
        f"row) {ideal_flops:.2f}x -> {measured / ideal_flops:.0%}."
    )
    return markdown_table(headers, rows), summary


def describe(setup: Setup) -> str:
    m = setup.model
    params = Transformer(m).num_parameters()
    where = (
        torch.cuda.get_device_name(0)
        if setup.device == "cuda"
        else f"{platform.machine()}, {torch.get_num_threads()} torch thread(s)"
    )
    return (
        f"{where}, torch {torch.__version__}, {'bf16 autocast' if setup.bf16 else 'float32'}; "
        f"model dim {m.dim}, {m.n_layers} layers, {m.n_heads} heads / {m.kv_heads} kv, "
        f"vocab {m.vocab_size} ({params / 1e6:.1f} M params); {setup.steps} timed steps "
        f"(+{setup.warmup} warm-up) of {setup.docs_per_step} documents, lengths from "
        f"sample_data (bytes + 1) clipped to {setup.max_len}; AdamW."
    )


def crossover(
    doc_counts=(1, 4, 16, 64), sizes=(32, 64, 96, 128, 192, 256, 384, 512, 768, 1024), repeat=7
) -> str:
    """Time dense (one masked call, O(T^2)) against sdpa (one call per document) on CPU.

    Forward + backward of `varlen_attention` (4 heads, 2 kv heads, head_dim 32) on ``T``
    tokens cut at random into ``n`` documents. `auto` uses dense while ``T^2 <= K * n``: sdpa
    pays a fixed cost per document, dense a cost per T^2. K is fitted as the median over ``n``
    of T_n^2 / n, T_n the largest size up to which dense won every time (robust to a late
    noise spike on a shared machine).
    """
    from benchmarks._common import best_of

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    rows, fits = [], []
    warm = torch.randn(256, 4, 32, requires_grad=True)
    for _ in range(20):  # threads and allocator warm before the first timed size
        cu = torch.tensor([0, 128, 256], dtype=torch.int32)
        varlen_attention(warm, warm, warm, cu, backend="dense").sum().backward()
    for n_docs in doc_counts:
        last_dense, streak = 0, True
        for total in sizes:
            if n_docs > total:
                continue
            cuts = np.sort(rng.choice(np.arange(1, total), n_docs - 1, replace=False))
            cu = torch.tensor([0, *cuts.tolist(), total], dtype=torch.int32)
            q = torch.randn(total, 4, 32, requires_grad=True)
            k = torch.randn(total, 2, 32, requires_grad=True)
            v = torch.randn(total, 2, 32, requires_grad=True)
            times = {}
            for backend in ("dense", "sdpa"):

                def step(backend=backend, q=q, k=k, v=v, cu=cu):
                    varlen_attention(q, k, v, cu, backend=backend).sum().backward()

                step()
                times[backend] = best_of(step, repeat)
            winner = "dense" if times["dense"] <= times["sdpa"] else "sdpa"
            streak = streak and winner == "dense"
            if streak:
                last_dense = total
            rows.append(
                [n_docs, total, f"{times['dense'] * 1e3:.2f}", f"{times['sdpa'] * 1e3:.2f}", winner]
            )
        fits.append(last_dense**2 / n_docs)
        print(f"{n_docs} documents: dense won up to {last_dense} tokens", flush=True)
    table = markdown_table(
        ["documents", "total tokens", "dense ms (fwd+bwd)", "sdpa ms (fwd+bwd)", "faster"], rows
    )
    k = float(np.median(fits))
    return table + f"\n\nFitted K = {k:,.0f} (dense while tokens^2 <= K * documents)."


def backend_sweep(device: str, repeat: int = 5) -> str:
    """Every usable backend on `device` against document length, at a fixed token count.

    Forward + backward of `varlen_attention` on T tokens cut into equal documents of length
    `L` (short, medium, long), GQA 4:1; bf16 on CUDA (T = 65,536, 32 heads, head_dim 128),
    float32 on CPU (T = 4,096, 4 heads, head_dim 32). Shows where one backend overtakes another
    and what `auto` picks, which is the evidence for `choose_backend`'s order.
    """
    from attention.varlen import BACKENDS, choose_backend, why_not
    from benchmarks._common import best_of

    cuda = device == "cuda"
    dev = torch.device(device)
    dtype = torch.bfloat16 if cuda else torch.float32
    total, heads, kv, dim = (65_536, 32, 8, 128) if cuda else (4_096, 4, 1, 32)
    lengths = (64, 256, 1024, 4096, 16384) if cuda else (32, 128, 512, 2048)
    usable = [b for b in BACKENDS[1:] if why_not(b, dev, dtype, (-1, 0), True) is None]
    if not cuda:
        usable = [b for b in usable if b in ("dense", "sdpa")]
    rows = []
    for length in lengths:
        n = total // length
        cu = torch.arange(0, total + 1, length, dtype=torch.int32, device=dev)
        q = torch.randn(total, heads, dim, device=dev, dtype=dtype, requires_grad=True)
        k = torch.randn(total, kv, dim, device=dev, dtype=dtype, requires_grad=True)
        v = torch.randn(total, kv, dim, device=dev, dtype=dtype, requires_grad=True)
        times = {}
        for backend in usable:

            def step(backend=backend, q=q, k=k, v=v, cu=cu, length=length):
                varlen_attention(q, k, v, cu, max_seqlen=length, backend=backend).sum().backward()
                if cuda:
                    torch.cuda.synchronize()

            try:
                step()
            except (RuntimeError, ValueError) as exc:  # e.g. dense runs out of memory
                times[backend] = None
                print(f"{backend} at L={length}: {type(exc).__name__}: {exc}"[:200], flush=True)
                continue
            times[backend] = best_of(step, repeat)
        ok = {b: t for b, t in times.items() if t is not None}
        fastest = min(ok, key=ok.get) if ok else "-"
        auto = choose_backend(device=dev, dtype=dtype, total_tokens=total, n_docs=n).name
        rows.append(
            [f"{length:,}", f"{n:,}"]
            + [f"{times[b] * 1e3:.2f}" if times.get(b) is not None else "failed" for b in usable]
            + [fastest, auto]
        )
        print(*rows[-1], sep="\t", flush=True)
    headers = ["doc length", "documents"] + [f"{b} ms" for b in usable] + ["fastest", "auto"]
    what = (
        f"{torch.cuda.get_device_name(0)}, bf16, T = {total:,}, {heads} heads / {kv} kv, "
        f"head_dim {dim}"
        if cuda
        else f"CPU, float32, T = {total:,}, {heads} heads / {kv} kv, head_dim {dim}"
    )
    return (
        f"Attention backends by document length ({what}; forward + backward, best of {repeat}; "
        f"`python -m benchmarks.bench_train --sweep --device {device}`):\n\n"
        + markdown_table(headers, rows)
    )


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1 (0 was read as the default, -1 ran)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--steps", type=_positive, default=None, help="timed steps (default 30 CPU, 60 CUDA)"
    )
    parser.add_argument("--crossover", action="store_true", help="CPU dense-vs-sdpa timing only")
    parser.add_argument(
        "--sweep", action="store_true", help="every backend on --device against document length"
    )
    parser.add_argument(
        "--threads", type=_positive, default=None, help="CPU threads for torch (default: torch's)"
    )
    parser.add_argument(
        "--attn",
        default=None,
        help="the packed model's attention backend (default: auto); with it the run only prints",
    )
    parser.add_argument(
        "--flex-dynamic",
        action="store_true",
        help="compile flex attention with dynamic=True (an experiment; prints only)",
    )
    parser.add_argument(
        "--no-readme", action="store_true", help="print only; leave docs/benchmarks.md alone"
    )
    args = parser.parse_args()

    if args.crossover:
        print(crossover())
        return
    if args.sweep:
        body = backend_sweep(args.device)
        print(body)
        if not args.no_readme:
            update_block(f"attention-{args.device}", body)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda but torch.cuda.is_available() is False")
    setup = cuda_setup(args.steps) if args.device == "cuda" else cpu_setup(args.steps)
    if args.threads:
        torch.set_num_threads(args.threads)
        setup = dataclasses.replace(setup, threads=args.threads)
    if args.attn:
        try:
            setup = dataclasses.replace(
                setup, model=dataclasses.replace(setup.model, attn_backend=args.attn)
            )
        except ValueError as exc:
            raise SystemExit(f"error: --attn {args.attn}: {exc}") from None
    if args.flex_dynamic:
        setup = dataclasses.replace(setup, flex_dynamic=True)
    print(describe(setup), flush=True)
    packed, padded = measure(setup)
    table, summary = train_table(setup, packed, padded)
    print(table)
    print(summary)
    print(f"graphs compiled by torch.compile in the packed run: {packed['graphs']}")
    if args.no_readme or args.attn or args.flex_dynamic:
        return
    section = f"**{setup.device.upper()}** — {describe(setup)}\n\n{table}\n\n{summary}"
    _write_readme(setup.device, section)


def _write_readme(device: str, section: str) -> None:
    """Keep one section per device in the `train` block: a CUDA run keeps the CPU table."""
    from benchmarks._common import BENCHMARKS

    text = BENCHMARKS.read_text(encoding="utf-8") if BENCHMARKS.exists() else ""
    start, end = "<!-- bench:train:start -->", "<!-- bench:train:end -->"
    old = (
        text[text.find(start) + len(start) : text.find(end)]
        if start in text and end in text
        else ""
    )
    sections = {}
    for part in old.split("<!-- train:")[1:]:
        name, _, body = part.partition("-->")
        sections[name.strip()] = body.strip()
    sections[device] = section
    body = "\n\n".join(
        f"<!-- train:{k} -->\n{sections[k]}" for k in ("cpu", "cuda") if k in sections
    )
    update_block("train", body)


if __name__ == "__main__":
    main()
