"""Reading: corpus files -> batches of documents, each a counted skip or an error when bad.

Plain text, JSONL (and `.json` arrays), Parquet, each also `.gz` / `.zst`; files, folders and
globs (through `packtool.storage`); whole files or byte ranges / row-group ranges of one, for
partition workers. Document ids are file index + offset (`docids.py`), unique across files
without remembering any. Token ids made elsewhere (`pretokenized.py`) and `packtool tokenize`
output read back as input (`tokenized.py`) come in here too.

Records in: paths and a `ReadConfig`. Out: `DocumentBatch`es (texts, sources, extra fields,
doc ids), or tokenized tables for inputs that already hold ids.
May import: packtool's top-level modules, `storage`, `dataset`, `pack`, `mixture`.

Modules:
- `corpus.py`: `read_corpus`, `expand_inputs`; `documents.py`: `ReadConfig`, `DocumentBatch`.
- `formats.py`: the format registry; `text.py`, `jsonl.py`, `parquet.py`: one reader each.
- `compressed.py`, `lines.py`: one byte stream from plain, gzip or zstd; a byte range's lines.
- `docids.py`, `sft_config.py`: document ids; how fine-tuning records are read.
- `pretokenized.py`, `tokenized.py`: inputs that already hold token ids.
"""
