"""Corpus readers: every format, files/folders/globs, batching, streaming, skips and errors."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import packtool.read.corpus as corpus_mod
from packtool.errors import ConfigError, DataError
from packtool.read import jsonl
from packtool.read.corpus import expand_inputs, read_corpus
from packtool.read.documents import ReadConfig, SkipCounter

DOCS = [
    {"text": "hello world", "lang": "en", "n": 1},
    {"text": "héllo wörld ✓", "lang": "de"},
    {"text": "λόγος\nsecond line", "lang": "el", "n": [1, 2]},
]


def jsonl_bytes(rows: list[object]) -> bytes:
    return b"".join(json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in rows)


def write_corpus(path: Path, rows: list[dict] = DOCS) -> Path:
    """Write `rows` in the format named by `path`'s suffix."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".parquet"):
        pq.write_table(
            pa.Table.from_pylist([{k: r.get(k) for k in ("text", "lang")} for r in rows]), path
        )
    elif name.endswith(".gz"):
        path.write_bytes(gzip.compress(jsonl_bytes(rows)))
    elif name.endswith(".zst"):
        path.write_bytes(zstandard.ZstdCompressor().compress(jsonl_bytes(rows)))
    elif name.endswith((".jsonl", ".ndjson", ".json")):
        path.write_bytes(jsonl_bytes(rows))
    else:
        raise ValueError(name)
    return path


def read_all(inputs, config=None, skips=None):
    docs = []
    for batch in read_corpus(inputs, config, skips):
        for i, text in enumerate(batch.texts):
            extras = {k: v[i] for k, v in batch.extras.items()}
            docs.append((int(batch.doc_ids[i]), text, batch.sources[i], extras))
    return docs


