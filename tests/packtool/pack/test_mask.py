"""A loss mask through pack: never split, truncated consistently, counted; both engines, resume,
verify, inspect and stats agree."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packtool.audit.inspect import inspect_dataset
from packtool.audit.verify import verify_dataset
from packtool.dataset.manifest import read_manifest
from packtool.dataset.shards import ShardConfig
from packtool.engines import records, worker
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.output_folder import staging_folder
from packtool.errors import AlreadyComplete, ConfigError
from packtool.pack.chunk import PackConfig, pack_table
from packtool.pack.tail import TailPolicy
from packtool.stats.lengths import StatsConfig, compute_stats
from packtool.stats.report import render_report
from tests.cli import one_error_line, run


def conversations(n: int, seed: int, vocab: int = 250) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids and loss masks of `n` made-up conversations: 1-4 turns, each a masked prompt and
    a supervised answer; some long, some with nothing supervised (every 50th)."""
    rng = np.random.default_rng(seed)
    ids, masks = [], []
    for i in range(n):
        toks, mask = [], []
        for _ in range(int(rng.integers(1, 5))):
            p, a = int(rng.integers(2, 30)), int(rng.integers(1, 40))
            toks += rng.integers(0, vocab, p + a).tolist()
            mask += [0] * p + [int(i % 50 != 7)] * a
        ids.append(toks)
        masks.append(mask)
    return ids, masks


def write_sft(folder: Path, n: int = 600, seed: int = 0, files: int = 2) -> list[Path]:
    """Pre-tokenized Parquet (input_ids + labels), `files` files of several row groups."""
    folder.mkdir(parents=True, exist_ok=True)
    ids, masks = conversations(n, seed)
    labels = [
        [t if m else -100 for t, m in zip(d, k, strict=True)]
        for d, k in zip(ids, masks, strict=True)
    ]
    paths = []
    for f in range(files):
        part = slice(f * n // files, (f + 1) * n // files)
        path = folder / f"sft-{f}.parquet"
        pq.write_table(
            pa.table({"input_ids": ids[part], "labels": labels[part]}), path, row_group_size=50
        )
        paths.append(path)
    return paths


def tokenized(ids, masks) -> pa.Table:
    return pa.table(
        {
            "doc_id": pa.array(np.arange(len(ids)), pa.int64()),
            "input_ids": pa.array(ids, pa.list_(pa.uint16())),
            "length": pa.array([len(d) for d in ids], pa.int32()),
            "loss_mask": pa.array(masks, pa.list_(pa.uint8())),
        }
    )


def pieces(table: pa.Table) -> dict[int, tuple[list[int], list[int], int]]:
    """doc id -> (ids, mask, chunk) of every packed piece (a doc id seen twice fails)."""
    out = {}
    for row in table.to_pylist():
        off = row["doc_offsets"]
        for k, (doc, chunk) in enumerate(zip(row["doc_ids"], row["doc_chunks"], strict=True)):
            assert doc not in out, "a masked document was split"
            a, b = off[k], off[k + 1]
            out[doc] = (row["input_ids"][a:b], list(row["loss_mask"][a:b]), chunk)
    return out


def test_exact_small_chunk():
    ids = [[1, 2, 3, 4], [5, 6, 7], [8, 9, 10, 11, 12, 13], [14, 15]]
    masks = [[0, 0, 1, 1], [0, 1, 1], [0, 0, 0, 0, 0, 1], [0, 0]]
    packed = pack_table(tokenized(ids, masks), PackConfig(max_len=5, long_docs="truncate"))
    assert pieces(packed.table) == {
        0: ([1, 2, 3, 4], [0, 0, 1, 1], 0),
        1: ([5, 6, 7], [0, 1, 1], 0),
    }
    c = packed.counts
    # Document 2 lost its only supervised token to truncation, document 3 never had one.
    assert (c.documents_packed, c.documents_dropped, c.documents_unsupervised) == (2, 2, 2)
    assert (c.documents_truncated, c.tokens_truncated) == (0, 0)
    assert (c.tokens_out, c.tokens_dropped, c.tokens_supervised) == (7, 8, 4)
    assert c.tokens_in == c.tokens_out + c.tokens_truncated + c.tokens_dropped


def test_a_document_supervised_only_at_its_first_token_is_dropped_as_unsupervised():
    """Labels shift: the loader never makes a document's first token a target, so one whose
    only supervised token is its first trains on nothing (r6: packed, and verify said OK)."""
    ids = [[1, 2, 3], [4, 5, 6], [7, 8, 9, 10, 11]]
    masks = [[1, 0, 0], [1, 1, 0], [1, 0, 0, 0, 1]]
    packed = pack_table(tokenized(ids, masks), PackConfig(max_len=4, long_docs="truncate"))
    assert pieces(packed.table) == {1: ([4, 5, 6], [1, 1, 0], 0)}
    c = packed.counts
    # Document 2 kept only its first token's supervision after truncation: dropped too.
    assert (c.documents_packed, c.documents_unsupervised, c.tokens_supervised) == (1, 2, 2)
    assert c.tokens_in == c.tokens_out + c.tokens_truncated + c.tokens_dropped


def test_pack_skips_what_verify_would_refuse(tmp_path):
    """r6: labels supervising only a document's first token were packed, and verify passed.
    The last document keeps only its first token's supervision once truncated to 4: dropped
    by pack, and so projected by stats."""
    path = tmp_path / "pretok.parquet"
    pq.write_table(
        pa.table(
            {
                "input_ids": [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22], [30, 31, 32, 33, 34]],
                "labels": [
                    [5, -100, -100, -100, -100],
                    [-100, 11, 12],
                    [20, -100, -100],
                    [30, -100, -100, -100, 34],
                ],
            }
        ),
        path,
    )
    pack = PackConfig(max_len=4, long_docs="truncate")
    summary = run_pack(config(tmp_path / "out", [path], pack=pack))
    assert summary.skips == {"no_supervised_tokens": 2}
    c = summary.counts
    assert (c.documents_unsupervised, c.documents_packed, c.tokens_supervised) == (1, 1, 2)
    assert verify_dataset(tmp_path / "out").supervised_tokens == 2
    at = compute_stats([path], StatsConfig(max_len=4, candidates=(4,))).supervised.at[4]
    assert (at.documents_unsupervised, at.supervised_tokens) == (1, 2)


