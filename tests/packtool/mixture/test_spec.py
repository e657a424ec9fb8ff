"""Mixture files (packtool/mixture/spec.py) and `packtool mix` (packtool/mixture/plan.py, the CLI)."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import numpy as np
import pytest

from loader.testing import write_random_dataset
from packtool.dataset.manifest import read_manifest
from packtool.errors import ConfigError
from packtool.mixture.plan import plan_mixture
from packtool.mixture.spec import (
    MixtureSpec,
    SourceSpec,
    check_compatible,
    mixture_from_dict,
    parse_count,
    read_mixture_file,
)
from tests.cli import one_error_line, run


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixfiles")
    for name, n in (("web", 400), ("code", 200), ("books", 30)):
        write_random_dataset(root / name, n_rows=n, max_len=512, mean_doc=60, seed=len(name))
    return root


def write(root, name, text):
    path = root / name
    path.write_text(text)
    return path


def test_json_and_yaml_files_read_the_same(folders):
    body = {
        "seed": 3,
        "unit": "tokens",
        "total_tokens": "2.5M",
        "sources": [
            {"name": "web", "path": "web", "weight": 0.7},
            {"name": "books", "path": "books", "weight": 0.3, "max_epochs": 2, "at_cap": "drop"},
        ],
    }
    j = read_mixture_file(write(folders, "m.json", json.dumps(body)))
    yaml_text = """
seed: 3
unit: tokens
total_tokens: 2.5M
sources:
  - {name: web, path: web, weight: 0.7}
  - name: books
    path: books
    weight: 0.3
    max_epochs: 2
    at_cap: drop