# --- ReadConfig ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"text_field": ""}, "text_field"),
        ({"text_column": ""}, "text_column"),
        ({"extra_fields": "lang"}, "extra_fields"),
        ({"extra_fields": ("lang", "")}, "extra_fields"),
        ({"extra_fields": ("lang", "lang")}, "duplicates"),
        ({"extra_fields": ("source",)}, "clashes with a built-in column"),
        ({"extra_fields": ("input_ids",)}, "clashes"),
        # The column a tail's pieces add (packtool/pack/tail.py): a field of that name reached
        # the packer and failed there with pyarrow's KeyError traceback.
        ({"extra_fields": ("doc_chunk",)}, "clashes with a built-in column"),
        ({"batch_docs": 0}, "^batch_docs must be a positive integer, got 0$"),
        ({"batch_bytes": 0}, "^batch_bytes must be a positive integer, got 0$"),
        # Before: accepted (a float count), and strict="no" was kept and acted as strict.
        ({"batch_docs": 1.5}, "^batch_docs must be a positive integer, got 1.5$"),
        ({"batch_bytes": 1.5}, "^batch_bytes must be a positive integer, got 1.5$"),
        ({"batch_docs": None}, "^batch_docs must be a positive integer, got None$"),
        ({"strict": "no"}, "^strict must be True or False, got 'no'$"),
        ({"strict": 1}, "^strict must be True or False, got 1$"),
        ({"text_field": 3}, "text_field"),
    ],
)
def test_read_config_rejects(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        ReadConfig(**kwargs)


def test_read_config_is_frozen_and_keyword_only():
    cfg = ReadConfig()
    with pytest.raises(AttributeError):
        cfg.strict = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        ReadConfig("text")  # type: ignore[misc]


# --- expand_inputs -------------------------------------------------------------------------


def test_expand_inputs_files_folders_globs(tmp_path):
    a = write_corpus(tmp_path / "d" / "b.jsonl")
    b = write_corpus(tmp_path / "d" / "sub" / "a.parquet")
    (tmp_path / "d" / "notes.bin").write_bytes(b"x")  # unknown suffix: ignored in folders
    (tmp_path / "d" / ".hidden").mkdir()
    write_corpus(tmp_path / "d" / ".hidden" / "c.jsonl")  # hidden: ignored in folders
    c = tmp_path / "one.txt"
    c.write_text("x")
    assert expand_inputs([tmp_path / "d"]) == [a, b]
    assert expand_inputs([str(tmp_path / "d" / "**" / "*.parquet")]) == [b]
    # Inputs keep their order; duplicates are dropped.
    assert expand_inputs([c, tmp_path / "d", a]) == [c, a, b]
    # A file named explicitly is taken whatever its suffix.
    assert expand_inputs([tmp_path / "d" / "notes.bin"]) == [tmp_path / "d" / "notes.bin"]
    # `.json` is not picked up in folders (configuration), but read as JSON Lines when named.
    j = write_corpus(tmp_path / "d" / "data.json")
    assert expand_inputs([tmp_path / "d"]) == [a, b]
    assert [d[1] for d in read_all([j])] == [r["text"] for r in DOCS]


def test_listings_kept_lists_each_set_of_inputs_once(tmp_path, monkeypatch):
    import contextvars
    import threading

    a = write_corpus(tmp_path / "d" / "a.jsonl")
    calls = []
    real = corpus_mod.expand
    monkeypatch.setattr(corpus_mod, "expand", lambda *x: calls.append(x) or real(*x))
    with corpus_mod.listings_kept():
        assert expand_inputs([tmp_path / "d"]) == [a]
        b = write_corpus(tmp_path / "d" / "b.jsonl")  # after the listing: the command's view
        assert expand_inputs(str(tmp_path / "d")) == [a]
        got = []
        thread = threading.Thread(
            target=contextvars.copy_context().run,
            args=(lambda: got.append(expand_inputs([tmp_path / "d"])),),
        )
        thread.start()
        thread.join()
        assert got == [[a]]
        assert len(calls) == 1
        assert expand_inputs([a]) == [a]  # other inputs: a listing of their own
        assert len(calls) == 2
        with pytest.raises(DataError, match="no such file"):  # a failure is not kept
            expand_inputs([tmp_path / "gone.jsonl"])
        (tmp_path / "gone.jsonl").write_text('{"text": "x"}\n')
        assert expand_inputs([tmp_path / "gone.jsonl"]) == [tmp_path / "gone.jsonl"]
    assert expand_inputs([tmp_path / "d"]) == [a, b]  # outside: listed again
    with corpus_mod.listings_kept():  # a generator: read once (it was used up by the key)
        assert expand_inputs(p for p in [tmp_path / "d"]) == [a, b]
        assert expand_inputs([tmp_path / "d"]) == [a, b]


def test_expand_inputs_errors(tmp_path):
    with pytest.raises(DataError, match="missing.jsonl: no such file or folder"):
        expand_inputs([tmp_path / "missing.jsonl"])
    with pytest.raises(DataError, match="glob matches no files"):
        expand_inputs([str(tmp_path / "*.jsonl")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="folder has no corpus files"):
        expand_inputs([tmp_path / "empty"])


def test_inputs_that_are_no_paths_are_one_line_errors(tmp_path):
    # One path is one input; None, a number, bytes or an item that is no path say what is
    # expected (they were a TypeError from inside the loop).
    a = write_corpus(tmp_path / "a.jsonl")
    assert expand_inputs(str(a)) == expand_inputs(a) == [a]
    for bad in (None, 3, b"a.jsonl"):
        with pytest.raises(ConfigError, match="^inputs must be a path or a list of paths"):
            expand_inputs(bad)
    with pytest.raises(ConfigError, match="^an input must be a str or os.PathLike path, got 3$"):
        expand_inputs([a, 3])


# --- formats -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["c.jsonl", "c.ndjson", "c.jsonl.gz", "c.jsonl.zst", "c.parquet"])
def test_each_format_reads_the_same_documents(tmp_path, name):
    path = write_corpus(tmp_path / name)
    docs = read_all([path], ReadConfig(extra_fields=("lang",)))
    assert [d[1] for d in docs] == [r["text"] for r in DOCS]
    assert [d[0] for d in docs] == [0, 1, 2]
    assert {d[2] for d in docs} == {str(path)}
    assert [d[3]["lang"] for d in docs] == ["en", "de", "el"]


def test_text_files_one_document_each(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "b.txt").write_text("second\n")
    (tmp_path / "t" / "a.txt").write_text("first ✓")
    (tmp_path / "t" / "c.md").write_text("")
    skips = SkipCounter()
    docs = read_all([tmp_path / "t"], skips=skips)
    assert [d[1] for d in docs] == ["first ✓", "second\n"]
    assert skips.counts == {"empty": 1}


def test_several_inputs_keep_global_sequential_ids(tmp_path):
    a = write_corpus(tmp_path / "a.jsonl")
    b = write_corpus(tmp_path / "b.parquet")
    docs = read_all([a, b], ReadConfig(batch_docs=2))
    assert [d[0] for d in docs] == list(range(6))
    assert [d[2] for d in docs] == [str(a)] * 3 + [str(b)] * 3


def test_extra_fields_missing_and_non_string(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl")
    docs = read_all([path], ReadConfig(extra_fields=("n",)))
    assert [d[3]["n"] for d in docs] == ["1", None, "[1,2]"]
    flags = [{"text": "a", "f": True}, {"text": "b", "f": False}, {"text": "c", "f": 1.5}]
    docs = read_all([write_corpus(tmp_path / "b.jsonl", flags)], ReadConfig(extra_fields=("f",)))
    assert [d[3]["f"] for d in docs] == ["true", "false", "1.5"]  # JSON, not Python's "True"


def test_batches_respect_doc_and_byte_limits(tmp_path):
    rows = [{"text": "x" * 10} for _ in range(7)]
    path = write_corpus(tmp_path / "c.jsonl", rows)
    sizes = [len(b) for b in read_corpus([path], ReadConfig(batch_docs=3))]
    assert sizes == [3, 3, 1]
    sizes = [len(b) for b in read_corpus([path], ReadConfig(batch_bytes=25))]
    assert sizes == [3, 3, 1]  # a batch closes once it reaches 25 characters
    batches = list(read_corpus([path], ReadConfig(batch_docs=3)))
    assert sum(b.nbytes for b in batches) == path.stat().st_size


def test_reading_is_lazy_first_batch_before_later_files_open(tmp_path, monkeypatch):
    paths = [write_corpus(tmp_path / f"{i}.jsonl") for i in range(3)]
    opened: list[Path] = []
    real = corpus_mod.read_file

    def spy(path, config, skips):
        opened.append(path)
        yield from real(path, config, skips)

    monkeypatch.setattr(corpus_mod, "read_file", spy)
    it = read_corpus(paths, ReadConfig(batch_docs=2))
    first = next(it)
    assert len(first) == 2
    assert opened == [paths[0]]
    assert sum(len(b) for b in it) == 7
    assert opened == paths


# --- skips and errors ------------------------------------------------------------------------


def bad_jsonl(tmp_path: Path) -> Path:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(
        b'{"text": "ok one"}\n'
        b"{not json\n"
        b'{"body": "no text field"}\n'
        b'{"text": 42}\n'
        b'{"text": "bad \xff byte"}\n'
        b'{"text": ""}\n'
        b"\n"
        b'["a list"]\n'
        b'{"text": "ok two"}\n'
    )
    return path


def test_bad_lines_are_counted_skips_with_file_line(tmp_path):
    path = bad_jsonl(tmp_path)
    skips = SkipCounter()
    docs = read_all([path], skips=skips)
    assert [d[1] for d in docs] == ["ok one", "ok two"]
    assert [d[0] for d in docs] == [0, 1]  # skips take no id
    assert skips.counts == {"malformed_json": 2, "missing_field": 2, "invalid_utf8": 1, "empty": 1}
    assert skips.examples["malformed_json"][0].startswith(f"{path}:2 ")
    assert skips.examples["missing_field"] == [
        f"{path}:3 (no 'text')",
        f"{path}:4 ('text' is a number)",
    ]
    assert skips.examples["invalid_utf8"] == [f"{path}:5"]
    assert skips.examples["empty"] == [f"{path}:6"]
    assert skips.examples["malformed_json"][1] == f"{path}:8 (a JSON array, not an object)"
    assert skips.total == 6
    assert skips.summary().startswith("6 skipped: empty 1 (e.g. ")


def test_strict_turns_the_first_skip_into_an_error(tmp_path):
    path = bad_jsonl(tmp_path)
    with pytest.raises(DataError, match=rf"^{path}:2: malformed json .*--strict"):
        read_all([path], ReadConfig(strict=True))


def test_skip_counter_keeps_a_few_examples():
    skips = SkipCounter(max_examples=2)
    for i in range(5):
        skips.add("empty", f"f:{i}")
    assert skips.counts == {"empty": 5}
    assert skips.examples == {"empty": ["f:0", "f:1"]}
    assert SkipCounter().summary() == "no skips"


def test_skip_note_ends_an_error_message_only_when_something_was_skipped():
    assert SkipCounter().note() == ""
    skips = SkipCounter()
    skips.add("empty", "f:3")
    assert skips.note() == " (1 skipped: empty 1 (e.g. f:3))"


def test_text_field_missing_everywhere_is_an_error_naming_the_fields(tmp_path):
    path = write_corpus(tmp_path / "c.jsonl")
    with pytest.raises(
        DataError, match=r"no line has the text field 'body' \(fields found: lang, n, text\)"
    ):
        read_all([path], ReadConfig(text_field="body"))


def test_text_field_missing_in_a_long_file_fails_early(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "MISSING_FIELD_PATIENCE", 5)
    rows = [{"body": "x"}] * 5 + [{"text": "late"}]
    path = write_corpus(tmp_path / "c.jsonl", rows)
    with pytest.raises(DataError, match="no line has the text field 'text'"):
        read_all([path])


def _outcome(path, cuts):
    """What reading `path` in the byte ranges between `cuts` gives: the documents' texts and
    the skip counts, or the missing-field error."""
    skips = SkipCounter()
    texts = []
    try:
        for start, end in zip(cuts[:-1], cuts[1:], strict=True):
            texts += [d[0] for d in jsonl.read_jsonl(path, ReadConfig(), skips, start, end)]
    except DataError as exc:
        assert "no line has the text field 'text'" in str(exc)
        return "error"
    return texts, skips.counts


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kinds=st.lists(st.sampled_from(["text", "null", "other"]), min_size=1, max_size=12),
    fractions=st.lists(st.floats(0, 1), max_size=6),
)
def test_a_missing_text_field_is_judged_on_the_file_whatever_its_cuts(
    tmp_path, monkeypatch, kinds, fractions
):
    """Before: each byte range judged itself, so a range whose lines all lacked the field (or
    held null) failed the run "no line has the text field" while other ranges held thousands
    of documents: --partition-size 64KB failed a file that packed by default."""
    monkeypatch.setattr(jsonl, "MISSING_FIELD_PATIENCE", 3)
    rows = [{"text": f"d{i}"} if k == "text" else {"text": None} if k == "null" else {"o": i}
            for i, k in enumerate(kinds)]  # fmt: skip
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    size = path.stat().st_size
    cuts = sorted({0, size, *(int(f * size) for f in fractions)})
    assert _outcome(path, cuts) == _outcome(path, [0, size])


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda data, path: path.write_bytes(gzip.compress(data)), "gzip-compressed data"),
        (lambda data, path: path.write_bytes(zstandard.compress(data)), "zstd-compressed data"),
        (
            lambda data, path: pq.write_table(pa.table({"text": ["a"] * 1000}), path),
            "Parquet",
        ),
    ],
)
def test_compressed_or_parquet_bytes_named_jsonl_are_an_error_not_a_skip(tmp_path, make, kind):
    """Before: gzip of 1,000 records in data.jsonl was one `invalid_utf8` skip and the run went
    on (Parquet: 66 skips); the same bytes named .txt were already this error."""
    path = tmp_path / "data.jsonl"
    make(b'{"text": "a"}\n' * 1000, path)
    with pytest.raises(DataError, match=rf"data.jsonl: holds {kind}, not text; name it with"):
        read_all([path])


