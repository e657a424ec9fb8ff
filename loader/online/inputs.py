"""What the online packer is given: one token sequence per document, checked one by one.

A document is checked before it joins others, so a bad one fails alone and names itself, and
every document leaves here as a 1-D integer array whose ids fit the batch's int64.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
from numpy.typing import NDArray

from loader.record import INT64_MAX, check_ids, outside_int64, tensor_ids
from packtool.dataset.columns import LOSS_MASK, TOKEN, flat_parts, get, names, optional
from packtool.errors import ConfigError, DataError
from packtool.pack.columns import check_policy

DOCUMENTS = "an iterable of documents (token arrays or lists of ints)"
"""What a packer takes documents from, in words (for the error when it is given something else)."""


class TableRowError(DataError):
    """A row of a table given to `OnlinePacker.push_table` that is no document: `row` is its
    index in that table, `what` what is wrong with its `input_ids` (a reader of a file maps the
    row back to its place there: loader/online/streaming.py)."""

    def __init__(self, row: int, what: str) -> None:
        super().__init__(f"input_ids of row {row} {what}")
        self.row = row
        self.what = what


def iterable(source: Any, what: str) -> Iterator[Any]:
    """`iter(source)`, or a `DataError` saying `what` was expected and what came (a bare
    `TypeError`, "'int' object is not iterable", before)."""
    try:
        return iter(source)
    except TypeError:
        raise DataError(f"{what}, got {type(source).__name__}") from None


def several_sequences(arr: np.ndarray) -> bool:
    """Whether `arr` holds more than one sequence: `(B, T)` with B > 1, flattened, would become
    one of B sequences; `(1, T)` (a tokenizer's batch of one) is one."""
    return arr.ndim > 1 and (arr.shape[0] > 1 or sum(d > 1 for d in arr.shape) > 1)


def not_a_sequence(value: Any) -> str | None:
    """What `value` is ("a generator", "a dict") where it iterates, numpy having made a 0-d
    array of it (a generator, an iterator, a dict or a set is no sequence to numpy), else
    None: a plain number, a string or a 0-d array is a single value, not this."""
    if isinstance(value, (str, bytes)) or hasattr(value, "__array__"):
        return None
    if not isinstance(value, Iterable):
        return None
    name = type(value).__name__
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"


def doc_array(doc: Any, i: int, *, own: bool = False) -> NDArray:
    """One document's token ids as a 1-D array; `(1, T)` (a tokenizer's batch of one) is fine.

    A `(B, T)` array with B > 1 is refused: flattened, B sequences would become one document.
    `own`: the array is kept past the call, so one that may share the caller's memory (an
    array or tensor it could refill) is copied; one numpy made here from a list is not.
    """
    doc = tensor_ids(doc, f"document {i}: token ids")  # a CUDA or grad-tracking tensor too
    try:
        arr = np.asarray(doc)
    except ValueError as exc:  # ragged nested lists
        raise DataError(f"document {i} is not one sequence of token ids ({exc})") from None
    if arr.ndim == 0 and (what := not_a_sequence(doc)) is not None:  # e.g. a dataset's row
        raise DataError(f"document {i} must be a sequence of token ids (list/array), got {what}")
    if arr.ndim == 0:  # e.g. a flat token array given as the source: each id is no document
        raise DataError(
            f"document {i} is a single value ({arr.item()!r:.40}); give a 1-d array of token "
            "ids per document"
        )
    if own and not isinstance(doc, (list, tuple)):  # (numpy made a list's array here)
        arr = private(arr, doc)
    if several_sequences(arr):
        raise DataError(
            f"document {i} has shape {arr.shape}; give one 1-D token array per document"
        )
    # Per document, before it joins others: a bad one fails alone, naming itself.
    check_ids(arr, f"document {i}")
    arr = arr.reshape(-1)
    if not arr.size and arr.dtype.kind not in "iu":  # `[]` is float64 to numpy
        # Joined with other documents, a float64 one made their ids float64 too (a pack_stream
        # state's pending documents, refused at load as damaged).
        return np.zeros(0, np.int64)
    # One dtype for every document: a uint64 beside an int64 would meet in float64.
    return arr.astype(np.int64, copy=False) if arr.dtype == np.uint64 else arr


def joined_masks(masks: Iterable[Any], arrays: list[NDArray]) -> NDArray | None:
    """The loss masks of documents `arrays`, one each (arrays, lists or tensors, on any device
    and grad-tracking or not), checked against their documents and joined end to end (None for
    no documents). Each is copied as it is read when it may share the caller's memory (a
    source may refill one buffer for every document).

    Raises:
        DataError: Not one mask per document, or one of another length than its document.
    """
    masks = iterable(masks, "push_docs masks must be an iterable of loss masks, one per document")
    given = (tensor_ids(m, f"document {i}: loss mask", floats=True) for i, m in enumerate(masks))
    masks = [private(np.asarray(m), m) for m in given]
    if len(masks) != len(arrays):
        raise DataError(f"{len(masks)} loss masks for {len(arrays)} documents")
    masks = [m.reshape(-1) for m in masks]
    for i, (a, m) in enumerate(zip(arrays, masks, strict=True)):
        if len(m) != len(a):  # a total alone lets masks slide across documents
            raise DataError(f"document {i}: its loss mask has {len(m)} values for {len(a)} tokens")
    return np.concatenate(masks) if masks else None


def length_array(lengths: Any) -> NDArray[np.int64]:
    """The document lengths given to `push`, as int64.

    Raises:
        DataError: Not a 1-D integer array, or a length that is negative or past int64.
    """
    lengths = np.asarray(lengths)
    if lengths.ndim != 1 or (lengths.size and not np.issubdtype(lengths.dtype, np.integer)):
        raise DataError(f"lengths must be a 1-D integer array, got {lengths.dtype} {lengths.shape}")
    if lengths.dtype == np.uint64 and lengths.size and int(lengths.max()) > INT64_MAX:
        # cast to int64 it wrapped, and was called a negative length
        i = int(np.argmax(lengths))
        raise DataError(f"document {i} has a length of {int(lengths[i])}, too large (past int64)")
    lengths = lengths.astype(np.int64, copy=False)
    if lengths.size and int(lengths.min()) < 0:
        raise DataError(f"document {int(np.argmin(lengths))} has a negative length")
    return lengths


def doc_id_array(doc_ids: Any, n: int) -> NDArray[np.int64]:
    """The ids given for `n` documents, as int64.

    Raises:
        DataError: Not one integer per document, or one outside 0..2^63-1 (as in a dataset).
    """
    ids = np.asarray(doc_ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        # cast to int64 they were truncated: 1.5 and 1.7 both became document 1
        raise DataError(f"doc_ids must be integers, got dtype {ids.dtype}")
    if ids.shape != (n,):
        raise DataError(f"{ids.size} doc_ids for {n} documents")
    if ids.size and (low := int(ids.min())) < 0:  # verify refuses them too
        raise DataError(f"doc_ids must be >= 0, got {low}")
    if ids.size and (top := int(ids.max())) > INT64_MAX:  # checked before a cast wraps it
        raise DataError(f"doc_ids must be <= 2^63-1 (int64), got {top}")
    return ids.astype(np.int64, copy=False)


def flat_tokens(tokens: Any, n: int) -> NDArray:
    """The token ids of documents whose lengths sum to `n`, back to back: a 1-D integer array
    whose ids fit the batch's int64 (uint64 becomes int64).

    Raises:
        DataError: Not `n` ids in one dimension, non-integer ids, or ids outside 0..2^63-1.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 1 or n != len(tokens):
        raise DataError(f"lengths sum to {n} but {tokens.shape} token ids were given")
    if (bad := outside_int64(tokens)) is not None:  # numpy's dtype object
        raise DataError(f"token id {bad} is not in 0..2^63-1 (the batch's int64)")
    if tokens.size and not np.issubdtype(tokens.dtype, np.integer):
        # Float ids would be truncated to integers when a batch is collated.
        raise DataError(f"token ids must be integers, got dtype {tokens.dtype}")
    if tokens.dtype.kind == "i" and tokens.size and (low := int(tokens.min())) < 0:
        # A negative id would reach the model's embedding as an index error mid-training.
        raise DataError(f"token ids must be >= 0, got {low}")
    if tokens.dtype == np.uint64 and tokens.size and (top := int(tokens.max())) > INT64_MAX:
        # collate's int64 input_ids would wrap it to a negative index
        raise DataError(f"token id {top} does not fit int64 (the batch's input_ids)")
    if not tokens.dtype.isnative:  # big-endian ('>i4', np.fromfile): numba's kernels refused
        tokens = tokens.astype(tokens.dtype.newbyteorder("="))  # it with a TypingError
    # uint64 that fits: never met by a signed type in float64
    return tokens.astype(np.int64) if tokens.dtype == np.uint64 else tokens


def table_columns(table: Any, offsets: NDArray) -> dict[str, NDArray]:
    """The per-token columns (`loss_mask`) a tokenized table carries, flat, for its
    `input_ids` of list `offsets`; its `length` column, when it has one, checked against
    them (another reader may trust it).

    Raises:
        DataError: A column that is not one value per token; a `length` that is not the
            row's token count (`TableRowError`, naming the row).
    """
    if "length" in table.schema.names:
        col = table.column("length")
        if not pa.types.is_integer(col.type):
            raise DataError(f"the length column must hold integers, found {col.type}")
        held = np.diff(offsets)
        null = col.is_null().to_numpy(zero_copy_only=False)
        said = col.fill_null(0).to_numpy(zero_copy_only=False)
        bad = np.flatnonzero(null | (said != held))
        if bad.size:
            row, n = int(bad[0]), int(held[bad[0]])
            says = "is null" if null[row] else f"says {said[row]}"
            raise TableRowError(
                row, f"holds {n} token{'' if n == 1 else 's'} but its length column {says}"
            )
    extra = {}
    for c in optional():  # the declared per-token columns the table carries
        if c.level != TOKEN or c.name not in table.schema.names:
            continue
        c_off, c_values = flat_parts(table.column(c.name))  # a list, or bytes
        if not np.array_equal(c_off, offsets - offsets[0]):
            raise DataError(f"{c.name} does not have one value per token of input_ids")
        extra[c.name] = c_values
    return extra


def column_dict(columns: Any, loss_mask: Any) -> dict[str, Any]:
    """`push`'s per-token `columns` by name, with `loss_mask` when given, as a new dict.

    Raises:
        ConfigError: `columns` is not a dict (was dict()'s TypeError).
    """
    if columns is not None and not isinstance(columns, dict):
        raise ConfigError(
            f"columns must be a dict of per-token arrays by name, got {columns!r:.40}"
        )
    out = dict(columns or {})
    if loss_mask is not None:
        out[LOSS_MASK] = loss_mask
    return out


def token_columns(
    tokens: NDArray | None, columns: dict[str, Any], kind: tuple[str, ...] | None, long_docs: str
) -> tuple[dict[str, NDArray], tuple[str, ...]]:
    """Optional per-token columns (`loss_mask`) for `tokens`, each in its declared dtype, and
    their names in declared order (a packer's kind: `kind`, the one it has so far, or None).

    Raises:
        ConfigError: A column that is not per-token, another kind than `kind`, or one the
            long-document policy cannot keep (a mask with `split`).
        DataError: No tokens, not one value per token, a value that is not a whole number, or
            one outside the column's declared range.
    """
    out = {}
    for name, values in columns.items():
        try:
            c = get(name)
        except KeyError:  # was that bare KeyError
            carried = [c.name for c in optional() if c.level == TOKEN]
            raise ConfigError(
                f"unknown column {name!r}; the packer carries the per-token columns {carried}"
            ) from None
        if c.level != TOKEN:
            raise ConfigError(f"{name} is not a per-token column; the packer carries only those")
        if tokens is None:
            raise DataError(f"{name} needs the tokens it belongs to (push tokens with it)")
        arr = np.asarray(values)
        if arr.shape != tokens.shape or (arr.size and arr.dtype.kind not in "iubf"):
            raise DataError(
                f"{name} must have one value per token: got {arr.dtype} {arr.shape} for "
                f"{tokens.shape} token ids"
            )
        if arr.dtype.kind == "f" and arr.size and not np.all(np.floor(arr) == arr):
            # 0.5 or NaN became 0 in the column's integer dtype: a document dropped as
            # unsupervised without a word
            raise DataError(f"{name} values must be whole numbers ({c.doc})")
        low, high = c.min_value, c.max_value
        if arr.size and (
            (low is not None and arr.min() < low) or (high is not None and arr.max() > high)
        ):
            raise DataError(f"{name} values must be in {low}..{high} ({c.doc})")
        out[name] = arr.astype(c.numpy_dtype(), copy=False)
    mine = names(c for c in optional() if c.name in out)
    if kind is not None and kind != mine:
        raise ConfigError(
            f"do not mix documents with and without {', '.join(set(kind) ^ set(mine))} "
            "in one packer (a dataset is one kind)"
        )
    check_policy(mine, long_docs, api=True)
    return {name: out[name] for name in mine}, mine


def private(arr: NDArray, given: Any) -> NDArray:
    """`arr`, copied when it shares memory with `given`, what the caller passed (an array or a
    tensor it may refill once the call returns)."""
    return arr.copy() if np.may_share_memory(arr, given) else arr
