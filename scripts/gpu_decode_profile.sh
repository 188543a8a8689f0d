#!/usr/bin/env bash
# Runs on the H200 (device tool) after scripts/gpu_check.sh has unpacked .gpu/: Nsight Compute
# on the split-KV decode kernel at 32k context, BF16 cache and MXFP4 cache, to see where its
# time goes (memory throughput, stall reasons). Clocks left alone (--clock-control none).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
# bench_gpu's decode table runs, per cache format, warm-up (3) + timed (20) calls, in the
# order BF16, MXFP8, MXFP6, MXFP4: launch 0 is BF16 and launch 69 is MXFP4.
for skip in 0 69; do
  timeout 120 ncu --clock-control none -k regex:decode_partial --launch-skip "$skip" --launch-count 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    ./.gpu/bench_gpu --shapes "1,8,8,256,128" --filter none-matches --decode 32768 --iters 1 --warmup 0 2>&1 \
    | grep -vE "^\| |^$" | tee "$OUT/ncu_decode_skip${skip}.txt" | grep -E "Duration|Throughput|Stall|Warp Cycles|Occupancy|Registers|Memory \[|L1|L2|DRAM" | head -40
done
