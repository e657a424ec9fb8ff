"""The `packtool` command line: click only. Each command builds a config and calls one function.

Errors a user can act on become one line on stderr (packtool/cli/exits.py): exit code 1, or 2 for
a wrong option or argument. Nothing here is imported by the library.
"""

from __future__ import annotations

import contextvars
import functools
import gc
import os
import signal
import sys
from typing import Any

import click

from packtool import __version__
from packtool.cli import command_line, exits, input_options, interrupt
from packtool.cli.engine_options import EngineOptions, engine_options
from packtool.cli.exits import echo
from packtool.cli.input_checks import check_input_options
from packtool.cli.input_options import CorpusOptions, corpus_options, inputs_argument, sft_options
from packtool.dataset.manifest_check import LONG_DOC_POLICIES, MAX_LEN_LIMIT
from packtool.errors import AlreadyComplete, ConfigError, Detached
from packtool.quantities import MIN_PARTITION_SIZE, parse_size, positive_int

# numpy's OpenBLAS starts a spinning thread per core at import; no command does linear algebra,
# and on 2 cores those threads took ~0.3 s of start-up from the tokenizer and numba's loading.
# Set before numpy is first imported (commands import it lazily); an explicit value wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@click.group(
    cls=exits.Commands,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="packtool")
def cli() -> None:
    """Turn raw text corpora into packed training data.

    \b
    Typical use:
      packtool stats sample_data/corpus.jsonl --max-len 4096
      packtool pack  sample_data/corpus.jsonl -o packed/ --max-len 4096
    """


WORKERS_HELP = (
    "Tokenizer threads (also sets RAYON_NUM_THREADS for HF tokenizers) [default: all cores]."
)
PARTS = (
    "Input bytes per partition (64MB, 1GB), the unit of parallel work and of --resume: small "
    "files grouped, big JSONL cut at line starts, Parquet between row groups; at least 1KB "
    "(docs/scale-out.md)."
)
PACK_WORKERS = "Partition worker processes (local) or actors (Ray) [default: all cores]."


AT_LEAST_0, AT_LEAST_1 = click.IntRange(min=0), click.IntRange(min=1)
ROWS, ROUNDS = click.IntRange(1, (1 << 31) - 1), click.IntRange(1, 1000)  # shards, chunk limits
CHUNKS = "Documents packed together (bounds memory)."
GROUP_ROWS = "Rows per Parquet row group."


def _field(flag: str, name: str) -> str:
    """A field name option: an empty one would reach the library as an unnamed field."""
    if not name.strip():
        raise ConfigError(f"{flag}: the field name is empty; name a JSONL field or Parquet column")
    return name


def _named(output: str) -> str:
    """`-o`: an empty path would mean the current folder; say so instead."""
    if not output.strip():
        raise ConfigError("-o: the output path is empty; name the folder or file to write")
    return output


# --- commands are registered below; keep each one thin over a library function ---


@cli.command("verify", short_help="Re-check a packed dataset: checksums, schema, counts.")
@click.argument("directory", type=input_options.NamedPath(path_type=str), metavar="DATASET")
@click.option(
    "--no-checksums", is_flag=True, help="Skip recomputing sha256 (sizes are still checked)."
)
@input_options.storage_options
def verify_cmd(directory: str, no_checksums: bool) -> None:
    """Re-check a packed dataset: checksums, schema, offsets, token ids, totals.

    DATASET: the folder `packtool pack` wrote, or its index.json. Prints one OK line, or names
    the first problem and exits 1.
    """
    from packtool.audit.verify import verify_dataset

    report = verify_dataset(directory, checksums=not no_checksums, progress=True)
    for line in report.warnings:
        echo(f"warning: {line}", err=True)
    echo(report.summary())


