"""The tokenize stage: any input -> tokenized tables, and `packtool tokenize`.

`tokenize.tokenized_batches` is what `stats` and the engines call: it classifies the inputs
(raw text, fine-tuning records, token ids made elsewhere, `packtool tokenize` output) and
yields tables of the tokenized schema from each. `tokenize.tokenize_corpus` is the `tokenize`
command: the same tables written as tokenized Parquet through the output transaction.
`pieces.py` reads one partition's pieces (byte and row-group ranges) the same way.

Records in: paths, a `ReadConfig`, a `Tokenizer`. Out: pyarrow tables of the tokenized schema
(packtool/dataset/tokenized.py); tokenized Parquet files.
May import: every stage below it: top-level modules, `storage`, `dataset`, `pack`, `mixture`,
`read`, `tokenizer`, `sft`.

Modules:
- `tokenize.py`: the inputs' classification, the tables, the `tokenize` command.
- `pieces.py`: a partition's pieces as tokenized tables.
"""
