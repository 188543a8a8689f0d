#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, after scripts/gpu_check.sh has
# unpacked .gpu/: mxattn's benchmark at the anchor shapes of shared/design/anchors_h200.md
# and decode contexts, then the shared/bench reference scripts (copied into .bench/) in
# the same command, so every ratio compares numbers of one machine and minute.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES="1,40,40,75600,128;1,24,24,27280,128;1,40,40,32760,128;1,32,8,4096,128,causal;1,32,8,32768,128,causal;4,32,32,8192,128"
timeout "${BENCH_TIMEOUT:-420}" ./.gpu/bench_gpu --shapes "$SHAPES" --iters "${BENCH_ITERS:-3}" --warmup 1 --exclude "mma.sync,EFQ" \
  --decode "1024,8192,32768" --json "$OUT/bench_gpu.json" 2>&1 | tee "$OUT/bench_gpu.md"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .bench/wheels/*.whl 2>&1 | tail -2
timeout "${ANCHORS_TIMEOUT:-240}" python3 .bench/anchors_h200.py 2>&1 | tee "$OUT/anchors_same_run.txt" | tail -30
PYTHONPATH=/tmp/site timeout "${CUDNN_TIMEOUT:-120}" python3 .bench/cudnn_fp8_attn.py 2>&1 | tee "$OUT/cudnn_fp8_same_run.txt" | tail -12
