"""The retries of a web request (`packtool.storage.web`): which failures are asked again, how
often, and how long it waits between tries."""

from __future__ import annotations

import json

import aiohttp
import pytest

from packtool.errors import ConfigError
from packtool.storage import web
from tests.cli import one_error_line, run
from tests.packtool.storage.common import RangeHandler, web_server


def _answer(status: int) -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(None, (), status=status, message="m")  # type: ignore[arg-type]


def _failing(*errors: BaseException):
    """A request that fails with `errors` in turn, then answers "ok"; its calls counted."""
    calls = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return "ok"

    return call, calls


def test_transient_failures_are_asked_again_with_growing_waits():
    waits: list[float] = []
    cut = aiohttp.ClientPayloadError("Response payload is not completed")
    dropped = aiohttp.ServerDisconnectedError()
    info_503 = FileNotFoundError("u")  # fsspec's HTTP `info`: the answer as its cause
    info_503.__cause__ = _answer(503)
    call, calls = _failing(_answer(503), dropped, cut, info_503)
    assert web.retried(call, 5, waits.append) == "ok"
    assert len(calls) == 5
    for n, wait in enumerate(waits):  # 0.5, 1, 2, 4 s, each jittered down to half at most
        assert web.BACKOFF * 2**n / 2 <= wait <= web.BACKOFF * 2**n
    for limit in (1, 3):  # the last failure is raised as it came, after `attempts` tries
        call, calls = _failing(*[_answer(502)] * 5)
        with pytest.raises(aiohttp.ClientResponseError):
            web.retried(call, limit, lambda s: None)
        assert len(calls) == limit


@pytest.mark.parametrize(
    "error", [_answer(404), _answer(403), ConnectionRefusedError(), ValueError("bad")]
)
def test_other_failures_are_raised_at_once(error):
    call, calls = _failing(error)
    with pytest.raises(type(error)):
        web.retried(call, 5, lambda s: pytest.fail("waited"))
    assert len(calls) == 1


def test_no_retry_starts_past_the_time_bound(monkeypatch):
    monkeypatch.setattr(web, "RETRY_SECONDS", 0.0)
    call, calls = _failing(_answer(503))
    with pytest.raises(aiohttp.ClientResponseError):
        web.retried(call, 5, lambda s: pytest.fail("waited"))
    assert len(calls) == 1


def test_the_attempts_are_a_storage_option(tmp_path):
    assert web.max_attempts({}) == web.ATTEMPTS
    assert web.max_attempts({"retries": {"max_attempts": 2}}) == 2
    assert "retries" not in web.bounded_options({"retries": {"max_attempts": 2}})
    for bad in (0, "3", True, None):
        with pytest.raises(ConfigError, match="max_attempts"):
            web.max_attempts({"retries": {"max_attempts": bad}})
    seen: list[str] = []

    class Unavailable(RangeHandler):
        def send_head(self):
            seen.append(self.command)
            self.send_error(503)

    (tmp_path / "c.jsonl").write_text('{"text": "a b"}\n')
    options = json.dumps({"http": {"retries": {"max_attempts": 1}}})
    with web_server(tmp_path, Unavailable) as base:
        code, _, err = run("stats", f"{base}/c.jsonl", "--storage-options", options)
        assert code == 1 and "503" in one_error_line(err), err
        assert seen == ["HEAD", "GET"]  # fsspec's `info` asks both; neither again
        code, _, err = run(
            "stats", f"{base}/c.jsonl", "--storage-options", '{"http": {"retries": 0}}'
        )
        assert code == 1 and "max_attempts" in one_error_line(err), err


def test_bad_http_options_are_one_line_naming_the_option_not_a_404(tmp_path):
    """`{"client_kwargs": 5}` was a TypeError traceback; an option the client refuses at the
    request (`{"headers": "x"}`, an unknown keyword) read "not found (the server answered
    404)", the request's error taken for a missing file; `client_kwargs.timeout` could only be
    an aiohttp object, which JSON cannot give."""
    (tmp_path / "c.jsonl").write_text('{"text": "a b"}\n{"text": "c"}\n')
    with web_server(tmp_path, RangeHandler) as base:
        url = f"{base}/c.jsonl"
        for options in (
            {"client_kwargs": 5},
            {"http": {"client_kwargs": [1]}},
            {"client_kwargs": {"timeout": 5}},
            {"client_kwargs": {"timeout": {"sock_reed": 5}}},
            {"client_kwargs": {"timeout": {"sock_read": "x"}}},
        ):
            code, _, err = run("stats", url, "--storage-options", json.dumps(options))
            line = one_error_line(err)
            assert code == 1 and line.startswith(
                f"error: {url}: --storage-options / PACKTOOL_STORAGE_OPTIONS: "
            ), line
            assert "client_kwargs" in line and "credentials" not in line, line
        for options in ({"headers": "x"}, {"http": {"bogus_kw": 1}}):
            code, _, err = run("stats", url, "--storage-options", json.dumps(options))
            line = one_error_line(err)
            assert code == 1 and line.startswith(f"error: {url}: "), line
            said = line.removeprefix(f"error: {url}: ")  # the port may hold "404" (40483)
            assert "404" not in said and "not found" not in said, line
            assert "--storage-options" in line, line
        timeout = {"client_kwargs": {"timeout": {"sock_read": 5, "total": 30}}}
        code, out, err = run("stats", url, "--json", "--storage-options", json.dumps(timeout))
        assert code == 0 and json.loads(out)["documents"] == 2, err
    client = web.bounded_options(timeout)["client_kwargs"]["timeout"]
    assert isinstance(client, aiohttp.ClientTimeout)
    assert (client.sock_read, client.total, client.sock_connect) == (5, 30, 10)  # ours kept
