"""The outputs the docs show as real are what the commands print today (a docs audit found
stats.md's "real output" a tokenizer line behind the command)."""

from __future__ import annotations

import re
from pathlib import Path

from tests.cli import one_error_line, run

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"


def _block_after(doc: Path, marker: str) -> list[str]:
    """The lines of the first fenced block after the line holding `marker`."""
    text = doc.read_text(encoding="utf-8")
    at = text.index(marker)
    match = re.search(r"```\n(.*?)```", text[at:], re.S)
    assert match, f"{doc.name}: no block after {marker!r}"
    return match.group(1).splitlines()


def test_stats_md_shows_what_stats_prints(monkeypatch):
    monkeypatch.chdir(ROOT)  # the output names the corpus as given
    code, out, err = run("stats", "sample_data/corpus.jsonl", "--max-len", "4096")
    assert code == 0, err
    shown = _block_after(ROOT / "docs" / "stats.md", "real output")
    assert out.splitlines() == shown


def test_stats_md_shows_what_stats_prints_for_masked_data(monkeypatch):
    # The masked lines of stats.md came from data no command made; and the split bound stood
    # unqualified above the masked rows (1,657 vs 666 here).
    monkeypatch.chdir(ROOT)
    code, out, err = run(
        "stats", "sample_data/chat.jsonl", "--chat-template", "examples/chat_template.jinja",
        "--max-len", "512", "--candidates", "512",
    )  # fmt: skip
    assert code == 0, err
    shown = _block_after(ROOT / "docs" / "stats.md", "real output), at the max length")
    printed = out.splitlines()
    at = printed.index(shown[0])
    assert printed[at : at + len(shown)] == shown


def test_readme_shows_what_pack_prints(monkeypatch, tmp_path):
    monkeypatch.chdir(ROOT)
    out_dir = tmp_path / "packed"
    code, out, err = run("pack", "sample_data/corpus.jsonl", "-o", out_dir, "--max-len", "4096")
    assert code == 0, err
    shown = _block_after(ROOT / "README.md", "the sample corpus and prints")
    printed = out.replace(str(out_dir), "packed").splitlines()
    assert len(printed) == len(shown)
    for got, want in zip(printed, shown, strict=True):
        if want.startswith("time "):  # seconds, rates and cores differ from box to box
            assert re.match(r"time [0-9.]+s \(read\+tokenize ", got) and "; cores used: " in got
        else:
            assert got == want


def test_tokenize_md_quotes_the_misnamed_file_errors_tokenize_prints(monkeypatch, tmp_path):
    # tokenize.md quoted "...; the file holds gzip data: rename it to .gz" long after the
    # message had changed: each quoted line is checked against the command's own.
    import gzip

    monkeypatch.chdir(tmp_path)
    Path("data.zst").write_bytes(gzip.compress(CORPUS.read_bytes()[:2000]))
    Path("plain.jsonl.zst").write_bytes(CORPUS.read_bytes()[:2000])
    doc = (ROOT / "docs" / "tokenize.md").read_text(encoding="utf-8")
    for name in ("data.zst", "plain.jsonl.zst"):
        code, out, err = run("tokenize", name, "-o", "y.parquet", "--workers", "1")
        assert code != 0
        line = one_error_line(err)
        assert f"`{line}`" in doc, line


def test_tokenize_md_lists_the_metadata_tokenize_writes(tmp_path):
    # tokenize.md gave the tokenizer metadata without `engine`, and `special_tokens` as if every
    # file had it (a byte-tokenized one has not).
    import json

    import pyarrow.parquet as pq

    code, out, err = run("tokenize", CORPUS, "-o", tmp_path / "t.parquet", "--workers", "1")
    assert code == 0, err
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"packtool"])
    doc = (ROOT / "docs" / "tokenize.md").read_text(encoding="utf-8")
    listed = re.search(r'"tokenizer":\s*\{([\w,\s]+)\}', doc)
    assert listed, "tokenize.md: no tokenizer metadata"
    assert [k.strip() for k in listed.group(1).split(",")] == list(meta["tokenizer"])
    assert "special_tokens" not in meta  # byte: none to say; tokenize.md says so


