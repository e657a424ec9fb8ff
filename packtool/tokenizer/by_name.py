"""A tokenizer given to an API function by name, loaded with the caller's BOS choice.

The functions that take `tokenizer` as a `Tokenizer` or a spec string (`compute_stats`,
`tokenize_corpus`, `tokenized_batches`, `run_pack` and its engines, `tokenize_megatron`) also
take `bos`, which reaches `load_tokenizer` when they load the spec: the Python form of
`--bos-id N` (an int), `--bos-id default` ("default") and `--no-bos` (None); "auto", the default,
is the tokenizer's own rule. A tokenizer whose post-processor puts several ids before a text
(GLM-4's `[gMASK] <sop>`) is refused by that rule, and `bos` is how a caller chooses.
"""

from __future__ import annotations

from typing import Any

from packtool.errors import ConfigError
from packtool.tokenizer.tokenizers import Tokenizer, load_tokenizer

AUTO = "auto"


def tokenizer_by_name(tokenizer: Any, bos: int | str | None = AUTO, **options: Any) -> Any:
    """`load_tokenizer(tokenizer, bos=bos, **options)` for a spec string; anything else as it is.

    Raises:
        ConfigError: `bos` chosen for a tokenizer that is not given by name (a `Tokenizer`
            carries its own BOS: choose it where it is loaded), or as `load_tokenizer`.
    """
    if isinstance(tokenizer, str):
        return load_tokenizer(tokenizer, bos=bos, **options)
    if bos != AUTO and isinstance(tokenizer, Tokenizer):
        raise ConfigError(
            f"bos={bos!r} applies to a tokenizer given by name; this Tokenizer was loaded with "
            f"bos id {tokenizer.identity.bos_id}: pass bos to load_tokenizer instead"
        )
    return tokenizer
