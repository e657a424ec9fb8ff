"""`packtool inspect`: what a packed dataset holds, one row's documents, and pictures of both.

The summary comes from `index.json` plus one measurement: only the `doc_offsets` column of each
shard is read (its last entry per row is the row length), which gives each row's fill and
document count without touching the tokens, in memory bounded by max_len (a histogram), in time
linear in the rows (~0.9 s at 8.6 M rows). `--row N` reads the one row group that holds global
row N.

(Named `inspect_dataset`, not `inspect`: a module called `inspect.py` in this folder would shadow
the standard library's `inspect` for any script run from inside `packtool/`.)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from packtool.audit import verify
from packtool.audit.row_values import row_values
from packtool.audit.verify import DAMAGED, list_parts
from packtool.dataset.columns import Column, derived
from packtool.dataset.manifest import Manifest, dataset_folder, open_dataset
from packtool.dataset.masks import segment_sums, spans
from packtool.errors import ConfigError, DataError, one_line, option_choice
from packtool.storage import local as storage

PLOT_ROWS = 64
"""Rows drawn in the row-fill picture."""
PREVIEW_CHARS = 40
PREVIEW_IDS = 8
STRIP_CHARS = 100
"""Characters of the loss-mask strip under a row (`RowView.mask_strip`)."""


@dataclass(frozen=True, kw_only=True)
class FillStats:
    """Measured fill (row length / max_len) and documents per row over every row."""

    fill_min: float
    fill_p50: float
    fill_p90: float
    fill_mean: float
    docs_min: int
    docs_p50: float
    docs_mean: float
    docs_max: int


@dataclass(frozen=True, kw_only=True)
class RowDocument:
    """One document (or chunk) inside a packed row."""

    doc_id: int
    chunk: int
    start: int
    length: int
    preview: str
    """Decoded text (byte tokenizer) or the first token ids."""
    supervised: int | None = None
    """Tokens with loss_mask 1 (None: the dataset has no loss mask)."""
    spans: tuple[tuple[int, int], ...] = ()
    """The supervised runs, `(start, end)` token positions in the row (half-open)."""
    supervised_preview: str = ""
    """The start of the first supervised run, previewed like `preview`."""
    source: str = ""
    """Where the document came from: `file:line N (byte B)`, `file:row N`, ... (`docids.where`);
    empty for datasets whose ids do not say (packed before format 3)."""


@dataclass(frozen=True, kw_only=True)
class RowView:
    """One packed row: where it lives and its documents."""

    row: int
    """Global row index across shards."""
    file: str
    shard_row: int
    length: int
    max_len: int
    doc_offsets: NDArray[np.int64]
    """int64, (n_docs + 1,): the row's cu_seqlens."""
    documents: tuple[RowDocument, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "row": self.row,
            "file": self.file,
            "shard_row": self.shard_row,
            "length": self.length,
            "max_len": self.max_len,
            "fill": self.length / self.max_len,
            "doc_offsets": [int(x) for x in self.doc_offsets],
            "documents": [
                {**d.__dict__, "spans": [list(p) for p in d.spans]} for d in self.documents
            ],
            "mask_strip": self.mask_strip,
        }

    mask_strip: str = ""
    """With a loss mask: the row drawn in `STRIP_CHARS` characters, `#` where some token of the
    stretch is supervised, `.` where none is, `|` at document starts."""

    def format(self) -> str:
        masked = any(d.supervised is not None for d in self.documents)
        lines = [
            f"row {self.row} ({self.file} row {self.shard_row}): {self.length:,} tokens of max_len "
            f"{self.max_len:,} ({self.length / self.max_len:.1%}), {len(self.documents)} documents",
            f"  {'doc_id':>10}  {'chunk':>5}  {'start':>7}  {'length':>7}  "
            + (f"{'supervised':>10}  " if masked else "")
            + "preview",
        ]
        for d in self.documents:
            sup = f"{d.supervised:>10}  " if masked else ""
            lines.append(
                f"  {d.doc_id:>10}  {d.chunk:>5}  {d.start:>7}  {d.length:>7}  {sup}{d.preview}"
            )
            if d.source:
                lines.append(f"  {'':>10}  from {d.source}")
            if masked:
                runs = ", ".join(f"{a}-{b}" for a, b in d.spans[:8])
                more = f" (+{len(d.spans) - 8} more)" if len(d.spans) > 8 else ""
                lines.append(f"  {'':>10}  supervised tokens {runs}{more}: {d.supervised_preview}")
        if self.mask_strip:
            lines.append(f"  loss mask |{self.mask_strip}|")
        return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class DatasetSummary:
    """The manifest's record plus the measured fill distribution."""

    directory: Path
    manifest: Manifest
    rows: int
    tokens: int
    fill: FillStats | None
    """None for a dataset with no rows."""
    first_rows: tuple[NDArray[np.int64], ...]
    """doc_offsets of the first `PLOT_ROWS` rows (for the row-fill picture)."""

    @property
    def not_stored(self) -> tuple[Column, ...]:
        """Derived columns this dataset lacks (packed before they were declared)."""
        return tuple(c for c in derived() if c.name not in self.manifest.columns)

    @property
    def gap_rows(self) -> int:
        return self.rows - self.manifest.lower_bound_rows

    def to_dict(self) -> dict[str, Any]:
        m = self.manifest
        lb = m.lower_bound_rows
        return {
            "directory": str(self.directory),
            "format": m.format,
            "format_version": m.format_version,
            "tokenizer": m.tokenizer,
            "max_len": m.max_len,
            "algorithm": m.algorithm,
            "seed": m.seed,
            "rounds": m.rounds,
            "long_docs": m.long_docs,
            "counts": m.counts,
            "columns": list(m.columns),
            "columns_not_stored": [c.name for c in self.not_stored],
            "rows": self.rows,
            "tokens": self.tokens,
            "efficiency": m.efficiency,
            "lower_bound_rows": lb,
            "gap_rows": self.gap_rows,
            "gap": self.gap_rows / lb if lb else None,
            "fill": self.fill.__dict__ if self.fill else None,
            "shards": [s.__dict__ for s in m.shards],
            "command": m.command,
        }

    def format(self) -> str:
        m = self.manifest
        tok = m.tokenizer
        lb = m.lower_bound_rows
        gap = f"{self.gap_rows / lb:.2%}" if lb else "n/a"
        lines = [
            f"dataset     {self.directory} ({m.format} v{m.format_version})",
            f"tokenizer   {tok.get('kind')}:{tok.get('name')} (vocab {tok.get('vocab_size'):,}, "
            f"eos {tok.get('eos_id')}, bos {tok.get('bos_id')})",
            f"packing     {m.algorithm}, max_len {m.max_len:,}, seed {m.seed}, rounds {m.rounds}, "
            f"long docs: {m.long_docs}",
            f"columns     {', '.join(m.columns)}",
            *(
                f"            no {c.name} ({c.doc}): packed before packtool stored it; "
                "a repack stores it"
                for c in self.not_stored
            ),
            *_count_lines(m.counts),
            f"rows        {self.rows:,} (lower bound {lb:,}, gap {self.gap_rows:,} = {gap})",
            f"efficiency  {m.efficiency:.2%} ({self.tokens:,} tokens in {self.rows:,} rows of "
            f"{m.max_len:,})",
        ]
        if "tokens_supervised" in m.counts and self.rows:
            sup = m.counts["tokens_supervised"]
            lines.append(
                f"supervised  {sup / (self.rows * m.max_len):.2%} of slots ({sup:,} tokens with "
                "loss_mask 1: the supervised efficiency)"
            )
        if self.fill:
            f = self.fill
            lines += [
                f"fill        min {f.fill_min:.1%}  p50 {f.fill_p50:.1%}  p90 {f.fill_p90:.1%}  "
                f"mean {f.fill_mean:.1%}",
                f"docs/row    min {f.docs_min}  p50 {f.docs_p50:g}  mean {f.docs_mean:.2f}  "
                f"max {f.docs_max}",
            ]
        shards = list(m.shards)
        shown = shards if len(shards) <= 6 else [*shards[:3], None, *shards[-2:]]
        lines.append(f"shards      {len(shards)}")
        for s in shown:
            if s is None:
                lines.append(f"  ... {len(shards) - 5} more")
            else:
                lines.append(
                    f"  {s.file}  {s.rows:,} rows  {s.tokens:,} tokens  {s.bytes / 1e6:.1f} MB"
                )
        return "\n".join(lines)


