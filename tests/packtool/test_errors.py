"""packtool/errors.py: the errors the CLI prints in one line."""

from __future__ import annotations

import errno
import json

import pytest

from packtool.errors import first_line, joined_lines, json_value, naming, one_line, option_choice
from packtool.storage import local as storage


@pytest.mark.parametrize("where", ["local", "s3"])
def test_naming_names_a_local_path_or_a_url(tmp_path, where):
    # A full scratch disk under `tokenize -o s3://...` raised ENOSPC inside naming(S3Path): its
    # os.fspath() raised TypeError (an S3Path is no os.PathLike), a 60-line traceback.
    path = tmp_path / "part.parquet" if where == "local" else storage.as_path("s3://b/p/x")
    with pytest.raises(OSError) as raised, naming(path):
        raise OSError(errno.ENOSPC, "No space left on device")
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename == str(path)


def test_one_line_folds_every_whitespace_run_and_cuts_where_asked():
    thrift = "Couldn't deserialize thrift:\n  TProtocolException:\tInvalid data\n"
    assert one_line(thrift) == "Couldn't deserialize thrift: TProtocolException: Invalid data"
    assert one_line(ValueError("a\r\nb")) == "a b"
    assert one_line("x" * 10, 10) == "x" * 10
    assert one_line("x" * 11, 10) == "xxxxxxx..."
    assert len(one_line("word " * 100, 40)) == 40
    assert one_line("") == ""


def test_first_line_keeps_a_client_error_s_first_line_or_its_type():
    body = "An error occurred (SlowDown)\n<?xml version='1.0'?><Error>...</Error>"
    assert first_line(RuntimeError(body)) == "An error occurred (SlowDown)"
    assert first_line(RuntimeError("  \n ")) == "RuntimeError"
    assert first_line(OSError("y" * 400)) == "y" * 300


def test_first_line_of_an_aiohttp_error_keeps_its_cause_on_the_second_line():
    # aiohttp puts the cause on a second line ("400, message:\n  Can not decode ..."): the
    # error read "ClientPayloadError: 400, message:", saying nothing.
    aiohttp = pytest.importorskip("aiohttp")
    from aiohttp.http_exceptions import ContentEncodingError

    cause = ContentEncodingError("Can not decode content-encoding: gzip")
    got = first_line(aiohttp.ClientPayloadError(str(cause)))
    assert got == "400, message: Can not decode content-encoding: gzip"
    assert first_line(aiohttp.ClientPayloadError("x\n" * 400)) == ("x " * 150)[:300]


def test_the_cli_names_a_path_with_two_spaces_in_a_row_as_it_is(tmp_path):
    """errors.one_line folds every whitespace run: used for the CLI's lines (89ebc02), a path
    `no  such   dataset` was printed as `no such dataset`, another path."""
    from tests.cli import one_error_line, run

    assert joined_lines("a  b\n  c\td  \n\n") == "a  b c\td"
    missing = tmp_path / "no  such   dataset"
    code, _, err = run("inspect", str(missing))
    assert code == 1 and f"{missing}:" in one_error_line(err), err


def test_json_value_makes_nesting_past_the_recursion_limit_a_value_error():
    # json.loads raises RecursionError for it, which the readers of damaged files did not catch
    # (tests/packtool/test_nested_json.py: each of them).
    for raw in ("[" * 100_000 + "]" * 100_000, b"{" + b'"a":{' * 5_000):
        with pytest.raises(ValueError, match="^nested too deeply$"):
            json_value(raw)
    assert json_value(b'{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}
    assert json_value("[" * 100 + "]" * 100) == json.loads("[" * 100 + "]" * 100)
    assert json_value('{"a": 1}', object_pairs_hook=list) == [("a", 1)]
    with pytest.raises(json.JSONDecodeError):
        json_value("[1,")


@pytest.mark.parametrize(
    ("flag", "name", "value", "shown"),
    [
        ("--tokenizer-engine", "engine", "auto", "--tokenizer-engine auto / engine='auto'"),
        ("--eos-id", "eos", 3, "--eos-id 3 / eos=3"),
        ("--eos-id", "eos", "default", "--eos-id default / eos='default'"),
        ("--tokenizer", "tokenizer", "PATH", "--tokenizer PATH / tokenizer=PATH"),  # a blank
        ("--overwrite", "overwrite", True, "--overwrite / overwrite=True"),  # a flag
    ],
)
def test_a_choice_is_written_as_both_callers_make_it(flag, name, value, shown):
    # A message the library raises reaches Python callers too: it named only the CLI's flag.
    assert option_choice(flag, name, value) == shown
