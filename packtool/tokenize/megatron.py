"""`packtool tokenize --to megatron`: any input into a Megatron indexed dataset (`PREFIX.bin/.idx`).

The documents, in reading order, each as the tokenizer encodes it (its BOS rule, then the EOS
as `preprocess_data.py --append-eod` adds it; `--no-eos` as without it), through the same
dispatch and pipeline as tokenized Parquet (`tokenize.write_all`), into
`dataset.megatron.MegatronWriter`. Bytes equal to what megatron-core's `IndexedDatasetBuilder`
writes for those documents (tests/packtool/tokenize/test_megatron.py builds both).

The output is two files, so the switch to a new dataset cannot be one rename. The rule is the
one of `index.json`: a dataset exists exactly when its `.idx` exists, and the `.idx` is put in
place last. Both are written under hidden names beside the output while the corpus is read;
then the old `.idx` is deleted (from here the old dataset is gone, never half of it visible
under the new one), the new `.bin` renamed over the old, and the new `.idx` renamed in. A run
killed during those three steps leaves a `.bin` without an `.idx`: no dataset, rebuilt whole
by the next run. One writer per prefix (the output lock of packtool/dataset/output.py on the
`.idx`).

A loss mask (fine-tuning records, pre-tokenized labels) and `--keep-field` columns have no place
in the format: such inputs are refused in one line rather than written without them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from packtool.dataset.megatron import MegatronWriter, megatron_dtype, megatron_paths
from packtool.dataset.output import OutputPaths, check_apart, remove, transaction
from packtool.errors import ConfigError
from packtool.read.documents import ReadConfig, SkipCounter
from packtool.storage import local as storage
from packtool.storage import writing
from packtool.tokenize.tokenize import TokenizeSummary, input_columns, summary_of, write_all
from packtool.tokenizer.tokenizers import Tokenizer, load_tokenizer


def tokenize_megatron(
    inputs: Iterable[str | os.PathLike],
    prefix: str | os.PathLike,
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str = "byte",
    workers: int | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    command: str = "",
) -> TokenizeSummary:
    """Tokenize `inputs` into `PREFIX.bin` and `PREFIX.idx` (see the module docstring).

    Args:
        prefix: the dataset's path prefix, as Megatron's `--data-path` names it (`PREFIX.bin` or
            `PREFIX.idx` name the same pair).
        The others: as `tokenize.tokenize_corpus`.

    Raises:
        ConfigError: the pair exists without `overwrite`, another process writes it, it is
            inside an input folder, or the inputs carry what the format cannot hold.
        DataError: bad input, or no document at all (nothing is written).
    """
    inputs = list(inputs)
    config = read_config or ReadConfig()
    bin_path, idx_path = megatron_paths(prefix)
    shown = str(prefix)
    for path in (bin_path, idx_path):
        check_apart(path, [os.fspath(i) for i in inputs])  # before anything is read
    if config.extra_fields:
        raise ConfigError(
            "--to megatron: a Megatron indexed dataset holds token ids only; drop --keep-field"
        )
    optional = input_columns(inputs, config)
    if optional:
        raise ConfigError(
            f"--to megatron: the inputs carry {', '.join(optional)} (fine-tuning records or "
            "labels), which a Megatron indexed dataset cannot hold; write tokenized Parquet "
            "(--to parquet) or pack them"
        )
    if isinstance(tokenizer, str):
        tokenizer = load_tokenizer(tokenizer, workers=workers)
    dtype = megatron_dtype(tokenizer.identity.vocab_size)
    skips = SkipCounter(strict=config.strict)

    def prepare(paths: OutputPaths) -> None:
        for path in (bin_path, idx_path):
            if storage.is_dir(path):
                raise ConfigError(f"{path} is a folder; choose another --output prefix")
            if storage.lexists(path) and not overwrite:
                raise ConfigError(f"{path} exists; pass --overwrite to replace {shown}.bin/.idx")
        remove(paths.staging)  # a killed run's leftovers: nothing to resume
        try:  # the first write, up front: a failure names the user's path
            writing.create_empty(paths.staging)
        except OSError as exc:
            raise ConfigError(f"cannot write {shown} ({exc.strerror or exc})") from None

    with transaction(idx_path, command or "packtool tokenize", prepare, lambda exc, _: True) as (
        paths,
        _,
    ):
        start = time.perf_counter()
        bin_tmp = writing.temporary_name(bin_path)
        writer = MegatronWriter(bin_tmp, paths.staging, dtype)
        try:
            bar, _ = write_all(inputs, config, tokenizer, workers, skips, writer, progress, ())
            writer.close()
            # The old dataset goes first, so no .idx ever names another .bin (module docstring);
            # the transaction's commit then renames the new .idx in.
            writing.remove_file(idx_path)
            writing.replace(bin_tmp, bin_path)
        except BaseException:
            writer.abort()
            raise
    seconds = time.perf_counter() - start
    return summary_of(bar, skips, [bin_path, idx_path], tokenizer, seconds, str(dtype))
