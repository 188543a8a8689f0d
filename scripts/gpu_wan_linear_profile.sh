#!/usr/bin/env bash
# Runs on the GPU machine (device tool), from the repo root, with .gpu/ built by
# scripts/build_gpu_bundle.sh (wan_transformer, bench_fp8_linear; fp8_gpu when present):
# where the Wan blocks' linear time goes with BF16 and with FP8 projections, and what the
# FP8 GEMM alone gives at the same shapes against the BF16 GEMM Wan's blocks run (no bias).
# Output in $OUT: wan_linear_profile.txt (both `--profile-stages` tables),
# bench_fp8_linear_wan.md/.json, and, when .gpu/fp8_gpu is there, fp8_gpu_tests.txt.
#   WAN_PROFILE_MODEL  t2v-a14b (default) or ti2v-5b
#   WAN_PROFILE_GRID   latent grid (default 21x90x160: A14B 720p)
#   WAN_PROFILE_LINEAR linear schedules to profile (default "bf16 fp8")
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
NV=$(python3 -c "import nvidia, os, glob; print(':'.join(glob.glob(os.path.join(list(nvidia.__path__)[0], '*', 'lib'))))" 2>/dev/null || true)
export LD_LIBRARY_PATH="${NV}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MXATTN_REQUIRE_GPU=1
( cd .gpu && for f in *.xz; do [ -e "$f" ] && xz -d -f "$f"; done; chmod +x ./* )
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv
MODEL=${WAN_PROFILE_MODEL:-t2v-a14b}
GRID=${WAN_PROFILE_GRID:-21x90x160}
rc=0
echo "== bench_fp8_linear at the Wan shapes (qkv: the three projections as one GEMM)"
./.gpu/bench_fp8_linear --granularity tensor,channel --json "$OUT/bench_fp8_linear_wan.json" \
  --shapes "wan-a14b qkvo,75600,5120,5120;wan-a14b qkv,75600,5120,15360;wan-a14b ffn1,75600,5120,13824;wan-a14b ffn2,75600,13824,5120;wan-5b qkvo,27280,3072,3072;wan-5b ffn1,27280,3072,14336;wan-5b ffn2,27280,14336,3072" \
  | tee "$OUT/bench_fp8_linear_wan.md" || rc=1
echo "== wan_transformer $MODEL $GRID, 2 blocks, exact attention, --profile-stages"
for lin in ${WAN_PROFILE_LINEAR:-bf16 fp8}; do
  ./.gpu/wan_transformer --device cuda --model "$MODEL" --layers 2 --grid "$GRID" --attn exact \
    --reps 2 --profile-stages --linear "$lin" || rc=1
done 2>&1 | tee "$OUT/wan_linear_profile.txt"
if [ -x .gpu/fp8_gpu ]; then
  echo "== FP8 linear GPU tests"
  timeout 300 ./.gpu/fp8_gpu --test-threads=1 > "$OUT/fp8_gpu_tests.txt" 2>&1 || { rc=1; echo "!! fp8_gpu FAILED"; }
  grep -E "^test |test result|panicked" "$OUT/fp8_gpu_tests.txt"
fi
exit "$rc"
