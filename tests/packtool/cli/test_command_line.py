"""The command line a dataset records (`index.json`'s "command", the output's lock) holds no
secret: `--storage-options` credentials were written verbatim into index.json (uploaded with
the dataset) and into the lock record, which a second run printed."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from packtool.cli.command_line import REDACTED, redacted
from packtool.dataset.manifest import read_manifest
from tests.cli import run

ROOT = Path(__file__).resolve().parents[3]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"
SECRET = "hf_SUPERSECRET"
OPTIONS = json.dumps({"hf": {"token": SECRET}})


@pytest.fixture
def locked(monkeypatch):
    """What each run writes into its output's lock (a second writer is shown its command)."""
    from packtool.storage import writing

    notes: list[bytes] = []
    real = writing.take_lock
    monkeypatch.setattr(
        writing, "take_lock", lambda path, note=b"": notes.append(note) or real(path, note)
    )
    return notes


@pytest.mark.parametrize(
    "given",
    [
        ["--storage-options", OPTIONS],
        [f"--storage-options={OPTIONS}"],
        ["--storage-options", OPTIONS, "--storage-options", OPTIONS],
    ],
    ids=["separate", "joined", "twice"],
)
def test_pack_records_no_storage_options_secret(tmp_path, locked, given):
    out = tmp_path / "out"
    code, _, err = run("pack", CORPUS, "-o", out, "--max-len", "512", *given)
    assert code == 0, err
    command = read_manifest(out).command
    assert SECRET not in command
    assert SECRET not in (out / "index.json").read_text()
    assert locked and all(SECRET.encode() not in data for data in locked)
    # what is kept: every other word, and the option with its value hidden
    words = shlex.split(command)
    assert words[:2] == ["packtool", "pack"] and "--max-len" in words
    assert words.count(REDACTED) + sum(w.endswith(f"={REDACTED}") for w in words) == len(
        [g for g in given if g.startswith("--storage-options")]
    )


@pytest.mark.parametrize("to", ["parquet", "megatron"])
def test_tokenize_records_no_secret_in_its_lock(tmp_path, locked, to):
    out = tmp_path / ("t.parquet" if to == "parquet" else "t")
    code, _, err = run("tokenize", CORPUS, "-o", out, "--to", to, "--storage-options", OPTIONS)
    assert code == 0, err
    assert locked and all(SECRET.encode() not in note for note in locked)
    assert all(b"--storage-options" in note for note in locked)  # the command is there
    assert not any(SECRET in p.read_bytes().decode("latin-1") for p in tmp_path.iterdir())


