"""The text report of `packtool stats`: tables, the length histograms as bars, the candidates.

Formatting only: every number comes from a `packtool.stats.lengths.LengthStats`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from packtool.dataset.identity import describe_tokenizer
from packtool.stats.lengths import LengthStats


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: bool = True) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def fmt(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if (right and i and headers[i]) else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(parts).rstrip()

    return [fmt(headers), "  ".join("-" * w for w in widths), *(fmt(r) for r in rows)]


def _pct(x: float) -> str:
    return f"{100 * x:.2f}%"


_BARS = " ▁▂▃▄▅▆▇█"


def _render_histogram_32(
    buckets: list[dict[str, int]],
    max_len: int,
    longer: int,
    per_line: int = 32,
    max_lines: int = 4,
    lengths: np.ndarray | None = None,
) -> list[str]:
    """The length histogram up to max_len, one character per bucket (height ~ documents).

    Buckets are 32 tokens wide, or a multiple of 32 chosen so that the picture stays within
    `max_lines` lines (at max_len 4,096 it is 32; at 1 M tokens it would otherwise be 1,000
    lines). `longer` is the number of documents longer than max_len; where max_len is not a
    multiple of 32 they are taken out of the last bucket (with `lengths`: the documents' own),
    which ends past it.
    """
    n = -(-max_len // 32)
    counts = np.zeros(n, dtype=np.int64)
    for b in buckets:
        if b["lo"] != 0 and b["hi"] <= n * 32:
            counts[(b["hi"] - 1) // 32] = b["documents"]
    if lengths is not None and n * 32 > max_len:
        counts[-1] -= int(((lengths > max_len) & (lengths <= n * 32)).sum())
    group = -(-n // (per_line * max_lines))
    counts = np.pad(counts, (0, -n % group)).reshape(-1, group).sum(axis=1)
    width, n = 32 * group, len(counts)
    peak = max(int(counts.max()), 1)
    # Any non-empty bucket shows at least the lowest bar; empty buckets stay blank.
    levels = np.where(counts > 0, np.maximum(1, np.round(8 * counts / peak)), 0).astype(int)
    lines = [f"length histogram ({width}-token buckets up to {max_len:,}; bar height ~ documents)"]
    for start in range(0, n, per_line):
        lo, hi = start * width + 1, min(min(n, start + per_line) * width, max_len)
        bars = "".join(_BARS[v] for v in levels[start : start + per_line])
        lines.append(f"{lo:>7,}-{hi:<7,} |{bars}|")
    lines.append(f"longer than {max_len:,}: {longer:,} documents")
    return lines


def _long_line(s: LengthStats) -> str:
    """What the documents longer than the max length become under `s.long_docs`."""
    became = {
        "split": f"{s.long_chunks:,} chunks after splitting",
        "truncate": f"truncated, {s.tokens - s.packed_tokens:,} tokens cut",
        "drop": "dropped",
    }[s.long_docs]
    return (
        f"{s.long_documents:,} documents, {s.long_tokens:,} tokens -> {became} "
        f"({s.chunks:,} pieces in all)"
    )


def _packing_lines(s: LengthStats) -> list[tuple[str, str]]:
    """The bound and FFD rows after the long-document policy; with a loss mask, `pack` also
    drops the documents left unsupervised (and refuses split), so these are labelled by the
    policy, and the masked lines follow with the bound on the kept lengths (an unqualified split
    bound stood above fewer masked rows, and above what `pack` did)."""
    sup = s.supervised
    split = {"split": " (if split)", "truncate": " (truncated)"}[s.long_docs] if sup else ""
    lines = [
        (
            f"lower bound{split}" if sup is not None else "lower bound on rows",
            f"L1 {s.lower_bound_l1:,}  L2 {s.lower_bound_l2:,}",
        ),
        (f"FFD packing{split}", f"{s.ffd_rows:,} rows, efficiency {_pct(s.ffd_efficiency)}"),
    ]
    if sup is None:
        return lines
    at = sup.at[s.max_len]
    share = sup.supervised_tokens / sup.tokens if sup.tokens else 0.0
    return [
        *lines,
        ("supervised tokens", f"{sup.supervised_tokens:,} ({_pct(share)} of tokens)"),
        ("masked: lower bound", f"L1 {at.lower_bound_l1:,}  L2 {at.lower_bound_l2:,}"),
        (
            "masked: FFD, truncated",
            f"{at.rows:,} rows, efficiency {_pct(at.efficiency)}, supervised efficiency "
            f"{_pct(at.supervised_efficiency)} (documents never split: {at.documents_truncated:,}"
            f" truncated, {at.documents_unsupervised:,} dropped with no supervised token left)",
        ),
    ]


def render_report(s: LengthStats) -> str:
    """The text `packtool stats` prints."""
    L = s.max_len
    tok = s.inputs.get("tokenizer") or {}
    lines = []
    if tok:
        lines.append(f"tokenizer   {describe_tokenizer(tok)}")
    if s.inputs.get("skipped_summary"):
        lines.append(f"skipped     {s.inputs['skipped_summary']}")
    lines += [
        f"documents   {s.documents:,}",
        f"tokens      {s.tokens:,}",
        f"length      min {s.min:,}  mean {s.mean:,.1f}  p50 {s.p50:,}  p90 {s.p90:,}  "
        f"p99 {s.p99:,}  max {s.max:,}",
        f"gini        {s.gini:.3f}",
        "",
        "length histogram (log2 buckets)",
    ]
    peak = max(b["documents"] for b in s.histogram_log2)
    hist_rows = [
        [
            f"{b['lo']:,}-{b['hi']:,}",
            f"{b['documents']:,}",
            _pct(b["documents"] / s.documents),
            _pct(b["tokens"] / s.tokens) if s.tokens else "-",
            "#" * max(1 if b["documents"] else 0, round(30 * b["documents"] / peak)),
        ]
        for b in s.histogram_log2
    ]
    lines += _table(["length", "documents", "% docs", "% tokens", ""], hist_rows)
    lines += ["", *_render_histogram_32(s.histogram_32, L, s.long_documents, lengths=s.lengths)]
    lines += [
        "",
        f"at max length {L:,}",
        *(
            f"  {label:<23} {value}"  # a label past 23 characters keeps a space
            for label, value in [
                (f"longer than {L:,}", _long_line(s)),
                (f"pad each to {L:,}", f"{_pct(s.pad_to_max_len_waste)} of slots wasted"),
                (
                    f"pad batches of {s.batch_size:,}",
                    f"{_pct(s.pad_per_batch_waste)} of slots wasted (each batch to its longest)",
                ),
                *_packing_lines(s),
            ]
        ),
        "",
        "candidate max lengths (FFD "
        + {"split": "after splitting", "truncate": "after truncating", "drop": "after dropping"}[
            s.long_docs
        ]
        + ")",
    ]
    sup = s.supervised
    cand_rows = [
        [
            f"{c.max_len:,}" + (" *" if c.max_len == s.suggested_max_len else ""),
            f"{c.long_documents:,}",
            f"{c.chunks:,}",
            f"{c.lower_bound_rows:,}",
            f"{c.rows:,}",
            _pct(c.efficiency),
            _pct(c.pad_to_max_len_waste),
            *([_pct(sup.at[c.max_len].supervised_efficiency)] if sup else []),
        ]
        for c in s.candidates
    ]
    headers = [
        "max_len",
        {"split": "split docs", "truncate": "truncated docs", "drop": "dropped docs"}[s.long_docs],
        "chunks",
        "L2 rows",
        "FFD rows",
        "efficiency",
        "pad-to-max waste",
    ]
    lines += _table(headers + (["supervised eff. (truncated)"] if sup else []), cand_rows)
    lines += ["", f"suggested max length: {s.suggested_max_len:,} (* : {s.suggestion_rule})"]
    return "\n".join(lines)
