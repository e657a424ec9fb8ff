"""The Ray engine against the local engine: same shards byte for byte, resume, missing extra.

One local Ray (2 CPUs, the `ray_session` fixture of conftest.py) serves every test that needs it;
they skip cleanly when ray[data] is not installed. The missing-extra tests run without Ray.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from packtool.cli import cli, main
from packtool.corpus import ReadConfig
from packtool.engines import local
from packtool.engines.local import STATE_FILE, RunConfig, run_pack
from packtool.engines.preflight import staging_folder
from packtool.errors import ConfigError, DataError, MissingDependencyError
from packtool.pack import PackConfig
from packtool.shards import ShardConfig
from packtool.verify import verify_dataset

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "sample_data" / "corpus.jsonl"
CHUNK_DOCS = 1000  # 4,024 documents -> 5 chunks, so ordering and renumbering matter


def config(out: Path, inputs=(CORPUS,), **kw) -> RunConfig:
    kw.setdefault("pack", PackConfig(max_len=2048))
    kw.setdefault("shards", ShardConfig(shard_rows=100))
    return RunConfig(
        inputs=tuple(str(p) for p in inputs),
        out_dir=str(out),
        chunk_docs=CHUNK_DOCS,
        progress=False,
        **kw,
    )


def run_ray(cfg: RunConfig, **ray_kw):
    from packtool.engines.ray import RayConfig, run_pack_ray

    return run_pack_ray(cfg, RayConfig(**ray_kw))


def shard_bytes(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.glob("shard-*.parquet"))}


def manifest_without_command(out: Path) -> dict:
    data = json.loads((out / "index.json").read_text())
    data.pop("command")
    return data


def assert_same_as_local(ray_out: Path, local_out: Path) -> None:
    a, b = manifest_without_command(ray_out), manifest_without_command(local_out)
    assert a == b
    # The Ray engine's documented promise: byte-identical shards under the same names.
    assert shard_bytes(ray_out) == shard_bytes(local_out)
    assert sorted(p.name for p in ray_out.iterdir()) == sorted(p.name for p in local_out.iterdir())


@pytest.mark.parametrize(
    "pack",
    [
        PackConfig(max_len=2048),
        PackConfig(max_len=1024, algorithm="bfd", rounds=3, seed=7, group_by="lang"),
    ],
    ids=["ffd", "bfd-rounds-groups"],
)
def test_ray_shards_are_byte_identical_to_the_local_engine(ray_session, tmp_path, pack):
    read = ReadConfig(extra_fields=("lang",) if pack.group_by == "lang" else ())
    want = run_pack(config(tmp_path / "local", pack=pack, read=read))
    got = run_ray(config(tmp_path / "ray", pack=pack, read=read))
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")
    assert got.counts == want.counts and got.skips == want.skips == {"empty": 6}
    assert abs(got.efficiency - want.efficiency) <= 0.0005
    assert len(got.shards) > 5  # several chunks, several shards each: renumbering was exercised
    report = verify_dataset(tmp_path / "ray", checksums=True)
    assert report.rows == got.counts.rows
    # Every document exactly once, with all of its tokens, under the local engine's doc ids.
    table = pq.read_table(sorted(str(p) for p in (tmp_path / "ray").glob("shard-*.parquet")))
    pieces: dict[int, int] = {}
    for offsets, ids in zip(
        table.column("doc_offsets").to_pylist(), table.column("doc_ids").to_pylist(), strict=True
    ):
        for doc, a, b in zip(ids, offsets, offsets[1:], strict=False):
            pieces[doc] = pieces.get(doc, 0) + b - a
    assert sorted(pieces) == list(range(4024))
    assert sum(pieces.values()) == got.counts.tokens_out == got.counts.tokens_in


def test_cli_engine_ray_on_tokenized_parquet(ray_session, tmp_path):
    """`packtool pack --engine ray` through the CLI, on `packtool tokenize` output."""
    runner = CliRunner()
    tok = tmp_path / "tok.parquet"
    assert runner.invoke(cli, ["tokenize", str(CORPUS), "-o", str(tok)]).exit_code == 0
    common = [str(tok), "--max-len", "4096", "--chunk-docs", "1500", "--shard-rows", "64"]
    result = runner.invoke(cli, ["pack", *common, "-o", str(tmp_path / "ray"), "--engine", "ray"])
    assert result.exit_code == 0, result.output
    assert "Ray: 1 reader task" in result.output
    assert runner.invoke(cli, ["pack", *common, "-o", str(tmp_path / "local")]).exit_code == 0
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")


def test_resume_after_the_driver_dies_midway(ray_session, tmp_path, monkeypatch):
    from packtool.engines import ray as ray_engine

    run_pack(config(tmp_path / "local"))
    real_save = ray_engine._save_state
    saves = []

    def dying_save(out, fingerprint, done):
        real_save(out, fingerprint, done)
        saves.append(len(done))
        if len(done) == 2:  # two chunks finished and recorded, three still to go
            raise KeyboardInterrupt

    monkeypatch.setattr(ray_engine, "_save_state", dying_save)
    with pytest.raises(KeyboardInterrupt):
        run_ray(config(tmp_path / "ray"))
    monkeypatch.setattr(ray_engine, "_save_state", real_save)
    out = tmp_path / "ray"
    staging = staging_folder(out)
    assert not out.exists() and (staging / STATE_FILE).exists()
    state = json.loads((staging / STATE_FILE).read_text())
    assert state["engine"] == "ray" and len(state["chunks"]) == 2

    with pytest.raises(ConfigError, match="interrupted run .* --resume"):
        run_ray(config(out))  # neither --overwrite nor --resume
    with pytest.raises(ConfigError, match="started with --engine ray"):
        run_pack(config(out, resume=True))  # the local engine refuses a Ray run's state
    summary = run_ray(config(out, resume=True))
    assert summary.resumed_chunks == 2
    assert_same_as_local(out, tmp_path / "local")
    assert not (out / STATE_FILE).exists() and not staging.exists()


def test_resume_when_killed_while_renaming_shards(ray_session, tmp_path, monkeypatch):
    from packtool.engines import ray as ray_engine

    run_pack(config(tmp_path / "local"))
    real_move = ray_engine._move
    moved = []

    def dying_move(src, dst):
        if len(moved) == 3:
            raise KeyboardInterrupt
        moved.append(dst)
        real_move(src, dst)

    monkeypatch.setattr(ray_engine, "_move", dying_move)
    with pytest.raises(KeyboardInterrupt):
        run_ray(config(tmp_path / "ray"))
    monkeypatch.setattr(ray_engine, "_move", real_move)
    assert len(moved) == 3 and not (tmp_path / "ray").exists()
    summary = run_ray(config(tmp_path / "ray", resume=True))
    assert summary.resumed_chunks == 5
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")


def test_ray_resumes_a_run_the_local_engine_started(ray_session, tmp_path, monkeypatch):
    run_pack(config(tmp_path / "whole"))
    real_write = local.write_shards
    calls = []

    def dying_write(*args, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(1)
        return real_write(*args, **kw)

    monkeypatch.setattr(local, "write_shards", dying_write)
    with pytest.raises(KeyboardInterrupt):
        run_pack(config(tmp_path / "out"))
    monkeypatch.setattr(local, "write_shards", real_write)
    summary = run_ray(config(tmp_path / "out", resume=True))
    assert summary.resumed_chunks == 2
    assert_same_as_local(tmp_path / "out", tmp_path / "whole")


def test_a_user_error_inside_a_ray_task_is_one_readable_error(ray_session, tmp_path):
    # sample_data has 6 empty documents: strict mode stops at the first, inside the reader task.
    with pytest.raises(DataError, match="empty.*run without --strict"):
        run_ray(config(tmp_path / "out", read=ReadConfig(strict=True)), max_retries=0)


def test_ray_config_validation():
    from packtool.engines.ray import RayConfig

    with pytest.raises(ConfigError, match="actors"):
        RayConfig(actors=0)
    with pytest.raises(ConfigError, match="max_retries"):
        RayConfig(max_retries=-1)


def test_missing_ray_names_the_extra(tmp_path, monkeypatch, capsys):
    from packtool.engines.ray import run_pack_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'packtool\[ray\]'"):
        run_pack_ray(config(tmp_path / "out"))
    argv = ["pack", str(CORPUS), "-o", str(tmp_path / "cli"), "--engine", "ray"]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err == "error: --engine ray needs Ray Data: pip install 'packtool[ray]'"


def test_ray_address_needs_the_ray_engine(tmp_path):
    result = CliRunner().invoke(
        cli, ["pack", str(CORPUS), "-o", str(tmp_path / "o"), "--ray-address", "auto"]
    )
    assert result.exit_code != 0
    assert "--ray-address needs --engine ray" in str(result.exception)


def test_a_worker_that_dies_is_retried_and_the_output_is_unchanged(
    ray_session, tmp_path, monkeypatch
):
    import os

    from packtool.engines import ray as ray_engine

    run_pack(config(tmp_path / "local"))
    marker = str(tmp_path / "died")

    # Defined inside the test, so Ray ships the class by value to its workers.
    class DiesOnce(ray_engine._ChunkWorker):
        def __call__(self, batch):
            if 2 in [int(c) for c in batch["chunk"]] and not os.path.exists(marker):
                Path(marker).touch()
                os._exit(1)  # the actor process dies in the middle of chunk 2
            return super().__call__(batch)

    monkeypatch.setattr(ray_engine, "_ChunkWorker", DiesOnce)
    summary = run_ray(config(tmp_path / "ray"), max_retries=2)
    assert Path(marker).exists()  # it did die once
    assert summary.resumed_chunks == 0
    assert_same_as_local(tmp_path / "ray", tmp_path / "local")