def test_invalid_utf8_text_file_is_a_skip(tmp_path):
    (tmp_path / "bad.txt").write_bytes(b"abc \xff\xfe")
    skips = SkipCounter()
    assert read_all([tmp_path / "bad.txt"], skips=skips) == []
    assert skips.examples == {"invalid_utf8": [f"{tmp_path / 'bad.txt'} (byte 4)"]}
    # After a byte order mark (dropped from the text), the byte is still the file's: it was 4.
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfabc \xff\xfe")
    skips = SkipCounter()
    assert read_all([tmp_path / "bom.txt"], skips=skips) == []
    assert skips.examples == {"invalid_utf8": [f"{tmp_path / 'bom.txt'} (byte 7)"]}


def test_parquet_missing_column_is_an_error_naming_the_columns(tmp_path):
    path = write_corpus(tmp_path / "c.parquet")
    with pytest.raises(
        DataError, match=r"no text column 'body' \(columns: text, lang\); pass --text-column"
    ):
        read_all([path], ReadConfig(text_column="body"))
    with pytest.raises(DataError, match=r"no extra field 'topic' \(columns: text, lang\)"):
        read_all([path], ReadConfig(extra_fields=("topic",)))


def test_parquet_nulls_binary_and_wrong_types(tmp_path):
    path = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": ["a", None, "", "b"]}), path)
    skips = SkipCounter()
    assert [d[1] for d in read_all([path], skips=skips)] == ["a", "b"]
    assert skips.counts == {"missing_field": 1, "empty": 1}
    assert skips.examples["missing_field"] == [f"{path}:row 1 ('text' is null)"]

    pq.write_table(pa.table({"text": pa.array([b"ok", b"\xff"], pa.binary())}), path)
    skips = SkipCounter()
    assert [d[1] for d in read_all([path], skips=skips)] == ["ok"]
    assert skips.counts == {"invalid_utf8": 1}

    pq.write_table(pa.table({"text": [1, 2]}), path)
    with pytest.raises(DataError, match="has type int64, not a string"):
        read_all([path])


