#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, after scripts/gpu_check.sh has unpacked
# .gpu/ (built with BUNDLE_OLD=REV, see scripts/build_gpu_bundle.sh): this build's bench_gpu
# and the older revision's, alternating (old, new, old, new) in one command, so a slowdown
# of this build shows against the same machine and minute. Output: $OUT/compare_bench.md and
# $OUT/compare_wan.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${COMPARE_SHAPES:-"1,40,40,75600,128;1,32,8,4096,128,causal;4,32,32,8192,128"}
ARGS=(--shapes "$SHAPES" --iters "${COMPARE_ITERS:-3}" --warmup 1 --exclude "${COMPARE_EXCLUDE:-mma.sync,EFQ}" --decode "${COMPARE_DECODE:-32768}")
# COMPARE_WHAT: bench, wan or both (default), for device calls that carry only some binaries
WHAT=${COMPARE_WHAT:-both}
[ "$WHAT" = wan ] || for round in 1 2; do
  for which in old new; do
    bin=./.gpu/bench_gpu; [ "$which" = old ] && bin=./.gpu/bench_gpu_old
    echo "== round $round: $which"
    { echo "== bench_gpu round $round: $which"; timeout "${COMPARE_TIMEOUT:-240}" "$bin" "${ARGS[@]}" 2>&1 || echo "!! $which round $round exit $?"; } > "$OUT/run.txt"
    cat "$OUT/run.txt" >> "$OUT/compare_bench.md"
    grep -E "^\|" "$OUT/run.txt" | head -60
  done
done
# The Wan transformer (2 A14B blocks at 720p, exact and Fused-Softmax MXFP8): the model-level
# path (fused ops, the attention calls, the deferred checks) against the older build.
[ "$WHAT" = bench ] && { rm -f "$OUT/run.txt"; exit 0; }
WT=(--device cuda --model t2v-a14b --layers 2 --grid 21x90x160 --attn "${COMPARE_WAN_ATTN:-exact,fused-mxfp8}" --reps 3)
for round in 1 2; do
  for which in old new; do
    bin=./.gpu/wan_transformer; [ "$which" = old ] && bin=./.gpu/wan_transformer_old
    echo "== wan_transformer round $round: $which"
    { echo "== wan_transformer round $round: $which"; timeout 120 "$bin" "${WT[@]}" 2>&1; } | tee -a "$OUT/compare_wan.txt" | grep -E "forward" || echo "!! $which exit"
  done
done
rm -f "$OUT/run.txt"
