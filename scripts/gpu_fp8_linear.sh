#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with .gpu/ built by
# scripts/build_gpu_bundle.sh: the FP8 linear layer's GPU tests (crates/fp8/tests/gpu.rs:
# codes and scales bit for bit, the GEMM against the CPU reference on both GEMM paths, bad
# input) and its benchmark against candle's BF16 matmul (evals/bench_fp8_linear.rs).
# Output in $OUT: fp8_gpu_tests.txt, bench_fp8_linear.md / .json. Fails when a test fails or
# no GPU is found (MXATTN_REQUIRE_GPU=1).
#   FP8_BENCH_ARGS   extra arguments of bench_fp8_linear (e.g. --fallback, --shapes "...")
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null || true)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MXATTN_REQUIRE_GPU=1
( cd .gpu && for f in fp8_gpu.xz bench_fp8_linear.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x ./* )
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
rc=0
echo "== FP8 linear GPU tests"
timeout 420 ./.gpu/fp8_gpu --test-threads=1 --nocapture > "$OUT/fp8_gpu_tests.txt" 2>&1 || rc=$?
grep -E "^test |worst|panicked|test result|path" "$OUT/fp8_gpu_tests.txt" | tail -80
[ "$rc" -ne 0 ] && echo "!! FP8 linear GPU tests FAILED (exit $rc); full output in fp8_gpu_tests.txt"
echo "== bench_fp8_linear"
# shellcheck disable=SC2086
timeout 420 ./.gpu/bench_fp8_linear --json "$OUT/bench_fp8_linear.json" ${FP8_BENCH_ARGS:-} \
  > "$OUT/bench_fp8_linear.md" 2>&1 || { echo "!! bench_fp8_linear FAILED"; rc=1; }
cat "$OUT/bench_fp8_linear.md"
exit "$rc"
