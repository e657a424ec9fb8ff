"""Checkpoints of online packing: the `OnlinePacker` state and the packed rows inside states.

`OnlinePacker.state_dict()` and `StreamingPackedDataset.state_dict()` hold arrays (as torch
tensors, `saved`: `torch.load`'s default `weights_only=True` refuses numpy's arrays, so until
2026-12-07 a checkpoint loaded as torch documents it failed), counters and flags; `loaded`
turns them back into numpy arrays (a state pickled with numpy's arrays still loads). Everything
is checked before any of it is used: a damaged part would otherwise fail later as a bare
KeyError / TypeError, or worse, be used as is (a truthy string for `closed`, a count gone
missing, a segment pointing outside its tokens). A bad part is a `DataError` naming its
key path (`packer.buffer.length`, `ready[0].tokens`) and saying the checkpoint is damaged.
"""

from __future__ import annotations

import warnings
from dataclasses import fields
from typing import Any

import numpy as np
import torch

from loader.config import OnlineConfig
from loader.online.rows import PackedRows
from loader.online.segments import Segments
from packtool.dataset.columns import optional
from packtool.errors import DataError
from packtool.pack.chunk import PackCounts

STATE_KEYS = frozenset(
    (
        "config",
        "seed_key",
        "buffer",
        "out",
        "has_tokens",
        "dtype",
        "counts",
        "packs",
        "held_rows",
        "forced_rows",
        "flushes",
        "next_doc_id",
        "closed",
    )
)
"""The keys of `OnlinePacker.state_dict()` (and `columns`, absent from states saved before
optional columns existed)."""
_COUNTERS = ("packs", "held_rows", "forced_rows", "flushes", "next_doc_id")
_LATER_COUNTS = frozenset(("documents_unsupervised", "tokens_supervised"))
"""Counts added with the loss mask: a state saved before them lacks them (they were 0)."""
LATER_KEYS = _LATER_COUNTS | {"columns", "pending"}
"""Keys added with optional columns (and `pending`, the documents a running `pack_stream` read
but had not pushed): a state saved before them lacks them and loads with their defaults (no
optional column, counts 0, nothing pending); present, they are checked like every other part."""
_INT64_MAX = np.iinfo(np.int64).max
_COUNT_KEYS = frozenset(f.name for f in fields(PackCounts))
_ROWS_KEYS = tuple(f.name for f in fields(PackedRows) if f.name != "columns")
_SEGMENT_KEYS = tuple(f.name for f in fields(Segments) if f.name != "columns")


