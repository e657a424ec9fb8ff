"""What a `tokenize` run did (`TokenizeSummary`, the paragraph the CLI prints), for tokenized
Parquet (packtool/tokenize/tokenize.py) and Megatron pairs (packtool/engines/megatron/run.py).

Records in: the run's progress counts, skips, files written and tokenizer identity. Out: the
summary.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packtool.dataset.identity import TokenizerIdentity, describe_tokenizer
from packtool.progress import Progress
from packtool.read.documents import SkipCounter
from packtool.storage import local as storage


@dataclass(kw_only=True)
class TokenizeSummary:
    """What `tokenize_corpus` did."""

    documents: int
    tokens: int
    seconds: float
    input_bytes: int
    skips: dict[str, int] = field(default_factory=dict)
    skip_line: str = "no skips"
    """`SkipCounter.summary()`: counts per reason with file:line examples."""
    files: list[str] = field(default_factory=list)
    """Files written."""
    output_bytes: int = 0
    tokenizer: dict[str, Any] = field(default_factory=dict)
    dtype: str = ""
    supervised_tokens: int | None = None
    """Tokens with loss_mask 1, when the input has labels or a loss mask (else None)."""
    special_names: dict[str, str] = field(default_factory=dict)
    """`eos` / `bos` -> the token text a default id came from."""
    partitions: int = 1
    """Partitions of a partitioned run (`--to megatron`, packtool/engines/megatron/run.py)."""
    resumed_partitions: int = 0
    """Of those, finished by an interrupted run and kept (`--resume`)."""
    resumed_tokens: int = 0
    """Their tokens (of `tokens`): not this run's work, so not in its rates."""
    resumed_bytes: int = 0
    """Their input bytes (of `input_bytes`)."""
    engine: str = ""
    """What ran the partitions, in words ("" for a run in this process)."""

    @property
    def tokens_per_s(self) -> float:
        """This run's rate: the tokens of partitions a `--resume` kept are not its work."""
        return (self.tokens - self.resumed_tokens) / max(self.seconds, 1e-9)

    def format(self) -> str:
        """One paragraph for the terminal."""
        where = self.files[0] if len(self.files) == 1 else f"{len(self.files)} part files"
        if len(self.files) == 2 and self.files[0].endswith(".bin"):  # a Megatron pair
            where = f"{self.files[0]} and {Path(self.files[1]).name}"
        own = self.tokens - self.resumed_tokens
        share = f" ({own:,} of {self.tokens:,} tokens in this run)" if self.resumed_tokens else ""
        mb_s = (self.input_bytes - self.resumed_bytes) / 1e6 / max(self.seconds, 1e-9)
        return (
            f"Tokenized {self.documents:,} documents into {self.tokens:,} tokens with "
            f"{describe_tokenizer(self.tokenizer, self.special_names)}, {self.dtype} ids, in "
            f"{self.seconds:.2f} s: {self.tokens_per_s:,.0f} tokens/s{share}, "
            f"{mb_s:.1f} MB/s of input. "
            f"{self._supervised()}Skips: {self.skip_line}. "
            f"Wrote {where} ({self.output_bytes / 1e6:.1f} MB).{self._partitions()}"
        )

    def _partitions(self) -> str:
        if self.partitions <= 1 and not self.resumed_partitions:
            return ""
        resumed = (
            f", {self.resumed_partitions} kept from the interrupted run"
            if self.resumed_partitions
            else ""
        )
        return f" {self.partitions} partitions{resumed}; {self.engine}."

    def _supervised(self) -> str:
        if self.supervised_tokens is None:
            return ""
        share = self.supervised_tokens / max(self.tokens, 1)
        return f"Loss mask kept: {self.supervised_tokens:,} supervised tokens ({share:.1%}). "


def summary_of(
    bar: Progress,
    skips: SkipCounter,
    files: list[Path],
    special_names: dict[str, str],
    seconds: float,
    dtype: str,
    supervised: int | None,
    identity: TokenizerIdentity,
) -> TokenizeSummary:
    """What a tokenize run did, from its progress counts, skips and the files it wrote
    (`identity`: what the output records; `special_names`: where its EOS / BOS came from)."""
    return TokenizeSummary(
        documents=bar.docs,
        tokens=bar.tokens,
        seconds=seconds,
        input_bytes=bar.nbytes,
        skips=skips.to_dict(),
        skip_line=skips.summary(),
        files=[str(f) for f in files],
        output_bytes=sum(storage.size(f) for f in files),
        tokenizer=identity.to_dict(),
        dtype=dtype,
        supervised_tokens=supervised,
        special_names=dict(special_names),
    )
