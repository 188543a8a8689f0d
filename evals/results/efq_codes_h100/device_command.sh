# The device command of this folder (one call, NVIDIA H100 80GB HBM3). .gpu/ held, xz-compressed
# and stripped: gpu (the GPU test binary) and bench_gpu of c54a4b0 (items 18 and 19), and
# bench_gpu_old of 5caf5ca (main before both, with --digest), all built here with
#   source .venv-cuda/env.sh; MXATTN_CUDA_ARCHS=90a CARGO_TARGET_DIR=target/cuda \
#     cargo build --release --features cuda --example bench_gpu --tests
export OUT; GPU_CHECK_ONLY='^GPU tests$|memcheck|racecheck|initcheck' scripts/gpu_check.sh > $OUT/check.txt 2>&1; echo "check rc=$?"
grep -E "^test result|^== |FAILED|panicked|ERROR SUMMARY|RACECHECK SUMMARY|H100|H200" $OUT/check.txt | head -30
NV=$(python3 -c "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'lib'))" 2>/dev/null)
export LD_LIBRARY_PATH="$NV:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
COMPARE_WHAT=bench COMPARE_SHAPES="1,32,8,4096,128,causal;1,32,8,32768,128,causal;1,40,40,75600,128" \
  COMPARE_ITERS=5 COMPARE_WARMUP=1 COMPARE_CHECKS=deferred COMPARE_DECODE="" \
  COMPARE_EXCLUDE="mma.sync,staged,fp32,MXFP6,MXFP4 V" COMPARE_JSON=1 COMPARE_DIGEST=1 COMPARE_TIMEOUT=150 \
  COMPARE_KERNELS="fused-softmax u8, MXFP8 QK, FP8 V" scripts/gpu_compare_bench.sh > $OUT/compare_console.txt 2>&1
echo "compare rc=$?"; tail -2 $OUT/compare_digest.txt; grep "| NO" $OUT/compare_digest.txt | head
cat $OUT/compare_kernels.txt | grep -v "badd\|softmax_bf16\|cast_f32\|nvjet"; ls $OUT
