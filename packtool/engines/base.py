"""What both drivers share: plan the run, keep its running sums, finish it.

A driver (packtool/engines/local.py, ray.py) does three things, and only the middle one differs:

1. `Run(config, checked, output)`: make the plan (packtool/engines/plan.py) from the inputs'
   sizes and modification times, save it with the run's fingerprint before any work (a fresh
   run), or compare it with the saved one and add up the finished partitions' records
   (`--resume`: one small file read per finished partition, none of its inputs);
2. for each wave of `run.waves()`, one after another: run
   `worker.run_partition(run.context, run.descriptor(u))` for every unit `u` of the wave,
   anywhere, in any order, calling `run.account(record)` as each one finishes. The first wave
   is the partitions without a record (`run.todo`), each next one a level of the tail tree's
   merge nodes without a record (packtool/engines/merge.py: each packs the tails of at most
   `TAIL_FAN_IN` units of the wave before, so it waits for that wave only);
3. `run.finish()`: the tree's root (the last level's tails packed together, at most
   F x 32 rows), then `index.json` streamed from the records, then the run state removed;
   `output_folder.output_folder` swaps the staging folder in.

So the drivers are small, the dataset is the same whichever one ran it (or both: a run the
local engine started can be resumed on a cluster, and the other way round), and the driver's
memory is the running sums (`records.Totals`) plus the plan (and the ids of the units left).

`pack_with(config, tokenizer, driver)` is that sequence, written once: the inputs checked
(packtool/engines/preflight.py), the output locked and staged (output_folder.py), the `Run`,
the engine's `Driver.drive` for step 2, `run.finish()`. Each engine makes its `Driver` after
its own checks (`local.local_driver`, `ray.ray_driver`, `slurm.driver.slurm_driver`), and
packtool/engines/drivers.py finds one by its name (`--engine`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.tokenized import tokenized_schema
from packtool.engines import finish, merge, records
from packtool.engines.config import RunConfig
from packtool.engines.context import WorkerContext, context_for
from packtool.engines.output_folder import COMPLETE, Output, output_folder
from packtool.engines.plan import Plan, describe, make_plan
from packtool.engines.preflight import (
    FACTS_KEY,
    Checked,
    check_facts,
    check_inputs,
    doc_id_units,
    fingerprint_of,
)
from packtool.engines.resume_checks import (
    CHAT_TEMPLATE_KEY,
    check_complete,
    check_fingerprint,
    fingerprint_digest,
)
from packtool.engines.summary import PackSummary
from packtool.errors import OVERWRITE, RESUME, ConfigError, DataError, WorkersLost
from packtool.prefetch import map_ordered
from packtool.progress import Progress
from packtool.storage import local as storage
from packtool.tokenize.tables import Source
from packtool.tokenizer.tokenizers import Tokenizer

FAN_IN_KEY = "tail_fan_in"
"""The tail tree's fan-in, saved in the run state (`plan.json`) so a resume builds its tree."""


def plan_of(config: RunConfig, checked: Checked) -> Plan:
    """The partition plan of a fresh run: a stat of every input (and the footer of a Parquet
    file above the target), `prefetch.io_threads()` files at a time, taken in input order, so
    the plan is that of reading one file after another."""
    files = map_ordered(
        lambda pk: describe(*pk, config.partition_size),
        zip(checked.paths, checked.kinds(), strict=True),
    )
    return make_plan(list(files), config.partition_size)


def save_plan(
    work: Path,
    fingerprint: dict[str, Any],
    plan: Plan,
    checked: Checked,
    extra: dict[str, Any] | None = None,
) -> None:
    """A fresh run's state, before any work (so any stop can be resumed): its fingerprint, its
    plan, what was read of its inputs, and what else the run needs to resume (`extra`)."""
    saved = {"fingerprint": fingerprint, "plan": plan.to_dict(), **(extra or {})}
    if checked.facts is not None:
        saved[FACTS_KEY] = checked.facts.to_dict()
    records.write_plan(work, saved)


