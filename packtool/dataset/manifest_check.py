"""`index.json` checked as a whole: enumerations, ranges and the counting identities.

`manifest.read_manifest` runs `manifest_problem` on every read, after the field types are known
to be right, so `verify`, `inspect` and the loader refuse the same manifests. What `packtool
pack` writes always passes; a hand-edited, foreign or damaged manifest fails with one sentence
naming the field and both sides of the identity it breaks. A count that is absent is not
checked (hand-made datasets may record fewer); `rows` and `tokens_out` are required.

The identities (docs/verify-inspect.md lists them too):

- tokens_in = tokens_out + tokens_truncated + tokens_dropped;
- documents_in = documents_packed + documents_dropped + documents_empty (>= documents_packed
  when those are not recorded); documents_split, documents_truncated <= documents_packed;
- documents_packed <= segments <= tokens_out, rows <= segments; a policy's counts are zero
  under the other policies (nothing is truncated under `split`, ...); tokens_supervised only
  with `loss_mask` in `columns`;
- rows and tokens_out are the sums over the shard entries; each shard holds rows..rows x max_len
  tokens; efficiency = tokens_out / (rows x max_len) to 6 decimals (as written);
- ceil(tokens_out / max_len) <= lower_bound_rows <= rows; with `extra`, lower_bound_l1 is that
  ceiling, lower_bound_rows = max(lower_bound_l1, lower_bound_l2), and rows_per_round has one
  entry per round, never increasing, ending at rows.

Each check is arithmetic on the manifest alone (no shard is opened): O(shards).
"""

from __future__ import annotations

import math
from typing import Any

from packtool.dataset.columns import LOSS_MASK

ALGORITHMS = ("ffd", "bfd")
"""The packing algorithms a manifest may record. Defined here, where a manifest is checked
(`dataset` is below `pack`); the packer's options take them from here (packtool/pack/limits.py)."""
LONG_DOC_POLICIES = ("split", "truncate", "drop")
"""What a document longer than max_len becomes: cut into max_len pieces, cut to one, or left out."""
MAX_LEN_LIMIT = 1 << 24
"""The largest max_len accepted (16,777,216 tokens). The kernels' work arrays are indexed by
length and remaining capacity, tens of bytes per unit of max_len: at this limit `packtool pack`
and `packtool stats` peak at ~1.2-1.3 GB whatever the corpus, and 2**30 was measured past 24 GB."""
DOC_ID_BITS = {"file_bits": 24, "offset_bits": 39}
"""`extra.doc_ids` of the `file_offset` scheme records its layout, always this one
(packtool/read/docids.py's FILE_BITS and OFFSET_BITS, which a test keeps equal to these)."""
EFFICIENCY_TOLERANCE = 1e-6
"""`packtool pack` records efficiency rounded to 6 decimals (error <= 5e-7)."""

_COUNTED = ("rows", "tokens")
"""What `extra.groups` records of each group (with its efficiency)."""

# Which counts each long-doc policy may make non-zero.
_POLICY_COUNTS = {
    "split": ("documents_split",),
    "truncate": ("documents_truncated", "tokens_truncated"),
    "drop": ("documents_dropped", "tokens_dropped"),
}


def manifest_problem(d: dict[str, Any]) -> str | None:
    """The first inconsistency of a manifest dict (types already checked), or None."""
    for check in (_tokenizer, _settings, _shards, _counts, _bounds, _extra):
        problem = check(d)
        if problem:
            return problem
    return None


def _tokenizer(d: dict[str, Any]) -> str | None:
    tok = d["tokenizer"]
    for key in ("kind", "name"):
        if not isinstance(tok.get(key), str) or not tok.get(key):
            return f"tokenizer.{key} must be a non-empty string, found {tok.get(key)!r}"
    if not isinstance(tok.get("sha256", ""), str):
        return f"tokenizer.sha256 must be a string, found {tok.get('sha256')!r}"
    # The engine that encoded (packtool/tokenizer/engines.py): any name, since it never changes an
    # id, so a reader need not know it; absent or null in datasets packed before engines.
    if tok.get("engine") is not None and not isinstance(tok["engine"], str):
        return f"tokenizer.engine must be a string or null, found {tok['engine']!r}"
    vocab = tok["vocab_size"]
    if vocab > 2**32:  # no shard holds such ids (uint32 at most)
        return f"tokenizer.vocab_size is {vocab:,}; token ids are stored as uint32 at most"
    for key in ("eos_id", "bos_id"):
        value = tok.get(key)
        if value is not None and value >= vocab:
            return f"tokenizer.{key} is {value} but token ids are below vocab_size {vocab}"
    return None


