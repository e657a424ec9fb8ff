"""The end of a run: the root of the tail tree, then `index.json` written last.

The partitions' tails are packed by the tail tree (packtool/engines/merge.py): merge nodes of
at most `merge.TAIL_FAN_IN` (F) children each, run level by level on the engine's workers
(`base.Run.waves`). What is left for the driver is the **root**, `final_stage`: the tails of
the last level (at most F x 32 rows of at most max_len tokens, whatever the number of
partitions), packed with no tail of its own into the last shards
(`shard-RRRRRR-KKKKK.parquet`, R = the root's id) and a record like a partition's (rows, no
documents: the pieces were counted where they were read). With at most F partitions the root
is "partition N" (N = the number of partitions) and packs every partition's tail, as the single
final stage did before the tree. Its record makes a resume skip it too.

`index.json` is then streamed: its head (counts, bounds, options) comes from the running sums,
its shard list from the records, read one at a time in id order (partitions, merge nodes, the
root), so neither the driver nor this stage ever holds every shard's entry. Nothing is renamed
or re-hashed: the shards were written under their final names with their sha256.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packtool.dataset import groups as group_record
from packtool.dataset.columns import names, required, written
from packtool.dataset.manifest import INDEX_FILE, Manifest
from packtool.engines import merge, records
from packtool.engines.context import WorkerContext
from packtool.engines.merge import TailTree
from packtool.engines.records import Totals
from packtool.engines.summary import PackSummary
from packtool.errors import ConfigError, DataError, option_choice
from packtool.read import docids
from packtool.stats import lengths as stats
from packtool.storage import local as storage
from packtool.storage import writing


def final_stage(ctx: WorkerContext, tree: TailTree) -> dict[str, Any]:
    """Pack the root of the tail tree (its children's tails, at most F x 32 rows) in this
    process; write its shards and its record ("partition" = `tree.root`, `final`: True)."""
    return merge.merge_node(ctx, tree.descriptor(tree.root))


def manifest_head(
    config: Any,
    totals: Totals,
    identity: dict[str, Any],
    columns: tuple[str, ...],
    doc_ids: dict[str, Any],
    partitions: int,
    fingerprint: str,
    special_names: dict[str, str] | None = None,
    chat_template: dict[str, Any] | None = None,
    *,
    work: Path,
) -> tuple[PackSummary, Manifest]:
    """The summary and `index.json` without its shard list, from the running sums;
    `fingerprint` is the run's (`resume_checks.fingerprint_digest`), which `--resume` compares;
    `special_names` where the EOS and BOS defaults came from (`Tokenizer.special_names`);
    `chat_template` the template chat records were rendered with (`sft.encode.template_record`).
    Past `groups.INLINE_GROUPS` groups their list is written to `groups.json` in `work` (the
    staging folder) and `index.json` records only that file (packtool/dataset/groups.py).

    Raises:
        DataError: no document, or nothing left to pack.
        ConfigError: `--group-by` named a field no document has.
    """
    counts = totals.counts
    skips = totals.skips
    # Empty documents are dropped by the reader (a counted skip); they are documents all the same.
    empty_read = skips.get("empty", 0)
    counts.documents_in += empty_read
    counts.documents_empty += empty_read
    other_skips = sum(skips.values()) - empty_read
    note = _skip_note(totals)
    if counts.documents_in == 0:
        raise DataError(f"no documents in {', '.join(config.inputs)}" + note)
    if counts.tokens_out == 0:
        raise DataError("every document was empty or dropped; nothing to pack" + note)
    if config.pack.group_by is not None and set(totals.groups) == {""}:
        raise ConfigError(
            f"{option_choice('--group-by', 'group_by', config.pack.group_by)}: no document has "
            "this field, or a value "
            "for it (missing, null or empty in every one: check the name; nothing was "
            "committed)"
        )
    max_len = config.pack.max_len
    l1, l2 = stats.lower_bounds_from_histogram(totals.histogram, max_len)
    efficiency = counts.tokens_out / (counts.rows * max_len)
    # The running sums themselves, in name order (a sorted list of names, not a copy of the
    # sums: at 10^6 groups the driver holds them once).
    groups = {k: totals.groups[k] for k in sorted(totals.groups)}
    summary = PackSummary(
        counts=counts,
        rows_per_round=[int(r) for r in totals.rounds],
        lower_bound_l1=l1,
        lower_bound_l2=l2,
        efficiency=efficiency,
        num_shards=totals.shards,
        groups=groups,
        skips=dict(sorted(skips.items())),
        skip_examples={k: list(totals.examples.get(k, [])) for k in sorted(skips)},
        partitions=partitions,
        out_dir=config.out_dir,
        columns=tuple(c for c in written(columns) if c not in names(required())),
        max_len=max_len,
        tail_pieces=totals.tail_pieces,
        tokenizer=dict(identity),
    )
    counts_out = counts.to_dict()
    if not summary.masked:  # supervised counts mean nothing without a mask
        del counts_out["documents_unsupervised"], counts_out["tokens_supervised"]
    manifest = Manifest(
        tokenizer=identity,
        max_len=max_len,
        algorithm=config.pack.algorithm,
        seed=config.pack.seed,
        rounds=config.pack.rounds,
        long_docs=config.pack.long_docs,
        counts={**counts_out, "documents_skipped": int(other_skips)},
        efficiency=round(efficiency, 6),
        lower_bound_rows=summary.lower_bound,
        shards=(),
        command=config.command,
        columns=written(columns),  # with the derived ones (seq_lengths) pack_table adds
        extra={
            "rows_per_round": summary.rows_per_round,
            "lower_bound_l1": l1,
            "lower_bound_l2": l2,
            "chunk_docs": config.chunk_docs,
            "partition_size": config.partition_size,
            "partitions": partitions,
            **group_record.record(work, groups, max_len),
            "skips": summary.skips,
            "group_by": config.pack.group_by,
            **(
                {"supervised_efficiency": round(summary.supervised_efficiency, 6)}
                if summary.masked
                else {}
            ),
            "doc_ids": doc_ids,
            "fingerprint": fingerprint,
            **({"special_tokens": dict(special_names)} if special_names else {}),
            **({"chat_template": dict(chat_template)} if chat_template else {}),
        },
    )
    return summary, manifest


def _skip_note(totals: Totals) -> str:
    if not totals.skips:
        return ""
    parts = [
        f"{reason} {n} (e.g. {', '.join(totals.examples.get(reason, []))})"
        for reason, n in sorted(totals.skips.items())
    ]
    return f" ({sum(totals.skips.values())} skipped: " + "; ".join(parts) + ")"


def doc_id_record(
    work: Path, files: list[str], units: list[str], sizes: list[int]
) -> dict[str, Any]:
    """`extra.doc_ids`, writing `sources.json` into `work` when there are many files. `sizes`:
    each file's bytes as read, which `inspect` compares before counting a line in it."""
    if len(files) <= docids.INLINE_FILES:
        return docids.record(files, units, sizes=sizes)
    import hashlib

    data = docids.sources_bytes(files, units, sizes)
    writing.write_atomic(work / docids.SOURCES_FILE, data, make_parent=True)
    return docids.record(files, units, sources_sha256=hashlib.sha256(data).hexdigest())


def remove_temporaries(work: Path) -> None:
    """Delete the hidden `.NAME.<writer>.tmp` files a killed writer left in `work` (one listing:
    a worker killed mid-shard, a killed Ray actor), so the dataset holds none of them."""
    for e in storage.list_dir(work):
        if writing.looks_temporary(e.name) and storage.is_file(e):
            writing.remove_file(e)


def write_index(work: Path, manifest: Manifest, root: int) -> Path:
    """`index.json` with the shards of records 0..root (partitions, merge nodes, the root last),
    streamed.

    The same JSON as `manifest.write_manifest` would give for the full manifest, written
    through a temporary file and a rename (a reader never sees half of it).
    """
    head = manifest.to_dict()
    marker = "__packtool_shards__"
    head["shards"] = marker
    text = json.dumps(head, indent=2)
    before, after = text.split(f'"{marker}"')
    path = work / INDEX_FILE
    with writing.atomic_output(path, text=True) as f:
        f.write(before + "[")
        first = True
        for record in records.records_in_order(work, root + 1):
            for shard in record["shards"]:
                f.write(("\n    " if first else ",\n    ") + json.dumps(shard))
                first = False
        f.write("\n  ]" if not first else "]")
        f.write(after + "\n")
    return path