@cli.command("inspect", short_help="Summarise a packed dataset: manifest, fill, one row.")
@click.argument("directory", type=input_options.NamedPath(path_type=str), metavar="DATASET")
@click.option(
    "--row", type=int, default=None, help="List the documents of this global row (0-based)."
)
@click.option(
    "--plot",
    type=input_options.NamedPath(dir_okay=False, path_type=str),
    default=None,
    help="Draw the first 64 rows' fill to FILE.png (.svg/.pdf too); with --row also "
    "FILE-row-N.png, that row's causal attention mask.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@input_options.storage_options
def inspect_cmd(directory: str, row: int | None, plot: str | None, as_json: bool) -> None:
    """Summarise a packed dataset: manifest, fill distribution, one row, pictures."""
    import json

    from packtool.audit.inspect import inspect_dataset

    result = inspect_dataset(directory, row=row, plot=plot)
    echo(json.dumps(result.to_dict(), indent=2) if as_json else result.format())


@cli.command("mix", short_help="Plan a mixture file: each source's tokens, epochs, share.")
@click.argument("mixture", type=input_options.NamedPath(path_type=str), metavar="MIXTURE")
@click.option("--tokens", help="Plan this many tokens (10B, 2.5M, 1e9, ...).")
@click.option("--steps", help="Plan this many global steps (give a batch size).")
@click.option("--rows-per-batch", type=AT_LEAST_1, help="--steps: rows per rank batch.")
@click.option("--tokens-per-batch", type=AT_LEAST_1, help="--steps: token budget per rank batch.")
@click.option("--world-size", type=AT_LEAST_1, default=1, show_default=True, help="--steps: ranks.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def mix_cmd(mixture: str, as_json: bool, **length: Any) -> None:
    """Plan a mixture file: each source's tokens, epochs and share (docs/mixtures.md).

    Runs the loader's schedule on each source's index.json; the length is --tokens or --steps,
    else the file's total. Warns about a source repeated past its max_epochs.
    """
    import json

    from packtool.mixture.plan import plan_file

    plan = plan_file(mixture, **length)
    for line in plan.warnings:
        echo(f"warning: {line}", err=True)
    echo(json.dumps(plan.to_dict(), indent=2) if as_json else plan.format())


@cli.command("tokenize", short_help="Tokenize a corpus into tokenized Parquet (or Megatron).")
@inputs_argument
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=str),
    callback=lambda ctx, param, value: _named(value),
    help="OUT.parquet (one file; also s3://bucket/OUT.parquet) or a folder "
    "(part-00000.parquet, ...; also s3://bucket/prefix); with --to megatron, the PREFIX of PREFIX.bin and PREFIX.idx "
    "(also s3://bucket/data/PREFIX).",
)
@click.option(
    "--to",
    "to",
    type=click.Choice(["parquet", "megatron"]),
    default="parquet",
    show_default=True,
    help="Output format: tokenized Parquet (what pack, stats and the loader read), or a "
    "Megatron indexed dataset (.bin/.idx, byte-identical to megatron-core's "
    "IndexedDatasetBuilder; each document's ids then the tokenizer's eos_token, as "
    "preprocess_data.py --append-eod). docs/integrations.md.",
)
@click.option(
    "--keep-field",
    multiple=True,
    metavar="NAME",
    callback=lambda ctx, param, value: tuple(_field("--keep-field", v) for v in value),
    help="Carry this JSONL field / Parquet column along as a string column (repeatable).",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="Tokenizer threads (also sets RAYON_NUM_THREADS for HF tokenizers); with --to megatron "
    "the cores to use: partition worker processes (local) or actors (Ray) [default: all cores].",
)
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists.")
@click.option(
    "--partition-size",
    default=None,
    metavar="SIZE",
    help=f"--to megatron: {PARTS} [default: 256MB]",
)
@click.option(
    "--resume",
    is_flag=True,
    help="--to megatron: finish an interrupted run into the same PREFIX (its finished "
    "partitions are kept).",
)
@engine_options
@corpus_options
@sft_options
def tokenize_cmd(
    inputs: tuple[str, ...],
    output: str,
    to: str,
    keep_field: tuple[str, ...],
    workers: int | None,
    overwrite: bool,
    partition_size: str | None,
    resume: bool,
    engines: EngineOptions,
    corpus: CorpusOptions,
    sft: Any,
) -> None:
    """Tokenize text corpora into tokenized Parquet (or a Megatron indexed dataset).

    INPUT: .txt / .md (one document per file), .jsonl, .parquet (text: --text-column; tokenized
    Parquet: its ids as recorded); text and JSONL also .gz / .zst; files, folders or quoted globs.
    Bad lines and empty documents are skipped and counted (--strict: errors). Fine-tuning records:
    docs/sft.md. --to megatron: --engine, --partition-size, --resume (docs/scale-out.md).
    """
    check_input_options(inputs, corpus, sft)
    common: dict[str, Any] = {
        "read_config": corpus.read_config(extra_fields=keep_field, sft=sft),
        "tokenizer": corpus.tokenizer_for(inputs, workers, megatron=to == "megatron"),
        "workers": workers,
        "overwrite": overwrite,
        "command": command_line.recorded(),
    }
    if to != "megatron":
        given = [
            name
            for name, used in (
                ("--engine", engines.engine != "local"),
                ("--partition-size", partition_size is not None),
                ("--resume", resume),
            )
            if used
        ]
        if given:
            raise ConfigError(
                f"{given[0]} needs --to megatron (Parquet output runs in this process)"
            )
        from packtool.tokenize.tokenize import tokenize_corpus

        exits.written(tokenize_corpus(inputs, output, **common).format())
        return
    from packtool.dataset.megatron import megatron_paths
    from packtool.engines.megatron.run import tokenize_megatron

    # The run's staging folder sits beside PREFIX.idx (its lock's file).
    index = str(megatron_paths(output)[1])
    interrupt.note.set(functools.partial(interrupt.resume_note, index, overwrite))
    try:
        summary = tokenize_megatron(
            inputs,
            output,
            resume=resume,
            partition_size=parse_size(
                partition_size or "256MB", "--partition-size", MIN_PARTITION_SIZE
            ),
            engine=engines.engine,
            engine_config=engines.config(workers),
            **common,
        )
    except (AlreadyComplete, Detached) as done:  # nothing to do / the jobs run on
        exits.written(str(done))
        return
    exits.written(summary.format())


