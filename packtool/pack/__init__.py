"""Packing: tokenized documents -> packed rows, pure and per chunk.

The numba bin-packing kernels (first-fit-decreasing, best-fit-decreasing) on plain arrays,
wrapped by `chunk.pack_table`, which packs one chunk of documents into rows of at most max_len
tokens, repacks in seeded rounds, applies the long-document policy and hands its least-filled
rows on as a tail so chunk ends cost no rows. No I/O here: tables in, tables out.

Records in: a tokenized table (`doc_id`, `input_ids`, `length`, optional columns). Out: a
`PackedChunk` whose rows follow docs/CONTRACTS.md's shard layout.
May import: packtool's top-level modules, `storage`, `dataset` (the columns).

Modules:
- `kernels.py`, `limits.py`, `warmup.py`: the kernels, their bounds (no numba), their warm-up.
- `segments.py`: documents cut into pieces, pieces gathered and summed (numba).
- `jit.py`: the kernels' decorator; numba is imported at the first kernel call, not at import.
- `chunk.py`: one chunk packed (`PackConfig`, `pack_table`, `PackCounts`); `repack.py`: its rounds.
- `columns.py`: the optional columns (loss mask) that move with `input_ids`.
- `tail.py`, `rows.py`, `flat_ids.py`: tails, packed rows gathered on demand, flat id arrays.
- `reference.py`: plain-Python references the tests hold the kernels to.
"""
