"""The `packtool` command line: click only. Each command builds a config and calls one function.

Errors a user can act on (`PacktoolError`) become one line on stderr and exit code 1; click's own
usage errors exit with 2. Nothing here is imported by the library.
"""

from __future__ import annotations

import sys

import click

from packtool import __version__
from packtool.errors import PacktoolError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="packtool")
def cli() -> None:
    """Turn raw text corpora into packed training data.

    \b
    Typical use:
      packtool stats sample_data/corpus.jsonl --max-len 4096
      packtool pack  sample_data/corpus.jsonl -o packed/ --max-len 4096
    """


# --- commands are registered below; keep each one thin over a library function ---


@cli.command("verify")
@click.argument("directory", type=click.Path(file_okay=False, path_type=str))
@click.option(
    "--no-checksums", is_flag=True, help="Skip recomputing sha256 (sizes are still checked)."
)
def verify_cmd(directory: str, no_checksums: bool) -> None:
    """Re-check a packed dataset: checksums, schema, offsets, token ids, totals.

    Prints one OK line, or names the first problem and exits 1.
    """
    from packtool.verify import verify_dataset

    report = verify_dataset(directory, checksums=not no_checksums, progress=True)
    for line in report.warnings:
        click.echo(f"warning: {line}", err=True)
    click.echo(report.summary())


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: runs the CLI and turns `PacktoolError` into one line."""
    try:
        cli.main(args=argv, prog_name="packtool", standalone_mode=False)
    except PacktoolError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except BrokenPipeError:  # `packtool stats ... | head`
        sys.exit(0)


if __name__ == "__main__":  # pragma: no cover
    main()