@pytest.mark.parametrize(
    ("arg", "kept", "hidden"),
    [
        ("https://alice:pw123@example.com/c.jsonl", "https://", "alice:pw123"),
        ("s3://KEYID:SECRETKEY@bucket/x", "s3://", "SECRETKEY"),
        ("https://h/c.jsonl?X-Amz-Signature=abc123&x=1", "x=1", "abc123"),
        ("https://acct.blob/c.jsonl?sv=2020&sig=zzz999", "sv=2020", "zzz999"),
        ("https://h/t.json?access_token=tok42", "https://h/t.json", "tok42"),
        ("export HF_TOKEN=hf_abc; module load x", "module load x", "hf_abc"),
        ("--export=ALL,AWS_SECRET_ACCESS_KEY=xyz", "--export=ALL", "xyz"),
        ('export API_KEY="a b c"', "export API_KEY=", "a b c"),
        # a name that starts with the secret word (a reviewer: TOKEN=, PASSWORD= were kept)
        ("export TOKEN=t0k PATH=/bin", "PATH=/bin", "t0k"),
        ("export PASSWORD=hunter2", "export PASSWORD=", "hunter2"),
        ("--export=ALL,SECRET=s3cr3t", "--export=ALL", "s3cr3t"),
        # a quoted piece inside the value (shell-joined): all of it, not up to the quote
        ('export HF_TOKEN="ab"cd9', "export HF_TOKEN=", "cd9"),
        ("export X_TOKEN=ab'c d'e9 Y=1", "Y=1", "e9"),
        # `key` as a whole segment of the NAME, any case, camelCase too
        ("--export=ALL,aws_secret_access_key=xyz", "--export=ALL", "xyz"),
        ("export KEY=k3y", "export KEY=", "k3y"),
        ("export apiKey=k3y HF_TOKEN2=t0k Y=1", "Y=1", "k3y"),
        ("export accessToken=t0k", "export accessToken=", "t0k"),
        # a secret's word inside a NAME without separators (a reviewer: all were kept)
        ("export PGPASSWORD=x9 PATH=/bin", "PATH=/bin", "x9"),
        ("export HFTOKEN=t0k", "export HFTOKEN=", "t0k"),
        ("export ACCESSTOKEN=t0k", "export ACCESSTOKEN=", "t0k"),
        ("export APITOKEN=t0k", "export APITOKEN=", "t0k"),
        ("export AUTHTOKEN=t0k", "export AUTHTOKEN=", "t0k"),
        ("export SECRETKEY=k3y", "export SECRETKEY=", "k3y"),
        ("export AWS_SECRETKEY=k3y", "export AWS_SECRETKEY=", "k3y"),
        ("export DBPASSWORD=pw9", "export DBPASSWORD=", "pw9"),
        ("export GITHUB_PAT=p4t", "export GITHUB_PAT=", "p4t"),
        ("export API_KEYS=k3y MAX_TOKENS=8", "MAX_TOKENS=8", "k3y"),
        ("s3://b/x.parquet?authtoken=t0k", "s3://b/x.parquet", "t0k"),
        ("https://h/x?accesstoken=t0k", "https://h/x", "t0k"),
        ("https://h/x?apitoken=t0k&y=1", "y=1", "t0k"),
        ("https://h/x?sessiontoken=t0k", "https://h/x", "t0k"),
        ("export donkey=3", "export donkey=", "3"),  # kept before: over-hiding is cheaper
        # a bare Hugging Face token, a Bearer value
        ("huggingface-cli login --token hf_" + "a1" * 12, "--token", "hf_a1a1"),
        ("curl -H 'Authorization: Bearer s3cr3t' u", "Authorization: Bearer", "s3cr3t"),
    ],
)
def test_secrets_in_any_argument_are_hidden(arg, kept, hidden):
    (shown,) = redacted([arg])
    assert hidden not in shown
    assert kept in shown and REDACTED in shown


@pytest.mark.parametrize(
    "arg",
    [
        "hf://datasets/org/name@main/data.jsonl",  # a revision, not a user
        "--tokenizer=gpt2",
        "--keep-field=api_key",
        "https://example.com/c.jsonl?page=2",
        "corpus.jsonl",
        "--text-field=key",
        # a plural count, or a Hive partition in a path (a NAME holding a secret's word,
        # `donkey=`, is hidden: missing a secret costs more than over-hiding)
        "s3://b/t/partition_key=3/",
        "export MAX_TOKENS=8 MAX_NEW_TOKENS=9 NUM_KEYS=2 PATH=/bin",
        "https://example.com/c.jsonl?max_tokens=1&page=2",
        "export X=1/HF_TOKEN=2",
        # a secret's word only inside a harmless word: HF's common setting, hidden, cost a
        # Slurm run its --resume line
        "export TOKENIZERS_PARALLELISM=false AUTHOR=me PASSES=3",
        "https://example.com/c.jsonl?design=1",
    ],
)
def test_words_without_a_secret_are_kept(arg):
    assert redacted([arg]) == [arg]


def test_only_the_value_of_storage_options_is_hidden():
    args = ["pack", "c.jsonl", "--storage-options", "{}", "-o", "out"]
    assert redacted(args) == ["pack", "c.jsonl", "--storage-options", REDACTED, "-o", "out"]


def test_a_resume_line_for_a_command_with_a_secret_hidden_is_in_words():
    # Seen: the Slurm `--no-wait` line printed `packtool pack ... --storage-options <redacted>
    # --resume`, which fails when copied; where a secret was hidden it says it in words.
    from packtool.engines.config import resume_command

    kept = shlex.join(redacted(["pack", "c.jsonl", "-o", "out", "--no-wait"]))
    assert resume_command(f"packtool {kept}") == "packtool pack c.jsonl -o out --resume"
    hidden = shlex.join(redacted(["pack", "c.jsonl", "--storage-options", OPTIONS, "-o", "o"]))
    assert REDACTED in hidden and resume_command(f"packtool {hidden}") is None


def test_the_engines_know_the_cli_s_redaction_mark():
    from packtool.engines import config

    assert config.REDACTED == REDACTED