def _count_lines(counts: dict[str, int]) -> list[str]:
    """The manifest's counts, documents and tokens on lines of their own."""
    groups: dict[str, list[str]] = {"documents": [], "tokens": [], "counts": []}
    for key, value in counts.items():
        head, _, tail = key.partition("_")
        if head in ("documents", "tokens") and tail:
            groups[head].append(f"{tail} {value:,}")
        else:
            groups["counts"].append(f"{key} {value:,}")
    return [f"{name:<12}" + ", ".join(items) for name, items in groups.items() if items]


@dataclass(frozen=True, kw_only=True)
class Inspection:
    """What `packtool inspect` shows: the summary, optionally a row and the pictures written."""

    summary: DatasetSummary
    row: RowView | None = None
    plots: tuple[Path, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "summary": self.summary.to_dict(),
            "row": self.row.to_dict() if self.row else None,
            "plots": [str(p) for p in self.plots],
        }

    def format(self) -> str:
        parts = [self.summary.format()]
        if self.row:
            parts.append(self.row.format())
        parts += [f"wrote {p}" for p in self.plots]
        return "\n".join(parts)


def summarize_dataset(path: str | Path, *, plot_rows: int = PLOT_ROWS) -> DatasetSummary:
    """Read the manifest and the `doc_offsets` column of every shard; measure fill per row.

    Memory is bounded whatever the row count: each shard's row lengths and documents per row
    are folded into counts of their distinct values (at most max_len + 1 of each), from which
    the percentiles are exactly numpy's (holding every row's figures took ~48 bytes a row:
    493 MB at 8.6 M rows)."""
    directory, manifest = open_dataset(path)
    lengths, docs = _Histogram(), _Histogram()
    first_rows: list[NDArray[np.int64]] = []
    for shard in manifest.shards:
        file = directory / shard.file
        pf = None
        try:
            pf = shard_file(file)
            # ParquetFile.read, not pq.read_table: the latter imports pandas (~1 s).
            column = pf.read(columns=["doc_offsets"]).column(0).combine_chunks()
        except (*DAMAGED, LookupError) as exc:
            raise DataError(
                f"{file}: cannot read doc_offsets{_damaged_group(pf, ['doc_offsets'])} "
                f"({one_line(exc)}); run `packtool verify`"
            ) from None
        kind = column.type
        if not (
            (pa.types.is_list(kind) or pa.types.is_large_list(kind))
            and pa.types.is_integer(kind.value_type)
        ):  # list_parts would read it as integers: a TypeError or AttributeError
            raise DataError(
                f"{file}: doc_offsets is {kind}, not a list of integers; run `packtool verify`"
            )
        off_off, off = list_parts(column)
        if len(off_off) - 1 != shard.rows:  # the figures below would mix two datasets
            raise DataError(
                f"{file}: holds {len(off_off) - 1:,} rows, index.json says {shard.rows:,}; the "
                "shard was changed after it was written: run `packtool verify`"
            )
        n_off = np.diff(off_off)
        last = np.zeros(len(n_off), dtype=np.int64)
        has = n_off > 0
        last[has] = off[off_off[1:][has] - 1]
        lengths.add(last)
        docs.add(np.maximum(n_off - 1, 0))
        for i in range(min(len(n_off), plot_rows - len(first_rows))):
            first_rows.append(off[off_off[i] : off_off[i + 1]].astype(np.int64))
    fill = None
    if lengths.n:
        fill = FillStats(
            fill_min=lengths.min() / manifest.max_len,
            fill_p50=lengths.percentile(50) / manifest.max_len,
            fill_p90=lengths.percentile(90) / manifest.max_len,
            fill_mean=lengths.mean() / manifest.max_len,
            docs_min=int(docs.min()),
            docs_p50=docs.percentile(50),
            docs_mean=docs.mean(),
            docs_max=int(docs.max()),
        )
    return DatasetSummary(
        directory=directory,
        manifest=manifest,
        rows=lengths.n,
        tokens=lengths.total(),
        fill=fill,
        first_rows=tuple(first_rows),
    )