def test_split_is_refused_for_masked_data_and_left_out_truncates():
    table = tokenized([[1, 2, 3, 4, 5, 6]], [[0, 1, 1, 1, 1, 1]])
    with pytest.raises(ConfigError, match="long_docs='split' cuts documents across rows"):
        pack_table(table, PackConfig(max_len=4, long_docs="split"))
    c = pack_table(table, PackConfig(max_len=4)).counts  # long_docs None: by the columns
    assert (c.documents_truncated, c.tokens_truncated, c.documents_split) == (1, 2, 0)


@settings(max_examples=60, deadline=None)
@given(
    docs=st.lists(
        st.lists(st.tuples(st.integers(0, 99), st.integers(0, 1)), min_size=1, max_size=30),
        min_size=1,
        max_size=40,
    ),
    max_len=st.integers(2, 24),
    policy=st.sampled_from(["truncate", "drop"]),
    seed=st.integers(0, 10),
)
def test_random_masks_travel_with_their_tokens(docs, max_len, policy, seed):
    ids = [[t for t, _ in d] for d in docs]
    masks = [[m for _, m in d] for d in docs]
    packed = pack_table(
        tokenized(ids, masks), PackConfig(max_len=max_len, long_docs=policy, seed=seed)
    )
    got = pieces(packed.table)
    expected = {}
    for i, (d, m) in enumerate(zip(ids, masks, strict=True)):
        if policy == "drop" and len(d) > max_len:
            continue
        if sum(m[1:max_len]) == 0:
            continue  # nothing supervised left past the first token: dropped and counted
        expected[i] = (d[:max_len], m[:max_len], 0)
    assert got == expected
    c = packed.counts
    assert c.tokens_in == c.tokens_out + c.tokens_truncated + c.tokens_dropped
    assert c.tokens_supervised == sum(sum(m) for _, m, _ in got.values())
    assert c.documents_packed == len(got)
    assert c.documents_in == c.documents_packed + c.documents_dropped + c.documents_empty
    rows = packed.table.column("input_ids").to_pylist()
    assert all(len(r) <= max_len for r in rows)


