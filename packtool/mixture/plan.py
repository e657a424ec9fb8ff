"""`packtool mix`: what a mixture will deliver over a planned length, before training.

Runs the loader's own schedule (`packtool.mixture.schedule.Schedule`, the same rule, caps and segments)
on each source's size from its `index.json` alone: rows of the source's mean length, spread so
an epoch holds exactly its tokens (`SyntheticLengths`). Reads no shard; the per-source tokens
come out within one row of the real run's (whose rows differ in length, not in totals), and the
epochs, caps and drops are the real run's up to where inside an epoch a row boundary falls.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from packtool.dataset.manifest import read_manifest
from packtool.errors import ConfigError, option_choice
from packtool.mixture.schedule import Schedule, SyntheticLengths
from packtool.mixture.spec import (
    MixtureSpec,
    check_compatible,
    check_distinct_data,
    parse_count,
    read_mixture_file,
)
from packtool.progress import Progress


@dataclass(frozen=True, kw_only=True)
class SourcePlan:
    """One source's part of a planned mixture."""

    name: str
    path: str
    weight: float
    target: float
    """Its share by weight (normalised)."""
    epoch_rows: int
    epoch_tokens: int
    rows: int
    tokens: int
    share: float
    """Its share of the units delivered (tokens, or rows)."""
    epochs: float
    """Passes over the source (rows delivered / rows per epoch)."""
    max_epochs: float | None
    at_cap: str
    needed_epochs: float
    """Passes its weight asks for over the whole planned length, caps aside."""


@dataclass(frozen=True, kw_only=True)
class MixPlan:
    """The plan `plan_mixture` returns; `format()` is the CLI's table."""

    origin: str
    unit: str
    seed: int
    length: str
    """The planned length in words."""
    tokens: int
    rows: int
    steps: int | None
    sources: tuple[SourcePlan, ...]
    events: tuple[dict[str, Any], ...]
    ended: str | None
    """Why the mixture ended before the planned length (a cap), else None."""
    warnings: tuple[str, ...]
    seconds: float
    """Time the schedule took."""

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "sources"}
        d["sources"] = [vars(s) for s in self.sources]
        d["events"], d["warnings"] = list(self.events), list(self.warnings)
        return d

    def format(self) -> str:
        head = [
            f"mixture {self.origin or '(in memory)'}: {len(self.sources)} sources, weights count "
            f"{self.unit}, seed {self.seed}",
            f"planned {self.length}: {self.tokens:,} tokens in {self.rows:,} rows"
            + (f", {self.steps:,} steps" if self.steps is not None else "")
            + f" (schedule {self.seconds:.2f}s)",
        ]
        cols = ["source", "weight", "target", "tokens", "share", "rows", "epochs", "max_epochs"]
        body = [
            [
                s.name,
                f"{s.weight:g}",
                f"{100 * s.target:.2f}%",
                f"{s.tokens:,}",
                f"{100 * s.share:.2f}%",
                f"{s.rows:,}",
                f"{s.epochs:.2f}",
                "-" if s.max_epochs is None else f"{s.max_epochs:g} ({s.at_cap})",
            ]
            for s in self.sources
        ]
        widths = [max(len(r[i]) for r in [cols, *body]) for i in range(len(cols))]
        lines = [
            "  ".join(
                v.ljust(w) if i in (0,) else v.rjust(w)
                for i, (v, w) in enumerate(zip(r, widths, strict=True))
            )
            for r in [cols, *body]
        ]
        notes = [f"note: {e['message']} (at {e['tokens']:,} tokens)" for e in self.events]
        return "\n".join(head + lines + notes)


def _source_sizes(spec: MixtureSpec) -> tuple[list[tuple[str, int, int]], int]:
    """`(path, rows, tokens)` per source from its index.json, and their common max_len."""
    entries, sizes, data = [], [], []
    for s in spec.sources:
        if not isinstance(s.path, (str, bytes)) and not hasattr(s.path, "__fspath__"):
            raise ConfigError(f"source {s.name!r}: `packtool mix` plans packed dataset folders")
        m = read_manifest(s.path)
        entries.append((s.name, m.tokenizer, m.max_len))
        if m.num_rows == 0:
            raise ConfigError(f"source {s.name!r} ({s.path}) has no rows; remove it")
        sizes.append((str(s.path), m.num_rows, m.num_tokens))
        data.append((s, m.fingerprint, f"fingerprint {m.fingerprint}"))
    check_compatible(entries)  # one max_len for all
    check_distinct_data(data)
    return sizes, int(entries[0][2])


def _option(flag: str, value: object = "N") -> str:
    """A length or batch option as both callers give it: `--tokens N / tokens=N` (the CLI's
    flag, `plan_mixture`'s argument)."""
    return option_choice(flag, flag[2:].replace("-", "_"), value)


def plan_file(
    path: str, *, tokens: str | int | None = None, steps: str | int | None = None, **batching: Any
) -> MixPlan:
    """`plan_mixture` of a mixture file, lengths given as counts or text (`10B`)."""
    return plan_mixture(
        read_mixture_file(path),
        tokens=None if tokens is None else parse_count(tokens, "--tokens"),
        steps=None if steps is None else parse_count(steps, "--steps"),
        **batching,
    )


