"""Storage: the one seam between packtool (and the loader) and the file system they read.

Today one backend, the local (POSIX) file system (`local.py`): `expand` turns files, folders and
globs into a sorted, de-duplicated file list (stat-ing in parallel, refusing in one line what is
not a regular file), and every read goes through it: `open_input` (byte streams), `read_bytes` /
`read_text` (small files), `memory_map` (the loader's shards), `parquet_file` /
`parquet_schema` / `parquet_metadata`. Each is the call packtool made before, so bytes and speed
are unchanged; tests/test_architecture.py fails when another module opens a file to read it.
The folder is shaped after fsspec / `pyarrow.fs` (list, stat, open for reading, random access)
so that object storage plugs in as a second backend. The write side (the shard writer, the
output transaction's renames and lock, run records) still calls the OS in its modules
(docs/architecture.md, "The storage seam, today").

Records in: paths and globs as people type them. Out: `pathlib.Path` lists, open files, bytes.
May import: packtool's top-level modules (`errors`, `prefetch`) only; pyarrow on first use.

Modules:
- `local.py`: the local file system.
"""
