"""The loader's settings, each a frozen dataclass validated when it is made (`ConfigError`).

`LoaderConfig`: how a `PackedDataset` turns packed rows into batches. `OnlineConfig`: how
`OnlinePacker` (and `StreamingPackedDataset`) pack a stream of documents. Also the checks that
need more than the settings: the static-shape document cap against the dataset's rows
(`static_max_docs`), and the rank and world size a loader runs as (`dist_rank_world`).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from packtool.errors import ConfigError
from packtool.pack.limits import check_long_docs, check_max_len

STRATEGIES = ("ffd", "bucketed")
"""`OnlineConfig.strategy` values."""


def check_int(name: str, value: Any, lo: int | None = None) -> None:
    """Raise a `ConfigError` unless `value` is an integer (>= `lo` when given; bools refused)."""
    wrong_type = isinstance(value, bool) or not isinstance(value, (int, np.integer))
    if wrong_type or (lo is not None and value < lo):
        bound = "" if lo is None else f" >= {lo}"
        raise ConfigError(f"{name} must be an integer{bound}, got {value!r}")


def check_bool(name: str, value: Any) -> None:
    """Raise a `ConfigError` unless `value` is True or False (a string such as 'no' is true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name} must be True or False, got {value!r}")


def check_number(name: str, value: Any) -> None:
    """Raise a `ConfigError` unless `value` is a real number (not a bool, not a string)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{name} must be a number, got {value!r}")


def check_epoch(epoch: Any) -> int:
    """An epoch number: an integer from 0 below 2**63 (it is kept in a shared int64: a larger
    one wrapped around, 2**64 + 3 became epoch 3), else a `ConfigError`."""
    check_int("epoch", epoch, 0)
    if epoch >= 2**63:
        raise ConfigError(f"epoch must be below 2**63, got {epoch!r}")
    return int(epoch)


def make_config(cls: type, settings: dict[str, Any], config: Any = None) -> Any:
    """`config` when given, else `cls(**settings)` for a config dataclass; unknown or missing
    names, a config together with keyword settings, or a config that is no `cls` (a dict) are a
    `ConfigError`."""
    if config is not None:
        if settings:
            raise ConfigError(
                f"give either a config or keyword settings, not both ({sorted(settings)})"
            )
        if not isinstance(config, cls):
            raise ConfigError(
                f"config must be a {cls.__name__}, got {type(config).__name__}; give the settings "
                f"as keyword arguments or as a {cls.__name__}(...)"
            )
        return config
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown setting(s) {', '.join(map(repr, unknown))}; {cls.__name__} takes "
            f"{', '.join(known)}"
        )
    try:
        return cls(**settings)
    except TypeError as exc:  # a required setting is missing
        raise ConfigError(f"{cls.__name__}: {exc}") from None


@dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    """How rows become batches. Exactly one of `rows_per_batch` / `tokens_per_batch`."""

    rows_per_batch: int | None = None
    """Packed rows per rank batch."""
    tokens_per_batch: int | None = None
    """Token budget per rank batch: rows are added in order while the budget holds."""
    seed: int = 0
    """Seed of the per-epoch permutation (with the dataset fingerprint and epoch)."""
    shuffle: bool = True
    """False: rows in stored order (still split over ranks and workers the same way)."""
    shuffle_window: int = 16
    """Row groups whose rows are shuffled together (row groups themselves are shuffled too); 0
    shuffles all rows freely, which decodes a whole row group per row unless the cache holds the
    dataset. Keep `cache_bytes` above this many decoded row groups."""
    nodes: int | str = 1
    """Nodes the ranks run on (ranks `n * world_size // nodes ...` on node n, as torchrun
    numbers them): each node's ranks then read rows of that node's own shuffle windows
    (loader/order/nodes.py), so from a bucket a node downloads ~1/nodes of the dataset, not all
    of it (docs/remote.md, "Several nodes"). Needs `rows_per_batch` and windows (not
    `shuffle_window=0`); the order then depends on a node's rows a step (ranks per node x
    `rows_per_batch`), so a resume inside an epoch keeps it. 1: the plain order. "auto": the
    launcher's count (`resolve_nodes`: torchrun's WORLD_SIZE / LOCAL_WORLD_SIZE, else Slurm's
    SLURM_NNODES, else 1)."""
    drop_last: bool = False
    """Drop an incomplete last global step; otherwise ranks short of rows get a filler batch."""
    static_shape: bool = False
    """Pad every batch to the same shapes (CUDA graphs / torch.compile); see loader/collate.py."""
    max_docs_per_batch: int | None = None
    """Static shape: cu_seqlens length - 1 (padding pseudo-document included). Required with a
    token budget; with rows_per_batch it defaults to rows × the most documents in any row + 1."""
    balance: bool = False
    """Reassign each global step's rows to ranks so attention cost (Σ len² + linear) is balanced."""
    balance_linear: float = 1024.0
    """Weight of the per-token term in the balance cost (about 6 × d_model models the MLPs)."""
    layout: str = "packtool"
    """"packtool" (docs/CONTRACTS.md batch) or "hf" (transformers padding-free keys)."""
    seq_idx: bool = False
    """Add `seq_idx` (int32, per token: its document's index in the batch), what state-space and
    linear-attention layers (mamba_ssm, transformers' hybrid models) need so that no state
    flows across documents (loader/collate.py)."""
    varlen_keys: bool = False
    """Add `cu_seq_lens_q/k` and `max_length_q/k` to the packtool layout (the hf layout has them)."""
    context_parallel: tuple[int, int] | None = None
    """(size, rank): give this context-parallel rank its share of every batch
    (loader/context_parallel.py). Every rank of the group must get the same rows: pass the
    data-parallel rank and world to the dataset, not the global ones."""
    cp_style: str = "megatron"
    """"megatron" (THD zigzag, documents padded to 2 x size) or "balanced" (torchtitan's
    document-causal load balance over blocks of `cp_block` tokens; the only one with fixed
    shapes, so the one `static_shape` takes)."""
    cp_block: int = 64
    """Tokens per block of the balanced style."""
    pad_id: int = 0
    """Token id used for static-shape padding."""
    cache_bytes: int = 96 << 20
    """Bound on decoded row groups cached per process (default: a 16-row-group shuffle window of
    256 rows x 4096 uint16 tokens, with room to spare). A mixture splits it over its sources,
    each keeping at least its shuffle window and one row group more."""
    verify: bool = False
    """Check every shard's sha256 at open (reads the whole dataset)."""
    page_checksums: bool = True
    """Check each Parquet page's CRC32 as it is decoded (~4% of the loader's CPU on text, ~15% on
    random ids: docs/loader.md)."""
    cache_dir: str | None = None
    """A dataset in a bucket (`s3://...`): the node-local folder its row groups are cached in,
    shared by every worker and rank of the node (default `$PACKTOOL_CACHE_DIR/ranges`, else
    `~/.cache/packtool/ranges`; docs/remote.md, "Training from a bucket")."""
    cache_limit: int = 64 << 30
    """Bytes that cache may hold (the least recently read row groups nobody reads go first)."""

    def __post_init__(self) -> None:
        if (self.rows_per_batch is None) == (self.tokens_per_batch is None):
            raise ConfigError(
                "give exactly one of rows_per_batch or tokens_per_batch, got "
                f"rows_per_batch={self.rows_per_batch}, tokens_per_batch={self.tokens_per_batch}"
            )
        # Types first: a float row count would cut batches of alternating sizes, a string
        # "False" would switch an option on; both silently.
        for name in ("rows_per_batch", "tokens_per_batch", "max_docs_per_batch"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name))
        for name in ("seed", "shuffle_window", "pad_id", "cache_bytes", "cache_limit"):
            check_int(name, getattr(self, name))
        if self.cache_limit < 1:
            raise ConfigError(f"cache_limit must be >= 1 byte, got {self.cache_limit}")
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise ConfigError(f"cache_dir must be a folder path, got {self.cache_dir!r}")
        for name in (
            "shuffle",
            "drop_last",
            "static_shape",
            "balance",
            "verify",
            "page_checksums",
            "seq_idx",
            "varlen_keys",
        ):
            check_bool(name, getattr(self, name))
        if self.rows_per_batch is not None and self.rows_per_batch < 1:
            raise ConfigError(f"rows_per_batch must be >= 1, got {self.rows_per_batch}")
        if self.tokens_per_batch is not None and self.tokens_per_batch < 1:
            raise ConfigError(f"tokens_per_batch must be >= 1, got {self.tokens_per_batch}")
        if self.max_docs_per_batch is not None and self.max_docs_per_batch < 2:
            raise ConfigError(f"max_docs_per_batch must be >= 2, got {self.max_docs_per_batch}")
        if self.max_docs_per_batch is not None and not self.static_shape:
            raise ConfigError(
                "max_docs_per_batch only applies with static_shape=True (it sizes cu_seqlens)"
            )
        if not 0 <= self.pad_id < 2**63:
            raise ConfigError(f"pad_id must be a token id >= 0, got {self.pad_id}")
        if (
            isinstance(self.balance_linear, bool)
            or not isinstance(self.balance_linear, (int, float, np.integer, np.floating))
            or not 0 <= self.balance_linear < float("inf")
        ):
            raise ConfigError(
                f"balance_linear must be a finite number >= 0, got {self.balance_linear!r}"
            )
        if (
            self.static_shape
            and self.tokens_per_batch is not None
            and self.max_docs_per_batch is None
        ):
            raise ConfigError("static_shape with tokens_per_batch needs max_docs_per_batch")
        if self.layout not in ("packtool", "hf"):
            raise ConfigError(f"layout {self.layout!r} is unknown; choose 'packtool' or 'hf'")
        from loader.context_parallel import check_cp

        check_cp(1, 0, self.cp_style, self.cp_block)  # checked with or without a group
        if self.context_parallel is not None:
            cp = self.context_parallel
            if not isinstance(cp, (tuple, list)) or len(cp) != 2:
                raise ConfigError(f"context_parallel must be (size, rank), got {cp!r}")
            check_cp(cp[0], cp[1], self.cp_style, self.cp_block)
            if self.layout != "packtool":
                raise ConfigError(
                    "context_parallel splits packtool-layout batches; use layout='packtool'"
                )
            if self.varlen_keys:
                raise ConfigError(
                    "varlen_keys does not combine with context_parallel: a rank's share attends "
                    "through global_cu_seqlens and doc_index (megatron style: cu_seqlens and "
                    "cu_seqlens_padded), which the split hands on instead"
                )
            if self.static_shape and self.cp_style != "balanced":
                raise ConfigError(
                    "static_shape with context_parallel needs cp_style='balanced' (the "
                    f"{self.cp_style} style pads every document to a multiple of 2 x cp, so its "
                    "shapes vary)"
                )
        if self.shuffle_window < 0:
            raise ConfigError(f"shuffle_window must be >= 0, got {self.shuffle_window}")
        if self.nodes != "auto":
            check_int("nodes", self.nodes, 1)
        dealt = self.nodes != "auto" and self.nodes > 1  # "auto": checked once resolved
        if dealt and self.tokens_per_batch is not None:
            raise ConfigError(
                "nodes > 1 needs rows_per_batch: a node's ranks take a fixed run of rows of its "
                "own windows each step, and a token budget cuts batches of varying rows"
            )
        if dealt and self.shuffle and self.shuffle_window == 0:
            raise ConfigError(
                "nodes > 1 needs shuffle windows (shuffle_window > 0): the free shuffle puts "
                "every row anywhere, so no node has rows of its own"
            )
        if self.cache_bytes < 0:
            raise ConfigError(f"cache_bytes must be >= 0, got {self.cache_bytes}")

    def layout_key(self, world_size: int) -> dict[str, Any]:
        """The settings that decide which rows form a global step (resume compares them)."""
        return {
            "world_size": world_size,
            "rows_per_batch": self.rows_per_batch,
            "tokens_per_batch": self.tokens_per_batch,
            "max_docs_per_batch": self.max_docs_per_batch if self.static_shape else None,
            "drop_last": self.drop_last,
            "shuffle": self.shuffle,
            "shuffle_window": self.shuffle_window,
            # Only where set: states saved before `nodes` existed keep their layout.
            **({"nodes": self.nodes} if self.nodes != 1 else {}),
        }


