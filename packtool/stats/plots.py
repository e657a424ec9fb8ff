"""Pictures for people: each function draws one figure into a PNG file.

matplotlib is imported inside each function (with the non-interactive Agg backend), so importing
packtool stays fast and works without a display. Functions here are independent of each other.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from packtool.errors import ConfigError, DataError, MissingDependencyError, option_choice
from packtool.storage import local as storage
from packtool.storage import writing


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a core dependency
        raise MissingDependencyError(
            f"{option_choice('--plot', 'plot', 'PATH')} needs matplotlib: pip install "
            "matplotlib (or reinstall packtool)"
        ) from None
    return plt


SUFFIXES = (".png", ".svg", ".pdf")


def check_plot_path(path: str | os.PathLike) -> Path:
    """`path` as a `Path` if a figure can be written there (a known image suffix, an existing
    folder), else `ConfigError`: the CLI checks it before a long pass over the corpus."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ConfigError(
            f"plot file {str(path)!r}: unsupported image type {path.suffix or '(none)'!r}; "
            f"use one of {', '.join(SUFFIXES)}"
        )
    if not storage.exists(path.parent):
        raise ConfigError(f"plot file {str(path)!r}: folder {str(path.parent)!r} does not exist")
    return path


def _save(fig: Any, path: Path) -> None:
    """`fig.savefig` into `path`, whole or not at all (`writing.atomic_output`: a full disk left
    a good picture of that name truncated); a write that fails (a full disk, no permission) is
    a `DataError` naming the plot file (matplotlib's OSError named none: "error: No space left
    on device")."""
    try:
        with writing.atomic_output(path) as f:
            fig.savefig(f, format=path.suffix[1:].lower())
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise DataError(f"plot file {str(path)!r}: not written ({why})") from None


def plot_length_histogram(
    lengths: ArrayLike,
    max_len: int,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    bins_per_octave: int = 4,
) -> Path:
    """Histogram of document lengths on a log2 axis, with `max_len` marked.

    Args:
        lengths: Document lengths in tokens.
        max_len: The row length, drawn as a vertical line.
        path: Where to write the picture (.png, .svg or .pdf).
        title: Figure title (default: counts and max length).
        bins_per_octave: Histogram bins per doubling of length.

    Returns:
        The path written.
    """
    path = check_plot_path(path)
    arr = np.asarray(lengths, dtype=np.int64)
    pos = arr[arr > 0]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        hi = max(int(pos.max()) if pos.size else 1, max_len) * 1.05
        lo = np.floor(np.log2(pos.min())) if pos.size else 0.0
        n_bins = int(np.ceil((np.log2(hi) - lo) * bins_per_octave)) + 1
        bins = np.logspace(lo, np.log2(hi), n_bins, base=2)
        ax.hist(pos, bins=bins, color="#4477aa", edgecolor="white", linewidth=0.5)
        ax.set_xscale("log", base=2)
        ax.axvline(max_len, color="#cc3311", linestyle="--", linewidth=1.5)
        longer = int((arr > max_len).sum())
        ax.text(
            max_len,
            ax.get_ylim()[1] * 0.95,
            f" max_len {max_len:,}\n {longer:,} longer",
            color="#cc3311",
            va="top",
        )
        ax.set_xlabel("document length (tokens, log2 scale)")
        ax.set_ylabel("documents")
        ax.set_title(title or f"{arr.size:,} documents, {int(arr.sum()):,} tokens")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


def plot_row_fill(
    rows: Sequence[ArrayLike],
    max_len: int,
    path: str | os.PathLike,
    *,
    title: str | None = None,
) -> Path:
    """Packed rows as horizontal bars: one colour per document, white where the row is padding.

    Args:
        rows: Each row's `doc_offsets` (its cu_seqlens: 0, ..., row length).
        max_len: The row length (the x axis).
        path: Where to write the picture (.png, .svg or .pdf).
        title: Figure title.

    Returns:
        The path written.
    """
    path = check_plot_path(path)
    plt = _pyplot()
    n = len(rows)
    fig, ax = plt.subplots(figsize=(9, max(2.5, min(12, 0.12 * n + 1.5))), dpi=100)
    try:
        colours = plt.get_cmap("tab20").colors
        for y, offsets in enumerate(rows):
            off = np.asarray(offsets, dtype=np.int64)
            # one broken_barh call per row: a 32k-token row with many documents stays cheap
            spans = list(zip(off[:-1].tolist(), np.diff(off).tolist(), strict=True))
            ax.broken_barh(
                spans,
                (y - 0.4, 0.8),
                facecolors=[colours[(y + i) % len(colours)] for i in range(len(spans))],
                edgecolor="none",
            )
        ax.set_xlim(0, max_len)
        # no rows: keep a one-row-high axis (matplotlib warns on identical y limits) with a note
        ax.set_ylim(max(n, 1) - 0.5, -0.5)
        if n == 0:
            ax.text(max_len / 2, 0, "no rows", ha="center", va="center", color="#666666")
        ax.set_xlabel("token position in row")
        ax.set_ylabel("row")
        ax.set_title(title or f"{n} rows, max_len {max_len:,}")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
    return path


def plot_attention_mask(
    doc_offsets: ArrayLike,
    path: str | os.PathLike,
    *,
    title: str | None = None,
    max_pixels: int = 512,
) -> Path:
    """A row's block-diagonal causal attention mask (query x key), sampled to `max_pixels`.

    Args:
        doc_offsets: The row's cu_seqlens (0, ..., row length).
        path: Where to write the picture (.png, .svg or .pdf).
        title: Figure title.
        max_pixels: Longer rows are sampled down to this many positions per side.

    Returns:
        The path written.
    """
    path = check_plot_path(path)
    off = np.asarray(doc_offsets, dtype=np.int64)
    length = int(off[-1]) if off.size else 0
    # sample positions instead of materialising a length x length mask
    pos = np.unique(
        np.linspace(0, max(length - 1, 0), min(max(length, 1), max_pixels)).astype(np.int64)
    )
    doc = np.searchsorted(off, pos, side="right") - 1
    mask = (doc[:, None] == doc[None, :]) & (pos[None, :] <= pos[:, None])  # (query, key)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6), dpi=100)
    try:
        ax.imshow(
            np.ma.masked_where(~mask, np.broadcast_to(doc[:, None] % 20, mask.shape)),
            cmap="tab20b",
            interpolation="nearest",
            extent=(0, length, length, 0),
        )
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
        ax.set_title(title or f"causal mask, {max(off.size - 1, 0)} documents, {length:,} tokens")
        fig.tight_layout()
        _save(fig, path)
    finally:
        plt.close(fig)
    return path
