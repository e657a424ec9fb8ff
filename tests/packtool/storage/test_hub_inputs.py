"""`hf://` inputs read through huggingface_hub's own `HfFileSystem`, over HTTP, from a stand-in
Hub on loopback (tests/packtool/storage/hub_server.py; `HF_ENDPOINT` and the `endpoint`
storage option point the client at it): nothing of the client library is replaced, so what its
listings and its `info` give is what packtool compares."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from packtool.storage import remote, remote_read
from tests.cli import one_error_line, run
from tests.packtool.storage.hub_server import hub_server

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data"
REPO = "hf://datasets/org/name"
OPTIONS = ["--max-len", "512", "--workers", "1", "--partition-size", "100KB"]


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """The stand-in Hub (one per module), serving 300 KB of the sample corpus (three
    partitions of 100 KB) and three text files in a folder."""
    root = tmp_path_factory.mktemp("hub")
    lines = (SAMPLE / "corpus.jsonl").read_bytes().splitlines(keepends=True)
    (root / "corpus.jsonl").write_bytes(b"".join(lines[:400]))
    (root / "text").mkdir()
    for name in sorted(p.name for p in (SAMPLE / "text").iterdir())[:3]:
        shutil.copy(SAMPLE / "text" / name, root / "text" / name)
    with hub_server(root) as (endpoint, served), pytest.MonkeyPatch.context() as env:
        env.setenv("HF_ENDPOINT", endpoint)
        # (huggingface_hub reads HF_ENDPOINT once, at its import: the option reaches it always)
        env.setenv(remote.OPTIONS_ENV, json.dumps({"hf": {"endpoint": endpoint}}))
        remote._filesystem.cache_clear()
        yield SimpleNamespace(root=root, served=served)
    remote._filesystem.cache_clear()


def _shards(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def test_a_hub_file_packs_as_the_local_file(hub, tmp_path):
    """Every hf:// pack failed "changed since the run was planned (modified)": the plan's state
    came from a listing, which holds the file's blob id, and the workers' fresh one from
    `HfFileSystem.info(refresh=True)`, which drops it (a state of 0)."""
    url = f"{REPO}/corpus.jsonl"
    assert remote.stat(url, fresh=True) == remote.stat(url)
    assert remote.stat(url).st_mtime_ns != 0  # its blob id names its version
    code, _, err = run("pack", hub.root / "corpus.jsonl", "-o", tmp_path / "local", *OPTIONS)
    assert code == 0, err
    want = _shards(tmp_path / "local")
    assert len(want) > 1
    code, _, err = run("pack", url, "-o", tmp_path / "hub", *OPTIONS)
    assert code == 0, err
    assert _shards(tmp_path / "hub") == want
    code, _, err = run("pack", hub.root / "text", "-o", tmp_path / "text", "--max-len", "512")
    assert code == 0, err
    code, _, err = run("pack", f"{REPO}/text/", "-o", tmp_path / "hub-text", "--max-len", "512")
    assert code == 0, err
    assert _shards(tmp_path / "hub-text") == _shards(tmp_path / "text")


def test_a_hub_read_downloads_the_bytes_it_asks_for(hub):
    """`HfFileSystem.cat_file` opens the file with fsspec's 5 MB read-ahead: every ranged read
    of an hf:// input downloaded up to 5 MB more than it asked for (a 256 KB first block, a
    partition's range, a record's probe)."""
    url = f"{REPO}/corpus.jsonl"
    data = (hub.root / "corpus.jsonl").read_bytes()
    hub.served.clear()
    assert remote_read.read_range(url, 1_000, 3_000) == data[1_000:3_000]
    assert hub.served == [("corpus.jsonl", 2_000)]
    hub.served.clear()
    with remote_read.open_input(url) as f:
        assert f.read() == data
    assert sum(n for _, n in hub.served) == len(data)  # each byte once
    assert len(hub.served) == 2  # the first block (256 KB), then the rest


def test_a_missing_hub_path_or_an_unreachable_hub_is_one_line_naming_the_input(hub, monkeypatch):
    """A folder missing from the repository was "prefix holds no corpus files" (as if empty),
    and the look for a dataset link under a folder named a file the user never gave
    (`.../text/index.json: ConnectError`)."""
    for given in (
        f"{REPO}/nope/",
        f"{REPO}/nope",
        f"{REPO}/nope.jsonl",
        "hf://datasets/org/nope/x/",
    ):
        code, _, err = run("stats", given)
        assert code == 1
        assert one_error_line(err).startswith(f"error: {given}: not found on the Hub ("), err
    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{free.getsockname()[1]}"
    monkeypatch.setenv(remote.OPTIONS_ENV, json.dumps({"hf": {"endpoint": dead}}))
    for given in (f"{REPO}/text/", f"{REPO}/text", f"{REPO}/corpus.jsonl"):
        code, _, err = run("stats", given)
        assert code == 1
        line = one_error_line(err)
        assert line.startswith(f"error: {given}: ") and "index.json" not in line, line
        assert "Connect" in line, line


@pytest.mark.parametrize("spelling", ["hf", "HF", "Hf"])
def test_an_hf_url_in_any_case_is_the_same_hub_file(hub, tmp_path, spelling):
    """`is_remote` took `HF://` (schemes are case-insensitive) but the readers did not:
    `pack HF://...`, `-o HF://...` and `--tokenizer HF://.../tokenizer.json` were a traceback
    ("ValueError: Unsupported filesystem: 'HF'"); `--tokenizer hf://.../tokenizer.json` was
    read as the local path '//datasets/...' (the `hf:` prefix of a local path). Every spelling
    reads the Hub's file, as `hf://` does as an input."""
    from packtool.storage import local as storage
    from packtool.tokenizer.files import resolve
    from tests.packtool.tokenizer_shapes import build

    tok = build("gpt2", hub.root / "tok")
    url = f"{spelling}://datasets/org/name"
    files = resolve(f"{url}/tok/tokenizer.json")
    assert files.kind == "hf" and storage.read_bytes(files.path) == tok.read_bytes()
    assert storage.read_bytes(resolve(f"{url}/tok/").path) == tok.read_bytes()
    code, _, err = run("pack", hub.root / "corpus.jsonl", "-o", tmp_path / "local", *OPTIONS)
    assert code == 0, err
    code, _, err = run("pack", f"{url}/corpus.jsonl", "-o", tmp_path / "hub", *OPTIONS)
    assert code == 0, err
    assert _shards(tmp_path / "hub") == _shards(tmp_path / "local")
