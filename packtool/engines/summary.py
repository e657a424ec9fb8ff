"""What a `packtool pack` run reports at the end (the closing lines, and `--json`)."""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from packtool.dataset.columns import LOSS_MASK
from packtool.dataset.groups import INLINE_GROUPS
from packtool.dataset.identity import describe_tokenizer
from packtool.dataset.manifest import GROUPS_FILE, INDEX_FILE
from packtool.pack.chunk import PackCounts

SHOWN_GROUPS = 20
"""The most groups the closing summary names (index.json or groups.json lists them all)."""


@dataclass
class PackSummary:
    """What the run did, for the closing summary and the manifest."""

    counts: PackCounts
    rows_per_round: list[int]
    lower_bound_l1: int
    lower_bound_l2: int
    efficiency: float
    num_shards: int
    groups: dict[str, Sequence[int]]
    """Group -> (rows, tokens), in name order: the run's running sums (`records.Totals`)."""
    seconds: dict[str, float] = field(default_factory=dict)
    skips: dict[str, int] = field(default_factory=dict)
    skip_examples: dict[str, list[str]] = field(default_factory=dict)
    """The first few `file:line` (or row) of each skip reason, in partition order."""
    partitions: int = 0
    resumed_partitions: int = 0
    """Partitions a `--resume` found finished (their inputs were not read again)."""
    resumed_tokens: int = 0
    """Their `tokens_in`: not this run's work, so not in its rate (`seconds` are this run's)."""
    out_dir: str = ""
    cores_used: str = ""
    """What ran the work (the summary's last words)."""
    columns: tuple[str, ...] = ()
    """The optional shard columns the dataset has (`loss_mask`, `seq_lengths`)."""
    max_len: int = 0
    tail_pieces: int = 0
    """Pieces the partitions set aside and the final stage packed together."""
    tokenizer: dict[str, Any] = field(default_factory=dict)
    """The tokenizer identity `index.json` records (its `engine` says what encoded)."""
    special_names: dict[str, str] = field(default_factory=dict)
    """`eos` / `bos` -> the token text a default id came from (`Tokenizer.special_names`)."""

    @property
    def masked(self) -> bool:
        return LOSS_MASK in self.columns

    @property
    def supervised_efficiency(self) -> float:
        """Supervised tokens / (rows * max_len): the share of slots that train on something."""
        return self.counts.tokens_supervised / max(self.counts.rows * self.max_len, 1)

    @property
    def skipped_unreadable(self) -> int:
        """Skips that are not empty documents (malformed lines, missing fields, bad UTF-8)."""
        return sum(v for k, v in self.skips.items() if k != "empty")

    @property
    def tokens_in_this_run(self) -> int:
        """The tokens this run read (all of them unless a `--resume` kept partitions)."""
        return self.counts.tokens_in - self.resumed_tokens

    @property
    def lower_bound(self) -> int:
        return max(self.lower_bound_l1, self.lower_bound_l2)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": self.out_dir,
            "counts": self.counts.to_dict(),
            "efficiency": self.efficiency,
            "lower_bound_rows": self.lower_bound,
            "lower_bound_l1": self.lower_bound_l1,
            "lower_bound_l2": self.lower_bound_l2,
            "rows_per_round": self.rows_per_round,
            "shards": self.num_shards,
            "partitions": self.partitions,
            "resumed_partitions": self.resumed_partitions,
            "tokens_in_this_run": self.tokens_in_this_run,
            "tail_pieces": self.tail_pieces,
            "groups": {k: {"rows": r, "tokens": t} for k, (r, t) in self.groups.items()},
            "skips": self.skips,
            "skip_examples": self.skip_examples,
            "seconds": self.seconds,
            "cores_used": self.cores_used,
            "columns": list(self.columns),
            **({"supervised_efficiency": self.supervised_efficiency} if self.masked else {}),
            "tokenizer": self.tokenizer,
        }

    def format(self, max_len: int) -> str:
        """The closing summary a person reads after `packtool pack`."""
        c = self.counts
        gap = c.rows - self.lower_bound
        total = self.seconds.get("total", 0.0)
        stages = ", ".join(f"{k} {v:.2f}s" for k, v in self.seconds.items() if k != "total")
        own = self.tokens_in_this_run
        share = f" ({own:,} of {c.tokens_in:,} tokens in this run)" if self.resumed_tokens else ""
        lines = [
            f"packed {c.documents_packed:,} of {c.documents_in:,} documents "
            f"({c.tokens_out:,} tokens) into {c.rows:,} rows of <= {max_len} tokens "
            f"in {self.num_shards} shard(s) -> {self.out_dir}",
            f"efficiency {self.efficiency:.4%} (padding {1 - self.efficiency:.4%}); "
            f"lower bound {self.lower_bound:,} rows (L1 {self.lower_bound_l1:,}, "
            f"L2 {self.lower_bound_l2:,}); gap {gap:,} rows ({gap / max(self.lower_bound, 1):.3%})",
            "rows per round: " + _rounds(self.rows_per_round),
            f"documents: split {c.documents_split:,}, truncated {c.documents_truncated:,}, "
            f"dropped {c.documents_dropped:,}, empty {c.documents_empty:,}, "
            f"skipped while reading {self.skipped_unreadable:,}",
            f"tokens: in {c.tokens_in:,} = out {c.tokens_out:,} + truncated "
            f"{c.tokens_truncated:,} + dropped {c.tokens_dropped:,}",
            f"time {total:.2f}s ({stages}); {own / max(total, 1e-9):,.0f} tokens/s{share}; "
            f"{self.partitions:,} partition(s); cores used: {self.cores_used}",
        ]
        if self.masked:
            share = c.tokens_supervised / max(c.tokens_out, 1)
            lines.append(
                f"supervised: {c.tokens_supervised:,} tokens ({share:.2%} of tokens out); "
                f"supervised efficiency {self.supervised_efficiency:.4%}; documents dropped for "
                f"holding no supervised token (after truncation) {c.documents_unsupervised:,}"
            )
        if self.tokenizer:
            lines.append("tokenizer " + describe_tokenizer(self.tokenizer, self.special_names))
        if self.skips:
            lines.append(
                "skips: "
                + ", ".join(
                    f"{k} {v:,}"
                    + (f" (e.g. {', '.join(ex)})" if (ex := self.skip_examples.get(k)) else "")
                    for k, v in self.skips.items()
                )
            )
        if self.resumed_partitions:
            lines.append(
                f"resumed: kept {self.resumed_partitions:,} finished partition(s) of "
                f"{self.partitions:,} (their inputs were not read again)"
            )
        return "\n".join(lines + _group_lines(self.groups, max_len))


