#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, after scripts/gpu_check.sh has unpacked
# .gpu/ (built with BUNDLE_OLD=REV, see scripts/build_gpu_bundle.sh): this build's bench_gpu
# and the older revision's, alternating (old, new, old, new) in one command, so a slowdown
# of this build shows against the same machine and minute. Output: $OUT/compare_*.md.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SHAPES=${COMPARE_SHAPES:-"1,40,40,75600,128;1,32,8,4096,128,causal;4,32,32,8192,128"}
ARGS=(--shapes "$SHAPES" --iters "${COMPARE_ITERS:-3}" --warmup 1 --exclude "${COMPARE_EXCLUDE:-mma.sync,EFQ}" --decode "${COMPARE_DECODE:-32768}")
for round in 1 2; do
  for which in old new; do
    bin=./.gpu/bench_gpu; [ "$which" = old ] && bin=./.gpu/bench_gpu_old
    echo "== round $round: $which"
    timeout "${COMPARE_TIMEOUT:-240}" "$bin" "${ARGS[@]}" > "$OUT/compare_${which}_$round.md" 2>&1 || echo "!! $which round $round exit $?"
    tail -n +1 "$OUT/compare_${which}_$round.md" | grep -E "^\|" | head -60
  done
done
