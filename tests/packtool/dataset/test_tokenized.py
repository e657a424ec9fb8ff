"""The tokenized-Parquet format's shared reading: the inputs' common tokenizer, their lengths."""

from __future__ import annotations

from pathlib import Path

import pytest

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized import common_identity
from packtool.errors import DataError

BYTE = TokenizerIdentity(
    kind="byte", name="byte", vocab_size=258, eos_id=256, bos_id=None, sha256="a" * 64
)


def _meta(identity: TokenizerIdentity) -> dict:
    return {"tokenizer": identity.to_dict()}


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # Only the BOS differed: both sides read "byte:byte, vocab 258, eos 256", the same.
        ({"bos_id": 5}, "byte:byte (vocab 258, eos 256, bos 5), unlike a.parquet (byte:byte, "
         "vocab 258, eos 256, bos none); they differ in bos_id"),
        ({"sha256": "b" * 64}, "byte:byte (vocab 258, eos 256, bos none, sha256 bbbbbbbbbbbb), "
         "unlike a.parquet (byte:byte, vocab 258, eos 256, bos none, sha256 aaaaaaaaaaaa); "
         "they differ in sha256"),
        ({"eos_id": None, "bos_id": 1}, "byte:byte (vocab 258, eos none, bos 1), unlike "
         "a.parquet (byte:byte, vocab 258, eos 256, bos none); they differ in eos_id, bos_id"),
    ],
)  # fmt: skip
def test_a_tokenizer_mismatch_names_what_differs(change, said):
    from dataclasses import replace

    other = replace(BYTE, **change)
    with pytest.raises(DataError) as info:
        common_identity([(Path("a.parquet"), _meta(BYTE)), (Path("b.parquet"), _meta(other))])
    assert str(info.value) == f"b.parquet: tokenized with {said}"


def test_another_name_or_engine_is_the_same_tokenizer():
    from dataclasses import replace

    other = replace(BYTE, name="elsewhere/byte", engine="byte")
    assert common_identity([(Path("a"), _meta(BYTE)), (Path("b"), _meta(other))]) == BYTE