def _settings(d: dict[str, Any]) -> str | None:
    if d["algorithm"] not in ALGORITHMS:
        return f"algorithm {d['algorithm']!r} is not one of {list(ALGORITHMS)}"
    if d["long_docs"] not in LONG_DOC_POLICIES:
        return f"long_docs {d['long_docs']!r} is not one of {list(LONG_DOC_POLICIES)}"
    if d["max_len"] > MAX_LEN_LIMIT:
        return f"max_len {d['max_len']:,} is above the limit {MAX_LEN_LIMIT:,} (2**24)"
    if d.get("rounds", 1) < 1:
        return f"rounds must be >= 1, found {d['rounds']}"
    return None


def _counts(d: dict[str, Any]) -> str | None:
    counts = d["counts"]

    def get(key: str) -> int:
        return counts.get(key, 0)

    if "tokens_in" in counts:
        out = get("tokens_out") + get("tokens_truncated") + get("tokens_dropped")
        if counts["tokens_in"] != out:
            return (
                f"counts.tokens_in is {counts['tokens_in']:,} but tokens_out + tokens_truncated + "
                f"tokens_dropped = {out:,}"
            )
    if "documents_in" in counts and "documents_packed" in counts:
        parts = ("documents_packed", "documents_dropped", "documents_empty")
        if all(k in counts for k in parts):
            total = sum(counts[k] for k in parts)
            if counts["documents_in"] != total:
                return (
                    f"counts.documents_in is {counts['documents_in']:,} but documents_packed + "
                    f"documents_dropped + documents_empty = {total:,}"
                )
        elif counts["documents_in"] < counts["documents_packed"]:
            return (
                f"counts.documents_in is {counts['documents_in']:,}, below documents_packed "
                f"{counts['documents_packed']:,}"
            )
    if "documents_packed" in counts:
        for key in ("documents_split", "documents_truncated"):
            if get(key) > counts["documents_packed"]:
                return f"counts.{key} is {get(key):,}, above documents_packed {get('documents_packed'):,}"
    if "segments" in counts:
        seg = counts["segments"]
        if not get("documents_packed") <= seg <= get("tokens_out") or get("rows") > seg:
            return (
                f"counts.segments is {seg:,}; expected documents_packed ({get('documents_packed'):,})"
                f" <= segments <= tokens_out ({get('tokens_out'):,}) and rows ({get('rows'):,}) "
                "<= segments"
            )
    # A loss mask's counts (packtool/pack/columns.py): supervised tokens are tokens out, and a
    # document left without one is one of the dropped.
    if get("tokens_supervised") > get("tokens_out"):
        return (
            f"counts.tokens_supervised is {get('tokens_supervised'):,}, above tokens_out "
            f"{get('tokens_out'):,}"
        )
    columns = d.get("columns") if d.get("format_version") != 1 else None
    if "tokens_supervised" in counts and LOSS_MASK not in (columns or ()):
        # Written only with a mask (packtool/engines/finish.py): `columns` lost it (an edit),
        # and the loader would train on every token.
        return (
            f"counts.tokens_supervised is {counts['tokens_supervised']:,} but columns lists no "
            f"{LOSS_MASK} (the supervised counts come with a mask): restore index.json's columns"
        )
    if get("documents_unsupervised") > get("documents_dropped"):
        return (
            f"counts.documents_unsupervised is {get('documents_unsupervised'):,}, above "
            f"documents_dropped {get('documents_dropped'):,}"
        )
    policy = d["long_docs"]
    for other, keys in _POLICY_COUNTS.items():
        for key in keys if other not in (policy, "drop") else ():
            if get(key):
                return f"counts.{key} is {get(key):,} but long_docs is {policy!r}"
    if policy != "drop":
        # Under split or truncate the only documents dropped are those a loss mask leaves with no
        # supervised token (after truncation).
        dropped, unsupervised = get("documents_dropped"), get("documents_unsupervised")
        if dropped != unsupervised or (get("tokens_dropped") > 0) != (dropped > 0):
            return (
                f"counts.documents_dropped is {dropped:,} and tokens_dropped "
                f"{get('tokens_dropped'):,} but long_docs is {policy!r}, which drops only "
                f"the documents left with no supervised token (documents_unsupervised "
                f"{unsupervised:,})"
            )
    return None


