"""The figures: a write that fails names the plot file."""

from __future__ import annotations

import os

import pytest

from packtool.errors import DataError
from packtool.stats.plots import plot_attention_mask, plot_length_histogram, plot_row_fill


@pytest.mark.parametrize("plot", ["histogram", "row_fill", "attention_mask"])
def test_a_plot_that_cannot_be_written_names_its_file(tmp_path, plot):
    # A full disk (here /dev/full behind the name) said "error: No space left on device",
    # naming no file, after the report of a long pass over the corpus.
    path = tmp_path / "full.png"
    os.symlink("/dev/full", path)
    draw = {
        "histogram": lambda: plot_length_histogram([3, 9, 40], 16, path),
        "row_fill": lambda: plot_row_fill([[0, 3, 9]], 16, path),
        "attention_mask": lambda: plot_attention_mask([0, 3, 9], path),
    }[plot]
    with pytest.raises(DataError) as info:
        draw()
    assert str(info.value) == f"plot file {str(path)!r}: not written (No space left on device)"
