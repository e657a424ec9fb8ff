"""Where `packtool pack`'s wall time goes: a per-thread timeline of one run's stages.

Run from the repository root: `python -m benchmarks.e2e_timeline [PACK ARGS...]` (default: the
bench_e2e corpus and GPT-2 tokenizer.json, which `python -m benchmarks.bench_e2e` makes first).
It runs the real CLI in this process, with timers wrapped around the stages as their modules are
first imported (so imports, the tokenizer build and numba's loading happen where they normally
do), and prints for each thread and stage: calls, wall seconds, the thread's CPU seconds in it,
and when it first started and last ended (seconds since this script started). The idle core is
what the timeline shows: before the first encode, and after the last.
"""

from __future__ import annotations

import dataclasses
import importlib.abc
import importlib.machinery
import resource
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

T0 = time.perf_counter()
EVENTS: list[tuple[str, str, float, float, float]] = []  # thread, stage, start, end, cpu
MARKS: dict[str, tuple[float, float]] = {}  # phase boundary -> (wall since T0, process CPU-s)


def _process_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _mark(name: str, *, last: bool = False) -> None:
    """Note the wall time and the process's CPU seconds at a phase boundary (its first time, or
    its last with `last`)."""
    if last or name not in MARKS:
        MARKS[name] = (time.perf_counter() - T0, _process_cpu())


def _timed(fn: Callable, stage: str) -> Callable:
    def wrapper(*args: Any, **kw: Any) -> Any:
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            name = threading.current_thread().name
            EVENTS.append((name, stage, t0 - T0, time.perf_counter() - T0, time.thread_time() - c0))

    return wrapper


def _timed_iter(fn: Callable, stage: str) -> Callable:
    def wrapper(*args: Any, **kw: Any) -> Any:
        it = fn(*args, **kw)
        while True:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                item = next(it)
            except StopIteration:
                return
            name = threading.current_thread().name
            EVENTS.append((name, stage, t0 - T0, time.perf_counter() - T0, time.thread_time() - c0))
            yield item

    return wrapper


def _marked(fn: Callable, name: str, *, last: bool) -> Callable:
    def wrapper(*args: Any, **kw: Any) -> Any:
        if not last:
            _mark(name)
        try:
            return fn(*args, **kw)
        finally:
            if last:
                _mark(name, last=True)

    return wrapper


def _patch_tokenizers(m: Any) -> None:
    start = _marked(m.Tokenizer.start_batch, "first encode", last=False)
    m.Tokenizer.start_batch = _timed(start, "encode (engine)")
    finish = _marked(m.Tokenizer.finish_batch, "last token", last=True)
    m.Tokenizer.finish_batch = _timed(finish, "ids out + EOS")
    m.load_tokenizer = _timed(m.load_tokenizer, "load tokenizer")


def _patch_engines(m: Any) -> None:
    m.ENGINES = tuple(
        dataclasses.replace(e, open=_timed(e.open, f"build {e.name}")) for e in m.ENGINES
    )


def _patch_worker(m: Any) -> None:
    m.pack_cut = _timed_iter(m.pack_cut, "pack_cut (pack a chunk)")
    m.write_chunk = _timed(m.write_chunk, "write rows")


def _patch_shards(m: Any) -> None:
    m.ShardWriter._write = _timed(m.ShardWriter._write, "Parquet encode (row group)")
    m.ShardWriter._close_shard = _timed(
        m.ShardWriter._close_shard, "close shard (join, fsync, sha256)"
    )


PATCHES: dict[str, Callable[[Any], None]] = {
    "packtool.tokenizer.tokenizers": _patch_tokenizers,
    "packtool.tokenizer.engines": _patch_engines,
    "packtool.tokenize.tables": lambda m: setattr(
        m, "_raw_batches", _timed_iter(m._raw_batches, "read + parse JSON")
    ),
    "packtool.engines.worker": _patch_worker,
    "packtool.dataset.shards": _patch_shards,
    "packtool.pack.kernels": lambda m: setattr(
        m, "warm_up", _timed(m.warm_up, "load numba kernels")
    ),
    "numba": lambda m: None,  # its import is timed
}


class _Finder(importlib.abc.MetaPathFinder):
    """Times the import of each patched module and patches it once it has run."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            t0, c0 = time.perf_counter(), time.thread_time()
            run(module)
            thread = threading.current_thread().name
            EVENTS.append(
                (
                    thread,
                    f"import {name}",
                    t0 - T0,
                    time.perf_counter() - T0,
                    time.thread_time() - c0,
                )
            )
            PATCHES[name](module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> None:
    args = sys.argv[1:] or [
        "bench_data/real_corpus_110mb.jsonl", "-o", "bench_data/timeline-out", "--max-len", "4096",
        "--tokenizer", "bench_data/gpt2-hub-tokenizer.json", "--overwrite",
    ]  # fmt: skip
    MARKS["start"] = (0.0, _process_cpu())  # the interpreter's own start-up before T0 aside
    sys.meta_path.insert(0, _Finder())
    from packtool.cli import commands as cli

    try:
        cli.main(["pack", *args, "--json"])
    except SystemExit as exc:
        if exc.code:
            raise
    total = time.perf_counter() - T0
    usage = resource.getrusage(resource.RUSAGE_SELF)
    rows: dict[tuple[str, str], list[float]] = {}
    for thread, stage, start, end, cpu in EVENTS:
        row = rows.setdefault((thread, stage), [0, 0.0, 0.0, start, end])
        row[0] += 1
        row[1] += end - start
        row[2] += cpu
        row[4] = end
    print(
        f"\n{'thread':24} {'stage':36} {'calls':>5} {'wall s':>7} {'cpu s':>6} {'from':>6} {'to':>6}",
        file=sys.stderr,
    )
    for (thread, stage), (n, wall, cpu, start, end) in sorted(
        rows.items(), key=lambda kv: kv[1][3]
    ):
        print(
            f"{thread[:24]:24} {stage[:36]:36} {n:5d} {wall:7.3f} {cpu:6.3f} {start:6.3f} {end:6.3f}",
            file=sys.stderr,
        )
    cpu = usage.ru_utime + usage.ru_stime
    print(
        f"\nwhole run {total:.3f} s wall, {cpu:.2f} s CPU ({cpu / total:.2f} cores busy on average)",
        file=sys.stderr,
    )
    bounds = [("start", (0.0, MARKS.get("start", (0.0, 0.0))[1]))]
    bounds += [(k, MARKS[k]) for k in ("first encode", "last token") if k in MARKS]
    bounds.append(("end", (total, cpu)))
    names = {"start": "start-up", "first encode": "encoding", "last token": "tail"}
    for (a, (w0, c0)), (_, (w1, c1)) in zip(bounds, bounds[1:], strict=False):
        wall = w1 - w0
        print(
            f"{names[a]:9} {w0:6.3f} -> {w1:6.3f} s: {wall:.3f} s wall, {c1 - c0:.2f} CPU-s "
            f"({(c1 - c0) / wall if wall else 0:.2f} cores busy)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
