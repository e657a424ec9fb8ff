"""A stand-in for the Hugging Face Hub's HTTP API, read-only, on loopback: what `HfFileSystem`
asks of the Hub to list and read a dataset repository (`repo_info`, the tree listing,
`paths-info`, and `resolve` with range requests), answered from a local folder, which is the
dataset repository `org/name` at revision `main`. The client library is not touched: packtool
reads it through huggingface_hub's own `HfFileSystem`, pointed here by `HF_ENDPOINT` and the
`endpoint` storage option. `served` records the bytes each `resolve` GET answered."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

REPO = "org/name"
HEAD = "a" * 40


def _entry(root: Path, rel: str) -> dict[str, Any]:
    """A tree / paths-info entry for `rel` under `root` (a file's oid is its content's sha1)."""
    full = root / rel
    if full.is_dir():
        return {"type": "directory", "oid": hashlib.sha1(rel.encode()).hexdigest(), "path": rel}
    data = full.read_bytes()
    return {"type": "file", "oid": hashlib.sha1(data).hexdigest(), "size": len(data), "path": rel}


class HubHandler(http.server.BaseHTTPRequestHandler):
    """The Hub's answers for the dataset `REPO` held in `root` (set by `hub_server`)."""

    protocol_version = "HTTP/1.1"
    root: Path
    served: list[tuple[str, int]]
    """(file, bytes of its body) per `resolve` GET answered."""

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any) -> None:
        self._answer(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

    def _missing(self, code: str) -> None:
        message = f"{code}: not here"
        body = json.dumps({"error": message}).encode()
        self._answer(404, body, {"X-Error-Code": code, "X-Error-Message": message})

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()
        path = urlsplit(self.path).path
        if not re.fullmatch(rf"/api/datasets/{REPO}/paths-info/[^/]+", path):
            return self._missing("RepoNotFound")
        if self.headers.get("Content-Type", "").startswith("application/json"):
            paths = json.loads(raw).get("paths", [])
        else:
            paths = parse_qs(raw).get("paths", [])
        self._json([_entry(self.root, p) for p in paths if (self.root / p).exists()])

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        path, query = unquote(parts.path), parse_qs(parts.query)
        if re.fullmatch(rf"/api/datasets/{REPO}(/revision/[^/]+)?", path):
            return self._json({"id": REPO, "sha": HEAD, "private": False, "siblings": []})
        tree = re.fullmatch(rf"/api/datasets/{REPO}/tree/[^/]+/?(.*)", path)
        if tree:
            return self._tree(tree.group(1).strip("/"), query)
        resolve = re.fullmatch(rf"/datasets/{REPO}/resolve/[^/]+/(.*)", path)
        if resolve:
            return self._resolve(resolve.group(1))
        if path.startswith("/api/"):
            return self._missing("RepoNotFound")
        return self._missing("EntryNotFound")

    def _tree(self, rel: str, query: dict[str, list[str]]) -> None:
        folder = self.root / rel
        if not folder.is_dir():
            return self._missing("EntryNotFound")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        found = sorted(folder.rglob("*") if recursive else folder.iterdir())
        self._json([_entry(self.root, str(p.relative_to(self.root))) for p in found])

    def _resolve(self, rel: str) -> None:
        full = self.root / rel
        if not full.is_file():
            return self._missing("EntryNotFound")
        data = full.read_bytes()
        headers = {"ETag": f'"{hashlib.sha1(data).hexdigest()}"', "X-Repo-Commit": HEAD}
        headers["Accept-Ranges"] = "bytes"
        wanted = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        status, body = 200, data
        if wanted:
            start = int(wanted.group(1))
            end = min(int(wanted.group(2)) if wanted.group(2) else len(data) - 1, len(data) - 1)
            status, body = 206, data[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
        if self.command == "GET":
            self.served.append((rel, len(body)))
        self._answer(status, body, headers)


@contextlib.contextmanager
def hub_server(root: Path) -> Iterator[tuple[str, list[tuple[str, int]]]]:
    """The stand-in Hub serving `root` as `hf://datasets/org/name` on a free loopback port while
    the block runs: (its endpoint URL, the `served` list of its `resolve` GETs)."""
    served: list[tuple[str, int]] = []
    handler = type("Hub", (HubHandler,), {"root": Path(root), "served": served})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", served
    finally:
        server.shutdown()
        server.server_close()