def test_every_benchmark_block_is_in_benchmarks_md():
    """Each block a benchmark publishes (`publish("NAME", ...)`) has its markers in
    docs/benchmarks.md, and a figure of docs/remote.md's open comes from one: the cold open of
    many shards was quoted in remote.md only, measured by no script."""
    names = set()
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        names |= set(re.findall(r'publish\(\s*"([\w-]+)"', script.read_text(encoding="utf-8")))
    assert {"bucket-loader", "bucket-open", "remote"} <= names
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    missing = [n for n in sorted(names) if f"<!-- bench:{n}:start -->" not in page]
    assert not missing, f"docs/benchmarks.md has no block for {missing}"
    remote = (ROOT / "docs" / "remote.md").read_text(encoding="utf-8")
    assert "python -m benchmarks.bench_bucket_open" in remote


def _same_shape(shown, got, where: str = "") -> None:
    """`shown` (a doc's JSON, values rounded, lists cut short with "...") agrees with `got`:
    the same keys at every level, integers and unshortened strings equal, floats to the digits
    shown, and each listed element like the real one in its place."""
    if isinstance(shown, dict):
        assert isinstance(got, dict) and list(shown) == list(got), (where, list(shown), list(got))
        for key in shown:
            _same_shape(shown[key], got[key], f"{where}.{key}")
    elif isinstance(shown, list):
        items = [s for s in shown if s != "..."]
        assert isinstance(got, list) and len(got) >= len(items), where
        for i, item in enumerate(items):
            _same_shape(item, got[i], f"{where}[{i}]")
    elif isinstance(shown, float):
        digits = len(repr(shown).split(".")[1])
        assert round(got, digits) == shown, (where, shown, got)
    elif isinstance(shown, str) and "..." in shown:
        assert isinstance(got, str), where
    else:
        assert shown == got, (where, shown, got)


def test_stats_md_json_is_what_stats_json_prints(monkeypatch):
    # stats.md's JSON gave the tokenizer without the `engine` key every raw run prints.
    import json

    monkeypatch.chdir(ROOT)
    code, out, err = run("stats", "sample_data/corpus.jsonl", "--max-len", "4096", "--json")
    assert code == 0, err
    text = (ROOT / "docs" / "stats.md").read_text(encoding="utf-8")
    at = text.index("## JSON (`--json`)")
    shown = re.search(r"```json\n(.*?)```", text[at:], re.S)
    assert shown, "stats.md: no JSON block"
    _same_shape(json.loads(shown.group(1)), json.loads(out))


