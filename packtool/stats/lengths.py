"""Length statistics of a corpus: distribution, padding waste, lower bounds, projected packing.

Everything is computed on an array of document lengths in tokens (`length_stats`); `compute_stats`
gets that array from raw corpora (tokenizing on the fly) or from tokenized Parquet (reading only
the `length` column). `packtool.stats.report.render_report` formats them.

Conventions (those of `packtool pack --long-docs X`, `StatsConfig.long_docs`, split by default):
- Documents longer than `max_len` are split into `max_len`-token chunks plus a remainder,
  truncated or dropped (`policy.py`) before anything is packed or padded; "chunks" below are the
  pieces packed, in input order. Document-level figures (percentiles, Gini, histograms) are the
  corpus's.
- Efficiency = tokens packed / (rows * max_len), the share of row slots holding tokens.
- Suggested max length: among the candidates that split (truncate, drop) at most
  `SPLIT_TOLERANCE` (1%) of the documents (all candidates >= the p99 length), the smallest whose
  projected FFD efficiency is within `SUGGEST_TOLERANCE` (one percentage point) of the best of
  them (`SUGGESTION_RULE`); the largest candidate when none cuts so few (`SUGGESTION_FALLBACK`,
  the rule then reported). Short rows always pack well once documents are chopped to fit, so
  efficiency alone would always suggest the shortest candidate; the limit keeps documents whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from packtool.dataset.columns import LOSS_MASK
from packtool.errors import ConfigError, DataError
from packtool.pack.chunk import check_room_for_text
from packtool.pack.kernels import check_max_len, ffd_assign
from packtool.pack.kernels import split_lengths as _split_lengths
from packtool.pack.limits import int64_lengths
from packtool.quantities import check_int
from packtool.stats.bounds import (
    lower_bound_l2_histogram,
    lower_bounds_from_histogram,
    split_histogram,
)
from packtool.stats.candidates import (
    SUGGEST_TOLERANCE,
    SUGGESTION_FALLBACK,
    SUGGESTION_RULE,
    Candidate,
    suggest_max_len,
    suggestion,
)
from packtool.stats.policy import LONG_DOC_POLICIES, policy_histogram, policy_pieces

if TYPE_CHECKING:
    from packtool.stats.supervised import SupervisedStats

__all__ = [
    "DEFAULT_CANDIDATES",
    "SUGGESTION_FALLBACK",
    "SUGGESTION_RULE",
    "SUGGEST_TOLERANCE",
    "Candidate",
    "LengthStats",
    "StatsConfig",
    "compute_stats",
    "gini",
    "length_stats",
    "lower_bound_l1",
    "lower_bound_l2",
    "lower_bounds_from_histogram",
    "split_lengths",
    "suggest_max_len",
]

DEFAULT_CANDIDATES = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True, kw_only=True)
class StatsConfig:
    """What to compute."""

    max_len: int = 4096
    """Row length in tokens: the padding, bound and packing figures are for this length."""
    batch_size: int = 8
    """Documents per batch for the "pad each batch to its longest" waste figure."""
    candidates: tuple[int, ...] = DEFAULT_CANDIDATES
    """Max lengths compared in the candidates table (the suggestion is one of these)."""
    long_docs: str = "split"
    """The `pack --long-docs` policy modelled: documents longer than a max length are `split`
    into chunks, `truncate`d or `drop`ped before padding and packing (`policy.py`)."""

    def __post_init__(self) -> None:
        if self.long_docs not in LONG_DOC_POLICIES:
            raise ConfigError(
                f"long_docs must be one of {', '.join(LONG_DOC_POLICIES)}, got {self.long_docs!r}"
            )
        # The lengths `packtool pack` accepts (rows of one token are refused there too). Each
        # kept as a Python int: a NumPy one reached to_dict() and json.dumps refused it.
        object.__setattr__(self, "max_len", check_max_len(self.max_len, minimum=2))
        object.__setattr__(self, "batch_size", check_int("batch_size", self.batch_size))
        if not isinstance(self.candidates, (tuple, list)) or any(
            isinstance(c, bool) or not isinstance(c, (int, np.integer)) for c in self.candidates
        ):  # a TypeError ('<' between str and int, an int not iterable) before
            raise ConfigError(
                f"candidates must be a non-empty tuple of positive lengths, got {self.candidates!r}"
            )
        if not self.candidates or any(c < 1 for c in self.candidates):
            raise ConfigError(
                f"candidates must be a non-empty tuple of positive lengths, got {self.candidates!r}"
            )
        object.__setattr__(
            self,
            "candidates",
            tuple(check_max_len(c, "candidate max length", minimum=2) for c in self.candidates),
        )

    def check_masked(self) -> None:
        """Refuse a policy not modelled for data with a loss mask (`ConfigError`): `supervised.py`
        models pack's default, truncate; split (the default here) is the plain figures' model."""
        if self.long_docs == "drop":
            raise ConfigError(
                "dropping long documents is not modelled for data with a loss mask: stats "
                "models truncate (pack's default for it), or split for the plain figures alone"
            )

    def check_room_for_text(self, eos_id: int | None, bos_id: int | None) -> None:
        """Refuse, as `packtool pack` does, a max length that BOS + EOS fill (`ConfigError`)."""
        check_room_for_text(self.max_len, eos_id, bos_id)
        for c in self.candidates:
            check_room_for_text(c, eos_id, bos_id, name="candidate max length")


# --- the pure statistics (arrays in, numbers out) ---


def _as_lengths(lengths: ArrayLike) -> NDArray[np.int64]:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigError(f"lengths must be a 1-D integer array, got {arr.dtype} {arr.shape}")
    arr = int64_lengths(arr).astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ConfigError(f"document {int(np.argmin(arr))} has negative length {int(arr.min())}")
    return arr


def split_lengths(lengths: ArrayLike, max_len: int) -> NDArray[np.int32]:
    """Chunk lengths after splitting each document into `max_len`-token pieces plus a remainder.

    Chunks come in input order (a document's pieces in order); empty documents give none.
    (`packtool.pack.kernels.split_lengths`, re-exported.)
    """
    return _split_lengths(_as_lengths(lengths), max_len)


def gini(lengths: ArrayLike) -> float:
    """Gini coefficient of the lengths: 0 when all are equal, towards 1 when a few hold all."""
    x = np.sort(_as_lengths(lengths)).astype(np.float64)
    n, total = x.size, x.sum()
    if n == 0 or total == 0:
        return 0.0
    ranks = np.arange(1, n + 1, dtype=np.float64)
    return float(2.0 * (ranks * x).sum() / (n * total) - (n + 1) / n)


def lower_bound_l1(lengths: ArrayLike, max_len: int) -> int:
    """L1 = ceil(total tokens / max_len): no packing into max_len rows can use fewer rows.

    Raises:
        ConfigError: `max_len` is not an integer in 1..MAX_LEN_LIMIT (as for `split_lengths`).
    """
    max_len = check_max_len(max_len)
    return int(-(-int(_as_lengths(lengths).sum()) // max_len))


def lower_bound_l2(lengths: ArrayLike, max_len: int) -> int:
    """The Martello–Toth L2 lower bound on rows, after splitting long documents (>= L1).

    For each k in 0..max_len/2: documents longer than max_len - k (J1) and those in
    (max_len/2, max_len - k] (J2) each need a row of their own, and documents in [k, max_len/2]
    (J3) can only use the room J2's rows leave; L2 = max over k of
    |J1| + |J2| + max(0, ceil((sum J3 - (|J2| * max_len - sum J2)) / max_len)).
    Martello & Toth, "Lower bounds and reduction procedures for the bin packing problem" (1990).

    Raises:
        ConfigError: `max_len` is not an integer in 1..MAX_LEN_LIMIT (as for `split_lengths`).
    """
    max_len = check_max_len(max_len)
    values, counts = np.unique(_as_lengths(lengths), return_counts=True)
    return lower_bound_l2_histogram(*split_histogram(values, counts, max_len), max_len)


def _pad_per_batch_slots(chunks: NDArray[np.int64], batch_size: int) -> int:
    n = chunks.size
    full = n // batch_size * batch_size
    slots = int(chunks[:full].reshape(-1, batch_size).max(axis=1).sum()) * batch_size if full else 0
    if full < n:
        slots += int(chunks[full:].max()) * (n - full)
    return slots


def _ffd_rows(chunks: NDArray[np.int64], max_len: int) -> int:
    return ffd_assign(chunks, max_len)[2] if chunks.size else 0


def _histogram_log2(arr: NDArray[np.int64]) -> list[dict[str, int]]:
    """Buckets [1, 1], [2, 3], [4, 7], ... from the shortest to the longest document.

    Empty documents get a [0, 0] bucket of their own.
    """
    pos = arr[arr > 0]
    bucket = (np.frexp(pos)[1] - 1).astype(np.int64)  # exact floor(log2) for integers
    n_b = int(bucket.max()) + 1 if pos.size else 0
    lo_b = int(bucket.min()) if pos.size else 0
    docs = np.bincount(bucket, minlength=n_b)
    toks = np.bincount(bucket, weights=pos, minlength=n_b)
    out = []
    n_zero = int((arr == 0).sum())
    if n_zero:
        out.append({"lo": 0, "hi": 0, "documents": n_zero, "tokens": 0})
    for b in range(lo_b, n_b):
        out.append(
            {
                "lo": 1 << b,
                "hi": (1 << (b + 1)) - 1,
                "documents": int(docs[b]),
                "tokens": int(toks[b]),
            }
        )
    return out


def _histogram_linear(arr: NDArray[np.int64], width: int = 32) -> list[dict[str, int]]:
    """Non-empty buckets [1, 32], [33, 64], ... (empty documents in a [0, 0] bucket)."""
    out = []
    n_zero = int((arr == 0).sum())
    if n_zero:
        out.append({"lo": 0, "hi": 0, "documents": n_zero})
    pos = arr[arr > 0]
    counts = np.bincount((pos - 1) // width) if pos.size else np.empty(0, np.int64)
    for b in np.flatnonzero(counts):
        out.append(
            {"lo": int(b) * width + 1, "hi": (int(b) + 1) * width, "documents": int(counts[b])}
        )
    return out


def _efficiency(tokens: int, rows: int, max_len: int) -> float:
    return tokens / (rows * max_len) if rows else 0.0


@dataclass(frozen=True, kw_only=True)
class LengthStats:
    """The statistics `packtool stats` reports; `to_dict()` for scripts, `render()` for people."""

    max_len: int
    batch_size: int
    documents: int
    tokens: int
    min: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    gini: float
    histogram_log2: list[dict[str, int]]
    histogram_32: list[dict[str, int]]
    long_documents: int
    """Documents longer than max_len."""
    long_tokens: int
    long_chunks: int
    """The pieces the documents longer than max_len become (truncated: one each; dropped: 0)."""
    chunks: int
    """Pieces of the whole corpus after the policy (every document is one, or its pieces)."""
    packed_tokens: int
    """Tokens in those pieces (`tokens` less what truncate or drop leave out)."""
    pad_to_max_len_slots: int
    pad_per_batch_slots: int
    lower_bound_l1: int
    lower_bound_l2: int
    ffd_rows: int
    candidates: list[Candidate]
    suggested_max_len: int
    long_docs: str = "split"
    """The `pack --long-docs` policy the max-length figures are for."""
    suggestion_rule: str = SUGGESTION_RULE
    """The rule's branch that chose it (`SUGGESTION_RULE` or `SUGGESTION_FALLBACK`)."""
    inputs: dict[str, Any] = field(default_factory=dict)
    """Where the lengths came from: kind (raw | tokenized | array), tokenizer, skipped counts."""
    lengths: NDArray[np.int64] | None = field(default=None, repr=False, compare=False)
    """The lengths themselves (for plots); not part of `to_dict()`."""
    supervised: SupervisedStats | None = None
    """Supervised tokens and efficiency, for data with a loss mask (packtool/stats/supervised.py)."""

    @property
    def ffd_efficiency(self) -> float:
        return _efficiency(self.packed_tokens, self.ffd_rows, self.max_len)

    @property
    def pad_to_max_len_waste(self) -> float:
        slots = self.pad_to_max_len_slots
        return 1.0 - self.packed_tokens / slots if slots else 0.0

    @property
    def pad_per_batch_waste(self) -> float:
        slots = self.pad_per_batch_slots
        return 1.0 - self.packed_tokens / slots if slots else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with stable keys (see docs/stats.md)."""
        return {
            "max_len": self.max_len,
            "long_docs": self.long_docs,
            "inputs": self.inputs,
            "documents": self.documents,
            "tokens": self.tokens,
            "length": {
                "min": self.min,
                "mean": self.mean,
                "p50": self.p50,
                "p90": self.p90,
                "p99": self.p99,
                "max": self.max,
            },
            "gini": self.gini,
            "longer_than_max_len": {
                "documents": self.long_documents,
                "tokens": self.long_tokens,
                "chunks": self.long_chunks,
                "chunks_after_split": self.chunks,  # the whole corpus's
            },
            "padding": {
                "pad_to_max_len": {
                    "slots": self.pad_to_max_len_slots,
                    "waste": self.pad_to_max_len_waste,
                },
                "pad_per_batch": {
                    "batch_size": self.batch_size,
                    "slots": self.pad_per_batch_slots,
                    "waste": self.pad_per_batch_waste,
                },
            },
            "lower_bound_rows": {"l1": self.lower_bound_l1, "l2": self.lower_bound_l2},
            "packed": {
                "algorithm": "ffd",
                "tokens": self.packed_tokens,
                "rows": self.ffd_rows,
                "efficiency": self.ffd_efficiency,
                "rows_over_l2": self.ffd_rows / self.lower_bound_l2 if self.lower_bound_l2 else 0.0,
            },
            "candidates": [c.to_dict() for c in self.candidates],
            "suggested_max_len": self.suggested_max_len,
            "suggestion_rule": self.suggestion_rule,
            "histogram_log2": self.histogram_log2,
            "histogram_32": self.histogram_32,
            **({"supervised": self.supervised.to_dict()} if self.supervised else {}),
        }


def length_stats(
    lengths: ArrayLike,
    config: StatsConfig | None = None,
    *,
    inputs: dict[str, Any] | None = None,
    supervised: SupervisedStats | None = None,
) -> LengthStats:
    """All statistics of one array of document lengths (tokens, BOS/EOS included).

    Raises:
        DataError: there are no documents.
        ConfigError: lengths are not a 1-D array of non-negative integers, or `supervised` is
            given with a `long_docs` not modelled for masked data (`StatsConfig.check_masked`).
    """
    config = config or StatsConfig()
    if supervised is not None:
        config.check_masked()
    arr = _as_lengths(lengths)
    if arr.size == 0:
        raise DataError("no documents to describe (every input was empty or skipped)")
    L, policy = config.max_len, config.long_docs
    chunks = policy_pieces(arr, L, policy)
    tokens = int(arr.sum())
    p50, p90, p99 = (int(v) for v in np.percentile(arr, [50, 90, 99], method="inverted_cdf"))
    long_mask = arr > L

    # FFD rows and L2 per max length, once each (max_len is usually a candidate). The kernels
    # release the GIL, so the lengths are packed in parallel threads.
    values, counts = np.unique(arr, return_counts=True)

    def pack_at(m: int) -> tuple[int, int, int, int]:
        c = chunks if m == L else policy_pieces(arr, m, policy)
        return (
            int(c.size),
            int(c.sum()),
            _ffd_rows(c, m),
            lower_bound_l2_histogram(*policy_histogram(values, counts, m, policy), m),
        )

    lens = sorted({L, *config.candidates})
    with ThreadPoolExecutor(max_workers=max(1, min(len(lens), os.cpu_count() or 1))) as pool:
        packed = dict(zip(lens, pool.map(pack_at, lens), strict=True))

    candidates = []
    for cand in config.candidates:
        n_chunks, kept, rows, l2 = packed[cand]
        candidates.append(
            Candidate(
                max_len=cand,
                long_documents=int((arr > cand).sum()),
                chunks=n_chunks,
                tokens=kept,
                lower_bound_rows=l2,
                rows=rows,
                efficiency=_efficiency(kept, rows, cand),
                pad_to_max_len_waste=1.0 - kept / (n_chunks * cand) if n_chunks else 0.0,
            )
        )
    suggested, rule = suggestion(candidates, int(arr.size), policy)
    long_chunks = {
        "split": int(-(-arr[long_mask] // L).sum()),
        "truncate": int(long_mask.sum()),
        "drop": 0,
    }[policy]

    return LengthStats(
        max_len=L,
        batch_size=config.batch_size,
        documents=int(arr.size),
        tokens=tokens,
        min=int(arr.min()),
        mean=float(arr.mean()),
        p50=p50,
        p90=p90,
        p99=p99,
        max=int(arr.max()),
        gini=gini(arr),
        histogram_log2=_histogram_log2(arr),
        histogram_32=_histogram_linear(arr, 32),
        long_documents=int(long_mask.sum()),
        long_tokens=int(arr[long_mask].sum()),
        long_chunks=long_chunks,
        chunks=int(chunks.size),
        packed_tokens=packed[L][1],
        pad_to_max_len_slots=int(chunks.size) * L,
        pad_per_batch_slots=_pad_per_batch_slots(chunks, config.batch_size) if chunks.size else 0,
        lower_bound_l1=lower_bound_l1(chunks, L),
        lower_bound_l2=packed[L][3],
        ffd_rows=packed[L][2],
        candidates=candidates,
        suggested_max_len=suggested,
        long_docs=policy,
        suggestion_rule=rule,
        inputs=dict(inputs or {"kind": "array"}),
        lengths=arr,
        supervised=supervised,
    )


def compute_stats(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    config: StatsConfig | None = None,
    *,
    read_config: Any = None,
    tokenizer: Any = None,
    workers: int | None = None,
    progress: bool | None = None,
    bos: int | str | None = "auto",
) -> LengthStats:
    """Statistics of a corpus: raw files are tokenized on the fly, tokenized Parquet is read.

    Args:
        inputs: files, folders, globs: all raw corpus files, or all tokenized Parquet (one str or
            `os.PathLike` is one input).
        config: what to compute.
        read_config: a `packtool.read.corpus.ReadConfig` for raw corpora.
        tokenizer: a `Tokenizer` or a spec for raw corpora (None: `byte`). For tokenized
            Parquet None reads the recorded tokenizer (a spec given is loaded to be compared):
            one given must be the recorded one, as for `tokenize_corpus` and `pack`
            (`packtool.tokenize.recorded.check_recorded_tokenizer`: the EOS / BOS not chosen
            are the file's, with a note on stderr; until 2026-12-07 it was ignored silently).
        workers: tokenizer threads when `tokenizer` is a spec.
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).
        progress: a bar on stderr while raw inputs are tokenized (None: on a terminal,
            `packtool.progress.progress_enabled`).

    Raises:
        DataError: unreadable or mixed inputs, no documents at all, or a tokenizer (or `bos`)
            unlike the one tokenized Parquet records.
        ConfigError: no inputs (an empty list), or a max length (or candidate) that BOS + EOS
            fill, which `pack` refuses.
    """
    from packtool.dataset.tokenized import tokenized_lengths
    from packtool.progress import Progress
    from packtool.read.corpus import expand_inputs
    from packtool.read.documents import ReadConfig, SkipCounter
    from packtool.stats.supervised import SupervisedCounter, read_supervised
    from packtool.storage.local import input_list, input_text
    from packtool.tokenize.tokenize import PRETOKENIZED, inputs_read, read_tables, unchanged_ids

    inputs = input_list(inputs)  # (an empty list: one line, not "no documents in ")
    config = config or StatsConfig()
    read_config = read_config or ReadConfig()
    paths = expand_inputs(inputs)  # listed and classified once, then handed on
    read = inputs_read(paths, read_config)
    identity = read.identity()
    counter = None
    if LOSS_MASK in read.columns:
        config.check_masked()  # before the pass over the corpus
        counter = SupervisedCounter([config.max_len, *config.candidates])
    skips = SkipCounter(strict=read_config.strict)
    if identity is not None:
        from packtool.tokenize.recorded import recorded_check
        from packtool.tokenizer.by_name import tokenizer_by_name

        # the recorded one or a DataError, as tokenize and pack (the ids are the file's); with
        # no tokenizer, `bos` is refused unless it is the file's
        given = None if tokenizer is None else tokenizer_by_name(tokenizer, bos, workers=workers)
        recorded_check(read, given, bos, input_text(inputs[0]))
        config.check_room_for_text(identity.eos_id, identity.bos_id)
        if counter is None:  # rows of no token are `empty` skips, as pack and tokenize count them
            lengths = tokenized_lengths(read.tokenized, skips)
        else:
            lengths = read_supervised(read.tokenized, counter, skips)
        if not lengths.size:
            what = skips.summary() if skips.total else "0 rows"
            raise DataError(f"no documents in {', '.join(map(str, inputs))} (tokenized, {what})")
        info: dict[str, Any] = {
            "kind": "tokenized",
            "tokenizer": identity.to_dict(),
            "skipped": skips.to_dict(),  # the key was missing: a KeyError for readers
            "skipped_summary": skips.summary(),
        }
    else:
        from packtool.tokenizer.by_name import tokenizer_by_name

        tokenizer = tokenizer_by_name(tokenizer or "byte", bos, workers=workers)
        used = tokenizer.identity
        if read.mode == PRETOKENIZED:
            used = unchanged_ids(used, tokenizer)  # ids counted as they are: no EOS, no BOS
        config.check_room_for_text(used.eos_id, used.bos_id)
        parts = []
        # Tokenizing a whole corpus takes a while (a bar on a terminal, as pack and tokenize)
        bar = Progress("stats", enabled=progress)
        try:
            for t, _ in read_tables(paths, read, read_config, tokenizer, skips):
                parts.append(t.column("length").to_numpy())
                bar.update(docs=len(parts[-1]), tokens=int(parts[-1].sum()))
                if counter is not None:
                    counter.add(t)
        finally:
            bar.close()
        lengths = np.concatenate(parts) if parts else np.empty(0, np.int64)
        if not lengths.size:
            raise DataError(f"no documents in {', '.join(map(str, inputs))}{skips.note()}")
        info = {
            "kind": "raw",
            "tokenizer": used.to_dict(),
            "skipped": skips.to_dict(),
            "skipped_summary": skips.summary(),
        }
    supervised = counter.result() if counter is not None else None
    return length_stats(lengths, config, inputs=info, supervised=supervised)