@pytest.mark.parametrize(
    "mask_type", [pa.list_(pa.uint8()), pa.binary(), pa.large_list(pa.int64())]
)
def test_a_tail_keeps_the_masks_type_and_a_list_mask_packs_as_a_binary_one(mask_type):
    """A list mask (which `token_values` reads as it reads bytes) with `tail=` was pyarrow's
    "Unsupported cast from binary to list": the tail built its mask as bytes, the shards'
    storage, then forced the table's list type on it."""
    ids, masks = conversations(120, seed=3)
    base = tokenized(ids, masks)
    binary = base.set_column(3, "loss_mask", pa.array([bytes(m) for m in masks], pa.binary()))
    table = (
        binary
        if mask_type == pa.binary()
        else base.set_column(3, "loss_mask", base.column("loss_mask").cast(mask_type))
    )
    pack = PackConfig(max_len=96, long_docs="truncate")

    def chunks(t: pa.Table):
        first = pack_table(t.slice(0, 60), pack, chunk_index=(0, 0), tail=TailPolicy())
        second = pack_table(
            t.slice(60), pack, chunk_index=(0, 1), carry=first.tail, tail=TailPolicy()
        )
        last = pack_table(t.slice(0, 0), pack, chunk_index=(0, 2), carry=second.tail)
        return first, second, last

    got, want = chunks(table), chunks(binary)
    for a, b in zip(got, want, strict=True):
        assert a.table.equals(b.table) and a.counts == b.counts
    for a, b in zip(got[:2], want[:2], strict=True):
        assert a.tail is not None and a.tail.schema.field("loss_mask").type == mask_type
        masks_of = [[list(m) for m in t.column("loss_mask").to_pylist()] for t in (a.tail, b.tail)]
        assert masks_of[0] == masks_of[1]
        assert a.tail.drop_columns(["loss_mask"]).equals(b.tail.drop_columns(["loss_mask"]))


def config(out: Path, inputs, **kw) -> RunConfig:
    kw.setdefault("pack", PackConfig(max_len=128, long_docs="truncate"))
    kw.setdefault("shards", ShardConfig(shard_rows=40, row_group_rows=16))
    kw.setdefault("chunk_docs", 150)
    return RunConfig(inputs=tuple(map(str, inputs)), out_dir=str(out), progress=False, **kw)


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


@pytest.fixture
def sft(tmp_path) -> list[Path]:
    return write_sft(tmp_path / "sft")


def test_local_engine_end_to_end(sft, tmp_path):
    summary = run_pack(config(tmp_path / "out", sft))
    manifest = read_manifest(tmp_path / "out")
    assert (
        manifest.columns[-2:] == ("loss_mask", "seq_lengths") and manifest.long_docs == "truncate"
    )
    c = manifest.counts
    assert c["tokens_supervised"] == summary.counts.tokens_supervised > 0
    assert c["documents_skipped"] == 12  # every 50th conversation has nothing supervised
    assert summary.skips == {"no_supervised_tokens": 12}
    report = verify_dataset(tmp_path / "out")
    assert report.supervised_tokens == c["tokens_supervised"]
    # Every conversation that remains is there once, with its ids and mask, cut at max_len.
    ids, masks = conversations(600, 0)
    kept = [i for i in range(600) if i % 50 != 7]
    table = pq.read_table(sorted(str(p) for p in (tmp_path / "out").glob("shard-*.parquet")))
    got = pieces(table)
    by_order = [got[d] for d in sorted(got)]
    expected = [(ids[i][:128], masks[i][:128], 0) for i in kept if sum(masks[i][:128])]
    assert by_order == expected
    assert "supervised efficiency" in summary.format(128)


