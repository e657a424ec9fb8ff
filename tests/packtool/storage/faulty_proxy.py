"""A fault-injecting HTTP proxy for the object-storage tests: in front of the loopback S3 server,
it answers some requests with 503 SlowDown, drops the connection of others without an answer,
and cuts the body of others short, on a fixed schedule (so a run is repeatable). With
`requests="writes"` the uploads are faulted instead (PUTs, multipart parts included), a `deny`
fault answers 403 AccessDenied, which no client retries, and a `conflict` fault 409
ConditionalRequestConflict (AWS's answer to a conditional put racing another, which moto never
gives). `delay_ms` holds every request that long before it is forwarded (a real network's round
trip; benchmarks/bench_bucket_loader.py `--latency-ms` runs it as a process of its own:
`python -m tests.packtool.storage.faulty_proxy UPSTREAM MS` prints its URL and forwards until
killed). `seen` lists the requests it was sent (with no faults: a request counter)."""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)

CONFLICT = (
    b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ConditionalRequestConflict</Code>'
    b"<Message>A conflicting conditional operation is currently in progress against this "
    b"resource. Please try again.</Message></Error>"
)
ANSWERS = {"slowdown": (503, SLOWDOWN), "deny": (403, DENIED), "conflict": (409, CONFLICT)}


class FaultyProxy:
    """`with FaultyProxy(upstream, every={"slowdown": 3, ...}) as url:` forwards to `upstream`;
    the n-th GET of an object (1-based, ranged reads and whole reads alike) gets the fault whose
    period divides n (the first listed that does), `counts` says how many of each were sent.
    `most`: each fault is sent at most that many times to each object (None: on every period);
    `by_object` counts the faults each object got, by (fault, path)."""

    def __init__(
        self,
        upstream: str,
        every: dict[str, int],
        requests: str = "reads",
        delay_ms: float = 0,
        most: int | None = None,
    ) -> None:
        self.upstream = urlsplit(upstream)
        self.delay = delay_ms / 1000
        self.every = every
        self.requests = requests
        self.most = most
        self.by_object: dict[tuple[str, str], int] = {}
        self.counts = {name: 0 for name in every} | {"forwarded": 0}
        self.seen: list[tuple[str, str]] = []
        """Every request's method and path, in the order they came."""
        self._n = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # An answer goes out in two writes (the headers, then the body) on a connection
            # the client keeps: with Nagle's algorithm the body waited for the client's delayed
            # ACK of the headers, ~40 ms a request (a pack through the proxy: ~5 s of waiting).
            disable_nagle_algorithm = True

            def log_message(self, *args) -> None:  # quiet
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                proxy.seen.append((self.command, self.path))
                fault = proxy._fault(self.command, self.path)
                if fault == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if fault in ANSWERS:
                    status, answer = ANSWERS[fault]
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(answer)))
                    self.end_headers()
                    self.wfile.write(answer)
                    return
                time.sleep(proxy.delay)
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                headers["Host"] = proxy.upstream.netloc
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                self.send_response(resp.status)
                head = self.command == "HEAD"  # its Content-Length is the object's: kept
                for k, v in resp.getheaders():
                    skip = ("transfer-encoding", "connection") + (
                        () if head else ("content-length",)
                    )
                    if k.lower() not in skip:
                        self.send_header(k, v)
                if not head:
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "truncate" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])  # then the connection goes
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _fault(self, method: str, path: str) -> str | None:
        if self.requests == "writes":
            if method != "PUT":  # uploads: whole objects and multipart parts
                return None
        elif method != "GET" or "?" in path:  # object reads only (not listings)
            return None
        with self._lock:
            self._n += 1
            n = self._n
            for name, period in self.every.items():
                key = (name, path.split("?")[0])
                if n % period == 0 and (
                    self.most is None or self.by_object.get(key, 0) < self.most
                ):
                    self.counts[name] += 1
                    self.by_object[key] = self.by_object.get(key, 0) + 1
                    return name
            self.counts["forwarded"] += 1
        return None

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    with FaultyProxy(sys.argv[1], {}, delay_ms=float(sys.argv[2])) as url:
        print(url, flush=True)
        threading.Event().wait()
