"""The loss-mask side of `packtool stats`: figures for what `pack` does with masked data."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from packtool.errors import ConfigError
from packtool.stats.lengths import StatsConfig, compute_stats
from packtool.stats.report import render_report
from tests.cli import one_error_line, run


def test_the_masked_bound_is_on_the_kept_lengths_as_packs(tmp_path):
    # Three documents of 10 tokens at max length 8: split, 30 tokens need 4 rows at least; pack
    # truncates masked data (8 tokens kept of each), so it packs 3 rows, and its bound says 3.
    # stats printed only the split bound (L1 4, L2 4) above its own 3 masked rows.
    path = tmp_path / "sft.parquet"
    ids = [list(range(1, 11))] * 3
    labels = [[-100, *d[1:]] for d in ids]
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), path)
    s = compute_stats([path], StatsConfig(max_len=8, candidates=(8, 16)))
    assert (s.lower_bound_l1, s.lower_bound_l2) == (4, 4)  # the plain figures: split
    at = s.supervised.at[8]
    assert (at.rows, at.lower_bound_l1, at.lower_bound_l2) == (3, 3, 3)
    assert (s.supervised.at[16].lower_bound_l1, s.supervised.at[16].lower_bound_l2) == (2, 3)
    d = json.loads(json.dumps(s.to_dict()))
    assert d["lower_bound_rows"] == {"l1": 4, "l2": 4}  # kept as it was
    assert d["supervised"]["at"]["8"]["lower_bound_rows"] == {"l1": 3, "l2": 3}
    assert d["supervised"]["at"]["8"]["rows"] == 3
    report = render_report(s)
    assert "  lower bound (if split)  L1 4  L2 4\n" in report
    assert "  FFD packing (if split)  4 rows," in report
    assert "  masked: lower bound     L1 3  L2 3\n" in report
    assert "lower bound on rows" not in report
    code, out, err = run("pack", path, "-o", tmp_path / "out", "--max-len", 8, "--json")
    assert code == 0, err
    packed = json.loads(out)
    assert (packed["counts"]["rows"], packed["lower_bound_rows"]) == (3, 3)


def test_plain_data_keeps_its_unqualified_bound(tmp_path):
    path = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"input_ids": [list(range(1, 11))] * 3}), path)
    s = compute_stats([path], StatsConfig(max_len=8, candidates=(8,)))
    assert s.supervised is None
    report = render_report(s)
    assert "  lower bound on rows     L1 4  L2 4\n" in report and "(if split)" not in report


def _three_masked(tmp_path):
    path = tmp_path / "sft.parquet"
    ids = [list(range(1, 11))] * 3
    pq.write_table(pa.table({"input_ids": ids, "labels": [[-100, *d[1:]] for d in ids]}), path)
    return path


def test_masked_data_takes_truncate_and_refuses_drop_which_is_not_modelled(tmp_path, monkeypatch):
    path = _three_masked(tmp_path)
    s = compute_stats([path], StatsConfig(max_len=8, candidates=(8,), long_docs="truncate"))
    assert (s.packed_tokens, s.ffd_rows, s.lower_bound_l2) == (24, 3, 3)  # as pack packs it
    report = render_report(s)
    assert "  lower bound (truncated) L1 3  L2 3\n" in report
    assert "  FFD packing (truncated) 3 rows," in report and "(if split)" not in report
    assert "  masked: FFD, truncated  3 rows," in report  # the masked model as it was
    # drop is refused before the corpus is read (a loss mask found, nothing counted yet)
    monkeypatch.setattr("packtool.stats.supervised.SupervisedCounter.add", None)
    with pytest.raises(ConfigError, match="^dropping long documents is not modelled for data "):
        compute_stats([path], StatsConfig(max_len=8, long_docs="drop"))
    code, out, err = run("stats", path, "--max-len", 8, "--long-docs", "drop")
    assert code == 1 and "models truncate (pack's default for it)" in one_error_line(err)