def _rounds(rows: list[int], shown: int = 8) -> str:
    """`9,322 -> 9,310 -> 9,298`; past `shown` rounds the first few, the last and how many (a
    line per round of a million rounds was megabytes)."""
    if len(rows) <= shown:
        return " -> ".join(f"{r:,}" for r in rows)
    head = " -> ".join(f"{r:,}" for r in rows[: shown - 1])
    return f"{head} -> ... -> {rows[-1]:,} ({len(rows):,} rounds)"


def _group_lines(groups: dict[str, Sequence[int]], max_len: int) -> list[str]:
    """A line per group, in name order; past `SHOWN_GROUPS` groups only the largest, largest
    first (most tokens; ties in name order), then how many more and where every one is listed (a line
    per group of `--group-by source` over 3,000 files was a 3,007-line summary)."""
    shown = groups.items()
    if len(groups) > SHOWN_GROUPS:
        shown = heapq.nlargest(SHOWN_GROUPS, shown, key=lambda item: item[1][1])
    lines = [
        f"group {name!r}: {rows:,} rows, efficiency {tokens / max(rows * max_len, 1):.4%}"
        for name, (rows, tokens) in shown
    ]
    if len(groups) > SHOWN_GROUPS:
        where = GROUPS_FILE if len(groups) > INLINE_GROUPS else f"{INDEX_FILE} (extra.groups)"
        lines.append(
            f"... and {len(groups) - SHOWN_GROUPS:,} more groups (the {SHOWN_GROUPS} with the "
            f"most tokens are shown; every group's rows and efficiency: {where})"
        )
    return lines
