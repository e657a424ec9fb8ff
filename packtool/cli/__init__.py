"""The `packtool` command line: click only, thin over the library.

Each command parses its options, builds the library's config, calls one library function and
prints its result; errors of the `PacktoolError` hierarchy and bad option values become one
line and exit code 1 (a wrong option or argument, one line and 2), Ctrl-C a short message and
exit code 130. The console script is `packtool.cli.entry:main` (it imports `commands` and
calls its `main`; a Ctrl-C during that import is one line too).

Records in: argv. Out: text or JSON on stdout, the library's files.
May import: anything in packtool (it is the top layer); nothing imports it.

Modules:
- `entry.py`: the console script, light to import (Ctrl-C while the commands load).
- `__main__.py`: `python -m packtool.cli`, the console script for a program that runs the CLI
  with its own interpreter (benchmarks/; `python -m packtool.cli.commands` misses only the
  early Ctrl-C handler).
- `commands.py`: the commands (`tokenize`, `stats`, `pack`, `mix`, `verify`, `inspect`).
- `input_options.py`: the corpus and fine-tuning options the input commands share.
- `input_checks.py`: given options the inputs cannot use (an error, or a warning where the
  output is the same either way).
- `engine_options.py`: where `pack` runs (`--engine local|ray|slurm` and their options).
- `interrupt.py`: Ctrl-C handling.
- `command_line.py`: the command line a run records (index.json, the output's lock), secrets
  (`--storage-options`, a URL's password) hidden.
- `exits.py`: a failure as one line on stderr and an exit code (a closed pipe: 0).
"""