@pytest.mark.parametrize(
    "args",
    [
        ["pack", "c.jsonl", "--password", "s3cr3t", "-o", "out"],
        ["pack", "c.jsonl", "--token", "s3cr3t", "-o", "out"],
        ["pack", "c.jsonl", "--api-key", "s3cr3t", "-o", "out"],
        ["pack", "c.jsonl", "--hf-token", "s3cr3t", "-o", "out"],
        ["pack", "c.jsonl", "-o", "out", "--github-tokens", "s3cr3t"],
    ],
)
def test_the_value_after_a_secret_option_is_hidden(args):
    # Seen: `--password hunter2` as two argv items was recorded verbatim (only `NAME=VALUE`
    # was looked at).
    assert redacted(args) == [REDACTED if a == "s3cr3t" else a for a in args]


@pytest.mark.parametrize(
    "args",
    [
        ["pack", "c.jsonl", "--tokenizer", "gpt2", "-o", "out"],
        ["plan", "index.json", "--tokens", "10B", "--tokens-per-batch", "4096"],
        ["x", "--max-tokens", "4096", "--num-keys", "3", "--total-tokens", "2.5M"],
        # a flag whose name holds a secret's word, then an option: no value to hide
        ["x", "--no-auth", "--resume"],
        ["x", "--token"],
    ],
)
def test_the_value_after_a_harmless_or_count_option_is_kept(args):
    assert redacted(args) == args


@pytest.mark.parametrize(
    ("arg", "kept", "hidden"),
    [
        # a name with hyphens (seen: kept, `-` ended the name)
        ("export HF-TOKEN=abc9 Y=1", "Y=1", "abc9"),
        ("--sbatch-arg=--hf-token=abc9", "--sbatch-arg=--hf-token=", "abc9"),
        ("--api-key=k3y", "--api-key=", "k3y"),
        # an option and its value inside one argument (`--slurm-setup "..."`)
        ("mytool --password hunter2 && make", "&& make", "hunter2"),
        ("mytool --api-key 'a b' x", "mytool --api-key", "a b"),
        # a plural that holds secrets, all of its list (seen: `GITHUB_TOKENS=` kept whole,
        # `API_KEYS=a,b` kept `b`)
        ("export GITHUB_TOKENS=ghp_x,ghp_y", "export GITHUB_TOKENS=", "ghp_y"),
        ("export API_KEYS=a1,b2 Y=1", "Y=1", "b2"),
        ("export SESSION_TOKENS=12ab", "export SESSION_TOKENS=", "12ab"),
        ("--hf-tokens=t1,t2", "--hf-tokens=", "t2"),
        ("https://h/x?access_keys=k1,k2&y=1", "y=1", "k2"),
        # a list stops before the next `NAME=` (Slurm's `--export=A=1,B=2`)
        ("--export=ALL,HF_TOKEN=t0k,PATH=/bin", "PATH=/bin", "t0k"),
        # ... but not before an item that ends in base64's `=` padding (seen: kept)
        ("--export=ALL,GITHUB_TOKENS=ghp_x,dG9rZW4=,PATH=/bin", "PATH=/bin", "dG9rZW4"),
        ("export API_KEYS=abc,c2VjcmV0== Y=1", "Y=1", "c2VjcmV0"),
    ],
)
def test_hyphenated_spaced_and_plural_secrets_are_hidden(arg, kept, hidden):
    (shown,) = redacted([arg])
    assert hidden not in shown
    assert kept in shown and REDACTED in shown


@pytest.mark.parametrize(
    "arg",
    [
        # a plural whose value is a number is a count, whatever comes before it
        "export MAX_TOKENS=4096 NUM_KEYS=3 TOTAL_TOKENS=1e9 MAX_NEW_TOKENS=-1 N_KEYS=2_000",
        "--max-tokens=4096",
        "--tokens=2.5M",
        "--tokenizer-engine=fast",
        "export HF_HOME=/scratch/hf TOKENIZERS_PARALLELISM=false",
        "mytool --max-tokens 512 --tokenizer gpt2 && make",
    ],
)
def test_counts_and_harmless_names_with_a_secret_s_word_are_kept(arg):
    assert redacted([arg]) == [arg]


def test_a_slurm_resume_line_keeps_counts_and_harmless_settings():
    # What a Slurm `--no-wait` run prints must stay copyable when nothing secret is in it.
    from packtool.engines.config import resume_command

    args = [
        "pack", "c.jsonl", "-o", "out", "--engine", "slurm", "--tokenizer", "gpt2",
        "--slurm-setup", "export TOKENIZERS_PARALLELISM=false MAX_TOKENS=4096",
        "--sbatch-arg=--export=ALL,NUM_KEYS=3", "--no-wait",
    ]  # fmt: skip
    assert redacted(args) == args
    line = resume_command(shlex.join(["packtool", *redacted(args)]))
    assert line is not None and shlex.split(line) == ["packtool", *args[:-1], "--resume"]