def test_verify_inspect_md_shows_what_verify_and_inspect_print(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # the outputs name the corpus and the folder as given
    (tmp_path / "sample_data").symlink_to(ROOT / "sample_data")
    code, out, err = run("pack", "sample_data/corpus.jsonl", "-o", "packed/", "--max-len", "4096")
    assert code == 0, err
    doc = ROOT / "docs" / "verify-inspect.md"
    shown = _block_after(doc, "## `packtool verify DIR")
    code, out, err = run("verify", "packed/")
    assert code == 0, err
    assert shown[-1].startswith("OK ")
    took = re.compile(r"[0-9.]+s$")  # the seconds differ from box to box
    assert took.sub("", out.strip()) == took.sub("", shown[-1])
    shown = _block_after(doc, "On the sample corpus packed as above")
    command = shown[0].removeprefix("$ packtool ").split()
    code, out, err = run(*command)
    assert code == 0, err
    printed = out.splitlines()
    cut = shown.index("  ...")  # the row's other documents are left out on the page
    assert printed[: cut - 1] == shown[1:cut]
    assert printed[-2:] == shown[cut + 1 :]


def _shown_default(shown: str) -> object:
    """A settings table's default as a value: a literal (`True`, 0, 10,000, `"packtool"`), a
    word in backticks (`ffd`), a size (96 MiB), `required` (no default); any other text is a
    rule applied at open (None in the dataclass)."""
    import ast
    import dataclasses

    shown = shown.strip()
    value = shown.strip("`").replace(",", "")
    if value == "required":
        return dataclasses.MISSING
    if value in ("True", "False", "None") or re.fullmatch(r"-?[0-9.]+|\"\w+\"", value):
        return ast.literal_eval(value)
    if shown.startswith("`") and re.fullmatch(r"\w+", value):
        return value
    if match := re.fullmatch(r"(\d+) (MiB|GiB)", value):
        return int(match.group(1)) * {"MiB": 2**20, "GiB": 2**30}[match.group(2)]
    return None  # "–", or "rows x most docs in a row + 1"


def _check_settings_table(page: str, heading: str, config: type) -> None:
    import dataclasses

    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    table = text.split(heading, 1)[1].split("\n| ", 1)[1].split("\n\n", 1)[0]
    rows = []
    for names, shown in re.findall(r"^\| (`\w+`(?:, `\w+`)*) \| ([^|]+) \|", table, re.M):
        values = shown.split(", ") if ", " in names else [shown]
        rows += zip(re.findall(r"`(\w+)`", names), values, strict=True)
    fields = {f.name: f.default for f in dataclasses.fields(config)}
    assert [name for name, _ in rows] == list(fields), page
    for name, shown in rows:
        want = _shown_default(shown)
        assert fields[name] == want, (page, name, shown, fields[name])


def test_the_settings_tables_give_every_setting_with_its_default():
    # loader.md's LoaderConfig options and online.md's OnlineConfig settings: every field, in
    # order, with the default the dataclass has.
    from loader.config import LoaderConfig, OnlineConfig

    _check_settings_table("loader.md", "## Options (`LoaderConfig`", LoaderConfig)
    _check_settings_table("online.md", "Settings (`OnlineConfig`", OnlineConfig)


def test_every_packtool_command_line_in_the_docs_parses():
    """Each `packtool ...` line of a bash block (README, docs/) is one the command line takes:
    its options exist and their values parse; and a `--to megatron` output is a file prefix
    (remote.md showed `-o tokenized/`, which tokenize refuses: a folder)."""
    import shlex

    import click

    from packtool.cli.commands import cli

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    seen = 0
    for page in pages:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
            for line in re.sub(r"\\\n\s*", " ", block).splitlines():
                for part in line.split("&&"):
                    match = re.match(r"^\s*(?:\w+=\S+ )*packtool (\w+)(.*)$", part)
                    if not match:
                        continue
                    name, args = match.group(1), shlex.split(match.group(2), comments=True)
                    try:
                        command = cli.commands[name]
                        command.make_context(name, list(args)).close()  # (it eats its list)
                    except click.ClickException as exc:
                        raise AssertionError(f"{page.name}: {part.strip()}: {exc}") from None
                    if name == "tokenize" and "megatron" in args:
                        out = args[args.index("-o") + 1]
                        assert not out.endswith("/"), f"{page.name}: {part.strip()}"
                    seen += 1
    assert seen >= 30  # the pages' examples were found


def test_verify_inspect_md_quotes_the_shard_order_error_verify_prints(tmp_path):
    # The page quoted `shards[1] (shard-000000-00001.parquet) is listed after ...-00002`: the
    # entry out of place after a swap is the third, shards[2].
    import json

    out = tmp_path / "DIR"
    code, _, err = run("pack", CORPUS, "-o", out, "--shard-rows", "300")
    assert code == 0, err
    manifest = json.loads((out / "index.json").read_text())
    shards = manifest["shards"]
    shards[1], shards[2] = shards[2], shards[1]
    (out / "index.json").write_text(json.dumps(manifest))
    code, _, err = run("verify", out)
    line = one_error_line(err).replace(str(out), "DIR")
    text = (ROOT / "docs" / "verify-inspect.md").read_text(encoding="utf-8")
    quoted = re.search(r"`(error: DIR/index\.json: shards\[.*?); \.\.\.`", text)
    assert code == 1 and quoted and line.startswith(quoted.group(1) + "; "), line


def test_every_repository_path_the_docs_name_exists():
    """A file or folder of this repository named on a page (`packtool/engines/worker.py`,
    `tests/packtool/cli/`, `examples/sft.py`) is there: a module moved or renamed leaves no
    stale pointer."""
    tops = "packtool|loader|attention|tests|examples|benchmarks|scripts|sample_data"
    path = re.compile(
        rf"(?<![\w/.-])((?:{tops})/[\w./-]*?(?:\.(?:py|sh|jinja|jsonl|parquet)|/))(?![\w./-])"
    )
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name in path.findall(line):
                if not (ROOT / name).exists():
                    missing.append(f"{page.name}:{number}: {name}")
    assert not missing, missing
