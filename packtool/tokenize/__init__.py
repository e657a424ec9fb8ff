"""The tokenize stage: any input -> tokenized tables, and `packtool tokenize`.

`tables.partition_tables` is the one place any input becomes tables of the tokenized schema:
raw text read and encoded, fine-tuning records rendered, encoded and masked, token ids made
elsewhere checked, `packtool tokenize` output read back; for a list of pieces (whole files, byte
ranges, row groups), ids `docids.encode(file index, offset)` for every kind.
`tokenize.inputs_read` classifies the inputs once; `tokenize.tokenized_batches` (and
`read_tables`, what `stats` calls with the inputs it classified) hands a whole corpus to the
dispatch, the engines' workers a partition's pieces.
`tokenize.tokenize_corpus` is the `tokenize` command: the same tables written as tokenized
Parquet through the output transaction.

Records in: paths, a `ReadConfig`, a `Tokenizer`. Out: pyarrow tables of the tokenized schema
(packtool/dataset/tokenized.py); tokenized Parquet files.
May import: every stage below it: top-level modules, `storage`, `dataset`, `pack`, `mixture`,
`read`, `tokenizer`, `sft`.

Modules:
- `tables.py`: the dispatch (the modes, `Source`, `FilePiece`, `partition_tables`).
- `tokenize.py`: the inputs' classification, `tokenized_batches`, the `tokenize` command.
- `recorded.py`: the tokenizer tokenized Parquet records, against the options' (EOS / BOS).

`tokenize --to megatron` runs on the partition engines (packtool/engines/megatron/run.py): the
same tables, partition by partition, into a Megatron indexed dataset.
"""