def shard_file(file: Path) -> Any:
    """The shard at `file` opened as a `ParquetFile`, once it is known to be a regular file
    (`DataError` else: a FIFO at a shard's name made inspect wait for ever)."""
    kind = storage.what_is_at(file)
    if kind is not None:
        what = "missing" if kind == "nothing" else f"{kind}, not a regular file"
        raise DataError(f"{file}: {what}; run `packtool verify`")
    # Each page's CRC32 checked as it is decoded, as verify and the loader check it: unchecked,
    # a flipped bit in a doc_ids page was shown as another document's id (and its source).
    return storage.parquet_file(file, page_checksum_verification=True)


def _damaged_group(pf: Any, columns: list[str]) -> str:
    """` in row group G` for the first row group of `pf` whose `columns` do not decode (a
    page's CRC32 that does not match), or "" (no file, or none found: the footer itself)."""
    for g in range(pf.num_row_groups if pf is not None else 0):
        try:
            pf.read_row_group(g, columns=columns)
        except (*DAMAGED, LookupError):
            return f" in row group {g}"
    return ""


class _Histogram:
    """Counts of the distinct values of an integer figure, added a shard at a time."""

    def __init__(self) -> None:
        self.values = np.zeros(0, dtype=np.int64)
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, x: NDArray[np.int64]) -> None:
        values, counts = np.unique(x, return_counts=True)
        both = np.concatenate([self.values, values])
        self.values, where = np.unique(both, return_inverse=True)
        self.counts = np.bincount(
            where, weights=np.concatenate([self.counts, counts]), minlength=len(self.values)
        ).astype(np.int64)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def total(self) -> int:
        return int((self.values * self.counts).sum())

    def min(self) -> float:
        return float(self.values[0])

    def max(self) -> float:
        return float(self.values[-1])

    def mean(self) -> float:
        return self.total() / self.n

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile of the values counted."""
        h = (self.n - 1) * q / 100
        lo = int(np.floor(h))
        ends = np.cumsum(self.counts)
        at = self.values[np.searchsorted(ends, [lo, min(lo + 1, self.n - 1)], side="right")]
        return float(at[0] + (h - lo) * (at[1] - at[0]))


def read_row(path: str | Path, row: int, *, manifest: Manifest | None = None) -> RowView:
    """Read global row `row` (0-based across shards, in manifest order) and list its documents.

    Raises:
        ConfigError: `row` is outside 0..rows-1 (the message names the valid range).
    """
    if manifest is None:
        directory, manifest = open_dataset(path)
    else:
        directory = dataset_folder(path)
    total = manifest.num_rows
    if not 0 <= row < total:
        valid = f"0..{total - 1}" if total else "none: the dataset has no rows"
        raise ConfigError(
            f"{option_choice('--row', 'row', row)} is out of range (valid: {valid}; {total:,} rows)"
        )
    starts = np.cumsum([0] + [s.rows for s in manifest.shards])
    i = int(np.searchsorted(starts, row, side="right") - 1)
    shard = manifest.shards[i]
    local = row - int(starts[i])
    file = directory / shard.file
    g = None
    try:
        pf = shard_file(file)
        problem = verify.schema_problem(pf.schema_arrow, manifest)
        if problem is not None:  # a negative id of an int32 column stopped the preview
            raise DataError(f"{file}: {problem}; run `packtool verify`")
        rg_starts = np.cumsum(
            [0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        )
        g = int(np.searchsorted(rg_starts, local, side="right") - 1)
        table = pf.read_row_group(g).slice(local - int(rg_starts[g]), 1)
        values = table.to_pylist()[0]
        missing = [
            c for c in ("input_ids", "doc_offsets", "doc_ids", "doc_chunks") if c not in values
        ]
        if missing:  # a column's name damaged in the footer
            raise LookupError(f"no column {missing[0]}")
    except (*DAMAGED, LookupError) as exc:
        group = f" in row group {g}" if g is not None else ""
        raise DataError(
            f"{file}: cannot read row {local}{group} ({one_line(exc)}); run `packtool verify`"
        ) from None
    ids, offsets, doc_ids, chunks, mask = row_values(values, manifest, f"{file}: row {local}")
    documents = []
    sources = _sources(manifest, doc_ids.tolist(), directory)
    for k, (doc_id, chunk) in enumerate(zip(doc_ids.tolist(), chunks.tolist(), strict=True)):
        start, end = int(offsets[k]), int(offsets[k + 1])
        runs = [] if mask is None else [(a + start, b + start) for a, b in spans(mask[start:end])]
        documents.append(
            RowDocument(
                doc_id=int(doc_id),
                chunk=int(chunk),
                start=start,
                length=end - start,
                preview=preview(ids[start:end], manifest.tokenizer),
                supervised=None if mask is None else int(mask[start:end].sum()),
                spans=tuple(runs),
                supervised_preview=preview(ids[runs[0][0] : runs[0][1]], manifest.tokenizer)
                if runs
                else "",
                source=sources[k],
            )
        )
    return RowView(
        row=row,
        file=shard.file,
        shard_row=local,
        length=len(ids),
        max_len=manifest.max_len,
        doc_offsets=offsets,
        documents=tuple(documents),
        mask_strip="" if mask is None else mask_strip(mask, offsets),
    )


def _sources(manifest: Manifest, doc_ids: list[int], directory: Path) -> list[str]:
    """`docids.places` of a row's documents (one scan per input file), or "" each when the
    dataset's ids do not encode their source."""
    from packtool.read import docids

    if (manifest.extra.get("doc_ids") or {}).get("scheme") != docids.SCHEME:
        return [""] * len(doc_ids)
    try:
        return docids.places(manifest.extra, doc_ids, directory)
    except DataError as exc:  # said, not left out: an edited sources.json
        return [f"unknown ({exc})"] * len(doc_ids)


