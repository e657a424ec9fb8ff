"""The S3 requests obstore does not make, for `s3_native.NativeS3`: listing and aborting
unfinished multipart uploads, and a DELETE conditional on the object's ETag (the lock's
release of its own version).

Each is one HTTP request signed with botocore's SigV4 signer (`botocore.auth.S3SigV4Auth`, the
code s3fs's client signs with; importing it takes ~0.04 s, where building a botocore client
loads the whole S3 service model: s3fs, aiobotocore and the client cost ~0.4 s of a process's
one core), sent with the standard library, and retried like obstore's requests: on 5xx,
throttling, timeouts and dropped connections, with exponential backoff and jitter. The
credentials are the ones `s3_native.usable` let through: the options' keys, the `AWS_*` keys, or
none (`anon`: unsigned); the endpoint is the one named (else AWS's regional one).
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

from packtool.errors import STORAGE_OPTIONS, ConfigError

_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"
CONFIG_ONLY_S3FS = frozenset({"ca_bundle", "s3", "endpoint_url", "services",
                              "use_fips_endpoint", "use_dualstack_endpoint"})  # fmt: skip
"""Settings of `~/.aws/config`'s default profile that botocore applies and obstore does not
read: where one is set, s3:// stays on s3fs (`s3_native.usable`)."""


def default_profile() -> dict[str, str]:
    """`~/.aws/config`'s default profile (botocore reads it with no variable set), or {}."""
    import configparser

    path = os.path.expanduser("~/.aws/config")
    if not os.path.isfile(path):
        return {}
    parser = configparser.RawConfigParser()
    try:
        parser.read(path)
    except configparser.Error:
        return {"unreadable": "yes"}  # botocore would refuse it too: s3fs says so
    return dict(parser["default"]) if parser.has_section("default") else {}


CONNECT_TIMEOUT_S = 10
READ_TIMEOUT_S = 60
"""obstore's (and these requests') timeout of a whole request unless the options say otherwise
(obstore also gives up on a request after 3 minutes of retries)."""
ATTEMPTS = 8
"""A request's attempts (botocore's `max_attempts`) unless the options say otherwise."""
S3FS_READ_TIMEOUT_S = 20
"""s3fs's wait between bytes unless the options say otherwise (s3fs's own default is 15 s;
botocore's read timeout is a wait between bytes, where obstore's is the whole request)."""
S3FS_TRIES = 2
"""s3fs's own tries of each request (its default 5), around botocore's attempts: the second is
for what botocore does not retry (a body cut short, an answer that does not parse)."""


_STRINGS = ("key", "secret", "token", "endpoint_url", "username", "password", "profile",
            "client_kwargs.region_name", "client_kwargs.endpoint_url")  # fmt: skip
_SECONDS = ("config_kwargs.connect_timeout", "config_kwargs.read_timeout")
_ATTEMPTS = ("config_kwargs.retries.max_attempts", "config_kwargs.retries.total_max_attempts")
_RETRIES = {"max_attempts", "total_max_attempts", "mode"}
_MODES = ("legacy", "standard", "adaptive")


def _refuse(name: str, what: str, value: Any = None) -> ConfigError:
    got = "" if value is None else f", got {json.dumps(value, default=repr)[:60]}"
    return ConfigError(f"{STORAGE_OPTIONS}: s3 {name!r} {what}{got}")


def check_options(options: dict[str, Any]) -> None:
    """A one-line `ConfigError` naming the S3 option (s3fs's keyword arguments, which obstore
    takes too: `s3_native`) whose value is not the shape the clients read, before any client
    is made: an object where one is read (`client_kwargs`, `config_kwargs`, its `retries`),
    strings, seconds, attempts, `anon`, `retries.mode`, and a `config_kwargs` key given at the
    top. Until 2026-12-07 each was a TypeError traceback (`{"config_kwargs": 5}`) or the
    client's one line naming no option (`'int' object has no attribute 'get'`)."""
    for name in ("retries", "connect_timeout", "read_timeout"):
        if name in options:
            raise _refuse(name, f'goes in config_kwargs ({{"config_kwargs": {{"{name}": ...}}}})')
    for name, what in (("client_kwargs", "botocore's client arguments: region_name, ..."),
                       ("config_kwargs", "botocore's Config: connect_timeout, retries, ...")):  # fmt: skip
        if not isinstance(options.get(name) or {}, dict):
            raise _refuse(name, f"must be a JSON object ({{...}}: {what})", options[name])
    config = options.get("config_kwargs") or {}
    retries = config.get("retries") or {}
    if not isinstance(retries, dict):
        raise _refuse(
            "config_kwargs.retries", 'must be a JSON object ({"max_attempts": N})', retries
        )
    for extra in sorted(set(retries) - _RETRIES):
        raise _refuse(
            f"config_kwargs.retries.{extra}", f"is no s3 option (retries takes {sorted(_RETRIES)})"
        )
    found = {"client_kwargs": options.get("client_kwargs") or {}, "config_kwargs": config,
             "config_kwargs.retries": retries, "": options}  # fmt: skip
    for name in _STRINGS + _SECONDS + _ATTEMPTS + ("anon", "config_kwargs.retries.mode"):
        where, _, key = name.rpartition(".")
        value = found[where].get(key)
        if value is None:
            continue
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if name in _STRINGS and not isinstance(value, str):
            raise _refuse(name, "must be a string", value)
        if name in _SECONDS and not (number and value > 0):
            raise _refuse(name, "must be seconds (a number above 0)", value)
        if name in _ATTEMPTS and not (number and float(value).is_integer() and value >= 1):
            raise _refuse(name, "must be a whole number of at least 1", value)
        if name == "anon" and not isinstance(value, bool):
            raise _refuse(name, "must be true or false", value)
        if name.endswith("mode") and value not in _MODES:
            raise _refuse(name, f"must be one of {', '.join(_MODES)}", value)


