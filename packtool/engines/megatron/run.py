"""`packtool tokenize --to megatron` on the partition engines: any engine, `--resume`, in order.

    plan (driver) -> part workers, any engine (local / Ray / Slurm):        -> driver: each part
                     read -> tokenize -> part-P.bin + part-P.lengths           appended to the
                     + completion record (packtool/engines/megatron/part.py)   merged pair as soon
                                                                               as all before it are
    -> finish: PREFIX.idx from the merged lengths; the pair swapped in

The plan, the partition descriptors, the completion records and the engines' drivers are the
ones `packtool pack` runs on (packtool/engines/base.py, local.py, ray.py, slurm/driver.py), so
`--engine ray|slurm`, `--workers`, `--partition-size` and `--resume` behave as they do there.
Each partition's documents come out of the one dispatch (`tables.partition_tables`) in reading
order, and the parts are joined in plan order, so the `.bin` / `.idx` are byte for byte those of
one process reading the inputs one after another (and of megatron-core's `IndexedDatasetBuilder`
fed the same documents), whatever the engine, the partition size or the number of workers.

**The merge runs while the parts are made, never as a pass at the end**
(packtool/engines/megatron/merge.py): when partition `k`'s record arrives and every partition
before it is merged, part `k` is appended to `merged.bin` / `merged.lengths` and its files
removed; the first part is renamed, not copied. What is left for the end is the `.idx` (its
counts come first: 20 bytes a document written from the 4-byte lengths, ~1% of the `.bin`) and
three renames.

**Resume.** Nothing about the merge is saved besides the files themselves: a resumed run reads
the records of the finished partitions (one small file each, as `pack --resume`), finds the
longest prefix of them that the merged files hold whole, cuts both files back to it and goes on
from there, whatever step of the merge a kill cut (merge.py).

**Commit.** A Megatron dataset is two files, so the switch cannot be one rename; the rule is
`index.json`'s: the dataset exists exactly when its `.idx` does, and the `.idx` is put in place
last. The finished index is written as `ready.idx` in the staging folder (complete or absent:
temporary name, fsync, rename), after the run's record; then the old `.idx` is deleted (from
here the old dataset is gone, never half of it visible with the new one) with its record,
`merged.bin` renamed over `PREFIX.bin`, the record to `.PREFIX.idx.packtool.json` (what
`--resume` of the finished pair checks: packtool/engines/megatron/record.py), `ready.idx` to
`PREFIX.idx`, and the folder removed; the steps run in the staging folder renamed aside first
(`.done`), so a half-deleted folder never reads as an interrupted run. A run killed during
those steps is finished by the next one (any command on this prefix, under its lock) from
`ready.idx`. One writer per prefix: the run goes through the output transaction of
packtool/dataset/output.py (its lock on the `.idx`, `recover_with` finishing a killed swap,
`commit_with` writing the index and swapping), so the index is written and swapped in only
after the lock is confirmed still held.

**Into a bucket** (`-o s3://bucket/data/corpus`, local engine only): the staging folder is a local
one in the scratch folder, named by the URL; the swap is the same steps with uploads for renames
(the old `.idx` deleted, the `.bin` uploaded, the `.idx` uploaded last), finished by the next run
on this machine from the staging folder when cut short, unless another run has written the pair
since (then dropped: packtool/engines/megatron/swap.py); the lock is the lock object beside the
`.idx` (docs/remote.md, "A Megatron indexed dataset in a bucket").

At 10^9 documents: the driver holds the plan (one entry per file and per partition), the
running sums, and the out-of-order parts' sizes; no document. The workers' memory is a table of
documents at a time. The merged pair and the parts never exceed the corpus's tokens plus the
parts waiting (disk use ~1x the `.bin`, not 2x).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from packtool.dataset.identity import TokenizerIdentity
from packtool.dataset.megatron import MEGATRON, megatron_dtype, megatron_paths, write_index
from packtool.dataset.output import (
    OutputPaths,
    object_lock,
    output_paths,
    remove,
    transaction,
)
from packtool.dataset.output_apart import check_apart
from packtool.engines import drivers, output_folder, preflight, records
from packtool.engines.base import plan_of, save_plan, saved_plan, source_of, workers_lost
from packtool.engines.config import RunConfig
from packtool.engines.megatron.merge import MERGED_BIN, MERGED_LENGTHS, Merge
from packtool.engines.megatron.part import MegatronContext
from packtool.engines.megatron.record import READY_RECORD, check_finished, write_record
from packtool.engines.megatron.swap import READY_IDX, drop_stale_swap, finish_swap, note_swap
from packtool.engines.output_folder import Output
from packtool.engines.plan import PARTITION_SIZE, Plan
from packtool.errors import OVERWRITE, RESUME, ConfigError, DataError, WorkersLost, option_choice
from packtool.pack.chunk import PackConfig
from packtool.pack.kernels import MAX_LEN_LIMIT
from packtool.progress import Progress
from packtool.read.documents import ReadConfig
from packtool.storage import hub, remote_write, writing
from packtool.storage import local as storage
from packtool.tokenize.summary import TokenizeSummary
from packtool.tokenize.tables import PRETOKENIZED, RAW, RECORDS
from packtool.tokenize.tokenize import names_kept
from packtool.tokenizer.by_name import tokenizer_by_name
from packtool.tokenizer.specials import EOS_TOKEN
from packtool.tokenizer.tokenizers import Tokenizer

TO_KEY = "to"
"""The fingerprint's mark of a Megatron run (a pack run's state is never resumed as one)."""


def tokenize_megatron(
    inputs: str | os.PathLike | Iterable[str | os.PathLike],
    prefix: str | os.PathLike,
    *,
    read_config: ReadConfig | None = None,
    tokenizer: Tokenizer | str | None = "byte",
    workers: int | None = None,
    overwrite: bool = False,
    resume: bool = False,
    progress: bool | None = None,
    partition_size: int = PARTITION_SIZE,
    engine: str = "local",
    engine_config: Any = None,
    command: str = "",
    bos: int | str | None = "auto",
) -> TokenizeSummary:
    """Tokenize `inputs` into `PREFIX.bin` and `PREFIX.idx` (see the module docstring).

    Args:
        inputs: files, folders, globs of any input kind packtool reads (not fine-tuning records,
            nor inputs with labels: the format has no loss mask).
        prefix: the dataset's path prefix, as Megatron's `--data-path` names it (`PREFIX.bin` or
            `PREFIX.idx` name the same pair).
        read_config: how to read the inputs.
        tokenizer: a `Tokenizer` or a `load_tokenizer` spec (loaded with `eos="eos_token"`,
            Megatron's end of document). For tokenized Parquet it must match the recorded
            tokenizer, and None takes the recorded one (its ids are written as they are).
        workers: partition workers (local engine; default one per core) or Ray actors.
        overwrite: replace an existing pair, or an interrupted run's state.
        resume: finish an interrupted run (its finished partitions are kept).
        progress: draw a progress bar (default: when stderr is a terminal).
        partition_size: target input bytes per partition (the unit of work and of resume).
        engine: `local`, `ray` or `slurm`.
        engine_config: `ray.RayConfig` / `slurm.driver.SlurmConfig` (None: the defaults).
        command: the command line, shown to a second writer that the lock refuses.
        bos: the BOS choice when `tokenizer` is a spec (`load_tokenizer`'s: "auto", the
            tokenizer's own rule; "default"; an id; None for none: `--bos-id` / `--no-bos`).

    Raises:
        ConfigError: the pair exists without `overwrite`, another process writes it, it is
            inside an input folder, the inputs carry what the format cannot hold, or bad options.
        DataError: bad input, or no document at all (nothing is written).
        AlreadyComplete: `resume` of a pair that is complete.
    """
    inputs = [storage.input_text(i) for i in storage.input_list(inputs)]
    config = read_config or ReadConfig()
    if storage.is_remote(prefix) and engine != "local":
        raise ConfigError(
            f"{prefix}: {MEGATRON} into a bucket runs on "
            f"{option_choice('--engine', 'engine', 'local')} (the parts are merged in a local "
            "staging folder, then uploaded); the ray and slurm engines write to a shared file "
            "system"
        )
    bin_path, idx_path = megatron_paths(prefix)
    for path in (bin_path, idx_path):
        check_apart(path, inputs)  # before anything is read
    if config.extra_fields:
        raise ConfigError(
            f"{MEGATRON}: a Megatron indexed dataset holds token ids only; drop --keep-field / "
            f"extra_fields={tuple(config.extra_fields)!r}"
        )
    # The engine's own checks (a known name, Ray installed, sbatch options Slurm accepts) come
    # before the tokenizer is loaded and any input read.
    engine_driver = drivers.driver(engine, engine_config, idx_path, workers)
    tokenizer = tokenizer_by_name(tokenizer, bos, eos=EOS_TOKEN, workers=workers)
    run_config = RunConfig(
        inputs=tuple(inputs),
        out_dir=str(idx_path),
        # Not packed: `preflight.check_inputs` takes the run's options in this form. `truncate`
        # and the largest length make its packing checks pass; they never change a byte here.
        pack=PackConfig(max_len=MAX_LEN_LIMIT, long_docs="truncate"),
        read=config,
        partition_size=partition_size,
        workers=workers,
        overwrite=overwrite,
        resume=resume,
        command=command,
        progress=progress,
    )
    # The .idx is the run's output (checked there); the .bin against what a glob reaches too.
    checked = preflight.check_inputs(
        run_config,
        tokenizer,
        lambda paths: check_apart(bin_path, inputs, paths),
        ends_added=True,
        # None: the inputs' recorded tokenizer (or byte), which `bos` must agree with (it was
        # dropped without a word); a tokenizer loaded above has it already
        bos=bos if tokenizer is None else "auto",
    )
    # The vocabulary as the run writes it (tokenized Parquet's recorded one where its ids are
    # taken as they are): ids past int32's are refused before anything is written
    megatron_dtype(TokenizerIdentity.from_dict(checked.identity).vocab_size)
    if checked.columns:
        raise ConfigError(
            f"{MEGATRON}: the inputs carry {', '.join(checked.columns)} (fine-tuning records "
            "or labels), which a Megatron indexed dataset cannot hold; write tokenized Parquet "
            "(--to parquet / tokenize_corpus) or pack them"
        )
    fingerprint = {**preflight.fingerprint_of(run_config, checked), TO_KEY: "megatron"}
    pair = (bin_path, idx_path)
    paths = (
        _remote_paths(prefix, idx_path) if storage.is_remote(idx_path) else output_paths(idx_path)
    )

    def discard(exc: BaseException, state: dict[str, Any] | None) -> bool:
        # As `pack` (`output_folder.discard_staging`); a finished pair is never discarded: the
        # next run finishes its swap (into a bucket), or --resume commits it (the Hub).
        finished = storage.is_file(paths.staging / READY_IDX)
        return not finished and output_folder.discard_staging(exc, state, paths.staging)

    with transaction(
        idx_path,
        run_config.command or "packtool tokenize",
        lambda paths: _prepare(run_config, paths.staging, prefix, pair, fingerprint),
        discard,
        paths=paths,
        recover_with=lambda paths: _recover(run_config, paths, bin_path, idx_path),
        commit_with=lambda paths: run.commit(),  # after the lock is confirmed still held
    ) as (paths, state):
        output = Output(work=paths.staging, state=state)
        run = MegatronRun(run_config, checked, output, prefix, bin_path, idx_path, fingerprint)
        try:
            used = engine_driver.drive_run(run, resumed=state is not None)
        finally:
            run.merge.close()
        run.check_merged()
    if engine_driver.after is not None:
        engine_driver.after(run)  # Slurm: a finished run's task logs go with it
    return run.summary(used)


def _recover(config: RunConfig, paths: OutputPaths, bin_path: Path, idx_path: Path) -> None:
    """What a killed run left, under the lock (the transaction's `recover` for a pair): its
    unfinished uploads aborted, and a swap it cut short finished (on the Hub only when asked:
    `_waiting_hub_pair`)."""
    if paths.remote and not hub.is_hub(idx_path):
        for path in (bin_path, idx_path):
            remote_write.abort_uploads(path, exact=True)
    if hub.is_hub(idx_path):
        _waiting_hub_pair(config, paths, bin_path, idx_path)
        return
    if paths.remote:  # the staging folder is this machine's: others may have written since
        drop_stale_swap(paths.staging, bin_path, idx_path, paths.shown)
    finish_swap(paths.staging, bin_path, idx_path, paths.shown)


def _remote_paths(prefix: str | os.PathLike, idx_path: Any) -> OutputPaths:
    """A bucket prefix's paths: the lock object beside `PREFIX.idx` (as for a local pair), the
    staging folder a local one (`writing.scratch_dir()`, named by the URL, so `--resume` on this
    machine finds it): the parts are merged there and the swap uploads the pair."""
    key = hashlib.sha256(str(idx_path).encode()).hexdigest()[:16]
    staging = writing.scratch_dir() / f"megatron-{key}"
    return OutputPaths(
        shown=os.fspath(prefix),
        target=idx_path,
        staging=staging,
        ready=staging,
        old=staging,
        lock=object_lock(idx_path),
        remote=True,
        whole_object=True,
    )


def _one_prefix(idx_path: Any) -> str:
    """The prefix of `PREFIX.idx`, however -o spelled it (`d/corpus`, `d/corpus.idx` or
    `d/corpus.bin`): the run's `out_dir`, which names the Slurm engine's logs folder, so a run
    resumed or overwritten under another spelling finds the same one."""
    return str(idx_path)[: -len(".idx")]


def _prepare(
    config: RunConfig, work: Path, prefix: str | os.PathLike, pair: tuple[Path, Path], fp: dict
) -> dict[str, Any] | None:
    shown, (bin_path, idx_path) = os.fspath(prefix), pair
    if storage.is_file(work):  # an earlier packtool's index temporary: nothing to resume
        writing.remove_file(work)
    for path in (bin_path, idx_path):
        if storage.is_dir(path):
            raise ConfigError(
                f"{path} is a folder; choose another prefix: "
                + option_choice("--output", "prefix", "PREFIX")
            )
    # A run killed before it saved its plan did nothing: started again by a plain run, as
    # `pack`'s (`records.never_planned`; the lock, taken first, rules out a live run's).
    abandoned = storage.is_dir(work) and records.never_planned(work)
    if config.resume:
        if storage.is_dir(records.run_dir(work)) and not abandoned:
            return records.read_plan(work)
        if storage.is_file(idx_path):  # raises: done, or made by other options or inputs
            check_finished(fp, bin_path, idx_path, shown)
        if abandoned:
            raise ConfigError(
                f"{shown}: the interrupted run stopped before it saved its plan, so there is "
                f"nothing to resume; run again without {RESUME}"
            )
        if storage.exists(work):
            raise ConfigError(f"{shown}: no interrupted run to resume; use {OVERWRITE}")
        raise ConfigError(f"{shown}: no interrupted run to resume; drop {RESUME}")
    if storage.exists(work):
        if not abandoned and not config.overwrite:
            raise ConfigError(
                f"an interrupted run into {shown} left its finished partitions in {work}; pass "
                f"{RESUME} to finish it or {OVERWRITE} to start over"
            )
        from packtool.engines.slurm.state import stop_jobs

        stop_jobs(work, _one_prefix(idx_path))  # a detached Slurm run's: gone before its folder
        remove(work)
    for path in (bin_path, idx_path):
        if storage.lexists(path) and not config.overwrite:
            raise ConfigError(
                f"{path} exists; pass {OVERWRITE} to replace {bin_path} and {idx_path}"
            )
    try:  # the first write, up front: a failure names the user's path
        writing.make_dir(work)
    except OSError as exc:
        raise ConfigError(f"cannot write {shown} ({exc.strerror or exc})") from None
    return None


def _waiting_hub_pair(
    config: RunConfig, paths: OutputPaths, bin_path: Path, idx_path: Path
) -> None:
    """A finished pair whose Hub commit failed waits in the staging folder: `--resume` commits
    it (then there is nothing left to do), `--overwrite` discards it, a plain run refuses (as
    `pack` does with a build waiting for its commit). Unlike a bucket's swap, a Hub commit
    leaves nothing half done, so the next run need not finish it unasked."""
    if not storage.is_file(paths.staging / READY_IDX):
        return
    if config.resume:
        finish_swap(paths.staging, bin_path, idx_path, paths.shown)
    elif config.overwrite:
        remove(paths.staging)
    else:
        raise ConfigError(
            f"a finished {paths.shown}.bin/.idx waits in {paths.staging}: its commit to the Hub "
            f"did not happen; pass {RESUME} to commit it or {OVERWRITE} to start over"
        )


class MegatronRun:
    """One `tokenize --to megatron` run as the engines' drivers see it: the shape of
    `base.Run` (`context`, `todo`, `waves`, `descriptor`, `account`, `workers_lost`) with one
    wave, the parts."""

    def __init__(
        self,
        config: RunConfig,
        checked: preflight.Checked,
        output: Output,
        prefix: str | os.PathLike,
        bin_path: Path,
        idx_path: Path,
        fingerprint: dict[str, Any],
    ) -> None:
        self.t_start = time.perf_counter()
        self.config, self.checked, self.work = config, checked, output.work
        self.prefix, self.bin_path, self.idx_path = os.fspath(prefix), bin_path, idx_path
        identity = TokenizerIdentity.from_dict(checked.identity)
        self.dtype = megatron_dtype(identity.vocab_size)
        self.fingerprint = fingerprint
        if output.state is None:
            self.plan: Plan = plan_of(config, checked)
            save_plan(self.work, fingerprint, self.plan, checked)
        else:
            self.plan = saved_plan(output.state, fingerprint, checked, self.work, self.prefix)
        n = len(self.plan.partitions)
        self.skips = records.SkipTotals()
        self.documents = self.tokens = self.input_bytes = 0
        self.merge = Merge(self.work)
        done = set(records.finished(self.work)) if output.state is not None else set()
        sizes = {}
        for p in sorted(done):
            record = records.read_record(self.work, p)
            self._add(record)
            sizes[p] = (int(record["bin_bytes"]), int(record["documents"]))
        self.merge.restore(sizes)
        self.kept = (self.tokens, self.input_bytes)  # not this run's work: not in its rates
        self.resumed = len(done)
        self.todo = [p for p in range(n) if p not in done]
        self.context = MegatronContext(
            source=source_of(config, checked, fingerprint),  # no extra fields: refused up front
            tokenizer=checked.tokenizer if checked.mode in (RAW, RECORDS) else None,
            work=str(self.work),
            dtype=self.dtype.str,
        )
        self.bar = Progress("tokenize", enabled=config.progress)

    @property
    def out_dir(self) -> str:
        return _one_prefix(self.idx_path)

    @property
    def command(self) -> str:
        return self.config.command

    @property
    def partitions(self) -> int:
        return len(self.plan.partitions)

    def waves(self) -> list[list[int]]:
        return [self.todo] if self.todo else []

    def descriptor(self, p: int) -> dict[str, Any]:
        return {**self.plan.descriptor(p), "kind": "megatron"}

    def workers_lost(self, what: str, advice: str) -> WorkersLost:
        return workers_lost(self.work, what, advice, len(self.plan.partitions))

    def _add(self, record: dict[str, Any]) -> None:
        self.documents += int(record["documents"])
        self.tokens += int(record["tokens"])
        self.input_bytes += int(record.get("input_bytes", 0))
        self.skips.add(record)

    def account(self, record: dict[str, Any]) -> None:
        """A finished part: its sums added, then merged if all before it are (`Merge`)."""
        self._add(record)
        self.merge.add(record)
        self.bar.update(
            docs=int(record["documents"]),
            tokens=int(record["tokens"]),
            nbytes=int(record.get("input_bytes", 0)),
        )

    def _special_names(self) -> dict[str, str]:
        """Where the EOS / BOS came from: the tokenizer's, what tokenized inputs recorded, and
        for pre-tokenized ids only the EOS appended (no BOS is added to them)."""
        tok, facts = self.checked.tokenizer, self.checked.facts
        if tok is None:
            return dict(facts.special_names or {}) if facts is not None else {}
        names = dict(tok.special_names)
        if self.checked.mode == PRETOKENIZED:
            names = names_kept(names, TokenizerIdentity.from_dict(self.checked.identity))
        return names

    def check_merged(self) -> None:
        """The end of the run's work: every part merged, and some document among them."""
        self.bar.close()
        self.merge.close()
        if self.merge.next != self.partitions:  # a driver bug, never bad input: keep the run
            raise RuntimeError(
                f"{self.merge.next} of {self.partitions} parts merged before the index; the "
                f"finished ones are kept: rerun with {RESUME}"
            )
        if self.documents == 0:
            # As `stats` and `pack` do: an output without a document is a mistake.
            skips = self.skips.counter()
            raise DataError(f"no documents in {', '.join(self.config.inputs)}{skips.note()}")

    def commit(self) -> None:
        """The `.idx`, then the swap (see the module docstring); called by the output's
        `transaction` once the lock is confirmed still held, so a run that lost it leaves no
        finished index for the next run to swap in."""
        ready = self.work / READY_IDX
        tmp = writing.temporary_name(ready)
        try:
            write_index(tmp, self.work / MERGED_LENGTHS, self.dtype, self.merge.documents)
            sizes = storage.size(self.work / MERGED_BIN), storage.size(tmp)
            write_record(self.work / READY_RECORD, self.fingerprint, *sizes)  # record.py
            if storage.is_remote(self.idx_path) and not hub.is_hub(self.idx_path):
                note_swap(self.work, self.idx_path, sizes[0])  # swap.py: what it replaces
            writing.replace(tmp, ready)  # complete or absent
        finally:
            writing.remove_file(tmp)
        finish_swap(self.work, self.bin_path, self.idx_path, self.prefix)

    def summary(self, used: str) -> TokenizeSummary:
        """What the committed run did (`used`: the engine, in words)."""
        files = [self.bin_path, self.idx_path]
        skips = self.skips.counter()
        return TokenizeSummary(
            documents=self.documents,
            tokens=self.tokens,
            seconds=time.perf_counter() - self.t_start,
            input_bytes=self.input_bytes,
            skips=skips.to_dict(),
            skip_line=skips.summary(),
            files=[str(f) for f in files],
            output_bytes=sum(storage.size(f) for f in files),
            tokenizer=dict(self.checked.identity),
            dtype=str(self.dtype),
            special_names=self._special_names(),
            partitions=self.partitions,
            resumed_partitions=self.resumed,
            resumed_tokens=self.kept[0],
            resumed_bytes=self.kept[1],
            engine=used,
        )


__all__ = ["MegatronRun", "tokenize_megatron"]