def saved_plan(
    state: dict[str, Any],
    fingerprint: dict[str, Any],
    checked: Checked,
    work: Path,
    out: str | os.PathLike,
) -> Plan:
    """The plan of the interrupted run to resume, once its fingerprint, input facts and files
    are those of this run (a one-line error naming `out` otherwise).

    The fingerprint holds every input's size and modification time: when it matches, the saved
    plan is the plan, and `check_inputs` took what it knows of the inputs from the saved state
    (no Parquet footer, no first record is read again).
    """
    check_fingerprint(state, fingerprint, storage.as_path(out))
    check_facts(state, checked, storage.as_path(out))
    try:
        plan = Plan.from_dict(state["plan"])
    except (KeyError, TypeError, ValueError):
        raise DataError(
            f"{records.run_dir(work) / records.PLAN_FILE}: malformed plan; use {OVERWRITE}"
        ) from None
    if [f.path for f in plan.files] != [str(p) for p in checked.paths]:
        raise ConfigError(f"cannot resume {out}: the partition plan differs")
    return plan


def source_of(config: RunConfig, checked: Checked, fingerprint: dict[str, Any]) -> Source:
    """How the run's workers read its inputs (`tables.Source`), from what preflight found and
    the run's fingerprint (the chat template text it began with, which workers hold theirs to)."""
    identity = TokenizerIdentity.from_dict(checked.identity)
    return Source(
        mode=checked.mode,
        read=config.read,
        schema=tokenized_schema(identity, config.read.extra_fields, optional=checked.columns),
        identity=identity,
        mask_source=checked.mask_source,
        sft_kind=checked.sft_kind,
        template_sha256=(fingerprint.get(CHAT_TEMPLATE_KEY) or {}).get("sha256"),
    )


def workers_lost(work: Path, what: str, advice: str, partitions: int) -> WorkersLost:
    """The error that stops a run whose workers died too often (`what`): it says whether
    finished partitions are kept for `--resume` (`output_folder.output_folder` keeps them), and
    how many (of the plan's `partitions`: the tail tree's merge records are not counted)."""
    done = len(records.finished_partitions(work, partitions))
    kept = (
        f"its {done} finished partition(s) are kept: rerun with {RESUME}"
        if done
        else "no partition had finished"
    )
    return WorkersLost(f"{what}; {kept} ({advice})")