@cli.command("stats", short_help="Length statistics: percentiles, padding waste, bounds.")
@inputs_argument
@click.option(
    "--max-len",
    default="4096",
    show_default=True,
    metavar="TOKENS",
    help="Row length: padding, lower bounds and projected packing are for this length.",
)
@click.option(
    "--batch-size",
    default="8",
    show_default=True,
    metavar="N",
    help="Chunks (documents after --long-docs at --max-len) per batch for the "
    "pad-each-batch-to-its-longest waste figure.",
)
@click.option(
    "--candidates",
    default=None,
    metavar="L1,L2,...",
    help="Max lengths to compare [default: 512,1024,...,32768].",
)
@click.option(
    "--long-docs",
    type=click.Choice(LONG_DOC_POLICIES),
    default="split",
    show_default=True,
    help="Model `pack --long-docs`: documents longer than a max length are cut into chunks, "
    "truncated or dropped before padding and packing (with a loss mask: split or truncate).",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option(
    "--plot",
    default=None,
    type=input_options.NamedPath(dir_okay=False, path_type=str),
    metavar="FILE.png",
    help="Draw the length histogram with the max length marked.",
)
@click.option("--workers", type=click.IntRange(min=1), default=None, help=WORKERS_HELP)
@corpus_options
@sft_options
def stats_cmd(
    inputs: tuple[str, ...],
    max_len: str,
    batch_size: str,
    candidates: str | None,
    long_docs: str,
    as_json: bool,
    plot: str | None,
    workers: int | None,
    corpus: CorpusOptions,
    sft: Any,
) -> None:
    """Length statistics: distribution, padding waste, lower bounds, projected packing.

    INPUT: raw corpora (tokenized on the fly with --tokenizer) or tokenized Parquet (only the
    `length` column is read). Also compares candidate max lengths and suggests one.
    """
    import json

    from packtool.stats.lengths import DEFAULT_CANDIDATES, StatsConfig, compute_stats
    from packtool.stats.report import render_report

    if candidates is None:
        cands = DEFAULT_CANDIDATES
    else:
        cands = tuple(  # each once, in the order given (a repeated one was a repeated row)
            dict.fromkeys(positive_int("--candidates", c.strip()) for c in candidates.split(","))
        )
    config = StatsConfig(
        max_len=positive_int("--max-len", max_len, least=2, most=MAX_LEN_LIMIT),
        batch_size=positive_int("--batch-size", batch_size, "chunks"),
        candidates=cands,
        long_docs=long_docs,
    )
    if plot is not None:
        from packtool.stats.plots import check_plot_path

        check_plot_path(plot)  # fail before the (possibly long) pass over the corpus
    # Tokenized Parquet carries its lengths: only the `length` column is read, and the
    # tokenizer is loaded only where --tokenizer is given (loading a large tokenizer.json takes
    # seconds), to be compared with the recorded one as pack and tokenize compare it (a
    # tokenizer unlike it, or an --eos-id / --bos-id unlike the file's, is their one-line
    # error; until 2026-12-07 stats warned that they were ignored and went on).
    check_input_options(inputs, corpus, sft)  # first, as tokenize: a misspelt field costs no load
    tokenizer = corpus.tokenizer_for(inputs, workers)  # --tokenizer-engine alone: a warning
    stats = compute_stats(
        inputs,
        config,
        read_config=corpus.read_config(sft=sft),
        tokenizer=tokenizer,
        workers=workers,
    )
    # The report first: a plot that fails (a full disk, no permission) after a long pass over
    # the corpus took the figures with it.
    if as_json:
        echo(json.dumps(stats.to_dict(), indent=2))
    else:
        echo(render_report(stats))
    if plot is not None:
        from packtool.stats.plots import plot_length_histogram

        plot_length_histogram(stats.lengths, config.max_len, plot)
        echo(f"wrote {plot}", err=as_json)


@cli.command("pack", short_help="Tokenize and pack a corpus into Parquet shards.")
@inputs_argument
@click.option(
    "-o",
    "--output",
    required=True,
    type=click.Path(path_type=str),
    callback=lambda ctx, param, value: _named(value),
    help="Output folder, or a bucket prefix (s3://bucket/prefix: written without a rename, "
    "docs/remote.md).",
)
@click.option(
    "--max-len",
    default="4096",
    show_default=True,
    metavar="TOKENS",
    callback=lambda ctx, param, value: positive_int(
        "--max-len", str(value), least=2, most=MAX_LEN_LIMIT
    ),
    help="Tokens per row at most.",
)
@click.option(
    "--algorithm",
    type=click.Choice(["ffd", "bfd"]),
    default="ffd",
    show_default=True,
    help="First-fit-decreasing or best-fit-decreasing.",
)
@click.option(
    "--long-docs",
    type=click.Choice(LONG_DOC_POLICIES),
    default=None,
    help="Documents longer than --max-len: cut into max-len chunks, truncate, or drop "
    "[default: split; truncate for data with a loss mask, which is never split].",
)
@click.option(
    "--rounds",
    type=ROUNDS,
    default=1,
    show_default=True,
    help="Packing passes: 1 = plain FFD/BFD; each extra round repacks the least-filled 10% of "
    "rows from a seeded shuffle, kept when it saves rows.",
)
@click.option(
    "--seed", type=AT_LEAST_0, default=0, show_default=True,
    help="Seeds the repacking rounds and the output's row order (shards differ even at --rounds 1).",
)  # fmt: skip
@click.option(
    "--group-by",
    default=None,
    metavar="FIELD",
    callback=lambda ctx, param, value: None if value is None else _field("--group-by", value),
    help="Pack only documents with the same FIELD together (source = the input file, or a "
    "JSONL field / Parquet column).",
)
@click.option("--chunk-docs", type=AT_LEAST_1, default=100_000, show_default=True, help=CHUNKS)
@click.option("--shard-rows", type=ROWS, default=16384, show_default=True, help="Rows per shard.")
@click.option("--row-group-rows", type=ROWS, default=256, show_default=True, help=GROUP_ROWS)
@click.option(
    "--compression",
    type=click.Choice(["lz4", "zstd", "snappy", "none"]),
    default="lz4",
    show_default=True,
    help="Parquet codec (lz4: fast to load; zstd: smallest).",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Replace the dataset in the output folder; the old one stays until the new one is "
    "complete, and is kept if the run fails.",
)
@click.option("--partition-size", default="256MB", show_default=True, metavar="SIZE", help=PARTS)
@click.option("--resume", is_flag=True, help="Finish an interrupted run into the same folder.")
@click.option("--workers", type=click.IntRange(min=1), default=None, help=PACK_WORKERS)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@engine_options
@corpus_options
@sft_options
@click.pass_context
def pack_cmd(
    ctx: click.Context,
    inputs: tuple[str, ...],
    output: str,
    max_len: int,
    algorithm: str,
    long_docs: str | None,
    rounds: int,
    seed: int,
    group_by: str | None,
    chunk_docs: int,
    shard_rows: int,
    row_group_rows: int,
    compression: str,
    overwrite: bool,
    partition_size: str,
    resume: bool,
    workers: int | None,
    as_json: bool,
    engines: EngineOptions,
    corpus: CorpusOptions,
    sft: Any,
) -> None:
    """Tokenize (or read tokenized Parquet), pack into rows and write Parquet shards + index.json.

    INPUT: raw corpora as for `packtool tokenize`, or tokenized Parquet from it (then the
    recorded tokenizer is used unless --tokenizer is given, which must match it).
    """
    import json
    from concurrent.futures import ThreadPoolExecutor

    # Start-up overlaps: the tokenizer loads in one thread while this one imports the rest.
    # numba is not among those imports (packtool/pack/jit.py): a partition loads its kernels
    # once it has started reading, so numba's import does not compete for the GIL with the
    # tokenizer's build. Errors keep their order: the tokenizer's surface only where it is
    # awaited below.
    loader = ThreadPoolExecutor(1, thread_name_prefix="packtool-tokenizer")
    loading = loader.submit(contextvars.copy_context().run, corpus.tokenizer_for, inputs, ctx=ctx)
    loader.shutdown(wait=False)
    from packtool.dataset.shards import ShardConfig
    from packtool.engines.local import RunConfig
    from packtool.pack.chunk import PackConfig

    check_input_options(inputs, corpus, sft)
    extra = () if group_by in (None, "source") else (group_by,)
    config = RunConfig(
        inputs=inputs,
        out_dir=output,
        pack=PackConfig(
            max_len=max_len,
            algorithm=algorithm,
            long_docs=long_docs,
            rounds=rounds,
            seed=seed,
            group_by=group_by,
        ),
        shards=ShardConfig(
            shard_rows=shard_rows, row_group_rows=row_group_rows, compression=compression
        ),
        read=corpus.read_config(extra_fields=extra, sft=sft),
        chunk_docs=chunk_docs,
        partition_size=parse_size(partition_size, "--partition-size", MIN_PARTITION_SIZE),
        workers=workers,
        overwrite=overwrite,
        resume=resume,
        command=command_line.recorded(),
    )
    tokenizer = loading.result()
    interrupt.note.set(functools.partial(interrupt.resume_note, output, overwrite))
    try:
        summary = engines.run(config, tokenizer, workers)
    except AlreadyComplete as done:  # --resume of a finished run: success, with nothing to do
        as_dict = {"output": done.output, "already_complete": True, "message": str(done)}
        exits.written(json.dumps(as_dict, indent=2) if as_json else str(done))
        return
    except Detached as gone:  # --no-wait: the jobs run on; --resume finishes
        as_dict = {
            "output": output,
            "detached": True,
            "job_ids": gone.job_ids,
            "message": str(gone),
        }
        exits.written(json.dumps(as_dict, indent=2) if as_json else str(gone))
        return
    if as_json:
        exits.written(json.dumps(summary.to_dict(), indent=2))
    else:
        exits.written(summary.format(max_len))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and turns `PacktoolError` into one line."""
    # Python's default (700) ran ~250 collections in a pack's imports: 0.3-0.45 s with the GIL
    # held. A command's data is arrays, not cycles; collections stay on, just rarer.
    gc.set_threshold(10_000, 10, 10)
    os.environ.setdefault("PACKTOOL_NUMBA_EXTENSIONS", "0")  # packtool/pack/warmup.py says why
    given = sys.argv[1:] if argv is None else [str(a) for a in argv]
    running, noting = command_line.ARGS.set(given), interrupt.note.set(lambda: "")
    # Installed here, next to the `try` whose `finally` restores it: an error before it (an
    # argument that is no text) left the CLI's handler in place for an in-process caller.
    previous, previous_term = interrupt.install_sigint(), interrupt.install_sigterm()
    try:
        cli.main(args=given, prog_name="packtool", standalone_mode=False)
    except BaseException as exc:  # one line and an exit code for what a user can act on
        named = bool(given) and given[0] in cli.commands
        code = exits.report(exc, f"packtool {given[0]}" if named else "packtool")
        if code is None:
            raise
        sys.exit(code)
    finally:
        interrupt.note.reset(noting)
        command_line.ARGS.reset(running)
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        if previous_term is not None:
            signal.signal(signal.SIGTERM, previous_term)
        if argv is None:
            _before_exit()


def _before_exit() -> None:
    """The console script's process ends next: spare it the teardown's full collections over
    every object the imports made (numba, pyarrow: ~117,000; ~0.1 s of a pack's 2.5 s here),
    which skip frozen objects. Only when `main()` read `sys.argv` (the command itself): a caller
    that passes `argv` (tests, other programs) goes on living and keeps its collections."""
    gc.freeze()


if __name__ == "__main__":  # pragma: no cover
    # `python -m packtool.cli.commands` (older scripts) as `entry.main` runs it, stdout and
    # stderr held when closed; only a Ctrl-C during this module's imports is not one line here
    # (`python -m packtool.cli` is the console script entirely).
    from packtool.storage import writing

    writing.hold_standard_descriptors()
    main()
