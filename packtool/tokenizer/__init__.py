"""The tokenizer: text -> token ids, exact and fast, behind one interface.

`load_tokenizer` resolves a name (`byte`, a tokenizer.json, a folder, `org/model`, a tiktoken
ranks file, a SentencePiece model) to files, picks the fastest engine that loads it and proves
the reference library's ids on a probe text (fastokens or gigatoken, else the reference), returns a
`Tokenizer` whose `encode_batch` adds BOS/EOS. Engines never change ids.

Records in: texts. Out: flat id arrays plus per-document lengths; a `TokenizerIdentity`
(packtool/dataset/identity.py) that datasets record.
May import: packtool's top-level modules, `storage`, `dataset`, `pack`, `mixture`, `read`.

Modules:
- `tokenizers.py`: `Tokenizer`, `load_tokenizer`, the special-token defaults.
- `engines.py`: the engine registry (fastest first) and each engine's encoder.
- `choice.py`: which engine encodes a tokenizer (the probe self-check).
- `engine_checks.py`: self-checks already passed, recorded per tokenizer and engine.
- `files.py`: tokenizer names as people write them, resolved to files.
- `specials.py`: the tokenizer's own BOS / EOS rule, and the defaults `load_tokenizer` takes.
- `by_name.py`: a tokenizer an API function is given by name, loaded with the caller's `bos`.
"""
