"""packtool shards through Hugging Face `datasets` and the collators that read them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from loader import PackedDataset
from loader.hf import RowCollator, hf_dataset, seq_lengths_table
from loader.testing import write_dataset
from packtool.dataset.manifest import read_manifest
from packtool.errors import ConfigError, DataError
from tests.loader.hf_helpers import (
    one_torch_thread,  # noqa: F401  (autouse: one torch thread)
    random_rows,
)

SAMPLE = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    path = tmp_path_factory.mktemp("hfd") / "ds"
    write_dataset(path, random_rows(9, seed=4), max_len=48, rows_per_shard=4, row_group_rows=2)
    return path


def stored_rows(path):
    m = read_manifest(path)
    return pa.concat_tables(pq.read_table(path / s.file) for s in m.shards).to_pylist()


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=5), min_size=1, max_size=8),
    cut=st.integers(0, 7),
)
def test_seq_lengths_are_each_rows_document_lengths(rows, cut):
    offsets = [np.concatenate([[0], np.cumsum(r)]).tolist() for r in rows]
    arr = pa.array(offsets, pa.list_(pa.int32()))
    cut = min(cut, len(rows) - 1)
    chunked = pa.chunked_array([arr.slice(0, cut), arr.slice(cut)])  # sliced, several chunks
    assert seq_lengths_table(chunked).to_pylist() == rows
    assert seq_lengths_table(arr).type == pa.list_(pa.int32())


def test_hf_dataset_adds_seq_lengths_to_the_stored_rows(small, tmp_path):
    ds = hf_dataset(small, cache_dir=tmp_path / "c")
    want = stored_rows(small)
    assert len(ds) == len(want) == 9
    assert ds.column_names == ["input_ids", "doc_offsets", "doc_ids", "doc_chunks", "seq_lengths"]
    for got, row in zip(ds, want, strict=True):
        assert got["input_ids"] == row["input_ids"]
        assert got["seq_lengths"] == np.diff(row["doc_offsets"]).tolist()
    streamed = list(hf_dataset(small, streaming=True))
    assert [r["seq_lengths"] for r in streamed] == ds["seq_lengths"]
    assert [r["input_ids"] for r in streamed] == ds["input_ids"]


def test_load_dataset_on_the_output_folder_reads_the_listed_shards(tmp_path):
    import datasets

    from packtool.cli.commands import cli

    out = tmp_path / "packed"
    args = ["pack", str(SAMPLE), "-o", str(out), "--max-len", "2048", "--shard-rows", "400"]
    result = CliRunner().invoke(cli, [*args, "--workers", "1"])
    assert result.exit_code == 0, result.output
    m = read_manifest(out)
    assert len(m.shards) >= 3 and (out / "index.json").exists()
    # As users type it: the folder alone; index.json beside the shards is not read as data.
    ds = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "c"))
    assert len(ds) == m.num_rows
    assert (
        ds.column_names
        == [*m.columns]
        == [
            "input_ids",
            "doc_offsets",
            "doc_ids",
            "doc_chunks",
            "seq_lengths",
        ]
    )
    assert sum(len(r) for r in ds["input_ids"]) == m.num_tokens
    assert ds["seq_lengths"] == [np.diff(o).tolist() for o in ds["doc_offsets"]]
    view = hf_dataset(out, cache_dir=tmp_path / "c")
    assert view.column_names == ds.column_names  # stored: passed through, nothing added
    assert view["input_ids"] == ds["input_ids"]  # index.json's shard order is the folder's
    assert view["seq_lengths"] == ds["seq_lengths"]
    # The parquet builder given the folder takes every file in it, index.json included: it
    # needs the data files named (datasets skips README.md, dataset_info.json and such only).
    cache = str(tmp_path / "c")
    with pytest.raises(Exception, match="magic bytes"):
        datasets.load_dataset("parquet", data_dir=str(out), split="train", cache_dir=cache)
    for kwargs in ({"data_dir": str(out), "data_files": "*.parquet"}, {"data_files": files(out)}):
        got = datasets.load_dataset("parquet", split="train", cache_dir=cache, **kwargs)
        assert got["input_ids"] == ds["input_ids"] and got["seq_lengths"] == ds["seq_lengths"]


def files(out):
    return [str(out / s.file) for s in read_manifest(out).shards]


@pytest.mark.parametrize("damage", ["swapped", "missing", "cut_short"])
def test_hf_dataset_checks_the_shards_as_the_loader_does(small, tmp_path, damage):
    # hf_dataset handed the files to datasets unchecked: a shard of another pack under the
    # listed name loaded silently, a missing one was datasets' FileNotFoundError, a cut-short
    # one a long DatasetGenerationError traceback after the rows before it.
    import shutil

    path = tmp_path / "ds"
    shutil.copytree(small, path)
    shard = path / read_manifest(path).shards[1].file
    if damage == "swapped":  # the same-named shard of another dataset (other rows)
        other = tmp_path / "other"
        write_dataset(other, random_rows(9, seed=5), max_len=48, rows_per_shard=4)
        shutil.copy(other / shard.name, shard)
    elif damage == "missing":
        shard.unlink()
    else:
        shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(DataError) as loader_error:
        PackedDataset(path, rows_per_batch=1)
    with pytest.raises(DataError) as hf_error:
        hf_dataset(path, cache_dir=tmp_path / "c")
    message = str(hf_error.value)
    assert message == str(loader_error.value) and "\n" not in message
    assert message.startswith(str(shard))
    assert ("is missing" if damage == "missing" else "but index.json says") in message
    with pytest.raises(DataError, match=re.escape(message)):
        hf_dataset(path, streaming=True)


def test_hf_dataset_derives_seq_lengths_for_older_datasets(small, tmp_path):
    import datasets

    old = datasets.load_dataset(str(small), split="train", cache_dir=str(tmp_path / "c"))
    assert "seq_lengths" not in old.column_names  # packed before pack stored it
    view = hf_dataset(small, cache_dir=tmp_path / "c")
    assert view["seq_lengths"] == [np.diff(o).tolist() for o in old["doc_offsets"]]


def test_row_collator_gives_the_loaders_batch(small, tmp_path):
    rows = hf_dataset(small, cache_dir=tmp_path / "c").select(range(3))
    want = next(iter(PackedDataset(small, rows_per_batch=3, layout="hf", shuffle=False)))
    for features in (list(rows), [{k: r[k] for k in ("input_ids", "doc_offsets")} for r in rows]):
        got = RowCollator()(features)
        assert got.keys() == want.keys()
        for k, v in want.items():
            assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k


def test_row_collator_refuses_rows_without_lengths():
    with pytest.raises(ConfigError, match="remove_unused_columns=False"):
        RowCollator()([{"input_ids": [1, 2, 3]}])
    with pytest.raises(ConfigError, match="do not add up"):
        RowCollator()([{"input_ids": [1, 2, 3], "seq_lengths": [2]}])
    # totals that agree across rows: a 4-token document across the two rows was collated
    rows = [{"input_ids": [1, 2, 3], "seq_lengths": [1]}, {"input_ids": [4, 5], "seq_lengths": [4]}]
    with pytest.raises(ConfigError, match=r"row 0: its document lengths \(1 tokens\)"):
        RowCollator()(rows)
    with pytest.raises(ConfigError, match=r"row 0: document lengths must be >= 1, got \[3, 0\]"):
        RowCollator()([{"input_ids": [1, 2, 3], "seq_lengths": [3, 0]}])


def test_row_collator_refuses_rows_it_cannot_read_in_one_line():
    # Before: a row without input_ids, or rows with mixed length keys, were a bare KeyError;
    # float ids (1.5) were truncated to 1 without a word and negative ids went through.
    with pytest.raises(ConfigError, match="row 0 has no input_ids"):
        RowCollator()([{"seq_lengths": [2]}])
    mixed = [
        {"input_ids": [1, 2], "seq_lengths": [2]},
        {"input_ids": [1, 2], "doc_offsets": [0, 2]},
    ]
    with pytest.raises(ConfigError, match="row 1 has no seq_lengths"):
        RowCollator()(mixed)
    for ids, match in (
        ([1.5, 2], "row 0: input_ids must be integers, got dtype float64"),
        ([-1, 2], "row 0: token id -1 is not in 0..2"),
        ([2**64, 2], f"row 0: token id {2**64} is not in 0..2"),
    ):
        with pytest.raises(DataError, match=re.escape(match)):
            RowCollator()([{"input_ids": ids, "seq_lengths": [2]}])


@pytest.mark.parametrize("key", ["loss_mask", "labels"])
def test_row_collator_refuses_rows_that_disagree_on_their_targets(key):
    """Row 0 with a loss_mask (or labels) and a later row without: a bare KeyError before; a
    later row with one that row 0 lacks would have had it ignored (trained on every token)."""
    target = {"loss_mask": b"\x00\x01\x01", "labels": [-100, 6, 7]}[key]
    masked = {"input_ids": [5, 6, 7], "seq_lengths": [3], key: target}
    plain = {"input_ids": [8, 9], "seq_lengths": [2]}
    for rows, match in (
        ([masked, plain], rf"^row 1 has no {key} \(its keys: \['input_ids', 'seq_lengths'\]\)"),
        ([masked, {**plain, key: None}], rf"^row 1 has no {key} "),
        ([plain, masked], rf"^row 1 has {key} but row 0 has neither loss_mask nor labels"),
    ):
        with pytest.raises(ConfigError, match=match) as info:
            RowCollator()(rows)
        assert "\n" not in str(info.value)
    both = RowCollator()(
        [masked, {**plain, key: {"loss_mask": b"\x01\x01", "labels": [8, 9]}[key]}]
    )
    assert both["labels"].tolist() == [[-100, 6, 7, -100, 9]]


def test_trl_padding_free_collator_on_packtool_rows_equals_the_loader(small, tmp_path):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    rows = list(hf_dataset(small, cache_dir=tmp_path / "c").select(range(3)))
    want = next(iter(PackedDataset(small, rows_per_batch=3, layout="hf", shuffle=False)))
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    with_lengths = trl(
        [{"input_ids": r["input_ids"], "seq_lengths": r["seq_lengths"]} for r in rows]
    )
    for k in ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k"):
        assert torch.equal(with_lengths[k], want[k]), k
    assert with_lengths["max_length_q"] == want["max_length_q"]
    # The stored rows alone: every row read as one document (what the seq_lengths column fixes).
    without = trl([{"input_ids": r["input_ids"]} for r in rows])
    assert len(without["cu_seq_lens_q"]) == 4 < len(want["cu_seq_lens_q"])


def test_transformers_flattening_collator_on_stored_rows_mixes_documents(small, tmp_path):
    from transformers import DataCollatorWithFlattening

    rows = list(hf_dataset(small, cache_dir=tmp_path / "c").select(range(3)))
    want = next(iter(PackedDataset(small, rows_per_batch=3, layout="hf", shuffle=False)))
    flat = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    mixed = flat([{"input_ids": r["input_ids"]} for r in rows])
    assert len(mixed["cu_seq_lens_q"]) == 4 < len(want["cu_seq_lens_q"])
    docs = [
        {"input_ids": r["input_ids"][a:b]}
        for r in rows
        for a, b in zip(r["doc_offsets"], r["doc_offsets"][1:], strict=False)
    ]
    for k, v in flat(docs).items():  # given the documents, it is packtool's batch
        assert torch.equal(v, want[k]) if isinstance(v, torch.Tensor) else v == want[k], k


def test_loader_imports_none_of_the_hf_stack_until_asked():
    import subprocess
    import sys

    code = (
        "import sys, loader, loader.hf; "
        "print(sorted({'transformers', 'datasets', 'trl', 'accelerate'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_trainer_pieces_without_transformers_name_the_extra(monkeypatch):
    import sys

    import loader.hf
    from packtool.errors import MissingDependencyError

    monkeypatch.delitem(sys.modules, "loader.hf.trainer", raising=False)
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingDependencyError, match=r"pip install packtool\[hf\]"):
        _ = loader.hf.PackedTrainer


def test_row_collator_keeps_the_loss_mask(tmp_path):
    rows = [[[5, 6, 7], [8, 9]], [[1, 2, 3, 4]]]
    masks = [[[0, 1, 1], [0, 1]], [[0, 0, 1, 1]]]
    write_dataset(tmp_path / "m", rows, max_len=6, loss_masks=masks)
    want = next(iter(PackedDataset(tmp_path / "m", rows_per_batch=2, layout="hf", shuffle=False)))
    features = list(hf_dataset(tmp_path / "m", cache_dir=tmp_path / "c"))
    got = RowCollator()(features)
    # Masked targets stay -100: a collator that dropped the mask would train on the prompts.
    assert got["labels"][0].tolist() == [-100, 6, 7, -100, 9, -100, -100, 3, 4]
    for k, v in want.items():
        assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k
    # Rows that carry hf_dataset's labels but not the loss_mask (select_columns, TRL-style
    # data): the labels are the mask. Before, every token of them became a target.
    trl_rows = [{k: f[k] for k in ("input_ids", "seq_lengths", "labels")} for f in features]
    got = RowCollator()(trl_rows)
    for k, v in want.items():
        assert torch.equal(got[k], v) if isinstance(v, torch.Tensor) else got[k] == v, k
    trl_rows[0]["labels"] = [-100, 7, 7, -100, 9]  # a target that is not the token itself
    with pytest.raises(ConfigError, match="labels differ from their input_ids where set"):
        RowCollator()(trl_rows)


def masked_rows(n_rows: int, *, seed: int):
    """random_rows with a 0/1 mask per token, every document holding a supervised token."""
    rows = random_rows(n_rows, seed=seed)
    rng = np.random.default_rng(seed + 100)
    masks = []
    for row in rows:
        m = [rng.integers(0, 2, len(d)).tolist() for d in row]
        for d in m:
            d[-1] = 1
        masks.append(m)
    return rows, masks


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 6), cut=st.integers(0, 5))
def test_labels_are_the_supervised_ids_and_minus_100_elsewhere(seed, n, cut):
    from loader.hf import labels_table

    rows, masks = masked_rows(n, seed=seed)
    table = pa.table(
        {
            "input_ids": pa.array([sum(r, []) for r in rows], pa.list_(pa.uint16())),
            "doc_offsets": pa.array(
                [np.concatenate([[0], np.cumsum([len(d) for d in r])]).tolist() for r in rows],
                pa.list_(pa.int32()),
            ),
            "loss_mask": pa.array([bytes(sum(m, [])) for m in masks], pa.binary()),
        }
    )
    cut = min(cut, n - 1)
    table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])  # chunked, sliced
    want = []
    for row, mask in zip(rows, masks, strict=True):
        labels = []
        for doc, m in zip(row, mask, strict=True):
            labels += [-100] + [t if k else -100 for t, k in zip(doc[1:], m[1:], strict=True)]
        want.append(labels)
    got = labels_table(*(table.column(c) for c in ("input_ids", "loss_mask", "doc_offsets")))
    assert got.type == pa.list_(pa.int32()) and got.to_pylist() == want


@pytest.fixture(scope="module")
def masked(tmp_path_factory):
    path = tmp_path_factory.mktemp("hfm") / "ds"
    rows, masks = masked_rows(9, seed=8)
    write_dataset(path, rows, max_len=48, rows_per_shard=4, loss_masks=masks, derived=True)
    return path


def test_hf_dataset_adds_the_loaders_labels_to_masked_rows(masked, tmp_path):
    ds = hf_dataset(masked, cache_dir=tmp_path / "c")
    assert ds.column_names[-1] == "labels" and "seq_lengths" in ds.column_names
    want = PackedDataset(masked, rows_per_batch=1, layout="hf", shuffle=False)
    for got, batch in zip(ds, want, strict=True):
        assert got["labels"] == batch["labels"][0].tolist()
    streamed = list(hf_dataset(masked, streaming=True))
    assert [r["labels"] for r in streamed] == ds["labels"]


def test_trl_collator_on_masked_rows_equals_the_loader(masked, tmp_path):
    import datasets
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    keys = ("input_ids", "labels", "position_ids", "cu_seq_lens_q", "cu_seq_lens_k")
    trl = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    want = next(iter(PackedDataset(masked, rows_per_batch=3, layout="hf", shuffle=False)))
    rows = list(hf_dataset(masked, cache_dir=tmp_path / "c").select(range(3)))
    got = trl([{k: r[k] for k in ("input_ids", "seq_lengths", "labels")} for r in rows])
    for k in keys:
        assert torch.equal(got[k], want[k]), k
    # load_dataset alone: TRL does not read the binary loss_mask and trains on every token.
    raw = datasets.load_dataset(str(masked), split="train", cache_dir=str(tmp_path / "c"))
    assert "loss_mask" in raw.column_names and "labels" not in raw.column_names
    every = trl([{k: r[k] for k in ("input_ids", "seq_lengths")} for r in raw.select(range(3))])
    assert (every["labels"] != -100).sum() > (want["labels"] != -100).sum()


def test_hf_dataset_checks_each_page_as_the_loader_does(tmp_path):
    # datasets reads Parquet without the pages' CRC32: a flipped byte of a page decoded into
    # other token ids, and hf_dataset gave them as the rows, silently (PackedDataset refuses
    # them: "row group 0 unreadable (... CRC checksum verification failed ...)").
    from packtool.dataset.shards import ShardConfig
    from packtool.engines.local import RunConfig, run_pack
    from packtool.pack.chunk import PackConfig

    path = tmp_path / "ds"
    corpus = Path(__file__).resolve().parents[3] / "sample_data" / "corpus.jsonl"
    run_pack(
        RunConfig(
            inputs=(str(corpus),),
            out_dir=str(path),
            pack=PackConfig(max_len=256),
            shards=ShardConfig(compression="none"),
            progress=False,
        )  # fmt: skip
    )
    shard = path / read_manifest(path).shards[0].file
    chunk = pq.ParquetFile(shard).metadata.row_group(0).column(0)  # input_ids, PLAIN int32
    end = chunk.data_page_offset + chunk.total_compressed_size  # after the last id
    original = shard.read_bytes()
    data = bytearray(original)
    data[end - 4] ^= 1  # the last id's low byte
    shard.write_bytes(bytes(data))
    unchecked = pq.read_table(shard, page_checksum_verification=False)["input_ids"]
    assert unchecked != pq.read_table(pa.BufferReader(original))["input_ids"]  # read, wrongly
    with pytest.raises(DataError, match="CRC checksum"):
        list(PackedDataset(path, rows_per_batch=256, shuffle=False))
    with pytest.raises(DataError, match=r"/ds: a shard is damaged \(.*CRC checksum"):
        hf_dataset(path, cache_dir=tmp_path / "c")
    with pytest.raises(OSError, match="CRC checksum"):
        list(hf_dataset(path, streaming=True))
    # A datasets whose Parquet builder takes no fragment_scan_options (older releases refuse
    # the key): the rows load as before, with a warning saying the pages go unchecked.
    from loader.hf import datasets as hf_datasets

    shard.write_bytes(original)
    want = hf_dataset(path, cache_dir=tmp_path / "c2")["input_ids"]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(hf_datasets, "_reads_scan_options", lambda datasets: False)
        with pytest.warns(UserWarning, match="cannot check the shards' page checksums"):
            got = hf_dataset(path, cache_dir=tmp_path / "c3")["input_ids"]
    assert got == want
