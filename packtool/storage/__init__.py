"""Storage: the one seam between packtool (and the loader) and the file system.

Every file-system operation of packtool and the loader goes through here: the local (POSIX) file
system, split along the read/write seam, and object stores and the web:

- `local.py`, the read side: `expand` turns files, folders and globs into a sorted,
  de-duplicated file list (stat-ing in parallel, refusing in one line what is not a regular
  file); stat and listing (`stat`, `file_states`, `exists`, `is_file`, `list_dir`, `glob`,
  `resolve`); reads: `open_input` (byte streams), `read_bytes` / `read_text` (small files),
  `memory_map`, `parquet_file` / `_schema` / `_metadata`, `open_random`, `open_size`: a
  local file's are `local_files.py`'s (pyarrow's opens by name, names not UTF-8 included);
  `footers.py`: a Parquet file's identity by content (its size and footer bytes, one read).
- `remote.py`: what `local.py` hands on for a URL (`s3://`, `gs://`, `az://`, `hf://`,
  `https://`), through fsspec: prefixes and globs listed, objects stat-ed (size and state),
  opened for ranged reads (http(s)://: retried, `web.py`), failures one line naming the URL.
- `writing.py`, the write side: folders, files written whole (temporary name, fsync, rename),
  pyarrow's writers, in-place appends, replace / rename / remove, folder fsync, and the
  one-writer lock (`take_lock`). On a URL it hands on to:
- `remote_write.py`: an object store's write side: a local file uploaded whole (multipart
  under 10,000 parts, aborted on failure), small objects in one PUT, conditional puts, removal,
  unfinished uploads aborted, and the lock object under a renewed lease.
- `cache.py`: the node-local cache of byte ranges of objects (the loader's row groups of a
  dataset in a bucket): downloaded once per node, shared by its processes, pinned, bounded.

Names follow fsspec / `pyarrow.fs`; tests/test_architecture.py fails when another module
touches the file system itself (docs/architecture.md, "The storage seam").

Records in: paths, URLs and globs as people type them, bytes and tables to write. Out:
`pathlib.Path` lists (`upath.UPath` for URLs), stat results, open files, bytes.
May import: packtool's top-level modules (`errors`, `prefetch`) only; pyarrow on first use.
"""
