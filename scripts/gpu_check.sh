#!/usr/bin/env bash
# Runs on the H200 (through the device tool), from the repo root, with the test binary
# built here by `cargo test --release --features cuda --test gpu --no-run` and carried,
# xz-compressed, in .gpu/ (see scripts/build_gpu_bundle.sh). Output goes to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
cd .gpu && for f in *.xz; do xz -d -f "$f"; done && chmod +x ./* && cd ..
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv
echo "== GPU tests"
timeout 300 ./.gpu/gpu --test-threads=1 --nocapture 2>&1 | tee "$OUT/gpu_tests.txt" | grep -vE "^\(" | tail -40
echo "== compute-sanitizer memcheck"
timeout 120 compute-sanitizer --tool memcheck --print-limit 20 ./.gpu/gpu sanitizer_small --test-threads=1 2>&1 | tail -15 | tee "$OUT/memcheck.txt"
echo "== compute-sanitizer racecheck"
timeout 120 compute-sanitizer --tool racecheck --print-limit 20 ./.gpu/gpu sanitizer_small --test-threads=1 2>&1 | tail -15 | tee "$OUT/racecheck.txt"
