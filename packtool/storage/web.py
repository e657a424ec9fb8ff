"""`http(s)://` reads: the client's bounds and the retries of a failed request.

fsspec's HTTP file system (over aiohttp) sets no timeout and retries nothing, where the stores'
clients do both (S3: 8 attempts in botocore's adaptive mode, `remote.S3_DEFAULTS`): one 503 or
one dropped connection among the thousands of ranged GETs of a large corpus failed the run.
`bounded_options` gives the client aiohttp timeouts (`HTTP_TIMEOUTS`); `retried` makes a web
request again after a transient failure (`transient`: a 5xx, 408 or 429 answer, a connection
dropped or reset, a body cut short, a timeout), up to `ATTEMPTS` attempts in all with
exponential backoff and jitter, and starts none later than `RETRY_SECONDS` after the first.
`{"http": {"retries": {"max_attempts": N}}}` in the storage options sets the attempts (1: no
retry), as `config_kwargs.retries.max_attempts` does for S3.

Records in: a request (a callable) and the storage options. Out: its answer, or its last error.
"""

from __future__ import annotations

import inspect
import json
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from packtool.errors import STORAGE_OPTIONS, ConfigError, DataError

T = TypeVar("T")

HTTP_TIMEOUTS = {"sock_connect": 10, "sock_read": 60}
"""Seconds an http(s):// read waits to connect and between bytes (aiohttp has no bound)."""
ATTEMPTS = 5
"""Tries of a web request in all (the first and 4 retries) unless the options say otherwise."""
BACKOFF = 0.5
"""Seconds before the first retry (at most; jittered down to half), doubled before each next
one up to `BACKOFF_MAX`: 0.5, 1, 2, 4 s."""
BACKOFF_MAX = 8.0
RETRY_SECONDS = 120.0
"""No retry starts later than this after the request's first attempt began (a server that
stalls takes `HTTP_TIMEOUTS["sock_read"]` an attempt)."""
RETRIED_STATUS = frozenset({408, 429})
"""Answers other than 5xx that are retried: a request timeout and throttling."""
_DROPPED = frozenset({"ServerDisconnectedError", "ClientPayloadError", "ClientOSError",
                      "ServerTimeoutError", "ConnectionTimeoutError", "SocketTimeoutError"})  # fmt: skip
"""aiohttp's errors of a connection dropped, reset or timed out, or a body cut short
(`ClientConnectorError`, a refused connection or an unknown host, is not one: it fails at once)."""


class ShortAnswer(DataError):
    """A range answered with fewer bytes than asked for, the server saying no more (an empty or
    short 206): the bytes after it were lost without a word, as if the file ended there. Made
    again as a transient failure is (`transient`); its message names the URL."""


def bounded_options(given: dict[str, Any]) -> dict[str, Any]:
    """fsspec's HTTP options from the storage options: aiohttp timeouts (`HTTP_TIMEOUTS`, with
    the keys of a `client_kwargs.timeout` object over them: `{"sock_read": 300}`, any of
    `aiohttp.ClientTimeout`'s), and packtool's own `retries` taken out (fsspec would pass it to
    every request). A `client_kwargs` or `timeout` that is not a JSON object is a one-line
    `ConfigError` (until 2026-12-06 a TypeError traceback, and a timeout could only be an
    aiohttp object, which JSON cannot give)."""
    max_attempts(given)  # a bad value is refused before any request
    given = {k: v for k, v in given.items() if k != "retries"}
    headers = given.get("headers") or {}
    if not isinstance(headers, dict):
        raise ConfigError(
            f'{STORAGE_OPTIONS}: http \'headers\' must be a JSON object ({{"Name": "value"}}), '
            f"got {json.dumps(headers)[:60]}"
        )
    if not any(k.lower() == "accept-encoding" for k in headers):
        given["headers"] = {**headers, "Accept-Encoding": "identity"}  # the file's own bytes
    client = given.get("client_kwargs")
    if client is None:
        client = {}
    if not isinstance(client, dict):
        raise ConfigError(
            f"{STORAGE_OPTIONS}: http 'client_kwargs' must be a JSON object ({{...}}: aiohttp's "
            f"ClientSession arguments), got {json.dumps(client)[:60]}"
        )
    try:
        import aiohttp
    except ImportError:  # the http extra is missing: fsspec says so
        return given
    timeout = client.get("timeout", {})
    # A server may encode its answer whatever is asked (an object stored with Content-Encoding:
    # gzip): aiohttp then decompressed each ranged body on its own, which is no range of the
    # file (taken for a server that ignores ranges), or failed ("Can not decode
    # content-encoding"). Its bytes are the file's as stored, which the size describes.
    client = {"auto_decompress": False, **client}
    if isinstance(timeout, aiohttp.ClientTimeout):  # from Python
        return {**given, "client_kwargs": client}
    if not isinstance(timeout, dict) or not all(
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0)
        for v in timeout.values()
    ):
        raise ConfigError(
            f"{STORAGE_OPTIONS}: http 'client_kwargs.timeout' must be a JSON object of seconds "
            '(e.g. {"sock_read": 300, "total": null}: aiohttp\'s ClientTimeout), got '
            f"{json.dumps(timeout)[:60]}"
        )
    try:
        bound = aiohttp.ClientTimeout(**{"total": None, **HTTP_TIMEOUTS, **timeout})
    except TypeError:
        fields = ", ".join(inspect.signature(aiohttp.ClientTimeout).parameters)
        raise ConfigError(
            f"{STORAGE_OPTIONS}: http 'client_kwargs.timeout' takes {fields}; got "
            f"{json.dumps(timeout)[:60]}"
        ) from None
    return {**given, "client_kwargs": {**client, "timeout": bound}}