class Run:
    """One `packtool pack` run as the drivers see it (see the module docstring)."""

    def __init__(self, config: RunConfig, checked: Checked, output: Output) -> None:
        self.t_start = time.perf_counter()
        self.config = config
        self.checked = checked
        self.work = output.work
        kinds = checked.kinds()
        fingerprint = output.fingerprint or fingerprint_of(config, checked)
        self.fingerprint = fingerprint_digest(fingerprint)
        self.chat_template: dict[str, Any] | None = fingerprint.get(CHAT_TEMPLATE_KEY)
        """The chat template's record (`index.json`'s `extra.chat_template`), chat runs only."""
        if output.state is not None and output.state.get(COMPLETE):
            # raises: there is nothing to run (the output a URL or a local path)
            check_complete(fingerprint, storage.as_path(config.out_dir), str(config.out_dir))
        if output.state is None:
            self.plan: Plan = plan_of(config, checked)
            fan_in = merge.TAIL_FAN_IN
            save_plan(self.work, fingerprint, self.plan, checked, {FAN_IN_KEY: fan_in})
        else:
            self.plan = saved_plan(output.state, fingerprint, checked, self.work, config.out_dir)
            # The saved fan-in builds the same tree; a state without one (an earlier packtool)
            # packed every tail in the root.
            fan_in = output.state.get(FAN_IN_KEY)
        self.units = doc_id_units(checked.paths, kinds)
        self.totals = records.Totals(config.pack.max_len, config.pack.rounds)
        n = len(self.plan.partitions)
        self.tree = merge.TailTree(n, fan_in)
        root = self.tree.root
        done = set(records.finished(self.work)) if output.state is not None else set()
        self.resumed_tokens = 0
        """The tokens of the partitions an interrupted run finished (not this run's work)."""
        # the root's record is added by `finish`; several records (and their shards' stats)
        # at a time, taken in order: one after another each waited on a bucket's round trips
        kept = [p for p in sorted(done) if p < root]
        for p, record in zip(kept, map_ordered(self._checked_record, kept), strict=True):
            self.totals.add(record, timed=False)  # the summary times this run's work
            self.resumed_tokens += int(record["counts"]["tokens_in"]) if p < n else 0
        self.resumed = sum(1 for p in done if p < n)
        self.final_done = root in done
        self.todo = [p for p in range(n) if p not in done]
        self._waves = [self.todo] + [
            [u for u in self.tree.level_ids(level) if u not in done]
            for level in range(1, self.tree.levels + 1)
        ]
        self.context: WorkerContext = context_for(
            source_of(config, checked, fingerprint),
            pack=config.pack,
            shards=config.shards,
            chunk_docs=config.chunk_docs,
            work=self.work,
            tokenizer=checked.tokenizer,
            read=config.read,
        )
        self.bar = Progress("pack", enabled=config.progress)
        self.seconds: dict[str, float] = {}

    def _checked_record(self, p: int) -> dict[str, Any]:
        """A finished partition's record, after checking its shards are there at their size."""
        record = records.read_record(self.work, p)
        for s in record["shards"]:
            path = self.work / s["file"]
            if not storage.is_file(path) or storage.size(path) != s["bytes"]:
                raise DataError(
                    f"{path}: finished shard is missing or changed; rerun with {OVERWRITE}"
                )
        return record

    @property
    def partitions(self) -> int:
        return len(self.plan.partitions)

    def waves(self) -> list[list[int]]:
        """The units to run, wave after wave: the partitions without a record, then each level
        of merge nodes without one (the root, run by `finish`, is in none). The units of a wave
        are independent; a wave needs only the waves before it finished. Empty waves left out.
        """
        return [wave for wave in self._waves if wave]

    def descriptor(self, p: int) -> dict[str, Any]:
        """What `worker.run_partition` needs for unit `p`: a partition or a merge node."""
        if p < self.partitions:
            return self.plan.descriptor(p)
        return self.tree.descriptor(p)

    def workers_lost(self, what: str, advice: str) -> WorkersLost:
        """The error that stops a run whose workers died too often (`workers_lost`)."""
        return workers_lost(self.work, what, advice, self.partitions)

    @property
    def out_dir(self) -> str:
        """The output, as the user gave it (what messages name)."""
        return self.config.out_dir

    @property
    def command(self) -> str:
        """The run's command line ("" when called as a library)."""
        return self.config.command

    def account(self, record: dict[str, Any]) -> None:
        """Add a finished unit's record to the running sums (constant cost)."""
        self.totals.add(record)
        if "merge" in record:
            return
        self.bar.update(
            docs=int(record.get("documents", 0)),
            tokens=int(record["counts"]["tokens_in"]),
            nbytes=int(record.get("input_bytes", 0)),
        )

    def special_names(self) -> dict[str, str]:
        """Where the EOS / BOS came from: the tokenizer's for raw inputs, what `packtool
        tokenize` recorded in tokenized ones."""
        if self.checked.tokenized and not self.checked.records:  # records are encoded here
            facts = self.checked.facts
            return dict(facts.special_names or {}) if facts is not None else {}
        tok = self.checked.tokenizer
        return dict(tok.special_names) if tok is not None else {}

    def finish(self, cores_used: str) -> PackSummary:
        """The final stage, `index.json`, and the run state removed (see the module docstring)."""
        self.bar.close()
        t0 = time.perf_counter()
        n = self.partitions
        root = self.tree.root
        merges = root - n
        # A driver bug, never bad input: fail loudly, keep the run.
        if self.totals.partitions != n or self.totals.merges != merges:
            raise RuntimeError(
                f"{self.totals.partitions} of {n} partition records and {self.totals.merges} of "
                f"{merges} merge records accounted before the final stage; the finished ones "
                f"are kept: rerun with {RESUME}"
            )
        if self.final_done:
            final = records.read_record(self.work, root)
        else:
            final = finish.final_stage(self.context, self.tree)
        self.totals.add(final, timed=not self.final_done)
        self.seconds = {k: round(v, 3) for k, v in self.totals.seconds.items()}
        self.seconds["final stage"] = time.perf_counter() - t0
        files = self.plan.files
        doc_ids = finish.doc_id_record(
            self.work, [f.path for f in files], self.units, [f.size for f in files]
        )
        summary, manifest = finish.manifest_head(
            self.config,
            self.totals,
            self.checked.identity,
            self.checked.columns,
            doc_ids,
            n,
            self.fingerprint,
            self.special_names(),
            self.chat_template,
            work=self.work,
        )
        finish.remove_temporaries(self.work)  # left by workers killed mid-write
        finish.write_index(self.work, manifest, root)
        # The run's state stays until the switch (`output.commit` deletes it then).
        self.seconds["total"] = time.perf_counter() - self.t_start
        summary.seconds = self.seconds
        summary.resumed_partitions = self.resumed
        summary.resumed_tokens = self.resumed_tokens
        summary.cores_used = cores_used
        summary.special_names = self.special_names()  # both engines' summaries name them
        return summary


