"""The figures: a write that fails names the plot file."""

from __future__ import annotations

import errno
import os

import pytest

from packtool.errors import DataError
from packtool.stats.plots import plot_attention_mask, plot_length_histogram, plot_row_fill

DRAW = {
    "histogram": lambda path: plot_length_histogram([3, 9, 40], 16, path),
    "row_fill": lambda path: plot_row_fill([[0, 3, 9]], 16, path),
    "attention_mask": lambda path: plot_attention_mask([0, 3, 9], path),
}


@pytest.fixture
def full_disk(monkeypatch):
    """The disk fills up part-way through the picture: some bytes written, then ENOSPC."""
    from matplotlib.figure import Figure

    def savefig(self, fname, **kwargs):
        if isinstance(fname, (str, os.PathLike)):
            with open(fname, "wb") as f:
                f.write(b"\x89PNG partial")
        else:
            fname.write(b"\x89PNG partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", savefig)


@pytest.mark.parametrize("plot", sorted(DRAW))
def test_a_plot_that_cannot_be_written_names_its_file_and_keeps_the_old_one(
    tmp_path, plot, full_disk
):
    # A full disk said "error: No space left on device", naming no file, after the report of
    # a long pass over the corpus; and it overwrote a good picture of that name with a
    # truncated one (the figure was saved in place; audit repro_plot_full.sh).
    path = tmp_path / "p.png"
    path.write_bytes(b"the good picture")
    with pytest.raises(DataError) as info:
        DRAW[plot](path)
    assert str(info.value) == f"plot file {str(path)!r}: not written (No space left on device)"
    assert path.read_bytes() == b"the good picture"
    assert sorted(os.listdir(tmp_path)) == ["p.png"]  # no temporary left


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
@pytest.mark.parametrize("plot", sorted(DRAW))
def test_a_plot_replaces_the_old_one_whole_in_its_format(tmp_path, plot, suffix):
    path = tmp_path / f"p{suffix}"
    path.write_bytes(b"an older picture")
    DRAW[plot](path)
    head = path.read_bytes()[:8]
    assert head.startswith({".png": b"\x89PNG", ".svg": b"<?xml", ".pdf": b"%PDF"}[suffix])
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_row_fill_of_no_rows_draws_a_note_without_a_warning(tmp_path):
    # A 0-row dataset (verify says OK) made `inspect --plot` print matplotlib's "Attempting to
    # set identical low and high ylims" UserWarning and its source line (audit
    # repro_empty_plot.sh): set_ylim(n - 0.5, -0.5) with n = 0.
    import warnings

    from matplotlib.figure import Figure

    texts: list[str] = []
    real_savefig = Figure.savefig

    def savefig(self, fname, **kwargs):
        texts.extend(t.get_text() for ax in self.axes for t in ax.texts)
        return real_savefig(self, fname, **kwargs)

    path = tmp_path / "empty.png"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(Figure, "savefig", savefig)
            assert plot_row_fill([], 16, path) == path
    assert path.read_bytes()[:8].startswith(b"\x89PNG")
    assert texts == ["no rows"]
