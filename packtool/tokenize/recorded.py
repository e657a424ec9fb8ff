"""The tokenizer tokenized Parquet records, against the one the options give.

Tokenized Parquet is read with the tokenizer it records (packtool/dataset/tokenized.py): a
`--tokenizer` or EOS / BOS option given for it only has to agree with it.

- The EOS and BOS the user did not choose (`Tokenizer.chosen_specials`: no `--eos-id`,
  `--no-eos`, `--bos-id`, `--no-bos`) are the file's, and a note says so. A file of
  pre-tokenized ids records none (`tokenize.unchanged_ids`), so `pack` of it with the
  `--tokenizer` that made it was refused ("eos None, bos None ... but the options give ... eos
  1, bos 0; pass the same --tokenizer/--eos-id/--bos-id"), which the user had done.
- Without `--tokenizer`, the EOS / BOS options are compared with the recorded ids alone
  (`check_recorded_specials`); they were applied to `byte`, the default, and `--eos-id 1
  --bos-id 0`, exactly what the file records, was refused as another tokenizer.
- A real difference is a `DataError` whose hint names the choices that read the file as it is,
  as the CLI's flag and the Python argument (`--no-bos / bos=None`): the API's functions
  (`tokenized_batches`, `compute_stats`, `run_pack`, ...) raise the same line, and a Python
  caller told "pass --no-bos" had no flag to pass.
- The line names the first input as the user gave it (`tok`), at every command: until
  2026-12-07 `tokenize` and `stats` named the first part file (`tok/part-00000.parquet`),
  `pack` and `tokenize --to megatron` the input, so the same mistake read two ways.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized import common_identity, split_tokenized
from packtool.errors import ConfigError, DataError
from packtool.read.corpus import expand_inputs
from packtool.storage import local as storage
from packtool.tokenizer.specials import special_choice
from packtool.tokenizer.tokenizers import Tokenizer

SPECIALS = ("eos", "bos")


ENGINE_IGNORED = (
    "warning: the inputs are tokenized Parquet; nothing is encoded, so --tokenizer-engine / "
    "engine= is ignored"
)
"""Said where a tokenizer engine was chosen for inputs whose ids are already there (the
tokenizer given beside them is only compared with the one they record)."""


def inputs_recorded(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
) -> tuple[str, TokenizerIdentity] | None:
    """The first input as given (what a line about them names) and the tokenizer all of them
    record (None when the inputs are raw)."""
    given = storage.input_list(inputs)
    tokenized, _ = split_tokenized(expand_inputs(given))
    return (storage.input_text(given[0]), common_identity(tokenized)) if tokenized else None


def check_recorded_tokenizer(
    identity: TokenizerIdentity, tokenizer: Tokenizer, where: str | os.PathLike
) -> Tokenizer | None:
    """`tokenizer` where it is the tokenizer `identity` records; None where it is once the EOS
    and BOS it was not given by choice are the recorded ones (the file is then read with its
    recorded tokenizer, as without `--tokenizer`; a note on stderr says so).

    Raises:
        DataError: another tokenizer, or an EOS / BOS chosen unlike the recorded one (naming
            both, and the flags that match the file).
    """
    own = tokenizer.identity
    if own.matches(identity):
        return tokenizer
    specials = {w: getattr(identity, f"{w}_id") for w in SPECIALS}
    specials.update({w: getattr(own, f"{w}_id") for w in tokenizer.chosen_specials})
    given = _with(own, tokenizer.base_vocab, specials)  # what the options give for the file
    if given.matches(identity):
        taken = [w for w in SPECIALS if getattr(own, f"{w}_id") != specials[w]]
        print(
            f"note: {where} records {_ids(identity, taken)}, not this tokenizer's "
            f"{_ids(own, taken)}: read with the recorded ones (an EOS / BOS chosen by "
            f"{special_choice('eos', 'N')}, {special_choice('eos', None)}, "
            f"{special_choice('bos', 'N')} or {special_choice('bos', None)} must match them)",
            file=sys.stderr,
            flush=True,
        )
        return None
    recorded = {w: getattr(identity, f"{w}_id") for w in SPECIALS}
    if _with(own, tokenizer.base_vocab, recorded).matches(identity):  # the same file
        flags = [special_choice(w, recorded[w]) for w in SPECIALS if specials[w] != recorded[w]]
        hint = (
            f"pass {' and '.join(flags)} (what the file records) or leave the EOS/BOS options out"
        )
    else:  # another tokenizer: as it is loaded
        given = own
        hint = (
            "leave --tokenizer out / pass tokenizer=None (the file is read with the tokenizer "
            "it records), or re-tokenize the raw corpus"
        )
    raise DataError(
        f"{where}: tokenized with {_described(identity)}, but the options give "
        f"{_described(given)}; {hint}"
    )


def recorded_check(
    read: Any, tokenizer: Tokenizer | None, bos: int | str | None, where: str | os.PathLike
) -> Tokenizer | None:
    """`tokenizer` for inputs `read` (`tokenize.InputsRead`) once checked against the tokenizer
    tokenized Parquet records (`check_recorded_tokenizer`: None where the inputs are read with
    their recorded one); other inputs have nothing to check. `where`: the first input as given.

    With `tokenizer` None, `bos` given to the API (`"auto"`: none) is checked as the CLI checks
    `--bos-id` there (`check_recorded_specials`): no tokenizer is loaded to apply another (it
    was ignored, and bos_id None recorded, until 2026-12-07).
    """
    identity = read.identity()
    if identity is None:
        return tokenizer
    if tokenizer is None:
        check_recorded_specials(identity, {} if bos == "auto" else {"bos": bos}, where)
        return None
    warn_engine_unused(tokenizer)
    return check_recorded_tokenizer(identity, tokenizer, where)


def warn_engine_unused(tokenizer: Tokenizer) -> None:
    """`ENGINE_IGNORED` on stderr where `tokenizer` was loaded with an engine chosen and the
    inputs are tokenized Parquet (the caller's to know), before the run's checks; once per
    tokenizer (`tokenize_corpus` checks it twice: the choice is then forgotten)."""
    if tokenizer.engine_asked is not None:
        print(ENGINE_IGNORED, file=sys.stderr, flush=True)
        tokenizer.engine_asked = None


def check_none_given(tokenizer: Tokenizer | None, eos_added: bool = False) -> None:
    """Refuse an EOS / BOS id chosen for pre-tokenized ids, which are used unchanged (with
    `eos_added`, `tokenize --to megatron`: the EOS is appended, a BOS refused). The one check
    every entry point makes (`tokenize.unchanged_ids`): `Tokenizer.given_ids` holds the ids
    chosen by `--eos-id` / `--bos-id` and by `eos=` / `bos=` to `load_tokenizer` (so to any API
    function given the tokenizer by name); until 2026-12-07 only the CLI's were, and `bos=5`
    to `tokenize_corpus`, `run_pack`, `compute_stats` or `tokenize_megatron` added nothing and
    recorded nothing, without a word.

    Raises:
        ConfigError: such an id, named as both callers choose it (`--bos-id 5 / bos=5`).
    """
    given = dict(tokenizer.given_ids) if tokenizer is not None else {}
    if eos_added:
        given.pop("eos", None)
    if not given:
        return
    it = "it" if len(given) == 1 else "them"
    how = "are used unchanged"
    if eos_added:
        how = "get only the EOS with --to megatron / tokenize_megatron"
    raise ConfigError(
        f"{' and '.join(special_choice(w, v) for w, v in given.items())} "
        f"add{'s' if it == 'it' else ''} nothing to pre-tokenized ids, which "
        f"{how} (docs/tokenize.md, 'Pre-tokenized "
        f"Parquet'); leave {it} out, or put {it} in the ids"
    )


def check_recorded_specials(
    identity: TokenizerIdentity, given: dict[str, int | str | None], where: str | os.PathLike
) -> None:
    """EOS / BOS options given without `--tokenizer` (`{"eos": 1, "bos": None}`: `--eos-id 1
    --no-bos`; `"default"` for `--eos-id default`), against what tokenized Parquet records:
    the file is read with its recorded tokenizer, so they can only agree with it.

    Raises:
        DataError: an id unlike the recorded one.
        ConfigError: `default`, which names no id without a tokenizer to take it from.
    """
    for which, value in given.items():
        recorded = getattr(identity, f"{which}_id")
        if value == "default":
            raise ConfigError(
                f"{special_choice(which, value)}: {where} is read with the tokenizer it "
                f"records ({_described(identity)}), and without a tokenizer (--tokenizer / "
                "tokenizer=) there is no default to take; "
                f"pass {special_choice(which, recorded)} or leave it out"
            )
        if value != recorded:
            raise DataError(
                f"{where}: tokenized with {_described(identity)}, but the options give "
                f"{which} {value}; pass {special_choice(which, recorded)} (what the file "
                "records) or leave the option out"
            )


def _with(
    identity: TokenizerIdentity, base_vocab: int, specials: dict[str, int | None]
) -> TokenizerIdentity:
    """`identity` with these EOS / BOS ids (and the vocabulary they widen, as `Tokenizer`)."""
    past = [v + 1 for v in specials.values() if v is not None]
    return replace(
        identity,
        eos_id=specials["eos"],
        bos_id=specials["bos"],
        vocab_size=max([base_vocab, *past]),
    )


def _ids(identity: TokenizerIdentity, which: list[str]) -> str:
    return ", ".join(f"{w} {getattr(identity, f'{w}_id')}" for w in which)


def _described(i: TokenizerIdentity) -> str:
    return f"{i.kind}:{i.name} (vocab {i.vocab_size}, eos {i.eos_id}, bos {i.bos_id})"