@dataclass(frozen=True, kw_only=True)
class OnlineConfig:
    """How a stream of documents becomes packed rows."""

    max_len: int
    """Tokens per row at most (>= 2)."""
    buffer_docs: int = 10_000
    """Pack when the buffer holds this many segments (documents, after splitting long ones)."""
    buffer_tokens: int | None = None
    """Also pack when the buffer holds this many tokens (None: no token bound)."""
    buffer_seconds: float | None = None
    """Also pack when the oldest new document has waited this long (None: no time window; a time
    window makes the output depend on timing, so training streams leave it off)."""
    strategy: str = "ffd"
    """`ffd` (first-fit-decreasing on the buffer) or `bucketed` (two-level, loader/online/bucketed.py)."""
    bucket: int = 32
    """Length bucket granularity of the `bucketed` strategy."""
    min_fill: float = 0.99
    """Rows below this fill (share of max_len) go back into the buffer, except at the flush."""
    max_holds: int = 4
    """A segment held back this many times is emitted with its row whatever the fill."""
    long_docs: str = "split"
    """Documents longer than max_len: `split` into max_len chunks, `truncate`, or `drop`."""
    seed: int = 0
    """Seeds the order of the rows each pack emits."""
    shuffle_rows: bool = True
    """Emit each pack's rows in a seeded random order (False: in the order rows were opened, so
    FFD's long-document rows come first)."""

    def __post_init__(self) -> None:
        check_max_len(self.max_len, minimum=2)  # also the kernels' 2**24 ceiling, up front
        check_int("buffer_docs", self.buffer_docs, 1)
        if self.buffer_tokens is not None:
            check_int("buffer_tokens", self.buffer_tokens, 1)
        if self.buffer_seconds is not None:
            check_number("buffer_seconds", self.buffer_seconds)
        if self.buffer_seconds is not None and not self.buffer_seconds > 0:
            raise ConfigError(f"buffer_seconds must be > 0 or None, got {self.buffer_seconds!r}")
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"strategy {self.strategy!r} is unknown; choose one of {list(STRATEGIES)}"
            )
        check_int("bucket", self.bucket, 1)
        check_number("min_fill", self.min_fill)
        check_bool("shuffle_rows", self.shuffle_rows)
        if not 0.0 <= self.min_fill <= 1.0:
            raise ConfigError(f"min_fill must be in [0, 1], got {self.min_fill!r}")
        check_int("max_holds", self.max_holds, 0)
        check_long_docs(self.long_docs)
        check_int("seed", self.seed, 0)