def _stopped_after_two_partitions(monkeypatch, cfg) -> None:
    """Run `cfg` until two of its partitions are finished, then stop it as Ctrl-C does."""
    staging = staging_folder(cfg.out_dir)
    real = worker.write_chunk

    def crash_in_the_third_partition(writer, packed):
        if len(records.finished(staging)) == 2:
            raise KeyboardInterrupt
        return real(writer, packed)

    monkeypatch.setattr(worker, "write_chunk", crash_in_the_third_partition)
    with pytest.raises(KeyboardInterrupt):
        run_pack(cfg)
    monkeypatch.setattr(worker, "write_chunk", real)


def test_resume_gives_the_same_bytes(sft, tmp_path, monkeypatch):
    kw = {"partition_size": 8_000, "workers": 1}  # the files cut between row groups
    whole = run_pack(config(tmp_path / "whole", sft, **kw))
    assert whole.partitions >= 4
    _stopped_after_two_partitions(monkeypatch, config(tmp_path / "cut", sft, **kw))
    summary = run_pack(config(tmp_path / "cut", sft, resume=True, **kw))
    assert summary.resumed_partitions == 2
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")
    assert read_manifest(tmp_path / "cut").to_dict() == read_manifest(tmp_path / "whole").to_dict()


def test_ray_engine_writes_the_same_bytes(ray_session, sft, tmp_path):
    from packtool.engines.ray import RayConfig, run_pack_ray

    want = run_pack(config(tmp_path / "local", sft))
    got = run_pack_ray(config(tmp_path / "ray", sft), RayConfig())
    assert shard_bytes(tmp_path / "ray") == shard_bytes(tmp_path / "local")
    a = json.loads((tmp_path / "ray" / "index.json").read_text())
    b = json.loads((tmp_path / "local" / "index.json").read_text())
    assert {k: v for k, v in a.items() if k != "command"} == {
        k: v for k, v in b.items() if k != "command"
    }
    assert got.counts == want.counts and got.columns == ("loss_mask", "seq_lengths")


def test_cli_defaults_to_truncate_and_refuses_split(sft, tmp_path):
    code, out, err = run("pack", *sft, "-o", tmp_path / "out", "--max-len", 128)
    assert code == 0, err
    assert "supervised:" in out and "supervised efficiency" in out
    assert read_manifest(tmp_path / "out").long_docs == "truncate"
    code, out, err = run(
        "pack", *sft, "-o", tmp_path / "x", "--max-len", 128, "--long-docs", "split"
    )
    assert code == 1 and "--long-docs split cuts documents" in one_error_line(err)
    assert not (tmp_path / "x").exists()  # refused before the output folder was made


def test_mixed_inputs_are_a_one_line_error(sft, tmp_path):
    plain = tmp_path / "plain.parquet"
    pq.write_table(pa.table({"input_ids": [[1, 2, 3]]}), plain)
    code, _, err = run("pack", sft[0], plain, "-o", tmp_path / "out")
    assert code == 1 and "has no labels or loss_mask, unlike" in one_error_line(err)
    code, _, err = run("stats", sft[0], plain)
    assert code == 1 and "a dataset is one kind" in one_error_line(err)


def test_inspect_marks_the_supervised_spans(tmp_path):
    path = tmp_path / "one.parquet"
    ids = [[10, 11, 12, 13, 14, 15], [20, 21, 22]]
    labels = [[-100, -100, 12, 13, -100, 15], [-100, 21, 22]]
    pq.write_table(pa.table({"input_ids": ids, "labels": labels}), path)
    run_pack(config(tmp_path / "out", [path], pack=PackConfig(max_len=16, long_docs="truncate")))
    view = inspect_dataset(tmp_path / "out", row=0)
    docs = {d.doc_id: d for d in view.row.documents}
    first = docs[0].start
    assert docs[0].supervised == 3 and docs[0].spans == (
        (first + 2, first + 4),
        (first + 5, first + 6),
    )
    assert docs[1].supervised == 2
    text = view.format()
    assert "columns     input_ids, doc_offsets, doc_ids, doc_chunks, loss_mask, seq_lengths" in text
    assert "supervised tokens" in text and "loss mask |" in text
    assert view.row.to_dict()["documents"][0]["spans"]


