"""packtool/errors.py: the errors the CLI prints in one line."""

from __future__ import annotations

import ast
import errno
import json
import re
from pathlib import Path

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
        # A user's value is theirs: quoted for a shell where it needs it, and an all-capital
        # one is no blank (both were written bare: `--group-by my field`, `group_by=URL`).
        ("--group-by", "group_by", "my field", "--group-by 'my field' / group_by='my field'"),
        ("--group-by", "group_by", "URL", "--group-by URL / group_by='URL'"),
        (
            "--chat-template",
            "chat_template",
            "/D/C.J2",
            "--chat-template /D/C.J2 / chat_template='/D/C.J2'",
        ),
    ],
)
def test_a_choice_is_written_as_both_callers_make_it(flag, name, value, shown):
    # A message the library raises reaches Python callers too: it named only the CLI's flag.
    assert option_choice(flag, name, value) == shown


# --- Every message the library raises names the Python argument beside a CLI flag ---

PACKTOOL = Path(__file__).resolve().parents[2] / "packtool"
FLAG = re.compile(r"(?<![\w=-])--[a-z][a-z0-9-]*")
BOTH_FORMS = re.compile(r"([=\s][^\s/;,()]+)?\s+/\s")  # `--flag / arg=`, `--flag VALUE / arg=`
CHOICE_HELPERS = {"option_choice", "special_choice"}
SAID = {"print", "warn", "echo", "workers_lost"}  # a line said beside a raise (stderr, warnings)
CLI_ONLY = {
    # (module, flag): reached from the CLI alone, or another program's flag
    ("engines/slurm/state.py", "--output"): "sbatch's own option",
    ("engines/slurm/arrays.py", "--exclude"): "sbatch's own option, given in sbatch_args",
    ("engines/slurm/commands.py", "--test-only"): "sbatch's own option: the driver's dry run",
    ("engines/ray.py", "--head"): "`ray start --head`: Ray's own command",
    ("storage/web.py", "--compressed"): "`curl --compressed`",
}


def _text(node: ast.AST) -> str:
    """A message's text as written: a formatted value is `{}`, a choice the helpers write
    (both forms) is `<choice>`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _text(v.value) if isinstance(v, ast.FormattedValue) else _text(v) for v in node.values
        )
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _text(node.left) + _text(node.right)
    if isinstance(node, ast.Call) and _called(node) in CHOICE_HELPERS:
        return "<choice>"
    if isinstance(node, ast.IfExp):
        return _text(node.body) + " | " + _text(node.orelse)
    return "{}"


def _called(call: ast.Call) -> str:
    fn = call.func
    return fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")


def _messages(tree: ast.AST) -> list[tuple[int, str]]:
    calls = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            calls += [c for c in ast.walk(node.exc) if isinstance(c, ast.Call)]
        elif isinstance(node, ast.Call) and _called(node) in SAID:
            calls.append(node)
    return [
        (arg.lineno, _text(arg))
        for call in calls
        if _called(call) not in CHOICE_HELPERS
        for arg in call.args
        if isinstance(arg, ast.Constant | ast.JoinedStr | ast.BinOp | ast.IfExp)
        and not FLAG.fullmatch(_text(arg))  # a flag's name given to a helper that words it
    ]


def _flag_only(text: str) -> list[str]:
    return [m.group() for m in FLAG.finditer(text) if not BOTH_FORMS.match(text, m.end())]


def test_every_library_message_names_the_python_argument_beside_a_flag():
    # Before: the library's functions (run_pack, tokenize_corpus, tokenize_megatron,
    # compute_stats, inspect_dataset, ...) raised lines such as "--to megatron: ...; drop
    # --keep-field" or "pass --overwrite", flags a Python caller cannot pass. A flag in a
    # message outside packtool/cli/ is followed by its Python form (`errors.option_choice`).
    found = []
    for path in sorted(PACKTOOL.rglob("*.py")):
        module = path.relative_to(PACKTOOL).as_posix()
        if module.startswith("cli/"):
            continue
        for line, text in _messages(ast.parse(path.read_text(encoding="utf-8"))):
            for flag in _flag_only(text):
                if (module, flag) not in CLI_ONLY:
                    found.append(f"packtool/{module}:{line}: {flag}: {text[:100]}")
    assert found == [], "\n".join(found)