@pytest.mark.parametrize(
    ("name", "data", "match"),
    [
        ("c.parquet", b"not parquet at all", "not a readable Parquet file"),
        ("c.jsonl.gz", b"not gzip", "cannot read"),
        ("c.jsonl.zst", b"not zstd data here", "corrupt zstd stream"),
        ("c.jsonl.gz", gzip.compress(b'{"text": "a"}\n' * 100)[:-20], "truncated"),
        ("c.txt.gz", b"plain text, not gzip", "cannot read"),
        ("c.txt.zst", b"plain text, not zstd", "corrupt zstd stream"),
        ("c.txt.gz", gzip.compress(b"x" * 1000)[:-12], "truncated"),
        ("c.txt.zst", zstandard.ZstdCompressor().compress(b"abc" * 5000)[:-7], "truncated"),
        (
            "c.jsonl.zst",
            zstandard.ZstdCompressor().compress(b'{"text": "a"}\n' * 5000)[:-7],
            "truncated",
        ),
    ],
    ids=[
        "not-parquet",
        "not-gzip-jsonl",
        "not-zstd-jsonl",
        "truncated-gzip-jsonl",
        "not-gzip-text",
        "not-zstd-text",
        "truncated-gzip-text",
        "truncated-zstd-text",
        "truncated-zstd-jsonl",
    ],
)
def test_corrupt_files_are_one_line_errors(tmp_path, name, data, match):
    (tmp_path / name).write_bytes(data)
    with pytest.raises(DataError, match=match) as info:
        read_all([tmp_path / name])
    assert str(tmp_path / name) in str(info.value)
    assert "\n" not in str(info.value)


