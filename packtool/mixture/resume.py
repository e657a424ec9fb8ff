"""Resuming a mixture schedule from a saved state: onto the same mixture, or a changed one.

`Schedule` (packtool/mixture/schedule.py) calls `restore` on a new schedule before its first
row: the same mixture continues exactly; a changed one (weights, caps, unit, sources added or
removed) continues every kept source from its cursor in a new segment, and says what changed
(`changes`, which the loader turns into its "resuming a changed mixture" warning). The state's
format and checks are packtool/mixture/schedule_state.py; this module works on the schedule it
is given (its counters and arrays), importing nothing of it.
"""

from __future__ import annotations

import os
from typing import Any

from packtool.errors import DataError
from packtool.mixture.schedule_state import check, ended_at_total


def _same_mixture(sch: Any, state: dict[str, Any]) -> bool:
    # The sources' order as saved (`order`; a state of before it: its keys' order, which a
    # save with sorted keys (json.dumps(sort_keys=True)) changed into a "changed mixture").
    if state["unit"] != sch.unit or state.get("order", list(state["sources"])) != sch.names:
        return False
    for spec in sch.specs:
        s = state["sources"][spec.name]
        if (float(s["weight"]), s.get("max_epochs"), s["at_cap"]) != (
            float(spec.weight),
            spec.max_epochs,
            spec.at_cap,
        ):
            return False
    return True


def _added(name: str, fingerprint: str | None, saved: dict[str, Any]) -> str:
    """The change an added source makes: it starts at its first row. The data of a saved
    source under a new name (a rename) is said to be that: its rows come again."""
    same = [n for n, e in saved.items() if fingerprint and e.get("fingerprint") == fingerprint]
    if not same:
        return f"added {name!r} (starts at its first row)"
    return (
        f"added {name!r} (starts at its first row: the same data as the saved source "
        f"{same[0]!r}, whose rows come again; keep the name {same[0]!r} to continue its cursor)"
    )


def _where(spec: Any, reader: Any) -> str:
    """The source's data in words: its path, or its reader's (a dataset object given as the
    path, a `StreamingPackedDataset`, has no words of its own)."""
    if isinstance(spec.path, (str, os.PathLike)):
        return str(spec.path)
    return str(getattr(reader, "path", type(spec.path).__name__))


def restore(sch: Any, state: dict[str, Any]) -> None:
    """Load `state` into a new `Schedule`; sets `sch.changes`.

    Same mixture (the same sources in the same order with the same weights, caps and unit): the
    counters carry over and the stream continues exactly. Changed weights, caps or unit, an
    added or a removed source: every kept source continues from its cursor (epoch and position
    in that epoch's order, so no row of the epoch is repeated or skipped), an added source
    starts at its first row, a removed one is kept aside ("dormant") so that adding it back
    later continues it, and a new segment starts (targets count from here). What changed is
    returned in words; an added source on the data of a saved one (a rename) is said to start
    again. Different data under a kept name (another fingerprint) is refused.

    Raises:
        DataError: A damaged state, another max_len, or other data under a kept name.
    """
    check(state)
    if int(state["max_len"]) != sch.max_len:
        raise DataError(
            f"the mixture state was saved with max_len {state['max_len']} but these sources "
            f"have max_len {sch.max_len}; resume on the same packed data"
        )
    old, dormant = state["sources"], dict(state["dormant"])
    same = _same_mixture(sch, state)
    changes: list[str] = []
    for i, spec in enumerate(sch.specs):
        entry = old.get(spec.name)
        if entry is None and spec.name in dormant:
            entry = dormant.pop(spec.name)
            changes.append(f"added back {spec.name!r} (continues from its cursor)")
        if entry is None:
            changes.append(_added(spec.name, sch.fingerprints[i], {**dormant, **old}))
            continue
        saved, now = entry.get("fingerprint"), sch.fingerprints[i]
        if now is not None and saved not in (None, now, *sch.former_fingerprints[i]):
            raise DataError(
                f"source {spec.name!r}: the state was saved on data {saved} but {spec.name!r} "
                f"is now {now} ({_where(spec, sch.readers[i])}); resume on the same data or "
                "give it a new name"
            )
        rows = sch.readers[i].epoch_rows(int(entry["epoch"]))
        if rows is not None and entry["pos"] > rows:
            raise DataError(
                f"malformed mixture state: sources.{spec.name}.pos is {entry['pos']} but an "
                f"epoch of {spec.name!r} holds {rows} rows; the checkpoint is damaged"
            )
        sch.epoch[i], sch.pos[i] = entry["epoch"], entry["pos"]
        sch.rows[i], sch.tokens[i] = entry["rows"], entry["tokens"]
        if same:
            sch.seg[i] = entry["seg"]
            sch.capped[i] = entry["capped"]
        else:
            if entry.get("max_epochs") == spec.max_epochs:
                sch.capped[i] = entry["capped"]  # else re-checked against the new cap
            if float(entry["weight"]) != float(spec.weight):
                changes.append(f"weight of {spec.name!r} {entry['weight']:g} -> {spec.weight:g}")
            if entry.get("max_epochs") != spec.max_epochs:
                changes.append(
                    f"max_epochs of {spec.name!r} {entry.get('max_epochs')} -> {spec.max_epochs}"
                )
            if entry["at_cap"] != spec.at_cap:
                changes.append(f"at_cap of {spec.name!r} {entry['at_cap']} -> {spec.at_cap}")
    for name, entry in old.items():
        if name not in sch.names:
            dormant[name] = entry
            changes.append(f"removed {name!r} (its cursor is kept in the state)")
    if state["unit"] != sch.unit:
        changes.append(f"unit {state['unit']} -> {sch.unit}")
    if not same and not changes:
        changes.append("source order changed")
    delivered, total, at = int(state["tokens"]), sch.total_tokens, ended_at_total(state["done"])
    # a run not ended, or ended at another total (not at a cap: over whatever the total)
    if (
        total is not None
        and delivered >= total
        and (state["done"] is None or at not in (None, total))
    ):
        changes.append(
            f"total_tokens {total:,} is at most the {delivered:,} tokens already "
            "delivered: the mixture ends here, with no more batches"
        )
    sch.delivered_rows, sch.delivered_tokens = int(state["rows"]), int(state["tokens"])
    sch.dormant = dormant
    sch.events = [dict(e) for e in state["events"]]
    sch.segment = {k: int(state["segment"][k]) for k in ("index", "rows", "tokens")}
    if same:
        sch.done = state["done"]
        if sch.done is not None and sch.done.startswith("total_tokens"):
            sch.done = None  # re-checked against this run's total (it may have been raised)
    else:
        sch.new_segment()
        sch.event("changed", "the mixture changed at this resume: " + "; ".join(changes))
    sch.changes = changes
