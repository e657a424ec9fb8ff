"""The `datasets` side of loader.hf: a model check, a `datasets` view, a row collator.

Public through `loader.hf` (loader/hf/__init__.py), which also reaches the Trainer pieces
(loader/hf/trainer.py) on first use.
"""

from __future__ import annotations

import inspect
import os
import warnings
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow.dataset as pds
import torch

from loader.collate import collate
from loader.record import Documents, check_ids
from packtool.dataset import columns as shard_columns
from packtool.dataset.columns import IGNORE_INDEX, LOSS_MASK, SEQ_LENGTHS, flat_parts
from packtool.errors import ConfigError, DataError, MissingDependencyError

MASK_FROM_POSITIONS = ("sdpa", "eager", "flex_attention")
"""Attention implementations that ignore `cu_seq_lens_*`: transformers separates documents for
them by building the mask from `position_ids`, which it does only with no attention mask and
no cache (transformers.masking_utils._preprocess_mask_arguments)."""

LABELS = "labels"
"""TRL's per-token targets, unshifted, -100 where a token is not a target: what
`trl.DataCollatorForLanguageModeling` (1.16) reads; it ignores `completion_mask` and
`assistant_masks`, which SFTTrainer folds into `labels` only when it prepares the dataset."""


def _require(module: str, extra: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingDependencyError(
            f"{module} is not installed; install it with `pip install {extra}`"
        ) from None


# ---- the model check ----------------------------------------------------------------------


def _unwrap(model: Any) -> Any:
    """The transformers model inside the wrappers accelerate and torch make: torch.compile's
    OptimizedModule (`_orig_mod`), DDP / DataParallel / DeepSpeedEngine / FSDP (`module`). Some
    read the model's attributes through (`.config` among them), so a wrapper is told by the
    model's `config` not being its own attribute."""
    while "config" not in getattr(model, "__dict__", ()):
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            inner = getattr(model, "module", None)
        if not isinstance(inner, torch.nn.Module):
            break
        model = inner
    return model


def _is_flash(impl: str) -> bool:
    """Whether transformers runs `impl` through its flash-attention path (cu_seq_lens aware)."""
    try:
        from transformers.utils.generic import is_flash_attention_requested
    except ImportError:  # transformers < 5: the names were flash_attention_2 / _3
        return impl.startswith("flash_attention")
    return is_flash_attention_requested(requested_attention_implementation=impl)


_PROBED: weakref.WeakKeyDictionary[Any, dict[str, float]] = weakref.WeakKeyDictionary()
"""Each probed model's `_probe_leak` per attention implementation: the probe runs once."""
_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Models the probe could not run, warned about once (the probe is tried again at each check)."""

PROBE_TOLERANCE = 1e-4
"""The largest change of the probe's logits, relative to their largest magnitude, taken as no
leak. The two runs compared have the same shapes and kernels, so a model that separates the
documents gives the same logits (measured on CPU: exactly, fp32 and bf16); a leak moved them by
3e-3 (XGLM) to 0.23 (OPT) on tiny random models."""


def _probe_leak(model: Any) -> float:
    """How much a document's logits change when the document packed before it changes.

    Two forwards of 11 tokens: `[a, b]` and `[a', b]` (5 and 6 random ids, positions restarting
    at b), `use_cache=False` and no attention mask, as a `layout="hf"` batch is run; in eval
    mode without gradients, every module's mode restored after. Returns the largest change of
    b's logits over their largest magnitude (0 where b reads nothing of the document before)."""
    emb = model.get_input_embeddings()
    gen = torch.Generator().manual_seed(0)
    firsts = torch.randint(emb.num_embeddings, (2, 5), generator=gen)
    second = torch.randint(emb.num_embeddings, (6,), generator=gen)
    positions = torch.cat([torch.arange(5), torch.arange(6)])[None].to(emb.weight.device)
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        with torch.no_grad():
            logits = []
            for first in firsts:
                ids = torch.cat([first, second])[None].to(emb.weight.device)
                out = model(input_ids=ids, position_ids=positions, use_cache=False)
                found = getattr(out, "logits", None)
                logits.append((found if found is not None else out[0])[0, 5:].float())
    finally:
        for m, mode in modes:
            m.training = mode
    if not all(bool(x.isfinite().all()) for x in logits):
        raise ValueError("its logits are not finite")
    scale = float(logits[0].abs().max()) or 1.0
    return float((logits[0] - logits[1]).abs().max()) / scale


def _check_separates(model: Any, impl: str, name: str) -> None:
    """Refuse a model whose packed documents see each other in fact (`_probe_leak`), which a
    configuration check cannot tell: OPT, BioGPT and XGLM in transformers 5.x take position_ids
    but build their causal mask without them, so no block-diagonal mask is made."""
    probed = _PROBED.setdefault(model, {})
    if impl not in probed:
        try:
            probed[impl] = _probe_leak(model)
        except Exception as exc:  # a model that cannot run here (meta tensors, sharded params)
            # Not a refusal: ZeRO-3 or FSDP parameters are gathered only inside their engine's
            # forward, and PackedTrainer checks before that; the configuration checks stand.
            # Not kept either: a later check, once the model can run, probes it.
            if model in _WARNED:
                return
            _WARNED.add(model)
            warnings.warn(
                f"check_packed_model could not run {type(model).__name__} on two short packed "
                f"documents to see whether they stay apart ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}); only its configuration was "
                "checked: call check_packed_model(model) again once its weights are loaded where "
                "it runs (or probe=False to skip this)",
                RuntimeWarning,
                stacklevel=3,
            )
            return
    leak = probed[impl]
    if leak > PROBE_TOLERANCE:
        raise ConfigError(
            f"{type(model).__name__} with {name} lets a packed document's logits change with "
            f"the document before it (by {leak:.1e} of their scale): it builds no "
            "block-diagonal mask from position_ids, so documents attend to each other; use "
            "an architecture that does (e.g. Llama, Qwen2, Mistral, GPT-2) or "
            "attn_implementation='flash_attention_2' (cu_seq_lens, CUDA)"
        )


def check_packed_model(
    model: Any, batch: Mapping[str, Any] | None = None, *, probe: bool = True
) -> str:
    """Refuse a transformers model (and batch) that would let packed documents see each other.

    Args:
        model: A `transformers.PreTrainedModel`; torch.compile, DDP and accelerate wrappers
            are unwrapped (the probe runs the model inside them, uncompiled).
        batch: The batch about to be passed as `model(**batch)`; also checks its keys (an
            `attention_mask`, missing `position_ids`, a `use_cache` key).
        probe: For mask-based implementations (sdpa, eager, flex), also run the model once on
            two short packed documents (no gradients, eval mode, restored after) and refuse it
            if the second one's logits depend on the first; once per model and implementation.

    Returns:
        How the model separates documents: `"cu_seq_lens"` (flash attention varlen kernels) or
        `"position_ids"` (a mask built from the restarting positions).

    Raises:
        ConfigError: One line: why documents would attend across their boundaries (the
            configuration, the batch, or the probe), and the fix.
    """
    model = _unwrap(model)
    config = getattr(model, "config", None)
    impl = getattr(config, "_attn_implementation", None)
    if config is None:
        raise ConfigError(
            f"{type(model).__name__} is not a transformers model (no .config); packtool's own "
            "attention.Transformer takes the packtool batch and needs no check"
        )
    name = f"attn_implementation={impl!r}"
    forward = inspect.signature(model.forward).parameters
    if "position_ids" not in forward:
        raise ConfigError(
            f"{type(model).__name__}.forward takes no position_ids, so positions run across the "
            "packed documents; use an architecture whose forward takes position_ids"
        )
    batch = batch if batch is not None else {}
    if "cu_seqlens" in batch and "cu_seq_lens_q" not in batch:
        raise ConfigError(
            "the batch is in packtool's own layout (flat input_ids, cu_seqlens), which "
            "transformers models do not take; use PackedDataset(..., layout='hf')"
        )
    if batch.get("attention_mask") is not None:
        raise ConfigError(
            "the batch holds an attention_mask: transformers then reads each row as one sequence "
            "and its documents attend to each other; drop it (packtool's layout='hf' batches have "
            "none and separate documents with position_ids and cu_seq_lens; TRL's SFTTrainer "
            "makes none with SFTConfig(padding_free=True))"
        )
    if impl is not None and _is_flash(impl):
        if batch and "cu_seq_lens_q" not in batch and "position_ids" not in batch:
            raise ConfigError(
                f"{name} needs cu_seq_lens_q/k or position_ids in the batch to separate documents; "
                "use PackedDataset(..., layout='hf') batches"
            )
        return "cu_seq_lens"
    if impl not in MASK_FROM_POSITIONS:
        raise ConfigError(
            f"{name} uses neither cu_seq_lens nor packed position_ids, so documents would attend "
            "to each other; load the model with attn_implementation='sdpa' (or 'flash_attention_2' "
            "on CUDA)"
        )
    if batch and batch.get("position_ids") is None:
        raise ConfigError(
            f"{name} separates documents only by their position_ids, and the batch has none; use "
            "PackedDataset(..., layout='hf') batches"
        )
    use_cache = batch.get("use_cache")
    if use_cache is None:  # what transformers reads for a missing or None use_cache
        use_cache = getattr(config, "use_cache", False)
    checkpointing = getattr(model, "is_activation_checkpointing", None)
    if checkpointing is None:  # transformers < 5.x
        checkpointing = getattr(model, "is_gradient_checkpointing", False)
    if use_cache and checkpointing and model.training and torch.is_grad_enabled():
        use_cache = False  # what transformers does (utils.generic.merge_with_config_defaults)
    if use_cache:
        raise ConfigError(
            f"{name} ignores cu_seq_lens and separates documents only when no KV cache is made, "
            "but use_cache is on, so documents would attend to each other; set "
            "model.config.use_cache = False (Trainer does; a plain loop must) or pass "
            "use_cache=False"
        )
    if probe:
        _check_separates(model, impl, name)
    return "position_ids"


# ---- datasets -------------------------------------------------------------------------------


def seq_lengths_table(doc_offsets: Any) -> Any:
    """`seq_lengths` (list<int32>, one length per document) of an Arrow `doc_offsets` column.

    The declared rule of the shard column (`packtool.dataset.columns.piece_lengths`), vectorised.
    """
    parts = {"doc_offsets": flat_parts(doc_offsets)}
    if len(parts["doc_offsets"][0]) > 1 and np.diff(parts["doc_offsets"][0]).min() < 1:
        raise ConfigError("a row has an empty doc_offsets list; the dataset is damaged")
    return shard_columns.get(SEQ_LENGTHS).derive(parts)


def labels_table(input_ids: Any, loss_mask: Any, doc_offsets: Any) -> Any:
    """TRL's `labels` (list<int32>) from Arrow columns: each token's id where `loss_mask` is 1,
    -100 where it is 0 and at every document's first token (nothing predicts it), i.e. the
    `labels` of a `layout="hf"` batch of those rows. Vectorised over the rows."""
    import pyarrow as pa

    ids_off, ids = flat_parts(input_ids)
    mask_off, mask = flat_parts(loss_mask)  # a binary value per row (its storage) or a list
    doc_off, docs = flat_parts(doc_offsets)
    if not np.array_equal(ids_off, mask_off):
        raise ConfigError("a row's loss_mask is not as long as its input_ids; run packtool verify")
    labels = np.where(mask != 0, ids.astype(np.int32), np.int32(IGNORE_INDEX))
    # Every offset but each row's last is a document's first token, at row start + offset.
    entries = np.diff(doc_off)
    row_of = np.repeat(np.arange(len(entries)), entries)
    last = np.zeros(len(docs), dtype=bool)
    last[doc_off[1:][entries > 0] - 1] = True
    labels[(ids_off[row_of] + docs)[~last]] = IGNORE_INDEX
    return pa.ListArray.from_arrays(pa.array(ids_off.astype(np.int32)), pa.array(labels))


def _list_of(datasets: Any, dtype: str) -> Any:
    # datasets 4 renamed Sequence (which it keeps as a deprecated alias) to List.
    return getattr(datasets, "List", datasets.Sequence)(datasets.Value(dtype))


def _view_columns(table: Any, *, lengths: bool, labels: bool) -> Any:
    """The columns `hf_dataset` adds to some rows: `seq_lengths` and/or `labels`."""
    import pyarrow as pa

    out = {}
    if lengths:
        out[SEQ_LENGTHS] = seq_lengths_table(table.column("doc_offsets"))
    if labels:
        out[LABELS] = labels_table(
            table.column("input_ids"), table.column(LOSS_MASK), table.column("doc_offsets")
        )
    return pa.table(out)


def _with_view_columns(table: Any, *, lengths: bool, labels: bool) -> Any:
    extra = _view_columns(table, lengths=lengths, labels=labels)
    for name in extra.column_names:
        table = table.append_column(name, extra.column(name))
    return table


def _reads_scan_options(datasets: Any) -> bool:
    """Whether this `datasets`' Parquet builder takes `fragment_scan_options` (recent releases;
    an older one refuses an unknown key)."""
    import dataclasses

    try:
        from datasets.packaged_modules.parquet.parquet import ParquetConfig

        return "fragment_scan_options" in {f.name for f in dataclasses.fields(ParquetConfig)}
    except (ImportError, TypeError):
        return False


def hf_dataset(
    path: str | os.PathLike,
    *,
    streaming: bool = False,
    cache_dir: str | os.PathLike | None = None,
    num_proc: int | None = None,
) -> Any:
    """The packed rows as a Hugging Face dataset TRL takes as already packed.

    Reads exactly the shards `index.json` lists (in its order) with `datasets`' Parquet
    builder, after checking them as `PackedDataset` does when it opens a dataset (each one
    present, of the size `index.json` gives, a Parquet file with the listed row count). Rows
    carry `seq_lengths` (each row's document lengths, TRL's packed format): stored
    by `packtool pack`, or computed from `doc_offsets` for datasets packed before it was. With a
    loss mask they also carry `labels` (the id where the mask is 1, -100 elsewhere and at each
    document's first token), which TRL trains on instead of every token. Pass it to
    `trl.SFTTrainer` with `SFTConfig(padding_free=True, max_length=None,
    dataset_kwargs={"skip_prepare_dataset": True})`, or to a plain `Trainer` with
    `data_collator=RowCollator()`.

    Args:
        path: A `packtool pack` output folder, or its URL in a bucket (`s3://...`: `datasets`
            downloads the shards through fsspec into its own cache).
        streaming: Return a `datasets.IterableDataset` (nothing converted or cached; what is
            added is computed as rows stream).
        cache_dir: `datasets`' cache folder (default: its own).
        num_proc: Processes for computing what is added (non-streaming).

    Raises:
        DataError: A missing or damaged `index.json`; a shard missing, of another size or row
            count than `index.json` lists (truncated, or replaced), or not a Parquet file; a
            page that fails its CRC32 or does not decode (with `streaming`, as rows stream:
            pyarrow's `OSError`).
        MissingDependencyError: `datasets` is not installed.
    """
    from functools import partial

    from loader.store.shards import ShardStore
    from packtool.storage import local as storage
    from packtool.storage import remote

    datasets = _require("datasets", "packtool[hf]")
    # The loader's own open checks each listed shard against index.json (present, its size, a
    # Parquet footer with the columns and row count listed) before datasets reads a byte:
    # datasets would read a replaced shard silently and report a missing or cut-short one in
    # a traceback of its own. A bucket's folder: the version its link names.
    store = ShardStore(path)
    folder, manifest = store.path, store.manifest
    kwargs: dict[str, Any] = {"split": "train"}
    if storage.is_remote(folder):  # `datasets` reads it through fsspec, with packtool's options
        files = [f"{str(folder).rstrip('/')}/{s.file}" for s in manifest.shards]
        kwargs["storage_options"] = remote.options_for(remote.scheme(folder) or "")
    else:
        files = [os.path.join(os.fspath(folder), s.file) for s in manifest.shards]
    kwargs["data_files"] = {"train": files}
    if cache_dir is not None and not streaming:
        kwargs["cache_dir"] = os.fspath(cache_dir)
    # Each page's CRC32, as the loader checks it (`page_checksums`): without it a flipped byte
    # of a page's lz4 literals decoded into other tokens, silently (98 rows of the sample).
    if _reads_scan_options(datasets):
        kwargs["fragment_scan_options"] = pds.ParquetFragmentScanOptions(
            page_checksum_verification=True
        )
    else:  # an older datasets refuses the key: load as before, and say what is not checked
        warnings.warn(
            f"datasets {datasets.__version__} takes no fragment_scan_options, so hf_dataset "
            "cannot check the shards' page checksums (a damaged page would decode into other "
            f"tokens); upgrade datasets, or run `packtool verify {folder}` once",
            stacklevel=2,
        )
    try:
        ds = datasets.load_dataset("parquet", streaming=streaming, **kwargs)
    except datasets.exceptions.DatasetGenerationError as exc:
        cause = exc.__cause__ or exc.__context__
        if not isinstance(cause, OSError):
            raise
        raise DataError(
            f"{folder}: a shard is damaged ({cause}); `packtool verify {folder}` names it"
        ) from None
    columns = ds.column_names if not streaming else list(ds.features or {})
    lengths = SEQ_LENGTHS not in columns
    labels = LOSS_MASK in columns and LABELS not in columns
    if not (lengths or labels):
        return ds
    add = {"lengths": lengths, "labels": labels}
    if streaming:
        added = ds.with_format("arrow").map(partial(_with_view_columns, **add), batched=True)
        return added.with_format(None)
    # Only the new columns are written to the cache (4 bytes a document for seq_lengths, 4 a
    # token for labels); the rows are joined to them side by side without a copy of the tokens.
    inputs = ["doc_offsets", *(["input_ids", LOSS_MASK] if labels else [])]
    features = {SEQ_LENGTHS: _list_of(datasets, "int32")} if lengths else {}
    if labels:
        features[LABELS] = _list_of(datasets, "int32")
    added = (
        ds.select_columns(inputs)
        .with_format("arrow")
        .map(
            partial(_view_columns, **add),
            batched=True,
            batch_size=4096 if not labels else 256,
            remove_columns=inputs,
            num_proc=num_proc,
            features=datasets.Features(features),
            desc=f"{' and '.join(features)} from the shards",
        )
        .with_format(None)
    )
    return datasets.concatenate_datasets([ds, added], axis=1)


class RowCollator:
    """Rows of `hf_dataset` (`input_ids` with `seq_lengths` or `doc_offsets`) -> one batch.

    The batch is `loader.collate(..., layout="hf")`: the rows' documents back to back, positions
    restarting per document, `cu_seq_lens_q/k`, labels -100 at each document's first token; the
    same as `PackedDataset(..., layout="hf")` gives for those rows. With `Trainer`, set
    `TrainingArguments(remove_unused_columns=False)`: it would otherwise drop the lengths.
    """

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        if not features:
            raise ConfigError("RowCollator got no rows")
        first = features[0]
        key = next((k for k in (SEQ_LENGTHS, "doc_offsets") if k in first), None)
        if key is None:
            raise ConfigError(
                f"rows have no {SEQ_LENGTHS} or doc_offsets (only {sorted(first)}), so their "
                "documents cannot be told apart; if Trainer removed them, set "
                "TrainingArguments(remove_unused_columns=False)"
            )
        # Which tokens are targets: row 0's loss_mask, else its labels; every row must say it alike.
        target = next((k for k in (LOSS_MASK, "labels") if first.get(k) is not None), None)
        for i, f in enumerate(features):  # a bare KeyError before
            for need in ("input_ids", key, *([target] if target else [])):
                if f.get(need) is None:
                    also = f" and {target}" if target else ""
                    raise ConfigError(
                        f"row {i} has no {need} (its keys: {sorted(f)}); every row needs "
                        f"input_ids and, as row 0 has, {key}{also}"
                    )
            extra = next((k for k in (LOSS_MASK, "labels") if f.get(k) is not None), None)
            if target is None and extra is not None:
                raise ConfigError(
                    f"row {i} has {extra} but row 0 has neither loss_mask nor labels, so its "
                    "targets would be ignored; give every row the same target column"
                )
        lens = [np.asarray(f[key], dtype=np.int64) for f in features]
        if key == "doc_offsets":
            lens = [np.diff(offsets) for offsets in lens]
        rows = [_row_ids(f["input_ids"], i) for i, f in enumerate(features)]
        for i, (row, row_lens) in enumerate(zip(rows, lens, strict=True)):
            # row by row: totals that agree across rows let a document cross a row boundary
            if len(row_lens) and row_lens.min() < 1:
                raise ConfigError(
                    f"row {i}: document lengths must be >= 1, got {row_lens.tolist()[:20]}"
                )
            if int(row_lens.sum()) != len(row):
                raise ConfigError(
                    f"row {i}: its document lengths ({int(row_lens.sum())} tokens) do not add up "
                    f"to its {len(row)} input_ids"
                )
        tokens = np.concatenate(rows)
        doc_lens = np.concatenate(lens)
        ids = np.full(len(doc_lens), -1, dtype=np.int64)
        columns = {}
        if target == LOSS_MASK:
            # Stored as one byte string per row (packtool/dataset/columns.py); lists are accepted too.
            columns[LOSS_MASK] = np.concatenate([_mask_values(f[LOSS_MASK]) for f in features])
            if len(columns[LOSS_MASK]) != len(tokens):
                raise ConfigError("the rows' loss_mask is not as long as their input_ids")
        elif target == "labels":
            # TRL-style unshifted labels (what hf_dataset adds): the mask is where they are set.
            labels = np.concatenate([np.asarray(f["labels"], dtype=np.int64) for f in features])
            if len(labels) != len(tokens):
                raise ConfigError("the rows' labels are not as long as their input_ids")
            set_ = labels != IGNORE_INDEX
            if not np.array_equal(labels[set_], tokens[set_]):
                raise ConfigError(
                    "the rows' labels differ from their input_ids where set; RowCollator takes "
                    "unshifted labels (the token itself, or -100), as hf_dataset writes them"
                )
            columns[LOSS_MASK] = set_.astype(np.uint8)
        return collate(Documents(tokens, doc_lens, ids, columns), layout="hf")


def _row_ids(value: Any, i: int) -> np.ndarray:
    """Row `i`'s token ids as int64 (a float id was truncated, a negative one reached the
    embedding).

    Raises:
        DataError: Ids that are not integers in 0..2^63-1, naming the row.
    """
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    check_ids(arr, f"row {i}", "input_ids")
    return arr.astype(np.int64)


def _mask_values(value: Any) -> np.ndarray:
    if isinstance(value, bytes | bytearray | memoryview):
        return np.frombuffer(value, dtype=np.uint8)
    return np.asarray(value, dtype=np.uint8)