MAX_BATCH_TOKENS = 2**31 - 1
"""Most tokens one batch may hold: `cu_seqlens` is int32 (flash-attn's, torch's varlen)."""


def check_batch_size(config: LoaderConfig, max_len: int, whose: str) -> None:
    """Refuse a batch setting rows of `max_len` tokens cannot fill or `cu_seqlens` cannot hold.

    Raises:
        ConfigError: `tokens_per_batch` below `max_len` (a row would not fit), or a batch of more
            than `MAX_BATCH_TOKENS` (`tokens_per_batch`, or `rows_per_batch` x `max_len`: a
            budget of 10^12 sized the workers' ring or the static padding by it, a failed
            allocation deep in torch).
    """
    budget = config.tokens_per_batch
    if budget is not None and budget < max_len:
        raise ConfigError(
            f"tokens_per_batch {budget} is smaller than {whose} max_len {max_len}; a row "
            "would not fit"
        )
    most = budget if budget is not None else config.rows_per_batch * max_len
    if most > MAX_BATCH_TOKENS:
        setting = (
            f"tokens_per_batch {budget:,}"
            if budget is not None
            else f"rows_per_batch {config.rows_per_batch:,} x max_len {max_len:,}"
        )
        raise ConfigError(
            f"{setting} is more tokens than a batch can hold: cu_seqlens is int32, so at most "
            f"{MAX_BATCH_TOKENS:,} a batch"
        )


