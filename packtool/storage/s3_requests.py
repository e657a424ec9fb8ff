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

import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ET
from typing import Any

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
ATTEMPTS = 8
"""A request's attempts (botocore's `max_attempts`) unless the options say otherwise."""


def endpoint(options: dict[str, Any]) -> str | None:
    """The endpoint named for S3: the options' (`endpoint_url`, also in `client_kwargs`), else
    the variables' (`AWS_ENDPOINT_URL_S3`, then `AWS_ENDPOINT_URL`); None: AWS itself."""
    client = options.get("client_kwargs") or {}
    return (options.get("endpoint_url") or client.get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"))  # fmt: skip


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