@pytest.fixture
def deadline():
    """Fails a redaction that has not ended in 5 s: a pattern that retries each word of a long
    argument (seen: 0.46 s at 10,000 characters, 15 s at 40,000, growing as the square) would
    take minutes on the 200,000 characters below, a linear one takes milliseconds."""
    import signal

    def expired(signum, frame):
        raise TimeoutError("redaction still running after 5 s")

    before = signal.signal(signal.SIGALRM, expired)
    signal.alarm(5)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, before)


@pytest.mark.parametrize(
    "long",
    [
        "-".join(["word"] * 40_000),  # hyphenated words: a URL's scheme?
        "a.b+c-" * 33_000,  # all a scheme's characters, no `://`
        "tokenpart-" * 20_000,  # a secret's name (`NAME=`), no `=`
        "--" + "tokenpart-" * 20_000 + " --flag",  # a secret's option, no value
        "https://h/x?" + "token." * 33_000,  # a secret's query parameter, no `=`
    ],
    ids=["hyphenated", "scheme-characters", "assigned", "spaced", "query"],
)
def test_a_long_argument_is_redacted_in_one_pass(deadline, long):
    (shown,) = redacted([f"{long} https://me:pw1@host/x HF_TOKEN=pw2 --password pw3"])
    assert shown.startswith(long)
    assert "pw1" not in shown and "pw2" not in shown and "pw3" not in shown
    assert shown.endswith(f"https://{REDACTED}@host/x HF_TOKEN={REDACTED} --password {REDACTED}")


@pytest.mark.parametrize(
    ("args", "hidden"),
    [
        (["pack", "c.jsonl", "--password", "-hunter2", "-o", "out"], "-hunter2"),
        (["pack", "c.jsonl", "--token", "-abc", "-o", "out"], "-abc"),
        (["x", "--api-key", "-k3y"], "-k3y"),
        (["x", "--hf-token", "-"], "-"),  # a lone dash is a value too
        (["x", "--no-auth", "-v"], "-v"),  # a short option after one: hidden (it may be a value)
    ],
)
def test_a_value_starting_with_a_dash_after_a_secret_option_is_hidden(args, hidden):
    # Seen: `--password -hunter2` was recorded verbatim: `-h...` was taken for a flag. The next
    # item is a secret option's value unless it is a long option (`--x`, or `--`).
    assert redacted(args) == [REDACTED if a == hidden else a for a in args]


@pytest.mark.parametrize(
    "args",
    [
        ["x", "--password", "--verbose", "-o", "out"],
        ["x", "--no-auth", "--resume"],
        ["x", "--token", "--"],
        ["x", "--max-tokens", "-1"],  # a count
    ],
)
def test_a_long_option_after_a_secret_option_is_not_its_value(args):
    assert redacted(args) == args


@pytest.mark.parametrize(
    ("arg", "kept", "hidden"),
    [
        # a `--slurm-setup` line: the value after a secret option starts with `-`
        ("mytool --password -hunter2 && make", "mytool --password ", "-hunter2"),
        ("mytool --token -abc --verbose", "--verbose", "-abc"),
        ("mytool -token -abc x", "x", "-abc"),
        # an escaped space is part of the value (seen: ` b` shown)
        ("export HF_TOKEN=a\\ b; make", "; make", " b"),
        ("export HF_TOKEN=a\\ b\\ cz Y=1", "Y=1", "cz"),
        ("mytool --password a\\ b && make", "&& make", " b"),
        ('export HF_TOKEN="a\\" b" Y=1', "Y=1", " b"),  # an escaped quote inside quotes
    ],
)
def test_dash_values_and_escaped_spaces_in_one_argument_are_hidden(arg, kept, hidden):
    (shown,) = redacted([arg])
    assert hidden not in shown, shown
    assert kept in shown and REDACTED in shown


@pytest.mark.parametrize(
    "arg",
    [
        "mytool --password --verbose && make",
        "mytool --no-auth --resume",
        "mytool --max-tokens -1 x",
    ],
)
def test_a_long_option_after_a_secret_option_in_one_argument_is_kept(arg):
    assert redacted([arg]) == [arg]