def test_unreadable_path_is_an_error(tmp_path):
    # A folder with a corpus suffix passes expand_inputs as a folder, so use a dangling symlink.
    link = tmp_path / "gone.jsonl"
    link.symlink_to(tmp_path / "nowhere.jsonl")
    with pytest.raises(
        DataError, match="gone.jsonl: a symbolic link to .*nowhere.jsonl, which does not"
    ):
        read_all([link])


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(texts=st.lists(st.text(max_size=40), max_size=12))
def test_jsonl_round_trip_property(tmp_path_factory, texts):
    path = tmp_path_factory.mktemp("p") / "c.jsonl"
    write_corpus(path, [{"text": t} for t in texts])
    skips = SkipCounter()
    got = [d[1] for d in read_all([path], ReadConfig(batch_docs=5), skips)]
    assert got == [t for t in texts if t]
    assert skips.counts.get("empty", 0) == sum(1 for t in texts if not t)


def test_a_lone_surrogate_escape_is_a_counted_malformed_json_skip(tmp_path):
    """JSON's grammar allows "\\ud800" alone, but no UTF-8 text holds it: the document is a
    counted skip naming why (docs/tokenize.md's skip table), the next one is kept."""
    path = tmp_path / "s.jsonl"
    path.write_text('{"text": "a\\ud800b"}\n{"text": "kept"}\n')
    skips = SkipCounter()
    assert [d[1] for d in read_all([path], skips=skips)] == ["kept"]
    assert skips.counts == {"malformed_json": 1}
    assert skips.examples["malformed_json"] == [f"{path}:1 (no low surrogate in string)"]