"""
    y = read_mixture_file(write(folders, "m.yaml", yaml_text))
    assert j == y
    assert j.total_tokens == 2_500_000 and j.seed == 3
    assert j.sources[0].path == str(folders / "web")  # relative to the file's folder
    assert j.weights() == {"web": 0.7, "books": 0.3}


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.json", '{"sources": [], "seed": 0}', "`sources` must be a non-empty list"),
        (
            "b.json",
            '{"sources": [{"name": "a", "path": "p", "weight": 1}], "sources": []}',
            "key 'sources' appears twice",
        ),
        (
            "c.yaml",
            "sources:\n  - {name: a, path: p, weight: 1}\nseed: 1\nseed: 2\n",
            "key 'seed' appears twice",
        ),
        (
            "d.json",
            '{"sources": [{"name": "a", "path": "p", "wieght": 1}]}',
            "unknown key\\(s\\) 'wieght'",
        ),
        ("e.json", '{"sorces": []}', "unknown key\\(s\\) 'sorces'"),
        ("f.yaml", "sources:\n  - {name: a, path: p, weight: 1e-3}\n", "YAML reads 1e-3 as text"),
        ("f2.json", '{"sources": [{"name": "a", "path": "p", "weight": "x"}]}', "got 'x'$"),
        ("g.json", '{"sources": [{"path": "p"}]}', "has no 'name'"),
        (
            "h.json",
            '{"sources": [{"name": "a", "path": "p", "weight": 1}], "total_tokens": "lots"}',
            "total_tokens must be",
        ),
        ("i.json", "{not json", "not valid JSON"),
        ("j.yaml", "sources: [\n", "not valid YAML"),
        ("k.json", '["a"]', "a mixture is a mapping"),
        (
            "l.json",
            '{"sources": [{"name": "a", "path": "p", "weight": 1}, {"name": "a", "path": "q", "weight": 1}]}',
            "duplicate source name",
        ),
        (
            "m.json",
            '{"sources": [{"name": "a", "path": "p", "weight": true}]}',
            "weight must be a number",
        ),
    ],
)
def test_bad_mixture_files_are_one_line_errors(tmp_path, name, text, message):
    with pytest.raises(ConfigError, match=message) as info:
        read_mixture_file(write(tmp_path, name, text))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("{sources: [{name: a, path: p, weight: 1}], 1: 2, foo: 3}", "1"),
        ("{sources: [{name: a, path: p, weight: 1, 1: 2, foo: 3}]}", "1"),
        ("{sources: [{name: a, path: p, weight: 1, [1,2]: 3}]}", "[1, 2]"),
        ("{sources: [{name: a, path: p, weight: 1}], ? [1]: 3}", "[1]"),
        ("{sources: [{name: a, path: p, weight: 1}], null: 3, 1.5: 2}", "None"),
        ("{sources: [{name: a, path: p, weight: 1}], {x: 1}: 3}", "{'x': 1}"),
    ],
)
def test_a_key_that_is_not_a_string_is_a_one_line_error(tmp_path, text, key):
    """Keys of other types (a number beside strings, null, a list or a mapping as a key) were a
    TypeError traceback: sorting the unknown keys, or a dict lookup of an unhashable key."""
    with pytest.raises(ConfigError) as info:
        read_mixture_file(write(tmp_path, "m.yaml", text))
    assert str(info.value).startswith(f"{tmp_path / 'm.yaml'}: "), info.value
    assert f"key {key} is not a string" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "text", "why"),
    [
        ("a.yaml", "sources:\n  - {name: web, path: p, weight: 1, weight: 2}\n", "key 'weight' appears twice"),
        ("b.json", '{"sources": [{"name": "web", "path": "p", "weight": 1, "weight": 2}]}', "key 'weight' appears twice"),
        ("c.yaml", "sources:\n  - {name: a, path: p, weight: 1}\n  - {name: web, path: q, weight: 1, 3: x}\n", "key 3 is not a string"),
        ("d.yaml", "sources:\n  - {name: web, path: p, weight: 1, [a]: 1}\n", "key ['a'] is not a string"),
        ("e.yaml", "sources:\n  - {name: web, name: web2, path: p, weight: 1}\n", "key 'name' appears twice"),
    ],
)  # fmt: skip
def test_a_bad_key_in_a_source_names_the_source(tmp_path, name, text, why):
    """A key twice, or not a string, inside one source's mapping was refused while the file was
    parsed, naming only the file: `m.yaml: key 'weight' appears twice` (which source?)."""
    path = write(tmp_path, name, text)
    with pytest.raises(ConfigError) as info:
        read_mixture_file(path)
    assert str(info.value).startswith(f"{path}: source 'web': {why}"), info.value
    assert "\n" not in str(info.value)


def test_a_bad_key_outside_the_sources_names_where_it_can(tmp_path):
    unnamed = write(tmp_path, "u.json", '{"sources": [{"path": "p", "weight": 1, "path": "q"}]}')
    with pytest.raises(ConfigError, match=r": source 'sources\[0\]': key 'path' appears twice"):
        read_mixture_file(unnamed)
    top = write(
        tmp_path, "t.yaml", "sources:\n  - {name: web, path: p, weight: 1}\nseed: 1\nseed: 2\n"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(str(top))}: key 'seed' appears twice"):
        read_mixture_file(top)
    # A mapping as a source's value (no value of a source is one): still that source's.
    inner = write(tmp_path, "v.yaml", "sources:\n  - {name: web, path: p, weight: {a: 1, a: 2}}\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(str(inner))}: source 'web': key 'a' "):
        read_mixture_file(inner)
    # Deeper than that (the file is not walked: YAML aliases can make it billions of items).
    deeper = write(
        tmp_path, "w.yaml", "sources:\n  - {name: web, path: p, weight: [{a: 1, a: 2}]}\n"
    )
    with pytest.raises(ConfigError, match=f"^{re.escape(str(deeper))}: key 'a' appears twice"):
        read_mixture_file(deeper)


def test_a_mapping_with_a_key_that_is_not_a_string_is_refused():
    source = {"name": "a", "path": "p", "weight": 1}
    with pytest.raises(ConfigError, match=r"^mixture: key 1 is not a string"):
        mixture_from_dict({"sources": [source], 1: 2, "foo": 3})
    with pytest.raises(ConfigError, match=r"^mixture: source 'a': key \(1, 2\) is not a string"):
        mixture_from_dict({"sources": [{**source, (1, 2): 3, "foo": 1}]})


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="mixture file not found"):
        read_mixture_file(tmp_path / "none.json")


def test_parse_count():
    assert parse_count("10B", "x") == 10_000_000_000
    assert parse_count("1_000", "x") == 1000 and parse_count(5, "x") == 5
    for bad in ("0", -3, 1.5, "1.5", "ten", True):
        with pytest.raises(ConfigError):
            parse_count(bad, "x")
    # exact (a float rounded 10**30), and bounded (past int64 it was a numba traceback)
    assert parse_count("4611686018427387903", "x") == 2**62 - 1
    assert parse_count("2.5T", "x") == 2_500_000_000_000
    for huge in ("1" + "0" * 30, 2**63, "9223372036854775808"):
        with pytest.raises(
            ConfigError, match=r"x .* is too large: at most 4,611,686,018,427,387,904"
        ):
            parse_count(huge, "x")


def test_numpy_numbers_become_the_python_numbers_of_the_same_value():
    # They passed the checks as they were, then broke json (the loader's fingerprint, the
    # state) and Fraction (a fractional cap's rows) far from the spec.
    a = SourceSpec(name="a", path="-", weight=np.float32(0.3), max_epochs=np.float32(1.15))
    b = SourceSpec(name="b", path="-", weight=np.int64(2), max_epochs=np.int32(3))
    spec = MixtureSpec(sources=(a, b), seed=np.uint64(7), total_tokens=np.int64(5000))
    assert (type(a.weight), type(a.max_epochs), type(b.weight), type(b.max_epochs)) == (
        float,
        float,
        int,
        int,
    )
    assert a.weight == np.float32(0.3) and a.max_epochs == np.float32(1.15)  # exact, not 0.3
    assert (b.weight, b.max_epochs, spec.seed, spec.total_tokens) == (2, 3, 7, 5000)
    assert type(spec.seed) is int and type(spec.total_tokens) is int
    json.dumps([spec.seed, a.weight, a.max_epochs, b.weight, b.max_epochs])
    assert type(spec.with_weights({"a": np.float64(0.5)}).source("a").weight) is float
    if np.finfo(np.longdouble).nmant > np.finfo(np.float64).nmant:  # x86: 80-bit
        third = np.longdouble(1) / np.longdouble(3)
        with pytest.raises(ConfigError, match="'a': weight .*float64 cannot hold exactly"):
            SourceSpec(name="a", path="-", weight=third)


def test_check_compatible_names_what_differs():
    tok = {
        "kind": "byte",
        "name": "byte",
        "vocab_size": 258,
        "eos_id": 257,
        "bos_id": None,
        "sha256": "",
    }
    check_compatible([("a", tok, 64), ("b", {**tok, "name": "other"}, 64)])  # the name may differ
    with pytest.raises(
        ConfigError, match=r"different tokenizers \(a byte \(eos_id 257\), b byte \(eos_id 0\)\)"
    ):
        check_compatible([("a", tok, 64), ("b", {**tok, "eos_id": 0}, 64)])
    with pytest.raises(ConfigError, match=r"different max_len \(a 64, b 32\)"):
        check_compatible([("a", tok, 64), ("b", tok, 32)])


def test_two_sources_on_the_same_data_are_refused_by_packtool_mix(folders, tmp_path):
    """A copy-pasted path planned as two sources would give every row twice (one epoch order
    per data): one line naming both, saying to use one source with the summed weight."""
    import shutil

    copy = tmp_path / "web_copy"  # the same data in another folder: the same rows too
    shutil.copytree(folders / "web", copy)
    for other in (folders / "web", copy):
        file = write(
            tmp_path,
            "same.yaml",
            f"total_steps: 3\nsources:\n  - {{name: w, path: {folders / 'web'}, weight: 1}}\n"
            f"  - {{name: b, path: {folders / 'books'}, weight: 1}}\n"
            f"  - {{name: w2, path: {other}, weight: 2}}\n",
        )
        code, _, err = run("mix", file, "--rows-per-batch", "2")
        line = one_error_line(err)
        assert code == 1 and "sources 'w' and 'w2' are the same data" in line, err
        assert "one source with their summed weight (3)" in line
    with pytest.raises(ConfigError, match=r"^sources 'w' and 'w2' are the same data"):
        plan_mixture(
            MixtureSpec(
                sources=(
                    SourceSpec(name="w", path=str(folders / "web"), weight=1),
                    SourceSpec(name="w2", path=str(folders / "web"), weight=1),
                ),
                total_tokens=1000,
            )
        )


def spec(folders, **kw):
    return MixtureSpec(
        sources=(
            SourceSpec(name="web", path=str(folders / "web"), weight=0.7),
            SourceSpec(name="code", path=str(folders / "code"), weight=0.2),
            SourceSpec(name="books", path=str(folders / "books"), weight=0.1, **kw),
        ),
        origin="test",
    )


def test_plan_shares_are_within_one_row_and_epochs_add_up(folders):
    plan = plan_mixture(spec(folders), tokens=3_000_000)
    assert 3_000_000 <= plan.tokens < 3_000_000 + 512
    for s in plan.sources:
        assert abs(s.tokens - s.target * plan.tokens) < 512
        assert s.epochs == pytest.approx(s.rows / s.epoch_rows)
    assert plan.warnings == () and plan.ended is None


def test_plan_warns_and_follows_a_cap(folders):
    drop = plan_mixture(spec(folders, max_epochs=1, at_cap="drop"), tokens=3_000_000)
    books = drop.sources[2]
    assert books.rows == books.epoch_rows  # exactly one epoch, then dropped
    assert books.needed_epochs > 1
    assert any("would be repeated" in w and "dropped there" in w for w in drop.warnings)
    assert [e["what"] for e in drop.events] == ["dropped"]
    stop = plan_mixture(spec(folders, max_epochs=1, at_cap="stop"), tokens=3_000_000)
    assert stop.ended and stop.tokens < 3_000_000
    assert any("ends early" in w for w in stop.warnings)


def test_plan_counts_a_fractional_cap_exactly(folders):
    # (1.15 - 1) * 400 is 59.99999999999996 in floats: 459 rows were planned, not 460
    cap = MixtureSpec(
        sources=(SourceSpec(name="web", path=str(folders / "web"), weight=1, max_epochs=1.15),)
    )
    plan = plan_mixture(cap)
    assert plan.sources[0].epoch_rows == 400 and plan.rows == plan.sources[0].rows == 460
    assert plan.ended == "source 'web' reached max_epochs 1.15"


def test_plan_in_steps(folders):
    rows = plan_mixture(spec(folders), steps=10, rows_per_batch=4, world_size=2)
    assert rows.rows == 80 and rows.steps == 10
    budget = plan_mixture(spec(folders), steps=10, tokens_per_batch=2048)
    assert budget.steps == 10 and budget.tokens <= 10 * 2048
    with pytest.raises(ConfigError, match="needs exactly one of"):
        plan_mixture(spec(folders), steps=10)
    with pytest.raises(ConfigError, match="give a length to plan"):
        plan_mixture(spec(folders))


def test_batch_options_without_steps_are_refused_naming_them(folders, tmp_path):
    # `mix --tokens N` planned the same with or without --rows-per-batch, --tokens-per-batch
    # and --world-size (both batch sizes at once too), while --steps refuses two batch sizes.
    file = write(
        tmp_path,
        "tokens.yaml",
        f"total_tokens: 20000\nsources:\n  - {{name: web, path: {folders / 'web'}, weight: 1}}\n",
    )
    code, _, err = run("mix", file, "--tokens", "10000", "--rows-per-batch", "2", "--tokens-per-batch", "600", "--world-size", "8")  # fmt: skip
    assert code == 1
    assert one_error_line(err) == (
        "error: --rows-per-batch 2 / rows_per_batch=2, --tokens-per-batch 600 / "
        "tokens_per_batch=600 and --world-size 8 / world_size=8 have no effect with --tokens "
        "10000 / tokens=10000 (a batch size and the world size count steps): plan --steps N / "
        "steps=N with one batch size, or drop them"
    )
    code, _, err = run("mix", file, "--world-size", "4")
    assert code == 1
    assert one_error_line(err) == (
        "error: --world-size 4 / world_size=4 has no effect with the mixture's total_tokens "
        "20,000 (a batch size and the world size count steps): plan --steps N / steps=N with "
        "one batch size, or drop it"
    )
    with pytest.raises(
        ConfigError,
        match=r"^--tokens-per-batch 1024 / tokens_per_batch=1024 has no effect with --tokens 1000 / ",
    ):
        plan_mixture(spec(folders), tokens=1000, tokens_per_batch=1024)
    cap = MixtureSpec(
        sources=(SourceSpec(name="web", path=str(folders / "web"), weight=1, max_epochs=1),)
    )
    with pytest.raises(
        ConfigError,
        match=r"^--rows-per-batch 2 / rows_per_batch=2 has no effect in a plan that runs until",
    ):
        plan_mixture(cap, rows_per_batch=2)
    assert plan_mixture(cap, world_size=1).rows == 400  # the default is no option given
    code, out, err = run("mix", file, "--tokens", "10000", "--json")
    assert code == 0 and err == "" and json.loads(out)["steps"] is None
    # Past the file's own total_tokens 20,000: planned, but the plan said nothing of where a run
    # of the file stops.
    code, out, err = run("mix", file, "--tokens", "30000", "--json")
    assert code == 0 and json.loads(out)["tokens"] >= 30000
    assert err == (
        "warning: --tokens 30000 / tokens=30000 plans past the mixture's own total_tokens 20,000, "
        "where a run "
        "of this file stops; the plan shows what a larger total would deliver\n"
    )


@pytest.mark.parametrize("batch", [("--tokens-per-batch", "2048"), ("--rows-per-batch", "4")])
def test_steps_past_the_files_total_tokens_are_planned_with_a_warning(folders, tmp_path, batch):
    """`--steps` planned past the file's total_tokens said nothing (only `--steps` past a
    total_steps, or `--tokens` past a total_tokens, did), where docs/mixtures.md promises it."""
    file = write(
        tmp_path,
        "tokens.yaml",
        f"total_tokens: 20000\nsources:\n  - {{name: web, path: {folders / 'web'}, weight: 1}}\n",
    )
    code, out, err = run("mix", file, "--steps", "40", *batch, "--json")
    planned = json.loads(out)["tokens"]
    assert code == 0 and planned > 20000 + 512, err
    assert err == (
        f"warning: --steps 40 / steps=40 plans {planned:,} tokens, past the mixture's own "
        "total_tokens "
        "20,000, where a run of this file stops; the plan shows what a larger total would "
        "deliver\n"
    )
    code, out, err = run("mix", file, "--steps", "2", *batch, "--json")
    assert code == 0 and err == "" and json.loads(out)["tokens"] < 20000


def test_steps_whose_last_row_reaches_the_files_total_tokens_are_not_past_it(folders):
    # a run stops after the row that brings the tokens to the total: a plan that ends on that
    # row delivers what the run does. One source: its first k rows hold k * T // R tokens
    # (`SyntheticLengths`), so the 10th row reaches 9 * T // R + 1 and is past 9 * T // R.
    web = read_manifest(folders / "web")
    after = [k * web.num_tokens // web.num_rows for k in (9, 10)]
    one = MixtureSpec(sources=(SourceSpec(name="web", path=str(folders / "web"), weight=1),))
    reached = plan_mixture(replace(one, total_tokens=after[0] + 1), steps=10, rows_per_batch=1)
    assert reached.tokens == after[1] and reached.warnings == ()
    past = plan_mixture(replace(one, total_tokens=after[0]), steps=10, rows_per_batch=1)
    assert past.warnings == (
        f"--steps 10 / steps=10 plans {after[1]:,} tokens, past the mixture's own total_tokens "
        f"{after[0]:,}, where a run of this file stops; the plan shows what a larger total "
        "would deliver",
    )


def test_planning_the_files_total_steps_without_a_batch_size_names_it(folders, tmp_path):
    # it said "planning --steps needs ..." to a user who gave no --steps
    file = write(
        tmp_path,
        "steps.yaml",
        f"total_steps: 40\nsources:\n  - {{name: web, path: {folders / 'web'}, weight: 1}}\n",
    )
    code, _, err = run("mix", file)
    line = one_error_line(err)
    assert code == 1 and "--steps" not in line, line
    assert (
        "planning the mixture's total_steps 40 needs exactly one of --rows-per-batch N / "
        "rows_per_batch=N, --tokens-per-batch N / tokens_per_batch=N (or plan a length in "
        "--tokens N / tokens=N)"
    ) in line
    code, _, err = run(
        "mix", file, "--steps", "5", "--rows-per-batch", "2", "--tokens-per-batch", "600"
    )
    assert code == 1 and "planning --steps 5 / steps=5 needs exactly one of" in one_error_line(err)
    code, out, err = run("mix", file, "--rows-per-batch", "2", "--json")
    assert code == 0 and json.loads(out)["rows"] == 80, err


def test_cli_table_json_and_errors(folders, tmp_path):
    file = write(
        tmp_path,
        "mix.json",
        json.dumps(
            {
                "sources": [
                    {"name": "web", "path": str(folders / "web"), "weight": 3},
                    {"name": "books", "path": str(folders / "books"), "weight": 1, "max_epochs": 2},
                ]
            }
        ),
    )
    code, out, err = run("mix", file, "--tokens", "2M")
    assert code == 0, err
    assert "source  weight  target" in out and "web" in out and "2 (stop)" in out
    assert "warning: source 'books' would be repeated" in err
    assert "warning: the mixture ends early" in err
    code, out, _ = run("mix", file, "--steps", "5", "--rows-per-batch", "2", "--json")
    assert code == 0 and json.loads(out)["rows"] == 10
    code, _, err = run("mix", file)
    assert code == 0  # the cap ends it: planned until then
    code, _, err = run("mix", file, "--steps", "5")
    assert code == 1 and "needs exactly one of" in one_error_line(err)
    code, _, err = run("mix", tmp_path / "missing.json")
    assert code == 1 and "mixture file not found" in one_error_line(err)
    bad = write(
        tmp_path,
        "bad.json",
        json.dumps({"sources": [{"name": "x", "path": str(tmp_path / "nope"), "weight": 1}]}),
    )
    code, _, err = run("mix", bad, "--tokens", "5")
    assert code == 1 and "no such dataset folder" in one_error_line(err)


@pytest.mark.parametrize(
    "text", ["1e-3", "1e3", "1.0e3", "2.5e10", ".5e2", "5.e2", "1e308", "3E-300"]
)
def test_the_exponent_hint_suggests_what_yaml_reads_as_that_number(tmp_path, text):
    """YAML 1.1 needs a dot and a sign in an exponent (1.0e+3): every form the message suggests
    must load as the number meant."""
    import yaml

    spec = tmp_path / "m.yaml"
    spec.write_text(f"sources:\n  - {{name: a, path: p, weight: {text}}}\n")
    with pytest.raises(ConfigError) as caught:
        read_mixture_file(spec)
    suggested = re.search(r"write (.+)\)$", str(caught.value)).group(1).split(" or ")
    assert suggested and all(
        yaml.safe_load(f"w: {form}")["w"] == pytest.approx(float(text)) for form in suggested
    ), suggested


@pytest.mark.parametrize(
    ("text", "count"),
    [("1e9", 10**9), ("1.0e+9", 10**9), ("2.5e6", 2_500_000), ("1E6", 10**6), ("10e-1", 1)],
)
def test_a_total_with_an_exponent_is_read_exactly(tmp_path, text, count):
    """`--tokens 1.0e+9` was refused with a hint about YAML telling the user to write 1.0e+9;
    `total_tokens: 1e9` (text to YAML 1.1) with the same hint. Exponent text is read exactly
    (Decimal) in both."""
    assert parse_count(text, "--tokens") == count
    spec = tmp_path / "m.yaml"
    spec.write_text(f"total_tokens: {text}\nsources:\n  - {{name: a, path: p, weight: 1}}\n")
    assert read_mixture_file(spec).total_tokens == count


@pytest.mark.parametrize(
    "text", ["1e-3", "1.5e0", "0e5", "1e1K", "1e+", "2.5e-1", "1e99999999999999999999"]
)
def test_an_exponent_that_is_not_a_positive_whole_number_is_refused_without_a_yaml_hint(text):
    # (an exponent past Decimal's range too: not a decimal.InvalidOperation traceback)
    with pytest.raises(ConfigError, match="positive whole number") as caught:
        parse_count(text, "--tokens")
    assert "YAML" not in str(caught.value), caught.value


def test_a_huge_exponent_is_too_large_at_once():
    # refused before an int of 10**999999999 is made (a Decimal compares without making it)
    for text in ("1e999999999", "1e30", "1" + "9" * 40 + "e3"):
        with pytest.raises(ConfigError, match=r"is too large: at most 4,611,686,018,427,387,904"):
            parse_count(text, "--tokens")


def test_the_cli_reads_tokens_with_an_exponent(folders, tmp_path):
    file = write(
        tmp_path, "m.yaml", f"sources:\n  - {{name: web, path: {folders / 'web'}, weight: 1}}\n"
    )
    code, out, err = run("mix", file, "--tokens", "1.0e+4", "--json")
    assert code == 0 and err == "" and 10_000 <= json.loads(out)["tokens"] < 10_000 + 512


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_source_without_a_weight_is_refused(tmp_path, suffix):
    """A source with no weight was given 1.0 without a word (the docs give no default)."""
    sources = [{"name": "a", "path": "p"}, {"name": "b", "path": "q", "weight": 0.2}]
    text = json.dumps({"total_tokens": 1000, "sources": sources})  # JSON is YAML too
    with pytest.raises(ConfigError, match="source 'a' has no 'weight'") as caught:
        read_mixture_file(write(tmp_path, "m" + suffix, text))
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="source 'a' has no weight"):
        SourceSpec(name="a", path="p")


@pytest.mark.parametrize("at_cap", ["drop", "stop"])
def test_at_cap_without_max_epochs_is_refused(tmp_path, at_cap):
    """`at_cap` acts at `max_epochs`: without one it did nothing, silently."""
    body = {"total_tokens": 1000, "sources": [{"name": "a", "path": "p", "weight": 1}]}
    body["sources"][0]["at_cap"] = at_cap
    with pytest.raises(ConfigError, match=f"source 'a': at_cap '{at_cap}' without max_epochs"):
        read_mixture_file(write(tmp_path, "m.json", json.dumps(body)))
    body["sources"][0]["max_epochs"] = 2
    assert (
        read_mixture_file(write(tmp_path, "m.json", json.dumps(body))).sources[0].at_cap == at_cap
    )
    with pytest.raises(ConfigError, match="at_cap 'drop' without max_epochs"):
        SourceSpec(name="a", path="p", weight=1, at_cap="drop")


def test_a_yaml_alias_bomb_is_a_short_error_not_a_hang(tmp_path):
    """Aliases nested 9 deep (9^9 items, a 435-byte file) load as shared references, but the
    message quoting the value (`seed must be an integer, got [...]`) grew without bound."""
    levels = ["&a0 [1,1,1,1,1,1,1,1,1]"] + [
        f"&a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)
    ]
    path = tmp_path / "m.yaml"
    path.write_text(f"seed: [{', '.join(levels)}]\nsources:\n  - {{name: s, path: x, weight: 1}}\n")
    with pytest.raises(ConfigError, match=r"^.*seed must be an integer, got \[\[1, 1") as info:
        read_mixture_file(path)
    assert len(str(info.value)) < 300