def plan_mixture(
    spec: MixtureSpec,
    *,
    tokens: int | None = None,
    steps: int | None = None,
    rows_per_batch: int | None = None,
    tokens_per_batch: int | None = None,
    world_size: int = 1,
    progress: bool | None = None,
) -> MixPlan:
    """What `spec` delivers over `tokens` tokens or `steps` global steps (default: the
    mixture's own total), or until its caps end it.

    Args:
        spec: The mixture (its sources packed dataset folders).
        tokens: Plan this many tokens.
        steps: Plan this many global steps; needs `rows_per_batch` or `tokens_per_batch`.
        rows_per_batch: Rows per rank batch (steps are then exact).
        tokens_per_batch: Token budget per rank batch (steps estimated on mean-length rows).
        world_size: Ranks per step.
        progress: Draw a progress bar (default: on a terminal).

    Raises:
        ConfigError: No length, or steps without a batch size; a batch size or a world size
            other than 1 without steps (they would change nothing); the sources' checks.
        DataError: A missing or damaged `index.json`.
    """
    if tokens is not None and steps is not None:
        raise ConfigError(f"give {_option('--tokens')} or {_option('--steps')}, not both")
    past = _past_own_total(spec, tokens, steps)
    what = _option("--steps", steps)  # the length asked for, or the mixture's own
    length = None if tokens is None else f"with {_option('--tokens', tokens)}"
    own = tokens is None and steps is None
    if own:
        tokens, steps = spec.total_tokens, spec.total_steps
        what = f"the mixture's total_steps {steps or 0:,}"
        length = None if tokens is None else f"with the mixture's total_tokens {tokens:,}"
    if tokens is None and steps is None and not spec.ends():
        raise ConfigError(
            f"give a length to plan ({_option('--tokens')} or {_option('--steps')}): the "
            "mixture has no total and no cap that ends it"
        )
    if steps is None:  # a batch size and the world size only count steps
        length = length or "in a plan that runs until the caps end it"
        _no_batching(length, rows_per_batch, tokens_per_batch, world_size)
    if steps is not None and (rows_per_batch is None) == (tokens_per_batch is None):
        raise ConfigError(
            f"planning {what} needs exactly one of {_option('--rows-per-batch')}, "
            + _option("--tokens-per-batch")
            + (f" (or plan a length in {_option('--tokens')})" if own else "")
        )
    sizes, max_len = _source_sizes(spec)
    if tokens_per_batch is not None and tokens_per_batch < max_len:
        raise ConfigError(f"tokens_per_batch {tokens_per_batch} is smaller than max_len {max_len}")
    readers = [SyntheticLengths(r, t) for _, r, t in sizes]
    sch = Schedule(spec.sources, readers, unit=spec.unit, max_len=max_len, total_tokens=tokens)
    t0 = time.perf_counter()
    rows_limit = (
        None if steps is None or rows_per_batch is None else steps * world_size * rows_per_batch
    )
    batches = carry = 0  # rank batches closed; tokens of the open one (a token budget)
    state = None
    last = 0  # the last planned row's tokens
    with Progress("mix", enabled=progress) as bar:
        while state is None and sch.done is None:
            chunk = sch.next(1 << 20)
            cut = None
            if rows_limit is not None and sch.delivered_rows >= rows_limit:
                cut = len(chunk) - (sch.delivered_rows - rows_limit)
            elif tokens_per_batch is not None and steps is not None:
                cut, batches, carry = _budget_cut(
                    chunk.length, tokens_per_batch, batches, carry, steps * world_size
                )
            planned = len(chunk) if cut is None else cut
            if planned:
                last = int(chunk.length[planned - 1])
            bar.update(docs=planned, tokens=int(chunk.length[:cut].sum()))
            if cut is not None:
                state = sch.state_after(chunk, cut)
    if state is None:
        state = sch.state()
    seconds = time.perf_counter() - t0
    plan = _plan(
        spec, sizes, state, tokens, steps, rows_per_batch, tokens_per_batch, world_size, seconds
    )
    own = spec.total_tokens  # with it, `steps` is --steps (a file has no total_steps then)
    if steps is not None and own is not None and plan.tokens - last >= own:
        # a run of the file stops after the row that brings its tokens to total_tokens: the
        # plan's last row comes after that one
        past.append(
            f"{_option('--steps', steps)} plans {plan.tokens:,} tokens, past the mixture's own "
            f"total_tokens {own:,}, where a run of this file stops; the plan shows what a larger "
            "total would deliver"
        )
    return replace(plan, warnings=(*past, *plan.warnings))