def check_pad_id(config: LoaderConfig, vocab_size: Any, where: str) -> None:
    """Refuse a `pad_id` that is not a token id of the data's vocabulary (it would reach
    `input_ids`, and an embedding lookup, in every static-shape batch).

    Raises:
        ConfigError: `pad_id` >= the tokenizer's `vocab_size` (named with `where`).
    """
    if vocab_size is not None and config.pad_id >= int(vocab_size):
        raise ConfigError(
            f"pad_id {config.pad_id} is not a token id of {where}: its tokenizer's vocab_size is "
            f"{int(vocab_size)} (ids 0-{int(vocab_size) - 1})"
        )


def static_max_docs(config: LoaderConfig, n_docs: np.ndarray) -> int:
    """The static-shape `cu_seqlens` length - 1 for a dataset whose rows hold `n_docs` documents.

    `n_docs` may be every row's count or only the `rows_per_batch` (or 1) largest
    (`RowIndex.top_n_docs`): nothing else decides the result.

    The default (rows_per_batch only) is rows × the most documents in any row + 1. A given
    `max_docs_per_batch` that some batch would exceed is refused now rather than as a `DataError`
    mid-epoch: with a token budget batches close before `max_docs_per_batch - 1` documents, so
    only a single row with more documents breaks it; with `rows_per_batch` batches are not cut by
    documents, so the bound is the `rows_per_batch` rows with the most documents together. One
    entry is always left for the padding pseudo-document.
    """
    if config.max_docs_per_batch is None:
        most = int(n_docs.max()) if len(n_docs) else 1
        return config.rows_per_batch * most + 1
    max_docs = config.max_docs_per_batch
    if config.tokens_per_batch is not None:
        need, what = int(n_docs.max()) if len(n_docs) else 0, "one row holds"
    else:
        rows = config.rows_per_batch
        # The rows with the most documents: a partition, not a sort of every row (start-up).
        most = n_docs if rows >= len(n_docs) else np.partition(n_docs, -rows)[-rows:]
        need = int(most.sum())
        what = f"a batch of {rows} row{'s' if rows > 1 else ''} can hold"
    if need + 1 > max_docs:
        raise ConfigError(
            f"max_docs_per_batch {max_docs} is too small for this dataset: {what} "
            f"{need} documents, plus one entry for padding; use at least {need + 1}"
        )
    return max_docs


