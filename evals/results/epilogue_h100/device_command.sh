# The device command of the A/B in this folder (one call, NVIDIA H100 80GB HBM3). .gpu/ held,
# xz-compressed and stripped: gpu (the GPU test binary) and bench_gpu of the epilogue change,
# bench_gpu_old of 2796d29 (main before it), both built here with
#   source .venv-cuda/env.sh; MXATTN_CUDA_ARCHS=90a CARGO_TARGET_DIR=target/cuda \
#     cargo build --release --features cuda --example bench_gpu --tests
export OUT; GPU_CHECK_ONLY='^GPU tests$|memcheck|racecheck|initcheck' bash scripts/gpu_check.sh > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "^test result|FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|H100|H200" $OUT/check.txt | head -20
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
COMPARE_WHAT=bench COMPARE_SHAPES="1,32,8,4096,128,causal;1,32,8,32768,128,causal;4,32,32,8192,128" COMPARE_ITERS=5 \
  COMPARE_WARMUP=1 COMPARE_CHECKS=deferred COMPARE_DECODE="" COMPARE_EXCLUDE="mma.sync,staged,fp32,MXFP6,MXFP4 V" \
  COMPARE_JSON=1 COMPARE_DIGEST=1 COMPARE_TIMEOUT=120 COMPARE_KERNELS="fused-softmax u8, MXFP8 QK, FP8 V;exact bf16" \
  bash scripts/gpu_compare_bench.sh > $OUT/compare_console.txt 2>&1
echo "compare rc=$?"; tail -2 $OUT/compare_digest.txt; grep "| NO" $OUT/compare_digest.txt | head
grep -v "badd\|softmax_bf16\|cast_f32\|nvjet" $OUT/compare_kernels.txt | grep attention_wgmma; ls $OUT
# The profile after the change (the second call, the new bench_gpu alone):
#   NCU_SHAPE="1,32,8,4096,128,causal" NCU_TAG=fused_u8_4k bash scripts/gpu_ncu_stalls.sh
# (its files renamed ncu_fused_u8_4k_after_*; the .ncu-rep and the per-instruction CSV not kept)