@dataclass(frozen=True)
class Driver:
    """An engine made ready to run packs into one output, its own checks passed."""

    drive: Callable[[Any], str]
    """Run every wave of a `Run` (or another job's run of the same shape:
    packtool/engines/megatron/run.py); what was used, in words (the summary's engine line)."""
    early: Callable[[RunConfig, list[Any]], None] | None = None
    """Called with the inputs once listed, while they are checked (the local engine starts its
    worker processes' server then)."""
    cancels_slurm_jobs: bool = True
    """A run the Slurm engine started, resumed here: its queued jobs are cancelled first
    (`slurm.arrays.taken_over`). False for the Slurm engine, which re-attaches to them."""
    after: Callable[[Run], None] | None = None
    """Called once the run is finished and swapped in (the Slurm engine removes its scripts
    and logs)."""

    def drive_run(self, run: Any, resumed: bool) -> str:
        """`drive(run)`; when `resumed` and this is not the Slurm engine, the jobs a Slurm
        driver queued for the run are cancelled first and their files removed after
        (`slurm.arrays.taken_over`): their tasks would run partitions beside this run's
        workers, then fail on the folder it removes. For `pack` and `tokenize --to megatron`."""
        if not resumed or not self.cancels_slurm_jobs:
            return self.drive(run)
        from packtool.engines.slurm.arrays import taken_over

        with taken_over(run):
            return self.drive(run)


def pack_with(
    config: RunConfig,
    tokenizer: Tokenizer | str | None,
    driver: Driver,
    *,
    bos: int | str | None = "auto",
) -> PackSummary:
    """Pack `config.inputs` into `config.out_dir` with `driver`: the inputs checked, the output
    locked and staged (or the interrupted run's state read back), the plan made or resumed,
    every wave driven, the run finished and swapped in (the module docstring). `bos`: the BOS
    choice for a `tokenizer` given by name (`run_pack`)."""
    early = driver.early
    checked = check_inputs(
        config, tokenizer, early and (lambda paths: early(config, paths)), bos=bos
    )
    config = checked.config  # long_docs decided by the inputs where it was left out
    with output_folder(config, fingerprint_of(config, checked)) as output:
        run = Run(config, checked, output)
        summary = run.finish(driver.drive_run(run, resumed=output.state is not None))
    if driver.after is not None:
        driver.after(run)
    return summary