def mask_strip(mask: NDArray, offsets: NDArray[np.int64], width: int = STRIP_CHARS) -> str:
    """A row's loss mask in at most `width` characters (see `RowView.mask_strip`)."""
    n = len(mask)
    if n == 0:
        return ""
    edges = np.linspace(0, n, min(width, n) + 1).astype(np.int64)
    sums = segment_sums(mask, edges)
    chars = np.where(sums > 0, "#", ".").astype(object)
    starts = np.searchsorted(edges, offsets[1:-1], side="right") - 1
    chars[starts[starts < len(chars)]] = "|"
    return "".join(chars)


def preview(ids: NDArray[np.int64], tokenizer: dict[str, Any]) -> str:
    """Decoded start of a document for the byte tokenizer, else its first token ids."""
    if tokenizer.get("kind") == "byte":
        specials = {tokenizer.get("eos_id"), tokenizer.get("bos_id")}
        head = (int(t) for t in ids[: PREVIEW_CHARS * 4])  # any id: out of range ones left out
        data = bytes(t for t in head if 0 <= t < 256 and t not in specials)
        text = data.decode("utf-8", errors="replace")
        more = len(text) > PREVIEW_CHARS or len(ids) > PREVIEW_CHARS * 4
        return repr(text[:PREVIEW_CHARS]) + ("..." if more else "")
    head = " ".join(str(int(t)) for t in ids[:PREVIEW_IDS])
    return f"[{head}{' ...' if len(ids) > PREVIEW_IDS else ''}]"