def resolve_nodes(nodes: int | str) -> int:
    """`nodes`, with "auto" read from the launcher: torchrun's (and accelerate's, DeepSpeed's)
    `WORLD_SIZE / LOCAL_WORLD_SIZE`, else Slurm's `SLURM_NNODES` (srun starting every rank),
    else 1."""
    if nodes != "auto":
        return int(nodes)
    env = os.environ
    if env.get("WORLD_SIZE") and env.get("LOCAL_WORLD_SIZE"):
        world, local = env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]
        if not (world.isdigit() and local.isdigit() and int(local) > 0):
            raise ConfigError(
                f"nodes='auto': WORLD_SIZE={world!r} and LOCAL_WORLD_SIZE={local!r} are not "
                "process counts; give nodes= a number"
            )
        if int(world) % int(local):
            raise ConfigError(
                f"nodes='auto': WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local} "
                "(nodes running different numbers of ranks); give nodes= a number"
            )
        return int(world) // int(local)
    slurm = env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES")
    if slurm:
        if not slurm.isdigit() or int(slurm) < 1:
            raise ConfigError(f"nodes='auto': SLURM_NNODES={slurm!r} is not a node count")
        return int(slurm)
    return 1


def dist_rank_world(
    rank: int | None, world_size: int | None, context_parallel: tuple[int, int] | None = None
) -> tuple[int, int]:
    """This process's (rank, world size): the explicit values, else torch.distributed's, else (0, 1).

    Raises:
        ConfigError: Either is not an integer, or the rank is not in [0, world_size); the rank
            is not given while a launcher's WORLD_SIZE says several processes run and
            torch.distributed is not initialised (each would read rank 0's rows); or
            `context_parallel` splits batches over several ranks while torch.distributed runs
            several processes and either is not given: its global rank would give each rank
            of a context-parallel group other rows (each its share of another batch, silently).
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        processes = dist.get_world_size()
        if (
            context_parallel is not None
            and context_parallel[0] > 1
            and processes > 1
            and (rank is None or world_size is None)
        ):
            raise ConfigError(
                f"context_parallel={tuple(context_parallel)} while torch.distributed runs "
                f"{processes} processes: pass rank= and world_size=, the data-parallel rank and "
                "world size (every rank of a context-parallel group must read the same rows; "
                "torch.distributed's global rank gives each its own)"
            )
        if world_size == 1 and processes > 1:
            # accelerate's Accelerator() without cpu=True on a CPU machine says 0 of 1 under
            # torchrun: every process would read every row.
            warnings.warn(
                f"world_size=1 while torch.distributed runs {processes} processes: each reads "
                "every row. Right only when they form one tensor/context-parallel group; else "
                "pass the data-parallel rank and world size (accelerate without a GPU: "
                "Accelerator(cpu=True))",
                stacklevel=3,
            )
        rank = dist.get_rank() if rank is None else rank
        world_size = processes if world_size is None else world_size
    launched = os.environ.get("WORLD_SIZE", "")
    # Made before init_process_group under a launcher, each process would read as rank 0.
    if rank is None and world_size != 1 and launched.isdigit() and int(launched) > 1:
        raise ConfigError(
            f"WORLD_SIZE={launched} (a launcher started {launched} processes) but "
            "torch.distributed is not initialised, so every process would read as rank 0 "
            "(the same rows); make the dataset after init_process_group (or "
            "TrainingArguments, Accelerator), or pass rank= and world_size="
        )
    rank = 0 if rank is None else rank
    world_size = 1 if world_size is None else world_size
    check_int("rank", rank)
    check_int("world_size", world_size)
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(
            f"rank must be in [0, world_size), got rank={rank}, world_size={world_size}"
        )
    return rank, world_size