ENCODED_SUFFIXES = {"gzip": (".gz",), "x-gzip": (".gz",), "zstd": (".zst",)}
"""The names that say a file holds what a `Content-Encoding` encodes (read decompressed)."""


def check_encoding(url: str, encoding: str) -> None:
    """Refuse a file the server sends encoded (`Content-Encoding`, asked for `identity`: an
    object stored with that metadata) whose name does not say it is compressed: its bytes are
    not the text its name says (packtool reads a file's bytes as stored: `bounded_options`),
    where a `.gz` file labelled gzip is read as a `.gz` file is."""
    from urllib.parse import urlsplit

    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return
    named = ENCODED_SUFFIXES.get(encoding)
    if named and urlsplit(url).path.lower().endswith(named):
        return
    raise DataError(
        f"{url}: the server sends it {encoding}-encoded (Content-Encoding: {encoding}) even when "
        "asked for its plain bytes, so its ranges are not ranges of its text; serve it "
        "without that encoding (an object stored with Content-Encoding metadata: remove it), "
        "or download it decompressed (curl --compressed) and read the local copy"
    )


def max_attempts(options: dict[str, Any]) -> int:
    """The tries of a web request the storage options ask for (`retries.max_attempts`), else
    `ATTEMPTS`."""
    retries = options.get("retries")
    if retries is None:
        return ATTEMPTS
    value = retries.get("max_attempts") if isinstance(retries, dict) else None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(
            f"{STORAGE_OPTIONS}: http 'retries' must be {{\"max_attempts\": N}} with N >= 1, got "
            f"{retries!r}"[:200]
        )
    return value


def transient(exc: BaseException) -> bool:
    """Whether a web request that failed with `exc` may answer if made again: a 5xx, 408 or 429
    answer, a connection dropped, reset or timed out, a body cut short. fsspec's HTTP `info`
    raises `FileNotFoundError` for any failed answer, the answer's error as its cause."""
    if isinstance(exc, ShortAnswer):
        return True
    if isinstance(exc, FileNotFoundError):
        cause = exc.__cause__
        return cause is not None and transient(cause)
    if type(exc).__module__.startswith("aiohttp"):
        if type(exc).__name__ in _DROPPED:
            return True
        status = getattr(exc, "status", None)  # ClientResponseError: the server's answer
        return isinstance(status, int) and (status >= 500 or status in RETRIED_STATUS)
    return isinstance(exc, (TimeoutError, ConnectionResetError, ConnectionAbortedError))


def retried(call: Callable[[], T], attempts: int, sleep: Callable[[float], Any] = time.sleep) -> T:
    """`call()`, made again after a `transient` failure, `attempts` tries in all, waiting
    `BACKOFF` x 2^n seconds (jittered down to half of that; at most `BACKOFF_MAX`) between them,
    none begun past `RETRY_SECONDS`; the last failure is raised as it came."""
    began = time.monotonic()
    attempt = 1
    while True:
        try:
            return call()
        except Exception as exc:
            if attempt >= attempts or not transient(exc):
                raise
            delay = min(BACKOFF_MAX, BACKOFF * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
            if time.monotonic() - began + delay > RETRY_SECONDS:
                raise
        sleep(delay)
        attempt += 1
