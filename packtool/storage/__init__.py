"""Storage: where packtool's file-system operations on inputs live.

Today one backend, the local (POSIX) file system: `local.expand` turns files, folders and globs
into a sorted, de-duplicated file list, stat-ing in parallel, and refuses what is not a regular
file in one line. This is the seam object storage plugs into (the folder is shaped after
fsspec / `pyarrow.fs`: list, glob, stat, open); the rest of packtool's opens, renames, locks and
mmaps still call the OS directly and move here with that work (docs/architecture.md says which).

Records in: paths and globs as people type them. Out: `pathlib.Path` lists.
May import: packtool's top-level modules (`errors`, `prefetch`) only.

Modules:
- `local.py`: expanding inputs on a local file system.
"""