def test_valid_json_orjson_refuses_is_read_and_a_lone_surrogate_element_is_a_skip(tmp_path):
    """A number beyond a double's range (`1e400`, in a field that is not the text) made its
    line a `malformed_json` skip, and made a `.json` array holding it, or an element with a
    lone surrogate, an error for the whole file: orjson refuses both, JSON's grammar allows
    them. `NaN` is still no JSON."""
    lines = tmp_path / "n.jsonl"
    lines.write_text(
        '{"text": "big", "score": 1e400}\n{"text": "nan", "x": NaN}\n{"text": "a\\ud800"}\n'
        '{"text": "kept"}\n'
    )
    array = tmp_path / "a.json"
    array.write_text('[{"text": "x\\ud800"}, {"text": "ok", "s": -1e999}, {"text": "last"}]')
    skips = SkipCounter()
    assert [d[1] for d in read_all([lines, array], skips=skips)] == ["big", "kept", "ok", "last"]
    assert skips.counts == {"malformed_json": 2 + 1}
    assert skips.examples["malformed_json"] == [
        f"{lines}:2 (unexpected character, expected a JSON value)",
        f"{lines}:3 (no low surrogate in string)",
        f"{array}:item 0 (no low surrogate in string)",
    ]


def test_an_integer_past_pythons_digit_limit_is_read_as_a_number_beyond_a_double_s_range(
    tmp_path,
):
    """Before: `{"text": "a", "n": <5,000 digits>}` was a `malformed_json` skip named "number
    is infinity when parsed as double" (orjson's words: the standard library, asked again,
    refuses an integer past `sys.get_int_max_str_digits()`, 4,300 digits), and a `.json` array
    holding one was an error for the whole file. Such an integer is a number beyond a double's
    range, as `1e400` is: read where the record's other fields are not used; in a kept field a
    counted skip that says so in words."""
    import sys

    big = "1" * 5000
    lines = tmp_path / "n.jsonl"
    lines.write_text(
        f'{{"text": "a", "n": {big}}}\n{{"text": "b", "n": [-{big}]}}\n{{"text": "c"}}\n'
    )
    array = tmp_path / "a.json"
    array.write_text(f'[{{"text": "x", "n": {{"m": {big}}}}}, {{"text": "y", "n": 2}}]')
    skips = SkipCounter()
    assert [d[1] for d in read_all([lines, array], skips=skips)] == ["a", "b", "c", "x", "y"]
    assert skips.counts == {}
    skips = SkipCounter()
    docs = read_all([lines, array], ReadConfig(extra_fields=("n",)), skips)
    assert [(d[1], d[3]["n"]) for d in docs] == [("c", None), ("y", "2")]
    words = f"field 'n' holds a number with more than {sys.get_int_max_str_digits()} digits"
    assert skips.counts == {"malformed_json": 3}
    assert skips.examples["malformed_json"] == [
        f"{lines}:1 ({words})",
        f"{lines}:2 ({words})",
        f"{array}:item 0 ({words})",
    ]


def test_a_json_array_that_is_not_utf8_names_the_bytes_place(tmp_path):
    """Before: a `.json` array with a 0xff byte inside a text value on its second line was
    "not one valid JSON array (str is not valid UTF-8: surrogates not allowed: line 1 column 1
    (char 0))": orjson checks the encoding first and names the file's start. Now the error names
    the byte, its line and column, and its offset."""
    path = tmp_path / "bad.json"
    path.write_bytes(b'[{"text": "hello"},\n {"text": "\xc3\xa9ab\xffcd"},\n {"text": "x"}]\n')
    with pytest.raises(DataError) as info:
        read_all([path])
    assert str(info.value) == (
        f"{path}: not UTF-8: byte 0xff at line 2 column 15 (byte 35); JSON text is UTF-8: save "
        "the file as UTF-8 (or as JSON Lines, where such a line is an invalid_utf8 skip)"
    )
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # the offset is the file's: BOM too
    with pytest.raises(DataError, match=r"line 2 column 15 \(byte 38\);"):
        read_all([path])