def _shards(d: dict[str, Any]) -> str | None:
    counts, max_len = d["counts"], d["max_len"]
    for key, field in (("rows", "rows"), ("tokens_out", "tokens")):
        if key not in counts:
            return f"counts.{key} is missing"
        total = sum(s[field] for s in d["shards"])
        if counts[key] != total:
            return f"counts.{key} is {counts[key]:,} but the shards list {total:,} in total"
    for s in d["shards"]:
        if not s["rows"] <= s["tokens"] <= s["rows"] * max_len:
            return (
                f"shard {s['file']} lists {s['tokens']:,} tokens in {s['rows']:,} rows; expected "
                f"between 1 and max_len ({max_len:,}) tokens per row"
            )
    rows, tokens = counts["rows"], counts["tokens_out"]
    expected = tokens / (rows * max_len) if rows else 0.0
    if not math.isclose(d["efficiency"], expected, abs_tol=EFFICIENCY_TOLERANCE):
        return (
            f"efficiency is {d['efficiency']!r} but tokens / (rows * max_len) = {expected:.6f} "
            f"({tokens:,} / ({rows:,} * {max_len:,}))"
        )
    return None


def _bounds(d: dict[str, Any]) -> str | None:
    if "lower_bound_rows" not in d:
        return None
    counts, bound = d["counts"], d["lower_bound_rows"]
    l1 = -(-counts["tokens_out"] // d["max_len"])
    if not l1 <= bound <= counts["rows"]:
        return (
            f"lower_bound_rows is {bound:,}; expected ceil(tokens_out / max_len) = {l1:,} <= it "
            f"<= rows ({counts['rows']:,})"
        )
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _doc_ids(info: Any) -> str | None:
    """`extra.doc_ids` as `packtool.read.docids` writes it (`inspect --row` reads it)."""
    if not isinstance(info, dict) or not isinstance(info.get("scheme", ""), str):
        return f"extra.doc_ids is {info!r}; expected an object with a scheme"
    files, units = info.get("files"), info.get("units")
    if "files" in info and not (isinstance(files, list) and all(isinstance(f, str) for f in files)):
        return f"extra.doc_ids.files is {files!r}; expected a list of input files"
    if units is not None and not (
        isinstance(units, list)
        and all(isinstance(u, str) for u in units)
        and (files is None or len(units) == len(files))
    ):
        return f"extra.doc_ids.units is {units!r}; expected one unit (text) per input file"
    sizes = info.get("sizes")
    if sizes is not None and not (
        isinstance(sizes, list)
        and all(_is_int(n) and n >= 0 for n in sizes)
        and (files is None or len(sizes) == len(files))
    ):
        return f"extra.doc_ids.sizes is {sizes!r}; expected one size (bytes) per input file"
    name = info.get("sources")
    if "sources" in info and (
        not isinstance(name, str) or not name or "/" in name or name in (".", "..")
    ):
        # `sources.json` beside index.json (`packtool.read.docids`): a reader opens no other file.
        return f"extra.doc_ids.sources is {name!r}; expected a file name inside the dataset folder"
    if info.get("scheme") == "file_offset":  # ids that `inspect` decodes with these bits
        for key, bits in DOC_ID_BITS.items():
            if not (_is_int(info.get(key)) and info[key] == bits):
                return (
                    f"extra.doc_ids.{key} is {info.get(key)!r}; file_offset ids are always "
                    + " and ".join(f"{k} {v}" for k, v in DOC_ID_BITS.items())
                )
    return None


def _extra(d: dict[str, Any]) -> str | None:
    extra, counts = d.get("extra") or {}, d["counts"]
    if not isinstance(extra, dict):
        return f"extra is {extra!r}; expected an object"
    for key in ("lower_bound_l1", "lower_bound_l2"):
        if key in extra and not (_is_int(extra[key]) and extra[key] >= 0):
            return f"extra.{key} is {extra[key]!r}; expected a row count"
    if "doc_ids" in extra:
        problem = _doc_ids(extra["doc_ids"])
        if problem:
            return problem
    l1 = -(-counts["tokens_out"] // d["max_len"])
    if "lower_bound_l1" in extra and extra["lower_bound_l1"] != l1:
        return (
            f"extra.lower_bound_l1 is {extra['lower_bound_l1']!r} but ceil(tokens_out / max_len) "
            f"= {l1:,} (max_len {d['max_len']:,})"
        )
    if "lower_bound_l1" in extra and "lower_bound_l2" in extra and "lower_bound_rows" in d:
        bound = max(extra["lower_bound_l1"], extra["lower_bound_l2"])
        if d["lower_bound_rows"] != bound:
            return f"lower_bound_rows is {d['lower_bound_rows']:,} but max(L1, L2) = {bound:,}"
    rounds = extra.get("rows_per_round")
    if rounds is not None:
        ok = (
            isinstance(rounds, list)
            and len(rounds) == d.get("rounds", 1)
            and all(_is_int(r) for r in rounds)
            and all(a >= b for a, b in zip(rounds, rounds[1:], strict=False))
            and rounds[-1] == counts["rows"]
        )
        if not ok:
            return (
                f"extra.rows_per_round is {rounds!r}; expected {d.get('rounds', 1)} row counts, "
                f"never increasing, ending at rows ({counts['rows']:,})"
            )
    if "groups" in extra:
        problem = groups_problem(extra["groups"], counts, d["max_len"], "extra.groups")
        if problem:
            return problem
    if "groups_file" in extra:
        problem = groups_file_problem(extra)
        if problem:
            return problem
    if "supervised_efficiency" in extra and "tokens_supervised" in counts:
        return _fraction_of_slots(
            extra, "supervised_efficiency", counts["tokens_supervised"], counts["rows"],
            d["max_len"], "extra",
        )  # fmt: skip
    return None


def groups_problem(groups: Any, counts: dict[str, Any], max_len: int, where: str) -> str | None:
    """The first problem of a dataset's groups (`where`: `extra.groups` in index.json, or
    `groups` in groups.json, packtool/dataset/groups.py), or None: each group's rows and tokens
    counts, adding up to the dataset's, each efficiency its tokens / (rows x max_len)."""
    if groups is not None and not isinstance(groups, dict):  # a text passed unchecked
        return (
            f"{where} is {groups!r}; expected an object mapping each group to its rows and tokens"
        )
    for name, g in (groups or {}).items():  # (rows 5.0 or true were added up)
        if not (isinstance(g, dict) and all(_is_int(g.get(k)) and g[k] >= 0 for k in _COUNTED)):
            return f"{where}[{name!r}] is {g!r}; expected its rows and tokens (counts)"
    if groups:
        rows = sum(g["rows"] for g in groups.values())
        tokens = sum(g["tokens"] for g in groups.values())
        if (rows, tokens) != (counts["rows"], counts["tokens_out"]):
            return (
                f"{where} add up to {rows:,} rows and {tokens:,} tokens; the dataset has "
                f"{counts['rows']:,} and {counts['tokens_out']:,}"
            )
        for name, g in groups.items():
            problem = _fraction_of_slots(
                g, "efficiency", g["tokens"], g["rows"], max_len, f"{where}[{name!r}]"
            )
            if problem:
                return problem
    return None


def groups_file_problem(extra: dict[str, Any]) -> str | None:
    """`extra.groups_file`, the record of a dataset's groups kept beside index.json, or None."""
    info = extra["groups_file"]
    if "groups" in extra:
        return "extra.groups and extra.groups_file are both given; a dataset lists its groups once"
    name = info.get("file") if isinstance(info, dict) else None
    ok = (
        isinstance(name, str)
        and name not in ("", ".", "..")
        and "/" not in name
        and "\\" not in name
        and _is_int(info.get("num_groups"))
        and info["num_groups"] > 0
        and isinstance(info.get("sha256"), str)
        and len(info["sha256"]) == 64
        and all(c in "0123456789abcdef" for c in info["sha256"])
    )
    if not ok:
        return (
            f"extra.groups_file is {info!r}; expected the file of the groups (a name inside the "
            "dataset folder), num_groups and its sha256"
        )
    return None


def _fraction_of_slots(
    d: dict[str, Any], key: str, tokens: int, rows: int, max_len: int, where: str
) -> str | None:
    """A recorded share of the token slots (`tokens / (rows * max_len)`, as `pack` rounds it),
    or a sentence saying it is not that; a group's efficiency and the supervised efficiency."""
    if key not in d:
        return None
    expected = tokens / max(rows * max_len, 1)
    value = d[key]
    if not isinstance(value, (int, float)) or not math.isclose(
        value, expected, abs_tol=EFFICIENCY_TOLERANCE
    ):
        return f"{where}.{key} is {value!r} but tokens / (rows * max_len) = {expected:.6f}"
    return None
