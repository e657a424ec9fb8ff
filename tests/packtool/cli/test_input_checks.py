"""Input options the inputs cannot use (packtool/cli/input_checks.py): a field option named
explicitly that no record has, or that the inputs are not read by, is a one-line error naming
it; an option these inputs merely do not use is a one-line warning (docs/sft.md, "Options the
inputs cannot use")."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli import one_error_line, run

COMMANDS = ("pack", "stats", "tokenize")
TEMPLATE = "{% for m in messages %}{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"


def jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), "utf-8")
    return path


def command(name: str, tmp_path: Path, *args: object) -> tuple[int, str, str]:
    """`packtool NAME ARGS`, with an output for the commands that write one."""
    if name == "stats":
        return run("stats", *args, "--max-len", 64, "--candidates", 64)
    out = tmp_path / ("out.parquet" if name == "tokenize" else "out")
    return run(name, *args, "-o", out, "--overwrite")


@pytest.fixture
def qa(tmp_path: Path) -> Path:
    """Prompt/completion records under other names, and a text field too."""
    rows = [{"question": f"q{i}?", "answer": f"a{i}", "text": f"q{i}? a{i}"} for i in range(20)]
    return jsonl(tmp_path / "qa.jsonl", rows)


@pytest.fixture
def tokenized(tmp_path: Path, qa: Path) -> Path:
    out = tmp_path / "tok.parquet"
    code, _, err = run("tokenize", qa, "-o", out, "--prompt-field", "question", "--completion-field", "answer")  # fmt: skip
    assert code == 0, err
    return out


@pytest.fixture
def pretokenized(tmp_path: Path) -> Path:
    out = tmp_path / "pre.parquet"
    table = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [-100, 5]]})
    pq.write_table(table, out)
    return out


@pytest.mark.parametrize("name", COMMANDS)
def test_a_misspelt_prompt_field_is_an_error_naming_it(name, tmp_path, qa):
    # It packed the `text` field as plain text, exit 0, no loss mask.
    code, out, err = command(
        name, tmp_path, qa, "--prompt-field", "questoin", "--completion-field", "answer"
    )
    assert code == 1 and out == ""
    assert one_error_line(err) == (
        "error: --prompt-field questoin: no field 'questoin' in the inputs' first records "
        "(fields found: answer, question, text)"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.parquet").exists()


def test_without_a_text_field_the_error_names_the_prompt_option_not_text_field(tmp_path):
    # It said "no line has the text field 'text' ... pass --text-field NAME", and following
    # that packed only the questions.
    qa2 = jsonl(tmp_path / "qa2.jsonl", [{"question": "q?", "answer": "a"}] * 5)
    code, _, err = command(
        "pack", tmp_path, qa2, "--prompt-field", "questoin", "--completion-field", "answer"
    )
    line = one_error_line(err)
    assert code == 1 and line.startswith("error: --prompt-field questoin: no field 'questoin'")
    assert "--text-field" not in line
    code, _, err = command(
        "pack", tmp_path, qa2, "--prompt-field", "questoin", "--completion-field", "answer",
        "--text-field", "question",
    )  # fmt: skip
    assert code == 1 and "--prompt-field questoin" in one_error_line(err)


def test_the_default_partner_of_a_given_field_is_named(tmp_path, qa):
    code, _, err = command("stats", tmp_path, qa, "--completion-field", "answer")
    assert code == 1
    assert one_error_line(err) == (
        "error: --completion-field answer: no field 'prompt' in the inputs' first records to go "
        "with it (fields found: answer, question, text); name the prompt with --prompt-field"
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_a_misspelt_messages_field_is_an_error_before_the_template_one(name, tmp_path):
    # It said "the inputs hold no chat records ... drop --chat-template"; dropping it packed text.
    dialog = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    conv = jsonl(tmp_path / "conv.jsonl", [{"dialog": dialog, "text": "hi yo"}] * 5)
    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATE, "utf-8")
    for extra in (["--chat-template", template], []):
        code, _, err = command(name, tmp_path, conv, "--messages-field", "dialgo", *extra)
        assert code == 1
        assert one_error_line(err) == (
            "error: --messages-field dialgo: no field 'dialgo' in the inputs' first records "
            "(fields found: dialog, text)"
        )
    code, _, err = command(name, tmp_path, conv, "--messages-field", "dialog", "--chat-template", template)  # fmt: skip
    assert code == 0 and "warning" not in err, err


def test_fields_present_but_read_as_another_kind_say_so(tmp_path):
    both = jsonl(
        tmp_path / "both.jsonl",
        [{"messages": [{"role": "user", "content": "x"}], "q": "x?", "a": "y"}] * 3,
    )
    args = ("--prompt-field", "q", "--completion-field", "a")
    code, _, err = command("stats", tmp_path, both, *args)
    assert code == 1
    assert one_error_line(err) == (
        "error: --prompt-field q: the inputs are read as messages records (by their first "
        "records), not prompt/completion records; drop --prompt-field"
    )


def test_a_forced_format_with_a_misspelt_field_is_an_error(tmp_path, qa):
    code, _, err = command(
        "pack", tmp_path, qa, "--format", "prompt-completion", "--prompt-field", "questoin",
        "--completion-field", "answer",
    )  # fmt: skip
    assert code == 1 and "--prompt-field questoin: no field 'questoin'" in one_error_line(err)
    code, _, err = command("pack", tmp_path, qa, "--format", "messages", "--messages-field", "chat")
    assert code == 1 and "--messages-field chat: no field 'chat'" in one_error_line(err)


def test_plain_text_files_have_no_fields(tmp_path):
    text = tmp_path / "doc.txt"
    text.write_text("hello world", "utf-8")
    code, _, err = command("tokenize", tmp_path, text, "--prompt-field", "q")
    assert code == 1
    assert one_error_line(err) == (
        "error: --prompt-field q: no field 'q' in the inputs' first records (fields found: none)"
    )


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize("option", ["--prompt-field", "--completion-field", "--messages-field"])
def test_record_field_options_on_tokenized_inputs_are_errors(
    name, option, tmp_path, tokenized, pretokenized
):
    for path in (tokenized, pretokenized):
        code, _, err = command(name, tmp_path, path, option, "question")
        assert code == 1
        assert one_error_line(err) == (
            f"error: {option} question: the inputs hold tokenized documents (their ids and loss "
            f"mask, if any, were made when they were tokenized); drop {option} (or tokenize the "
            "records again with it)"
        )


@pytest.mark.parametrize("name", COMMANDS)
def test_options_tokenized_inputs_do_not_use_are_warnings(name, tmp_path, tokenized):
    code, plain, err = command(name, tmp_path, tokenized)
    assert code == 0 and "warning" not in err, err
    before = pq.read_table(tmp_path / "out.parquet") if name == "tokenize" else None
    # --strict is used: a row of no id is an `empty` skip (read/tokenized.py), an error with it
    options = ["--text-field", "body", "--text-column", "body", "--render-processes", "2"]
    code, out, err = command(name, tmp_path, tokenized, *options, "--strict")
    assert code == 0, err
    warned = [line for line in err.splitlines() if line.startswith("warning: ")]
    assert warned == [
        "warning: --text-field body, --text-column body ignored: the inputs are tokenized "
        "Parquet, read as their stored ids (and loss mask)",
        "warning: --render-processes 2 ignored: the inputs hold no chat records, so nothing is "
        "rendered",
    ]
    if name == "tokenize":
        assert pq.read_table(tmp_path / "out.parquet").equals(before)
    elif name == "stats":
        assert out == plain


def test_render_processes_without_chat_records_is_a_warning(tmp_path, qa, pretokenized):
    for path, extra in ((qa, ["--prompt-field", "question", "--completion-field", "answer"]), (qa, []), (pretokenized, [])):  # fmt: skip
        code, _, err = command("stats", tmp_path, path, *extra, "--render-processes", "0")
        assert code == 0, err
        assert err.splitlines() == [
            "warning: --render-processes 0 ignored: the inputs hold no chat records, so nothing "
            "is rendered"
        ]


@pytest.mark.parametrize("name", COMMANDS)
def test_fields_that_are_read_pass_without_a_word(name, tmp_path, qa):
    code, out, err = command(
        name, tmp_path, qa, "--prompt-field", "question", "--completion-field", "answer"
    )
    assert code == 0 and err == "", err


@pytest.mark.parametrize("name", COMMANDS)
def test_text_options_for_formats_not_among_the_inputs_are_warnings(name, tmp_path):
    # `--text-field body` on Parquet inputs, and `--text-column body` on JSONL ones, were
    # ignored without a word: the run read `text` while the user meant `body`.
    docs = [f"document {i} " * 3 for i in range(20)]
    table = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": docs}), table)
    lines = jsonl(tmp_path / "t.jsonl", [{"text": d} for d in docs])
    for path, option, why in (
        (table, "--text-field", "no input is JSONL"),
        (lines, "--text-column", "no input is Parquet"),
    ):
        code, _, err = command(name, tmp_path, path, option, "body")
        assert code == 0, err
        assert err.splitlines() == [f"warning: {option} body ignored: {why}"]
    # Both formats among the inputs: each option is read by its files, no warning.
    code, _, err = command(name, tmp_path, table, lines, "--text-column", "text", "--text-field", "text")  # fmt: skip
    assert code == 0 and err == "", err


def test_text_field_on_fine_tuning_records_is_a_warning(tmp_path, qa):
    code, _, err = command(
        "pack", tmp_path, qa, "--prompt-field", "question", "--completion-field", "answer",
        "--text-field", "text",
    )  # fmt: skip
    assert code == 0, err
    assert err.splitlines() == [
        "warning: --text-field text ignored: the inputs are read as prompt-completion records"
    ]
