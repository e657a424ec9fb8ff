"""`hf://` outputs: a dataset built on this machine, published to the Hub in one commit.

On the Hugging Face Hub every object written is a commit: through `HfFileSystem` a pack would
make one commit per shard, per completion record and per renewal of its lock, and the Hub
limits how many commits a repository takes an hour. A commit is also the Hub's one atomic
step, and `parent_commit` makes it conditional. So an `hf://` output is built like a local one,
in a staging folder in the scratch folder (`scratch_folder`), and `publish` makes **one
commit** that adds the version's files (`PREFIX/v-.../`), writes the link `PREFIX/index.json`
naming it, and deletes the version it replaces: readers see the old dataset or the new one,
never a mixture, as on a bucket (packtool/dataset/output.py).

One writer per output: on this machine, a lock file beside the staging folder; between
machines, the commit names as its parent the revision's head read when the run took its lock,
so the Hub refuses it when anyone committed to the repository since (the run fails in one line,
its staging kept: `--resume` then commits what it built, against the new head).

The commit goes through `huggingface_hub.HfApi` (the `[hub]` extra), with `HF_TOKEN` or the
`token` of the `hf` storage options.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from packtool.errors import (
    OVERWRITE,
    RESUME,
    ConfigError,
    DataError,
    MissingDependencyError,
    first_line,
)
from packtool.storage import remote

REPO_TYPES = {"datasets": "dataset", "spaces": "space", "models": "model"}
"""The first part of an `hf://` path that names the repository type (none: a model)."""


@dataclass(frozen=True)
class HubPath:
    """Where an `hf://` URL points: a repository, a revision, a path inside it."""

    repo_id: str
    repo_type: str
    revision: str | None
    path_in_repo: str


def parse(url: Any) -> HubPath:
    """`hf://[datasets/|spaces/|models/]ORG/NAME[@REVISION]/PATH` split into its parts.

    Raises:
        ConfigError: no repository in it.
    """
    text = str(url)
    try:  # huggingface_hub's own grammar (what HfFileSystem reads), where it has one
        from huggingface_hub.utils import parse_hf_uri
    except ImportError:
        parse_hf_uri = None
    if parse_hf_uri is not None:
        try:
            uri = parse_hf_uri("hf://" + text.split("://", 1)[-1].lstrip("/"))
        except Exception as exc:  # HfUriError: a ValueError
            raise ConfigError(f"{text}: not a Hub path ({first_line(exc)})") from None
        if uri.type not in REPO_TYPES.values():
            raise ConfigError(
                f"{text}: a {uri.type} is not a repository packtool can commit to; write to a "
                "dataset (hf://datasets/ORG/NAME/PATH), model or space repository"
            )
        return HubPath(uri.id, uri.type, uri.revision, (uri.path_in_repo or "").strip("/"))
    parts = [p for p in text.split("://", 1)[-1].split("/") if p]
    repo_type = REPO_TYPES.get(parts[0], "model") if parts else "model"
    if parts and parts[0] in REPO_TYPES:
        parts = parts[1:]
    if len(parts) < 2:
        raise ConfigError(f"{text}: names no repository (hf://datasets/ORG/NAME/PATH)")
    name, _, revision = parts[1].partition("@")
    return HubPath(f"{parts[0]}/{name}", repo_type, unquote(revision) or None, "/".join(parts[2:]))


def scratch_folder(target: Any) -> Path:
    """This machine's folder for the output `target`: its staging folder and its lock file,
    under the scratch folder (`PACKTOOL_SCRATCH`), named by the URL, so a `--resume` finds it."""
    from packtool.storage.writing import scratch_dir

    key = hashlib.sha256(str(target).rstrip("/").encode()).hexdigest()[:16]
    folder = scratch_dir() / "hub" / key
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def lock_file(target: Any) -> Path:
    """The lock of the output `target` on this machine: a file (`flock`), not an object on the
    Hub, where every object written is a commit and each renewal would be another."""
    return scratch_folder(target) / "lock"


def api() -> Any:
    """The Hub client, with the `token` of the `hf` storage options where one is given."""
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise MissingDependencyError(
            "hf:// outputs need huggingface_hub: pip install 'packtool[hub]'"
        ) from None
    return HfApi(token=remote.options_for("hf").get("token"))


def head(target: Any, shown: str = "") -> str | None:
    """The commit the output's revision points at now (None: the repository has none yet).

    Raises:
        DataError: the repository cannot be read (missing, no access), naming `shown` (the
            output as the user gave it) or `target`.
    """
    where = parse(target)
    with remote.naming(shown or target):
        info = api().repo_info(where.repo_id, repo_type=where.repo_type, revision=where.revision)
    return getattr(info, "sha", None)


def publish(
    target: Any,
    staging: Path,
    version: str,
    beside: dict[str, bytes],
    old: str | None,
    parent: str | None,
    shown: str = "",
    resumable: bool = True,
) -> None:
    """One commit: every file under `staging` as `PREFIX/version/...`, the small files `beside`
    it (`PREFIX/NAME`: the link `index.json`), and the deletion of the folder `PREFIX/old`; on
    top of the commit `parent`. `shown`: the output as the user gave
    it, for messages; `resumable`: the command has `--resume` (else a refused commit's built
    dataset is not kept: the next run builds it again).

    Raises:
        ConfigError: the Hub refused the commit because the revision moved past `parent`.
        DataError: any other failure, naming `target`.
    """
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    where = parse(target)
    prefix = where.path_in_repo.strip("/")
    base = f"{prefix}/" if prefix else ""
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    ops: list[Any] = [
        CommitOperationAdd(f"{base}{version}/{p.relative_to(staging).as_posix()}", str(p))
        for p in files
    ]
    ops += [CommitOperationAdd(f"{base}{name}", data) for name, data in beside.items()]
    if old is not None and old != version:
        ops.append(CommitOperationDelete(f"{base}{old}/", is_folder=True))
    client = api()
    try:
        client.create_commit(
            where.repo_id,
            ops,
            commit_message=f"packtool: {base}{version} ({len(files)} files)",
            repo_type=where.repo_type,
            revision=where.revision,
            parent_commit=parent,
        )
    except Exception as exc:
        name = shown or str(target)
        if _moved(exc):  # refused: certainly not committed
            kept = (
                f"nothing was committed; the dataset is built in {staging}: rerun with {RESUME} "
                f"to commit it (or {OVERWRITE} to start over)"
                if resumable
                else "nothing was committed; rerun to build and commit it again"
            )
            raise ConfigError(
                f"{name}: the repository changed since this run started (another commit); {kept}"
            ) from None
        # Any other failure may come after the Hub applied the commit (a lost answer).
        kept = (
            f"the dataset is built in {staging}: rerun with {RESUME}, which commits it unless "
            f"this commit landed after all (or {OVERWRITE} to start over)"
            if resumable
            else "rerun to build and commit it again (check the repository first: the commit "
            "may have landed)"
        )
        raise DataError(
            f"{name}: the commit to the Hub failed ({first_line(exc)}); {kept}"
        ) from None
    fs, path = remote.filesystem(target)
    fs.invalidate_cache(path)  # this process reads the new dataset next (the summary, verify)


def put_files(files: dict[Any, Path], shown: str = "") -> None:
    """Upload local files to their `hf://` URLs (all in one repository and revision) in one
    commit: `tokenize`'s one object, a Megatron pair (its `.bin` and `.idx` together, so no
    reader sees one without the other). Unconditional, as a bucket's whole-object upload is:
    the lock is this machine's.

    Raises:
        DataError: the Hub refused it or could not be reached, naming `shown` or the URL.
    """
    from huggingface_hub import CommitOperationAdd

    targets = {url: parse(url) for url in files}
    first = next(iter(targets.values()))
    if any((w.repo_id, w.repo_type, w.revision) != (first.repo_id, first.repo_type, first.revision)
           for w in targets.values()):  # fmt: skip
        raise ConfigError(f"{shown or next(iter(files))}: one commit writes one repository")
    ops = [
        CommitOperationAdd(targets[url].path_in_repo, str(local)) for url, local in files.items()
    ]
    names = ", ".join(w.path_in_repo for w in targets.values())
    with remote.naming(shown or next(iter(files)), "committed to the Hub"):
        api().create_commit(
            first.repo_id,
            ops,
            commit_message=f"packtool: {names}",
            repo_type=first.repo_type,
            revision=first.revision,
        )
    for url in files:
        fs, path = remote.filesystem(url)
        fs.invalidate_cache(path)


def _moved(exc: BaseException) -> bool:
    """The Hub's answer to a commit whose `parent_commit` is no longer the head (412)."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    text = str(exc).lower()
    return status == 412 or "parent commit" in text or "precondition" in text


def is_hub(path: Any) -> bool:
    """An `hf://` URL."""
    return remote.scheme(path) == "hf"