def plot_paths(plot: str | Path, row: int | None) -> tuple[Path, Path | None]:
    """FILE.png for the row fill and, with a row, FILE-row-N.png for its attention mask."""
    plot = Path(plot)
    mask = plot.with_name(f"{plot.stem}-row-{row}{plot.suffix}") if row is not None else None
    return plot, mask


def inspect_dataset(
    path: str | Path,
    *,
    row: int | None = None,
    plot: str | Path | None = None,
    plot_rows: int = PLOT_ROWS,
) -> Inspection:
    """Summarise a packed dataset; optionally show one row and draw pictures.

    Args:
        path: The dataset folder (with `index.json`), or its `index.json`.
        row: A global row index to list the documents of (0-based across shards).
        plot: Write the row-fill picture here (PNG); with `row`, also `STEM-row-N.png` holding
            that row's block-diagonal causal attention mask.
        plot_rows: Rows drawn in the row-fill picture.
    """
    if plot_rows < 1:
        raise ConfigError(f"plot_rows must be >= 1, got {plot_rows}")
    summary = summarize_dataset(path, plot_rows=plot_rows)
    view = read_row(path, row, manifest=summary.manifest) if row is not None else None
    written: list[Path] = []
    if plot is not None:
        from packtool.stats.plots import plot_attention_mask, plot_row_fill

        fill_path, mask_path = plot_paths(plot, row)
        written.append(
            plot_row_fill(
                summary.first_rows,
                summary.manifest.max_len,
                fill_path,
                title=f"{summary.directory}: first {len(summary.first_rows)} of "
                f"{summary.rows:,} rows (max_len {summary.manifest.max_len:,})",
            )
        )
        if view is not None and mask_path is not None:
            written.append(
                plot_attention_mask(
                    view.doc_offsets,
                    mask_path,
                    title=f"row {view.row}: causal mask, {len(view.documents)} documents, "
                    f"{view.length:,} tokens",
                )
            )
    return Inspection(summary=summary, row=view, plots=tuple(written))