def _past_own_total(spec: MixtureSpec, tokens: int | None, steps: int | None) -> list[str]:
    """A warning where --tokens / --steps plans past the mixture's own total, which a run of the
    file stops at (the plan reported 5,019 tokens of a file whose total_tokens is 2,000); for
    --steps past the file's total_tokens, `plan_mixture` warns once the steps' tokens are
    known."""
    for flag, asked, own, key in (
        ("--tokens", tokens, spec.total_tokens, "total_tokens"),
        ("--steps", steps, spec.total_steps, "total_steps"),
    ):
        if asked is not None and own is not None and asked > own:
            return [
                f"{_option(flag, asked)} plans past the mixture's own {key} {own:,}, where a run of "
                "this file stops; the plan shows what a larger total would deliver"
            ]
    return []


def _no_batching(length: str, rows: int | None, budget: int | None, world: int) -> None:
    """Refuse batch options for a plan in tokens: they would change nothing (they were ignored
    without a word, both batch sizes at once included)."""
    given = [
        _option(flag, value)
        for flag, value in (
            ("--rows-per-batch", rows),
            ("--tokens-per-batch", budget),
            ("--world-size", None if world == 1 else world),
        )
        if value is not None
    ]
    if given:
        names = given[0] if len(given) == 1 else f"{', '.join(given[:-1])} and {given[-1]}"
        raise ConfigError(
            f"{names} {'has' if len(given) == 1 else 'have'} no effect {length} (a batch size "
            f"and the world size count steps): plan {_option('--steps')} with one batch size, "
            "or drop " + ("it" if len(given) == 1 else "them")
        )


def _budget_cut(
    lengths: np.ndarray, budget: int, batches: int, carry: int, want: int
) -> tuple[int | None, int, int]:
    """Greedy rank batches (rows while they fit `budget`, at least one) over `lengths`, after
    `carry` tokens of a batch left open by the last chunk. Returns the rows of this chunk up to
    the end of the `want`-th batch (None: it does not end here), batches closed, the new carry.
    """
    n = len(lengths)
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=cum[1:])
    i = 0
    while i < n:
        end = int(np.searchsorted(cum, cum[i] + budget - carry, side="right")) - 1
        if carry == 0:
            end = max(end, i + 1)
        if end >= n:  # every row left fits: the batch stays open into the next chunk
            return None, batches, carry + int(cum[n] - cum[i])
        batches += 1
        i, carry = end, 0
        if batches == want:
            return i, batches, 0
    return None, batches, carry


def _plan(
    spec, sizes, state, tokens, steps, rows_per_batch, tokens_per_batch, world, seconds
) -> MixPlan:
    targets = spec.weights()
    delivered_tokens, delivered_rows = int(state["tokens"]), int(state["rows"])
    units = delivered_tokens if spec.unit == "tokens" else delivered_rows
    planned_units = units
    if spec.unit == "tokens" and tokens is not None:
        planned_units = tokens
    elif steps is not None and rows_per_batch is not None and spec.unit == "rows":
        planned_units = steps * world * rows_per_batch
    sources, warnings = [], []
    for s, (path, rows, toks) in zip(spec.sources, sizes, strict=True):
        st = state["sources"][s.name]
        mine = st["tokens"] if spec.unit == "tokens" else st["rows"]
        per_epoch = toks if spec.unit == "tokens" else rows
        needed = targets[s.name] * planned_units / per_epoch
        plan = SourcePlan(
            name=s.name,
            path=path,
            weight=float(s.weight),
            target=targets[s.name],
            epoch_rows=rows,
            epoch_tokens=toks,
            rows=st["rows"],
            tokens=st["tokens"],
            share=mine / units if units else 0.0,
            epochs=st["rows"] / rows,
            max_epochs=s.max_epochs,
            at_cap=s.at_cap,
            needed_epochs=needed,
        )
        sources.append(plan)
        if s.max_epochs is not None and needed > s.max_epochs and s.weight > 0:
            then = (
                "the mixture stops there"
                if s.at_cap == "stop"
                else "it is dropped there and the others renormalise"
            )
            warnings.append(
                f"source {s.name!r} would be repeated {needed:.2f} times over the plan, more than "
                f"its max_epochs {s.max_epochs:g}; {then}"
            )
    ended = (
        state["done"] if state["done"] and not state["done"].startswith("total_tokens") else None
    )
    if ended and (tokens is not None or steps is not None):
        warnings.append(f"the mixture ends early, at {delivered_tokens:,} tokens: {ended}")
    length = (
        f"{tokens:,} tokens"
        if tokens is not None
        else f"{steps:,} steps of {world} x "
        + (f"{rows_per_batch} rows" if rows_per_batch else f"<= {tokens_per_batch:,} tokens")
        if steps is not None
        else "until the caps end it"
    )
    n_steps = steps if steps is not None and not ended else None
    return MixPlan(
        origin=spec.origin,
        unit=spec.unit,
        seed=spec.seed,
        length=length,
        tokens=delivered_tokens,
        rows=delivered_rows,
        steps=n_steps,
        sources=tuple(sources),
        events=tuple(e for e in state["events"] if e["what"] in ("dropped", "stopped")),
        ended=ended,
        warnings=tuple(warnings),
        seconds=seconds,
    )
