"""`python -m packtool.cli`: the console script (`entry.main`), as `packtool` runs it, for a
program that runs the CLI with its own interpreter (benchmarks/: `sys.executable -m ...`)."""

from packtool.cli.entry import main

if __name__ == "__main__":  # not when a spawned process re-imports its parent's main module
    main()