def check_s3fs_names(options: dict[str, Any]) -> None:
    """A one-line `ConfigError` naming an option s3fs would pass on to a call that refuses it
    at the first request (`AioSession`, botocore's `Config` or `create_client`: a TypeError
    naming no option): an argument of none of them. Imports s3fs and botocore (s3fs's path)."""
    import inspect

    try:
        import s3fs
        from aiobotocore.config import AioConfig
        from aiobotocore.session import AioSession
        from botocore.config import Config
        from botocore.session import Session
    except ImportError:  # the caller says s3fs is missing
        return

    def params(f: Any) -> set[str]:
        return set(inspect.signature(f).parameters) - {"self", "args", "kwargs"}

    known = {
        "": params(s3fs.S3FileSystem.__init__) | params(AioSession.__init__)
        | {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"},
        "client_kwargs.": params(Session.create_client) - {"service_name", "config"},
        "config_kwargs.": set(Config.OPTION_DEFAULTS) | params(AioConfig.__init__),
    }  # fmt: skip
    for prefix, names in known.items():
        given = options.get(prefix[:-1]) or {} if prefix else options
        for extra in sorted(set(given) - names):
            where = {"": "s3fs's S3FileSystem", "client_kwargs.": "botocore's create_client",
                     "config_kwargs.": "botocore's Config"}[prefix]  # fmt: skip
            raise _refuse(prefix + extra, f"is no s3 option (not an argument of {where})")


def s3fs_options(options: dict[str, Any]) -> dict[str, Any]:
    """s3fs's options with its timeouts bounded: `S3FS_READ_TIMEOUT_S` and `CONNECT_TIMEOUT_S`
    unless set, and the options' attempts (`max_attempts`, attempts in all as obstore takes it,
    or `total_max_attempts`; else `ATTEMPTS`) shared out over s3fs's `S3FS_TRIES` (set on the
    client: `bounded_s3fs`): botocore's `total_max_attempts`, which counts the first attempt in
    every retry mode (its `max_attempts` does not in the `legacy` mode). s3fs's 5 tries of
    botocore's 8 attempts of 60 s had an endpoint that accepts connections and never answers
    hang a run over 10 minutes; now 8 attempts of 20 s."""
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("connect_timeout", CONNECT_TIMEOUT_S)
    config.setdefault("read_timeout", S3FS_READ_TIMEOUT_S)
    retries = dict(config.get("retries") or {})
    attempts = int(retries.pop("total_max_attempts", retries.pop("max_attempts", ATTEMPTS)))
    retries["total_max_attempts"] = max(1, -(-attempts // S3FS_TRIES))
    config["retries"] = retries
    return {**options, "config_kwargs": config}


def bounded_s3fs(options: dict[str, Any]) -> Any:
    """An s3fs client (no instance cache) with `s3fs_options` and `S3FS_TRIES`."""
    import fsspec

    check_s3fs_names(options)
    options = {k: v for k, v in options.items() if k != "skip_instance_cache"}
    fs = fsspec.filesystem("s3", skip_instance_cache=True, **s3fs_options(options))
    fs.retries = S3FS_TRIES
    return fs


def endpoint(options: dict[str, Any]) -> str | None:
    """The endpoint named for S3: the options' (`endpoint_url`, also in `client_kwargs`), else
    the variables' (`AWS_ENDPOINT_URL_S3`, then `AWS_ENDPOINT_URL`); None: AWS itself.

    Raises:
        ConfigError: The one named is no http(s) URL of a host (obstore panicked in Rust on
            one, a 50-line backtrace; botocore says "Invalid endpoint").
    """
    client = options.get("client_kwargs") or {}
    named = ((f"{STORAGE_OPTIONS} endpoint_url", options.get("endpoint_url")),
             (f"{STORAGE_OPTIONS} client_kwargs.endpoint_url", client.get("endpoint_url")),
             ("AWS_ENDPOINT_URL_S3", os.environ.get("AWS_ENDPOINT_URL_S3")),
             ("AWS_ENDPOINT_URL", os.environ.get("AWS_ENDPOINT_URL")))  # fmt: skip
    name, url = next(((n, u) for n, u in named if u), ("", None))
    if url is None:
        return None
    parts = urllib.parse.urlsplit(str(url))
    try:
        parts.port  # noqa: B018 (a port that is no number or out of range raises)
    except ValueError:
        parts = parts._replace(netloc="")
    if (
        parts.scheme not in ("http", "https")
        or not parts.hostname
        or any(c.isspace() for c in str(url))
    ):
        raise ConfigError(
            f"{name} {url!r} is not an endpoint URL; give http(s)://HOST[:PORT] "
            "(e.g. http://minio:9000)"
        )
    return url


def region(options: dict[str, Any]) -> str | None:
    """The region botocore would sign for: the options', the variables', the default
    profile's."""
    client = options.get("client_kwargs") or {}
    return (client.get("region_name") or os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION") or default_profile().get("region"))  # fmt: skip


_RETRIED = {429, 500, 502, 503, 504}


class S3Requests:
    """Signed requests to one endpoint as one caller (s3fs's options: `key`, `secret`,
    `token`, `anon`, `endpoint_url`, `client_kwargs`, `config_kwargs`)."""

    def __init__(self, options: dict[str, Any]) -> None:
        config = options.get("config_kwargs") or {}
        self.region = region(options) or "us-east-1"
        url = endpoint(options) or f"https://s3.{self.region}.amazonaws.com"
        self.endpoint = url.rstrip("/")
        self.anon = bool(options.get("anon"))
        if options.get("key"):
            keys = (options["key"], options.get("secret", ""), options.get("token"))
        else:
            keys = (os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY"),
                    os.environ.get("AWS_SESSION_TOKEN"))  # fmt: skip
        self.keys = keys
        self.attempts = int((config.get("retries") or {}).get("max_attempts", ATTEMPTS))
        self.timeout = float(config.get("read_timeout", READ_TIMEOUT_S))

    def usable(self) -> bool:
        """Whether these requests can be signed here (else the caller asks s3fs)."""
        return self.anon or bool(self.keys[0] and self.keys[1])

    def list_multipart_uploads(self, bucket: str, prefix: str) -> list[tuple[str, str]]:
        """(key, upload id) of every unfinished multipart upload under `prefix`, all pages."""
        out: list[tuple[str, str]] = []
        query = {"uploads": "", "prefix": prefix}
        while True:
            root = ET.fromstring(self.send("GET", bucket, "", query))
            for u in root.iter(f"{_NS}Upload"):
                out.append((u.findtext(f"{_NS}Key") or "", u.findtext(f"{_NS}UploadId") or ""))
            if (root.findtext(f"{_NS}IsTruncated") or "").lower() != "true":
                return out
            query["key-marker"] = root.findtext(f"{_NS}NextKeyMarker") or ""
            query["upload-id-marker"] = root.findtext(f"{_NS}NextUploadIdMarker") or ""

    def abort_multipart_upload(self, bucket: str, key: str, upload: str) -> None:
        self.send("DELETE", bucket, key, {"uploadId": upload})

    def delete_if_match(self, bucket: str, key: str, etag: str) -> None:
        """Delete `key` only if it is still the version `etag` (an `OSError` naming the status,
        412, when it is not)."""
        self.send("DELETE", bucket, key, headers={"If-Match": etag})

    def send(
        self,
        method: str,
        bucket: str,
        key: str,
        query: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
    ) -> bytes:
        """One signed request (path-style: `ENDPOINT/BUCKET/KEY?QUERY`), retried; its body.
        Raises `OSError` naming the status or the failure once the attempts are spent."""
        path = f"/{bucket}/{urllib.parse.quote(key, safe='/~')}" if key else f"/{bucket}"
        url = self.endpoint + path
        if query:
            url += "?" + urllib.parse.urlencode(sorted(query.items()), quote_via=urllib.parse.quote)
        for attempt in range(max(1, self.attempts)):
            try:
                with urllib.request.urlopen(
                    self._signed(method, url, headers), timeout=self.timeout
                ) as r:
                    return r.read()
            except urllib.error.HTTPError as exc:
                if exc.code not in _RETRIED or attempt + 1 >= self.attempts:
                    raise OSError(f"{exc.code} {exc.reason}: {method} {bucket}/{key}") from None
            except (TimeoutError, urllib.error.URLError, ConnectionError) as exc:
                if attempt + 1 >= self.attempts:
                    raise OSError(f"{method} {bucket}/{key}: {exc}") from None
            time.sleep(min(20.0, 0.1 * 2**attempt) * random.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    def _signed(self, method: str, url: str, headers: dict[str, str] | None) -> Any:
        from botocore.auth import S3SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.credentials import Credentials

        request = AWSRequest(method=method, url=url, headers=dict(headers or {}), data=b"")
        if not self.anon:
            S3SigV4Auth(Credentials(*self.keys), "s3", self.region).add_auth(request)
        prepared = request.prepare()
        return urllib.request.Request(
            prepared.url, method=method, headers=dict(prepared.headers.items())
        )
