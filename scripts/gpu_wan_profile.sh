#!/usr/bin/env bash
# Runs on the H200 (device tool), from the repo root, with the bundle of
# scripts/build_gpu_bundle.sh carried in .gpu/: the fused elementwise kernels against the CPU
# (and under memcheck), the transformer fixtures on the GPU, then where a Wan block's time goes:
# a forward of the first PROFILE_LAYERS blocks at the real shapes, fused vs Candle's op-by-op
# elementwise chain, every stage timed between device synchronizations.
#   PROFILE_RUNS  ';'-separated "model grid" entries (default: A14B 720p 81 frames, 5B 720p 121)
#   PROFILE_ATTN  comma-separated attention presets (default exact,fused-mxfp8)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
cd .gpu && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x ./* && cd ..
IFS=';' read -ra RUNS <<< "${PROFILE_RUNS:-t2v-a14b 21x90x160;ti2v-5b 31x44x80}"
{
echo "== fused ops: GPU vs CPU"
timeout 120 ./.gpu/gpu fused_ops --test-threads=1 --nocapture 2>&1 | grep -E "fused|test result|panicked"
echo "== memcheck (fused ops)"
timeout 120 compute-sanitizer --tool memcheck ./.gpu/gpu sanitizer_small_fused --test-threads=1 2>&1 | grep -E "ERROR SUMMARY|test result"
echo "== transformer fixtures on the GPU (f32, exact, fused path)"
timeout 120 ./.gpu/wan_transformer --device cuda --check-fixtures 2>&1 | tail -3
for run in "${RUNS[@]}"; do
  read -r model grid <<< "$run"
  echo "== $model, latent $grid, first ${PROFILE_LAYERS:-2} blocks"
  timeout "${PROFILE_TIMEOUT:-200}" ./.gpu/wan_transformer --device cuda --model "$model" \
    --layers "${PROFILE_LAYERS:-2}" --grid "$grid" --elementwise both --profile-stages \
    --attn "${PROFILE_ATTN:-exact,fused-mxfp8}" --reps 2 2>&1
done
} | tee "$OUT/wan_profile.md"
