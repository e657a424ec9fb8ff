"""The names packtool writes in a dataset folder, and the one test of whether an entry is one.

What may be deleted (`pack --overwrite`, a stray version in a bucket), switched in or warned
about is decided by these names, so each is written here once:

- shards: `shard-PPPPPP-KKKKK.parquet` (`pack`: shard K of partition or merge node P,
  packtool/engines/records.py) and `shard-NNNNN.parquet` (`write_shards`, which
  `loader.testing` writes datasets with, and the `pack` of an older packtool);
- parts: `part-NNNNN.parquet` (`packtool tokenize`, packtool/dataset/tokenized_writer.py);
- `index.json`, `sources.json` and `groups.json` (packtool/dataset/manifest.py);
- a run's state: `.packtool-run` (a folder, packtool/engines/records.py) and an older packtool's
  (`.pack-state.json`, `.ray-chunks`);
- temporaries of atomic writes (`writing.looks_temporary`).

Shards and parts are told by prefix and suffix (`shard-*.parquet`, `part-*.parquet`), as they
always were; an entry counts only as the kind packtool writes it (`written_entry`): a folder named
like a shard is a user's.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from packtool.dataset.manifest import GROUPS_FILE, INDEX_FILE, SOURCES_FILE
from packtool.errors import ConfigError
from packtool.storage import writing

SHARD_PATTERN = "shard-{:05d}.parquet"
"""Shard N of `write_shards` (and of an older packtool's `pack`)."""
PACK_SHARD_PATTERN = "shard-{:06d}-{:05d}.parquet"
"""Shard `k` of unit `p` of a `pack` run: a partition (0 .. N - 1), or a node of the tail tree,
numbered on after the partitions (packtool/engines/merge.py; the root last, N when there are at
most `merge.TAIL_FAN_IN` partitions). Names are final when written and sort in manifest order."""
PART_PATTERN = "part-{:05d}.parquet"
"""Part N of a `packtool tokenize` output folder."""
RUN_STATE = ".packtool-run"
"""A pack run's state in its staging (packtool/engines/records.py). `commit` deletes it just
before the switch (in a bucket just after, so it is there while the link is written): a
`--resume` of a run killed before its switch knows what options and inputs built it."""
OLD_STATE = (".pack-state.json", ".ray-chunks")
"""What packtool before the partition engines (#13) kept there (a file and a folder); such a run
cannot be resumed."""
MANIFEST_FILES = (INDEX_FILE, SOURCES_FILE, GROUPS_FILE)


def is_shard_name(name: str) -> bool:
    """A shard's name: `shard-*.parquet` (both `PACK_SHARD_PATTERN` and `SHARD_PATTERN`)."""
    return name.startswith("shard-") and name.endswith(".parquet")


def is_part_name(name: str) -> bool:
    """A tokenize part's name: `part-*.parquet` (`PART_PATTERN`)."""
    return name.startswith("part-") and name.endswith(".parquet")


def is_state_name(name: str) -> bool:
    """A run's state, this packtool's (`RUN_STATE`) or an older one's (`OLD_STATE`)."""
    return name == RUN_STATE or name in OLD_STATE


def written_entry(name: str, file: bool, *, parts: bool) -> bool:
    """Whether an entry of a dataset folder is one packtool writes, by name and kind (`file`: a
    regular file, or an object in a bucket): shards (with `parts`, tokenize's parts too), the
    manifest and its lists of sources and groups, and temporaries as files; a run's state of
    either kind."""
    if is_state_name(name):
        return True
    if not file:
        return False
    return (
        is_shard_name(name)
        or (parts and is_part_name(name))
        or name in MANIFEST_FILES
        or writing.looks_temporary(name)
    )


def check_name_fits(shown: str, target: Path, beside: Iterable[Path]) -> None:
    """Refuse a local output whose name, or a name packtool writes beside it (`.NAME.packtool-
    staging`, the lock, ...), is longer than its folder's file system allows (`NAME_MAX`): the
    failure came later as "File name too long", naming the output itself (whose name fits) or
    the hidden name without saying what it is. Asked once the parent folder exists."""
    limit = writing.name_limit(target.parent)
    own = len(os.fsencode(target.name))
    if own > limit:
        raise ConfigError(
            f"{shown}: the name is {own} bytes, longer than the file system allows ({limit})"
        )
    longest = max((len(os.fsencode(p.name)) for p in beside), default=0)
    given = len(os.fsencode(Path(shown).name))  # `-o` as typed (a Megatron PREFIX, not .idx)
    if longest > limit:
        raise ConfigError(
            f"{shown}: the name is too long for the names packtool writes beside it "
            f"(.NAME.packtool-staging and the like: {longest} bytes, where the file system "
            f"allows {limit}); choose a shorter name (at most {given - (longest - limit)} bytes)"
        )