def test_what_the_fallback_parser_still_refuses(tmp_path):
    """The standard library, asked where orjson refuses, read a kept field holding 1e400 as
    'inf' (and inside an object as null), and guessed UTF-16 / UTF-32 or dropped a byte order
    mark (a UTF-16 file was half read); each stays a counted skip, as before."""
    kept = tmp_path / "k.jsonl"
    kept.write_text(
        '{"text": "a", "score": 1e400}\n{"text": "b", "meta": {"s": -2e308}}\n'
        '{"text": "c", "other": 1e400, "score": 1}\n'
    )
    skips = SkipCounter()
    docs = read_all([kept], ReadConfig(extra_fields=("score", "meta")), skips)
    assert [(d[1], d[3]["score"]) for d in docs] == [("c", "1")]
    assert skips.examples["malformed_json"] == [
        f"{kept}:1 (field 'score' holds a number beyond a double's range)",
        f"{kept}:2 (field 'meta' holds a number beyond a double's range)",
    ]
    wide = tmp_path / "w.jsonl"
    wide.write_bytes("".join(json.dumps({"text": t}) + "\n" for t in "xyz").encode("utf-16"))
    bom = tmp_path / "b.jsonl"
    bom.write_bytes(b'{"text": "first"}\n\xef\xbb\xbf{"text": "joined"}\n')
    skips = SkipCounter()
    assert [d[1] for d in read_all([wide, bom], skips=skips)] == ["first"]
    assert sum(skips.counts.values()) == 4 + 1  # the UTF-16 file's lines, the BOM line


def test_a_number_past_pythons_digit_limit_pickles_and_copies_as_its_infinity():
    """`LongInteger` (what such a literal reads as) refused pickle and deepcopy (its `__new__`
    was handed a float): a parsed record that travels to a process or is copied keeps it as
    the infinity it reads as."""
    import copy
    import math
    import pickle

    record = jsonl.standard_json(b'{"n": -' + b"9" * 5000 + b', "m": [' + b"1" * 5000 + b"]}")
    for again in (pickle.loads(pickle.dumps(record)), copy.deepcopy(record)):
        assert again["n"] == -math.inf and again["m"] == [math.inf]


def _compressions(byte: int) -> list[tuple]:
    """(suffix, compress, where byte `byte` is said to be) of a plain, .gz and .zst file."""
    inner = f"byte {byte} of the decompressed text"
    zstd = zstandard.ZstdCompressor().compress
    return [("", bytes, f"byte {byte}"), (".gz", gzip.compress, inner), (".zst", zstd, inner)]


BAD_ARRAY = b'[{"text": "hello"},\n {"text": "\xc3\xa9ab\xffcd"},\n {"text": "x"}]\n'


@pytest.mark.parametrize(("suffix", "compress", "place"), _compressions(35))
def test_a_bad_utf8_byte_of_a_compressed_json_array_is_placed_in_the_decompressed_text(
    tmp_path, suffix, compress, place
):
    """Before: `bad.json.gz` said "(byte 35)", an offset in the decompressed stream, as if it
    were the file's (the compressed file's byte 35 is somewhere else). A plain file's offset is
    its own, said as before."""
    path = tmp_path / f"bad.json{suffix}"
    path.write_bytes(compress(BAD_ARRAY))
    with pytest.raises(DataError) as info:
        read_all([path])
    assert str(info.value) == (
        f"{path}: not UTF-8: byte 0xff at line 2 column 15 ({place}); JSON text is UTF-8: save "
        "the file as UTF-8 (or as JSON Lines, where such a line is an invalid_utf8 skip)"
    )


@pytest.mark.parametrize(("suffix", "compress", "place"), _compressions(4))
def test_a_bad_utf8_byte_of_a_compressed_text_file_is_placed_in_the_decompressed_text(
    tmp_path, suffix, compress, place
):
    """Before: the skip of `bad.txt.gz` said "(byte 4)" without saying whose byte."""
    path = tmp_path / f"bad.txt{suffix}"
    path.write_bytes(compress(b"abc \xff\xfe"))
    skips = SkipCounter()
    assert read_all([path], skips=skips) == []
    assert skips.examples == {"invalid_utf8": [f"{path} ({place})"]}
