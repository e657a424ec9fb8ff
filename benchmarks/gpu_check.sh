#!/usr/bin/env bash
# The one prepared GPU run, for a session lent a CUDA machine (run from the repo root):
#   1. the GPU tests: each CUDA attention backend against sdpa in bf16 (pytest -m gpu),
#   2. the backend sweep by document length (the evidence for `auto`'s CUDA order),
#   3. training throughput, packed + varlen against padded, on CUDA;
#   4. an experiment, logged only: the packed model on flex, as compiled now and with
#      dynamic=True (the first CUDA run's flex training did not finish 65 varying-shape steps in
#      170 s; docs/attention.md), 20 steps each; each log ends with the graphs compiled.
# Needs only torch (with CUDA), numpy, pytest and hypothesis: attention/, test_varlen_gpu.py and
# these benchmarks import no other project dependency. Only the GPU test file is collected: the
# rest of tests/attention imports packtool (orjson, polars, ...), which the device image lacks, and
# one collection error would stop pytest before any test ran. The steps' limits add up to 9.7
# minutes, inside one 10-minute device command (on an H200, steps 1-3 took ~4 minutes). Steps
# 2-3 write their blocks in docs/benchmarks.md; that page and the logs are copied to $OUT
# (default gpu_out/) so they can be brought back and committed.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-gpu_out}
mkdir -p "$OUT"
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/gpu.txt"
timeout 170 python3 -m pytest -q -m gpu tests/attention/test_varlen_gpu.py -p no:cacheprovider -p no:logging 2>&1 | tee "$OUT/pytest_gpu.log" || status=1
timeout 130 python3 -m benchmarks.bench_train --sweep --device cuda 2>&1 | tee "$OUT/sweep.log" || status=1
timeout 130 python3 -m benchmarks.bench_train --device cuda 2>&1 | tee "$OUT/bench_train.log" || status=1
timeout 75 python3 -m benchmarks.bench_train --device cuda --attn flex --steps 20 2>&1 | grep -v DEBUG | tee "$OUT/train_flex.log"
timeout 75 python3 -m benchmarks.bench_train --device cuda --attn flex --flex-dynamic --steps 20 2>&1 | grep -v DEBUG | tee "$OUT/train_flex_dynamic.log"
cp docs/benchmarks.md "$OUT/benchmarks.md"
exit $status
