"""Length statistics: what a corpus's lengths mean for packing, before packing it.

Percentiles, the padding waste of padded batches, the Gini coefficient, lower bounds on rows
and the projected result of packing at several max lengths (the packer's own kernels run on
the lengths), a suggested max length, and for data with a loss mask the supervised share.
`packtool stats` prints `report.render_report(stats)`; `plots.py` draws the histograms.

Records in: token lengths (from `packtool.tokenize`). Out: `LengthStats` (JSON-friendly) and
its text report; PNG figures.
May import: packtool's top-level modules, `storage`, `dataset`, `pack`, `mixture`, `read`,
`tokenizer`, `sft`, `tokenize`.

Modules:
- `lengths.py`: `compute_stats`, `LengthStats`, the figures at each max length.
- `candidates.py`: a candidate max length's figures and the rule that suggests one.
- `policy.py`: the pieces `pack --long-docs split|truncate|drop` packs, from the lengths.
- `supervised.py`: the loss-mask side of the statistics.
- `bounds.py`: L1 and L2 from a histogram of lengths (both of the above, and the engines).
- `report.py`: the text report; `plots.py`: the figures.
"""
