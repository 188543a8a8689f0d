#!/usr/bin/env bash
# Runs on the H200 (through the device tool), from the repo root, with the test binaries
# built here by `cargo test --release --features cuda --test gpu --no-run` (and the FP8
# linear layer's, `-p mxattn-fp8 --test fp8_gpu`) and carried,
# xz-compressed, in .gpu/ (see scripts/build_gpu_bundle.sh). Output goes to $OUT.
#
# GPU_CHECK_ONLY (an extended regex) runs only the steps whose names match it, to split the
# steps over device calls of at most 600 s, e.g. GPU_CHECK_ONLY='^GPU tests$|FP8|sanitizer' and
# GPU_CHECK_ONLY='failure-mode|sm_80'.
#
# Fails (non-zero exit) when any GPU test fails, when no GPU is found (MXATTN_REQUIRE_GPU=1
# turns the tests' "no device, skipping" into a failure), or when a sanitizer reports an
# error. Each step's full output is kept in $OUT; the console shows its tail.
set -euo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null || true)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MXATTN_REQUIRE_GPU=1
( cd .gpu && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x ./* )
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv

failed=()
# step NAME LOG COMMAND...: runs COMMAND with its output in $OUT/LOG, prints the tail, and
# records NAME as failed on a non-zero exit (the script carries on to the other steps).
step() {
  local name=$1 log=$2; shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && ! grep -qE "$GPU_CHECK_ONLY" <<< "$name"; then
    echo "== $name: not selected (GPU_CHECK_ONLY=$GPU_CHECK_ONLY)"
    return
  fi
  echo "== $name"
  local rc=0
  "$@" > "$OUT/$log" 2>&1 || rc=$?
  grep -vE "^\(" "$OUT/$log" | tail -40
  if [ "$rc" -ne 0 ]; then
    echo "!! $name FAILED (exit $rc); full output in $log"
    failed+=("$name")
  fi
}
step "GPU tests" gpu_tests.txt timeout 300 ./.gpu/gpu --skip failure_mode --test-threads=1 --nocapture
# The failure modes other FP8 kernels shipped with (tests/failure/mod.rs): E4M3-flushed P mass,
# sinks, 160k keys, and (ignored elsewhere) operands past 2^31 elements (~60 GB of GPU memory).
step "GPU failure-mode tests" gpu_failure_modes.txt timeout 480 ./.gpu/gpu failure_mode \
  --include-ignored --test-threads=1 --nocapture
step "FP8 linear GPU tests" fp8_gpu_tests.txt timeout 300 ./.gpu/fp8_gpu --test-threads=1 --nocapture
if [ -x .gpu/gpu_sm80 ]; then
  # mxattn's kernels built for 8.0 only: on the H200 the driver JITs their PTX, and every
  # call the wgmma kernel would take runs on mma.sync (the tests check both).
  step "GPU tests, kernels built for sm_80 (PTX JIT, no wgmma)" gpu_tests_sm80.txt \
    timeout 420 ./.gpu/gpu_sm80 --skip failure_mode --test-threads=1 --nocapture
fi
step "compute-sanitizer memcheck" memcheck.txt timeout 120 compute-sanitizer --tool memcheck \
  --error-exitcode 1 --print-limit 20 ./.gpu/gpu sanitizer_small --test-threads=1
step "compute-sanitizer racecheck" racecheck.txt timeout 120 compute-sanitizer --tool racecheck \
  --error-exitcode 1 --print-limit 20 ./.gpu/gpu sanitizer_small --test-threads=1
# Reads of uninitialized device memory: the wgmma path allocates its packed operands and
# output without a memset (src/cuda/attention/launch.rs), trusting the kernels to write them.
step "compute-sanitizer initcheck" initcheck.txt timeout 120 compute-sanitizer --tool initcheck \
  --error-exitcode 1 --print-limit 20 ./.gpu/gpu sanitizer_small --test-threads=1
if [ "${#failed[@]}" -ne 0 ]; then
  echo "GPU check FAILED: ${failed[*]}"
  exit 1
fi
echo "GPU check passed"