def test_stats_projects_what_pack_does(sft, tmp_path):
    summary = run_pack(config(tmp_path / "out", sft, chunk_docs=10_000))
    stats = compute_stats(sft, StatsConfig(max_len=128, candidates=(128, 256)))
    at = stats.supervised.at[128]
    assert at.supervised_tokens == summary.counts.tokens_supervised
    assert at.tokens == summary.counts.tokens_out
    assert at.rows == summary.counts.rows  # one chunk: the same FFD
    assert at.supervised_efficiency == pytest.approx(summary.supervised_efficiency)
    assert stats.supervised.at[256].supervised_tokens >= at.supervised_tokens
    report = render_report(stats)
    assert "supervised tokens" in report and "supervised eff." in report
    # Tokenized once, the same figures (only the length and mask columns are read).
    code, _, err = run("tokenize", *sft, "-o", tmp_path / "tok.parquet")
    assert code == 0, err
    again = compute_stats(
        [tmp_path / "tok.parquet"], StatsConfig(max_len=128, candidates=(128, 256))
    )
    assert again.supervised.to_dict() == stats.supervised.to_dict()


def test_a_library_run_of_masked_inputs_truncates_as_the_cli_does(sft, tmp_path):
    """`PackConfig(long_docs=None)`, the default, decides by the inputs as `--long-docs` left out
    does: `truncate` for data with a loss mask (a library run was refused, in the CLI's words)."""
    summary = run_pack(config(tmp_path / "lib", sft, pack=PackConfig(max_len=128)))
    assert summary.counts.documents_truncated > 0
    code, _, err = run(
        "pack", *sft, "-o", tmp_path / "cli", "--max-len", 128, "--shard-rows", 40,
        "--row-group-rows", 16, "--chunk-docs", 150,
    )  # fmt: skip
    assert code == 0, err
    assert shard_bytes(tmp_path / "lib") == shard_bytes(tmp_path / "cli")
    a, b = (json.loads((tmp_path / o / "index.json").read_text()) for o in ("lib", "cli"))
    assert a["long_docs"] == "truncate"
    assert {k: v for k, v in a.items() if k != "command"} == {
        k: v for k, v in b.items() if k != "command"
    }


def test_a_library_run_names_long_docs_not_the_cli_flag(sft, tmp_path):
    with pytest.raises(ConfigError) as err:
        run_pack(config(tmp_path / "out", sft, pack=PackConfig(max_len=128, long_docs="split")))
    assert str(err.value).startswith("long_docs='split' cuts documents across rows")
    assert "use long_docs='truncate' or 'drop'" in str(err.value) and "--" not in str(err.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("masked", [True, False])
def test_a_run_recorded_with_an_explicit_policy_resumes_with_the_default(
    masked, tmp_path, monkeypatch
):
    """A run state saved with `long_docs` written out (as every state before the default decided
    by the inputs: the CLI wrote `truncate` or `split`) is resumed by a run that leaves it out."""
    paths = write_sft(tmp_path / "in")
    if not masked:  # the same ids, no labels
        for p in paths:
            pq.write_table(pq.read_table(p, columns=["input_ids"]), p, row_group_size=50)
    old = PackConfig(max_len=128, long_docs="truncate" if masked else "split")
    kw = {"partition_size": 8_000, "workers": 1}
    run_pack(config(tmp_path / "whole", paths, pack=old, **kw))
    _stopped_after_two_partitions(monkeypatch, config(tmp_path / "cut", paths, pack=old, **kw))
    new = PackConfig(max_len=128)
    summary = run_pack(config(tmp_path / "cut", paths, pack=new, resume=True, **kw))
    assert summary.resumed_partitions == 2
    assert shard_bytes(tmp_path / "cut") == shard_bytes(tmp_path / "whole")
    assert read_manifest(tmp_path / "cut").to_dict() == read_manifest(tmp_path / "whole").to_dict()
    # Finished, it is complete for the default too (index.json's digest is the same).
    with pytest.raises(AlreadyComplete):
        run_pack(config(tmp_path / "cut", paths, pack=new, resume=True, **kw))
