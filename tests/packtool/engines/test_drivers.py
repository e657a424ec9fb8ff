"""The engines by name (packtool/engines/drivers.py): each engine's checks come before any input
is read, for `pack` and `tokenize --to megatron` alike; the drivers they return run a pack."""

from __future__ import annotations

import pytest

from packtool.engines import drivers
from packtool.engines.base import Driver
from packtool.engines.local import RunConfig, run_pack
from packtool.engines.megatron.run import tokenize_megatron
from packtool.errors import ConfigError
from packtool.pack.chunk import PackConfig
from tests.cli import run


def _config(out, inputs=("/nowhere/missing.jsonl",)) -> RunConfig:
    return RunConfig(inputs=inputs, out_dir=str(out), pack=PackConfig(max_len=256), progress=False)


def test_an_unknown_engine_is_refused_before_any_input_is_read(tmp_path):
    # The input does not exist: a check that came after the inputs' would say so instead.
    with pytest.raises(ConfigError, match=r"^engine 'spark' is unknown; choose local, ray, slurm$"):
        drivers.pack_on("spark", _config(tmp_path / "out"))
    with pytest.raises(ConfigError, match="^engine 'spark' is unknown"):
        tokenize_megatron(["/nowhere/missing.jsonl"], tmp_path / "m", engine="spark")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("engine", ["ray", "slurm"])
def test_an_hf_output_is_refused_by_engines_that_build_elsewhere(tmp_path, engine):
    # Slurm's own check runs sbatch: the hf:// refusal comes before it, so none is needed here.
    with pytest.raises(ConfigError, match=f"the {engine} engine builds on other machines"):
        drivers.driver(engine, None, "hf://datasets/user/name", None)


def test_the_local_driver_by_name_packs_as_run_pack(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(f'{{"text": "document {i} " }}\n' for i in range(300)))
    local = drivers.driver("local", None, tmp_path / "a", 2)
    assert isinstance(local, Driver) and local.early is not None and local.cancels_slurm_jobs
    by_name = drivers.pack_on("local", _config(tmp_path / "a", (str(corpus),)))
    direct = run_pack(_config(tmp_path / "b", (str(corpus),)))
    assert by_name.num_shards == direct.num_shards > 0 and by_name.counts == direct.counts
    for shard in sorted((tmp_path / "b").glob("shard-*")):
        assert (tmp_path / "a" / shard.name).read_bytes() == shard.read_bytes()


def test_the_cli_s_engine_option_goes_through_the_table(tmp_path, monkeypatch):
    asked = []
    real = drivers.driver

    def watched(engine, *args):
        asked.append(engine)
        return real(engine, *args)

    monkeypatch.setattr(drivers, "driver", watched)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "one document"}\n')
    code, _, err = run("pack", corpus, "-o", tmp_path / "o", "--max-len", "64")
    assert code == 0, err
    assert asked == ["local"] and (tmp_path / "o" / "index.json").is_file()
