"""Fine-tuning data: records and chat templates -> texts, supervised spans, tokens.

Prompt/completion, `messages` and ShareGPT records (JSONL or Parquet) are classified, rendered
with the model's chat template exactly as transformers renders it (jinja2's sandbox), and
tokenized with a loss mask over the assistant turns (or the last one, or everything), so a
packed row never trains on a prompt.

Records in: records from files (`inputs.py`), an `SFTConfig`, a `Tokenizer`. Out: tables of
the tokenized schema with a `loss_mask` column (`encode.py`).
May import: packtool's top-level modules, `storage`, `dataset`, `pack`, `mixture`, `read`,
`tokenizer`.

Modules:
- `inputs.py`: what kind a dataset is; its records as prompts or conversations.
- `template.py`, `turns.py`, `render.py`: chat templates, assistant spans, rendering in a pool.
- `tokens.py`: rendered conversations -> ids and the loss mask.
- `encode.py`: records -> tokenized tables.
"""