def saved(value: Any) -> Any:
    """`value` with every numpy array a torch tensor sharing its memory and every numpy scalar
    a Python number: what `torch.load(..., weights_only=True)`, torch's default, accepts."""
    if isinstance(value, np.ndarray):
        with warnings.catch_warnings():  # a read-only array (an Arrow buffer): only read
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: saved(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(saved(v) for v in value)
    return value


def loaded(value: Any) -> Any:
    """`value` with every torch tensor a numpy array sharing its memory (`saved` undone); what
    is not a tensor is left as it is, for the checks to judge."""
    if isinstance(value, torch.Tensor):
        try:
            return value.detach().cpu().numpy()
        except (TypeError, RuntimeError):  # a dtype numpy lacks (bfloat16): damage, as it is
            return value
    if isinstance(value, dict):
        return {k: loaded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(loaded(v) for v in value)
    return value


def config_state(config: OnlineConfig) -> dict[str, Any]:
    """The settings as a plain dict (what a state records, and compares on load)."""
    return {f.name: getattr(config, f.name) for f in fields(config)}


def settings_diff(theirs: dict[Any, Any], mine: dict[str, Any]) -> list[str]:
    """The keys whose values differ (or that only one side has), as sorted strings."""
    missing = object()

    def differs(a: Any, b: Any) -> bool:
        try:
            return not bool(a == b)
        except (TypeError, ValueError):  # e.g. an array where a number was saved
            return True

    keys = {*mine, *theirs}
    return sorted(str(k) for k in keys if differs(theirs.get(k, missing), mine.get(k, missing)))


def _show(value: Any) -> str:
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return f"an array of {value.dtype} {tuple(value.shape)}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class StateCheck:
    """Checks parts of a state; each failure is a `DataError` "malformed <owner> state: <path>
    <problem>; the checkpoint is damaged"."""

    def __init__(self, owner: str) -> None:
        self.owner = owner

    def fail(self, path: str, problem: str) -> DataError:
        """The error to raise for the part at `path`."""
        return DataError(
            f"malformed {self.owner} state: {path} {problem}; the checkpoint is damaged"
        )

    def dict_(self, value: Any, path: str, keys: Any) -> dict[str, Any]:
        """`value`, a dict holding `keys` (`path` empty: the state itself)."""
        if not isinstance(value, dict):
            raise self.fail(path, f"is {_show(value)}, not a dict")
        for key in keys:
            if key not in value:
                raise self.fail(f"{path}.{key}" if path else key, "is missing")
        return value

    def int_(self, value: Any, path: str, lo: int | None = 0, *, int64: bool = True) -> int:
        """`value`, an integer (>= `lo` unless None) that fits int64 unless `int64` is False:
        every count, id and epoch a state holds does (2**63 as `next_doc_id` or `epoch` was
        numpy's OverflowError at the next push or iteration); a seed need not."""
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise self.fail(path, f"is {_show(value)}, not an integer")
        if lo is not None and value < lo:
            raise self.fail(path, f"is {value}, not >= {lo}")
        if int64 and value > _INT64_MAX:
            raise self.fail(path, f"is {value}, past int64")
        return int(value)

    def bool_(self, value: Any, path: str) -> bool:
        if not isinstance(value, (bool, np.bool_)):
            raise self.fail(path, f"is {_show(value)}, not True or False")
        return bool(value)

    def ints(self, value: Any, path: str, n: int | None = None) -> np.ndarray:
        """`value`, a 1-D array of integers >= 0 (of `n` entries when given): every array a
        state holds is ids, lengths, offsets or counts, none of which is ever negative."""
        if not isinstance(value, np.ndarray) or value.ndim != 1 or value.dtype.kind not in "iu":
            raise self.fail(path, f"is {_show(value)}, not a 1-D integer array")
        if n is not None and len(value) != n:
            raise self.fail(path, f"has {len(value)} entries where {n} are needed")
        if value.size and (low := int(value.min())) < 0:
            raise self.fail(path, f"holds {low}, and none of its values may be negative")
        if value.dtype == np.uint64 and value.size and (high := int(value.max())) > _INT64_MAX:
            # It would come out as a negative int64 id.
            raise self.fail(path, f"holds {high}, past the largest int64")
        return value

    def tokens(self, value: Any, path: str, with_tokens: bool | None, need: bool) -> None:
        """Token ids: an integer array, or None for a lengths-only packer (`with_tokens` False).

        `need`: there are segments whose tokens it must hold.
        """
        if value is None:
            if with_tokens and need:
                raise self.fail(path, "is None but the state holds tokens")
            return
        if with_tokens is False:
            raise self.fail(path, f"is {_show(value)} but the packer was fed lengths only")
        self.ints(value, path)


def _check_rows(
    check: StateCheck, state: Any, path: str, with_tokens: bool | None, max_len: int | None
) -> None:
    rows = check.dict_(state, path, _ROWS_KEYS)
    seg_len = check.ints(rows["seg_len"], f"{path}.seg_len")
    row_docs = check.ints(rows["row_docs"], f"{path}.row_docs")
    n = len(seg_len)
    if len(row_docs) == 0 or row_docs[0] != 0 or row_docs[-1] != n or (np.diff(row_docs) < 0).any():
        raise check.fail(f"{path}.row_docs", f"does not split {n} segments into rows")
    if max_len is not None and n:
        ends = np.r_[0, np.cumsum(seg_len, dtype=np.int64)][row_docs.astype(np.int64)]
        if (longest := int(np.diff(ends).max())) > max_len:  # it would be emitted as it is
            raise check.fail(f"{path}.seg_len", f"makes a row of {longest} tokens > max_len")
    check.ints(rows["doc_ids"], f"{path}.doc_ids", n)
    check.ints(rows["doc_chunks"], f"{path}.doc_chunks", n)
    tokens = rows["tokens"]
    check.tokens(tokens, f"{path}.tokens", with_tokens, need=n > 0)
    if tokens is not None and len(tokens) != int(seg_len.sum()):
        raise check.fail(
            f"{path}.tokens", f"has {len(tokens)} ids where the segments need {int(seg_len.sum())}"
        )
    _check_columns(check, rows.get("columns"), f"{path}.columns", tokens)


def _check_columns(check: StateCheck, cols: Any, path: str, tokens: Any) -> None:
    """Optional per-token columns: declared ones, each one integer per token."""
    if cols is None:
        return
    if not isinstance(cols, dict):
        raise check.fail(path, f"is {_show(cols)}, not a dict")
    known = {c.name for c in optional()}
    for name, values in cols.items():
        if name not in known:
            raise check.fail(f"{path}.{name}", "is not a declared optional column")
        n = None if tokens is None else len(tokens)
        if not isinstance(values, np.ndarray) or values.ndim != 1 or values.dtype.kind not in "iuf":
            raise check.fail(f"{path}.{name}", f"is {_show(values)}, not a 1-D numeric array")
        if n is not None and len(values) != n:
            raise check.fail(f"{path}.{name}", f"has {len(values)} entries where {n} are needed")


def check_rows_state(
    state: Any,
    *,
    owner: str,
    path: str,
    with_tokens: bool | None = None,
    max_len: int | None = None,
) -> None:
    """Refuse a damaged `PackedRows.to_state()` inside a state.

    Args:
        state: The rows' state.
        owner: The class whose state holds it (for the message).
        path: Its key path in that state (`pending`, `ready[0]`, ...).
        with_tokens: True: rows must carry tokens (unless empty); False: must not; None: either.
        max_len: No row may be longer (None: not checked).

    Raises:
        DataError: A part missing or malformed.
    """
    _check_rows(StateCheck(owner), state, path, with_tokens, max_len)


def check_packer_state(
    state: Any, config: OnlineConfig, *, owner: str = "OnlinePacker", at: str = ""
) -> Any:
    """Refuse what is not an intact `OnlinePacker` state saved with `config`; the state, its
    tensors as numpy arrays (`loaded`), if it is one.

    Args:
        state: An `OnlinePacker.state_dict()`.
        config: The settings of the packer that loads it.
        owner: The class whose state this is, or holds it (for the message).
        at: Its key path inside a larger state (`"packer."`); empty for a packer's own state.

    Raises:
        DataError: Not a packer state, one saved with other settings, or a damaged one.
    """
    state = loaded(state)  # tensors (or numpy arrays, in states saved before 2026-12-07)
    check = StateCheck(owner)
    if not at:
        # A packer's own state: say plainly when it is not one at all.
        missing = sorted(STATE_KEYS - set(state)) if isinstance(state, dict) else sorted(STATE_KEYS)
        if not isinstance(state, dict) or missing:
            raise DataError(
                "not an OnlinePacker state (from state_dict())"
                + (f": missing {', '.join(missing)}" if isinstance(state, dict) else "")
            )
    check.dict_(state, at.rstrip("."), sorted(STATE_KEYS))
    check.dict_(state["config"], f"{at}config", ())
    diff = settings_diff(state["config"], config_state(config))
    if diff:
        if not at:
            raise DataError(f"the packer state was saved with other settings ({', '.join(diff)})")
        # Inside a dataset state whose own settings matched: the packer's part is damaged.
        key, saved = diff[0], state["config"]
        problem = f"is {_show(saved[key])}" if key in saved else "is missing"
        raise check.fail(f"{at}config.{key}", problem)
    seed_key = state["seed_key"]
    if not isinstance(seed_key, (list, tuple)):
        raise check.fail(f"{at}seed_key", f"is {_show(seed_key)}, not a list of integers")
    for i, k in enumerate(seed_key):
        check.int_(k, f"{at}seed_key[{i}]", int64=False)  # the constructor refuses a negative one
    for key in _COUNTERS:
        check.int_(state[key], f"{at}{key}")
    check.bool_(state["closed"], f"{at}closed")
    has_tokens = state["has_tokens"]
    if has_tokens is not None:
        has_tokens = check.bool_(has_tokens, f"{at}has_tokens")
    dtype = state["dtype"]
    if dtype is not None:
        try:
            ok = isinstance(dtype, str) and np.dtype(dtype).kind in "iu"
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise check.fail(f"{at}dtype", f"is {_show(dtype)}, not an integer dtype")
    counts = check.dict_(state["counts"], f"{at}counts", sorted(_COUNT_KEYS - _LATER_COUNTS))
    extra = sorted(str(k) for k in set(counts) - _COUNT_KEYS)
    if extra:
        raise check.fail(f"{at}counts.{extra[0]}", "is not a packing count")
    for key in sorted(_COUNT_KEYS & set(counts)):
        check.int_(counts[key], f"{at}counts.{key}")
    columns = state.get("columns")
    if columns is not None:
        known = {c.name for c in optional()}
        if not isinstance(columns, list) or not all(c in known for c in columns):
            raise check.fail(f"{at}columns", f"is {_show(columns)}, not a list of column names")
    if state["buffer"] is not None:
        if has_tokens is None:  # set by the first push, and a buffer needs a push
            raise check.fail(f"{at}has_tokens", "is None but the buffer holds segments")
        _check_buffer(check, state["buffer"], f"{at}buffer", has_tokens, config)
    if state["out"] is not None:
        _check_rows(check, state["out"], f"{at}out", has_tokens, config.max_len)
    if state.get("pending") is not None:
        _check_pending(check, state["pending"], f"{at}pending", has_tokens, state["closed"])
    return state


def _check_pending(
    check: StateCheck, state: Any, path: str, has_tokens: bool | None, closed: bool
) -> None:
    """Documents read from a source and not yet pushed: token ids and their lengths."""
    pending = check.dict_(state, path, ("tokens", "lengths"))
    lengths = check.ints(pending["lengths"], f"{path}.lengths")
    tokens = check.ints(pending["tokens"], f"{path}.tokens")
    if len(tokens) != int(lengths.sum()):
        raise check.fail(
            f"{path}.tokens", f"has {len(tokens)} ids where the lengths need {int(lengths.sum())}"
        )
    if has_tokens is False or closed:
        why = "closed" if closed else "fed lengths only"
        raise check.fail(path, f"holds documents but the packer was {why}")


def _check_buffer(
    check: StateCheck, state: Any, path: str, has_tokens: bool | None, config: OnlineConfig
) -> None:
    buf = check.dict_(state, path, _SEGMENT_KEYS)
    length = check.ints(buf["length"], f"{path}.length")
    n, max_len = len(length), config.max_len
    if n > config.buffer_docs:  # a push packs it at buffer_docs; past that, the next one failed
        raise check.fail(f"{path}.length", f"holds {n} segments > buffer_docs {config.buffer_docs}")
    if n and length.max() > max_len:  # every buffered piece was cut to max_len when pushed
        raise check.fail(f"{path}.length", f"has a segment of {int(length.max())} > max_len")
    if n and length.min() == 0:  # empty documents are counted, never buffered
        raise check.fail(f"{path}.length", "has a segment of 0 tokens")
    start = check.ints(buf["start"], f"{path}.start", n)
    for key in ("doc", "chunk", "holds"):
        check.ints(buf[key], f"{path}.{key}", n)
    tokens = buf["tokens"]
    check.tokens(tokens, f"{path}.tokens", has_tokens, need=n > 0)
    # A segment outside its tokens would be gathered from other segments' tokens.
    if tokens is not None and n and (start + length).max() > len(tokens):
        raise check.fail(f"{path}.start", f"puts a segment outside the {len(tokens)} token ids")
    _check_columns(check, buf.get("columns"), f"{path}.columns", tokens)
