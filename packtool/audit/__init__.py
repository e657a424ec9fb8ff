"""Audit: `packtool verify` and `packtool inspect`, a finished dataset checked and shown.

`verify` re-reads every shard against `index.json` and the shard contract (checksums, row and
token counts, offsets, optional columns, each document exactly once); `inspect` shows what a
dataset holds, one row's documents, and pictures of both. Neither changes a byte.

Records in: a dataset folder. Out: a `VerifyReport` / the text and figures of `inspect`.
May import: every stage below it (top-level modules, `storage`, `dataset`, `pack`, `mixture`,
`read`, `tokenizer`, `sft`, `tokenize`, `stats`).

Modules:
- `verify.py`: the whole-dataset checks.
- `verify_columns.py`: the per-row checks of the declared optional columns.
- `inspect.py`: `packtool inspect`.
"""
