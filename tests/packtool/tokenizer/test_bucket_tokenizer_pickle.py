"""A tokenizer read from a bucket, pickled to the workers with the run's context: it held its
folder as a `UPath` carrying the run's storage options, so the key and secret of
`--storage-options` went into every pickle of the context, and the Slurm engine writes that
pickle to a file (`context.pkl` in the staging folder, or in `.packtool-slurm/` in the current
folder for a bucket output), readable there for the run's life and a detached run's."""

from __future__ import annotations

import json
import pickle

from packtool.storage import remote
from packtool.tokenizer.tokenizers import load_tokenizer
from tests.packtool.tokenizer_shapes import build

KEY, SECRET = "AKIDPICKLEMARK", "SECRETPICKLEMARK42"


def test_a_bucket_tokenizer_pickles_without_the_run_s_credentials(s3_server, tmp_path, monkeypatch):
    import boto3

    local = build("gpt2", tmp_path / "tok")
    boto3.client("s3").create_bucket(Bucket="pickled-tok")
    boto3.client("s3").upload_file(str(local), "pickled-tok", "tok/tokenizer.json")
    options = {"s3": {"key": KEY, "secret": SECRET, "endpoint_url": s3_server}}
    monkeypatch.setenv(remote.OPTIONS_ENV, json.dumps(options))
    tok = load_tokenizer("s3://pickled-tok/tok/tokenizer.json")
    assert tok.folder.storage_options["secret"] == SECRET  # its own reads reach the store

    blob = pickle.dumps(tok)  # what `pickle.dumps(run.context)` holds of it
    assert SECRET.encode() not in blob and KEY.encode() not in blob

    # A worker's copy takes the options of its own environment (forwarded to every engine's
    # workers): its folder still reads the bucket (a chat template's tokenizer_config.json).
    again = pickle.loads(blob)
    assert again.folder.storage_options["secret"] == SECRET
    assert str(again.folder) == str(tok.folder)
    assert (again.folder / "tokenizer.json").read_bytes() == local.read_bytes()
    texts = ["hello there", "a second text"]
    assert [a.tolist() for a in again.encode_batch(texts)] == [
        a.tolist() for a in tok.encode_batch(texts)
    ]
